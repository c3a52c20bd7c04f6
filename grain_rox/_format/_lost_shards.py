"""A set's lost shards: roxxel and grain_rox number a set's shards ``x_0000.rox``, ``x_0001.rox``,
... without gaps, so a hole in the numbers of a set without a manifest (which names its shards
itself) is a shard deleted or a copy that did not finish; roxxel reads on without it."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Sequence

from grain_rox._format._manifest import MANIFEST_SUFFIX

_MEMBER = re.compile(r"(.+)_(\d{4,})\.rox")


def refuse_lost_shards(
    found: Sequence[str],
    named: str,
    *,
    from_zero: bool,
    has_manifest: Callable[[str], bool] | None = None,
) -> None:
    """Refuse numbered shards (``x_0000.rox``, ...) of a set without a manifest whose numbers
    have a hole: roxxel and grain_rox number a set's shards from 0 without gaps, so a hole is a
    shard lost (deleted, or a copy that did not finish), and reading on would serve the set
    without its tokens, silently. ``from_zero``: the set was named, so a hole at its start
    counts too (else, as for a directory's files, only sets holding a ``_0000`` are sets).
    Names with more holes than files (``t_0000.rox`` beside ``t_20240517.rox``) are taken for
    another numbering, not a set that lost most of its shards.
    ``has_manifest(prefix)``: whether the set ``prefix`` has a manifest (default: a local
    ``prefix.manifest.json``), which names its shards itself.

    >>> refuse_lost_shards(["d/t_0000.rox", "d/t_0002.rox", "d/logs_2024.rox"], "d", from_zero=False)
    Traceback (most recent call last):
    ...
    FileNotFoundError: d: the shard set d/t.rox has no t_0001.rox: a writer numbers a set's shards from _0000 without gaps, so 1 shard is missing (deleted, or a copy that did not finish). Restore it; to read the shards that are there anyway, pass them as a list or a glob such as 'd/t_*.rox'
    """
    numbers: dict[str, set[int]] = {}
    for path in found:
        member = _MEMBER.fullmatch(os.path.basename(path))
        if member is not None:
            prefix = os.path.join(os.path.dirname(path), member[1])
            numbers.setdefault(prefix, set()).add(int(member[2]))
    for prefix, got in numbers.items():
        sealed = (has_manifest or _local_manifest)(prefix)
        if (not from_zero and 0 not in got) or sealed:
            continue  # not a writer's set, or one whose manifest names every shard
        missing = max(got) + 1 - len(got)
        # more holes than shards: names numbered otherwise (a date, a time), not a writer's
        if 0 < missing <= len(got):
            lost = [n for n in range(max(got)) if n not in got][:5]
            name = os.path.basename(prefix)
            shown = ", ".join(f"{name}_{n:04d}.rox" for n in lost)
            more = f" and {missing - 5} more" if missing > 5 else ""
            count = "1 shard is" if missing == 1 else f"{missing} shards are"
            raise FileNotFoundError(
                f"{named}: the shard set {prefix}.rox has no {shown}{more}: a writer numbers a "
                f"set's shards from _0000 without gaps, so {count} missing (deleted, or a copy "
                f"that did not finish). Restore {'it' if missing == 1 else 'them'}; to read "
                f"the shards that are there anyway, pass them as a list or a glob such as "
                f"{glob.escape(prefix) + '_*.rox'!r}"
            )


def _local_manifest(prefix: str) -> bool:
    return os.path.exists(prefix + MANIFEST_SUFFIX)
