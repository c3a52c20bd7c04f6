"""TokenPipeline: `.rox` shards -> global batches in a host-count-independent order, via Grain.

A Grain record here is a whole batch (or this process's rows of it) assembled by vectorised
reads, so Grain's per-record cost is paid once per batch, not once per row. Global batch ``k``
holds samples ``[k*B, (k+1)*B)`` of the source's :class:`~grain_rox._lanes.LaneOrder`; a
process reads only rows ``[lo, hi)``. Batch ``k`` is therefore a pure function of (data,
config, seed, k) whatever the number of processes, Grain workers, threads or prefetch depth,
and starting at step ``k`` costs the same for ``k = 10`` and ``k = 10**9``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

from grain_rox._grain_setup import batch_read_options, ensure_absl_flags_parsed
from grain_rox._lanes import DEFAULT_CHUNK_TOKENS, LaneOrder, Run, auto_lanes
from grain_rox._rox_corpus import RoxCorpus, open_rox
from grain_rox._windows import WindowReader, segment_features

ENDLESS = 1 << 62


def auto_chunk_tokens(num_tokens: int) -> int:
    """Chunk size from the corpus size: 64K tokens, smaller for corpora under 4M tokens.

    >>> auto_chunk_tokens(10**9), auto_chunk_tokens(100_000)
    (65536, 1562)
    """
    return int(min(DEFAULT_CHUNK_TOKENS, max(64, num_tokens // 64)))


@dataclasses.dataclass(frozen=True)
class TokenPipeline:
    """Global batches of next-token windows from `.rox` shards, shuffled, through Grain.

    Each record has ``inputs`` and ``targets`` (``seq_len`` tokens each, targets shifted by
    one) and, when an EOS id is known (argument or manifest), ``inputs_segmentation``,
    ``inputs_position``, ``targets_segmentation`` and ``targets_position``.

    >>> import tempfile, os, numpy as np
    >>> from grain_rox import write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "p.rox")
    >>> _ = write_rox([np.arange(5000, dtype=np.uint16)], path, separator=0)
    >>> pipe = TokenPipeline(path, seq_len=16, global_batch_size=4, seed=1, num_epochs=1)
    >>> batch = pipe.map_dataset()[0]
    >>> batch["inputs"].shape, batch["inputs"].dtype.name, pipe.num_batches
    ((4, 16), 'int32', 95)
    >>> bool((batch["targets"][:, :-1] == batch["inputs"][:, 1:]).all())
    True
    """

    paths: Any
    seq_len: int
    global_batch_size: int
    seed: int = 0
    num_epochs: int | None = None
    eos_id: int | None = None
    segmentation: bool = True
    chunk_tokens: int | None = None
    lanes: int | None = None
    dtype: Any = np.int32

    def __post_init__(self) -> None:
        if isinstance(self.paths, (list, tuple)):
            object.__setattr__(self, "paths", tuple(os.fspath(p) for p in self.paths))
        elif isinstance(self.paths, os.PathLike):
            object.__setattr__(self, "paths", os.fspath(self.paths))
        for name in ("seq_len", "global_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive int")
        if self.num_epochs is not None and self.num_epochs < 1:
            raise ValueError(f"num_epochs={self.num_epochs} must be >= 1 or None (endless)")
        if not 0 <= int(self.seed) < 2**63:
            raise ValueError(f"seed={self.seed} must be a non-negative 64-bit int")
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    # ---- the data ---------------------------------------------------------------------
    def open(self) -> RoxCorpus:
        """Open the shards (validated; cheap)."""
        return open_rox(self.paths)

    def _geometry(self, corpus: RoxCorpus) -> LaneOrder:
        chunk = self.chunk_tokens or auto_chunk_tokens(corpus.num_tokens)
        usable = sum((s.num_tokens // chunk) * chunk for s in corpus.shards)
        lanes = self.lanes or auto_lanes(usable, self.seq_len)
        return LaneOrder(
            [s.num_tokens for s in corpus.shards],
            seed=int(self.seed),
            chunk_tokens=chunk,
            lanes=lanes,
            runs=[Run(0, ENDLESS, self.seq_len)],
        )

    def batch_source(
        self, *, rows: tuple[int, int] | None = None, first_step: int = 0
    ) -> GlobalBatchSource:
        """The Grain data source: record ``i`` = rows ``[lo, hi)`` of global batch
        ``first_step + i``."""
        return GlobalBatchSource(self, rows=rows, first_step=first_step)

    @property
    def num_batches(self) -> int | None:
        """Global batches in ``num_epochs`` epochs (None when endless)."""
        return self.batch_source().num_batches

    def describe(self) -> dict[str, Any]:
        """The config and data identity a checkpoint is checked against."""
        corpus = self.open()
        order = self._geometry(corpus)
        return {
            "data": corpus.fingerprint,
            "seq_len": self.seq_len,
            "global_batch_size": self.global_batch_size,
            "seed": int(self.seed),
            "num_epochs": self.num_epochs,
            "eos_id": self.eos_id,
            "segmentation": self.segmentation,
            "chunk_tokens": order.chunk_tokens,
            "lanes": order.lanes,
            "dtype": self.dtype.name,
        }

    # ---- through Grain ----------------------------------------------------------------
    def map_dataset(
        self, *, rows: tuple[int, int] | None = None, first_step: int = 0
    ) -> grain.MapDataset:
        """A ``grain.MapDataset`` whose element ``i`` is global batch ``first_step + i``."""
        return grain.MapDataset.source(self.batch_source(rows=rows, first_step=first_step))

    def iter_dataset(
        self,
        *,
        rows: tuple[int, int] | None = None,
        first_step: int = 0,
        worker_count: int = 0,
        worker_buffer_size: int = 2,
    ) -> grain.IterDataset:
        """``map_dataset(...).to_iter_dataset()``, with Grain worker processes if asked."""
        ds = self.map_dataset(rows=rows, first_step=first_step).to_iter_dataset(
            batch_read_options()
        )
        if worker_count > 0:
            ensure_absl_flags_parsed()
            ds = ds.mp_prefetch(
                grain.MultiprocessingOptions(
                    num_workers=worker_count, per_worker_buffer_size=worker_buffer_size
                )
            )
        return ds

    def data_loader(
        self,
        *,
        rows: tuple[int, int] | None = None,
        first_step: int = 0,
        worker_count: int = 0,
        worker_buffer_size: int = 2,
    ) -> grain.DataLoader:
        """A ``grain.DataLoader`` over the batch source (no shuffling or batching ops needed:
        the order and the batches are the source's)."""
        source = self.batch_source(rows=rows, first_step=first_step)
        if worker_count > 0:
            ensure_absl_flags_parsed()
        return grain.DataLoader(
            data_source=source,
            sampler=grain.samplers.IndexSampler(
                num_records=len(source),
                shard_options=grain.sharding.NoSharding(),
                shuffle=False,
                num_epochs=1,
            ),
            worker_count=worker_count,
            worker_buffer_size=worker_buffer_size,
            read_options=batch_read_options(),
        )


class GlobalBatchSource:
    """A Grain ``RandomAccessDataSource`` of (this process's rows of) global batches.

    Thread-safe, picklable without open handles, with a repr that identifies data and config
    (not the process's rows, so a DataLoader checkpoint restores on another host count).
    """

    def __init__(
        self, pipeline: TokenPipeline, *, rows: tuple[int, int] | None, first_step: int
    ) -> None:
        self.pipeline = pipeline
        b = pipeline.global_batch_size
        lo, hi = rows if rows is not None else (0, b)
        if not 0 <= lo < hi <= b:
            raise ValueError(f"rows={rows} must satisfy 0 <= lo < hi <= global batch size {b}")
        self.rows = (int(lo), int(hi))
        self.first_step = int(first_step)
        self.corpus = pipeline.open()
        self.order = pipeline._geometry(self.corpus)
        self.reader = WindowReader(self.corpus, self.order)
        eos = pipeline.eos_id if pipeline.eos_id is not None else self.corpus.eos_id
        self.eos_id = eos if pipeline.segmentation else None
        self.dtype = pipeline.dtype
        if pipeline.num_epochs is None:
            self.num_batches: int | None = None
            self._len = ENDLESS - self.first_step
        else:
            samples = self.order.windows_per_epoch * pipeline.num_epochs
            self.num_batches = samples // b
            self._len = max(0, self.num_batches - self.first_step)
        if self.first_step < 0:
            raise ValueError(f"first_step={first_step} must be >= 0")

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        p = self.pipeline
        ident = json.dumps(
            [
                self.corpus.fingerprint,
                p.seq_len,
                p.global_batch_size,
                int(p.seed),
                p.num_epochs,
                self.eos_id,
                self.order.chunk_tokens,
                self.order.lanes,
                p.dtype.name,
                self.first_step,
            ]
        )
        digest = hashlib.sha1(ident.encode()).hexdigest()[:16]
        return (
            f"GlobalBatchSource(data={self.corpus.fingerprint}, seq_len={p.seq_len}, "
            f"global_batch_size={p.global_batch_size}, seed={p.seed}, "
            f"first_step={self.first_step}, config={digest})"
        )

    def global_step(self, index: int) -> int:
        return self.first_step + index

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        index = int(index)
        if not 0 <= index < self._len:
            raise IndexError(f"batch {index} is out of range for {self._len} batches")
        b = self.pipeline.global_batch_size
        step = self.first_step + index
        lo, hi = self.rows
        samples = np.arange(step * b + lo, step * b + hi, dtype=np.int64)
        windows, joins = self.reader.read(samples, dtype=self.dtype)
        windows.flags.writeable = False  # inputs and targets are views of one buffer
        record = {"inputs": windows[:, :-1], "targets": windows[:, 1:]}
        if self.eos_id is not None:
            record.update(segment_features(windows, int(self.eos_id), joins))
        return record

    def _getitems(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        return [self[i] for i in indices]

    __getitems__ = _getitems
