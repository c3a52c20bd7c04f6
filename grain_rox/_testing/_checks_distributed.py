"""The check that several real ``jax.distributed`` processes build the same global arrays as
one process (see :mod:`grain_rox.testing`)."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from grain_rox._testing._iterating import close, take
from grain_rox._testing._trees import as_numpy, assert_tree_equal


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
        close(it)
    with open(out, "wb") as f:
        pickle.dump(got, f)
    held = [d.process_index for d in jax.devices()]
    if len({held.count(p) for p in set(held)}) == 1:  # (it needs as many devices everywhere;
        multihost_utils.sync_global_devices("grain_rox.testing done")  # else: exit's barrier)


def check_processes_equal(
    make_iterable: Callable[[], Any],
    *,
    processes: int = 2,
    read: int = 3,
    timeout: float = 300,
    devices: Sequence[int] | None = None,
) -> None:
    """``processes`` real JAX processes (``jax.distributed`` over 127.0.0.1, this process's
    devices split among them) each iterate ``make_iterable()``; the global ``jax.Array``
    elements they build (gathered) equal the first ``read`` elements built here in one
    process. For iterators of global arrays, e.g. :class:`~grain_rox.MultiHostDataLoadIterator`
    (``make_iterable`` may read ``jax.process_index()`` to pick its shard).

    Args:
      make_iterable: builds the iterable; sent to each process with cloudpickle.
      processes: how many JAX processes.
      read: elements compared.
      timeout: seconds the processes may take in all before they are killed.
      devices: CPU devices of each process (its length is then the process count), e.g.
        ``(3, 1)`` for processes holding unequal shares; None: this process's devices split
        evenly.

    >>> from grain_rox import MultiHostDataLoadIterator, TokenPipeline
    >>> pipe = TokenPipeline("corpus.rox", seq_len=32, global_batch_size=8)  # doctest: +SKIP
    >>> check_processes_equal(lambda: MultiHostDataLoadIterator(pipe))  # doctest: +SKIP
    """
    import cloudpickle
    import jax

    expected = take(iter(make_iterable()), read)
    if devices is None:
        devices = [max(1, jax.device_count() // processes)] * processes
    elif processes not in (2, len(devices)):
        raise ValueError(f"processes={processes} but devices={list(devices)} names {len(devices)}")
    processes = len(devices)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "JAX_PLATFORMS": "cpu",
    }
    env.pop("JAX_NUM_PROCESSES", None)
    port = _free_port()
    with tempfile.TemporaryDirectory() as work:
        job = os.path.join(work, "job.pkl")
        with open(job, "wb") as f:
            cloudpickle.dump((make_iterable, read), f)
        code = "import sys; from grain_rox._testing._checks_distributed import _distributed_main; _distributed_main(*sys.argv[1:])"
        logs, procs = [], []
        try:
            for i in range(processes):
                logs.append(open(os.path.join(work, f"log{i}"), "w+b"))
                args = [str(port), str(processes), str(i), job, os.path.join(work, f"out{i}")]
                flags = f"--xla_force_host_platform_device_count={devices[i]}"
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", code, *args],
                        env={**env, "XLA_FLAGS": flags},
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
