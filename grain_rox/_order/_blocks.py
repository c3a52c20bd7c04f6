"""Where sample ``s`` of a token source comes from: blocks of the epoch stream, shuffled whole.

The default order of a source, a pure function of (shard sizes, seed, seq_len schedule):

* **Blocks.** Each epoch stream (``_chunks``: the source's 64K-token chunks in a seeded order)
  is cut into ``floor(stream / block_tokens)`` contiguous blocks of near-equal size, each at
  least ``block_tokens`` (default 512 Mi) and under twice that: the whole stream when it is
  smaller. Epochs and their blocks are read one after the other.
* **Windows.** A block begins with the seq_len ``s`` of the sample that opens it and is cut
  into windows of ``s + 1`` tokens with stride ``s`` (its *grid*); the grid's windows are
  served in the order of a seeded Feistel permutation of the block. So any step draws from a
  pool of at least ``min(stream, block_tokens)`` tokens, and two windows of one document land a third
  of a block apart on average, with no fixed period (``docs/order.md`` measures it).
* **Holes.** When ``seq_len`` changes in mid-block (a curriculum phase ends, or is cut short
  at a restore), the block's windows not yet served are strung together in their permuted
  order into a stream of *holes*, each a whole window of ``s + 1`` tokens (all ``s`` of its
  next-token pairs), and the new phase reads that stream front to back in windows of its own
  seq_len, like a cursor: no pair is replayed and none skipped. Each hole is
  unrelated text to the next, so a window over holes crosses *joins* (new segments, as at a
  chunk join). Then the next block begins a fresh grid. A sample's place depends only on the
  samples before it, so a schedule changed from some step on never moves served batches.

Per block, the grid's tail shorter than a window (under ``s`` tokens) and the hole stream's
last partial window are not served: under one window per block and per seq_len change.
Locating any sample costs O(log #segments) plus one vectorised permutation evaluation,
whatever the step, where the segments (about two per seq_len run) are laid out once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from grain_rox._order._chunks import ChunkStream, Rows, Run, Segment, schedule_runs
from grain_rox._order._permutation import FeistelPermutation, PermutedRuns, derive_key
from grain_rox._order._value_groups import value_groups

_PURPOSE_WINDOWS = 3
DEFAULT_BLOCK_TOKENS = 1 << 29
PLAN_GROUP = 1024  # samples a reader plans (and caches) together
# a block's window permutation is evaluated this many consecutive slots at a time, and kept:
# a plan reads 1,024 of them, ~76 us evaluated alone against ~26 from an 8,192-slot window
_PERMUTED_WINDOW = 8 * PLAN_GROUP
_GRID, _HOLES = 0, 1  # a Segment's kind: grid windows from ``slot`` on, through later blocks
# and epochs; or a block's hole stream (grid seq_len ``grid``, first unserved grid slot ``slot``,
# from token ``cursor`` of the stream)


class BlockOrder(ChunkStream):
    """The sample -> (epoch, epoch-stream spans) map of one source (see the module doc).

    >>> order = BlockOrder([1000], seed=0, chunk_tokens=100, runs=[Run(0, 10**18, 9)])
    >>> order.num_blocks, order.windows_per_epoch  # one block: a full permutation
    (1, 111)
    >>> rows = order.locate(np.arange(111))
    >>> sorted(rows.offset.tolist()) == list(range(0, 999, 9)), set(rows.epoch.tolist())
    (True, {0})
    >>> halves = BlockOrder([1000], seed=0, chunk_tokens=100, block_tokens=500,
    ...                     runs=[Run(0, 10**18, 9)])
    >>> first = halves.locate(np.arange(55)).offset  # block 0 (tokens 0-499) comes first
    >>> halves.num_blocks, bool(first.max() < 500)
    (2, True)
    """

    name = "blocks"
    group = PLAN_GROUP

    def __init__(
        self,
        shard_tokens: Sequence[int],
        *,
        seed: int,
        chunk_tokens: int,
        runs: Sequence[Run],
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
        max_seq_len: int | None = None,
    ) -> None:
        super().__init__(shard_tokens, seed=seed, chunk_tokens=chunk_tokens)
        self.runs, self.max_seq_len = schedule_runs(runs, max_seq_len)
        self.block_tokens = int(block_tokens)
        window = self.max_seq_len + 1
        if self.block_tokens < window:
            raise ValueError(
                f"block_tokens={block_tokens} cannot hold one window of seq_len "
                f"{self.max_seq_len} + 1; pass block_tokens >= {window}"
            )
        if self.stream_tokens < window:
            raise ValueError(
                f"{self.stream_tokens} usable tokens ({self.num_chunks} chunks of "
                f"{self.chunk_tokens}) cannot hold one window of seq_len {self.max_seq_len} + 1; "
                "use a smaller chunk_tokens or seq_len, or more data"
            )
        self.num_blocks = max(1, self.stream_tokens // self.block_tokens)
        # blocks 0..long-1 hold size + 1 tokens, the rest size: near-equal, in closed form
        self._size, self._long = divmod(self.stream_tokens, self.num_blocks)
        self._permutations: dict[tuple[int, int, int], FeistelPermutation] = {}
        self._permuted = PermutedRuns(_PERMUTED_WINDOW)
        self._epoch_windows: dict[int, int] = {}
        self._segments = _lay_out(self)
        self._starts = np.asarray([s.start for s in self._segments], dtype=np.int64)

    def __getstate__(self) -> dict[str, object]:
        # caches, never pickled
        return {
            **super().__getstate__(),
            "_permutations": {},
            "_permuted": PermutedRuns(_PERMUTED_WINDOW),
        }

    # ---- the block geometry of every epoch (closed forms) -------------------------------
    def block_start(self, block: np.ndarray | int) -> np.ndarray:
        """Token offset of ``block`` in its epoch stream."""
        return np.asarray(block) * self._size + np.minimum(block, self._long)

    def _windows_per_block(self, seq_len: int) -> tuple[int, int]:
        """Grid windows of ``seq_len`` in a long block (``size + 1`` tokens) and in a short one."""
        return self._size // seq_len, (self._size - 1) // seq_len

    def block_windows(self, block: np.ndarray | int, seq_len: int) -> np.ndarray:
        """Grid windows of ``seq_len`` in ``block``."""
        return (self._size + (np.asarray(block) < self._long) - 1) // seq_len

    def windows_before(self, block: np.ndarray | int, seq_len: int) -> np.ndarray:
        """Grid windows of ``seq_len`` in an epoch's blocks before ``block``."""
        block = np.asarray(block)
        long_n, short_n = self._windows_per_block(seq_len)
        return np.minimum(block, self._long) * long_n + np.maximum(block - self._long, 0) * short_n

    def epoch_windows(self, seq_len: int) -> int:
        """Grid windows of ``seq_len`` in one epoch."""
        return int(self.windows_before(self.num_blocks, seq_len))

    def block_of(self, window: np.ndarray, seq_len: int) -> np.ndarray:
        """The block holding an epoch's ``window``-th grid window of ``seq_len``."""
        long_n, short_n = self._windows_per_block(seq_len)
        in_long = self._long * long_n
        return np.where(
            window < in_long,
            window // max(long_n, 1),
            self._long + (window - in_long) // short_n,
        )

    def window_permutation(self, epoch: int, block: int, seq_len: int) -> FeistelPermutation:
        key = (epoch, block, seq_len)
        perm = self._permutations.get(key)
        if perm is None:  # a block serves many plans: its permutation is set up once
            n = int(self.block_windows(block, seq_len))
            perm = FeistelPermutation(n, derive_key(self.seed, _PURPOSE_WINDOWS, epoch, block))
            if len(self._permutations) >= 8:
                self._permutations.clear()
            self._permutations[key] = perm
        return perm

    def _permuted_windows(
        self, epoch: int, block: int, seq_len: int, slots: np.ndarray
    ) -> np.ndarray:
        """``window_permutation(epoch, block, seq_len)(slots)``, for consecutive slots (a
        plan's, nearly always) read from the kept windows of ``_PERMUTED_WINDOW`` slots."""
        return self._permuted(
            (epoch, block, seq_len), lambda: self.window_permutation(epoch, block, seq_len), slots
        )

    # ---- what the pipeline asks -----------------------------------------------------------
    @property
    def windows_per_epoch(self) -> int:
        """Samples in a fresh epoch under the first run's seq_len."""
        return self.epoch_windows(self.runs[0].seq_len)

    @property
    def max_joins(self) -> int:
        """The most joins (chunk joins, and joins between holes) one window can cross: for a
        window of ``s`` over holes of an earlier grid ``g``, up to ``s // g + 2`` holes, each
        crossing up to ``ceil(min(s, g) / chunk)`` chunk joins; never more than ``s``."""
        c = self.chunk_tokens
        joins = min(self.max_seq_len, math.ceil(self.max_seq_len / c))
        lens = [r.seq_len for r in self.runs]
        for i, grid in enumerate(lens):
            for s in set(lens[i + 1 :]) - {grid}:  # a later seq_len reads this grid's holes
                pieces = s // grid + 2
                joins = max(joins, min(s, pieces - 1 + pieces * math.ceil(min(s, grid) / c)))
        return joins

    def identity(self) -> dict[str, int]:
        """What a checkpoint names of this order besides the schedule and seed."""
        return {"block_tokens": self.block_tokens}

    @property
    def reads_holes(self) -> bool:
        """Whether the schedule reads a block's unserved windows as holes (a seq_len change
        in mid-block). Holes are whole windows; an earlier grain_rox read each one token
        short (losing its last pair), so a state names them (see ``TokenPipeline.describe``)."""
        return any(segment.kind == _HOLES for segment in self._segments)

    def locate(self, samples: np.ndarray) -> Rows:
        """Epoch, spans and seq_len of each sample (any order, any values in the schedule)."""
        samples = np.asarray(samples, dtype=np.int64)
        seg = np.searchsorted(self._starts, samples, side="right") - 1
        n = samples.size
        groups = value_groups(seg)
        if len(groups) == 1 and groups[0][0] >= 0:  # one segment (a plan's nearly always)
            segment = self._segments[groups[0][0]]
            if segment.kind == _GRID and int(samples.max()) < segment.stop:
                epoch, offset = self._grid_rows(segment, samples)
                return Rows(epoch, offset, np.full(n, segment.seq_len, dtype=np.int64))
        epoch = np.empty(n, dtype=np.int64)
        offset = np.empty(n, dtype=np.int64)
        seq_len = np.empty(n, dtype=np.int64)
        extra: list[tuple[np.ndarray, ...]] = []
        for k, sel in groups:
            mine = samples[sel]
            if k < 0 or mine.max() >= self._segments[k].stop:
                raise IndexError(f"samples {mine} lie outside the schedule's samples")
            segment = self._segments[k]
            seq_len[sel] = segment.seq_len
            if segment.kind == _GRID:
                epoch[sel], offset[sel] = self._grid_rows(segment, mine)
            else:
                epoch[sel] = segment.epoch
                spans = self._hole_spans(segment, mine)
                offset[sel] = spans[1][np.searchsorted(spans[0], np.arange(mine.size))]
                where = np.arange(n)[sel]  # these samples' rows
                extra.append((where[spans[0]], *spans[1:]))
        rows = Rows(epoch, offset, seq_len)
        if not extra:
            return rows
        single = np.ones(n, dtype=bool)
        for part in extra:
            single[part[0]] = False
        plain = rows.span_arrays()
        keep = single[plain[0]]
        cols = [np.concatenate([plain[i][keep], *(p[i] for p in extra)]) for i in range(4)]
        by_row = np.lexsort((cols[3], cols[0]))
        return Rows(
            epoch,
            offset,
            seq_len,
            (cols[0][by_row], cols[1][by_row], cols[2][by_row], cols[3][by_row]),
        )

    def _grid_rows(self, segment: Segment, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        one = self._one_block_rows(segment, samples)
        if one is not None:
            return one
        s = segment.seq_len
        per_epoch = self.epoch_windows(s)
        j = segment.slot + (samples - segment.start)
        epoch = segment.epoch + j // per_epoch
        w = j % per_epoch
        block = self.block_of(w, s)
        slot = w - self.windows_before(block, s)
        offset = np.empty_like(samples)
        for pair, sel in value_groups(epoch * self.num_blocks + block):
            e, b = divmod(pair, self.num_blocks)
            grid = self._permuted_windows(e, b, s, slot[sel]) * s
            grid += self.block_start(b)
            offset[sel] = grid
        return epoch, offset

    def _one_block_rows(
        self, segment: Segment, samples: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """:meth:`_grid_rows` of samples that all lie in one block of one epoch (a plan's
        nearly always), placed by their least and greatest (a window's epoch and block grow
        with it) in Python ints: ~25 numpy calls on every sample fewer, ~35 us a plan; None
        when they span several blocks."""
        s = segment.seq_len
        per_epoch = self._epoch_windows_int(s)
        shift = segment.slot - segment.start  # sample -> its grid window from the segment's
        e, w = divmod(int(samples.min()) + shift, per_epoch)
        e_hi, w_hi = divmod(int(samples.max()) + shift, per_epoch)
        b = self._block_of_int(w, s)
        if e_hi != e or self._block_of_int(w_hi, s) != b:
            return None
        slot = samples + (shift - e * per_epoch - self._windows_before_int(b, s))
        offset = self._permuted_windows(segment.epoch + e, b, s, slot) * s
        offset += b * self._size + min(b, self._long)  # block_start(b)
        return np.full(samples.size, segment.epoch + e, dtype=np.int64), offset

    def _epoch_windows_int(self, seq_len: int) -> int:
        """:meth:`epoch_windows`, kept per seq_len."""
        n = self._epoch_windows.get(seq_len)
        if n is None:
            n = self._epoch_windows[seq_len] = self.epoch_windows(seq_len)
        return n

    def _windows_before_int(self, block: int, seq_len: int) -> int:
        """:meth:`windows_before` of one block, in Python ints."""
        long_n, short_n = self._windows_per_block(seq_len)
        return min(block, self._long) * long_n + max(block - self._long, 0) * short_n

    def _block_of_int(self, window: int, seq_len: int) -> int:
        """:meth:`block_of` of one window of the epoch, in Python ints."""
        long_n, short_n = self._windows_per_block(seq_len)
        in_long = self._long * long_n
        if window < in_long:
            return window // max(long_n, 1)
        return self._long + (window - in_long) // short_n

    def _hole_spans(self, segment: Segment, samples: np.ndarray) -> tuple[np.ndarray, ...]:
        """(row, stream offset, length, offset in the window) of windows over holes."""
        s, grid = segment.seq_len, segment.grid
        h = grid + 1  # a hole: all grid + 1 tokens of an unserved window, each of its pairs
        c = segment.cursor + (samples - segment.start) * s  # window [c, c + s + 1) of holes
        first, last = c // h, (c + s) // h
        counts = last - first + 1
        row = np.repeat(np.arange(samples.size), counts)
        heads = np.concatenate([[0], np.cumsum(counts)[:-1]])
        piece = first[row] + np.arange(row.size) - heads[row]
        lo = np.maximum(c[row], piece * h)
        hi = np.minimum(c[row] + s + 1, (piece + 1) * h)
        perm = self.window_permutation(segment.epoch, segment.block, grid)
        window = perm(segment.slot + piece)
        start = self.block_start(segment.block) + window * grid + (lo - piece * h)
        return row, start, hi - lo, lo - c[row]


def _lay_out(order: BlockOrder) -> list[Segment]:
    """The segments of ``order.runs``: each run reads the rest of a hole stream, if a block
    was left in mid-grid at another seq_len, then grid windows block after block."""
    segments: list[Segment] = []
    epoch, block, grid, slot = 0, 0, 0, 0  # grid == 0: the block has not begun
    cursor = -1  # >= 0: reading the block's hole stream
    for run in order.runs:
        x, n, s = run.start, run.stop - run.start, run.seq_len
        if grid and grid != s and cursor < 0:
            cursor = 0  # the block's unserved grid windows become holes
        if cursor >= 0:
            holes = (int(order.block_windows(block, grid)) - slot) * (grid + 1)
            fit = (holes - cursor - s - 1) // s + 1 if cursor + s + 1 <= holes else 0
            t = min(n, fit)
            if t:
                segments.append(Segment(x, x + t, _HOLES, epoch, block, slot, s, grid, cursor))
            x, n = x + t, n - t
            if t < fit:
                cursor += t * s
                continue
            epoch, block = (epoch, block + 1) if block + 1 < order.num_blocks else (epoch + 1, 0)
            grid, slot, cursor = 0, 0, -1
        if n == 0:
            continue
        first = int(order.windows_before(block, s)) + slot
        segments.append(Segment(x, x + n, _GRID, epoch, block, first, s))
        j = first + n
        per_epoch = order.epoch_windows(s)
        epoch += j // per_epoch
        block = int(order.block_of(np.asarray(j % per_epoch), s))
        slot = j % per_epoch - int(order.windows_before(block, s))
        grid = s if slot else 0
    return segments
