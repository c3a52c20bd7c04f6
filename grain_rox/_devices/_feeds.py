"""The two inputs of :class:`~grain_rox.MultiHostDataLoadIterator`, behind one interface.

* :class:`PipelineFeed`: a :class:`~grain_rox.TokenPipeline`. Each process reads only its
  devices' rows of every global batch, so the position is the step alone, and a state (the
  step and the pipeline's identity) restores on any number of processes.
* :class:`GrainFeed`: a user's ``grain.DataLoader``, ``MapDataset`` or ``IterDataset`` whose
  elements are this process's rows. Its position is Grain's own iterator state, and its data
  and config are checked by Grain (a ``.batches()`` state names them; a ``grain.DataLoader``
  compares ``repr(data_source)`` and the sampler).

A feed makes the iterator of this process's batches from a start step (and position), knows
its length, says how many rows a global batch has, and checks a saved state before it is used:
that it comes from the same kind of input, and from the same data and config.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any, Protocol

import grain
import jax
import numpy as np
from jax.sharding import NamedSharding

from grain_rox._devices._agree import digest_ints, gather_ints
from grain_rox._devices._iterator_state import check_step
from grain_rox._devices._placement import (
    data_shards,
    process_rows,
    refuse_unsplit_batch,
    row_shares,
)
from grain_rox._devices._resident import batch_source_beneath, batch_source_of
from grain_rox._order._curriculum import ENDLESS, history_problems, legacy_counts_differ
from grain_rox._pipeline._batch_source import GlobalBatchSource
from grain_rox._pipeline._pipeline import TokenPipeline
from grain_rox._sources._batch_dataset import dataset_source
from grain_rox._sources._batches import BatchSource
from grain_rox._sources._identity import ADDED_FIELDS, DATA_HINT, FORM_FIELDS
from grain_rox._sources._output_dtype import x64_enabled
from grain_rox._sources._tokens_layout import TOKENS

_log = logging.getLogger("grain_rox")


class Feed(Protocol):
    """What the iterator needs of its input (see the module doc)."""

    state_key: str  # the key of the input's part of a saved state
    in_caller: bool  # batches come out of host_iterator already placed, made in the caller

    @property
    def length(self) -> int | None:
        """Global batches in all (None: endless or unknown)."""

    def no_length(self) -> TypeError:
        """The error ``len()`` raises when :meth:`length` is None."""

    def host_iterator(self, start_step: int, position: Any) -> Iterator[Any]:
        """This process's batches from global batch ``start_step`` (at ``position``)."""

    def position(self, host_iterator: Any) -> Any:
        """Where ``host_iterator`` stands after the batch it just gave (None: at the step)."""

    def global_rows(self, local_rows: int) -> int:
        """Rows of a global batch of which this process holds ``local_rows``."""

    def check_rows(self, arrays: list[np.ndarray]) -> None:
        """Refuse a batch whose rows the mesh cannot split evenly, saying what to change."""

    def saved(self, position: Any) -> Any:
        """The input's part of a state taken at ``position`` (JSON-able)."""

    def restore(self, decoded: dict[str, Any]) -> Any:
        """The position to resume from in a decoded state (None: its step says it all), after
        checking that the state fits this input."""

    def on_device(self, batch: Any) -> Any:
        """The batch the caller gets from the batch as placed on the devices."""


def _finite(n: int | None) -> int | None:
    return None if n is None or n >= min(ENDLESS, sys.maxsize) else int(n)


class PipelineFeed:
    """A :class:`~grain_rox.TokenPipeline`, read in this process's rows of each batch."""

    state_key = "pipeline"
    in_caller = False

    def __init__(
        self,
        pipeline: TokenPipeline,
        sharding: NamedSharding,
        worker_count: int,
        features_on_device: bool | None = None,
    ):
        self.pipeline = pipeline
        if worker_count > 0:
            _log.warning(
                "MultiHostDataLoadIterator(worker_count=%d) reads this TokenPipeline in "
                "process instead: a batch is one vectorised copy from memory maps, and Grain "
                "worker processes would only add the cost of sending it back through shared "
                "memory (measured 3x slower with 8 workers); pass worker_count=0 to silence "
                "this, or use Grain workers for inputs with heavy per-batch work",
                worker_count,
            )
        shards, _ = data_shards(sharding)
        sizes = sorted({p.batch_size for p in pipeline.schedule.phases})
        bad = [b for b in sizes if b % shards]
        if bad:
            if pipeline.global_batch_size is not None:  # the one-phase shorthand
                named, what = f"global_batch_size={bad[0]}", "global_batch_size"
            else:  # phases=[...]: the phase whose batch size it is, as the user wrote it
                phases = pipeline.schedule.phases
                at = next(i for i, ph in enumerate(phases) if ph.batch_size == bad[0])
                named, what = f"phase {at}'s batch_size={bad[0]}", "batch_size"
            refuse_unsplit_batch(named, bad[0], sharding, what)
        # each phase batch size -> the rows [lo, hi) this process reads, and back: a mesh may
        # give the processes overlapping rows (12 of 16 each), so the global batch is not a
        # multiple of a process's share
        self.rows = {b: process_rows(sharding, b) for b in sizes}
        self.batch_of = {hi - lo: b for b, (lo, hi) in self.rows.items()}
        # The host reads each batch as one array (layout="tokens") and one compiled function
        # derives the MaxText features on the devices: one transfer a batch instead of six.
        self.read_as = pipeline
        self.derive: Any = None
        tokens = pipeline.plan.tokens
        rows_only = all(axis is None for axis in tuple(sharding.spec)[1:])  # not along seq_len
        # 64-bit features without jax_enable_x64 are placed as 32-bit: the host checks that no
        # value wraps (a uint32 id >= 2**31 as int64); derived on the devices, one wrapped
        fits = (
            pipeline.dtype.itemsize < 8
            or x64_enabled()
            or (tokens is not None and np.iinfo(tokens.dtype).max <= np.iinfo(np.int32).max)
        )
        possible = pipeline.layout == "maxtext" and tokens is not None and rows_only and fits
        if features_on_device and not possible:
            _log.warning(
                "MultiHostDataLoadIterator(features_on_device=True) computes the features on the "
                "host: it needs the 'maxtext' layout (this pipeline's is %r), integer tokens, "
                "a data sharding that does not split the sequence axis (this one: %s), and an "
                "output dtype JAX places as it is (this one: %s%s)",
                pipeline.layout,
                sharding.spec,
                pipeline.dtype,
                "" if fits else ", 64-bit with jax_enable_x64 off",
            )
        if features_on_device is None:
            features_on_device = any(d.platform != "cpu" for d in sharding.mesh.devices.flat)
        if features_on_device and possible and tokens is not None:
            self.read_as = pipeline.with_layout("tokens")
            out_dtype = pipeline.dtype
            # six outputs, each its own array, even where two features are equal: one output
            # fewer would save a fixed cost on an accelerator, but a step that donates the
            # batch would then donate one buffer twice (an error; on CPU, a crash)
            # (in_shardings: the same call takes a host batch over and derives its features)
            self.derive = jax.jit(
                lambda batch: tokens.unpack(batch[TOKENS], out_dtype=out_dtype),
                in_shardings=sharding,
                out_shardings=sharding,
            )
        self.identity = pipeline.describe()
        refuse_other_pipelines(self.identity, sharding)

    @functools.cached_property
    def length(self) -> int | None:
        return _finite(self.pipeline.num_batches)

    def no_length(self) -> TypeError:
        return TypeError("this iterator is endless (num_epochs=None): it has no len()")

    def host_iterator(self, start_step: int, position: Any) -> Iterator[Any]:
        # local data in this thread, batch after batch; a bucket on Grain's read threads
        return iter(self.read_as.iter_dataset(rows=self.rows, first_step=start_step))

    def on_device(self, batch: Any) -> Any:
        return batch if self.derive is None else self.derive(batch)

    def position(self, host_iterator: Any) -> Any:
        return None

    def global_rows(self, local_rows: int) -> int:
        return self.batch_of[local_rows]

    def check_rows(self, arrays: list[np.ndarray]) -> None:
        pass  # the rows were chosen to split evenly (checked when the feed was made)

    def saved(self, position: Any) -> Any:
        return self.identity

    def restore(self, decoded: dict[str, Any]) -> Any:
        saved = decoded.get("pipeline")
        if not isinstance(saved, dict):
            raise ValueError(
                "cannot restore this data state on an iterator over a TokenPipeline: it was "
                "saved from an iterator fed by a Grain loader or dataset; restore it on an "
                "iterator over that same Grain input"
            )
        now = self.identity
        if decoded["version"] == 2:  # grain_rox 0.1: the lanes order, unnamed
            saved = {**saved, "order": "lanes"}
        if saved.get("order") != now["order"]:
            old = " (grain_rox 0.1's only order; its states have version 2)"
            raise ValueError(
                f"cannot restore this data state: it was saved with order={saved.get('order')!r}"
                f"{old if decoded['version'] == 2 else ''}, and this TokenPipeline uses "
                f"order={now['order']!r}, which serves batches in another order. Pass "
                f"TokenPipeline(..., order={saved.get('order')!r}) to continue this run "
                "bit-exactly, or start a new run"
            )
        # the phases are checked by their history, the holes by what the run has read; the
        # batches' form may change
        apart = ("phases", "holes")
        skipped = {*apart, *FORM_FIELDS}
        changed = {
            k: (saved.get(k), v)
            for k, v in now.items()
            if saved.get(k) != v
            and k not in skipped
            and not (k in ADDED_FIELDS and k not in saved)  # saved before it was recorded
        }
        changed.update(
            {k: (v, None) for k, v in saved.items() if k not in now and k not in skipped}
        )
        history = history_problems(saved.get("phases", []), now["phases"], decoded["step"])
        earlier = False  # refused for what an earlier release served: only it continues
        if history:
            changed["phases"] = (history, "")
        else:  # phases saved before mixing was exact continue where their counts agree
            kept = saved.get("phases", [])
            older = {
                i
                for i, p in enumerate(now["phases"][: len(kept)])
                if "apportioned" in p and "apportioned" not in kept[i]
            }
            steps = decoded["step"]
            differ = older and [
                i for i in legacy_counts_differ(self.pipeline.schedule, steps) if i in older
            ]
            if differ:
                earlier = True
                changed["phases"] = (
                    f"phases {differ} mixed by weights quantised to 2**30ths by an earlier "
                    "grain_rox, whose counts at this step differ from the exact weights' "
                    "(resuming would replay or skip samples)",
                    "",
                )
        blocks = saved.get("order") == "blocks" and "packing" not in saved  # holes are its
        if (
            blocks
            and "holes" in now
            and "holes" not in saved
            and _read_holes(saved.get("phases", []), decoded["step"])
        ):
            earlier = True
            changed["holes"] = (
                "read one token short a window by an earlier grain_rox (each lost its last "
                "pair), and this run has read some: resuming would replay or skip a few windows",
                "",
            )
        if changed:
            details = ", ".join(
                f"{k}: {a}" if k in apart else f"{k}: saved {a!r} -> now {b!r}"
                for k, (a, b) in changed.items()
            )
            grown = changed.get("max_seq_len")
            hint = ""
            if grown is not None and isinstance(grown[0], int) and grown[1] > grown[0]:
                hint = (
                    f". The run started with windows of at most {grown[0]} tokens and "
                    "order='lanes' kept room for no longer ones at every lane's end: a lanes "
                    "run that may add a phase with longer windows must be started with "
                    "TokenPipeline(max_seq_len=...) set to the longest seq_len it may use; this "
                    f"run can continue with phases of seq_len <= {grown[0]} only (the default "
                    "order='blocks' has no such limit)"
                )
            chunks = changed.get("chunk_tokens")
            kept = set(chunks[0].values()) if chunks and isinstance(chunks[0], dict) else set()
            if (
                len(kept) == 1  # one chunk for all sources, which chunk_tokens= can give
                and set(changed) <= {"chunk_tokens", "max_seq_len"}  # the phases only, else
                and saved.get("packing")
                and not self.pipeline.chunk_tokens
            ):
                hint = (
                    ". Packed rows take a chunk chosen from the longest seq_len of the phases "
                    "(and the shards); to keep this run's chunk with the phases now given, pass "
                    f"chunk_tokens={kept.pop()}"
                )
            if earlier:
                hint = (
                    ". This run continues exactly only with the grain_rox release that saved "
                    "the state"
                )
            if "data" in changed and not hint:
                now_data = ", ".join(
                    f"{n}: {spec}" if n else str(spec) for n, spec in self.pipeline.sources.items()
                )
                hint = f". The data now: {now_data[:300]}; {DATA_HINT}"
            raise ValueError(
                f"cannot restore this data state: the pipeline changed ({details}). Restore "
                f"with the same data and config, or start a new run{hint}"
            )
        length = self.length
        limit = self.pipeline.step_limit if length is None else ENDLESS
        check_step(decoded["step"], length, limit=limit, what="this TokenPipeline")
        return None


def _by_process(values: list[int]) -> str:
    """``process 0: 5, process 1: 4``, the first eight.

    >>> _by_process([5, 4])
    'process 0: 5, process 1: 4'
    """
    shown = ", ".join(f"process {i}: {v}" for i, v in enumerate(values[:8]))
    return shown + (f" and {len(values) - 8} more" if len(values) > 8 else "")


def _every_process(sharding: NamedSharding) -> bool:
    """Whether the mesh holds devices of every process (else the others make no iterator,
    and a collective would wait for them)."""
    processes = {d.process_index for d in sharding.mesh.devices.flat}
    return processes == set(range(jax.process_count()))


def refuse_other_pipelines(identity: dict[str, Any], sharding: NamedSharding) -> None:
    """Refuse an iterator whose processes read different pipelines (another seed, config or
    copy of the data in one process): each reads its own rows of its own batches, and the
    global batch would join rows of several runs, silently. One small collective."""
    if jax.process_count() == 1 or not _every_process(sharding):
        return
    got = gather_ints(digest_ints(identity))
    if len({tuple(r) for r in got.tolist()}) > 1:
        groups: dict[tuple[int, ...], list[int]] = {}
        for p, r in enumerate(got.tolist()):
            groups.setdefault(tuple(r), []).append(p)
        shown = " | ".join(
            f"process{'es' if len(ps) > 1 else ''} {', '.join(map(str, ps[:8]))}"
            for ps in groups.values()
        )
        raise ValueError(
            f"the processes read different TokenPipelines (by pipeline: {shown}; each group "
            "its own data, config or seed): the global batch would join rows of different "
            "runs. Build the same TokenPipeline, over the same data, in every process. This "
            f"process's: {json.dumps(identity, default=str)[:400]}"
        )


def refuse_uneven_lengths(
    length: int | None,
    last_rows: int | None,
    sharding: NamedSharding,
    *,
    refused: bool = False,
    unsplit: str | None = None,
) -> None:
    """Refuse Grain inputs that give the processes different numbers of batches, or last
    batches of different sizes (each process's ``length`` and rows in its last batch; None:
    unknown or endless). In the first case the process whose input ends first would stop and
    the others wait for it in their next training step for ever (JAX cannot tell them); in
    the second each process would make a global array of another shape (a collective
    mismatch: an error from deep in XLA, or a hang). One small collective when the iterator
    is made, in every process of the mesh (a mesh over only some processes is not checked:
    the others make no iterator). It also carries whether this process ``refused`` its input
    already (it raises its own error after): the others stop too, instead of waiting for it;
    and ``unsplit``, why this process's devices cannot split its last batch (raised once the
    lengths agree, as the others then say)."""
    if not _every_process(sharding):
        return
    # a length as two int32 halves (JAX's default integers), -1 for unknown
    n = -1 if length is None else length
    rows = -1 if last_rows is None else min(last_rows, 2**31 - 1)
    flags = [int(refused), int(unsplit is not None)]
    got = gather_ints([n >> 31, n & (2**31 - 1), rows, *flags]).astype(np.int64)
    others = np.flatnonzero(got[:, 3]).tolist()
    if refused:
        return
    if others:
        raise ValueError(
            f"process{'es' if len(others) > 1 else ''} {', '.join(map(str, others))} refused "
            "this iterator's input when it was made (each says why in its own error); this "
            "process stops too rather than wait for them"
        )
    lengths = [int(hi << 31 | lo) for hi, lo in got[:, :2].tolist()]
    if min(lengths) < 0:  # an unknown length: nothing to compare
        return
    if len(set(lengths)) > 1:
        raise ValueError(
            "the Grain input gives the processes different numbers of batches "
            f"({_by_process(lengths)}): the process whose input ends first would stop, and the "
            "others would wait for it in their next training step for ever. Give every "
            "process the same number of batches: split the rows evenly (e.g. a grain_rox "
            "source's .batches(..., shard=(jax.process_index(), jax.process_count()))), drop "
            "each process's extra rows or partial batch, or read a TokenPipeline"
        )
    cannot = np.flatnonzero(got[:, 4]).tolist()
    if unsplit is not None:
        raise ValueError(unsplit)
    if cannot:
        raise ValueError(
            f"the last batch of process{'es' if len(cannot) > 1 else ''} "
            f"{', '.join(map(str, cannot))} cannot be split evenly by its devices (each says "
            "why in its own error); this process stops too rather than wait for them. Drop "
            "the partial batch (drop_remainder=True in grain.transforms.Batch / .batch())"
        )
    last = got[:, 2].tolist()
    if min(last) >= 0 and len(set(last)) > 1:
        raise ValueError(
            f"the Grain input's last batch makes global batches of different numbers of rows "
            f"in the processes ({_by_process(last)}): each would make a global batch of another "
            "shape, which their training steps cannot share (a collective mismatch). Drop the "
            "partial batch (drop_remainder=True in grain.transforms.Batch / .batch()), or "
            "split the rows evenly over the processes"
        )


class GrainFeed:
    """A user's Grain loader or dataset whose elements are this process's rows."""

    state_key = "grain"
    in_caller = False

    def __init__(self, source: Any, sharding: NamedSharding):
        self.source = source
        self.shards, self.axes = data_shards(sharding)
        self.first_rows: int | None = None  # a batch's global rows, from the first batch
        # A .batches() dataset knows its global batch and which rows of it this process reads
        # (its shard): the process keeps the rows its devices hold, or is refused.
        self.keep: slice | None = None
        self.global_batch: int | None = None
        problem = None  # said after the processes compare notes: none is left waiting
        try:
            batches = batch_source_of(source)
            if batches is not None:
                self.keep, self.global_batch = _rows_to_keep(batches, sharding)
            else:
                beneath = batch_source_beneath(source)  # (after a .map: rows cannot be cut)
                if beneath is not None:
                    _rows_to_keep(beneath, sharding, transformed=True)
                _refuse_overlapping_shares(sharding, self.shards)
        except ValueError as e:
            problem = e
        lo, hi = process_rows(sharding, self.shards)
        # the pieces of a global batch this process's devices hold, of self.shards: all of
        # them where processes hold the same rows (a mesh axis across them that does not
        # split the batch), and as many as its devices on the data axis otherwise (3 devices
        # of a 4-device axis, say: not a fraction 1 / processes of it)
        self.held = hi - lo
        if jax.process_count() > 1:
            last = None if problem else self._last_rows()
            unsplit = None
            if last is not None and last % self.held:  # (said once the lengths agree)
                unsplit = (
                    f"this process's last batch has {last} rows, which its devices cannot "
                    f"split evenly: they hold {self.held} of the {self.shards} pieces a global "
                    f"batch is cut into on the mesh's {self.axes} axis. Drop the partial batch "
                    "(drop_remainder=True in grain.transforms.Batch / .batch()), or give each "
                    "process a multiple of its devices' share"
                )
                last = None
            elif last is not None:  # compared as global rows
                last = last * self.shards // self.held
            refuse_uneven_lengths(
                self.length, last, sharding, refused=problem is not None, unsplit=unsplit
            )
        if problem is not None:
            raise problem

    def _last_rows(self) -> int | None:
        """Rows in this process's last batch, read by index where the input has one (a
        ``grain.MapDataset`` of known length); None otherwise, or where reading it fails
        (the first batch read says so)."""
        n = self.length
        if n is None or n == 0 or not isinstance(self.source, grain.MapDataset):
            return None
        try:
            leaves = jax.tree_util.tree_leaves(self.source[n - 1])
        except Exception:  # (the same element fails again when it is read)
            return None
        sizes = {np.shape(leaf)[0] for leaf in leaves if np.ndim(leaf)}
        return sizes.pop() if len(sizes) == 1 else None

    @functools.cached_property
    def length(self) -> int | None:
        try:
            return _finite(len(self.source))
        except TypeError:
            return None

    def no_length(self) -> TypeError:
        if not hasattr(self.source, "__len__"):
            return TypeError(
                f"len() is unknown for a {type(self.source).__name__} input (it has no "
                "len()); pass a grain.MapDataset to know it, or count the batches"
            )
        return TypeError("this iterator is endless (num_epochs=None): it has no len()")

    def host_iterator(self, start_step: int, position: Any) -> Iterator[Any]:
        it: Any = iter(self.source)
        if self.keep is not None:
            it = _KeptRows(it, self.keep)
        if position is not None:
            try:
                it.set_state(position)
            except (KeyError, IndexError, TypeError) as e:  # Grain's own, on a misfit state
                misfit = misfit_state(it, position, e)
                _close(it)
                raise misfit from e
            except BaseException:
                _close(it)
                raise
        return it

    def position(self, host_iterator: Any) -> Any:
        return host_iterator.get_state() if hasattr(host_iterator, "get_state") else None

    def global_rows(self, local_rows: int) -> int:
        if self.global_batch is not None:
            return self.global_batch
        return local_rows * self.shards // self.held

    def check_rows(self, arrays: list[np.ndarray]) -> None:
        """A Grain input's batch must split evenly over the data axis: say which batch does
        not, and what to change, instead of JAX's error about a shape the user never made."""
        if not arrays:
            return
        local = {a.shape[0] if a.ndim else 0 for a in arrays}
        uneven = self.held < self.shards and max(local) % self.held  # (else: as global rows)
        if self.global_batch is None and len(local) == 1 and uneven:
            raise ValueError(
                f"this process's batch has {max(local)} rows, which its devices cannot split "
                f"evenly: they hold {self.held} of the {self.shards} pieces a global batch is "
                f"cut into on the mesh's {self.axes} axis, so give it a multiple of "
                f"{self.held} rows (its devices' share of the global batch)"
            )
        rows = self.global_rows(max(local))
        if self.first_rows is None:
            self.first_rows = rows
        if len(local) == 1 and rows % self.shards == 0 and rows > 0:
            return
        where = f"the {self.shards} devices of the mesh's {self.axes} axis"
        if len(local) > 1 or rows == 0:
            raise ValueError(
                f"a batch's arrays have different (or no) leading sizes {sorted(local)}: every "
                f"array of a batch needs the same number of rows, split over {where}"
            )
        if rows < self.first_rows:
            raise ValueError(
                f"the last batch has {rows} rows (the earlier ones had {self.first_rows}), "
                f"which cannot be split evenly over {where}: drop the partial batch (use "
                "drop_remainder=True in grain.transforms.Batch / .batch())"
            )
        raise ValueError(
            f"the batches have {rows} rows, which cannot be split evenly over {where}: use a "
            f"batch size that is a multiple of {self.shards} (in total over all processes)"
        )

    def on_device(self, batch: Any) -> Any:
        return batch

    def saved(self, position: Any) -> Any:
        if isinstance(position, bytes):  # a grain.DataLoader's state
            return {"bytes": position.decode("utf-8")}
        return position

    def restore(self, decoded: dict[str, Any]) -> Any:
        """Grain's iterator state inside ``decoded``, checked against this input's kind (its
        data and config are checked by the Grain iterator, see the module doc)."""
        if "pipeline" in decoded:
            raise ValueError(
                "cannot restore this data state on an iterator fed by a Grain loader or "
                "dataset: it was saved from an iterator over a TokenPipeline "
                f"({str(decoded['pipeline'])[:200]}); restore it on an iterator over that "
                "same TokenPipeline"
            )
        if decoded["version"] == 2:  # grain_rox 0.1 read TokenPipelines in the lanes order
            for pipeline in _pipelines_under(self.source):
                if pipeline.order != "lanes":
                    raise ValueError(
                        "cannot restore this data state: it was saved by grain_rox 0.1 (state "
                        "version 2), whose TokenPipeline used order='lanes', and the "
                        f"TokenPipeline inside this Grain input uses order={pipeline.order!r}, "
                        "which serves batches in another order. Pass TokenPipeline(..., "
                        "order='lanes') to continue this run bit-exactly, or start a new run"
                    )
        position, step = decoded["grain"], decoded["step"]
        loader = isinstance(self.source, grain.DataLoader)
        if decoded["version"] == 2 and isinstance(position, dict) and not loader:
            position = self._identified(position)
        if position is None:
            if step > 0:
                raise ValueError(
                    f"this data state says {step} batches were served but holds no Grain "
                    "position (its input's iterator had no get_state), so it cannot resume "
                    "there; give an input whose iterator has get_state/set_state"
                )
        else:
            position = self._position_in(position, loader)
            if not loader and not _names_its_data(position):
                _log.warning(
                    "MultiHostDataLoadIterator.set_state: this Grain dataset's state holds a "
                    "position only (step %d), not its data or order, so a restore onto other "
                    "data or another seed goes unnoticed; build the dataset on a grain_rox "
                    "source's .batches() or a TokenPipeline's map_dataset() (or "
                    "mix_datasets / pack_documents), whose states name both",
                    step,
                )
        check_step(step, self.length, limit=sys.maxsize, what="this Grain input")
        return position

    def _identified(self, position: dict[str, Any]) -> Any:
        """A grain_rox 0.1 Grain position (0.1 recorded no identities, and took any) in the
        shape this input's iterators now save: each identity taken from a fresh iterator,
        around the 0.1 position at its place (the order was checked above)."""
        it = iter(self.source)
        try:
            fresh = it.get_state()
        finally:
            _close(it)
        return _with_identities(position, fresh)

    def _position_in(self, saved: Any, loader: bool) -> Any:
        """The Grain state a saved part holds: bytes for a ``grain.DataLoader``, else a dict."""
        from_loader = isinstance(saved, dict) and set(saved) == {"bytes"}
        if from_loader and not isinstance(saved["bytes"], str):
            raise ValueError(f"this data state's Grain part is damaged: {saved!r:.200}")
        if not isinstance(saved, dict) or from_loader != loader:
            saved_kind = "a grain.DataLoader" if from_loader else "a Grain dataset"
            now_kind = "a grain.DataLoader" if loader else f"a {type(self.source).__name__}"
            raise ValueError(
                f"cannot restore this data state: it was saved from an iterator over "
                f"{saved_kind}, but this one reads {now_kind}; restore it on the same kind "
                "of input with the same data and config"
            )
        return saved["bytes"].encode("utf-8") if from_loader else saved


def misfit_state(it: Any, position: Any, error: BaseException) -> ValueError:
    """Say that a saved Grain position does not fit the iterator ``it`` (Grain's own error, on
    which ``it.set_state(position)`` failed, is a bare ``KeyError: 'next_index'``), showing
    both shapes of state."""
    try:
        now = it.get_state()
    except Exception:  # the iterator is past saying: show the saved part alone
        now = "?"
    return ValueError(
        f"cannot restore this data state: its Grain position {position!r:.200} does not fit "
        f"this input's iterator, whose state looks like {now!r:.200} (Grain: "
        f"{type(error).__name__}: {error}). It was saved from another input (e.g. a grain_rox "
        ".batches() dataset, which records what it reads, against a plain Grain dataset); "
        "restore it on the same input with the same data and config"
    )


def _names_its_data(state: Any) -> bool:
    """Whether a Grain dataset state carries a grain_rox identity (``{"identity", "state"}``
    at some level: ``.batches()``, ``mix_datasets``, ``pack_documents``).

    >>> _names_its_data({"next_index": 3}), _names_its_data([{"identity": {}, "state": {}}])
    (False, True)
    """
    if isinstance(state, dict):
        return {"identity", "state"} <= set(state) or any(map(_names_its_data, state.values()))
    if isinstance(state, list):
        return any(map(_names_its_data, state))
    return False


def _rows_to_keep(
    batches: BatchSource, sharding: NamedSharding, *, transformed: bool = False
) -> tuple[slice | None, int]:
    """Which rows of each element of a ``.batches()`` dataset this process keeps (None: all),
    and the global batch size. The element holds its shard's rows of each global batch; the
    process needs the rows its devices hold, which the mesh decides, not the process index
    (a mesh may list process 1's devices first, or put a model axis across the processes).
    Of a ``transformed`` one (a ``.map`` after it) no rows can be cut: the shard must be
    the process's rows exactly."""
    size = batches.batch_size
    refuse_unsplit_batch(
        f"the .batches() dataset's batch_size={size}", size, sharding, "batch size"
    )
    index, count = batches.shard
    first, last = index * size // count, (index + 1) * size // count
    lo, hi = process_rows(sharding, size)
    if (first, last) == (lo, hi) or (first <= lo and hi <= last and not transformed):
        return (None if (lo, hi) == (first, last) else slice(lo - first, hi - first)), size
    if size % (hi - lo) == 0 and lo % (hi - lo) == 0:
        fix = f"shard=({lo // (hi - lo)}, {size // (hi - lo)})"
    else:  # (a share no shard names: read whole, and cut here)
        fix = "shard=(0, 1) and no transformation after it"
    after = " and transformed after it (its rows cannot be cut)" if transformed else ""
    device = "" if transformed else ", or pass placement='device'"
    raise ValueError(
        f"the .batches() dataset's shard={tuple(batches.shard)} gives this process rows "
        f"[{first}, {last}) of each global batch of {size}{after}, but its devices hold rows "
        f"[{lo}, {hi}) under this mesh: the batch would be assembled from the wrong rows. "
        f"Make it with {fix}{device}"
    )


def _refuse_overlapping_shares(sharding: NamedSharding, shards: int) -> None:
    """Refuse a mesh whose processes hold overlapping but different rows of a batch (12 of 16
    each, say): a Grain input gives each process's rows as it reads them, which cannot be
    both its own and another's."""
    shares = sorted(set(row_shares(sharding, shards).values()))
    disjoint = all(a[1] <= b[0] for a, b in itertools.pairwise(shares))
    if len(shares) > 1 and not disjoint:
        shown = ", ".join(f"[{lo}, {hi})" for lo, hi in shares)
        raise ValueError(
            f"this mesh gives the processes overlapping shares of each batch (in {shards} "
            f"pieces: {shown}), which a Grain input of each process's own rows cannot give; "
            "use a mesh whose data axis keeps each process's devices together (jax.make_mesh), "
            "or read a TokenPipeline, which reads each process's rows itself"
        )


class _KeptRows:
    """A Grain iterator whose batches are cut to rows ``keep`` (this process's rows of a whole
    global batch); its state is the inner iterator's."""

    def __init__(self, inner: Any, keep: slice) -> None:
        self.inner, self.keep = inner, keep

    def __iter__(self) -> _KeptRows:
        return self

    def __next__(self) -> Any:
        return jax.tree_util.tree_map(lambda a: a[self.keep], next(self.inner))

    def get_state(self) -> Any:
        return self.inner.get_state()

    def set_state(self, state: Any) -> None:
        self.inner.set_state(state)

    def close(self) -> None:
        _close(self.inner)


def _close(it: Any) -> None:
    """Close a Grain iterator that has ``close`` (worker processes, threads); others have none."""
    closer = getattr(it, "close", None)
    if callable(closer):
        closer()


def _with_identities(saved: Any, fresh: Any) -> Any:
    """``saved`` (a Grain state without identities) with each ``{"identity", "state"}`` level
    that ``fresh`` (a state of the same chain now) has around it, at the same place.

    >>> _with_identities({"next_index": 3}, {"identity": {"seed": 1}, "state": {"next_index": 0}})
    {'identity': {'seed': 1}, 'state': {'next_index': 3}}
    """
    if isinstance(fresh, dict) and isinstance(saved, dict):
        if set(fresh) == {"identity", "state"} and set(saved) != {"identity", "state"}:
            return {"identity": fresh["identity"], "state": _with_identities(saved, fresh["state"])}
        return {k: _with_identities(v, fresh[k]) if k in fresh else v for k, v in saved.items()}
    if isinstance(fresh, list) and isinstance(saved, list) and len(fresh) == len(saved):
        return [_with_identities(s, f) for s, f in zip(saved, fresh, strict=True)]
    return saved


def _pipelines_under(node: Any, depth: int = 0) -> Iterator[TokenPipeline]:
    """The TokenPipelines whose batch sources feed a Grain loader or dataset graph."""
    if depth > 64:
        return
    if isinstance(node, GlobalBatchSource):
        yield node.pipeline
        return
    # a DataLoader's data source; a source dataset's
    for child in (getattr(node, "_data_source", None), dataset_source(node)):
        if child is not None:
            yield from _pipelines_under(child, depth + 1)
    for parent in getattr(node, "_parents", None) or ():
        yield from _pipelines_under(parent, depth + 1)


def _read_holes(phases: list[dict[str, Any]], step: int) -> bool:
    """Whether a run of the blocks order under ``phases`` (a saved schedule's description)
    may have read holes before ``step``: a phase that began before it with another seq_len
    than the one before (its first sample reads the rest of a block in mid-grid)."""
    start = 0
    for before, phase in itertools.pairwise(phases):
        steps = before.get("steps")
        if steps is None:
            return False
        start += steps
        if start >= step:
            return False
        if phase.get("seq_len") != before.get("seq_len"):
            return True
    return False
