"""MultiHostDataLoadIterator: host batches from Grain -> global ``jax.Array``s on a mesh.

Each process reads only the rows its devices hold; the rows are placed with
``jax.make_array_from_process_local_data``. A bounded background thread keeps ``prefetch``
batches on the devices ahead of the training step; an error there is re-raised in the caller
after the good batches before it, never a hang. The iterator's state is the number of global
batches handed to the caller, so it restores on any number of processes (for a
:class:`~grain_rox.TokenPipeline`), or Grain's own state (for a user's Grain loader).
``set_state`` refuses a state from other data or config (the pipeline's identity; for Grain
inputs the identity a ``.batches()`` state or a ``grain.DataLoader`` carries), from the other
kind of input, or edited by hand (see ``grain_rox._devices._iterator_state``), naming the problem. A
batch whose rows the mesh's data axis cannot split evenly is an error naming the batch size,
the number of devices on that axis and the fix.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import queue
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import grain
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from grain_rox._devices._iterator_state import STATE_VERSION as _STATE_VERSION
from grain_rox._devices._iterator_state import check_step, decode_state
from grain_rox._devices._iterator_state import history_problems as _history_problems
from grain_rox._order._curriculum import ENDLESS
from grain_rox._pipeline._pipeline import TokenPipeline

_DONE = object()
_running: weakref.WeakSet[MultiHostDataLoadIterator] = weakref.WeakSet()
_exit_hook: list[bool] = []


def _stop_all_at_exit() -> None:
    """Stop the prefetch threads of iterators nobody closed before the interpreter exits: a
    daemon thread still inside JAX or Grain during shutdown aborts the process."""
    for it in list(_running):
        try:  # noqa: SIM105 - contextlib may already be gone at exit
            it.close()
        except Exception:
            pass


def default_mesh(axis: str = "data") -> Mesh:
    """A 1-D mesh over every device of every process, named ``axis``."""
    return Mesh(np.asarray(jax.devices()), (axis,))


def data_shards(sharding: NamedSharding) -> tuple[int, str]:
    """How many pieces ``sharding`` cuts a batch's rows into, and the mesh axes that do it.

    >>> mesh = Mesh(np.asarray(jax.devices()[:1]), ("data",))
    >>> data_shards(NamedSharding(mesh, PartitionSpec("data")))
    (1, "'data'")
    """
    spec = sharding.spec
    first = spec[0] if len(spec) else None
    if first is None:
        return 1, "(none: rows are not split)"
    axes = first if isinstance(first, tuple) else (first,)
    return math.prod(sharding.mesh.shape[a] for a in axes), "/".join(map(repr, axes))


def process_rows(sharding: NamedSharding, global_batch: int, ndim: int = 2) -> tuple[int, int]:
    """The contiguous rows ``[lo, hi)`` of a global batch that this process's devices hold."""
    shape = (global_batch,) + (1,) * (ndim - 1)
    index_map = sharding.addressable_devices_indices_map(shape)
    starts, stops = [], []
    for index in index_map.values():
        assert index is not None
        rows = index[0]
        start, stop, _ = rows.indices(global_batch)
        starts.append(start)
        stops.append(stop)
    lo, hi = min(starts), max(stops)
    covered = np.zeros(global_batch, dtype=bool)
    for a, b in zip(starts, stops, strict=True):
        covered[a:b] = True
    if not covered[lo:hi].all():
        raise ValueError(
            f"this process's devices hold non-contiguous rows of the batch under {sharding}; "
            "use a mesh whose data axis keeps each process's devices together "
            "(e.g. jax.make_mesh or mesh_utils.create_device_mesh)"
        )
    return lo, hi


class MultiHostDataLoadIterator:
    """Iterate global ``jax.Array`` batches laid out on ``mesh`` (see the module doc).

    ``loader_or_dataset`` is a :class:`~grain_rox.TokenPipeline` (recommended: each process
    reads only its rows and the state restores on any host count), a ``grain.DataLoader``, or
    a ``grain.MapDataset`` / ``grain.IterDataset`` whose elements are this process's rows.

    >>> import tempfile, os, numpy as np
    >>> from grain_rox import TokenPipeline, write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "m.rox")
    >>> _ = write_rox([np.arange(20000, dtype=np.uint16)], path)
    >>> pipe = TokenPipeline(path, seq_len=32, global_batch_size=8, num_epochs=1)
    >>> with MultiHostDataLoadIterator(pipe) as it:
    ...     batch = next(it)
    ...     state = it.get_state()
    >>> batch["inputs"].shape, type(batch["inputs"]).__name__, len(it)
    ((8, 32), 'ArrayImpl', 79)
    >>> json.loads(state)["step"]
    1
    """

    def __init__(
        self,
        loader_or_dataset: Any,
        *,
        mesh: Mesh | None = None,
        data_sharding: NamedSharding | None = None,
        data_axis: str = "data",
        prefetch: int = 2,
        worker_count: int = 0,
    ) -> None:
        if data_sharding is not None and mesh is not None and data_sharding.mesh != mesh:
            raise ValueError("data_sharding was built on another mesh than mesh=")
        if data_sharding is None:
            mesh = mesh if mesh is not None else default_mesh(data_axis)
            if data_axis not in mesh.axis_names:
                raise ValueError(
                    f"mesh axes {mesh.axis_names} have no {data_axis!r} axis; pass data_axis= "
                    "or data_sharding="
                )
            data_sharding = NamedSharding(mesh, PartitionSpec(data_axis))
        self.sharding = data_sharding
        self.mesh = data_sharding.mesh
        self.prefetch = max(1, int(prefetch))
        self.worker_count = int(worker_count)
        self._source = loader_or_dataset
        self._pipeline = loader_or_dataset if isinstance(loader_or_dataset, TokenPipeline) else None
        self._step = 0
        self._grain_state: Any = None  # the Grain state after the last batch handed out
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=self.prefetch)
        self._stop = threading.Event()
        self._exhausted = False
        self._shards, self._axes = data_shards(self.sharding)
        self._first_rows: int | None = None  # a Grain input's batch rows (set by the producer)
        self._length: tuple[int | None] | None = None  # len() of the input, once known
        if self._pipeline is not None:
            sizes = sorted({p.batch_size for p in self._pipeline.schedule.phases})
            bad = [b for b in sizes if b % self._shards]
            if bad:
                fix = -(-bad[0] // self._shards) * self._shards
                raise ValueError(
                    f"global_batch_size={bad[0]} cannot be split evenly over the "
                    f"{self._shards} devices of the mesh's {self._axes} axis: use a "
                    f"global_batch_size that is a multiple of {self._shards} (e.g. {fix}), or a "
                    "mesh with fewer devices on that axis"
                )
            self._rows = {b: process_rows(self.sharding, b) for b in sizes}
            lo, hi = self._rows[sizes[0]]
            self._factor = sizes[0] // (hi - lo)
            self._describe = self._pipeline.describe()
        self._grain_iter: Any = None

    @property
    def local_rows(self) -> dict[int, tuple[int, int]]:
        """For a TokenPipeline: each phase batch size -> the rows ``[lo, hi)`` this process
        reads (its devices' part of the global batch)."""
        if self._pipeline is None:
            raise TypeError("local_rows is known only for a TokenPipeline input")
        return dict(self._rows)

    # ---- sizes ----------------------------------------------------------------------------
    def __len__(self) -> int:
        n = self._input_length()
        if n is None:
            if self._pipeline is None and not hasattr(self._source, "__len__"):
                raise TypeError(
                    f"len() is unknown for a {type(self._source).__name__} input (it has no "
                    "len()); pass a grain.MapDataset to know it, or count the batches"
                )
            raise TypeError("this iterator is endless (num_epochs=None): it has no len()")
        return n

    def _input_length(self) -> int | None:
        """Batches the input serves in all (None: endless or unknown), computed once."""
        if self._length is None:
            if self._pipeline is not None:
                n = self._pipeline.num_batches
            else:
                try:
                    n = len(self._source)
                except TypeError:
                    n = None
            self._length = (None if n is None or n >= min(ENDLESS, sys.maxsize) else int(n),)
        return self._length[0]

    # ---- the producer ---------------------------------------------------------------------
    def _make_grain_iterator(self, start_step: int, grain_state: Any) -> Any:
        if self._pipeline is not None:
            ds = self._pipeline.iter_dataset(
                rows=self._rows, first_step=start_step, worker_count=self.worker_count
            )
            return iter(ds)
        it = iter(self._source)
        if grain_state is not None:
            try:
                it.set_state(grain_state)
            except BaseException:
                closer = getattr(it, "close", None)
                if callable(closer):
                    closer()
                raise
        return it

    def _to_global(self, local: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten(local)
        unique: dict[int, np.ndarray] = {}  # the same host array (shared positions) once
        for leaf in leaves:
            if id(leaf) not in unique:
                unique[id(leaf)] = np.ascontiguousarray(leaf)  # JAX copies strided views slower
        arrays = list(unique.values())
        self._check_rows(arrays)
        if jax.process_count() == 1:
            placed = jax.device_put(arrays, self.sharding)  # one batched transfer
        else:
            placed = [
                jax.make_array_from_process_local_data(
                    self.sharding, a, (a.shape[0] * self._row_factor(a.shape[0]), *a.shape[1:])
                )
                for a in arrays
            ]
        by_id = dict(zip(unique, placed, strict=True))
        return jax.tree_util.tree_unflatten(treedef, [by_id[id(leaf)] for leaf in leaves])

    def _check_rows(self, arrays: list[np.ndarray]) -> None:
        """A Grain input's batch must split evenly over the data axis: say which batch does
        not, and what to change, instead of JAX's error about a shape the user never made."""
        if self._pipeline is not None or not arrays:
            return
        local = {a.shape[0] if a.ndim else 0 for a in arrays}
        rows = max(local) * self._row_factor(max(local))
        if self._first_rows is None:
            self._first_rows = rows
        if len(local) == 1 and rows % self._shards == 0 and rows > 0:
            return
        where = f"the {self._shards} devices of the mesh's {self._axes} axis"
        if len(local) > 1 or rows == 0:
            raise ValueError(
                f"a batch's arrays have different (or no) leading sizes {sorted(local)}: every "
                f"array of a batch needs the same number of rows, split over {where}"
            )
        if rows < self._first_rows:
            raise ValueError(
                f"the last batch has {rows} rows (the earlier ones had {self._first_rows}), "
                f"which cannot be split evenly over {where}: drop the partial batch (use "
                "drop_remainder=True in grain.transforms.Batch / .batch())"
            )
        raise ValueError(
            f"the batches have {rows} rows, which cannot be split evenly over {where}: use a "
            f"batch size that is a multiple of {self._shards} (in total over all processes)"
        )

    def _row_factor(self, local_rows: int) -> int:
        if self._pipeline is not None:
            return self._factor  # global rows / this process's rows, the same in every phase
        return jax.process_count()

    def _produce(self, grain_iter: Any, stop: threading.Event, out: queue.Queue[Any]) -> None:
        try:
            while not stop.is_set():
                try:
                    local = next(grain_iter)
                except StopIteration:
                    out.put((_DONE, None))
                    return
                state = None
                if self._pipeline is None and hasattr(grain_iter, "get_state"):
                    state = grain_iter.get_state()
                batch = self._to_global(local)
                while not stop.is_set():
                    try:
                        out.put((batch, state), timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # re-raised in the caller, in order
            out.put((e, None))

    def start_prefetch(self) -> None:
        """Start the background producer (done automatically on the first ``next``)."""
        if self._thread is not None or self._exhausted:
            return
        if self._grain_iter is None:  # (set_state may have made it, to check the state)
            self._grain_iter = self._make_grain_iterator(self._step, self._grain_state)
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.prefetch)
        self._thread = threading.Thread(
            target=self._produce,
            args=(self._grain_iter, self._stop, self._queue),
            name="grain_rox-prefetch",
            daemon=True,
        )
        self._thread.start()
        _running.add(self)
        if not _exit_hook:
            _exit_hook.append(True)
            atexit.register(_stop_all_at_exit)

    def _halt(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            while thread.is_alive():
                with contextlib.suppress(queue.Empty):
                    self._queue.get(timeout=0.05)
                thread.join(timeout=0.05)
        closer = getattr(self._grain_iter, "close", None)
        if callable(closer):
            closer()
        self._grain_iter = None

    # ---- the iterator protocol -------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._exhausted:
            raise StopIteration
        if self._thread is None:
            self.start_prefetch()
        item, state = self._queue.get()
        if item is _DONE:
            self._exhausted = True
            self._halt()
            raise StopIteration
        if isinstance(item, BaseException):
            self._halt()
            raise item
        self._step += 1
        self._grain_state = state
        return item

    # ---- state -----------------------------------------------------------------------------
    @property
    def step(self) -> int:
        """Global batches handed to the caller so far (or since the restored state)."""
        return self._step

    def get_state(self) -> bytes:
        """JSON bytes: the step, and the pipeline identity or Grain's own state."""
        state: dict[str, Any] = {"version": _STATE_VERSION, "step": self._step}
        if self._pipeline is not None:
            state["pipeline"] = self._describe
        else:
            grain_state = self._grain_state
            if isinstance(grain_state, bytes):
                grain_state = {"bytes": grain_state.decode("utf-8")}
            state["grain"] = grain_state
        return json.dumps(state, sort_keys=True).encode("utf-8")

    def set_state(self, state: bytes | str | dict[str, Any]) -> None:
        """Continue after the batch where ``state`` was taken (from any process count).

        A state from other data, another config or another kind of input is refused, naming
        what changed; so is a hand-edited one (a step that is not a non-negative int, or past
        the end of a finite input)."""
        decoded = decode_state(state)
        step = decoded["step"]
        if self._pipeline is not None:
            self._check_pipeline_state(decoded)
            length = self._input_length()
            limit = (
                ENDLESS if length is not None else getattr(self._pipeline, "step_limit", ENDLESS)
            )
            check_step(step, length, limit=limit, what="this TokenPipeline")
            grain_state = None
        else:
            grain_state = self._check_grain_state(decoded)
            check_step(step, self._input_length(), limit=sys.maxsize, what="this Grain input")
        self._halt()
        if grain_state is not None:  # Grain checks its own state now, not at the next batch
            self._grain_iter = self._make_grain_iterator(step, grain_state)
        self._step = step
        self._grain_state = grain_state
        self._exhausted = False

    def _check_pipeline_state(self, decoded: dict[str, Any]) -> None:
        saved = decoded.get("pipeline")
        if not isinstance(saved, dict):
            raise ValueError(
                "cannot restore this data state on an iterator over a TokenPipeline: it was "
                "saved from an iterator fed by a Grain loader or dataset; restore it on an "
                "iterator over that same Grain input"
            )
        changed = {
            k: (saved.get(k), v)
            for k, v in self._describe.items()
            if saved.get(k) != v and k != "phases"
        }
        changed.update({k: (v, None) for k, v in saved.items() if k not in self._describe})
        history = _history_problems(
            saved.get("phases", []), self._describe["phases"], decoded["step"]
        )
        if history:
            changed["phases"] = (history, "")
        if changed:
            details = ", ".join(
                f"{k}: {a}" if k == "phases" else f"{k}: saved {a!r} -> now {b!r}"
                for k, (a, b) in changed.items()
            )
            raise ValueError(
                f"cannot restore this data state: the pipeline changed ({details}). Restore "
                "with the same data and config, or start a new run"
            )

    def _check_grain_state(self, decoded: dict[str, Any]) -> Any:
        """The Grain iterator state inside ``decoded``, checked against this input's kind (its
        data and config are checked by the Grain iterator: a ``.batches()`` dataset's state
        names them, a ``grain.DataLoader`` compares ``repr(data_source)`` and the sampler)."""
        if "pipeline" in decoded:
            raise ValueError(
                "cannot restore this data state on an iterator fed by a Grain loader or "
                "dataset: it was saved from an iterator over a TokenPipeline "
                f"({str(decoded['pipeline'])[:200]}); restore it on an iterator over that "
                "same TokenPipeline"
            )
        grain_state, step = decoded["grain"], decoded["step"]
        loader = isinstance(self._source, grain.DataLoader)
        if grain_state is None:
            if step > 0:
                raise ValueError(
                    f"this data state says {step} batches were served but holds no Grain "
                    "position (its input's iterator had no get_state), so it cannot resume "
                    "there; give an input whose iterator has get_state/set_state"
                )
            return None
        from_loader = isinstance(grain_state, dict) and set(grain_state) == {"bytes"}
        if from_loader and not isinstance(grain_state["bytes"], str):
            raise ValueError(f"this data state's Grain part is damaged: {grain_state!r:.200}")
        if not isinstance(grain_state, dict) or from_loader != loader:
            saved_kind = "a grain.DataLoader" if from_loader else "a Grain dataset"
            now_kind = "a grain.DataLoader" if loader else f"a {type(self._source).__name__}"
            raise ValueError(
                f"cannot restore this data state: it was saved from an iterator over "
                f"{saved_kind}, but this one reads {now_kind}; restore it on the same kind "
                "of input with the same data and config"
            )
        return grain_state["bytes"].encode("utf-8") if from_loader else grain_state

    # ---- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the background thread and release Grain's iterator."""
        self._halt()

    def __enter__(self) -> MultiHostDataLoadIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # no contextlib here: at interpreter exit module globals may already be None
        try:  # noqa: SIM105
            self._stop.set()
        except Exception:
            pass
