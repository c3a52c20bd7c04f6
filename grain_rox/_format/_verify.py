"""Check every shard of a set on its own and report all damage, not just the first."""

from __future__ import annotations

import dataclasses
import os

from grain_rox._format._leftovers import leftovers_of
from grain_rox._format._manifest import manifest_path_for
from grain_rox._format._paths import PathSpec, resolve_shard_paths
from grain_rox._format._rox_format import (
    RoxFormatError,
    ShardHeader,
    check_index,
    check_same_dtype,
    read_header,
    read_index,
)
from grain_rox._format._shard_set import current_manifest


@dataclasses.dataclass(frozen=True)
class ShardReport:
    """The outcome of checking one shard: ``problem`` is None when it is sound.

    Attributes:
      path: the shard (or leftover temporary file) checked.
      problem: what is wrong and the fix, or None when it is sound.
      num_blocks: its blocks (0 when it could not be read).
      num_tokens: its tokens, padding included (0 when it could not be read).
      checksum: ``"ok"`` when its sha256 matched the manifest's, ``"none"`` when not checked
        (no manifest entry, or ``checksums=False``); a mismatch is a ``problem``.
      kind: ``"shard"``, or ``"leftover"``: a killed writer's hidden temporary file (harmless).
      note: what a ``"leftover"`` report says and how to remove it.
    """

    path: str
    problem: str | None
    num_blocks: int = 0
    num_tokens: int = 0
    checksum: str = "none"
    kind: str = "shard"
    note: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def verify_rox(
    paths: PathSpec, *, checksums: bool = True, roxxel_names: bool = False
) -> list[ShardReport]:
    """Check each shard's footer, size, whole index and (with a manifest) sha256 checksum.

    Unlike :func:`open_rox`, which stops at the first damaged shard, this returns one report
    per shard, plus a report for every shard whose dtype differs from the first shard's, plus
    one ``kind="leftover"`` report (ok, with a ``note``) per hidden temporary file that a
    killed writer left beside the sets (the next write to the set removes them).

    Args:
      paths: the shards: a file, glob, directory, set name or list of them (as for
        :func:`open_rox`).
      checksums: also hash every shard that its manifest records a sha256 for.
      roxxel_names: resolve a set name with roxxel's looser ``name*.rox`` fallback.

    Returns:
      One :class:`ShardReport` per shard, in the corpus's order, then one per leftover.

    >>> import tempfile, os
    >>> from grain_rox import write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "v.rox")
    >>> _ = write_rox(["some text"], path, block_size=4)
    >>> [(r.ok, r.num_blocks, r.checksum) for r in verify_rox(path)]
    [(True, 3, 'ok')]
    """
    reports = []
    first: ShardHeader | None = None  # the first readable shard: the set's dtype
    resolved = resolve_shard_paths(paths, roxxel_names=roxxel_names)
    for path in resolved:
        try:
            header = read_header(path)
            check_index(header, read_index(header))
            if first is None:
                first = header
            check_same_dtype(first, header)
            checksum = "none"
            mpath = manifest_path_for(path)
            manifest = current_manifest(mpath)
            record = manifest.check_shard(header, mpath) if manifest else None
            if record is not None and checksums and record.check_checksum(path):
                checksum = "ok"
            reports.append(ShardReport(path, None, header.num_blocks, header.num_tokens, checksum))
        except RoxFormatError as e:
            reports.append(ShardReport(path, f"{e.problem}. Fix: {e.fix}."))
        except OSError as e:
            reports.append(ShardReport(path, f"cannot read: {e}"))
    for tmp in leftovers_of(resolved):
        note = (
            f"a hidden temporary file ({os.path.getsize(tmp):,} bytes) of a write to this set "
            "that was killed; it is not part of the data. Fix: delete it, or write to the set "
            "again (the next write removes it)"
        )
        reports.append(ShardReport(tmp, None, kind="leftover", note=note))
    return reports
