"""Hidden temporary files that writes of a shard set leave behind when they are killed.

A write builds every file of a set (shards and manifest) under a hidden temporary name
``.<name>.<pid>.<random>.tmp`` in the set's directory and renames it into place. A writer
killed before its rename leaves that file behind: it is never part of the data, readers list it
(:func:`leftover_temps`, :func:`leftovers_of`) so ``inspect`` and ``verify`` can report it, and
the next write to the set removes it
(:func:`grain_rox._format._shard_set.clean_leftovers`).
"""

from __future__ import annotations

import contextlib
import os
import re

from grain_rox._format._atomic import set_writer_active
from grain_rox._format._manifest import MANIFEST_SUFFIX, manifest_path_for, set_name


def _temp_pattern(manifest_path: str) -> re.Pattern[str]:
    base = re.escape(set_name(manifest_path))
    names = rf"(?:{base}(?:_\d{{4,}})?\.rox|{base}{re.escape(MANIFEST_SUFFIX)})"
    return re.compile(rf"\.{names}\.(\d+)\.[0-9a-f]+\.tmp")


def matching_temps(manifest_path: str) -> list[tuple[str, int]]:
    """Every hidden temporary file of a write to this set, running or not, with its writer's
    pid, sorted by path."""
    directory = os.path.dirname(manifest_path) or "."
    pattern = _temp_pattern(manifest_path)
    found = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            match = pattern.fullmatch(entry.name)
            if match:
                found.append((entry.path, int(match.group(1))))
    return sorted(found)


def leftover_temps(manifest_path: str) -> list[str]:
    """Return the hidden temporary files of writes to this set that are not running now:
    all of them when no writer holds the set's lock (whatever their pid: a killed writer's
    pid may be alive again, e.g. pid 1 in a container), else those of dead pids.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> _ = open(os.path.join(d, ".t_0001.rox.1.ab12.tmp"), "wb")
    >>> [os.path.basename(p) for p in leftover_temps(os.path.join(d, "t.manifest.json"))]
    ['.t_0001.rox.1.ab12.tmp']
    """
    found = matching_temps(manifest_path)  # before the lock check: see set_writer_active
    active = set_writer_active(manifest_path)
    return [
        path
        for path, pid in found
        if (active is False or not _alive(pid)) and os.path.lexists(path)
    ]


# any set's temporary: the file it stands for (a shard, or a manifest), then .<pid>.<hex>.tmp
_ANY_TEMP = re.compile(rf"\.(?:(.+\.rox)|(.+){re.escape(MANIFEST_SUFFIX)})\.\d+\.[0-9a-f]+\.tmp")


def killed_write_note(searched: str, directory: bool) -> str:
    """For an error that found no shard at ``searched`` (a set's path, or a directory): a
    note naming the temporaries a killed write left there, or "" when there are none.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> _ = open(os.path.join(d, ".t_0000.rox.1.ab12.tmp"), "wb")
    >>> killed_write_note(os.path.join(d, "t.rox"), directory=False)[:52]
    '; a killed write left 1 temporary file beside it (.t'
    """
    sets = [manifest_path_for(searched)]
    if directory:  # the sets a temporary there belongs to
        with contextlib.suppress(FileNotFoundError):
            names = [_ANY_TEMP.fullmatch(e.name) for e in os.scandir(searched)]
            stands_for = {m.group(1) or f"{m.group(2)}.rox" for m in names if m}
            sets = sorted({manifest_path_for(os.path.join(searched, f)) for f in stands_for})
    found = sorted({t for mpath in sets for t in leftover_temps(mpath)})
    if not found:
        return ""
    files = "file" if len(found) == 1 else "files"
    shown = ", ".join(os.path.basename(p) for p in found[:3]) + (", ..." if len(found) > 3 else "")
    return (
        f"; a killed write left {len(found)} temporary {files} beside it ({shown}), none of "
        "them a shard: run the write again (it removes them) or delete them"
    )


def leftovers_of(paths: list[str]) -> list[str]:
    """The killed writers' temporaries beside the sets that shard ``paths`` belong to."""
    found: list[str] = []
    for mpath in dict.fromkeys(manifest_path_for(p) for p in paths):
        found += [t for t in leftover_temps(mpath) if t not in found]
    return found


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # ours from an earlier, failed call in this process: not in use
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return pid < (1 << 31)
    return True
