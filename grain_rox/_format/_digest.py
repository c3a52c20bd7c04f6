"""The short content digest that data sources put in their reprs (Grain compares reprs when it
restores a checkpoint, so a repr must change when, and only when, the data or config does),
and the content digest of a data file with the check that it did not change after it was
opened (sources reopen files lazily, by path, in every worker process)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from typing import IO, Any


def facts_digest(facts: Any) -> str:
    """16 hex digits of the SHA-1 of ``facts`` as JSON (lists, dicts, strings, numbers).

    >>> facts_digest(["a.rox", 4096, {"seed": 0}])
    'ee0c275135cc25d3'
    """
    return hashlib.sha1(json.dumps(facts).encode()).hexdigest()[:16]


FULL_HASH_BYTES = 256 << 20  # a source's files up to this size are hashed whole (~0.2 s)
SAMPLE_BYTES, BLOCK = 64 << 20, 16 << 10  # larger ones: 64 MiB in evenly spaced blocks
_digests: dict[tuple[str, int, int, int, int, int, int], str] = {}
_digests_lock = threading.Lock()
RACY_NS = 2_000_000_000  # a file modified this recently may change again within its mtime


def racy(stat_key: tuple[int, int, int, int, int]) -> bool:
    """Whether a file's mtime is too recent to vouch for its content: a rewrite within the
    filesystem's timestamp granularity keeps size, inode and mtime (git's "racy" case)."""
    return time.time_ns() - stat_key[3] < RACY_NS


def stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What identifies a file's version cheaply: (device, inode, size, mtime_ns, ctime_ns).
    The ctime, as in git's index: an edit in place that puts the mtime back (``os.utime``,
    ``rsync -t --inplace``) keeps size, inode and mtime, but the system sets the ctime."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def content_digest(f: IO[bytes], path: str, *, share: int = 1) -> str:
    """SHA-1 of the open file ``f``'s content: all of it up to ``FULL_HASH_BYTES / share``;
    beyond, its size and ``SAMPLE_BYTES / share`` (at least 2 blocks) read in evenly spaced
    blocks, first and last included (``share``: how many files of one source split the
    budget). Cached per (path, device, inode, size, mtime_ns, ctime_ns, share), so reopening an
    unchanged file costs one ``stat`` (files modified in the last 2 s are hashed each time).

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "a.bin")
    >>> with open(path, "wb") as f:
    ...     _ = f.write(b"abc")
    >>> with open(path, "rb") as f:
    ...     content_digest(f, path) == hashlib.sha1(b"abc").hexdigest()
    True
    """
    key = (os.path.abspath(path), *stat_key(os.fstat(f.fileno())), share)
    with _digests_lock:
        cached = _digests.get(key)
    if cached is not None:
        return cached
    size = key[3]
    h = hashlib.sha1()
    f.seek(0)
    if size <= max(FULL_HASH_BYTES // share, 4 * BLOCK):
        while chunk := f.read(8 << 20):
            h.update(chunk)
    else:
        blocks = max(2, SAMPLE_BYTES // share // BLOCK)
        h.update(f"sampled {size} {blocks}".encode())
        step = (size - BLOCK) / (blocks - 1)
        for i in range(blocks):
            f.seek(int(i * step))
            h.update(f.read(BLOCK))
    digest = h.hexdigest()
    if not racy(key[1:6]):
        with _digests_lock:
            _digests[key] = digest
    return digest


def file_changed(
    now: tuple[int, int, int, int, int], opened: tuple[int, int, int, int, int]
) -> bool:
    """Whether a file's stat ``now`` fails to vouch that it still holds what it held when its
    stat was ``opened`` (then its content digest decides)."""
    return now != opened or racy(opened)


def check_unchanged(
    f: IO[bytes],
    path: str,
    opened: tuple[int, int, int, int, int],
    digest: str,
    *,
    what: str,
    share: int = 1,
    rehash: bool = False,
) -> tuple[int, int, int, int, int]:
    """The stat of the open file ``f`` if it still holds the content ``digest`` it held when
    ``what`` opened it (stat ``opened``); a ValueError naming the file otherwise. A file with
    the same stat costs nothing (unless ``rehash``); one with another stat (a copy, a
    ``touch``) is re-hashed.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "a.bin")
    >>> with open(path, "wb") as f:
    ...     _ = f.write(b"abc")
    >>> with open(path, "rb") as f:
    ...     opened, digest = stat_key(os.fstat(f.fileno())), content_digest(f, path)
    >>> with open(path, "wb") as f:
    ...     _ = f.write(b"abd")
    >>> with open(path, "rb") as f:
    ...     check_unchanged(f, path, opened, digest, what="this source")
    Traceback (most recent call last):
    ...
    ValueError: ... changed after this source was made (3 -> 3 bytes, new content): ...
    """
    now = stat_key(os.fstat(f.fileno()))
    if (rehash or file_changed(now, opened)) and content_digest(f, path, share=share) != digest:
        raise ValueError(
            f"{path} changed after {what} was made ({opened[2]} -> {now[2]} bytes, new "
            f"content): it no longer holds the data {what} (and any state saved from it) "
            "refers to. Restore the original file, or make a new source and start a new run"
        )
    return now


def reopen(path: str, kind: str) -> IO[bytes]:
    """Open a file that a source of ``kind`` was made on (lazily, in each process), or a
    ``FileNotFoundError`` naming it and the fix; the caller checks its content with
    :func:`check_unchanged`."""
    try:
        return open(path, "rb")
    except OSError as e:
        raise FileNotFoundError(
            f"{path}: cannot be reopened ({e.strerror}); it was part of this {kind} when it was "
            f"made: restore the file, or make a new {kind}"
        ) from None
