"""Pack one chunk's documents into a fixed number of rows: best fit (or first fit), decreasing.

The documents of a chunk are the stretches its EOS tokens end (the first and last may be
parts of documents the chunk boundary cuts). A document longer than a row of ``seq_len + 1``
tokens is first cut into *pieces* of ``seq_len + 1`` tokens with stride ``seq_len`` (they
overlap by one token, so every next-token pair is kept once); the pieces are then placed,
longest first, each whole into the row it fits best (``"best_fit"``: least room left) or
first (``"first_fit"``: lowest row number), opening a new row when none fits.

The number of rows is fixed in advance (the packed order measures what a source's chunks
need: :func:`rows_used`), so the packed order can number rows in closed form; rows left over
are padding. A piece that fits whole in no row once every row is open is split over the rows
with the most room (at least two tokens each, overlapping by one), which :func:`min_rows`
rows always make possible: nothing is dropped.

>>> ends = np.array([3, 10, 12])  # documents [0, 3), [3, 10), [10, 12) and the tail [12, 16)
>>> packed = pack_chunk(ends, 16, seq_len=7, rows=3)
>>> [packed.row(r) for r in range(packed.rows)]
[[(3, 7)], [(0, 3), (12, 4)], [(10, 2)]]
"""

from __future__ import annotations

import bisect
import dataclasses
import math

import numpy as np

PACKINGS = ("best_fit", "first_fit")


def min_rows(chunk_tokens: int, seq_len: int) -> int:
    """The fewest rows :func:`pack_chunk` may be given for a chunk of ``chunk_tokens``: enough
    for every piece even when each row wastes a token and each piece of a long document, or
    each split, adds an overlap token.

    >>> min_rows(65536, 1024), min_rows(65536, 8)
    (65, 9217)
    """
    if seq_len < 2:
        raise ValueError(f"packing needs seq_len >= 2, not {seq_len}")
    return math.ceil((chunk_tokens + chunk_tokens // seq_len + 1) / seq_len)


def rows_used(ends: np.ndarray, chunk_len: int, *, seq_len: int, packing: str) -> int:
    """Rows :func:`pack_chunk` opens for a chunk's documents when it may open any number.

    >>> rows_used(np.array([3, 10, 12]), 16, seq_len=7, packing="best_fit")
    3
    """
    return pack_open(ends, chunk_len, seq_len=seq_len, packing=packing).opened


def pack_open(ends: np.ndarray, chunk_len: int, *, seq_len: int, packing: str) -> PackedChunk:
    """:func:`pack_chunk` with a row for every piece, so that it never runs out of rows: the
    rows it opens come first, the rest are empty (:func:`with_rows` then fits it to any number
    of rows it does not outgrow).

    >>> packed = pack_open(np.array([3, 10, 12]), 16, seq_len=7, packing="best_fit")
    >>> packed.rows, packed.content.tolist()
    (4, [7, 7, 2, 0])
    """
    pieces = document_pieces(ends, chunk_len, seq_len)[0].size
    return pack_chunk(ends, chunk_len, seq_len=seq_len, rows=pieces, packing=packing)


def with_rows(packed: PackedChunk, rows: int) -> PackedChunk:
    """``packed`` (from :func:`pack_open`) as :func:`pack_chunk` packs the same chunk into
    ``rows`` rows, at least the rows it opened: packing never ran out of rows, so it takes the
    same decisions for any such number (rows are chosen by room, then by number, and the
    unopened ones have none); only the empty rows at the end differ.

    >>> ends = np.array([3, 10, 12])
    >>> fitted = with_rows(pack_open(ends, 16, seq_len=7, packing="best_fit"), 3)
    >>> direct = pack_chunk(ends, 16, seq_len=7, rows=3)
    >>> [np.array_equal(a, b) for a, b in zip(fitted.spans, direct.spans)]
    [True, True, True]
    >>> np.array_equal(fitted.first, direct.first), np.array_equal(fitted.content, direct.content)
    (True, True)
    """
    used = packed.opened
    if rows < used:
        raise ValueError(f"a chunk packed into {used} rows cannot take {rows}")
    more = rows - packed.rows
    first, content = packed.first[: rows + 1], packed.content[:rows]
    if more > 0:
        first = np.concatenate([first, np.full(more, first[-1], dtype=np.int64)])
        content = np.concatenate([content, np.zeros(more, dtype=np.int64)])
    return PackedChunk(rows=rows, first=first, spans=packed.spans, content=content,
                       split=packed.split)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class PackedChunk:
    """One chunk's rows: row ``r`` holds pieces ``[first[r], first[r + 1])``, each
    (chunk offset, length), in text order; ``content[r]`` tokens, the rest padding."""

    rows: int
    first: np.ndarray  # (rows + 1,) int64
    # (3, pieces) int64: each piece's offset in the chunk, length, and offset in its row (one
    # array, so that a reader strings many chunks' pieces together in one concatenation)
    spans: np.ndarray
    content: np.ndarray  # (rows,) int64 tokens of each row
    split: int  # pieces cut further because no row held them whole

    @property
    def opened(self) -> int:
        """Rows that hold tokens (the others are empty)."""
        return int(np.count_nonzero(self.content))

    @property
    def start(self) -> np.ndarray:
        """(pieces,) offset of each piece in the chunk."""
        return self.spans[0]

    @property
    def length(self) -> np.ndarray:
        """(pieces,) tokens of each piece."""
        return self.spans[1]

    @property
    def at(self) -> np.ndarray:
        """(pieces,) offset of each piece in its row."""
        return self.spans[2]

    def row(self, r: int) -> list[tuple[int, int]]:
        """Row ``r``'s pieces as (offset, length) pairs."""
        lo, hi = int(self.first[r]), int(self.first[r + 1])
        return list(zip(self.start[lo:hi].tolist(), self.length[lo:hi].tolist(), strict=True))


def document_pieces(
    ends: np.ndarray, chunk_len: int, seq_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of every piece of a chunk whose documents end at ``ends`` (exclusive
    ends, ascending): documents longer than ``seq_len + 1`` cut with stride ``seq_len``.

    >>> [a.tolist() for a in document_pieces(np.array([2, 9]), 9, seq_len=3)]
    [[0, 2, 5], [2, 4, 4]]
    """
    ends = np.asarray(ends, dtype=np.int64)
    bounds = np.concatenate([[0], ends[ends < chunk_len], [chunk_len]])
    starts, stops = bounds[:-1], bounds[1:]
    keep = stops > starts
    starts, stops = starts[keep], stops[keep]
    n = stops - starts
    count = np.maximum(1, (n - 2) // seq_len + 1)  # ceil((n - 1) / seq_len), at least 1
    doc = np.repeat(np.arange(n.size), count)
    heads = np.concatenate([[0], np.cumsum(count)[:-1]])
    k = np.arange(doc.size) - heads[doc]
    start = starts[doc] + k * seq_len
    return start, np.minimum(seq_len + 1, stops[doc] - start)


class _Rooms:
    """The room left in each of ``rows`` rows (0 until set), with the lowest row that has at
    least ``n`` found in O(log rows): a binary tree of maxima over the rows.

    >>> rooms = _Rooms(5)
    >>> rooms.set(1, 3); rooms.set(3, 7); rooms.set(4, 7)
    >>> rooms.first_with(4), rooms.first_with(2), rooms.first_with(8), rooms.most
    (3, 1, -1, 7)
    """

    def __init__(self, rows: int) -> None:
        self.leaves = 1 << max(0, rows - 1).bit_length()
        self.tree = [0] * (2 * self.leaves)

    @property
    def most(self) -> int:
        return self.tree[1]

    def set(self, row: int, room: int) -> None:
        tree = self.tree
        i = self.leaves + row
        tree[i] = room
        i >>= 1
        while i:
            tree[i] = max(tree[2 * i], tree[2 * i + 1])
            i >>= 1

    def first_with(self, n: int) -> int:
        """The lowest row with room >= ``n`` (``n`` >= 1), or -1."""
        tree = self.tree
        if tree[1] < n or n < 1:
            return -1
        i = 1
        while i < self.leaves:
            i = 2 * i if tree[2 * i] >= n else 2 * i + 1
        return i - self.leaves


def pack_chunk(
    ends: np.ndarray, chunk_len: int, *, seq_len: int, rows: int, packing: str = "best_fit"
) -> PackedChunk:
    """Pack a chunk's documents (see the module doc) into exactly ``rows`` rows of
    ``seq_len + 1`` tokens."""
    if packing not in PACKINGS:
        raise ValueError(f"packing={packing!r} is not one of {PACKINGS}")
    capacity = seq_len + 1
    start, length = document_pieces(ends, chunk_len, seq_len)
    by_size = np.lexsort((start, -length))  # longest first, then in text order
    start, length = start[by_size], length[by_size]
    full = int(np.count_nonzero(length == capacity))
    if full > rows:
        raise AssertionError(f"{full} full pieces cannot take {rows} rows")
    row_of = list(range(full))  # a full piece fills a row of its own
    starts, lengths = start.tolist(), length.tolist()
    room = [0] * rows
    opened = full
    extra: list[tuple[int, int, int]] = []  # (row, start, length) of split parts
    split = 0
    best = packing == "best_fit"
    # best fit: rows with room, keyed room * rows + row, kept sorted (least room first);
    # first fit: the lowest row with room enough, found in a tree of rooms (a scan of the
    # open rows took 1.9 s a 64K-token chunk at seq_len 8)
    keys: list[int] = []
    rooms = None if best else _Rooms(rows)
    for i in range(full, len(lengths)):
        n = lengths[i]
        r = -1
        if best:
            at = bisect.bisect_left(keys, n * rows)
            if at < len(keys):
                r = keys.pop(at) % rows
        else:
            assert rooms is not None
            r = rooms.first_with(n)
        if r < 0 and opened < rows:
            r = opened
            opened += 1
            room[r] = capacity
        if r < 0:  # every row open and none holds it whole: split it over the roomiest
            split += 1
            a = starts[i]
            while True:
                if best:
                    r = keys[-1] % rows if keys else -1
                else:
                    assert rooms is not None
                    r = rooms.first_with(rooms.most)  # the first of the roomiest
                if r >= 0 and room[r] >= n:
                    if best:
                        keys.remove(room[r] * rows + r)
                    break
                if r < 0 or room[r] < 2:
                    raise AssertionError("a chunk's pieces outgrew its rows")
                part = room[r]
                if best:
                    keys.pop()
                extra.append((r, a, part))
                room[r] = 0
                if rooms is not None:
                    rooms.set(r, 0)
                a, n = a + part - 1, n - part + 1
            starts[i], lengths[i] = a, n
        row_of.append(r)
        room[r] -= n
        if best and room[r] > 0:
            bisect.insort(keys, room[r] * rows + r)
        if rooms is not None:
            rooms.set(r, room[r])
    row_of += [e[0] for e in extra]
    starts += [e[1] for e in extra]
    lengths += [e[2] for e in extra]
    row = np.asarray(row_of, dtype=np.int64)
    start, length = np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    order = np.lexsort((start, row))  # by row, each row's pieces in text order
    row, start, length = row[order], start[order], length[order]
    first = np.concatenate([[0], np.cumsum(np.bincount(row, minlength=rows))])
    ends = np.cumsum(length)
    at = ends - length - np.concatenate([[0], ends])[first[:-1]][row]
    return PackedChunk(
        rows=rows,
        first=first.astype(np.int64),
        spans=np.stack([start, length, at]).astype(np.int64),
        content=np.bincount(row, weights=length, minlength=rows).astype(np.int64),
        split=split,
    )
