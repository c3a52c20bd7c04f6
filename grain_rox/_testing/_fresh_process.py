"""Another Python interpreter that runs the checks' second half (see :mod:`grain_rox.testing`):
what a restarted job would compute, with nothing of this process built there."""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any


class FreshProcess:
    """A new Python interpreter that runs functions for the checks: ``call(fn, *args)``
    returns ``fn(*args)`` computed there (sent with cloudpickle, the result with pickle).

    It starts with this process's ``sys.path`` and environment and has built nothing of
    yours, so what it computes shows what a restarted job would see. Starting one costs an
    interpreter (and, once used, Grain's and JAX's imports): share one between checks.

    Args:
      timeout: seconds one call may take before the interpreter is ended.

    >>> with FreshProcess() as other:
    ...     other.call(os.getpid) != os.getpid()
    True
    """

    def __init__(self, *, timeout: float = 300.0) -> None:
        self.timeout = timeout
        ours, theirs = socket.socketpair()
        self._log = tempfile.TemporaryFile()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        code = "import sys; from grain_rox._testing._fresh_process import _serve; _serve(int(sys.argv[1]))"
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
def fresh_processes(
    fresh: FreshProcess | Sequence[FreshProcess] | None, count: int
) -> Iterator[Any]:
    if fresh is not None:
        yield [fresh] if isinstance(fresh, FreshProcess) else list(fresh)
        return
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(FreshProcess()) for _ in range(count)]
