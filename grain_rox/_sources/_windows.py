"""Read the windows an order (``_order._blocks``, ``_order._lanes``) names, a group at a time.

A window is ``seq_len + 1`` tokens of an epoch stream, in one or more *spans* (several when an
order strings unrelated text together); it can cross a chunk boundary, where the epoch stream
joins two unrelated chunks. For each group of samples the order plans together the reader
computes, vectorised, every window's *pieces* (shard, start, length) once and caches that
plan; a batch is then one slice copy per window (per piece where a window has several)
straight from the memory maps into one preallocated array, with the cast to the output dtype
done by the copy. Measured on 32 windows of 1025 tokens over 6 shards: 33 us, against 40-60
us for one fancy-index gather per shard, and a slice per window stays as cheap however many
shards a batch touches. Each read also says where its windows cross a chunk join,
for the segment features (``grain_rox._sources._segments``).
"""

from __future__ import annotations

import collections
import dataclasses
import threading

import numpy as np

from grain_rox._format._rox_corpus import RoxCorpus
from grain_rox._format._served_shards import ServedShards
from grain_rox._order._blocks import BlockOrder
from grain_rox._order._chunks import Rows
from grain_rox._order._lanes import LaneOrder
from grain_rox._order._packed import PackedOrder, PackedPieces
from grain_rox._order._value_groups import value_groups
from grain_rox._sources._process_local import ProcessLocal, process_local
from grain_rox._sources._segments import Joins

_PLAN_CACHE = 8
# A packed reader that reads on in order (it planned the group before) plans this many groups
# in one pass: a packed order's groups are small (64 rows, so that a cold lookup packs few
# chunks), and a plan's ~60 numpy calls cost little more for many rows. Plans of 1, 4, 8 and
# 16 groups at seq_len 512 (short documents): 106, 219, 299 and 529 us, so 53, 27, 19 and 17
# us a batch of 32 rows. A lookup out of order (a resume, a worker's strided reads) still
# plans its one group.
_PACKED_PLAN_AHEAD = 8
# ... and at most this many tokens of rows: a plan holds every piece of its rows as Python
# ints, which for long rows of short documents is many (seq_len 8192, documents of 5-99
# tokens: 16 plans of 64 rows held ~156k pieces, 40 MB); so 8 groups up to seq_len 2047,
# fewer above, one from 16383 (and the cache holds a pass and two groups, at least 8 plans)
_PACKED_PLAN_TOKENS = 1 << 20
# A read of at least this many windows per shard of the corpus gathers a shard's windows
# with one fancy index each rather than slicing each window: (256, 2049) over 6 shards,
# 255 us against 390 (a slice costs ~1.5 us a window, a gather ~5 us a shard).
_ROWS_PER_SHARD_GATHER = 8
# From a corpus of one shard (nothing to split by shard) the gather wins from 4 windows:
# 1025-token windows at random starts into rows of a batch, 4.2 us against 4.5 for 4,
# 5.1 against 6.2 for 6 (a mixed batch reads a few rows from each source).
_ONE_SHARD_GATHER = 4


@dataclasses.dataclass(frozen=True)
class _GroupPlan:
    """Pieces of every window of one group of samples, in slot order."""

    seq_len: np.ndarray  # (R,)
    first_piece: np.ndarray  # (R + 1,) row -> its pieces [first_piece[r], first_piece[r+1])
    single: np.ndarray  # (R,) bool: the window lies in one chunk (one piece)
    slot_shard: np.ndarray  # (R,) shard of the slot's first piece
    slot_start: np.ndarray  # (R,) start of the slot's first piece
    one_seq_len: bool  # every window of the group has one seq_len
    multi_before: np.ndarray  # (R + 1,) windows of several pieces among slots [0, r)
    content: np.ndarray | None  # (R,) tokens of each row, the rest padding (None: all full)
    # every piece: (shard, token offset inside it, length, offset inside the window), each
    # (P,), in row order (multi-piece windows are copied a slice per piece)
    pieces: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    packed: _PackedRows | None = None  # packed rows, for their copies (None: other orders)

    def pieces_of(self, slots: np.ndarray) -> list[list[tuple[int, int, int, int]]]:
        """The pieces of each of ``slots``, as Python ints, for a copy a slice per piece:
        sliced per slot for a few (a batch's one or two windows across a chunk join), in one
        vectorised pass for many, from the plan's lists for packed rows."""
        if self.packed is not None:
            return [self.packed.pieces_of(slot) for slot in slots.tolist()]
        fp = self.first_piece
        if slots.size <= 4:
            out = []
            for slot in slots.tolist():
                a, b = int(fp[slot]), int(fp[slot + 1])
                out.append(list(zip(*(x[a:b].tolist() for x in self.pieces), strict=True)))
            return out
        counts = fp[slots + 1] - fp[slots]
        at = np.repeat(fp[slots] - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        flat = list(zip(*(a[at].tolist() for a in self.pieces), strict=True))
        ends = np.cumsum(counts).tolist()
        return [flat[b - c : b] for b, c in zip(ends, counts.tolist(), strict=True)]

    def part(self, lo: int, size: int) -> _GroupPlan:
        """The plan of slots ``[lo, lo + size)``, as views: its pieces stay the whole plan's
        (``first_piece`` indexes them), and ``multi_before`` is only ever differenced."""
        hi = lo + size
        seq_len = self.seq_len[lo:hi]
        return _GroupPlan(
            seq_len=seq_len,
            first_piece=self.first_piece[lo : hi + 1],
            single=self.single[lo:hi],
            slot_shard=self.slot_shard[lo:hi],
            slot_start=self.slot_start[lo:hi],
            one_seq_len=self.one_seq_len or bool((seq_len == seq_len[0]).all()),
            multi_before=self.multi_before[lo : hi + 1],
            content=None if self.content is None else self.content[lo:hi],
            pieces=self.pieces,
            packed=None if self.packed is None else self.packed.part(lo, hi),
        )


@dataclasses.dataclass(frozen=True)
class _PackedRows:
    """A packed plan's rows as a batch copies them, made once a plan rather than a batch: a
    packed row has ~1-3 pieces (seq_len 512), each copied a slice at a time, and its joins (a
    piece's start after the row's first) are slices of the plan's, not lists a batch builds
    (~15 us a batch of 32 rows in the per-piece loop before)."""

    # every piece (shard, start, length, dest), in slot order; slot r's are [heads[r],
    # heads[r + 1]) (sliced by a read, not a plan: 25 us a plan of 256 rows)
    pieces: list[tuple[int, int, int, int]]
    heads: list[int]
    content: list[int]  # each slot's tokens before its padding
    join_first: np.ndarray  # (R + 1,) slot -> its joins [join_first[r], join_first[r + 1])
    join_slot: np.ndarray  # (J,) each join's slot in the whole pass, ascending
    join_column: np.ndarray  # (J,) its column, ascending within a slot
    first_slot: int = 0  # this part's first slot in the pass (join_slot is shared, not copied)

    def part(self, lo: int, hi: int) -> _PackedRows:
        """Slots ``[lo, hi)``: its joins stay the whole plan's (``join_first`` indexes them)."""
        return _PackedRows(
            pieces=self.pieces,
            heads=self.heads[lo : hi + 1],
            content=self.content[lo:hi],
            join_first=self.join_first[lo : hi + 1],
            join_slot=self.join_slot,
            join_column=self.join_column,
            first_slot=self.first_slot + lo,
        )

    def pieces_of(self, slot: int) -> list[tuple[int, int, int, int]]:
        """Slot ``slot``'s pieces, in the order they fill it."""
        return self.pieces[self.heads[slot] : self.heads[slot + 1]]

    def joins(self, lo: int, hi: int, rows: np.ndarray | None) -> Joins:
        """The joins of slots ``[lo, hi)``, by row of a read of them into ``rows`` (None:
        slot ``lo + i`` into row ``i``), sorted."""
        a, b = int(self.join_first[lo]), int(self.join_first[hi])
        at, columns = self.join_slot[a:b] - (self.first_slot + lo), self.join_column[a:b]
        if rows is None:
            return at, columns
        at = rows[at]
        if at.size > 1 and not bool((at[1:] >= at[:-1]).all()):
            return _sorted_joins(at, columns)
        return at, columns


class WindowReader(ProcessLocal):
    """Reads samples of one source into (n, seq_len + 1) token windows (thread-safe)."""

    # Round plans: rebuilt in each process.
    PROCESS_LOCAL = process_local(
        _lock=threading.Lock, _plans=collections.OrderedDict, _last=lambda: (-1, None)
    )
    _lock: threading.Lock
    _plans: collections.OrderedDict[int, _GroupPlan]
    _last: tuple[int, _GroupPlan | None]  # the plan read last: one atomic read, no lock

    def __init__(
        self, corpus: RoxCorpus | ServedShards, order: BlockOrder | LaneOrder | PackedOrder
    ) -> None:
        self.corpus = corpus
        self.order = order
        self._remote = corpus.remote
        self.packed = isinstance(order, PackedOrder)  # rows padded after their content
        self._ahead = 1  # groups a packed reader plans in one pass when it reads in order
        if isinstance(order, PackedOrder):
            rows_tokens = order.group * (order.max_seq_len + 1)
            self._ahead = max(1, min(_PACKED_PLAN_AHEAD, _PACKED_PLAN_TOKENS // rows_tokens))
        # a pass and the two groups before it (which tell that the reader reads in order)
        self._cache_size = max(_PLAN_CACHE, self._ahead + 2)
        # reads of at least this many windows gather per shard instead of slicing each one
        self._one_shard = len(corpus.paths) == 1
        self._gather_from = (
            _ONE_SHARD_GATHER if self._one_shard else _ROWS_PER_SHARD_GATHER * len(corpus.paths)
        )
        self.start_process_local()

    def _plan(self, group: int) -> _GroupPlan:
        last_group, last = self._last
        if last_group == group and last is not None:
            return last
        plan = self._plan_of(group)
        self._last = (group, plan)
        return plan

    def _plan_of(self, group: int) -> _GroupPlan:
        with self._lock:
            plan = self._plans.get(group)
            if plan is not None:
                self._plans.move_to_end(group)
                return plan
            # read on in order: the two groups before were planned (a cold read across two
            # groups, as a resume's first batch may be, plans only what it reads)
            in_order = group - 1 in self._plans and group - 2 in self._plans
        if self.packed:
            plans = self._packed_plans(group, self._ahead if in_order else 1)
        else:
            plans = [self._make_plan(group)]
        with self._lock:
            for g, made in enumerate(plans, start=group):
                self._plans[g] = made
                self._plans.move_to_end(g)
            while len(self._plans) > self._cache_size:
                self._plans.popitem(last=False)
        return plans[0]

    def _packed_plans(self, group: int, count: int) -> list[_GroupPlan]:
        """The plans of packed groups ``group, ..., group + count - 1``, made in one pass (as
        many of them as the order's scheduled samples fill; at least ``group``'s own)."""
        order = self.order
        assert isinstance(order, PackedOrder)
        size = order.group
        count = max(1, min(count, (order.sample_stop - group * size) // size))
        plan = _packed_plan(order.locate_pieces(np.arange(group * size, (group + count) * size)))
        return [plan] if count == 1 else [plan.part(j * size, size) for j in range(count)]

    def _make_plan(self, group: int) -> _GroupPlan:
        """The plan of a group of full windows (a block or lanes order; packed rows:
        :meth:`_packed_plans`)."""
        order = self.order
        assert not isinstance(order, PackedOrder)
        size = order.group
        rows = order.locate(np.arange(group * size, (group + 1) * size, dtype=np.int64))
        if rows.spans is None:
            first_piece, pieces = _window_pieces(order, rows)
        else:
            first_piece, pieces = _span_pieces(order, rows)
        pieces_per_row = np.diff(first_piece)
        head = first_piece[:-1]  # (a full window has at least one piece)
        single = pieces_per_row == 1
        multi_before = np.zeros(size + 1, dtype=np.int64)
        np.cumsum(~single, out=multi_before[1:])
        return _GroupPlan(
            seq_len=rows.seq_len,
            first_piece=first_piece,
            single=single,
            slot_shard=pieces[0].take(head),
            slot_start=pieces[1].take(head),
            one_seq_len=bool((rows.seq_len == rows.seq_len[0]).all()),
            multi_before=multi_before,
            content=None,
            pieces=pieces,
        )

    def _read_slots(
        self,
        group: int,
        lo: int,
        n: int,
        dtype: np.dtype,
        out: np.ndarray | None,
        rows: np.ndarray | None = None,
    ) -> tuple[np.ndarray, Joins | None] | None:
        """Fast path: consecutive slots ``[lo, lo + n)`` of one group, one seq_len (written to
        rows ``rows`` of ``out`` when given, else to an ``(n, seq_len + 1)`` ``out``)."""
        plan = self._plan(group)
        hi = lo + n
        width = int(plan.seq_len[lo]) + 1
        if n > 1 and not plan.one_seq_len and not (plan.seq_len[lo:hi] == width - 1).all():
            return None
        if rows is None:
            out = _destination(out, (n, width), dtype)
        assert out is not None
        single = plan.single[lo:hi]
        all_single = plan.multi_before[hi] == plan.multi_before[lo]
        shards, starts = plan.slot_shard[lo:hi], plan.slot_start[lo:hi]
        if not all_single:
            shards, starts = shards[single], starts[single]
        targets = slice(None) if all_single else np.flatnonzero(single)
        self._fill(shards, starts, width, out, targets if rows is None else rows[targets])
        joins = None
        if not all_single:
            multi = np.flatnonzero(~single)
            targets = multi if rows is None else rows[multi]
            if plan.packed is None:
                joins = self._copy_pieces(plan, lo + multi, out, targets)
            else:
                self._copy_packed(plan.packed, lo + multi, out, targets)
                joins = plan.packed.joins(lo, hi, rows)
        return out, joins

    def _fill(
        self,
        shards: np.ndarray,
        starts: np.ndarray,
        width: int,
        out: np.ndarray,
        targets: slice | np.ndarray,
    ) -> None:
        """Rows ``targets`` of ``out`` (a slice or row numbers) get the ``width``-token
        windows at ``starts`` of ``shards``: a slice copy per window from the memory maps, or,
        for a read of many windows per shard and for a bucket, one gather per shard (from a
        bucket all in one round trip)."""
        if not shards.size:
            return
        if not self._remote and shards.size < self._gather_from:
            rows = (
                targets.tolist()
                if isinstance(targets, np.ndarray)
                else range(*targets.indices(out.shape[0]))
            )
            _copy_rows(self.corpus, shards.tolist(), starts.tolist(), width, out, rows)
            return
        if self._one_shard:
            out[targets] = self.corpus.gather(0, starts, width)
            return
        listed = shards.tolist()  # a few: cheaper in Python than two numpy reductions
        lo = min(listed)
        if lo == max(listed):
            out[targets] = self.corpus.gather(lo, starts, width)
            return
        if isinstance(targets, slice):
            targets = np.arange(out.shape[0])[targets]
        ids = np.unique(shards).tolist()
        sels = [shards == s for s in ids]
        got = self.corpus.gather_many(
            [(s, starts[sel], width) for s, sel in zip(ids, sels, strict=True)]
        )
        for sel, rows_got in zip(sels, got, strict=True):
            out[targets[sel]] = rows_got

    def _copy_pieces(
        self,
        plan: _GroupPlan,
        slots: np.ndarray,
        out: np.ndarray,
        out_rows: np.ndarray,
    ) -> Joins:
        """Copy windows made of several pieces (``slots`` of ``plan``) into rows ``out_rows`` of
        ``out``, a slice copy per piece, and pad packed rows (with 0); returns their joins, by
        row of ``out``, sorted."""
        content = None if plan.content is None else plan.content[slots].tolist()
        pieces = plan.pieces_of(slots)
        remote = self._remote
        # a bucket's pieces come in one batch of requests; local ones are sliced from the maps
        fetched = iter(self._fetch_pieces(pieces) if remote else ())
        tokens: dict[int, np.ndarray] = {}  # each shard's memory map, looked up once
        join_rows: list[int] = []
        join_columns: list[int] = []
        for i, row in enumerate(out_rows.tolist()):
            for s, a, n, d in pieces[i]:
                if remote:
                    out[row, d : d + n] = next(fetched)
                else:
                    source = tokens.get(s)
                    if source is None:
                        source = tokens[s] = self.corpus.shard_tokens(s)
                    out[row, d : d + n] = source[a : a + n]
                if d:
                    join_rows.append(row)
                    join_columns.append(d)
            if content is not None:
                out[row, content[i] :] = 0
        joins = np.asarray(join_rows, np.int64), np.asarray(join_columns, np.int64)
        pairs = list(zip(join_rows, join_columns, strict=True))
        return joins if pairs == sorted(pairs) else _sorted_joins(*joins)

    def _copy_packed(
        self, rows: _PackedRows, slots: np.ndarray, out: np.ndarray, out_rows: np.ndarray
    ) -> None:
        """Copy packed rows ``slots`` into rows ``out_rows`` of ``out``, a slice copy per piece,
        and pad them with 0 (their joins: :meth:`_PackedRows.joins`)."""
        pieces, heads, content = rows.pieces, rows.heads, rows.content
        slot_list = slots.tolist()
        if self._remote:  # a bucket's pieces come in one batch of requests
            fetched = iter(self._fetch_pieces([rows.pieces_of(slot) for slot in slot_list]))
            for slot, row in zip(slot_list, out_rows.tolist(), strict=True):
                for _, _, n, d in rows.pieces_of(slot):
                    out[row, d : d + n] = next(fetched)
                out[row, content[slot] :] = 0
            return
        tokens: dict[int, np.ndarray] = {}  # each shard's memory map, looked up once
        for slot, row in zip(slot_list, out_rows.tolist(), strict=True):
            for s, a, n, d in pieces[heads[slot] : heads[slot + 1]]:
                source = tokens.get(s)
                if source is None:
                    source = tokens[s] = self.corpus.shard_tokens(s)
                out[row, d : d + n] = source[a : a + n]
            out[row, content[slot] :] = 0

    def _fetch_pieces(self, pieces: list[list[tuple[int, int, int, int]]]) -> list[np.ndarray]:
        """The tokens of every piece (in order) from a corpus in a bucket: all in one round
        trip of concurrent ranged requests."""
        by_shard: dict[int, list[int]] = {}
        spans: dict[int, list[tuple[int, int]]] = {}
        flat = [p for row in pieces for p in row]
        for i, (s, a, n, _) in enumerate(flat):
            by_shard.setdefault(s, []).append(i)
            spans.setdefault(s, []).append((a, a + n))
        got = self.corpus.shard_spans_many(list(spans.items()))
        data: list[np.ndarray] = [np.empty(0)] * len(flat)
        for ps, arrays in zip(by_shard.values(), got, strict=True):
            for i, array in zip(ps, arrays, strict=True):
                data[i] = array
        return data

    def row_content(self, samples: np.ndarray) -> np.ndarray | None:
        """Tokens of each sample's row, the rest padding (None: an order of full windows)."""
        if not self.packed:
            return None
        samples = np.asarray(samples, dtype=np.int64)
        size = self.order.group
        if _consecutive(samples, size):  # in one group: a slice of its plan's
            return self.run_content(int(samples[0]), samples.size)
        out = np.empty(samples.size, dtype=np.int64)
        groups = samples // size
        for j, sel in value_groups(groups):
            content = self._plan(j).content
            assert content is not None
            out[sel] = content[samples[sel] - j * size]
        return out

    def run_content(self, first: int, n: int) -> np.ndarray | None:
        """:meth:`row_content` of samples ``first, first + 1, ...`` (``n``), as
        :meth:`read_run` reads them: a slice of one plan's, without checking that they are
        consecutive (~3 us a batch)."""
        if not self.packed:
            return None
        size = self.order.group
        if first // size != (first + n - 1) // size:
            return self.row_content(np.arange(first, first + n, dtype=np.int64))
        content = self._plan(first // size).content
        assert content is not None
        return content[first % size : first % size + n].copy()

    def read_run(self, first: int, out: np.ndarray, rows: np.ndarray | None) -> Joins | None:
        """Samples ``first, first + 1, ...`` (one a row) into rows ``rows`` of ``out`` (a whole
        batch's buffer, written in place, in its dtype; None: every row, in order); returns the
        chunk joins of those rows, by row of ``out`` (None: no join). A batch reads each
        source's rows this way: a source's rows in a batch take consecutive samples of its own
        order (so a batch of one source reads without checking that its samples are)."""
        size = self.order.group
        n = out.shape[0] if rows is None else rows.size
        if first // size == (first + n - 1) // size:
            fast = self._read_slots(first // size, first % size, n, out.dtype, out, rows)
            if fast is not None:
                return fast[1]
        samples = np.arange(first, first + n, dtype=np.int64)
        if rows is None:
            return self.read(samples, dtype=out.dtype, out=out)[1]
        part, joins = self.read(samples, dtype=out.dtype)
        out[rows] = part
        return None if joins is None else _sorted_joins(rows[joins[0]], joins[1])

    def read(
        self, samples: np.ndarray, *, dtype: np.dtype, out: np.ndarray | None = None
    ) -> tuple[np.ndarray, Joins | None]:
        """Windows of ``samples`` as an (n, seq_len + 1) array of ``dtype`` (written into
        ``out`` when given: any (n, seq_len + 1) array, a strided view included), plus where
        they cross chunk joins (:data:`Joins`; None when no window crosses one).

        All samples must share one seq_len (one curriculum phase). Windows that lie in one
        chunk (nearly all) are copied a slice each from the memory maps (from a bucket: one
        gather per shard, in one round trip); the few that cross a chunk join, piece by piece.
        """
        samples = np.asarray(samples, dtype=np.int64)
        size = self.order.group
        first, n = int(samples[0]), samples.size
        if _consecutive(samples, size):
            fast = self._read_slots(first // size, first % size, n, dtype, out)
            if fast is not None:
                return fast
        groups = samples // size
        parts_joins: list[Joins] = []
        dest: np.ndarray | None = None  # out, once its shape is known
        first_group, last_group = int(groups[0]), int(groups[-1])
        group_ids = [first_group] if first_group == last_group else np.unique(groups).tolist()
        for j in group_ids:
            plan = self._plan(j)
            rows = np.arange(samples.size) if len(group_ids) == 1 else np.flatnonzero(groups == j)
            slots = samples[rows] - j * size
            width = int(plan.seq_len[slots[0]]) + 1
            if dest is None:
                dest = _destination(out, (samples.size, width), dtype)
            if np.any(plan.seq_len[slots] + 1 != width):
                raise ValueError("one read holds windows of one seq_len (one phase)")
            single = plan.single[slots]
            self._fill(plan.slot_shard[slots][single], plan.slot_start[slots][single], width,
                       dest, rows[single])  # fmt: skip
            if not single.all():
                parts_joins.append(self._copy_pieces(plan, slots[~single], dest, rows[~single]))
        assert dest is not None
        return dest, merge_joins(parts_joins)


_Pieces = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _window_pieces(order: BlockOrder | LaneOrder, rows: Rows) -> tuple[np.ndarray, _Pieces]:
    """``first_piece`` and the pieces (shard, start, length, offset in the window) of rows
    that are each one span of the epoch stream (nearly every plan's), cut where they cross a
    chunk: :func:`_span_pieces` without its span-to-row maps, ~20 fewer numpy calls."""
    c = order.chunk_tokens
    offset, width = rows.offset, rows.seq_len + 1
    first_q = offset // c
    counts = (offset + width - 1) // c - first_q + 1  # pieces of each row: one a chunk
    first_piece = np.zeros(offset.size + 1, dtype=np.int64)
    np.cumsum(counts, out=first_piece[1:])
    row = np.repeat(np.arange(offset.size), counts)
    q = np.repeat(first_q - first_piece[:-1], counts)  # each piece's chunk in the stream
    q += np.arange(row.size)
    phys = _physical_chunks(order, rows.epoch, row, q)
    shard, chunk_start = order.chunk_location(phys)
    lo = offset.take(row)
    chunk_lo = q * c
    piece_lo = np.maximum(chunk_lo, lo)
    chunk_lo += c  # the chunk's end
    piece_hi = np.minimum(chunk_lo, lo + width.take(row))
    chunk_start += piece_lo
    chunk_start -= chunk_lo - c  # the piece's start in its shard
    return first_piece, (shard, chunk_start, piece_hi - piece_lo, piece_lo - lo)


def _span_pieces(order: BlockOrder | LaneOrder, rows: Rows) -> tuple[np.ndarray, _Pieces]:
    """``first_piece`` and the pieces (shard, start, length, offset in the window) of rows of
    any spans (windows over holes), each span cut where it crosses a chunk."""
    span_row, span_offset, span_length, span_dest = rows.span_arrays()
    c = order.chunk_tokens
    first_q = span_offset // c
    last_q = (span_offset + span_length - 1) // c
    counts = last_q - first_q + 1  # pieces of each span: one per chunk it touches
    heads = np.concatenate([[0], np.cumsum(counts)])
    span_of_piece = np.repeat(np.arange(span_row.size), counts)
    q = first_q[span_of_piece] + np.arange(heads[-1]) - heads[span_of_piece]
    phys = _physical_chunks(order, rows.epoch, span_row[span_of_piece], q)
    shard, chunk_start = order.chunk_location(phys)
    lo = span_offset[span_of_piece]
    piece_lo = np.maximum(q * c, lo)
    piece_hi = np.minimum((q + 1) * c, lo + span_length[span_of_piece])
    start = chunk_start + (piece_lo - q * c)
    pieces_per_row = np.bincount(span_row[span_of_piece], minlength=rows.offset.size)
    first_piece = np.concatenate([[0], np.cumsum(pieces_per_row)])
    return first_piece, (
        shard,
        start,
        piece_hi - piece_lo,
        span_dest[span_of_piece] + piece_lo - lo,
    )


def _physical_chunks(
    order: BlockOrder | LaneOrder, epoch: np.ndarray, row: np.ndarray, q: np.ndarray
) -> np.ndarray:
    """The physical chunk of each piece (``q``: its chunk in the epoch stream of its row's
    epoch): the rows of one epoch (nearly always) without a per-piece epoch."""
    groups = value_groups(epoch)
    if len(groups) == 1:
        return order.physical_chunks(groups[0][0], q)
    piece_epoch = epoch[row]
    phys = np.empty_like(q)
    for e, sel in value_groups(piece_epoch):
        phys[sel] = order.physical_chunks(e, q[sel])
    return phys


def _packed_plan(rows: PackedPieces) -> _GroupPlan:
    """The plan of packed rows: each piece lies in one chunk, so in one shard, as the order
    gives it; a row reads alone (a slice) when one piece fills it."""
    first, content, seq_len = rows.first, rows.content, rows.seq_len
    columns = (rows.shard, rows.start, rows.length, rows.dest)
    listed = list(zip(*(a.tolist() for a in columns), strict=True))
    single = (first[1:] - first[:-1] == 1) & (content == seq_len + 1)
    size, pieces = seq_len.size, rows.shard.size
    head = np.minimum(first[:-1], max(pieces - 1, 0))  # a packed row may be empty
    return _GroupPlan(
        seq_len=seq_len,
        first_piece=first,
        single=single,
        slot_shard=rows.shard[head] if pieces else np.zeros(size, dtype=np.int64),
        slot_start=rows.start[head] if pieces else np.zeros(size, dtype=np.int64),
        one_seq_len=bool((seq_len == seq_len[0]).all()),
        multi_before=np.concatenate([[0], np.cumsum(~single)]),
        content=content,
        pieces=columns,
        packed=_PackedRows(
            listed, first.tolist(), content.tolist(), *_packed_joins(first, rows.dest)
        ),
    )


def _packed_joins(first: np.ndarray, dest: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where packed rows cross chunk joins (:class:`_PackedRows`' ``join_first``,
    ``join_slot``, ``join_column``): every piece that does not start its row (rows
    ``[first[r], first[r + 1])``'s pieces start at ``dest``), by row, sorted.

    >>> j = _packed_joins(np.array([0, 2, 3, 6]), np.array([0, 5, 0, 0, 9, 4]))
    >>> [a.tolist() for a in j]
    [[0, 1, 1, 3], [0, 2, 2], [5, 4, 9]]
    """
    at = np.flatnonzero(dest)  # the pieces of a join, in slot order
    slot = np.searchsorted(first, at, side="right") - 1
    column = dest[at]
    # a row's pieces come in the order they fill it (PackedPieces): sorted but for a check
    if slot.size > 1 and not ((column[1:] > column[:-1]) | (slot[1:] != slot[:-1])).all():
        order = np.lexsort((column, slot))
        slot, column = slot[order], column[order]
    return np.searchsorted(at, first), slot, column


def _sorted_joins(rows: np.ndarray, columns: np.ndarray) -> Joins:
    """``(rows, columns)`` sorted by row, then column (as a mask's ``np.nonzero`` gives them)."""
    order = np.lexsort((columns, rows))
    return rows[order], columns[order]


def merge_joins(parts: list[Joins]) -> Joins | None:
    """The joins of several reads into one batch (each by row of the batch, sorted), sorted;
    None when there are none.

    >>> merge_joins([(np.array([3]), np.array([5])), (np.array([1, 3]), np.array([2, 1]))])
    (array([1, 3, 3]), array([2, 1, 5]))
    """
    if len(parts) <= 1:
        return parts[0] if parts else None  # one read's joins come sorted
    return _sorted_joins(*(np.concatenate(c) for c in zip(*parts, strict=True)))


def _copy_rows(
    corpus: RoxCorpus | ServedShards,
    shards: list[int],
    starts: list[int],
    width: int,
    out: np.ndarray,
    targets: list[int] | range,
) -> None:
    """``out[t] = tokens of shards[i] from starts[i]`` for each target row ``t``: one slice copy
    (and cast) per window from the memory maps (see the module doc)."""
    maps: dict[int, np.ndarray] = {}
    for t, s, a in zip(targets, shards, starts, strict=True):
        tokens = maps.get(s)
        if tokens is None:
            tokens = maps[s] = corpus.shard_tokens(s)
        window = tokens[a : a + width]
        if window.shape[0] != width:  # never from a plan; a short slice would broadcast
            raise IndexError(
                f"window [{a}, {a + width}) lies outside shard {s} ({tokens.shape[0]} tokens)"
            )
        out[t] = window


def _destination(out: np.ndarray | None, shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
    """``out`` if given (it must have ``shape``), else a new array."""
    if out is None:
        return np.empty(shape, dtype=dtype)
    if out.shape != shape:
        raise ValueError(f"out has shape {out.shape}; these windows need {shape}")
    return out


def _consecutive(samples: np.ndarray, size: int) -> bool:
    """Whether ``samples`` are ``first, first + 1, ...`` within one group of ``size``.

    >>> _consecutive(np.array([4, 5, 6]), 8), _consecutive(np.array([4, 2, 6]), 8)
    (True, False)
    """
    first, n = int(samples[0]), samples.size
    if first // size != (first + n - 1) // size or int(samples[-1]) != first + n - 1:
        return False
    return n < 3 or bool(np.all(np.diff(samples) == 1))
