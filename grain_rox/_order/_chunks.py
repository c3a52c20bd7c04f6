"""The epoch stream every order reads: a source's chunks in a seeded order per epoch.

Each shard's tokens are cut into chunks of ``chunk_tokens`` (a shard's tail shorter than a
chunk is not used). Epoch ``e`` reads the chunks in the order of a seeded Feistel permutation
``pi_e``; the concatenation is the *epoch stream*, and an order (``_lanes``, ``_blocks``) says
which stream offsets each sample reads. :class:`Rows` is that answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from grain_rox._order._permutation import FeistelPermutation, derive_key

PURPOSE_CHUNKS = 1
DEFAULT_CHUNK_TOKENS = 1 << 16
CHUNK_TABLE_LIMIT = 1 << 20


@dataclasses.dataclass(frozen=True)
class Run:
    """A stretch of the sample space with one seq_len: samples ``[start, stop)``."""

    start: int
    stop: int  # may be huge (endless)
    seq_len: int


@dataclasses.dataclass(frozen=True)
class Rows:
    """Where samples read from: each window's epoch and ``seq_len``, and its *spans*.

    A window of ``seq_len + 1`` tokens is usually one contiguous stretch of its epoch stream,
    starting at ``offset`` (``spans`` is None). When some window is made of several stretches,
    ``spans`` holds, for every stretch of every window, sorted by row: (row, stream offset,
    length, offset inside the window).

    >>> rows = Rows(np.zeros(2, np.int64), np.array([0, 50]), np.array([9, 9]))
    >>> [a.tolist() for a in rows.span_arrays()]
    [[0, 1], [0, 50], [10, 10], [0, 0]]
    """

    epoch: np.ndarray  # (n,) int64
    offset: np.ndarray  # (n,) int64, token offset in the epoch stream (of the first span)
    seq_len: np.ndarray  # (n,) int64
    spans: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
    content: np.ndarray | None = None  # (n,) tokens of each row, the rest padding (None: full)

    def span_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(row, stream offset, length, offset in the window) of every span."""
        if self.spans is not None:
            return self.spans
        n = self.offset.size
        return np.arange(n), self.offset, self.seq_len + 1, np.zeros(n, dtype=np.int64)


@dataclasses.dataclass(frozen=True)
class Segment:
    """Samples ``[start, stop)`` that a block order (``_blocks``, ``_packed``) reads one way,
    its ``kind``: from ``slot`` of ``block`` of ``epoch`` at ``seq_len`` on, or, in a block
    read on at another seq_len than the ``grid`` that opened it, from token ``cursor`` of
    what the block has left."""

    start: int
    stop: int
    kind: int
    epoch: int
    block: int
    slot: int
    seq_len: int
    grid: int = 0
    cursor: int = 0


def schedule_runs(runs: Sequence[Run], max_seq_len: int | None) -> tuple[tuple[Run, ...], int]:
    """A source's non-empty runs and its longest window (``max_seq_len``, default the
    schedule's longest seq_len; below it is an error).

    >>> schedule_runs([Run(0, 5, 8), Run(5, 5, 64), Run(5, 9, 16)], None)
    ((Run(start=0, stop=5, seq_len=8), Run(start=5, stop=9, seq_len=16)), 16)
    """
    kept = tuple(r for r in runs if r.stop > r.start)
    longest = max(r.seq_len for r in kept)
    window = int(max_seq_len or longest)
    if window < longest:
        raise ValueError(
            f"max_seq_len={max_seq_len} is below the schedule's longest seq_len {longest}"
        )
    return kept, window


class ChunkStream:
    """A source's chunks and their per-epoch order (see the module doc).

    >>> stream = ChunkStream([250, 130], seed=0, chunk_tokens=100)
    >>> stream.num_chunks, stream.stream_tokens
    (3, 300)
    >>> sorted(stream.physical_chunks(0, np.arange(3)).tolist())
    [0, 1, 2]
    >>> [a.tolist() for a in stream.chunk_location(np.array([1, 2]))]
    [[0, 1], [100, 0]]
    """

    def __init__(self, shard_tokens: Sequence[int], *, seed: int, chunk_tokens: int) -> None:
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens={chunk_tokens} must be >= 1")
        self.seed = int(seed)
        self.chunk_tokens = int(chunk_tokens)
        chunks = np.asarray([t // chunk_tokens for t in shard_tokens], dtype=np.int64)
        self._chunk_starts = np.concatenate([[0], np.cumsum(chunks)])
        self.num_chunks = int(self._chunk_starts[-1])
        if self.num_chunks == 0:
            raise ValueError(
                f"no shard holds a whole chunk of {chunk_tokens} tokens (shard sizes "
                f"{list(shard_tokens)[:5]}...); pass a smaller chunk_tokens"
            )
        self.stream_tokens = self.num_chunks * self.chunk_tokens
        self._chunk_tables: dict[int, np.ndarray] = {}

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["_chunk_tables"] = {}  # a cache: rebuilt on demand, never pickled
        return state

    def chunk_permutation(self, epoch: int) -> FeistelPermutation:
        return FeistelPermutation(self.num_chunks, derive_key(self.seed, PURPOSE_CHUNKS, epoch))

    def physical_chunks(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """``pi_epoch(positions)``: from a per-epoch table when the corpus has at most
        :data:`CHUNK_TABLE_LIMIT` chunks (8 MiB), else straight from the Feistel network."""
        if self.num_chunks > CHUNK_TABLE_LIMIT:
            return self.chunk_permutation(epoch)(positions)
        table = self._chunk_tables.get(epoch)
        if table is None:
            table = self.chunk_permutation(epoch)(np.arange(self.num_chunks))
            self._chunk_tables = {epoch: table}  # the current epoch only: bounded memory
        return table[positions]

    def chunk_location(self, chunk_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard, token offset inside the shard) of physical chunks."""
        shard = np.searchsorted(self._chunk_starts, chunk_ids, side="right") - 1
        return shard, (chunk_ids - self._chunk_starts[shard]) * self.chunk_tokens
