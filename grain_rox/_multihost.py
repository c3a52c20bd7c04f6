"""MultiHostDataLoadIterator: host batches from Grain -> global ``jax.Array``s on a mesh.

Each process reads only the rows its devices hold; the rows are placed with
``jax.make_array_from_process_local_data``. A bounded background thread keeps ``prefetch``
batches on the devices ahead of the training step; an error there is re-raised in the caller
after the good batches before it, never a hang. The iterator's state is the number of global
batches handed to the caller, so it restores on any number of processes (for a
:class:`~grain_rox.TokenPipeline`), or Grain's own state (for a user's Grain loader).
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from grain_rox._pipeline import TokenPipeline

_STATE_VERSION = 2
_DONE = object()


def default_mesh(axis: str = "data") -> Mesh:
    """A 1-D mesh over every device of every process, named ``axis``."""
    return Mesh(np.asarray(jax.devices()), (axis,))


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


def _history_problems(saved: list[dict[str, Any]], now: list[dict[str, Any]], step: int) -> str:
    """Why the phases ``now`` cannot continue a run saved at ``step`` under ``saved`` ("" if
    they can: phases that already ran, fully or partly, must be the same; later ones may
    change, and a running phase may be cut short at ``step`` to start a new one)."""
    start = 0
    for i, old in enumerate(saved):
        if start >= step:
            return ""  # this phase had not started: the new schedule may differ from here on
        if i >= len(now):
            return f"phase {i} (started at step {start}) is missing from the new schedule"
        new = now[i]
        diff = [
            f"{k} {old[k]!r} -> {new[k]!r}"
            for k in ("batch_size", "seq_len", "weights")
            if old[k] != new[k]
        ]
        if diff:
            return f"phase {i}, which ran from step {start}, changed ({', '.join(diff)})"
        old_steps, new_steps = old["steps"], new["steps"]
        if old_steps is not None and step >= start + old_steps:  # this phase ran in full
            if new_steps != old_steps:
                return f"phase {i} ran its {old_steps} steps but now has {new_steps}"
            start += old_steps
            continue
        done = step - start  # the phase that was running when the state was saved
        if new_steps is not None and new_steps < done:
            return f"phase {i} already ran {done} steps but now has only {new_steps}"
        return ""  # it continues, or is cut short here: later phases may differ
    return ""


def _decode_state(state: bytes | str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(state, bytes):
        state = state.decode("utf-8")
    if isinstance(state, str):
        state = json.loads(state)
    if not isinstance(state, dict) or "step" not in state or "version" not in state:
        raise ValueError(f"not a MultiHostDataLoadIterator state: {str(state)[:200]}")
    if state["version"] != _STATE_VERSION:
        raise ValueError(
            f"this data state has format version {state['version']}, but this grain_rox reads "
            f"version {_STATE_VERSION}: it was saved by another grain_rox release, whose batch "
            "order may differ; restore with that release or start a new run"
        )
    return state


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
        if self._pipeline is not None:
            sizes = sorted({p.batch_size for p in self._pipeline.schedule.phases})
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
        if self._pipeline is not None:
            n = self._pipeline.num_batches
        else:
            try:
                n = len(self._source)
            except TypeError:
                n = None
        if n is None or n >= 1 << 61:
            raise TypeError("this iterator is endless (num_epochs=None): it has no len()")
        return int(n)

    # ---- the producer ---------------------------------------------------------------------
    def _make_grain_iterator(self, start_step: int, grain_state: Any) -> Any:
        if self._pipeline is not None:
            ds = self._pipeline.iter_dataset(
                rows=self._rows, first_step=start_step, worker_count=self.worker_count
            )
            return iter(ds)
        it = iter(self._source)
        if grain_state is not None:
            it.set_state(grain_state)
        return it

    def _to_global(self, local: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten(local)
        unique: dict[int, np.ndarray] = {}  # the same host array (shared positions) once
        for leaf in leaves:
            if id(leaf) not in unique:
                unique[id(leaf)] = np.ascontiguousarray(leaf)  # JAX copies strided views slower
        arrays = list(unique.values())
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

    def _halt(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
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
        """Continue after the batch where ``state`` was taken (from any process count)."""
        decoded = _decode_state(state)
        if self._pipeline is not None:
            saved = decoded.get("pipeline")
            if saved is None:
                raise ValueError("the state was saved from a Grain loader, not a TokenPipeline")
            changed = {
                k: (saved.get(k), v)
                for k, v in self._describe.items()
                if saved.get(k) != v and k != "phases"
            }
            history = _history_problems(
                saved.get("phases", []), self._describe["phases"], int(decoded["step"])
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
        grain_state = decoded.get("grain")
        if isinstance(grain_state, dict) and set(grain_state) == {"bytes"}:
            grain_state = grain_state["bytes"].encode("utf-8")
        self._halt()
        self._step = int(decoded["step"])
        self._grain_state = grain_state
        self._exhausted = False

    # ---- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the background thread and release Grain's iterator."""
        self._halt()

    def __enter__(self) -> MultiHostDataLoadIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._stop.set()
