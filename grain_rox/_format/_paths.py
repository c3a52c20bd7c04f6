"""Resolve a user's path, glob, directory or list into shard files.

Globs, directories and lists resolve (and therefore order) exactly as roxxel 0.9.x does, and
the global block order of a corpus follows it:

* a list: each entry resolved by the rules below, in order, duplicates allowed (roxxel users
  build virtual N-times corpora this way); we also accept tuples and ``pathlib.Path`` items;
* a string with ``*`` or ``?``: ``sorted(glob.glob(s))`` (lexicographic: ``_10000`` sorts
  before ``_1001``, as in roxxel);
* an existing directory: ``sorted(glob(dir/*.rox))``, not recursive;
* an existing file: that file;
* a set name ``data/man.rox`` (or ``data/man``) that is not a file: the files
  ``man_<4+ digits>.rox`` beside it and nothing else. A set with a grain_rox manifest
  (``man.manifest.json``) is ordered by shard number; a set without one (written by roxxel)
  in roxxel's lexicographic order. Any looser match (``man_v2_0000.rox``, or ``docs_0000.rox``
  for ``doc.rox``) is an error that lists the candidates and how to name them.

A set name or directory whose numbered shards (of a set without a manifest) have a hole is
refused, where roxxel reads on without the lost shard (:func:`refuse_lost_shards`); a glob or
a list reads what it names.

``roxxel_names=True`` resolves a set name the way roxxel does instead: ``sorted(glob(prefix_*
.rox))``, else ``sorted(glob(prefix*.rox))``, which also matches unrelated sets such as
``train_extra_0000.rox`` next to ``train_0000.rox``. The bit-exact roxxel stream uses it.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

from grain_rox._format._leftovers import killed_write_note
from grain_rox._format._lost_shards import refuse_lost_shards
from grain_rox._format._object_store import is_url
from grain_rox._format._remote_set import resolve_url

PathSpec = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def _has_glob(s: str) -> bool:
    return "*" in s or "?" in s


def _shard_number(path: str) -> int:
    return int(path[path.rindex("_") + 1 : -len(".rox")])


def _resolve_set_name(s: str, prefix: str) -> list[str]:
    """``prefix_<digits>.rox`` only; an error listing looser candidates if there are any."""
    numbered = re.compile(re.escape(os.path.basename(prefix)) + r"_\d{4,}\.rox")
    escaped = glob.escape(prefix)
    found = [p for p in glob.glob(escaped + "_*.rox") if numbered.fullmatch(os.path.basename(p))]
    if found:
        if os.path.exists(prefix + ".manifest.json"):  # a set grain_rox wrote: by number
            return sorted(found, key=_shard_number)
        refuse_lost_shards(found, s, from_zero=True)
        return sorted(found)  # roxxel's order for roxxel's sets
    loose = sorted(glob.glob(escaped + "*.rox"))
    if loose:
        shown = ", ".join(os.path.basename(p) for p in loose[:8])
        more = f" and {len(loose) - 8} more" if len(loose) > 8 else ""
        raise FileNotFoundError(
            f"{s!r} names no shard set: neither {prefix + '.rox'!r} nor "
            f"{prefix + '_NNNN.rox'!r} files exist, but {len(loose)} file(s) start with that "
            f"name ({shown}{more}) and grain_rox does not guess which belong to it. Pass a glob "
            f"such as {escaped + '*.rox'!r}, the list of files, or roxxel_names=True for "
            "roxxel's prefix*.rox fallback"
        )
    return []


def _resolve_entry(s: str, roxxel_names: bool) -> tuple[list[str], str]:
    """Resolve one entry; returns (files, what was searched when nothing matched)."""
    if os.path.islink(s) and not os.path.exists(s):  # (else taken for a set name)
        return [], _dangling(s)
    if os.path.isdir(s):
        found = sorted(glob.glob(os.path.join(s, "*.rox")))
        dangling = [p for p in found if os.path.islink(p) and not os.path.exists(p)]
        if dangling:
            raise FileNotFoundError(f"no .rox shard found for {_dangling(dangling[0])}")
        refuse_lost_shards(found, s, from_zero=False)
        return found, f"the directory {s!r} (no *.rox in it{killed_write_note(s, True)})"
    if os.path.exists(s):
        return [s], ""
    if s.endswith(("/", os.sep)):  # (a set name, the only other kind, is no directory)
        return [], f"the directory {s!r} (it does not exist)"
    parent = os.path.dirname(s)
    # (roxxel's prefix fallback globs the whole path, a directory part too)
    if parent and not os.path.isdir(parent) and not (roxxel_names and _has_glob(parent)):
        return [], f"{s!r} (its directory {parent!r} does not exist)"
    prefix = s[: -len(".rox")] if s.endswith(".rox") else s
    if not roxxel_names:
        found = _resolve_set_name(s, prefix)
        searched = (
            f"{s!r} (not a file or directory; no {prefix + '_NNNN.rox'!r} shards"
            f"{killed_write_note(s, False)})"
        )
        return found, "" if found else searched
    for suffix in ("_*.rox", "*.rox"):
        found = sorted(glob.glob(prefix + suffix))  # unescaped, as roxxel does
        if found:
            return found, ""
    return (
        [],
        f"{s!r} (not a file or directory; {prefix + '_*.rox'!r} and {prefix + '*.rox'!r} matched nothing)",
    )


def _dangling(link: str) -> str:
    return (
        f"{link!r} (a symbolic link to {os.readlink(link)!r}, which does not exist: restore "
        "its target, or delete the link)"
    )


def resolve_shard_paths(
    spec: PathSpec,
    *,
    roxxel_names: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> list[str]:
    """Return the shard files ``spec`` names, in order (see the module docstring).

    Raises ``FileNotFoundError`` naming what was searched when nothing matches or an entry
    names nothing. URLs (``gs://``, ``s3://``, any fsspec scheme) resolve by the same rules,
    by listing their prefix (:func:`grain_rox._format._remote_set.resolve_url`), with
    ``storage_options`` (None: fsspec's configuration).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> for name in ["c_0001.rox", "c_0000.rox", "notes.txt"]:
    ...     _ = (d / name).write_bytes(b"")
    >>> [os.path.basename(p) for p in resolve_shard_paths(str(d))]
    ['c_0000.rox', 'c_0001.rox']
    >>> [os.path.basename(p) for p in resolve_shard_paths(str(d / "c.rox"))]
    ['c_0000.rox', 'c_0001.rox']
    >>> resolve_shard_paths(str(d / "c_0.rox"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    FileNotFoundError: ... 2 file(s) start with that name (c_0000.rox, c_0001.rox) and grain_rox does not guess ...
    >>> len(resolve_shard_paths(str(d / "c_0.rox"), roxxel_names=True))
    2
    """
    if isinstance(spec, (bytes, bytearray)):
        raise TypeError(f"shard paths must be str or os.PathLike, got bytes {spec!r}")
    if isinstance(spec, (str, os.PathLike)):
        s = os.fspath(spec)
        if is_url(s):
            entries = [s]
        elif _has_glob(s):  # (a set's manifest beside its shards is no shard)
            entries = sorted(p for p in glob.glob(s) if not p.endswith(".manifest.json"))
            if not entries:
                raise FileNotFoundError(f"no .rox shard matches the glob {s!r}")
        else:
            entries = [s]
    else:
        kinds = (str, os.PathLike)
        unordered = isinstance(spec, (set, frozenset, dict))  # a corpus's order is its shards'
        items = list(spec) if isinstance(spec, Iterable) and not unordered else None
        if items is None or not all(isinstance(p, kinds) for p in items):
            raise TypeError(
                f"shard paths must be a path (str or os.PathLike: a file, glob, directory or set "
                f"name) or a list of them, got {spec!r:.200} ({type(spec).__name__})"
            )
        entries = [os.fspath(p) for p in items]
        if not entries:
            raise FileNotFoundError("the list of .rox shards is empty")
    paths: list[str] = []
    missing: list[str] = []
    for entry in entries:
        if is_url(entry):
            found, searched = resolve_url(
                entry, roxxel_names=roxxel_names, storage_options=storage_options
            )
        else:
            found, searched = _resolve_entry(entry, roxxel_names)
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
