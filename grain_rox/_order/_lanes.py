"""Where sample ``s`` of a token source comes from: chunks, epochs, lanes and rounds.

The global order of one source, a pure function of (shard sizes, seed, seq_len schedule):

* **Chunks.** The epoch stream of ``_chunks``: each epoch reads the source's chunks in a
  seeded order ``pi_e``.
* **Lanes.** The epoch stream is cut into ``lanes`` equal, contiguous lanes. Each lane is read
  front to back in windows of ``seq_len + 1`` tokens with stride ``seq_len``, so a lane's
  cursor is a plain token count: when ``seq_len`` changes between curriculum phases the lane
  continues where it stopped, with nothing replayed and nothing skipped.
* **Rounds.** Samples are taken in rounds of ``lanes`` samples; in round ``j`` each lane gives
  exactly one window, in the order of a seeded permutation ``phi_{e,j}`` of the lanes. The rows
  of a batch therefore come from different lanes, i.e. from unrelated places of the corpus, and
  a lane's next window turns up about ``lanes / batch`` steps later at a random row.
* **Epochs.** An epoch ends before the first round in which some lane might not fit a window
  of ``max_seq_len + 1`` tokens; the next round starts epoch ``e + 1`` with fresh
  permutations. Per epoch, every lane's tail shorter than one longest window (at most about
  ``lanes * max_seq_len`` tokens in all) is not served.

Locating any sample costs O(#phases) arithmetic plus one vectorised permutation evaluation,
whatever the step: reaching step 10**9 costs what reaching step 10 does.

This was the default order of grain_rox 0.1 (``TokenPipeline(order="lanes")``); the default is
now ``_blocks``, whose pool of text is far larger (``docs/order.md`` measures both).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from grain_rox._order._chunks import DEFAULT_CHUNK_TOKENS, ChunkStream, Rows, Run, schedule_runs
from grain_rox._order._permutation import FeistelPermutation, derive_key
from grain_rox._order._value_groups import value_groups

__all__ = ["DEFAULT_CHUNK_TOKENS", "LaneOrder", "Rows", "Run", "auto_lanes"]

_PURPOSE_ROUNDS = 2
DEFAULT_MAX_LANES = 1024
MIN_WINDOWS_PER_LANE = 64


def auto_lanes(
    stream_tokens: int,
    max_seq_len: int,
    *,
    max_lanes: int = DEFAULT_MAX_LANES,
    multiple_of: int = 1,
) -> int:
    """Lanes such that each lane holds >= 64 windows of the longest seq_len (at least 1),
    rounded down to a multiple of the batch size when there are enough: then a batch never
    spans two rounds, and its rows come from as many different lanes.

    >>> auto_lanes(100_000_000, 1024), auto_lanes(10_000, 16), auto_lanes(50_000_000, 1024, multiple_of=32)
    (1024, 9, 736)
    """
    lanes = max(1, min(max_lanes, stream_tokens // (MIN_WINDOWS_PER_LANE * (max_seq_len + 1))))
    if multiple_of > 1 and lanes >= multiple_of:
        lanes -= lanes % multiple_of
    return int(lanes)


class LaneOrder(ChunkStream):
    """The sample -> (epoch, epoch-stream offset) map of one source (see the module doc).

    >>> order = LaneOrder([1000], seed=0, chunk_tokens=100, lanes=4, runs=[Run(0, 10**18, 9)])
    >>> order.lane_tokens, order.windows_per_epoch
    (250, 108)
    >>> rows = order.locate(np.arange(4))
    >>> sorted((rows.offset // 250).tolist()), rows.epoch.tolist()
    ([0, 1, 2, 3], [0, 0, 0, 0])
    """

    def __init__(
        self,
        shard_tokens: Sequence[int],
        *,
        seed: int,
        chunk_tokens: int,
        lanes: int,
        runs: Sequence[Run],
        max_seq_len: int | None = None,
    ) -> None:
        super().__init__(shard_tokens, seed=seed, chunk_tokens=chunk_tokens)
        self.lanes = int(lanes)
        self.lane_tokens = self.stream_tokens // self.lanes
        self.runs, self.max_seq_len = schedule_runs(runs, max_seq_len)
        if self.lane_tokens < self.max_seq_len + 1:
            raise ValueError(
                f"a lane of {self.lane_tokens} tokens ({self.stream_tokens} usable tokens / "
                f"{self.lanes} lanes) cannot hold one window of seq_len {self.max_seq_len} + 1; "
                "use fewer lanes, a smaller chunk_tokens, or more data"
            )
        self._rounds = _RoundTable(self.runs, self.lanes, self.lane_tokens, self.max_seq_len)

    name = "lanes"

    @property
    def group(self) -> int:
        """Samples a reader plans together: one round."""
        return self.lanes

    @property
    def max_joins(self) -> int:
        """The most chunk joins one window can cross."""
        return math.ceil(self.max_seq_len / self.chunk_tokens)

    def identity(self) -> dict[str, int]:
        """What a checkpoint names of this order besides the schedule and seed."""
        return {"lanes": self.lanes}

    @property
    def windows_per_epoch(self) -> int:
        """Samples in a fresh epoch under the first run's seq_len."""
        room = self.lane_tokens - self.max_seq_len - 1
        return (room // self.runs[0].seq_len + 1) * self.lanes

    def round_permutation(self, epoch: int, round_: int) -> FeistelPermutation:
        return FeistelPermutation(self.lanes, derive_key(self.seed, _PURPOSE_ROUNDS, epoch, round_))

    def locate(self, samples: np.ndarray) -> Rows:
        """Epoch, epoch-stream offset and seq_len of each sample (any order, any values)."""
        samples = np.asarray(samples, dtype=np.int64)
        epoch = np.empty_like(samples)
        offset = np.empty_like(samples)
        seq_len = np.empty_like(samples)
        for j, sel in value_groups(samples // self.lanes):
            info = self._rounds.locate(j)
            slots = samples[sel] - j * self.lanes
            lanes = self.round_permutation(info.epoch, j)(slots)
            cursor = np.full(slots.size, info.pure_tokens, dtype=np.int64)
            for r, pieces in info.mixed_rounds:  # rounds of this epoch that straddle runs
                their_slots = self.round_permutation(info.epoch, r).inverse(lanes)
                cursor += _piece_seq_len(pieces, their_slots)
            epoch[sel] = info.epoch
            offset[sel] = lanes * self.lane_tokens + cursor
            seq_len[sel] = _piece_seq_len(info.pieces, slots)
        return Rows(epoch, offset, seq_len)


def _piece_seq_len(pieces: tuple[tuple[int, int], ...], slots: np.ndarray) -> np.ndarray:
    """seq_len of each slot of a round made of (first slot, seq_len) pieces."""
    starts = np.asarray([p[0] for p in pieces], dtype=np.int64)
    lens = np.asarray([p[1] for p in pieces], dtype=np.int64)
    return lens[np.searchsorted(starts, slots, side="right") - 1]


@dataclasses.dataclass(frozen=True)
class RoundInfo:
    epoch: int
    epoch_start_round: int
    pure_tokens: int  # cursor advance from this epoch's single-run rounds before this round
    mixed_rounds: tuple[tuple[int, tuple[tuple[int, int], ...]], ...]  # earlier, this epoch
    pieces: tuple[tuple[int, int], ...]  # this round: (first slot, seq_len)


class _RoundTable:
    """Rounds grouped into epochs under a seq_len schedule, answered in O(#runs)."""

    def __init__(self, runs: Sequence[Run], lanes: int, lane_tokens: int, max_seq_len: int) -> None:
        self.runs = list(runs)
        self.lanes = lanes
        self.lane_tokens = lane_tokens
        self.max_seq_len = max_seq_len

    def _round_pieces(self, j: int) -> tuple[tuple[int, int], ...]:
        lo, hi = j * self.lanes, (j + 1) * self.lanes
        pieces = []
        for run in self.runs:
            a, b = max(lo, run.start), min(hi, run.stop)
            if a < b:
                pieces.append((a - lo, run.seq_len))
        if not pieces or pieces[0][0] != 0 or self._covered(lo, hi) < hi - lo:
            raise IndexError(f"round {j} lies outside the schedule's samples")
        return tuple(pieces)

    def _covered(self, lo: int, hi: int) -> int:
        return sum(max(0, min(hi, r.stop) - max(lo, r.start)) for r in self.runs)

    def locate(self, j: int) -> RoundInfo:
        """Walk the schedule to round ``j``: epoch, cursor base and mixed rounds before it.

        Round ``j`` belongs to the current epoch while ``used + max_seq_len + 1 <= lane``,
        where ``used`` bounds every lane's cursor (the sum of each earlier round's widest
        window). The rule looks only at earlier rounds and a fixed ``max_seq_len``, so a
        schedule changed from some sample on never moves rounds that were already served.
        """
        room = self.lane_tokens - self.max_seq_len - 1
        epoch, start, used, pure = 0, 0, 0, 0  # used: max cursor (conservative), pure: exact
        mixed: list[tuple[int, tuple[tuple[int, int], ...]]] = []
        r = 0  # the next round to account for
        while r < j:
            run = next((x for x in self.runs if x.start <= r * self.lanes < x.stop), None)
            if run is None:
                raise IndexError(f"round {j} lies outside the schedule's samples")
            end_pure = min(run.stop // self.lanes, j)  # rounds fully inside this run
            if r < end_pure:
                n, seq_len = end_pure - r, run.seq_len
                fit = (room - used) // seq_len + 1 if used <= room else 0
                if n <= fit:
                    used, pure, r = used + n * seq_len, pure + n * seq_len, r + n
                else:  # fill this epoch, then whole epochs, then the rest
                    rounds_per_epoch = room // seq_len + 1
                    full, left = divmod(n - fit, rounds_per_epoch)
                    epoch += 1 + full
                    if left == 0:  # the last of these rounds filled an epoch exactly
                        epoch -= 1
                        left = rounds_per_epoch
                    start = r + n - left
                    used = pure = left * seq_len
                    mixed = []
                    r += n
                continue
            pieces = self._round_pieces(r)  # a round that straddles runs
            if used > room:
                epoch, start, used, pure, mixed = epoch + 1, r, 0, 0, []
            mixed.append((r, pieces))
            used += max(p[1] for p in pieces)
            r += 1
        if used > room:  # round j itself opens the next epoch
            epoch, start, pure, mixed = epoch + 1, j, 0, []
        return RoundInfo(epoch, start, pure, tuple(mixed), self._round_pieces(j))
