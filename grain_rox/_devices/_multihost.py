"""MultiHostDataLoadIterator: host batches from Grain -> global ``jax.Array``s on a mesh.

Each process reads only the rows its devices hold; the rows are placed with
``jax.make_array_from_process_local_data``. A bounded background thread keeps ``prefetch``
batches on the devices ahead of the training step (on accelerators a second one reads the next
host batch meanwhile); an error there is re-raised in the caller after the good batches before
it, never a hang. The iterator's state is the number of global batches handed to the caller,
so it restores on any number of processes (for a :class:`~grain_rox.TokenPipeline`), or
Grain's own state (for a user's Grain loader).
``set_state`` refuses a state from other data or config (the pipeline's identity; for Grain
inputs the identity a ``.batches()`` state or a ``grain.DataLoader`` carries), from the other
kind of input, or edited by hand (see ``grain_rox._devices._iterator_state``), naming the
problem. A batch whose rows the mesh's data axis cannot split evenly is an error naming the
batch size, the number of devices on that axis and the fix.

This module is the shared core (placement, prefetch, the state's envelope); what differs
between a TokenPipeline and a Grain input sits behind one interface in ``_feeds``.
``placement="device"`` serves a ``.batches()`` dataset from rows held on the devices
(``_resident``): the same batches and the same state as the host path, gathered there.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import json
import logging
import queue
import threading
import weakref
from collections.abc import Awaitable, Iterable, Iterator
from typing import Any

import jax
import numpy as np
from etils import epath
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from grain_rox._devices._feeds import Feed, GrainFeed, PipelineFeed
from grain_rox._devices._iterator_state import STATE_VERSION, decode_state
from grain_rox._devices._narrowing import leaf_names, refuse_narrowing
from grain_rox._devices._placement import default_mesh
from grain_rox._devices._resident import resident_feed
from grain_rox._order._permutation import int_arg, json_plain
from grain_rox._pipeline._pipeline import TokenPipeline

_DONE = object()
# Read the next host batch in one thread while another places the last one on the devices
# (a transfer waits on the device; reading needs the interpreter). None: on accelerators
# (measured on an H200: the default 1,650 -> 2,539 batches/s at (32, 1024), 930 -> 1,520 at
# (256, 2048)), not on CPU devices, where both stages compete for the same cores.
_SPLIT_PRODUCER: bool | None = None
# Place a batch by calling one jitted function on the host arrays (its C++ dispatch copies
# them over, and derives the features in the same call where the feed has them to derive)
# rather than through jax.device_put's Python path. None: where the batch lands on one device
# of one process (measured on CPU: 39 us a (32, 1025) batch by device_put, 9.6 by the call);
# across several devices the call goes through JAX's Python sharding of host arrays
# (8 CPU devices: 250 us against 83 for device_put), so those keep device_put.
_PLACE_BY_CALL: bool | None = None
# The call compiles once per batch shape (17 ms a shape on CPU, against 0.4 for a device_put):
# batches of more shapes than this (a user's Grain input padded per batch) place the new
# shapes by device_put.
_CALL_SHAPES = 8
_log = logging.getLogger("grain_rox")
_running: weakref.WeakSet[MultiHostDataLoadIterator] = weakref.WeakSet()
_exit_hook: list[bool] = []


def _put(out: queue.Queue[Any], item: Any, stop: threading.Event) -> bool:
    """Put ``item`` into ``out``, waiting for room unless ``stop`` is set (then False)."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _drain(items: queue.Queue[Any], stop: threading.Event) -> Iterator[Any]:
    """The items of ``items`` until ``stop`` is set."""
    while not stop.is_set():
        try:
            yield items.get(timeout=0.1)
        except queue.Empty:
            continue


# JAX settings under which the call is not a transfer like device_put: each with the values
# that leave it so (a transfer guard refuses or logs host arrays in a jitted call, NaN checks
# refuse a batch holding a NaN, jit disabled hands the host arrays back).
_CALL_SETTINGS = (
    ("jax_transfer_guard", (None, "allow")),
    ("jax_transfer_guard_host_to_device", (None, "allow")),
    ("jax_debug_nans", (None, False)),
    ("jax_debug_infs", (None, False)),
    ("jax_disable_jit", (None, False)),
)


def _indivisible(error: Exception) -> bool:
    """Whether ``error`` is JAX's refusal of a sharding that cannot split an array evenly
    (``IndivisibleError``, a ValueError; its name is private, its message says so; JAX
    before 0.7 raised a plain ValueError: "... should be divisible by 4, but it is ...")."""
    text = str(error)
    return (
        type(error).__name__ == "IndivisibleError"
        or "evenly divide" in text
        or "should be divisible by" in text
    )


@functools.lru_cache(maxsize=64)
def _takes(dtype: np.dtype) -> bool:
    """Whether the placing call takes arrays of ``dtype`` as they are: booleans, integers,
    floats, complex and ml_dtypes' (bfloat16, float8, int4: numpy kind "V", unstructured), in
    native byte order. Strings, objects and records go by device_put, whose error names them."""
    plain = dtype.kind in "biufc" or (dtype.kind == "V" and dtype.names is None)
    return plain and dtype.isnative


def _stop_all_at_exit() -> None:
    """Stop the prefetch threads of iterators nobody closed before the interpreter exits: a
    daemon thread still inside JAX or Grain during shutdown aborts the process."""
    for it in list(_running):
        try:  # noqa: SIM105 - contextlib may already be gone at exit
            it.close()
        except Exception:
            pass


def _input_kind(feed: Feed) -> str:
    """The input a restore continues, in words, for the log."""
    if isinstance(feed, PipelineFeed):
        data = feed.identity.get("data") or {}
        named = ", ".join(f"{k} {v}" if k else str(v) for k, v in data.items())
        return f"a TokenPipeline over data {named}"
    if isinstance(feed, GrainFeed):
        return f"a Grain input ({type(feed.source).__name__})"
    return f"a .batches() dataset held on the devices ({getattr(feed, 'layout', '?')})"


class MultiHostDataLoadIterator:
    """Iterate global ``jax.Array`` batches laid out on ``mesh``, resumable from ``get_state()``.

    Each process reads only the rows its devices hold and places them with
    ``jax.make_array_from_process_local_data``; a background thread keeps ``prefetch`` batches
    on the devices ahead of the training step (on accelerators two: one reads the next batch
    while the other places the last; an error there is raised in the caller after the good
    batches before it, never a hang). The state is the number of global batches handed out
    (plus Grain's own state for a Grain input), so a TokenPipeline's state restores on any
    number of processes; ``set_state`` refuses a state from other data, another config or
    another kind of input, naming what changed. Use it as a context manager, or call
    ``close()``, to stop the threads.

    ``loader_or_dataset`` is a :class:`~grain_rox.TokenPipeline` (recommended: each process
    reads only its rows and the state restores on any host count), a ``grain.DataLoader``, or
    a ``grain.MapDataset`` / ``grain.IterDataset`` whose elements are this process's rows
    (the rows its devices hold: every row, the same in each process, where the mesh's
    processes do not split the batch). A Grain input must give every process the same number
    of batches: where one process's input ends first, it stops and the others' next global
    batch waits for it in their training step (JAX cannot tell them), and the same last
    batch size (else the global arrays differ in shape). A ``grain.MapDataset``'s length and
    last batch are compared when the iterator is made, and uneven ones refused; a
    TokenPipeline, and ``.batches(shard=...)`` of one source, end on the same step
    everywhere.

    Args:
        loader_or_dataset: The input, as above.
        mesh: The device mesh (default: every device of every process on one axis named
            ``data_axis``).
        data_sharding: How a batch's arrays lie on the mesh (default: rows split over
            ``data_axis``); give it instead of, or built on, ``mesh``.
        data_axis: The mesh axis that splits a batch's rows (default ``"data"``).
        prefetch: Batches kept on the devices ahead of the training step (at least 1).
        worker_count: Kept for compatibility: a TokenPipeline is read in process whatever it
            says (a batch is one vectorised copy; Grain workers only add the cost of sending
            it back), with a log line saying so; a Grain input brings its own workers.
        features_on_device: For a TokenPipeline with the default ``"maxtext"`` layout, send
            each batch as one array and derive the MaxText features on the devices with one
            compiled function (one transfer instead of six), or compute them on the host and
            send each array (False). Default: on the devices when they are accelerators, on
            the host when they are CPUs (there XLA's row scans cost more than NumPy's and a
            "transfer" is a memory copy).
        placement: ``"host"`` (default): each batch is read on the host and sent over.
            ``"device"``: for a ``.batches()`` dataset of fixed-shape rows (NumPy, HF eager,
            ArrayRecord rows, ``shuffled_batches(RoxTokenSource(...))``), every row is placed
            on the devices once (replicated, or sharded over the data axis when only a share
            fits; an error naming the sizes when neither does) and each batch is gathered
            there: the same batches and state as the host path, so a run can switch between
            the two across a restore. ``"auto"``: the devices when that works, else the host.
        device_memory_budget: For ``placement="device"``/``"auto"``: bytes of rows one
            device may hold (default: a quarter of its free memory; CPU devices: a quarter
            of the host's RAM shared among this process's devices).

    Raises:
        ValueError: a batch whose rows the mesh's ``data_axis`` cannot split evenly (naming
            the batch size, the devices on that axis and a size that works);
            ``data_sharding`` built on another mesh than ``mesh``; with
            ``placement="device"``, rows that fit on the devices neither replicated nor
            sharded; a ``grain.MapDataset`` that gives the processes different numbers of
            batches or last batches of different sizes (naming each process's).

    >>> import tempfile, os, numpy as np
    >>> from grain_rox import TokenPipeline, write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "m.rox")
    >>> _ = write_rox([np.arange(20000, dtype=np.uint16)], path)
    >>> pipe = TokenPipeline(path, seq_len=32, global_batch_size=8, num_epochs=1)
    >>> with MultiHostDataLoadIterator(pipe) as it:
    ...     batch = next(it)
    ...     state = it.get_state()
    >>> batch["inputs"].shape, type(batch["inputs"]).__name__, len(it)
    ((8, 32), 'ArrayImpl', 77)
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
        features_on_device: bool | None = None,
        placement: str = "host",
        device_memory_budget: int | None = None,
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
        where = "MultiHostDataLoadIterator"
        self.prefetch = int_arg(prefetch, "prefetch", where=where)  # (0 was taken as 1, unsaid)
        self.worker_count = int_arg(worker_count, "worker_count", where=where, minimum=0)
        if features_on_device is not None and not isinstance(features_on_device, (bool, np.bool_)):
            raise TypeError(
                f"{where}: features_on_device={features_on_device!r} is not a bool; pass True, "
                "False or None (the default: on the devices where they are accelerators)"
            )
        resident = resident_feed(loader_or_dataset, self.sharding, placement, device_memory_budget)
        self._feed: Feed
        if resident is not None:
            self._feed = resident
        elif isinstance(loader_or_dataset, TokenPipeline):
            self._feed = PipelineFeed(
                loader_or_dataset, self.sharding, self.worker_count, features_on_device
            )
        else:
            self._feed = GrainFeed(loader_or_dataset, self.sharding)
        self._step = 0
        # The input's own position after the last batch handed out (a Grain iterator's state;
        # None for a TokenPipeline, whose position is the step).
        self._position: Any = None
        self._host_iter: Any = None  # the iterator of this process's batches, once made
        self._threads: list[threading.Thread] = []  # the producer's, once started
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=self.prefetch)
        self._read_queue: queue.Queue[Any] = queue.Queue(maxsize=2)
        self._split_producer = (
            any(d.platform != "cpu" for d in self.sharding.mesh.devices.flat)
            if _SPLIT_PRODUCER is None
            else _SPLIT_PRODUCER
        )
        self._place_by_call = (
            jax.process_count() == 1 and len(self.sharding.device_set) == 1
            if _PLACE_BY_CALL is None
            else _PLACE_BY_CALL and jax.process_count() == 1
        )
        self._placer: Any = None  # the jitted function that places a batch, once made
        self._call_shapes: set[Any] = set()  # the batch shapes placed by the call so far
        self._stop = threading.Event()
        self._exhausted = False

    @property
    def local_rows(self) -> dict[int, tuple[int, int]]:
        """For a TokenPipeline: each phase batch size -> the rows ``[lo, hi)`` this process
        reads (its devices' part of the global batch)."""
        if not isinstance(self._feed, PipelineFeed):
            raise TypeError("local_rows is known only for a TokenPipeline input")
        return dict(self._feed.rows)

    @property
    def placement(self) -> str:
        """Where batches are made: ``"host"``, or on the devices from rows held
        ``"replicated"`` (all on every device) or ``"sharded"`` (over the data axis)."""
        return str(getattr(self._feed, "layout", "host"))

    # ---- sizes ----------------------------------------------------------------------------
    def __len__(self) -> int:
        n = self._feed.length
        if n is None:
            raise self._feed.no_length()
        return n

    # ---- the producer ---------------------------------------------------------------------
    def _to_global(self, local: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten(local)
        # Every leaf is its own device array, a host array shared by two keys (the positions)
        # included: a step that donates the batch cannot donate one buffer twice.
        arrays = [np.ascontiguousarray(leaf) for leaf in leaves]  # JAX copies strided views slower
        self._feed.check_rows(arrays)
        refuse_narrowing(  # 64-bit integers JAX would place wrapped
            arrays,
            where=lambda: f"a batch of {_input_kind(self._feed)}",
            names=lambda: leaf_names(local),
        )
        try:
            return self._placed(treedef, arrays)
        except ValueError as e:  # JAX's IndivisibleError names neither the array nor the fix
            if not _indivisible(e):
                raise
            raise ValueError(self._unsplit(arrays, leaf_names(local), e)) from None

    def _unsplit(self, arrays: list[np.ndarray], names: list[str], error: Exception) -> str:
        """What to say of a batch array that ``self.sharding`` cannot split evenly."""
        spec = self.sharding.spec
        sizes = dict(self.sharding.mesh.shape)
        for name, a in zip(names, arrays, strict=True):
            for axis, (dim, part) in enumerate(zip(a.shape, tuple(spec), strict=False)):
                if axis == 0 and jax.process_count() > 1:  # this process's rows of the batch
                    dim = self._feed.global_rows(dim)
                parts = part if isinstance(part, tuple) else (part,)
                ways = int(np.prod([sizes[p] for p in parts if p is not None]))
                if dim % ways == 0:
                    continue
                layout = getattr(getattr(self._feed, "pipeline", None), "layout", None)
                fix = (
                    f"layout={layout!r} sends each sample as rows that hold its tokens with "
                    "what the features need, not one position of the sequence a column: split "
                    f"batches by rows only (PartitionSpec({next(iter(spec))!r})) and the sequence "
                    "inside your step (jax.lax.with_sharding_constraint on pipe.unpack's "
                    "features), or use layout='maxtext', whose features are (batch, seq_len)"
                    if layout not in (None, "maxtext")
                    else "give it a sharding whose mesh axes divide it, or pad it to a multiple"
                )
                return (
                    f"MultiHostDataLoadIterator: data_sharding {spec} splits axis {axis} of the "
                    f"batch's {name} {ways} ways, but that axis has {dim} entries (shape "
                    f"{a.shape}); {fix}"
                )
        return str(error)

    def _placed(self, treedef: Any, arrays: list[np.ndarray]) -> Any:
        """The host arrays of a batch as global arrays on the devices."""
        if self._place_by_call:
            try:
                if self._call_fits(treedef, arrays):
                    return self._placing()(jax.tree_util.tree_unflatten(treedef, arrays))
            except (TypeError, ValueError) as e:  # a batch the call cannot take (a pytree
                if _indivisible(e):  # node whose metadata is an array): device_put's way;
                    raise  # (but no way splits an array the sharding cannot)
                self._place_by_call = False
        if jax.process_count() > 1:
            placed = [
                jax.make_array_from_process_local_data(
                    self.sharding, a, (self._feed.global_rows(a.shape[0]), *a.shape[1:])
                )
                for a in arrays
            ]
        elif len(arrays) == 1:
            # an array alone: device_put([a]) took 251 us against 128 for device_put(a) on
            # one H200 host (the same on another); for several, one batched call is cheaper
            placed = [jax.device_put(arrays[0], self.sharding)]
        else:
            placed = jax.device_put(arrays, self.sharding)  # one batched transfer
        return self._feed.on_device(jax.tree_util.tree_unflatten(treedef, placed))

    def _call_fits(self, treedef: Any, arrays: list[np.ndarray]) -> bool:
        """Whether the call places this batch: arrays JAX takes as they are (numeric, native
        byte order: a byte-swapped one was served swapped), no JAX setting that treats a
        jitted call otherwise than a transfer (a transfer guard, NaN checks, disabled jit),
        and shapes it has compiled for or one of the first :data:`_CALL_SHAPES`; the rest go
        by device_put (JAX's own errors, for arrays it cannot take), the shapes said once."""
        config: Any = jax.config
        if any(getattr(config, name, None) not in unset for name, unset in _CALL_SETTINGS):
            return False
        if not all(_takes(a.dtype) for a in arrays):
            return False
        shapes = (treedef, tuple((a.shape, a.dtype) for a in arrays))
        if shapes in self._call_shapes:  # (a node whose metadata cannot be compared raises)
            return True
        if len(self._call_shapes) < _CALL_SHAPES:
            self._call_shapes.add(shapes)
            return True
        if len(self._call_shapes) == _CALL_SHAPES:
            self._call_shapes.add(None)  # said
            _log.info(
                "MultiHostDataLoadIterator: batches of more than %d shapes; the others are "
                "placed by jax.device_put (the jitted call that places a batch compiles once "
                "a shape)",
                _CALL_SHAPES,
            )
        return False

    def _placing(self) -> Any:
        """The jitted function that takes a host batch to the devices: the feed's own (which
        derives the features there too), or one that returns the batch as placed (each leaf
        a new device buffer, so that a step may donate it)."""
        if self._placer is None:
            derive = getattr(self._feed, "derive", None)
            # a function of this iterator's own: its compiled shapes go with it (a module
            # function's would stay in JAX's cache for the process, from every iterator)
            self._placer = derive or jax.jit(
                lambda batch: batch, in_shardings=self.sharding, out_shardings=self.sharding
            )
        return self._placer

    def _read_into(self, host_iter: Any, stop: threading.Event) -> Iterator[Any]:
        """``(host batch, position)``, then ``(_DONE, None)`` at the end or ``(error, None)``."""
        while not stop.is_set():
            try:
                local = next(host_iter)
                position = self._feed.position(host_iter)
            except StopIteration:
                yield _DONE, None
                return
            except BaseException as e:  # re-raised in the caller, in order
                yield e, None
                return
            yield local, position

    def _read_ahead(self, host_iter: Any, stop: threading.Event, out: queue.Queue[Any]) -> None:
        """The reading stage of a split producer: host batches into ``out``."""
        for item in self._read_into(host_iter, stop):
            if not _put(out, item, stop):
                return

    def _place_from(
        self, items: Iterable[Any], stop: threading.Event, out: queue.Queue[Any]
    ) -> None:
        """Place each host batch of ``items`` on the devices, into ``out`` (an end or an error
        passes through, and ends the stage)."""
        for item, position in items:
            last = item is _DONE or isinstance(item, BaseException)
            if not last:
                try:
                    item = self._to_global(item)
                except BaseException as e:  # re-raised in the caller, in order
                    item, position, last = e, None, True
            if not _put(out, (item, position), stop) or last:
                return

    def start_prefetch(self) -> None:
        """Start the background producer (done automatically on the first ``next``; batches
        gathered on the devices are dispatched asynchronously in the caller's thread)."""
        if self._threads or self._exhausted:
            return
        if self._host_iter is None:  # (set_state may have made it, to check the state)
            self._open()
        if self._feed.in_caller:
            return
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.prefetch)
        self._threads = []
        if self._split_producer:  # one thread reads the next batch while another places one
            self._read_queue = queue.Queue(maxsize=2)
            self._threads.append(
                threading.Thread(
                    target=self._read_ahead,
                    args=(self._host_iter, self._stop, self._read_queue),
                    name="grain_rox-read",
                    daemon=True,
                )
            )
            placing = _drain(self._read_queue, self._stop)
        else:
            placing = self._read_into(self._host_iter, self._stop)
        self._threads.append(
            threading.Thread(
                target=self._place_from,
                args=(placing, self._stop, self._queue),
                name="grain_rox-prefetch",
                daemon=True,
            )
        )
        for thread in self._threads:
            thread.start()
        _running.add(self)
        if not _exit_hook:
            _exit_hook.append(True)
            atexit.register(_stop_all_at_exit)

    def _open(self) -> None:
        """Make the iterator of this process's batches from the step; before a Grain input's
        first batch, take its position from it, so that a state saved then names its data
        (and a restore checks it) like one saved later."""
        self._host_iter = self._feed.host_iterator(self._step, self._position)
        if self._position is None:
            self._position = self._feed.position(self._host_iter)

    def _halt(self) -> None:
        threads, self._threads = self._threads, []
        if threads:
            self._stop.set()
            for thread in threads:
                while thread.is_alive():
                    for q in (self._queue, self._read_queue):
                        with contextlib.suppress(queue.Empty):
                            q.get_nowait()
                    thread.join(timeout=0.05)
        closer = getattr(self._host_iter, "close", None)
        if callable(closer):
            closer()
        self._host_iter = None

    # ---- the iterator protocol -------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._exhausted:
            raise StopIteration
        if not self._threads:
            self.start_prefetch()
        if self._feed.in_caller:
            return self._next_in_caller()
        item, position = self._queue.get()
        if item is _DONE:
            self._exhausted = True
            self._halt()
            raise StopIteration
        if isinstance(item, BaseException):
            self._halt()
            raise item
        self._step += 1
        self._position = position
        return item

    def _next_in_caller(self) -> Any:
        try:
            batch = next(self._host_iter)
        except StopIteration:
            self._exhausted = True
            self._halt()
            raise
        except BaseException:
            self._halt()
            raise
        self._step += 1
        self._position = self._feed.position(self._host_iter)
        return batch

    # ---- state -----------------------------------------------------------------------------
    @property
    def step(self) -> int:
        """Global batches handed to the caller so far (or since the restored state)."""
        return self._step

    def get_state(self) -> bytes:
        """JSON bytes: the step, and the pipeline identity or Grain's own state."""
        grain_input = not isinstance(self._feed, PipelineFeed)  # (whose position is the step)
        if (
            grain_input
            and self._position is None
            and self._host_iter is None
            and not self._exhausted
        ):
            self._open()  # (not yet read: its position names its data)
        state: dict[str, Any] = {"version": STATE_VERSION, "step": self._step}
        state[self._feed.state_key] = json_plain(self._feed.saved(self._position))
        return json.dumps(state, sort_keys=True).encode("utf-8")

    def set_state(self, state: bytes | str | dict[str, Any]) -> None:
        """Continue after the batch where ``state`` was taken (from any process count).

        A state from other data, another config or another kind of input is refused, naming
        what changed; so is a hand-edited one (a step that is not a non-negative int, or past
        the end of a finite input). A restore is logged at INFO to the ``"grain_rox"`` logger,
        naming the step and the kind of input."""
        decoded = decode_state(state)
        step = decoded["step"]
        position = self._feed.restore(decoded)
        self._halt()
        if position is not None:  # Grain checks its own state now, not at the next batch
            self._host_iter = self._feed.host_iterator(step, position)
        self._step = step
        self._position = position
        self._exhausted = False
        _log.info(
            "MultiHostDataLoadIterator.set_state: resuming at step %d; input: %s",
            step,
            _input_kind(self._feed),
        )

    # ---- Orbax v1: a StatefulCheckpointable, as Grain's own iterators are -------------------
    async def save(self, directory: Any) -> Awaitable[None]:
        """Orbax v1's save (``ocp.v1.save_checkpointables(path, {"data": it})``): the state
        at this batch, written once Orbax has made ``directory``, as
        :class:`~grain_rox.RoxCheckpointSave` writes it (so it restores as that does)."""
        from grain_rox._devices._checkpoint import write_state  # Orbax, loaded on first use

        state = self.get_state()  # now: batches taken while Orbax writes do not change it

        async def write() -> None:
            path = epath.Path(await directory.await_creation())
            await asyncio.to_thread(write_state, path, state)

        return write()

    async def load(self, directory: Any) -> Awaitable[None]:
        """Orbax v1's load (``ocp.v1.load_checkpointables``): ``set_state`` from what
        :meth:`save` (or :class:`~grain_rox.RoxCheckpointSave`) wrote in ``directory``."""
        from grain_rox._devices._checkpoint import read_state

        return asyncio.to_thread(read_state, epath.Path(directory), self)

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
