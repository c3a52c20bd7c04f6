"""Conformance checks that need other processes (see :mod:`grain_rox.testing`): a fresh
interpreter that runs the checks' second half, stable reprs, Orbax and DataLoader restores,
Grain worker processes, and several ``jax.distributed`` processes."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from grain_rox._testing._checks_records import (
    ENDLESS,
    _close,
    _iter_dataset,
    _name,
    _take,
    as_numpy,
    assert_tree_equal,
)


# ---- another interpreter -------------------------------------------------------------------
class FreshProcess:
    """A new Python interpreter that runs functions for the checks: ``call(fn, *args)``
    returns ``fn(*args)`` computed there (sent with cloudpickle, the result with pickle).

    It starts with this process's ``sys.path`` and environment and has built nothing of
    yours, so what it computes shows what a restarted job would see. Starting one costs an
    interpreter (and, once used, Grain's and JAX's imports): share one between checks.

    >>> with FreshProcess() as other:
    ...     other.call(os.getpid) != os.getpid()
    True
    """

    def __init__(self, *, timeout: float = 300.0) -> None:
        self.timeout = timeout
        ours, theirs = socket.socketpair()
        self._log = tempfile.TemporaryFile()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        code = "import sys; from grain_rox._testing._checks_processes import _serve; _serve(int(sys.argv[1]))"
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        theirs.close()
        from multiprocessing.connection import Connection

        self._conn = Connection(ours.detach())

    def _output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, computed in the other interpreter."""
        import cloudpickle

        name = getattr(fn, "__name__", repr(fn))
        self._conn.send_bytes(cloudpickle.dumps((fn, args, kwargs)))
        if not self._conn.poll(self.timeout):
            self.close()
            raise AssertionError(
                f"{name} did not finish within {self.timeout:.0f} s in the fresh process; "
                f"its output:\n{self._output()}"
            )
        try:
            ok, value = pickle.loads(self._conn.recv_bytes())
        except EOFError:
            self.close()
            raise AssertionError(
                f"the fresh process died running {name} (exit {self._proc.returncode}); its "
                f"output:\n{self._output()}"
            ) from None
        if not ok:
            raise AssertionError(f"{name} failed in the fresh process:\n{value}")
        return value

    def close(self) -> None:
        """End the interpreter (idempotent)."""
        with contextlib.suppress(OSError):
            self._conn.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> FreshProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve(fd: int) -> None:
    """The other interpreter's loop: run each received call, send back its result."""
    from multiprocessing.connection import Connection

    conn = Connection(fd)
    while True:
        try:
            fn, args, kwargs = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        try:
            reply = (True, fn(*args, **kwargs))
        except BaseException:
            reply = (False, traceback.format_exc())
        conn.send_bytes(pickle.dumps(reply))


@contextlib.contextmanager
def _processes(fresh: FreshProcess | Sequence[FreshProcess] | None, count: int) -> Iterator[Any]:
    if fresh is not None:
        yield [fresh] if isinstance(fresh, FreshProcess) else list(fresh)
        return
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(FreshProcess()) for _ in range(count)]


# ---- stable repr ---------------------------------------------------------------------------
def _build(make: Callable[..., Any], directory: str | None) -> Any:
    return make() if directory is None else make(directory)


def _reprs(make_source: Callable[..., Any], directories: Sequence[str | None]) -> list[str]:
    return [repr(_build(make_source, d)) for d in directories]


def check_stable_repr(
    make_source: Callable[..., Any],
    *,
    data_dir: str | None = None,
    processes: int = 2,
    fresh: FreshProcess | Sequence[FreshProcess] | None = None,
) -> None:
    """``repr(make_source(...))`` (Grain's ``DataLoader`` compares it on restore) names no
    memory address, and is the same here, in ``processes`` fresh interpreters (concurrently),
    and, with ``data_dir``, for a byte-identical copy of that directory elsewhere (new
    modification times): ``make_source(data_dir)`` and ``make_source(copy)``.

    >>> import functools
    >>> check_stable_repr(functools.partial(range, 3), processes=1)
    >>> check_stable_repr(object)
    Traceback (most recent call last):
    ...
    AssertionError: repr(object) names a memory address: '<object object at 0x...>'; define a __repr__ from the data's content and the config
    """
    here = repr(_build(make_source, data_dir))
    if " at 0x" in here or "object at" in here:
        shown = here.split(" at 0x")[0] + " at 0x...>" if " at 0x" in here else here
        raise AssertionError(
            f"repr({_name(_build(make_source, data_dir))}) names a memory address: {shown!r}; "
            "define a __repr__ from the data's content and the config"
        )
    with contextlib.ExitStack() as stack:
        directories: list[str | None] = [data_dir]
        if data_dir is not None:
            copy = os.path.join(stack.enter_context(tempfile.TemporaryDirectory()), "copy")
            shutil.copytree(data_dir, copy, copy_function=shutil.copyfile)
            directories.append(copy)
            there = repr(make_source(copy))
            if there != here:
                raise AssertionError(
                    f"repr differs for a byte-identical copy of {data_dir}:\n  {here}\n  {there}"
                )
        procs = stack.enter_context(_processes(fresh, processes))
        with concurrent.futures.ThreadPoolExecutor(len(procs)) as pool:
            results = list(pool.map(lambda p: p.call(_reprs, make_source, directories), procs))
        for p, reprs in enumerate(results):
            for d, r in zip(directories, reprs, strict=True):
                if r != here:
                    raise AssertionError(
                        f"repr differs in fresh process {p} (data {d}):\n  here:  {here}\n  "
                        f"there: {r}"
                    )


def _orbax_args(handler: str) -> tuple[Any, Any]:
    if handler == "grain":
        import grain

        return grain.checkpoint.CheckpointSave, grain.checkpoint.CheckpointRestore
    if handler == "grain_rox":
        from grain_rox._devices._checkpoint import RoxCheckpointRestore, RoxCheckpointSave

        return RoxCheckpointSave, RoxCheckpointRestore
    raise ValueError(f"handler={handler!r}; use 'grain' or 'grain_rox'")


def _restore_and_read(
    make_iterable: Callable[[], Any], directory: str, step: int, read: int, handler: str
) -> list[Any]:
    import orbax.checkpoint as ocp

    _, restore = _orbax_args(handler)
    it = iter(make_iterable())
    manager = ocp.CheckpointManager(directory)
    try:
        manager.restore(step, args=ocp.args.Composite(data=restore(it)))
    finally:
        manager.close()
    return _take(it, read)


def check_orbax_roundtrip(
    make_iterable: Callable[[], Any],
    *,
    steps: int = 2,
    read: int = 3,
    handler: str = "grain",
    fresh: FreshProcess | None = None,
) -> None:
    """Orbax saves an iterator of ``make_iterable()`` after ``steps`` elements here; a fresh
    interpreter builds ``make_iterable()`` again, restores it from the checkpoint and reads
    ``read`` elements: they equal what this iterator read next. ``handler``: ``"grain"``
    (``grain.checkpoint.CheckpointSave/Restore``) or ``"grain_rox"``
    (:class:`~grain_rox.RoxCheckpointSave`; iterators with JSON ``get_state``).

    >>> import grain
    >>> check_orbax_roundtrip(lambda: grain.MapDataset.range(9).to_iter_dataset())  # doctest: +SKIP
    """
    import orbax.checkpoint as ocp

    save, _ = _orbax_args(handler)
    with tempfile.TemporaryDirectory() as directory:
        it = iter(make_iterable())
        try:
            head = [next(it) for _ in range(steps)]
            if len(head) != steps:
                raise AssertionError(f"{make_iterable} gave fewer than {steps} elements")
            manager = ocp.CheckpointManager(directory)
            manager.save(steps, args=ocp.args.Composite(data=save(it)))
            manager.wait_until_finished()
            manager.close()
            expected = [as_numpy(next(it)) for _ in range(read)]
        finally:
            _close(it)
        with _processes(fresh, 1) as (proc,):
            got = proc.call(_restore_and_read, make_iterable, directory, steps, read, handler)
    for i, (a, e) in enumerate(zip(got, expected, strict=True)):
        assert_tree_equal(a, e, what=f"element {steps + i} after the Orbax restore")


def check_mp_prefetch_equal(ds: Any, *, workers: int = 2, max_elements: int | None = None) -> None:
    """``ds.mp_prefetch(...)`` with ``workers`` Grain worker processes yields what ``ds``
    yields in this process (the first ``max_elements``; required for an endless ``ds``).

    >>> import grain
    >>> check_mp_prefetch_equal(grain.MapDataset.range(6).to_iter_dataset())  # doctest: +SKIP
    """
    import grain

    from grain_rox._sources._grain_setup import make_grain_workers_usable

    make_grain_workers_usable()  # Grain 0.2.18's absl trap, for datasets built without us
    ds = _iter_dataset(ds)
    expected = _take(iter(ds), max_elements)
    options = grain.MultiprocessingOptions(num_workers=workers)
    got = _take(iter(ds.mp_prefetch(options)), max_elements)
    if len(got) != len(expected):
        raise AssertionError(
            f"with {workers} Grain workers: {len(got)} elements, in-process {len(expected)}"
        )
    for i, (a, e) in enumerate(zip(got, expected, strict=True)):
        assert_tree_equal(a, e, what=f"element {i} with {workers} Grain workers")


def data_loader(
    make_source: Callable[[], Any],
    *,
    worker_count: int = 2,
    batch_size: int | None = 2,
    seed: int = 0,
) -> Any:
    """The ``grain.DataLoader`` :func:`check_dataloader_restore_in_fresh_process` uses:
    ``make_source()`` in a seeded shuffled order (in order if endless), one epoch, batched
    by ``batch_size`` (``None``: records as they are).

    >>> next(iter(data_loader(lambda: list(range(8)), worker_count=0))).tolist()
    [0, 4]
    """
    import grain

    from grain_rox._sources._grain_setup import make_grain_workers_usable

    make_grain_workers_usable()  # Grain 0.2.18's absl trap, for sources built without us
    source = make_source()
    finite = len(source) < ENDLESS
    sampler = grain.samplers.IndexSampler(
        num_records=len(source),
        shard_options=grain.sharding.NoSharding(),
        shuffle=finite,
        seed=seed,
        num_epochs=1,
    )
    ops = [grain.transforms.Batch(batch_size)] if batch_size else []
    return grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=ops,
        worker_count=worker_count,
        read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=4),
    )


def check_dataloader_restore_in_fresh_process(
    make_source: Callable[[], Any],
    *,
    worker_count: int = 2,
    batch_size: int | None = 2,
    steps: int = 2,
    read: int = 2,
    fresh: FreshProcess | None = None,
) -> None:
    """``grain.DataLoader(worker_count=2)`` over ``make_source()`` (see :func:`data_loader`),
    checkpointed with Grain's Orbax handler after ``steps`` batches, restores in a fresh
    interpreter (where Grain checks ``repr(source)``) to the same next ``read`` batches.

    >>> check_dataloader_restore_in_fresh_process(lambda: list(range(8)))  # doctest: +SKIP
    """
    make = functools.partial(
        data_loader, make_source, worker_count=worker_count, batch_size=batch_size
    )
    check_orbax_roundtrip(make, steps=steps, read=read, handler="grain", fresh=fresh)


# ---- several JAX processes -------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _distributed_main(port: str, count: str, index: str, job: str, out: str) -> None:
    """One process of :func:`check_processes_equal` (its command-line arguments): JAX's
    distributed runtime first, then the job."""
    import jax

    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=int(count),
        process_id=int(index),
        initialization_timeout=60,
    )
    from jax.experimental import multihost_utils

    with open(job, "rb") as f:
        make_iterable, read = pickle.load(f)
    it = iter(make_iterable())
    try:
        got = [
            as_numpy(multihost_utils.process_allgather(next(it), tiled=True)) for _ in range(read)
        ]
    finally:
        _close(it)
    with open(out, "wb") as f:
        pickle.dump(got, f)
    multihost_utils.sync_global_devices("grain_rox.testing done")


def check_processes_equal(
    make_iterable: Callable[[], Any], *, processes: int = 2, read: int = 3, timeout: float = 300
) -> None:
    """``processes`` real JAX processes (``jax.distributed`` over 127.0.0.1, this process's
    devices split among them) each iterate ``make_iterable()``; the global ``jax.Array``
    elements they build (gathered) equal the first ``read`` elements built here in one
    process. For iterators of global arrays, e.g. :class:`~grain_rox.MultiHostDataLoadIterator`
    (``make_iterable`` may read ``jax.process_index()`` to pick its shard).

    >>> from grain_rox import MultiHostDataLoadIterator, TokenPipeline
    >>> pipe = TokenPipeline("corpus.rox", seq_len=32, global_batch_size=8)  # doctest: +SKIP
    >>> check_processes_equal(lambda: MultiHostDataLoadIterator(pipe))  # doctest: +SKIP
    """
    import cloudpickle
    import jax

    expected = _take(iter(make_iterable()), read)
    per_process = max(1, jax.device_count() // processes)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={per_process}",
        "JAX_PLATFORMS": "cpu",
    }
    env.pop("JAX_NUM_PROCESSES", None)
    port = _free_port()
    with tempfile.TemporaryDirectory() as work:
        job = os.path.join(work, "job.pkl")
        with open(job, "wb") as f:
            cloudpickle.dump((make_iterable, read), f)
        code = "import sys; from grain_rox._testing._checks_processes import _distributed_main; _distributed_main(*sys.argv[1:])"
        logs, procs = [], []
        try:
            for i in range(processes):
                logs.append(open(os.path.join(work, f"log{i}"), "w+b"))
                args = [str(port), str(processes), str(i), job, os.path.join(work, f"out{i}")]
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", code, *args],
                        env=env,
                        stdout=logs[-1],
                        stderr=subprocess.STDOUT,
                    )
                )
            _wait_all(procs, logs, timeout)
            results = []
            for i in range(processes):
                with open(os.path.join(work, f"out{i}"), "rb") as f:
                    results.append(pickle.load(f))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
            for log in logs:
                log.close()
    for i, got in enumerate(results):
        for k, (a, e) in enumerate(zip(got, expected, strict=True)):
            assert_tree_equal(a, e, what=f"element {k} in process {i} of {processes}")


def _wait_all(procs: list[subprocess.Popen], logs: list[Any], timeout: float) -> None:
    """Wait for every process; on a failure or the timeout, an error with their output."""
    import time

    start, failed_at = time.monotonic(), None
    while True:
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return
        now = time.monotonic()
        if any(c not in (None, 0) for c in codes):
            failed_at = failed_at or now
        if (failed_at and (all(c is not None for c in codes) or now - failed_at > 5)) or (
            now - start > timeout
        ):
            for p in procs:
                if p.poll() is None:
                    p.kill()
            outputs = []
            for i, log in enumerate(logs):
                log.seek(0)
                text = log.read().decode(errors="replace")[-3000:]
                outputs.append(f"--- process {i} (exit {procs[i].poll()}) ---\n{text}")
            raise AssertionError(
                f"the {len(procs)}-process run failed (exit codes {codes}):\n" + "\n".join(outputs)
            )
        time.sleep(0.05)
