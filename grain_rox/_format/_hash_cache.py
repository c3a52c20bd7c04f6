"""sha256 of shard files, remembered per file version on this host.

A shard whose size or mtime_ns differs from its manifest's record (a copy to a local disk, a
``cp -r`` without ``-p``) must be hashed once to prove it is still the data that was written.
Without a memory of that, every process that opens the copy (each training start, each Grain
worker that asks for a repr) would re-read the whole corpus. The result is kept in memory and
in a small file per version under the cache directory (``$GRAIN_ROX_CACHE_DIR``, else
``$XDG_CACHE_HOME/grain_rox``, else ``~/.cache/grain_rox``), keyed by the file's real path,
device, inode, size and mtime_ns: an edit in place changes mtime_ns and so the key, and the
file is hashed again. A cache that cannot be written (a read-only home) only costs the re-hash.

>>> import tempfile, os
>>> os.environ["GRAIN_ROX_CACHE_DIR"] = tempfile.mkdtemp()
>>> path = os.path.join(tempfile.mkdtemp(), "a.bin")
>>> _ = open(path, "wb").write(b"abc")
>>> cached_sha256(path, os.stat(path))[:12]
'ba7816bf8f01'
>>> _MEMORY.clear(); cached_sha256(path, os.stat(path))[:12]  # from the file cache now
'ba7816bf8f01'
>>> del os.environ["GRAIN_ROX_CACHE_DIR"]
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator

from grain_rox._format._manifest import sha256_file

_LOG = logging.getLogger("grain_rox")
_MEMORY: dict[tuple[str, int, int, int, int], str] = {}


def cache_dir() -> str:
    """Where hashes of file versions are remembered on this host."""
    explicit = os.environ.get("GRAIN_ROX_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "grain_rox")


def _entry_path(key: tuple[str, int, int, int, int]) -> str:
    name = hashlib.sha1(repr(key).encode()).hexdigest()
    return os.path.join(cache_dir(), "sha256", name[:2], name)


def _read_entry(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            digest = f.read(65)
    except (OSError, UnicodeDecodeError):
        return None
    ok = len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
    return digest if ok else None


def _write_entry(path: str, digest: str) -> None:
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(digest)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


@contextlib.contextmanager
def _entry_lock(entry: str) -> Iterator[None]:
    """Hold an exclusive lock on one cache entry, so processes that start together on one host
    hash a file version once: the others wait and read the entry (no lock where the cache
    cannot be written, or without advisory locks)."""
    try:
        import fcntl

        os.makedirs(os.path.dirname(entry), exist_ok=True)
        fd = os.open(entry + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, OSError):
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def cached_sha256(path: str, st: os.stat_result) -> str:
    """sha256 of ``path`` as ``st`` describes it, hashed at most once per file version and
    host (see the module doc)."""
    key = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    digest = _MEMORY.get(key)
    if digest is not None:
        return digest
    entry = _entry_path(key)
    digest = _read_entry(entry)
    if digest is None:
        with _entry_lock(entry):
            digest = _read_entry(entry)  # another process may have hashed it while we waited
            if digest is None:
                _LOG.info(
                    "hashing %s (%d bytes): its size or mtime differs from its manifest's "
                    "record (a copy?); the result is remembered in %s",
                    path,
                    st.st_size,
                    cache_dir(),
                )
                digest = sha256_file(path)
                if os.stat(path).st_mtime_ns == st.st_mtime_ns:  # not changed while we read it
                    _write_entry(entry, digest)
    _MEMORY[key] = digest
    return digest
