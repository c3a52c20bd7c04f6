"""Resolve a user's path, glob, directory or list into shard files, exactly as roxxel does.

Roxxel 0.9.x resolves (and therefore orders) shards like this, and the global block order of
a corpus follows it, so we copy the rules byte for byte:

* a list: each entry resolved by the rules below, in order, duplicates allowed (roxxel users
  build virtual N-times corpora this way); we also accept tuples and ``pathlib.Path`` items;
* a string with ``*`` or ``?``: ``sorted(glob.glob(s))`` (lexicographic: ``_10000`` sorts
  before ``_1001``, as in roxxel);
* an existing directory: ``sorted(glob(dir/*.rox))``, not recursive;
* an existing file: that file;
* anything else: ``prefix = s`` minus a ``.rox`` suffix, then ``sorted(glob(prefix_*.rox))``,
  else ``sorted(glob(prefix*.rox))`` (roxxel's fallback, which can also match unrelated sets
  such as ``train_extra_0000.rox`` next to ``train_0000.rox``).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

PathSpec = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def _has_glob(s: str) -> bool:
    return "*" in s or "?" in s


def _resolve_entry(s: str) -> tuple[list[str], str]:
    """Resolve one entry; returns (files, what was searched when nothing matched)."""
    if os.path.isdir(s):
        return sorted(glob.glob(os.path.join(s, "*.rox"))), f"the directory {s!r} (no *.rox in it)"
    if os.path.exists(s):
        return [s], ""
    prefix = s[: -len(".rox")] if s.endswith(".rox") else s
    for suffix in ("_*.rox", "*.rox"):
        found = sorted(glob.glob(prefix + suffix))  # unescaped, as roxxel does
        if found:
            return found, ""
    return (
        [],
        f"{s!r} (not a file or directory; {prefix + '_*.rox'!r} and {prefix + '*.rox'!r} matched nothing)",
    )


def resolve_shard_paths(spec: PathSpec) -> list[str]:
    """Return the shard files ``spec`` names, in roxxel's order.

    Raises ``FileNotFoundError`` naming what was searched when nothing matches or an entry
    names nothing.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> for name in ["c_0001.rox", "c_0000.rox", "notes.txt"]:
    ...     _ = (d / name).write_bytes(b"")
    >>> [os.path.basename(p) for p in resolve_shard_paths(str(d))]
    ['c_0000.rox', 'c_0001.rox']
    >>> [os.path.basename(p) for p in resolve_shard_paths(str(d / "c.rox"))]
    ['c_0000.rox', 'c_0001.rox']
    """
    if isinstance(spec, (bytes, bytearray)):
        raise TypeError(f"shard paths must be str or os.PathLike, got bytes {spec!r}")
    if isinstance(spec, (str, os.PathLike)):
        s = os.fspath(spec)
        if _has_glob(s):
            entries = sorted(glob.glob(s))
            if not entries:
                raise FileNotFoundError(f"no .rox shard matches the glob {s!r}")
        else:
            entries = [s]
    else:
        entries = [os.fspath(p) for p in spec]
        if not entries:
            raise FileNotFoundError("the list of .rox shards is empty")
    paths: list[str] = []
    missing: list[str] = []
    for entry in entries:
        found, searched = _resolve_entry(entry)
        paths.extend(found)
        if not found:
            missing.append(searched)
    if missing:
        raise FileNotFoundError(
            "no .rox shard found for "
            + "; ".join(missing[:5])
            + (" ..." if len(missing) > 5 else "")
        )
    return paths
