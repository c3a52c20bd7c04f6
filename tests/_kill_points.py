"""Kill a writer just before its N-th file operation: the fault injection of the write tests.

The child scripts of ``test_write_transactions.py`` and ``test_array_record.py`` import this
(their ``PYTHONPATH`` holds ``tests/``), call :func:`kill_before`, then write.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

# The calls that publish, replace or make durable a file: a kill point before each.
FILE_OPERATIONS = ("replace", "rename", "unlink", "remove", "fsync")
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def kill_before(n: int) -> None:
    """From now on, count this process's calls to :data:`FILE_OPERATIONS` and send it SIGKILL
    just before the ``n``-th."""
    count = [0]

    def hook(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            if count[0] == n:
                os.kill(os.getpid(), signal.SIGKILL)
            return fn(*args, **kwargs)

        return wrapper

    for name in FILE_OPERATIONS:
        setattr(os, name, hook(getattr(os, name)))


def child_env() -> dict[str, str]:
    """The environment of a child script that imports this module."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": TESTS_DIR + (os.pathsep + path if path else "")}
