"""Printing after a write has committed: a stdout that fails loses lines, never the write's status.

``grain-rox convert ... | head -1`` closes the pipe while ``convert`` still prints its summary,
and a full disk under ``> log`` refuses it. The shards are published by then; reporting exit
status 2 would tell a retry wrapper the conversion failed, and ``--if-exists append`` rerun
appends the same documents twice. :class:`Summary` prints each line at once, keeps the first
failure instead of raising, and says on stderr what was written and what was not printed.

>>> summary = Summary("convert")
>>> summary.print("wrote 2 documents")
wrote 2 documents
>>> summary.finish("data/train.rox")
0
"""

from __future__ import annotations

import contextlib
import os
import sys


def silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of a closed pipe does not
    print a traceback ("Exception ignored ... BrokenPipeError") after the command's own word."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no descriptor (StringIO)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


class Summary:
    """The lines a command prints once its output is committed.

    Args:
      command: the subcommand's name, for the stderr line (``grain-rox convert: ...``).
    """

    def __init__(self, command: str) -> None:
        self.command = command
        self.lost: OSError | None = None  # the first failure to print; later lines are dropped

    def print(self, line: str) -> None:
        """Print ``line`` now (flushed: a closed pipe shows here, not at exit); after a failure,
        drop it."""
        if self.lost is not None:
            return
        try:
            print(line, flush=True)
        except OSError as e:  # BrokenPipeError, ENOSPC, EIO
            self.lost = e
            silence_stdout()

    def finish(self, written: str) -> int:
        """The exit status, 0: what was written is whole; a summary that could not be printed is
        said on stderr, naming ``written``."""
        if self.lost is not None:
            with contextlib.suppress(OSError):
                print(
                    f"grain-rox {self.command}: wrote {written} (committed and whole), but its "
                    f"summary on stdout could not be printed: {self.lost}",
                    file=sys.stderr,
                )
        return 0
