"""The command line's log: ``--log-level {warning,info,debug}`` sends the ``"grain_rox"``
logger's records to stderr while a command runs.

The library itself only emits records (skipped inputs and damage at WARNING, milestones at
INFO, per-file and per-shard detail at DEBUG) and configures nothing. The command line sets the
``"grain_rox"`` logger's level and, as :func:`logging.basicConfig` does, adds a stderr handler
to the root logger only when logging is not configured yet (no root handler, as when run from a
shell; an application or test runner that calls :func:`~grain_rox.cli.main` keeps its own
handlers), for the length of the command. On the root logger that handler is the one the progress
bars move above themselves while drawn (``tqdm``'s ``logging_redirect_tqdm``), so log lines
never cut through a bar. At ``warning`` (the default) a line is the bare message, as Python
prints an unconfigured warning; ``info`` and ``debug`` lines carry a timestamp, the level and
the logger, for a log collector. Messages are spelled with the command's flags
(:func:`~grain_rox._cli._wording.cli_wording`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

from grain_rox._cli._wording import cli_wording

LOG_LEVELS = {"warning": logging.WARNING, "info": logging.INFO, "debug": logging.DEBUG}
DETAILED = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _FlagWording(logging.Formatter):
    """A formatter that spells Python keywords as ``command``'s flags."""

    def __init__(self, fmt: str, command: str) -> None:
        super().__init__(fmt)
        self.command = command

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = cli_wording(record.message, self.command)
        return super().formatMessage(record)


def cli_handler(level: str, command: str) -> logging.Handler:
    """The stderr handler of ``--log-level level`` for ``command``.

    >>> record = logging.makeLogRecord({"msg": "pass if_exists='append' to add", "levelno": 30})
    >>> cli_handler("warning", "convert").format(record)
    'pass --if-exists append to add'
    """
    if level not in LOG_LEVELS:
        raise ValueError(f"log level {level!r} is not one of {sorted(LOG_LEVELS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_FlagWording("%(message)s" if level == "warning" else DETAILED, command))
    return handler


@contextlib.contextmanager
def cli_logging(level: str, command: str) -> Iterator[logging.Handler | None]:
    """Log ``"grain_rox"`` records at ``level`` and above while the block runs: to stderr when
    logging is not configured (yields that handler), else to the handlers already there
    (yields None). The logger's level and the root logger's handlers are as they were after.
    """
    handler = cli_handler(level, command)
    logger, root = logging.getLogger("grain_rox"), logging.getLogger()
    added = None if root.handlers else handler
    before = logger.level
    logger.setLevel(LOG_LEVELS[level])
    if added is not None:
        root.addHandler(added)
    try:
        yield added
    finally:
        if added is not None:
            root.removeHandler(added)
        logger.setLevel(before)
