"""Threads released together, for the tests of reads from several threads at once."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_released_together(work: Callable[[int], None], threads: int) -> None:
    """``work(0)``, ..., ``work(threads - 1)``, each in its own thread, all released at once by
    a barrier (so their first reads race); the first exception a thread raised is raised here.

    >>> seen = []
    >>> run_released_together(seen.append, 3)
    >>> sorted(seen)
    [0, 1, 2]
    """
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def run(t: int) -> None:
        try:
            start.wait()
            work(t)
        except BaseException as e:
            errors.append(e)

    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
