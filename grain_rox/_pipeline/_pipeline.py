"""TokenPipeline: `.rox` shards -> mixed, phased global batches in a host-independent order.

A Grain record here is a whole batch (or this process's rows of it) assembled by vectorised
reads, so Grain's per-record cost is paid once per batch, not once per row. Global step ``k``
falls in a curriculum phase (``_curriculum``); its rows are split between the named sources
by the phase's exact mixture (``_order._mixture``); each source serves its share from its own
shuffled, lane-based order (``_lanes``), continuing across phases and epochs. Batch ``k`` is
a pure function of (data, config, seed, k), whatever the number of processes, Grain workers,
threads or prefetch depth; a process reads only rows ``[lo, hi)``; starting at step ``k``
costs the same for ``k = 10`` and ``k = 10**9``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import operator
import os
import sys
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np

from grain_rox._format._digest import facts_digest
from grain_rox._format._rox_corpus import RoxCorpus, open_rox
from grain_rox._order._curriculum import SAMPLE_LIMIT, Phase, Schedule
from grain_rox._order._lanes import DEFAULT_CHUNK_TOKENS, LaneOrder, auto_lanes
from grain_rox._order._permutation import derive_key, int_arg, record_index, seed_arg
from grain_rox._sources._grain_setup import batch_read_options, make_grain_workers_usable
from grain_rox._sources._windows import WindowReader, segment_features

RowSpec = tuple[int, int] | Mapping[int, tuple[int, int]] | None


def auto_chunk_tokens(num_tokens: int) -> int:
    """Chunk size from the corpus size: 64K tokens, smaller for corpora under 4M tokens.

    >>> auto_chunk_tokens(10**9), auto_chunk_tokens(100_000)
    (65536, 1562)
    """
    return int(min(DEFAULT_CHUNK_TOKENS, max(64, num_tokens // 64)))


def _source_seed(seed: int, name: str) -> int:
    # By name, so adding or reordering sources leaves every other source's order alone.
    return derive_key(seed, zlib.crc32(name.encode("utf-8")))


@dataclasses.dataclass(frozen=True)
class TokenPipeline:
    """Global batches of next-token windows from `.rox` shards, shuffled, through Grain.

    ``sources`` is one path spec (file, glob, directory, base path, list) or a mapping
    ``{name: path spec}``. Either give ``seq_len`` and ``global_batch_size`` (one endless
    phase; ``weights`` when mixing), or ``phases=[Phase(...), ...]`` for a curriculum.
    ``max_seq_len`` (default: the longest phase's) is the window room every lane keeps at an
    epoch's end; a run that may later add a phase with longer windows must set it up front.

    ``layout="windows"`` yields ``{"windows": (B, seq_len + 1)}`` (plus ``"segments"``:
    (B, 3, seq_len) = inputs_segmentation, inputs_position, targets_segmentation) instead of
    six MaxText arrays: fewer, larger transfers to the devices (each transfer has a fixed
    cost); :func:`grain_rox.unpack_windows` turns it back into MaxText features inside a jit.

    Each record has ``inputs`` and ``targets`` (``seq_len`` tokens each, targets shifted by
    one) and, when an EOS id is known (argument or manifest), ``inputs_segmentation``,
    ``inputs_position``, ``targets_segmentation`` and ``targets_position``.

    Sources whose manifests record different tokenizers or EOS ids (their token ids mean
    different things) are refused unless ``allow_mixed_tokenizers=True``; sources that record
    no tokenizer (roxxel's own files) are not checked. An endless pipeline serves steps below
    :attr:`step_limit` (about ``2**61 / batch_size``), and its datasets have Grain's endless
    length, ``sys.maxsize`` (so Grain's ``.repeat()`` refuses them, and a ``.shuffle()`` needs
    a finite prefix, ``ds[:n]``); a finite one serves ``num_batches`` steps.

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

    sources: Any
    seq_len: int | None = None
    global_batch_size: int | None = None
    seed: int = 0
    num_epochs: int | None = None
    weights: Mapping[str, float] | None = None
    phases: Sequence[Phase] | None = None
    eos_id: int | None = None
    segmentation: bool = True
    chunk_tokens: int | None = None
    lanes: int | None = None
    max_seq_len: int | None = None
    dtype: Any = np.int32
    layout: str = "maxtext"
    allow_mixed_tokenizers: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", _normalize_sources(self.sources))
        where = "TokenPipeline"
        object.__setattr__(self, "seed", seed_arg(self.seed, where=where))
        for name, minimum in (("num_epochs", 1), ("eos_id", 0), ("chunk_tokens", 1), ("lanes", 1),
                              ("max_seq_len", 1)):  # fmt: skip
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, int_arg(value, name, where=where, minimum=minimum))
        for name in ("segmentation", "allow_mixed_tokenizers"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(
                    f"{where}: {name}={getattr(self, name)!r} is a "
                    f"{type(getattr(self, name)).__name__}; pass True or False"
                )
        if self.phases is None:
            for name in ("seq_len", "global_batch_size"):
                object.__setattr__(self, name, int_arg(getattr(self, name), name, where=where))
            phases: tuple[Phase, ...] = (
                Phase(None, int(self.global_batch_size), int(self.seq_len), self.weights),  # type: ignore[arg-type]
            )
        else:
            shorthand = (self.seq_len, self.global_batch_size, self.weights)
            derived = None not in shorthand[:2] and tuple(self.phases) == (
                Phase(None, self.global_batch_size, self.seq_len, self.weights),  # type: ignore[arg-type]
            )  # true after dataclasses.replace() of a shorthand pipeline
            if shorthand != (None, None, None) and not derived:
                raise ValueError(
                    "give either phases=[Phase(...), ...] or seq_len/global_batch_size/weights, "
                    "not both"
                )
            phases = tuple(self.phases)
        object.__setattr__(self, "phases", phases)
        if self.num_epochs is not None and (len(self.sources) > 1 or len(phases) > 1):
            raise ValueError(
                "num_epochs applies to one source in one phase; with mixtures or phases "
                "give each Phase its steps (see estimate_steps)"
            )
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        if self.layout not in ("maxtext", "windows"):
            raise ValueError(f"layout={self.layout!r}; use 'maxtext' or 'windows'")
        self.schedule  # noqa: B018 - builds it now: names and weights are validated early

    # ---- the data ---------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.sources)

    @property
    def paths(self) -> Any:
        """The path spec of a single-source pipeline (the mapping otherwise)."""
        return self.sources[""] if set(self.sources) == {""} else self.sources

    @functools.cached_property
    def schedule(self) -> Schedule:
        """The phases over the named sources (built once per pipeline)."""
        assert self.phases is not None
        return Schedule(self.phases, self.names)

    def open(self) -> dict[str, RoxCorpus]:
        """Open every source's shards (validated; cheap), and check that the sources share
        one tokenizer (see the class doc)."""
        corpora = {name: open_rox(spec) for name, spec in self.sources.items()}
        if not self.allow_mixed_tokenizers:
            _check_one_tokenizer(corpora)
        return corpora

    @property
    def step_limit(self) -> int:
        """The first step this pipeline cannot serve: ``num_batches`` when finite (starting
        there means "done"), else the end of the sample numbering (about 2**61 samples)."""
        total = self.num_batches
        return self.schedule.step_limit if total is None else total

    def check_step(self, step: Any, *, argument: str = "first_step") -> int:
        """``step`` as an int if this pipeline can start there, else a ``TypeError`` or
        ``ValueError`` naming ``argument``, the step and the largest step that works.

        >>> import tempfile, os, numpy as np
        >>> from grain_rox import write_rox
        >>> path = os.path.join(tempfile.mkdtemp(), "s.rox")
        >>> _ = write_rox([np.arange(5000, dtype=np.uint16)], path)
        >>> pipe = TokenPipeline(path, seq_len=16, global_batch_size=4, num_epochs=1)
        >>> pipe.check_step(np.int64(95))
        95
        >>> pipe.check_step(96)
        Traceback (most recent call last):
        ...
        ValueError: TokenPipeline: first_step=96 is past the end of this pipeline (95 batches: steps 0 to 94, and 95 means done); pass a step <= 95, or the state saved with this pipeline
        """
        return _check_step(step, argument, self.num_batches, self.schedule.step_limit)

    def _orders(self, corpora: Mapping[str, RoxCorpus], schedule: Schedule) -> list[LaneOrder]:
        orders = []
        assert self.phases is not None
        longest = self.max_seq_len or max(p.seq_len for p in self.phases)
        batch = math.lcm(*(p.batch_size for p in self.phases))
        for s, (name, corpus) in enumerate(corpora.items()):
            chunk = self.chunk_tokens or auto_chunk_tokens(corpus.num_tokens)
            usable = sum((sh.num_tokens // chunk) * chunk for sh in corpus.shards)
            try:
                orders.append(
                    LaneOrder(
                        [sh.num_tokens for sh in corpus.shards],
                        seed=_source_seed(int(self.seed), name),
                        chunk_tokens=chunk,
                        lanes=self.lanes or auto_lanes(usable, longest, multiple_of=batch),
                        runs=schedule.source_runs(s),
                        max_seq_len=longest,
                    )
                )
            except ValueError as e:
                label = f"source {name!r} ({corpus.paths[0]}...)" if name else corpus.paths[0]
                raise ValueError(f"{label}: {e}") from None
        return orders

    def batch_source(self, *, rows: RowSpec = None, first_step: int = 0) -> GlobalBatchSource:
        """The Grain data source: record ``i`` = rows ``[lo, hi)`` of global batch
        ``first_step + i`` (``rows`` may map each phase's batch size to its rows)."""
        return GlobalBatchSource(self, rows=rows, first_step=first_step)

    @property
    def num_batches(self) -> int | None:
        """Global batches in all (None when endless)."""
        return self.batch_source().num_batches

    @property
    def total_steps(self) -> int | None:
        """Steps of the whole schedule, like Roxxel's ``total_steps`` (None when endless)."""
        return self.num_batches

    def estimate_steps(self, *, seq_len: int, batch_size: int, source: str | None = None) -> int:
        """Steps of ``batch_size`` rows of ``seq_len`` in one epoch of a source (like Roxxel's
        ``estimate_steps``, but exact for this pipeline's order: lane tails excluded)."""
        name = source if source is not None else self.names[0]
        corpus = open_rox(self.sources[name])
        probe = dataclasses.replace(
            self,
            sources={name: self.sources[name]} if name else self.sources[name],
            phases=None,
            seq_len=seq_len,
            global_batch_size=batch_size,
            weights=None,
            num_epochs=None,
        )
        order = probe._orders({name: corpus}, probe.schedule)[0]
        return order.windows_per_epoch // batch_size

    def describe(self) -> dict[str, Any]:
        """The config and data identity a checkpoint is checked against."""
        corpora = self.open()
        orders = self._orders(corpora, self.schedule)
        return {
            "data": {n: c.fingerprint for n, c in corpora.items()},
            "phases": self.schedule.describe(),
            "seed": int(self.seed),
            "num_epochs": self.num_epochs,
            "eos_id": self.eos_id,
            "segmentation": self.segmentation,
            "chunk_tokens": {n: o.chunk_tokens for n, o in zip(corpora, orders, strict=True)},
            "lanes": {n: o.lanes for n, o in zip(corpora, orders, strict=True)},
            "max_seq_len": orders[0].max_seq_len,
            "dtype": self.dtype.name,
            "layout": self.layout,
        }

    # ---- through Grain ----------------------------------------------------------------
    def map_dataset(self, *, rows: RowSpec = None, first_step: int = 0) -> grain.MapDataset:
        """A ``grain.MapDataset`` whose element ``i`` is global batch ``first_step + i``."""
        return grain.MapDataset.source(self.batch_source(rows=rows, first_step=first_step))

    def iter_dataset(
        self,
        *,
        rows: RowSpec = None,
        first_step: int = 0,
        worker_count: int = 0,
        worker_buffer_size: int = 2,
    ) -> grain.IterDataset:
        """``map_dataset(...).to_iter_dataset()``, with Grain worker processes if asked."""
        worker_count, worker_buffer_size = _worker_args(worker_count, worker_buffer_size)
        ds = self.map_dataset(rows=rows, first_step=first_step).to_iter_dataset(
            batch_read_options()
        )
        if worker_count > 0:
            ds = ds.mp_prefetch(
                grain.MultiprocessingOptions(
                    num_workers=worker_count, per_worker_buffer_size=worker_buffer_size
                )
            )
        return ds

    def data_loader(
        self,
        *,
        rows: RowSpec = None,
        first_step: int = 0,
        worker_count: int = 0,
        worker_buffer_size: int = 2,
    ) -> grain.DataLoader:
        """A ``grain.DataLoader`` over the batch source (no shuffling or batching ops needed:
        the order and the batches are the source's)."""
        worker_count, worker_buffer_size = _worker_args(worker_count, worker_buffer_size)
        source = self.batch_source(rows=rows, first_step=first_step)
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


def unpack_windows(batch: Mapping[str, Any]) -> dict[str, Any]:
    """MaxText features from a ``layout="windows"`` batch (numpy or jax; cheap inside a jit).

    >>> import numpy as np
    >>> b = unpack_windows({"windows": np.arange(5)[None]})
    >>> b["inputs"].tolist(), b["targets"].tolist()
    ([[0, 1, 2, 3]], [[1, 2, 3, 4]])
    """
    w = batch["windows"]
    out = {"inputs": w[:, :-1], "targets": w[:, 1:]}
    if "segments" in batch:
        seg = batch["segments"]
        out["inputs_segmentation"] = seg[:, 0]
        out["inputs_position"] = seg[:, 1]
        out["targets_segmentation"] = seg[:, 2]
        out["targets_position"] = seg[:, 1]
    return out


def _worker_args(worker_count: Any, worker_buffer_size: Any) -> tuple[int, int]:
    return (
        int_arg(worker_count, "worker_count", where="TokenPipeline", minimum=0),
        int_arg(worker_buffer_size, "worker_buffer_size", where="TokenPipeline"),
    )


def _check_step(step: Any, argument: str, total: int | None, limit: int) -> int:
    step = int_arg(step, argument, where="TokenPipeline", minimum=0)
    if total is not None and step > total:
        raise ValueError(
            f"TokenPipeline: {argument}={step} is past the end of this pipeline ({total} "
            f"batches: steps 0 to {total - 1}, and {total} means done); pass a step <= "
            f"{total}, or the state saved with this pipeline"
        )
    if total is None and step >= limit:
        raise ValueError(
            f"TokenPipeline: {argument}={step} is past the largest step this endless pipeline "
            f"supports, {limit - 1} (its sample numbers stay below 2**61 = {SAMPLE_LIMIT}); "
            f"pass a step <= {limit - 1}, or the state saved with this pipeline"
        )
    return step


def _tokenizer_label(corpus: RoxCorpus) -> str:
    tok = corpus.tokenizer or {}
    sha = f" sha256 {tok['sha256'][:12]}" if tok.get("sha256") else ""
    return f"tokenizer {tok.get('name')!r}{sha}, EOS id {corpus.eos_id}"


def _check_one_tokenizer(corpora: Mapping[str, RoxCorpus]) -> None:
    """Refuse sources whose manifests record different tokenizers or EOS ids."""
    recorded = {n: c for n, c in corpora.items() if c.tokenizer is not None}
    facts = {json.dumps([c.tokenizer, c.eos_id], sort_keys=True) for c in recorded.values()}
    if len(facts) <= 1:
        return
    shown = "; ".join(
        f"{n!r} ({c.paths[0]}{', ...' if len(c.paths) > 1 else ''}): {_tokenizer_label(c)}"
        for n, c in recorded.items()
    )
    raise ValueError(
        f"TokenPipeline: the sources were tokenized differently ({shown}): the same token id "
        "means different text in each. Re-tokenize them with one tokenizer (grain-rox convert "
        "--tokenizer ...), or pass allow_mixed_tokenizers=True if mixing them is intended"
    )


def _normalize_sources(sources: Any) -> dict[str, Any]:
    def spec(x: Any) -> Any:
        if isinstance(x, (list, tuple)):
            return tuple(os.fspath(p) for p in x)
        return os.fspath(x) if isinstance(x, os.PathLike) else x

    if isinstance(sources, Mapping) and set(sources) == {""}:
        return {"": spec(sources[""])}  # already normalised (dataclasses.replace)
    if isinstance(sources, Mapping):
        if not sources:
            raise ValueError("sources={} is empty; give at least one {name: path}")
        bad = [n for n in sources if not isinstance(n, str) or not n]
        if bad:
            raise ValueError(f"source names must be non-empty strings, got {bad}")
        return {n: spec(p) for n, p in sources.items()}
    return {"": spec(sources)}


class GlobalBatchSource:
    """A Grain ``RandomAccessDataSource`` of (this process's rows of) global batches.

    Thread-safe, picklable without open handles, with a repr that identifies data and config
    (not the process's rows, so a DataLoader checkpoint restores on another host count).

    >>> import tempfile, os, numpy as np
    >>> from grain_rox import TokenPipeline, write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "g.rox")
    >>> _ = write_rox([np.arange(9000, dtype=np.uint16)], path)
    >>> source = TokenPipeline(path, seq_len=16, global_batch_size=4).batch_source(rows=(2, 4))
    >>> source[0]["inputs"].shape, repr(source).startswith("GlobalBatchSource(data=")
    ((2, 16), True)
    >>> import sys; len(source) == sys.maxsize  # endless, as Grain's MapDataset.repeat()
    True
    """

    def __init__(self, pipeline: TokenPipeline, *, rows: RowSpec, first_step: int) -> None:
        make_grain_workers_usable()  # a user's own mp_prefetch/DataLoader workers start
        self.pipeline = pipeline
        self.schedule = pipeline.schedule
        self.first_step = int_arg(first_step, "first_step", where="TokenPipeline", minimum=0)
        self._rows = {}
        for p in self.schedule.phases:
            b = p.batch_size
            r = rows.get(b) if isinstance(rows, Mapping) else rows
            if r is not None and (not isinstance(r, (tuple, list)) or len(r) != 2):
                raise TypeError(f"TokenPipeline: rows={r!r} must be (lo, hi), e.g. rows=(0, {b})")
            lo, hi = r if r is not None else (0, b)
            lo = int_arg(lo, "rows lo", where="TokenPipeline", minimum=None)
            hi = int_arg(hi, "rows hi", where="TokenPipeline", minimum=None)
            if not 0 <= lo < hi <= b:
                raise ValueError(f"rows={r} must satisfy 0 <= lo < hi <= batch size {b}")
            self._rows[b] = (int(lo), int(hi))
        self.corpora = pipeline.open()
        self.orders = pipeline._orders(self.corpora, self.schedule)
        self.readers = [
            WindowReader(c, o) for c, o in zip(self.corpora.values(), self.orders, strict=True)
        ]
        self.eos_ids = [
            (pipeline.eos_id if pipeline.eos_id is not None else c.eos_id)
            if pipeline.segmentation
            else None
            for c in self.corpora.values()
        ]
        self.features = all(e is not None for e in self.eos_ids)
        self.dtype = pipeline.dtype
        total = self.schedule.total_steps
        if pipeline.num_epochs is not None:
            b = self.schedule.phases[0].batch_size
            total = self.orders[0].windows_per_epoch * pipeline.num_epochs // b
        self.num_batches: int | None = total
        self.step_limit = self.schedule.step_limit if total is None else total
        _check_step(self.first_step, "first_step", total, self.schedule.step_limit)
        # Grain's "endless" is len == sys.maxsize (as MapDataset.repeat() reports it)
        self._len = sys.maxsize if total is None else max(0, total - self.first_step)

    @property
    def rows(self) -> tuple[int, int]:
        """This process's rows of the first phase's batches."""
        return self._rows[self.schedule.phases[0].batch_size]

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        p = self.pipeline
        data = {n: c.fingerprint for n, c in self.corpora.items()}
        digest = facts_digest(
            [
                data,
                self.schedule.describe(),
                int(p.seed),
                p.num_epochs,
                self.eos_ids,
                [(o.chunk_tokens, o.lanes) for o in self.orders],
                p.dtype.name,
                self.first_step,
            ]
        )
        shown = ",".join(f"{n}:{f}" if n else f for n, f in data.items())
        return (
            f"GlobalBatchSource(data={shown}, phases={len(self.schedule.phases)}, "
            f"seed={p.seed}, first_step={self.first_step}, config={digest})"
        )

    def _index(self, index: int) -> int:
        """``index`` as a record number in ``[0, len)``: a negative one counts from the end
        (as for a list or ``MapDataset``); an endless pipeline serves records below
        ``step_limit - first_step`` and has no end to count from."""
        if self.num_batches is not None:
            return record_index(index, self._len, "batch", "batches")
        index = operator.index(index)
        last = self.step_limit - 1 - self.first_step
        endless = (
            "Its len is sys.maxsize, Grain's 'endless'. Its batches are already shuffled (by "
            "the pipeline's seed); to shuffle them again or index from the end, take a finite "
            "prefix first: ds[:n].shuffle(seed=...), or pass num_epochs= or finite phases"
        )
        if index < 0:
            raise IndexError(
                f"batch {index}: an endless pipeline has no last batch to count from. {endless}"
            )
        if index > last:
            raise IndexError(
                f"batch {index} is past the last batch this endless pipeline serves, {last} "
                f"(step {self.step_limit - 1}: sample numbers stay below 2**61). {endless}"
            )
        return index

    def sources_of(self, step: int) -> np.ndarray:
        """Which source (index into ``pipeline.names``) serves each row of global ``step``."""
        p = self.schedule.phases[self.schedule.phase_of_step(step)]
        return self.schedule.step_samples(step, 0, p.batch_size)[1]

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        step = self.first_step + self._index(index)
        phase = self.schedule.phases[self.schedule.phase_of_step(step)]
        lo, hi = self._rows[phase.batch_size]
        _, sources, own = self.schedule.step_samples(step, lo, hi)
        if len(self.readers) == 1:
            windows, joins = self.readers[0].read(own, dtype=self.dtype)
        else:
            windows = np.empty((hi - lo, phase.seq_len + 1), dtype=self.dtype)
            joins = None
            for s in np.unique(sources).tolist():
                sel = np.flatnonzero(sources == s)
                part, part_joins = self.readers[s].read(own[sel], dtype=self.dtype)
                windows[sel] = part
                if part_joins is not None:
                    if joins is None:
                        joins = np.zeros(windows.shape, dtype=bool)
                    joins[sel] = part_joins
        features = self._features(windows, joins, sources)
        windows.flags.writeable = False  # inputs and targets are views of one buffer
        if self.pipeline.layout == "windows":
            record = {"windows": windows}
            if features:
                record["segments"] = np.stack(
                    [
                        features["inputs_segmentation"],
                        features["inputs_position"],
                        features["targets_segmentation"],
                    ],
                    axis=1,
                )
            return record
        record = {"inputs": windows[:, :-1], "targets": windows[:, 1:]}
        record.update(features)
        return record

    def _features(
        self, windows: np.ndarray, joins: np.ndarray | None, sources: np.ndarray
    ) -> dict[str, np.ndarray]:
        if not self.features:
            return {}
        eos_ids = [int(e) for e in self.eos_ids if e is not None]
        if len(set(eos_ids)) == 1:  # one EOS id for all sources: one pass over the batch
            return segment_features(windows, eos_ids[0], joins)
        out: dict[str, np.ndarray] = {}
        for s in np.unique(sources).tolist():
            sel = np.flatnonzero(sources == s)
            part_joins = None if joins is None else joins[sel]
            part = segment_features(windows[sel], eos_ids[s], part_joins)
            for key, value in part.items():
                if key not in out:
                    out[key] = np.empty((windows.shape[0], windows.shape[1] - 1), np.int32)
                out[key][sel] = value
        return out

    def _getitems(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        return [self[i] for i in indices]

    __getitems__ = _getitems
