"""Pickling a source without what belongs to one process: locks, open files, memory maps,
caches built from them.

Grain copies a source into every worker process by pickling it, so a source must pickle as
its paths and config (small, no open handle) and reopen its files lazily where it is used.
:class:`ProcessLocal` is that pattern once: a class names its per-process attributes and how
to make each afresh; pickling leaves them out, unpickling makes them new, and the class's
own code (re)opens whatever they cache on first use.

>>> import copy, threading
>>> class Source(ProcessLocal):
...     PROCESS_LOCAL = process_local(_lock=threading.Lock, _maps=dict)
...     def __init__(self, path):
...         self.path = path
...         self.start_process_local()
>>> source = Source("a.npy")
>>> source._maps["x"] = "an open map"
>>> sorted(source.__getstate__())
['path']
>>> clone = copy.copy(source)  # as pickle does: __getstate__, then __setstate__
>>> clone.path, clone._maps, clone._lock is not source._lock
('a.npy', {}, True)
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from typing import Any, ClassVar


def process_local(**fresh: Callable[[], Any]) -> Mapping[str, Callable[[], Any]]:
    """A class's ``PROCESS_LOCAL`` table: attribute name -> what makes it afresh (read-only)."""
    return types.MappingProxyType(fresh)


class ProcessLocal:
    """Leaves the attributes named in ``PROCESS_LOCAL`` out of the pickle and makes each anew
    (``PROCESS_LOCAL[name]()``) when unpickled, in every process; see the module doc."""

    PROCESS_LOCAL: ClassVar[Mapping[str, Callable[[], Any]]] = process_local()

    def start_process_local(self) -> None:
        """Set every per-process attribute to a fresh value (in ``__init__`` and on unpickling)."""
        for name, fresh in self.PROCESS_LOCAL.items():
            setattr(self, name, fresh())

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self.PROCESS_LOCAL}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.start_process_local()
