"""Roxxel's ``stream()`` batches, bit for bit, as a random-access ``grain.MapDataset``.

:func:`roxxel_stream` reproduces the non-mixed path of roxxel 0.9.x's
``Roxxel(paths).stream(seq_len=..., batch_size=..., seed=..., start_step=...,
completed_phases=..., total_steps=..., dtype=...)``: record ``k`` is the ``k``-th batch that
stream yields (as a numpy array instead of a JAX array), and ``len(dataset)`` is the number of
batches it yields. A run trained with roxxel can therefore move to grain_rox mid-training and
see exactly the data it would have seen: ``tests/test_roxxel_stream.py`` pins this by comparing
every batch with roxxel 0.9.14's own ``stream()``, resumed runs and completed phases included.

Roxxel's definition, re-implemented here with grain_rox's own reader:

* ``perm = np.arange(n_blocks)`` shuffled by ``np.random.default_rng(seed).shuffle``;
* ``B`` = bytes of global block 0 (roxxel's block size), ``E`` = the token size,
  ``P = batch_size * seq_len * E`` bytes per batch;
* ``S`` skip bytes from ``completed_phases`` and ``start_step`` (byte offsets are continuous
  across phases), ``consumed, rem = divmod(S, B)``;
* ``V'`` = blocks ``perm[consumed:]`` concatenated, the first one entered at byte ``rem``;
  batch ``k`` is bytes ``[k*P, (k+1)*P)`` of ``V'``, viewed as the token dtype, then
  ``.astype(dtype)`` and reshaped to ``(batch_size, seq_len)``;
* ``len = min(total_steps, max(0, n_blocks*B - S) // P, len(V') // P)`` (the last term only
  matters for non-uniform blocks, where roxxel's generator runs out of blocks early).

Cost: the permutation is roxxel's, so it takes O(n_blocks) time and memory (8 bytes per block)
once per dataset (and once per process after unpickling: it is recomputed, not pickled). With
uniform blocks a record is then O(1) arithmetic plus copying the ``ceil(P/B) + 1`` block
slices it spans. Non-uniform blocks (roxxel's append with a different ``block_size``)
additionally need a cumulative byte-length array over the permuted blocks (another 8 bytes per
block) and a binary search per record. If the block index has not been walked yet (corpora
over ~1M blocks), it is walked once to learn whether blocks are uniform.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np
from numpy.typing import DTypeLike

from grain_rox._format._paths import PathSpec
from grain_rox._format._rox_corpus import RoxCorpus, open_rox
from grain_rox._sources._identity import with_identity

# One entry of ``completed_phases``: (steps, batch_size, seq_len) of an earlier training phase.
# Not grain_rox.Phase (a curriculum phase of TokenPipeline): roxxel's resume arithmetic only.
CompletedPhase = tuple[int, int, int]

# Uniform batches spanning at least this many blocks are gathered with numpy fancy indexing
# (one copy per shard) instead of a Python loop over blocks.
_GATHER_MIN_BLOCKS = 4


def _non_negative_int(name: str, value: Any, *, minimum: int = 0) -> int:
    if isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be an int, not {value!r}")
    try:
        result = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, not {type(value).__name__} {value!r}") from None
    if result < minimum:
        raise ValueError(f"{name}={result} must be >= {minimum}")
    return result


def _check_phases(completed_phases: Sequence[Sequence[int]] | None) -> tuple[CompletedPhase, ...]:
    if completed_phases is None:
        return ()
    if isinstance(completed_phases, str | bytes):
        raise TypeError("completed_phases must be a sequence of (steps, batch_size, seq_len)")
    phases = []
    for i, phase in enumerate(completed_phases):
        try:
            steps, batch_size, seq_len = phase
        except (TypeError, ValueError):
            raise ValueError(
                f"completed_phases[{i}]={phase!r} must be a (steps, batch_size, seq_len) triple"
            ) from None
        phases.append(
            (
                _non_negative_int(f"completed_phases[{i}] steps", steps),
                _non_negative_int(f"completed_phases[{i}] batch_size", batch_size),
                _non_negative_int(f"completed_phases[{i}] seq_len", seq_len),
            )
        )
    return tuple(phases)


def skip_bytes(
    *,
    start_step: int,
    completed_phases: Sequence[CompletedPhase],
    bytes_per_batch: int,
    itemsize: int,
) -> int:
    """Bytes of the shuffled stream consumed before ``start_step`` (roxxel's resume loop)."""
    skipped = 0
    accumulated = 0
    for steps, batch_size, seq_len in completed_phases:
        if start_step < accumulated + steps:  # start_step lies inside this historical phase
            return skipped + (start_step - accumulated) * batch_size * seq_len * itemsize
        skipped += steps * batch_size * seq_len * itemsize
        accumulated += steps
    return skipped + (start_step - accumulated) * bytes_per_batch


class RoxxelStreamSource:
    """A ``RandomAccessDataSource`` whose record ``k`` is roxxel's ``stream()`` batch ``k``.

    Built by :func:`roxxel_stream`, which validates the arguments. Thread-safe; pickles
    without open handles and without the permutation (recomputed lazily); stable repr.

    Args:
      corpus: the open shards (at least one block).
      seq_len, batch_size, seed, start_step, total_steps: as for :func:`roxxel_stream`.
      completed_phases: the earlier phases as ``(steps, batch_size, seq_len)`` int triples.
      dtype: the numpy dtype of the batches.
    """

    def __init__(
        self,
        corpus: RoxCorpus,
        *,
        seq_len: int,
        batch_size: int,
        seed: int,
        start_step: int,
        completed_phases: tuple[CompletedPhase, ...],
        total_steps: int | None,
        dtype: np.dtype,
    ) -> None:
        self.corpus = corpus
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.start_step = start_step
        self.completed_phases = completed_phases
        self.total_steps = total_steps
        self.dtype = dtype
        self._lock = threading.RLock()
        self._perm: np.ndarray | None = None
        self._starts: np.ndarray | None = None

        n = len(corpus)
        self._n_blocks = n
        self._token_dtype = corpus.dtype
        itemsize = self._token_dtype.itemsize
        # roxxel: len(self[0]), the first *global* block (shard 0's first block unless shard 0
        # is empty), taken as the size of every block.
        self._block_bytes = int(corpus[0].nbytes)
        self._batch_bytes = batch_size * seq_len * itemsize
        self._skip = skip_bytes(
            start_step=start_step,
            completed_phases=completed_phases,
            bytes_per_batch=self._batch_bytes,
            itemsize=itemsize,
        )
        self._consumed, self._rem = divmod(self._skip, self._block_bytes)
        max_steps = max(0, n * self._block_bytes - self._skip) // self._batch_bytes
        steps = max_steps if total_steps is None else min(total_steps, max_steps)

        uniform = corpus.uniform_blocks
        if uniform is None:  # a large corpus whose index was not walked at open: walk it now
            corpus.verify(checksums=False)
            uniform = corpus.uniform_blocks
        self._uniform = bool(uniform) and corpus.block_size == self._block_bytes
        self._shard_first_blocks = np.array([s.first_block for s in corpus.shards], np.int64)
        if self._uniform:
            stream_bytes = max(0, (n - self._consumed) * self._block_bytes - self._rem)
        else:
            stream_bytes = int(self._block_starts()[-1])
        self._len = min(steps, stream_bytes // self._batch_bytes)

    # ---- lazily computed, per-process state -------------------------------------------------
    def _permutation(self) -> np.ndarray:
        perm = self._perm
        if perm is None:
            with self._lock:
                perm = self._perm
                if perm is None:
                    perm = np.arange(self._n_blocks)
                    np.random.default_rng(self.seed).shuffle(perm)
                    self._perm = perm
        return perm

    def _block_lengths(self) -> np.ndarray:
        """Bytes of every block, in global block order, from each shard's (checked) index."""
        lengths = np.empty(self._n_blocks, np.int64)
        for s, shard in enumerate(self.corpus.shards):
            if shard.num_blocks:
                ends = self.corpus.shard_index(s)
                lengths[shard.first_block : shard.first_block + shard.num_blocks] = np.diff(
                    ends, prepend=np.int64(0)
                )
        return lengths

    def _block_starts(self) -> np.ndarray:
        """Non-uniform blocks: ``starts[j]`` = byte of V' where block ``perm[consumed + j]``
        (entered at ``rem`` for j = 0) begins; ``starts[-1]`` = ``len(V')``."""
        starts = self._starts
        if starts is None:
            with self._lock:
                starts = self._starts
                if starts is None:
                    starts = self._compute_block_starts()
                    self._starts = starts
        return starts

    def _compute_block_starts(self) -> np.ndarray:
        rest = self._permutation()[self._consumed :]
        lengths = self._block_lengths()[rest]
        if lengths.size:
            lengths[0] = max(0, int(lengths[0]) - self._rem)
        starts = np.zeros(lengths.size + 1, np.int64)
        np.cumsum(lengths, out=starts[1:])
        return starts

    # ---- RandomAccessDataSource --------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return (
            f"RoxxelStreamSource(data={self.corpus.fingerprint}, seq_len={self.seq_len}, "
            f"batch_size={self.batch_size}, seed={self.seed}, start_step={self.start_step}, "
            f"completed_phases={list(self.completed_phases)}, total_steps={self.total_steps}, "
            f"dtype={self.dtype.name}, batches={self._len})"
        )

    def __getitem__(self, index: int) -> np.ndarray:
        k = operator.index(index)
        if k < 0:
            k += self._len
        if not 0 <= k < self._len:
            raise IndexError(f"batch {index} is out of range for {self._len} batches")
        # Offsets, block sizes and batch sizes are all whole tokens (grain_rox refuses shards
        # whose blocks split tokens), so the bytes are copied as tokens.
        itemsize = self._token_dtype.itemsize
        size = self._batch_bytes // itemsize
        if self._uniform:
            block, offset = divmod(self._skip + k * self._batch_bytes, self._block_bytes)
            span = (offset + self._batch_bytes - 1) // self._block_bytes + 1
            if span >= _GATHER_MIN_BLOCKS:
                tokens = self._gather_uniform(block, span)[offset // itemsize :][:size]
            else:
                tokens = self._copy_blocks(block, offset // itemsize, size)
        else:
            starts = self._block_starts()
            start = k * self._batch_bytes
            j = int(np.searchsorted(starts, start, side="right")) - 1
            offset = start - int(starts[j]) + (self._rem if j == 0 else 0)
            tokens = self._copy_blocks(self._consumed + j, offset // itemsize, size)
        return tokens.astype(self.dtype, copy=False).reshape(self.batch_size, self.seq_len)

    def _copy_blocks(self, block: int, offset: int, size: int) -> np.ndarray:
        """``size`` tokens of blocks ``perm[block], perm[block + 1], ...``, the first entered
        at token ``offset`` (block by block: any block sizes)."""
        perm = self._permutation()
        corpus = self.corpus
        tokens = np.empty(size, self._token_dtype)
        filled = 0
        while filled < size:
            data = corpus[int(perm[block])]
            take = min(data.size - offset, size - filled)
            tokens[filled : filled + take] = data[offset : offset + take]
            filled += take
            block += 1
            offset = 0
        return tokens

    def _gather_uniform(self, block: int, span: int) -> np.ndarray:
        """Blocks ``perm[block : block + span]`` concatenated (uniform blocks), gathered with one
        fancy-indexing copy per shard they come from."""
        ids = self._permutation()[block : block + span]
        block_tokens = self._block_bytes // self._token_dtype.itemsize
        out = np.empty((ids.size, block_tokens), self._token_dtype)
        firsts = self._shard_first_blocks
        if firsts.size == 1:
            out[:] = self.corpus.gather(0, ids * block_tokens, block_tokens)
        else:
            shard_of = np.searchsorted(firsts, ids, side="right") - 1
            for s in np.unique(shard_of).tolist():
                rows = np.flatnonzero(shard_of == s)
                starts = (ids[rows] - firsts[s]) * block_tokens
                out[rows] = self.corpus.gather(s, starts, block_tokens)
        return out.reshape(-1)

    def _getitems(self, indices: Sequence[int]) -> list[np.ndarray]:
        return [self[i] for i in indices]

    __getitems__ = _getitems

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        state["_perm"] = None
        state["_starts"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()


def roxxel_stream(
    paths: PathSpec | RoxCorpus,
    *,
    seq_len: int,
    batch_size: int,
    seed: int,
    start_step: int = 0,
    completed_phases: Sequence[Sequence[int]] | None = None,
    total_steps: int | None = None,
    dtype: DTypeLike = np.int32,
) -> grain.MapDataset:
    """Roxxel's ``stream()`` as a ``grain.MapDataset``: record ``k`` is batch ``k``, bit for bit.

    Record ``k`` equals ``np.asarray`` of the ``k``-th batch of roxxel 0.9.x's
    ``Roxxel(paths).stream(seq_len=seq_len, batch_size=batch_size, seed=seed,
    start_step=start_step, completed_phases=completed_phases, total_steps=total_steps,
    dtype=dtype)`` (non-mixed path), a ``(batch_size, seq_len)`` numpy array of ``dtype``; and
    ``len(dataset)`` is the number of batches that stream yields. The shards are read with
    grain_rox's reader (roxxel is not needed).

    Args:
      paths: the shards, resolved like roxxel (a file, glob, directory, prefix or list), or an
        open :class:`RoxCorpus`.
      seq_len: tokens per row (>= 1).
      batch_size: rows per batch (>= 1).
      seed: the shuffle seed (an int >= 0, as for ``np.random.default_rng``).
      start_step: the global step to resume at (>= 0); record 0 is that step's batch.
      completed_phases: ``(steps, batch_size, seq_len)`` of earlier training phases with other
        shapes, oldest first, exactly as passed to roxxel.
      total_steps: an upper bound on the number of batches (>= 0), as in roxxel.
      dtype: the output dtype (tokens are converted with ``.astype``, as roxxel does, so an
        id the dtype cannot hold wraps as it does in roxxel: a ``uint32`` id from 2**31 on
        becomes negative in ``int32``, where :class:`~grain_rox.TokenPipeline` refuses it).

    Returns:
      A ``grain.MapDataset`` of ``(batch_size, seq_len)`` arrays of ``dtype``: record ``k``
      is the stream's batch ``k`` (counted from ``start_step``). Its iterators' states carry
      the shards' fingerprint and these arguments, so a restore onto other shards or other
      arguments is refused naming what changed.

    Raises:
      TypeError: an argument that is not an int, or ``completed_phases`` that is not a
        sequence of ``(steps, batch_size, seq_len)``.
      ValueError: an argument out of range (named in the message), or an empty corpus.

    Costs O(n_blocks) time and memory for roxxel's block permutation (see the module
    docstring); records are then O(1) to locate. Notes: Grain's ``MapDataset.source`` wraps
    indices modulo ``len`` (``ds[len(ds)]`` is ``ds[0]``), so bound loops by ``len(ds)``;
    iterate with ``ds.to_iter_dataset(grain.ReadOptions(num_threads=0))`` or similar (Grain's
    default 16 reader threads cost ~1 ms per small record). Unlike roxxel, shards whose blocks
    split tokens are refused (by :func:`grain_rox.open_rox`), and a 64-bit ``dtype`` is kept
    (roxxel's JAX arrays are narrowed to 32 bits unless ``jax_enable_x64`` is on).

    >>> import os, tempfile, numpy as np
    >>> from grain_rox import write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "run.rox")
    >>> _ = write_rox([np.arange(1000, dtype=np.uint16)], path, block_size=64)
    >>> ds = roxxel_stream(path, seq_len=16, batch_size=4, seed=0)
    >>> len(ds), ds[0].shape, ds[0].dtype
    (16, (4, 16), dtype('int32'))
    >>> resumed = roxxel_stream(path, seq_len=16, batch_size=4, seed=0, start_step=3)
    >>> bool((resumed[0] == ds[3]).all()), len(resumed)
    (True, 13)
    """
    seq_len = _non_negative_int("seq_len", seq_len, minimum=1)
    batch_size = _non_negative_int("batch_size", batch_size, minimum=1)
    seed = _non_negative_int("seed", seed)
    start_step = _non_negative_int("start_step", start_step)
    phases = _check_phases(completed_phases)
    if total_steps is not None:
        total_steps = _non_negative_int("total_steps", total_steps)
    out_dtype = np.dtype(dtype)
    corpus = open_rox(paths, roxxel_names=True)  # roxxel's prefix*.rox fallback, bit for bit
    if len(corpus) == 0:
        raise ValueError(
            f"the corpus {list(corpus.paths)} is empty (0 blocks); roxxel's stream() refuses it "
            "too ('Roxxel database is empty or not opened.')"
        )
    source = RoxxelStreamSource(
        corpus,
        seq_len=seq_len,
        batch_size=batch_size,
        seed=seed,
        start_step=start_step,
        completed_phases=phases,
        total_steps=total_steps,
        dtype=out_dtype,
    )
    # Its iterators' states carry what the batches are made of, so a restore onto other
    # shards, another seed or other shapes is refused naming the change (a bare
    # MapDataset.source's state is a position only, and restored onto anything)
    identity = {
        "data": corpus.fingerprint,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "seed": seed,
        "start_step": start_step,
        "completed_phases": [list(p) for p in phases],
        "total_steps": total_steps,
        "dtype": out_dtype.name,
    }
    return with_identity(grain.MapDataset.source(source), identity, what="roxxel_stream")
