"""Atomic file creation: write under a hidden temporary name, fsync, then rename into place.

A reader never sees a half-written file: until the rename, the data lives under
``.<name>.<pid>.<random>.tmp`` in the same directory, which neither roxxel's nor our shard
globs (``*.rox``) match. A writer killed before the rename leaves only such a temporary file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from typing import BinaryIO

TMP_SUFFIX = ".tmp"


def temp_path_for(path: str) -> str:
    """Return a fresh hidden temporary name beside ``path``.

    >>> temp_path_for("d/a.rox").startswith("d/.a.rox.")
    True
    """
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}")


def fsync_dir(directory: str) -> None:
    """Make a rename in ``directory`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def publish(tmp: str, path: str) -> None:
    """Rename a finished, fsynced temporary file into place and make the rename durable."""
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


@contextlib.contextmanager
def atomic_create(path: str) -> Iterator[BinaryIO]:
    """Open a temporary file for ``path``; on success fsync and rename it into place.

    On any exception the temporary file is removed and ``path`` is left as it was.

    >>> import tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> with atomic_create(p) as f:
    ...     _ = f.write(b"abc")
    >>> open(p, "rb").read()
    b'abc'
    """
    tmp = temp_path_for(path)
    f = open(tmp, "xb")
    try:
        yield f
        f.flush()
        os.fsync(f.fileno())
        f.close()
        publish(tmp, path)
    except BaseException:
        f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_create(path) as f:
        f.write(data)


class ShardSetBusyError(OSError):
    """Another process is writing the same shard set right now."""


def _lock_path(manifest_path: str) -> str:
    directory, name = os.path.split(manifest_path)
    base = name[: -len(".manifest.json")] if name.endswith(".manifest.json") else name
    return os.path.join(directory, f".{base}.write-lock")


def set_writer_active(manifest_path: str) -> bool | None:
    """Whether a write of this set holds its lock now: False if the lock file is missing or
    can be locked (its writer was killed), True if held; None where advisory locks do not
    exist (Windows). Creates nothing.

    >>> import tempfile
    >>> mpath = os.path.join(tempfile.mkdtemp(), "t.manifest.json")
    >>> set_writer_active(mpath)
    False
    >>> with set_write_lock(mpath, "t.rox"):
    ...     set_writer_active(mpath)
    True
    """
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fd = os.open(_lock_path(manifest_path), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases a lock taken here
    return False


@contextlib.contextmanager
def set_write_lock(manifest_path: str, set_label: str) -> Iterator[None]:
    """Hold an exclusive advisory lock on one shard set for the length of a write, so two
    writers of one set (two ``convert`` jobs, two member shards written in parallel) cannot
    interleave their renames and manifests; a second writer fails at once, naming the set.
    The lock file (``.<set>.write-lock``, empty, hidden) exists only during the write.

    >>> import tempfile, os
    >>> mpath = os.path.join(tempfile.mkdtemp(), "t.manifest.json")
    >>> with set_write_lock(mpath, "t.rox"):  # doctest: +ELLIPSIS
    ...     with set_write_lock(mpath, "t.rox"):
    ...         pass
    Traceback (most recent call last):
    ...
    grain_rox._format._atomic.ShardSetBusyError: another process is writing the shard set t.rox now (it holds the lock ...); wait for that write to finish, or write to another name
    """
    try:
        import fcntl
    except ImportError:  # no advisory locks here (Windows): writers are not serialised
        yield
        return
    lock_path = _lock_path(manifest_path)
    deadline = time.monotonic() + 0.2  # a reader's check (set_writer_active) holds it briefly
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() < deadline:
                time.sleep(0.01)
                continue
            raise ShardSetBusyError(
                f"another process is writing the shard set {set_label} now (it holds the lock "
                f"{lock_path}); wait for that write to finish, or write to another name"
            ) from None
        try:  # the holder before us may have removed the file we opened: lock the new one
            if os.stat(lock_path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock_path)  # while still holding it: nothing is left after a write
        os.close(fd)  # releases the lock
