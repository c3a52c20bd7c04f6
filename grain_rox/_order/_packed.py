"""Where packed row ``s`` of a token source comes from: chunks packed into a fixed number of rows.

The order of ``TokenPipeline(packing="best_fit")``, a pure function of (data, seed, seq_len
schedule), so packed batches keep every contract of the unpacked pipeline:

* **Groups.** Each chunk of the epoch stream (``_chunks``: the source's 64K-token chunks in a
  seeded order per epoch) is a *group*: its documents (the stretches its EOS tokens end; the
  chunk's edges cut the first and last) are packed whole by ``_bin_packing`` into exactly
  ``rows_per_group(seq_len)`` rows, one number for all the source's chunks: one more than
  packing needed for 3 in 4 of 8 chunks sampled across the source (at least ``min_rows``,
  which lets any chunk fit; a chunk that needs more has its smallest leftover documents split,
  measured at 0-0.2% of documents on the embedded corpora). So row ``r`` of group ``g`` depends only on that
  chunk's tokens, ``seq_len`` and the sample, and rows are numbered in closed form. Finding documents needs no index: the chunk's EOS tokens are found when it is
  packed, in the memory map the rows are read from anyway.
* **Blocks.** Each epoch's groups are cut into near-equal blocks of at least
  ``block_tokens`` of text; a block's rows (its *grid*, at the seq_len of the sample that
  opens it) are served in a seeded Feistel permutation, so consecutive rows come from
  unrelated places of the block.
* **Seq_len changes.** When ``seq_len`` changes in mid-block, the block's rows not yet served
  are read on, in their permuted order, each cut into ``ceil(grid / seq_len)`` rows of the
  new length (one row when it is longer, with more padding), with a cursor that continues
  where it stopped: nothing is replayed and nothing skipped. The next block is packed at the
  new seq_len.

A sample's place depends only on the samples before it, and locating any sample costs
O(log #segments) plus one permutation evaluation and the packing of the chunks it reads
(cached per process), whatever the step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from grain_rox._order._bin_packing import (
    PACKINGS,
    PackedChunk,
    min_rows,
    pack_chunk,
    pack_open,
    with_rows,
)
from grain_rox._order._blocks import PLAN_GROUP
from grain_rox._order._chunks import ChunkStream, Rows, Run, Segment, schedule_runs
from grain_rox._order._pack_store import PackStore
from grain_rox._order._permutation import FeistelPermutation, PermutedRuns, derive_key
from grain_rox._order._value_groups import value_groups

_PURPOSE_PACKED_ROWS = 5
SAMPLE_CHUNKS = 8  # chunks packed to measure how many rows a chunk needs
DEFAULT_PACKED_BLOCK_TOKENS = 1 << 27
# a block's row permutation is evaluated this many consecutive slots at a time, and kept: a
# plan pass reads 256 of them, ~19 us of a 1,024-slot window (76 us) against ~8 of a 4,096 (135)
_PERMUTED_WINDOW = 4096
PACK_CACHE_BYTES = 64 << 20  # packed chunks a process keeps (then only the ones in use)
_CONT, _REST = 0, 1  # a Segment's kind: whole rows from global row ``slot`` of ``epoch`` on;
# or the rest of one block's grid at ``grid``, cut at ``seq_len``, from grid row ``slot``,
# token ``cursor``

# (shard, token offset of a chunk in it) -> the exclusive ends of the chunk's documents
ChunkDocuments = Callable[[int, int], np.ndarray]


class PackedOrder(ChunkStream):
    """The sample -> packed row map of one source (see the module doc).

    Args:
      shard_tokens: Tokens of each shard.
      seed: The source's seed.
      chunk_tokens: Tokens per chunk (a group packed on its own).
      runs: The source's seq_len runs (from the schedule).
      documents: (shard, offset of a chunk in it) -> the chunk's documents' exclusive ends.
      packing: ``"best_fit"`` or ``"first_fit"``.
      block_tokens: The least text per shuffled block.
      max_seq_len: The longest seq_len (default: the schedule's).

    >>> tokens = np.tile(np.r_[np.arange(1, 10), 0], 100)  # 100 documents of 10 tokens
    >>> ends = lambda shard, at: np.flatnonzero(tokens[at:at + 200] == 0) + 1
    >>> order = PackedOrder([1000], seed=0, chunk_tokens=200, runs=[Run(0, 10**18, 19)],
    ...                     documents=ends)
    >>> order.rows_per_group(19), order.windows_per_epoch
    (12, 60)
    >>> rows = order.locate(np.arange(60))
    >>> int(np.bincount(rows.content, minlength=21)[20]), int(rows.content.sum())
    (50, 1000)
    """

    name = "blocks"
    # rows a reader plans together: each may read another chunk, packed when first read, so
    # fewer than the other orders' PLAN_GROUP keep a cold lookup (a resume) to a few chunks
    group = PLAN_GROUP // 16

    def __init__(
        self,
        shard_tokens: Sequence[int],
        *,
        seed: int,
        chunk_tokens: int,
        runs: Sequence[Run],
        documents: ChunkDocuments,
        packing: str = "best_fit",
        block_tokens: int = DEFAULT_PACKED_BLOCK_TOKENS,
        max_seq_len: int | None = None,
    ) -> None:
        super().__init__(shard_tokens, seed=seed, chunk_tokens=chunk_tokens)
        if packing not in PACKINGS:
            raise ValueError(f"packing={packing!r} is not one of {PACKINGS} (or None)")
        self.packing = packing
        self.documents = documents
        self._rows_per_group: dict[int, int] = {}
        self._start_process_local()  # before the lay-out, which samples chunks into it
        self.runs, self.max_seq_len = schedule_runs(runs, max_seq_len)
        self.block_tokens = int(block_tokens)
        self.num_blocks = max(1, self.num_chunks // max(1, self.block_tokens // self.chunk_tokens))
        self._base, self._long = divmod(self.num_chunks, self.num_blocks)
        self._segments = _lay_out(self)
        self._starts = np.asarray([s.start for s in self._segments], dtype=np.int64)
        self.sample_stop = self._segments[-1].stop  # samples [0, sample_stop) are scheduled

    def _start_process_local(self) -> None:
        self._store = PackStore(PACK_CACHE_BYTES)
        # (physical chunk, seq_len) -> the chunk as rows_per_group packed it to measure, kept
        # until it is first read (packing costs ~0.1 ms a chunk; 8 per seq_len are sampled)
        self._sampled: dict[tuple[int, int], PackedChunk] = {}
        self._permutations: dict[tuple[int, int, int], FeistelPermutation] = {}
        self._permuted = PermutedRuns(_PERMUTED_WINDOW)

    def __getstate__(self) -> dict[str, object]:
        state = super().__getstate__()
        for key in ("_store", "_sampled", "_permutations", "_permuted"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._start_process_local()

    # ---- geometry (closed forms) ----------------------------------------------------------
    def rows_per_group(self, seq_len: int) -> int:
        """Rows each chunk is packed into at ``seq_len`` (see the module doc; measured once)."""
        rows = self._rows_per_group.get(seq_len)
        if rows is None:
            picks = np.unique(np.linspace(0, self.num_chunks - 1, SAMPLE_CHUNKS).astype(np.int64))
            shards, starts = self.chunk_location(picks)
            packed = [
                pack_open(self.documents(shard, start), self.chunk_tokens, seq_len=seq_len,
                          packing=self.packing)
                for shard, start in zip(shards.tolist(), starts.tolist(), strict=True)
            ]  # fmt: skip
            used = [p.opened for p in packed]
            enough = math.ceil(float(np.percentile(used, 75))) + 1
            rows = max(min_rows(self.chunk_tokens, seq_len), enough)
            self._rows_per_group[seq_len] = rows
            for chunk, p, u in zip(picks.tolist(), packed, used, strict=True):
                if u <= rows:  # as _pack would pack it: kept for its first read
                    self._sampled[(chunk, seq_len)] = p
        return rows

    def groups_before(self, block: np.ndarray | int) -> np.ndarray:
        """Groups (chunks) of an epoch's blocks before ``block``."""
        return np.asarray(block) * self._base + np.minimum(block, self._long)

    def block_groups(self, block: np.ndarray | int) -> np.ndarray:
        return self._base + (np.asarray(block) < self._long)

    def block_of_group(self, group: np.ndarray) -> np.ndarray:
        in_long = self._long * (self._base + 1)
        return np.where(
            group < in_long,
            group // (self._base + 1),
            self._long + (group - in_long) // max(self._base, 1),
        )

    def epoch_rows(self, seq_len: int) -> int:
        return self.num_chunks * self.rows_per_group(seq_len)

    def row_permutation(self, epoch: int, block: int, grid: int) -> FeistelPermutation:
        """The order of a block's rows (its grid: ``grid`` is the seq_len that opened it);
        the last few are kept, as a block is read for many batches."""
        permutation = self._permutations.get((epoch, block, grid))
        if permutation is None:
            n = int(self.block_groups(block)) * self.rows_per_group(grid)
            key = derive_key(self.seed, _PURPOSE_PACKED_ROWS, epoch, block)
            permutation = FeistelPermutation(n, key)
            if len(self._permutations) >= 16:
                self._permutations.clear()
            self._permutations[(epoch, block, grid)] = permutation
        return permutation

    def permuted_rows(self, epoch: int, block: int, grid: int, slots: np.ndarray) -> np.ndarray:
        """``row_permutation(epoch, block, grid)(slots)``: for consecutive slots (a plan's
        rows of one block, nearly always) read from the permutation of the
        ``_PERMUTED_WINDOW`` slots around them, evaluated once and kept (the last few)."""
        return self._permuted(
            (epoch, block, grid), lambda: self.row_permutation(epoch, block, grid), slots
        )

    def padded_rests(self) -> list[tuple[int, int, int]]:
        """``(rows, grid, seq_len)`` of each stretch where a longer ``seq_len`` reads on a
        block packed at ``grid``: each of those rows holds one grid row (at most ``grid + 1``
        tokens), the rest padding (see the module doc)."""
        return [
            (s.stop - s.start, s.grid, s.seq_len)
            for s in self._segments
            if s.kind == _REST and s.seq_len > s.grid
        ]

    # ---- what the pipeline asks -----------------------------------------------------------
    @property
    def windows_per_epoch(self) -> int:
        """Rows in a fresh epoch under the first run's seq_len."""
        return self.epoch_rows(self.runs[0].seq_len)

    @property
    def max_joins(self) -> int:
        return self.max_seq_len

    def identity(self) -> dict[str, object]:
        """What a checkpoint names of this order besides the schedule and seed."""
        return {"block_tokens": self.block_tokens, "packing": self.packing}

    def _pack(self, key: int) -> PackedChunk:
        """The chunk of ``key`` (``physical chunk * (max_seq_len + 1) + seq_len``) packed."""
        chunk, seq_len = divmod(key, self.max_seq_len + 1)
        sampled = self._sampled.pop((chunk, seq_len), None)
        if sampled is not None:
            return with_rows(sampled, self.rows_per_group(seq_len))
        shard, start = self.chunk_location(np.asarray([chunk]))
        return pack_chunk(
            self.documents(int(shard[0]), int(start[0])),
            self.chunk_tokens,
            seq_len=seq_len,
            rows=self.rows_per_group(seq_len),
            packing=self.packing,
        )

    @property
    def _packed_bytes(self) -> int:
        """Bytes of the packed chunks this process holds."""
        return self._store.nbytes

    def locate(self, samples: np.ndarray) -> Rows:
        """Epoch, spans, seq_len and content of each sample (any order, in the schedule)."""
        cursor = self._cursor(samples)
        epoch, seq_len = cursor[0], cursor[4]
        n = seq_len.size
        span_row, position, _, start, length, dest, content = self._spans(*cursor)
        stream = position[span_row] * self.chunk_tokens + start
        first = np.zeros(n, dtype=np.int64)
        head = np.ones(span_row.size, dtype=bool)  # each row's first span (rows are sorted)
        np.not_equal(span_row[1:], span_row[:-1], out=head[1:])
        first[span_row[head]] = stream[head]
        return Rows(epoch, first, seq_len, (span_row, stream, length, dest), content=content)

    def locate_pieces(self, samples: np.ndarray) -> PackedPieces:
        """The pieces of each sample's row where the shards hold them (what a reader copies):
        :meth:`locate` without the detour through epoch-stream offsets, as a packed piece
        never crosses a chunk.

        >>> tokens = np.tile(np.r_[np.arange(1, 10), 0], 100)
        >>> ends = lambda shard, at: np.flatnonzero(tokens[at:at + 200] == 0) + 1
        >>> order = PackedOrder([1000], seed=0, chunk_tokens=200, runs=[Run(0, 10**18, 19)],
        ...                     documents=ends)
        >>> p = order.locate_pieces(np.arange(60))
        >>> int(p.content.sum()), int(p.length.sum()), p.first.size
        (1000, 1000, 61)
        """
        cursor = self._cursor(samples)
        seq_len = cursor[4]
        span_row, _, phys, start, length, dest, content = self._spans(*cursor)
        shard, chunk_start = self.chunk_location(phys)
        first = np.zeros(seq_len.size + 1, dtype=np.int64)
        np.cumsum(np.bincount(span_row, minlength=seq_len.size), out=first[1:])
        return PackedPieces(seq_len, content, first, shard[span_row],
                            chunk_start[span_row] + start, length, dest)  # fmt: skip

    def _cursor(
        self, samples: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]:
        """(epoch, block, grid slot, offset in the grid row, seq_len, grid) of each sample, and
        whether every sample reads whole grid rows (no ``_REST`` segment: offset 0 and
        seq_len == grid throughout)."""
        samples = np.asarray(samples, dtype=np.int64)
        n = samples.size
        seg = np.searchsorted(self._starts, samples, side="right") - 1
        epoch = np.empty(n, dtype=np.int64)
        block = np.empty(n, dtype=np.int64)
        slot = np.empty(n, dtype=np.int64)
        offset = np.empty(n, dtype=np.int64)
        seq_len = np.empty(n, dtype=np.int64)
        grid = np.empty(n, dtype=np.int64)
        whole = True
        for k, sel in value_groups(seg):
            if k < 0 or samples[sel].max() >= self._segments[k].stop:
                raise IndexError(f"samples {samples[sel]} lie outside the schedule's samples")
            segment = self._segments[k]
            t = samples[sel] - segment.start
            seq_len[sel] = s = segment.seq_len
            if segment.kind == _CONT:
                rows = self.rows_per_group(s)
                per_epoch = self.num_chunks * rows
                j = segment.slot + t
                epoch[sel] = segment.epoch + j // per_epoch
                w = j % per_epoch
                block[sel] = b = self.block_of_group(w // rows)
                slot[sel] = w - self.groups_before(b) * rows
                offset[sel] = 0
                grid[sel] = s
            else:
                whole = False
                epoch[sel], block[sel], grid[sel] = segment.epoch, segment.block, segment.grid
                slot[sel], offset[sel] = _rest_cursor(segment, t)
        return epoch, block, slot, offset, seq_len, grid, whole

    def _grid_rows(
        self, epoch: np.ndarray, block: np.ndarray, slot: np.ndarray, grid: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(chunk position in the epoch stream, row in its chunk, physical chunk) of grid
        slots: the rows of one block (nearly every plan's) in Python scalars of that block,
        ~15 us less than per-row arrays of its rows per group."""
        blocks = epoch * self.num_blocks + block  # a block's rows have one grid seq_len
        groups = value_groups(blocks)
        if len(groups) == 1:
            e, b = divmod(groups[0][0], self.num_blocks)
            g = int(grid[0])
            permuted = self.permuted_rows(e, b, g, slot)
            position, row = np.divmod(permuted, self.rows_per_group(g))
            position += int(self.groups_before(b))
            return position, row, self.physical_chunks(e, position)
        n = slot.size
        permuted = np.empty(n, dtype=np.int64)
        per_group = np.empty(n, dtype=np.int64)
        for key, sel in groups:
            e, b = divmod(key, self.num_blocks)
            g = int(grid[sel][0])
            permuted[sel] = self.permuted_rows(e, b, g, slot[sel])
            per_group[sel] = self.rows_per_group(g)
        position = self.groups_before(block) + permuted // per_group  # in the epoch stream
        row = permuted % per_group
        phys = np.empty(n, dtype=np.int64)
        for e, sel in value_groups(epoch):
            phys[sel] = self.physical_chunks(e, position[sel])
        return position, row, phys

    def _spans(
        self,
        epoch: np.ndarray,
        block: np.ndarray,
        slot: np.ndarray,
        offset: np.ndarray,
        seq_len: np.ndarray,
        grid: np.ndarray,
        whole: bool,
    ) -> tuple[np.ndarray, ...]:
        """The spans of rows given as (epoch, block, grid slot, offset in the grid row):
        (row of each span (ascending), each row's chunk position in its epoch stream and
        physical chunk, each span's offset in its chunk, length and offset in its row, each
        row's content). ``whole``: every row is a whole grid row (nothing to cut)."""
        n = slot.size
        position, row, phys = self._grid_rows(epoch, block, slot, grid)
        # every chunk read (packed when first read), its pieces looked up for all rows at once
        base, firsts, spans = self._store.rows(phys * (self.max_seq_len + 1) + grid, self._pack)
        at_row = base + row
        lo = firsts.take(at_row)
        at_row += 1
        counts = firsts.take(at_row) - lo
        span_row = np.repeat(np.arange(n), counts)
        lo -= np.cumsum(counts) - counts  # each row's first piece, less its first span
        piece = np.repeat(lo, counts)
        piece += np.arange(span_row.size)
        # a take along the pieces: ~2.5x faster than spans[:, piece] (a fancy index)
        start, length, at = spans.take(piece, axis=1)
        if not whole:  # cut each grid row to the window [offset, offset + seq_len + 1)
            o = offset[span_row]
            a = np.maximum(at, o)
            z = np.minimum(at + length, o + seq_len[span_row] + 1)
            keep = z > a
            span_row, a, z, o = span_row[keep], a[keep], z[keep], o[keep]
            start, length, at = start[keep] + a - at[keep], z - a, a - o
        content = np.bincount(span_row, weights=length, minlength=n).astype(np.int64)
        return span_row, position, phys, start, length, at, content


@dataclasses.dataclass(frozen=True)
class PackedPieces:
    """Where the rows of samples lie in the shards: row ``r`` is pieces
    ``[first[r], first[r + 1])``, in the order they fill it, then padding up to
    ``seq_len[r] + 1`` tokens (:meth:`PackedOrder.locate_pieces`)."""

    seq_len: np.ndarray  # (R,) int64
    content: np.ndarray  # (R,) tokens of each row before its padding
    first: np.ndarray  # (R + 1,)
    shard: np.ndarray  # (P,) each piece's shard
    start: np.ndarray  # (P,) its token offset in the shard
    length: np.ndarray  # (P,) its tokens
    dest: np.ndarray  # (P,) its offset in its row


def _rest_rows(grid: int, seq_len: int, offset: int) -> int:
    """Rows of ``seq_len`` that the rest of a grid row from token ``offset`` is cut into."""
    return max(0, -(-(grid - offset) // seq_len))


def _rest_cursor(segment: Segment, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(grid slot, offset in the grid row) of the ``t``-th row of a ``_REST`` segment."""
    g, s = segment.grid, segment.seq_len
    head = _rest_rows(g, s, segment.cursor) if segment.cursor else 0
    m = _rest_rows(g, s, 0)
    after = np.maximum(t - head, 0)
    in_head = t < head
    slot = np.where(in_head, segment.slot, segment.slot + (head > 0) + after // m)
    offset = np.where(in_head, segment.cursor + t * s, (after % m) * s)
    return slot, offset


def _lay_out(order: PackedOrder) -> list[Segment]:
    """The segments of ``order.runs`` (see the module doc)."""
    segments: list[Segment] = []
    epoch, block, grid, slot, offset = 0, 0, 0, 0, 0  # grid == 0: the block has not begun
    cut = False  # the block's grid is read at another seq_len since a change
    for run in order.runs:
        x, n, s = run.start, run.stop - run.start, run.seq_len
        if grid and grid != s:
            cut = True
        if cut:
            rows = int(order.block_groups(block)) * order.rows_per_group(grid)
            head = _rest_rows(grid, s, offset) if offset else 0
            m = _rest_rows(grid, s, 0)
            left = head + (rows - slot - (offset > 0)) * m
            t = min(n, left)
            segment = Segment(x, x + t, _REST, epoch, block, slot, s, grid, offset)
            if t:
                segments.append(segment)
            x, n = x + t, n - t
            if t < left:
                end_slot, end_offset = _rest_cursor(segment, np.asarray([t]))
                slot, offset = int(end_slot[0]), int(end_offset[0])
                continue
            epoch, block = (epoch, block + 1) if block + 1 < order.num_blocks else (epoch + 1, 0)
            grid, slot, offset, cut = 0, 0, 0, False
        if n == 0:
            continue
        rows = order.rows_per_group(s)
        first = int(order.groups_before(block)) * rows + slot
        segments.append(Segment(x, x + n, _CONT, epoch, block, first, s))
        j = first + n
        per_epoch = order.num_chunks * rows
        epoch += j // per_epoch
        w = j % per_epoch
        block = int(order.block_of_group(np.asarray(w // rows)))
        slot = w - int(order.groups_before(block)) * rows
        grid = s if slot else 0
    return segments
