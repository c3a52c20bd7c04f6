"""The data files a source was made on, and the check that refuses one whose content changed.

A source opens its files lazily, by path, in every worker process, and reads them for as
long as it lives; a file rewritten meanwhile would serve other rows than the ones its
fingerprint (and any state saved from it) promised. :class:`WatchedFiles` records each
file's stat and content digest when the source is made, checks a file again when a reader
(re)opens it and on a cheap ``stat`` later, and raises an error naming the file when its
content changed (a copy or a ``touch`` with the same content passes).

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "rows.bin")
>>> with open(path, "wb") as f:
...     _ = f.write(b"abc")
>>> files = WatchedFiles({0: path}, what="DemoSource")
>>> with files.reopen(0) as f:
...     f.read()
b'abc'
>>> with open(path, "wb") as f:
...     _ = f.write(b"abd")
>>> files.recheck(0)
Traceback (most recent call last):
...
ValueError: ... changed after this DemoSource was made (3 -> 3 bytes, new content): ...
"""

from __future__ import annotations

import os
import time
from collections.abc import Hashable, Mapping
from typing import IO, Generic, TypeVar

from grain_rox._format._digest import (
    check_unchanged,
    content_digest,
    file_changed,
    racy,
    reopen,
    stat_key,
)

Key = TypeVar("Key", bound=Hashable)
RECENT_RECHECK_S = 0.5  # a recent file (see WatchedFiles.recheck) is hashed at most this often


class WatchedFiles(Generic[Key]):
    """Files ``paths`` (a key of the source's choosing -> path) of one ``what`` source, each
    with its stat and content digest as they were when the source was made.

    The digest covers each file whole up to 256 MiB in all, 64 MiB of samples beyond (the
    budget is shared by the source's files: see ``grain_rox._format._digest``). Pickled with
    the source (plain data: paths, stats, digests).
    """

    def __init__(self, paths: Mapping[Key, str], *, what: str) -> None:
        self.paths = dict(paths)
        self.what = what
        self.opened: dict[Key, tuple[int, int, int, int, int]] = {}  # each file's last checked stat
        self.digests: dict[Key, str] = {}  # and its content digest when the source was made
        # files whose stat cannot vouch for them yet (written in the last 2 s): when each was
        # last hashed (monotonic), as hashing one on every check would read it 20 times a second
        self.recent: dict[Key, float] = {}
        for key, path in self.paths.items():
            with open(path, "rb") as f:
                self.opened[key] = stat_key(os.fstat(f.fileno()))
                self.digests[key] = content_digest(f, path, share=len(self.paths))
            self._note_recent(key)

    def check(self, key: Key, f: IO[bytes], *, rehash: bool = False) -> None:
        """Refuse the open file ``f`` (file ``key``) if its content is not the one the source
        was made on (hashed when its stat moved, or ``rehash``); remember its new stat when
        only that moved (a copy, a ``touch``)."""
        self.opened[key] = check_unchanged(
            f,
            self.paths[key],
            self.opened[key],
            self.digests[key],
            what=f"this {self.what}",
            share=len(self.paths),
            rehash=rehash,
        )
        self._note_recent(key)

    def _note_recent(self, key: Key) -> None:
        """Note file ``key`` as recent (hashed just now) while its stat cannot vouch for it."""
        if racy(self.opened[key]):
            self.recent[key] = time.monotonic()
        else:
            self.recent.pop(key, None)

    def reopen(self, key: Key) -> IO[bytes]:
        """File ``key`` opened again and checked, at its start (the caller closes it); a file
        that cannot be opened is a ``FileNotFoundError`` naming it and the fix."""
        f = reopen(self.paths[key], self.what)
        try:
            self.check(key, f)
            f.seek(0)  # a check may have read the file
        except BaseException:
            f.close()
            raise
        return f

    def recheck(self, key: Key) -> None:
        """Check file ``key`` again after one ``stat``, reading it only if its stat moved: an
        open reader or map sees a file rewritten in place. A file removed or renamed away is
        left alone: what the source opened keeps the bytes it held."""
        path = self.paths[key]
        try:
            now = stat_key(os.stat(path))
        except OSError:
            return
        hashed = self.recent.get(key)
        rehash = False
        if now == self.opened[key] and hashed is not None:
            # a recent file: its stat cannot vouch for it, so it is hashed, but at most every
            # RECENT_RECHECK_S while recent, and once more after (a rewrite within the file
            # system's timestamp tick keeps the stat)
            changed = rehash = not racy(now) or time.monotonic() - hashed >= RECENT_RECHECK_S
        else:
            changed = file_changed(now, self.opened[key])
        if changed:
            try:
                f = open(path, "rb")
            except OSError:
                return
            with f:
                self.check(key, f, rehash=rehash)
