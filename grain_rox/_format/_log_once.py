"""Say a message once a process: sources, pipelines and corpora are made again for each
iterator, restore and worker, and the same words each time would bury the first.

>>> log_once(logging.INFO, "said once")
>>> "said once" in _said
True
"""

from __future__ import annotations

import logging

_log = logging.getLogger("grain_rox")
_said: set[str] = set()  # what this process has said


def log_once(level: int, message: str) -> None:
    """Log ``message`` at ``level`` to the ``"grain_rox"`` logger, the first time only."""
    if message not in _said:
        _said.add(message)
        _log.log(level, message)
