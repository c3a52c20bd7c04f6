"""TokenPipeline: `.rox` shards -> mixed, phased global batches in a host-independent order.

A Grain record here is a whole batch (or this process's rows of it) assembled by vectorised
reads, so Grain's per-record cost is paid once per batch, not once per row. Global step ``k``
falls in a curriculum phase (``_curriculum``); its rows are split between the named sources
by the phase's exact mixture (``_order._mixture``); each source serves its share from its own
shuffled order (``_blocks``, or ``_lanes`` when asked), continuing across phases and epochs. Batch ``k`` is
a pure function of (data, config, seed, k), whatever the number of processes, Grain workers,
threads or prefetch depth; a process reads only rows ``[lo, hi)``; starting at step ``k``
costs the same for ``k = 10`` and ``k = 10**9``.

This module holds the configuration and its Grain entry points; the pipeline resolved against
its data is ``_plan``, and the Grain source that reads the batches is ``_batch_source``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grain
import numpy as np

from grain_rox._format._rox_corpus import RoxCorpus, open_rox
from grain_rox._order._bin_packing import PACKINGS
from grain_rox._order._curriculum import Phase, Schedule
from grain_rox._order._permutation import int_arg, seed_arg
from grain_rox._pipeline._batch_source import GlobalBatchSource, RowSpec
from grain_rox._pipeline._data_loader import PipelineDataLoader
from grain_rox._pipeline._plan import (
    HOLES,
    PipelinePlan,
    open_sources,
    resolve_plan,
    source_orders,
)
from grain_rox._sources._batch_dataset import BatchDataset
from grain_rox._sources._grain_setup import batch_read_options
from grain_rox._sources._identity import with_identity
from grain_rox._sources._segments import unpack_windows
from grain_rox._sources._tokens_layout import TOKENS, TokensLayout

LAYOUTS = ("maxtext", "tokens", "windows")


@dataclasses.dataclass(frozen=True)
class TokenPipeline:
    """Global batches of next-token windows from `.rox` shards, shuffled, through Grain.

    ``sources`` is one path spec (file, glob, directory, base path, list) or a mapping
    ``{name: path spec}``. Either give ``seq_len`` and ``global_batch_size`` (one endless
    phase; ``weights`` when mixing), or ``phases=[Phase(...), ...]`` for a curriculum.
    ``max_seq_len`` (default: the longest phase's) is the longest window any phase may use. With
    the default order a run may add a phase with longer windows at a restore; with
    ``order="lanes"`` it must be set up front.

    The order (``order="blocks"``, the default) cuts each epoch of a source into blocks of at
    least ``block_tokens`` (512 Mi; the whole source when smaller) and serves every block's
    windows in a seeded permutation, so each step draws from ``min(source, block_tokens)``
    tokens or more, with no fixed period; a ``seq_len`` change continues through the rest of the block with
    nothing replayed or skipped (``docs/order.md``). ``order="lanes"`` is grain_rox 0.1's
    order (a 64M-token pool at the defaults), kept to continue runs saved with it.

    ``layout="tokens"`` yields one array a batch, ``{"tokens": (B, seq_len + 1 + k)}`` in the
    sources' own integer dtype (``uint16`` for most vocabularies): the window plus ``k`` small
    columns that say where it crosses a chunk join (and, for packed rows, where its padding
    starts: ``grain_rox._sources._tokens_layout``). Each array sent to an accelerator costs a
    transfer of fixed price, so this is the fastest way in; :meth:`unpack` turns it into the
    MaxText features inside the training step's jit. ``MultiHostDataLoadIterator`` sends the
    default ``"maxtext"`` layout this way too and derives the features on the devices.
    ``layout="windows"`` yields ``{"windows": (B, seq_len + 1)}`` (plus ``"segments"``:
    (B, 3, seq_len) = inputs_segmentation, inputs_position, targets_segmentation), which
    :func:`grain_rox.unpack_windows` turns back into MaxText features.

    Each record has ``inputs`` and ``targets`` (``seq_len`` tokens each, targets shifted by
    one) and, when an EOS id is known (argument or manifest), ``inputs_segmentation``,
    ``inputs_position``, ``targets_segmentation`` and ``targets_position``.

    Sources whose manifests record different tokenizers or EOS ids (their token ids mean
    different things) are refused unless ``allow_mixed_tokenizers=True``; sources that record
    no tokenizer (roxxel's own files) are not checked. One source (a folder, glob or list)
    joining sets of other tokenizers is refused the same way; one joining sets of other EOS
    ids, or sets that record one beside sets that do not (roxxel's), is refused unless
    ``eos_id=`` gives the EOS of them all. An endless pipeline serves steps below
    :attr:`step_limit` (about ``2**61 / batch_size``), and its datasets have Grain's endless
    length, ``sys.maxsize`` (so Grain's ``.repeat()`` refuses them, and a ``.shuffle()`` needs
    a finite prefix, ``ds[:n]``); a finite one serves ``num_batches`` steps.

    Args:
        sources: One path spec (a `.rox` file, glob, directory, base path or list of them), or
            ``{name: path spec}`` to mix named sources.
        seq_len: Tokens per row of ``inputs`` (one-phase shorthand; or give ``phases``).
        global_batch_size: Rows per global batch, over all processes (one-phase shorthand).
        seed: Seeds every source's shuffled order (each source's by its name) and the mixing.
        num_epochs: Epochs of a single source in a single phase (None: endless).
        weights: ``{name: weight}`` mixing the named sources (one-phase shorthand).
        phases: ``[Phase(steps, batch_size, seq_len, weights), ...]``, a curriculum (the last
            may be endless, ``steps=None``), instead of the three shorthand arguments.
        eos_id: The EOS token for the segment features (default: the manifests').
        segmentation: Add the four segment features when an EOS id is known (default True).
        chunk_tokens: Tokens per shuffled chunk of a source (default: 64K, smaller for a small
            corpus).
        order: ``"blocks"`` (default) or ``"lanes"`` (grain_rox 0.1's order), see above.
        block_tokens: The least tokens per shuffled block of ``order="blocks"`` (default
            2**29; blocks are near-equal, under twice this; a smaller block mixes a smaller
            pool).
        lanes: ``order="lanes"`` only: contiguous parts of a source's shuffled chunks read
            side by side, one window each per round (default: up to 1024, each holding 64 or
            more longest windows).
        max_seq_len: The longest window any phase may use, now or later (default: the longest
            phase's).
        dtype: The dtype of ``inputs`` and ``targets`` (default ``int32``).
        layout: ``"maxtext"`` (six arrays, default), ``"tokens"`` (one array) or
            ``"windows"`` (see above).
        allow_mixed_tokenizers: Mix sources tokenized differently (default False: refused).
        packing: ``None`` (default: rows of concatenated text, split anywhere), or
            ``"best_fit"`` / ``"first_fit"``: each row holds whole documents (a document
            longer than a row in pieces), padded, with segment ids that keep them apart, in
            an order with the same contracts (see ``docs/packing.md``).

    >>> import tempfile, os, numpy as np
    >>> from grain_rox import write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "p.rox")
    >>> _ = write_rox([np.arange(1, 5001, dtype=np.uint16)], path, separator=0)
    >>> pipe = TokenPipeline(path, seq_len=16, global_batch_size=4, seed=1, num_epochs=1)
    >>> batch = pipe.map_dataset()[0]
    >>> batch["inputs"].shape, batch["inputs"].dtype.name, pipe.num_batches
    ((4, 16), 'int32', 77)
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
    order: str = "blocks"
    block_tokens: int | None = None
    dtype: Any = np.int32
    layout: str = "maxtext"
    allow_mixed_tokenizers: bool = False
    packing: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", _normalize_sources(self.sources))
        where = "TokenPipeline"
        object.__setattr__(self, "seed", seed_arg(self.seed, where=where))
        for name, minimum in (("num_epochs", 1), ("eos_id", 0), ("chunk_tokens", 1), ("lanes", 1),
                              ("max_seq_len", 1), ("block_tokens", 1)):  # fmt: skip
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
            phases = _phases_arg(self.phases)
        object.__setattr__(self, "phases", phases)
        if self.num_epochs is not None and (len(self.sources) > 1 or len(phases) > 1):
            raise ValueError(
                "num_epochs applies to one source in one phase; with mixtures or phases "
                "give each Phase its steps (see estimate_steps)"
            )
        _check_order_args(self.order, self.lanes, self.block_tokens)
        _check_packing_args(self)
        longest = max(p.seq_len for p in phases)
        if self.max_seq_len is not None and self.max_seq_len < longest:
            raise ValueError(
                f"TokenPipeline: max_seq_len={self.max_seq_len} is below the longest phase's "
                f"seq_len {longest}: set max_seq_len={longest} or more, or leave it unset "
                "(default: the longest phase's seq_len)"
            )
        object.__setattr__(self, "dtype", _dtype_arg(self.dtype))
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout={self.layout!r}; use one of {', '.join(map(repr, LAYOUTS))}")
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

    @functools.cached_property
    def plan(self) -> PipelinePlan:
        """This pipeline resolved against its data: the opened sources, their lane orders and
        what follows from them (built on first use, once per pipeline object; not pickled).
        A pipeline keeps the shards it first opened: to see shards appended later, make a new
        one (``dataclasses.replace(pipe)`` resolves again).

        >>> import tempfile, os, numpy as np
        >>> from grain_rox import write_rox
        >>> path = os.path.join(tempfile.mkdtemp(), "r.rox")
        >>> _ = write_rox([np.arange(5000, dtype=np.uint16)], path)
        >>> pipe = TokenPipeline(path, seq_len=16, global_batch_size=4, num_epochs=1)
        >>> pipe.plan is pipe.plan, pipe.plan.num_batches
        (True, 77)
        """
        return resolve_plan(self)

    def __getstate__(self) -> dict[str, Any]:
        # The plan holds opened files and lane orders: a process that unpickles the pipeline
        # (a Grain worker) builds its own when it needs one.
        state = self.__dict__.copy()
        state.pop("plan", None)
        return state

    def open(self) -> dict[str, RoxCorpus]:
        """Open every source's shards (validated; cheap), and check that the sources share
        one tokenizer (see the class doc)."""
        return open_sources(
            self.sources,
            allow_mixed_tokenizers=self.allow_mixed_tokenizers,
            eos_given=self.eos_id is not None or not self.segmentation,
        )

    @property
    def step_limit(self) -> int:
        """The first step this pipeline cannot serve: ``num_batches`` when finite (starting
        there means "done"), else the end of the sample numbering (about 2**61 samples)."""
        return self.plan.step_limit

    def check_step(self, step: Any, *, argument: str = "first_step") -> int:
        """``step`` as an int if this pipeline can start there, else a ``TypeError`` or
        ``ValueError`` naming ``argument``, the step and the largest step that works.

        >>> import tempfile, os, numpy as np
        >>> from grain_rox import write_rox
        >>> path = os.path.join(tempfile.mkdtemp(), "s.rox")
        >>> _ = write_rox([np.arange(5000, dtype=np.uint16)], path)
        >>> pipe = TokenPipeline(path, seq_len=16, global_batch_size=4, num_epochs=1)
        >>> pipe.check_step(np.int64(77))
        77
        >>> pipe.check_step(78)
        Traceback (most recent call last):
        ...
        ValueError: TokenPipeline: first_step=78 is past the end of this pipeline (77 batches: steps 0 to 76, and 77 means done); pass a step <= 77, or the state saved with this pipeline
        """
        return self.plan.check_step(step, argument)

    @property
    def remote(self) -> bool:
        """Whether a source is in a bucket (read by ranged requests, several batches in
        flight) rather than memory-mapped."""
        return any(corpus.remote for corpus in self.plan.corpora.values())

    def batch_source(self, *, rows: RowSpec = None, first_step: int = 0) -> GlobalBatchSource:
        """The Grain data source: record ``i`` = rows ``[lo, hi)`` of global batch
        ``first_step + i`` (``rows`` may map each phase's batch size to its rows)."""
        if self.layout == "tokens":
            self.tokens_layout()  # refuses tokens that are not integers
        return GlobalBatchSource(self, rows=rows, first_step=first_step)

    # ---- one array a batch ----------------------------------------------------------------
    def tokens_layout(self) -> TokensLayout:
        """How this pipeline packs a batch into one ``layout="tokens"`` array (its dtype, its
        join and EOS columns); a ``ValueError`` if the sources' tokens are not integers."""
        layout = self.plan.tokens
        if layout is None:
            dtypes = sorted({c.dtype.name for c in self.plan.corpora.values()})
            raise ValueError(
                f"layout='tokens' packs integer token ids, but these sources store {dtypes}; "
                "use layout='maxtext' or 'windows'"
            )
        return layout

    def with_layout(self, layout: str) -> TokenPipeline:
        """This pipeline with another record ``layout``: the same data, order and batches
        (and the same opened data: nothing is resolved again).

        >>> import tempfile, os, numpy as np
        >>> from grain_rox import write_rox
        >>> path = os.path.join(tempfile.mkdtemp(), "l.rox")
        >>> _ = write_rox([np.arange(1, 5000, dtype=np.uint16)], path, separator=0)
        >>> pipe = TokenPipeline(path, seq_len=16, global_batch_size=4, seed=1)
        >>> batch = pipe.with_layout("tokens").map_dataset()[0]
        >>> batch["tokens"].shape, batch["tokens"].dtype.name
        ((4, 18), 'uint16')
        >>> features = pipe.unpack(batch)  # inside a jit in a training step
        >>> expected = pipe.map_dataset()[0]
        >>> all(np.array_equal(features[k], expected[k]) for k in expected)
        True
        """
        other = dataclasses.replace(self, layout=layout)
        if "plan" in self.__dict__:  # share the resolved plan (layout plays no part in it)
            other.__dict__["plan"] = self.__dict__["plan"]
        return other

    def unpack(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """The MaxText features (``inputs``, ``targets`` and, with an EOS id, the four
        segment features) of a ``layout="tokens"`` or ``layout="windows"`` batch: NumPy for
        NumPy, ``jax.Array`` for JAX (cheap inside ``jax.jit``: a cumulative sum and max per
        row, or views). See :meth:`with_layout` for an example."""
        if "windows" in batch:
            return unpack_windows(batch)
        if TOKENS not in batch:
            raise KeyError(
                f"unpack() reads a layout='tokens' or 'windows' batch (key {TOKENS!r} or "
                f"'windows'); this one has keys {sorted(batch)}: build the pipeline with one of "
                "those layouts, or use pipe.with_layout('tokens')"
            )
        return self.tokens_layout().unpack(batch[TOKENS], out_dtype=self.dtype)

    @property
    def num_batches(self) -> int | None:
        """Global batches in all (None when endless)."""
        return self.plan.num_batches

    @property
    def total_steps(self) -> int | None:
        """Steps of the whole schedule, like Roxxel's ``total_steps`` (None when endless)."""
        return self.num_batches

    def estimate_steps(self, *, seq_len: int, batch_size: int, source: str | None = None) -> int:
        """Steps of ``batch_size`` rows of ``seq_len`` in one epoch of a source (like Roxxel's
        ``estimate_steps``, but exact for this pipeline's order: block tails excluded)."""
        name = source if source is not None else self.names[0]
        corpus = self._opened(name)
        probe = dataclasses.replace(
            self,
            sources={name: self.sources[name]} if name else self.sources[name],
            phases=None,
            seq_len=seq_len,
            global_batch_size=batch_size,
            weights=None,
            num_epochs=None,
        )
        order = source_orders(probe, {name: corpus})[0]
        return order.windows_per_epoch // batch_size

    def _opened(self, name: str) -> RoxCorpus:
        """Source ``name``'s shards: the plan's if it is resolved, else opened now."""
        plan = self.__dict__.get("plan")
        return plan.corpora[name] if plan is not None else open_rox(self.sources[name])

    def describe(self) -> dict[str, Any]:
        """The config and data identity a checkpoint is checked against."""
        plan = self.plan
        names = list(plan.corpora)
        return {
            "data": {n: c.fingerprint for n, c in plan.corpora.items()},
            # the sources' order (dicts compare without it): the mixture breaks its ties by
            # it, so another order of the same sources serves other rows at every step
            **({"sources": names} if len(names) > 1 else {}),
            "phases": self.schedule.describe(),
            "seed": int(self.seed),
            "num_epochs": self.num_epochs,
            "eos_id": self.eos_id,
            "segmentation": self.segmentation,
            "chunk_tokens": {n: o.chunk_tokens for n, o in zip(names, plan.orders, strict=True)},
            "order": self.order,
            **{
                key: {n: o.identity()[key] for n, o in zip(names, plan.orders, strict=True)}
                for key in plan.orders[0].identity()
            },
            # the lanes order keeps room for max_seq_len at every lane's end: it is part of
            # that order; the block order places nothing by it (a longer phase may come later)
            **({"max_seq_len": plan.orders[0].max_seq_len} if self.order == "lanes" else {}),
            "dtype": self.dtype.name,
            "layout": self.layout,
            # named only where padding is left out (a state saved before it was, on such data,
            # is refused: its order read the padding)
            **({"padding_left_out": plan.padding_left_out} if plan.padding_left_out else {}),
            # named only where a seq_len change reads a block's rest as holes (a state saved
            # while holes were read one token short is refused)
            **({"holes": HOLES} if plan.reads_holes else {}),
        }

    # ---- through Grain ----------------------------------------------------------------
    def map_dataset(self, *, rows: RowSpec = None, first_step: int = 0) -> grain.MapDataset:
        """A ``grain.MapDataset`` whose element ``i`` is global batch ``first_step + i``.

        Its iterators' states are ``{"identity": ..., "state": {"next_index": i}}``: Grain's
        position with this pipeline's identity (:meth:`describe` and ``first_step``; not the
        rows, which any number of processes may split differently), so ``set_state`` refuses
        a state saved over other data or another config, naming what changed."""
        identity = {**self.describe(), "first_step": int(first_step)}
        batches = BatchDataset(self.batch_source(rows=rows, first_step=first_step))
        return with_identity(batches, identity, what="TokenPipeline")

    def iter_dataset(
        self,
        *,
        rows: RowSpec = None,
        first_step: int = 0,
        worker_count: int = 0,
        worker_buffer_size: int = 2,
    ) -> grain.IterDataset:
        """``map_dataset(...).to_iter_dataset()``, with Grain worker processes if asked.

        Local data is read in the calling thread, batch after batch (an
        ``InOrderIterDataset``, without Grain's per-element bookkeeping); data in a bucket on
        8 of Grain's read threads, which overlap the round trips. The state is Grain's either
        way, ``{"next_index": i}``, under the pipeline's identity (see :meth:`map_dataset`)."""
        worker_count, worker_buffer_size = _worker_args(worker_count, worker_buffer_size)
        ds = self.map_dataset(rows=rows, first_step=first_step).to_iter_dataset(
            batch_read_options(remote=self.remote)
        )
        if worker_count > 0:
            ds = ds.mp_prefetch(
                grain.MultiprocessingOptions(
                    num_workers=worker_count, per_worker_buffer_size=worker_buffer_size
                )
            )
            # Grain's state of worker processes is one per worker: it restores only with as
            # many, so they are named (a state of another worker_count is refused saying so,
            # not a KeyError from inside Grain)
            identity = {**self.describe(), "first_step": int(first_step)}
            ds = with_identity(ds, {**identity, "worker_count": worker_count}, what="TokenPipeline")
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
        if not len(source):  # Grain's IndexSampler refuses 0 records, naming neither
            raise ValueError(
                f"TokenPipeline: first_step={first_step} is the end of this pipeline "
                f"({self.num_batches} batches): no batch is left, and a grain.DataLoader cannot "
                "be made over none; stop there (first_step == pipe.num_batches means done), or "
                "use iter_dataset(first_step=...), which is empty there"
            )
        return PipelineDataLoader(
            data_source=source,
            sampler=grain.samplers.IndexSampler(
                num_records=len(source),
                shard_options=grain.sharding.NoSharding(),
                shuffle=False,
                num_epochs=1,
            ),
            worker_count=worker_count,
            worker_buffer_size=worker_buffer_size,
            read_options=batch_read_options(remote=self.remote),
        )


ORDERS = ("blocks", "lanes")


def _check_order_args(order: Any, lanes: int | None, block_tokens: int | None) -> None:
    """``order`` is known, and ``lanes`` / ``block_tokens`` are given only with their order."""
    if order not in ORDERS:
        raise ValueError(
            f"TokenPipeline: order={order!r}; use 'blocks' (the default) or 'lanes' (grain_rox "
            "0.1's order, to continue a run saved with it)"
        )
    if order == "blocks" and lanes is not None:
        raise ValueError(
            f"TokenPipeline: lanes={lanes} applies to order='lanes'; the default order='blocks' "
            "takes block_tokens (or pass order='lanes' with lanes)"
        )
    if order == "lanes" and block_tokens is not None:
        raise ValueError(
            f"TokenPipeline: block_tokens={block_tokens} applies to order='blocks'; "
            "order='lanes' takes lanes"
        )


def _check_packing_args(pipeline: TokenPipeline) -> None:
    """``packing`` is known, and the rest of the config can carry packed rows."""
    packing = pipeline.packing
    if packing is None:
        return
    if packing not in PACKINGS:
        raise ValueError(
            f"TokenPipeline: packing={packing!r}; use 'best_fit', 'first_fit' or None (rows of "
            "concatenated text, the default)"
        )
    if pipeline.order != "blocks":
        raise ValueError(
            f"TokenPipeline: packing={packing!r} has its own order; order={pipeline.order!r} "
            "applies to unpacked rows (leave order at its default)"
        )
    if not pipeline.segmentation:
        raise ValueError(
            f"TokenPipeline: packing={packing!r} needs segmentation=True: the segment ids are "
            "what keep a row's documents (and its padding) apart"
        )
    short = [p.seq_len for p in pipeline.phases or () if p.seq_len < 2]
    if short:
        raise ValueError(f"TokenPipeline: packing={packing!r} needs seq_len >= 2, not {short[0]}")


def _dtype_arg(dtype: Any) -> np.dtype:
    """``dtype`` as a NumPy integer or float dtype (``np.dtype(None)`` would be float64)."""
    fix = "pass an integer dtype such as np.int32 (the default) or np.int64"
    if dtype is None:
        raise TypeError(f"TokenPipeline: dtype=None; {fix}")
    try:
        out = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"TokenPipeline: dtype={dtype!r} is not a NumPy dtype; {fix}") from None
    if out.kind not in "iuf":
        raise ValueError(f"TokenPipeline: dtype={out.name} cannot hold token ids; {fix}")
    return out


def _phases_arg(phases: Any) -> tuple[Phase, ...]:
    """``phases`` as a tuple of :class:`Phase`: a non-empty list (or other iterable) of them."""
    if isinstance(phases, (Phase, Mapping, str, bytes)) or not isinstance(phases, Iterable):
        raise TypeError(
            f"TokenPipeline: phases={phases!r:.200} is a {type(phases).__name__}, not a list of "
            "Phase; pass phases=[Phase(steps, batch_size, seq_len, weights), ...]"
        )
    phases = tuple(phases)
    if not phases:
        raise ValueError(
            "TokenPipeline: phases=[] holds no phase; pass at least one, e.g. "
            "phases=[Phase(None, batch_size, seq_len)], or seq_len= and global_batch_size="
        )
    for i, p in enumerate(phases):
        if not isinstance(p, Phase):
            raise TypeError(
                f"TokenPipeline: phases[{i}]={p!r:.200} is a {type(p).__name__}, not a Phase; "
                "pass Phase(steps, batch_size, seq_len, weights) (from grain_rox import Phase)"
            )
    return phases


def _worker_args(worker_count: Any, worker_buffer_size: Any) -> tuple[int, int]:
    return (
        int_arg(worker_count, "worker_count", where="TokenPipeline", minimum=0),
        int_arg(worker_buffer_size, "worker_buffer_size", where="TokenPipeline"),
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
