"""Check every shard of a set on its own and report all damage, not just the first."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from grain_rox._format._manifest import manifest_path_for
from grain_rox._format._paths import PathSpec, resolve_shard_paths
from grain_rox._format._rox_format import INDEX_DTYPE, RoxFormatError, check_index, read_header
from grain_rox._format._shard_set import current_manifest, leftovers_of


@dataclasses.dataclass(frozen=True)
class ShardReport:
    """The outcome of checking one shard: ``problem`` is None when it is sound."""

    path: str
    problem: str | None
    num_blocks: int = 0
    num_tokens: int = 0
    checksum: str = "none"  # "ok", "mismatch", or "none" (no manifest entry)
    kind: str = "shard"  # or "leftover": a killed writer's hidden temporary file (harmless)
    note: str | None = None  # what a "leftover" report says and how to remove it

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

    >>> import tempfile, os
    >>> from grain_rox import write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "v.rox")
    >>> _ = write_rox(["some text"], path, block_size=4)
    >>> [(r.ok, r.num_blocks, r.checksum) for r in verify_rox(path)]
    [(True, 3, 'ok')]
    """
    reports = []
    first_dtype: tuple[str, np.dtype] | None = None
    resolved = resolve_shard_paths(paths, roxxel_names=roxxel_names)
    for path in resolved:
        try:
            header = read_header(path)
            if header.num_blocks:
                ends = np.memmap(
                    path, INDEX_DTYPE, "r", offset=header.raw_size, shape=(header.num_blocks,)
                )
                check_index(header, ends)
                del ends
            if first_dtype is None:
                first_dtype = (path, header.dtype)
            elif header.dtype != first_dtype[1]:
                raise RoxFormatError(
                    path,
                    f"its dtype {header.dtype} differs from {first_dtype[0]}'s {first_dtype[1]}",
                    "keep one token dtype per corpus",
                )
            checksum = "none"
            mpath = manifest_path_for(path)
            manifest = current_manifest(mpath)
            record = manifest.shards.get(os.path.basename(path)) if manifest else None
            if record is not None:
                record.check(header, mpath)
                if checksums and record.check_checksum(path):
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
