"""Check every shard on its own and report all damage, not just the first.

The shards a path names may belong to several sets (a directory holding ``train.rox`` and
``code_0000.rox ...``): each shard is checked against its own set (its manifest, and the dtype
of the set's first shard), so two healthy sets of different dtypes are two sets, not damage.

The ``"grain_rox"`` logger hears of the work: its start and its outcome at INFO, each damaged
shard at WARNING, each sound shard and each leftover temporary file at DEBUG.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from collections.abc import Callable
from typing import Any

from grain_rox._format._leftovers import leftovers_of
from grain_rox._format._manifest import ShardRecord, manifest_path_for, set_base
from grain_rox._format._object_store import is_url, store_for
from grain_rox._format._paths import PathSpec, resolve_shard_paths
from grain_rox._format._remote_set import check_object_checksum, remote_manifest
from grain_rox._format._remote_shard import ObjectRef, RemoteShard, open_object
from grain_rox._format._rox_format import (
    RoxFormatError,
    ShardHeader,
    check_index,
    check_same_dtype,
    read_header,
    read_index,
)
from grain_rox._format._shard_set import current_manifest

_HASH_CHUNK = 8 << 20

logger = logging.getLogger("grain_rox")
# how a shard report's problem begins where its set's manifest is unusable (the CLI counts them)
UNCHECKED = "not checked: "


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
      note: what a ``"leftover"`` report says and how to remove it; for a sound shard not
        hashed (``checksums=False``) whose mtime is not the manifest's, that only its checksum
        can tell whether it changed.
      set: the set the file belongs to: its path without ``.rox`` and a ``_NNNN`` shard number
        (``data/code_0003.rox`` -> ``data/code``).
      dtype: its token dtype (None when it could not be read).
    """

    path: str
    problem: str | None
    num_blocks: int = 0
    num_tokens: int = 0
    checksum: str = "none"
    kind: str = "shard"
    note: str | None = None
    set: str = ""
    dtype: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def verify_rox(
    paths: PathSpec,
    *,
    checksums: bool = True,
    roxxel_names: bool = False,
    on_bytes: Callable[[int], None] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[ShardReport]:
    """Check each shard's footer, size, whole index and (with a manifest) sha256 checksum.

    Unlike :func:`open_rox`, which stops at the first damaged shard, this returns one report
    per shard, a shard whose dtype differs from its set's first sound shard's among them (a
    set with a manifest: from the manifest's), plus one
    ``kind="leftover"`` report (ok, with a ``note``) per hidden temporary file that a killed
    writer left beside the sets (the next write to the set removes them). Shards of different
    sets may hold different dtypes (:func:`shard_sets` groups the reports).

    Args:
      paths: the shards: a file, glob, directory, set name or list of them (as for
        :func:`open_rox`).
      checksums: also hash every shard that its manifest records a sha256 for.
      roxxel_names: resolve a set name with roxxel's looser ``name*.rox`` fallback.
      on_bytes: called with the bytes of each shard checked, as they are hashed (the whole
        file at once when it is not hashed): the calls add up to the shards' total size.
      storage_options: fsspec options for URLs (``gs://``, ``s3://``); an object's bytes
        are streamed through ranged requests to check its checksum.

    Returns:
      One :class:`ShardReport` per shard, in the corpus's order, then one per leftover.

    >>> import tempfile, os
    >>> from grain_rox import write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "v.rox")
    >>> _ = write_rox(["some text"], path, block_size=4)
    >>> [(r.ok, r.num_blocks, r.checksum, r.dtype) for r in verify_rox(path)]
    [(True, 3, 'ok', 'uint8')]
    """
    reports = []
    logged: set[str] = set()  # the problems of unusable manifests logged so far
    firsts: dict[str, ShardHeader] = {}  # each set's first readable shard: the set's dtype
    resolved = resolve_shard_paths(
        paths, roxxel_names=roxxel_names, storage_options=storage_options
    )
    logger.info(
        "verifying %d shard%s (%s)",
        len(resolved),
        "" if len(resolved) == 1 else "s",
        "structure and checksums" if checksums else "structure only, no checksums",
    )
    for path in resolved:
        name = set_base(path)
        sent = 0

        def count(n: int) -> None:
            nonlocal sent
            sent += n
            if on_bytes is not None:
                on_bytes(n)

        try:
            ref = None
            if is_url(path):
                store = store_for(path, storage_options)
                ref = ObjectRef(store, store.info(path))
                header, index = open_object(ref)
                ends = index if index is not None else RemoteShard(header, ref, None).ends
                check_index(header, ends)
            else:
                header = read_header(path)
                check_index(header, read_index(header))
            checksum = "none"
            mpath = manifest_path_for(path)
            manifest = (
                remote_manifest(ref.store, mpath) if ref is not None else current_manifest(mpath)
            )
            record = manifest.check_shard(header, mpath) if manifest else None
            # against the set's first sound shard (after the manifest's own check: a damaged
            # first shard made every sound one look like another dtype)
            check_same_dtype(firsts.get(name, header), header)
            note = None
            if record is not None and checksums and record.sha256 is not None:
                if ref is not None:
                    check_object_checksum(ref, record, count)
                else:
                    _check_sha256(path, record, count)
                checksum = "ok"
            elif record is not None and ref is None and _touched(path, record):
                note = (
                    "modified since it was written (its mtime is not the manifest's), so only "
                    "its checksum can tell whether its tokens changed; reading it hashes it "
                    "and refuses a mismatch. Fix: run grain-rox verify without --no-checksums"
                )
            firsts.setdefault(name, header)
            reports.append(
                ShardReport(
                    path,
                    None,
                    header.num_blocks,
                    header.num_tokens,
                    checksum,
                    note=note,
                    set=name,
                    dtype=str(header.dtype),
                )
            )
        except RoxFormatError as e:
            problem = f"{e.problem}. Fix: {e.fix}."
            if e.path != path:  # the set's manifest (or another of its files), not this shard
                problem = f"{UNCHECKED}the set's {e.path} is unusable: {problem}"
            reports.append(ShardReport(path, problem, set=name))
        except OSError as e:
            reports.append(ShardReport(path, f"cannot read: {e}", set=name))
        _log_report(reports[-1], logged)
        size = _size(path, storage_options)
        if size > sent:  # the rest: all of it when it was not hashed
            count(size - sent)
    for tmp in leftovers_of([p for p in resolved if not is_url(p)]):
        note = (
            f"a hidden temporary file ({os.path.getsize(tmp):,} bytes) of a write to this set "
            "that was killed; it is not part of the data. Fix: delete it, or write to the set "
            "again (the next write removes it)"
        )
        reports.append(ShardReport(tmp, None, kind="leftover", note=note, set=set_base(tmp)))
        logger.debug("leftover %s: %s", tmp, note)
    shards = [r for r in reports if r.kind == "shard"]
    damaged, sets, leftovers = (
        sum(not r.ok for r in shards),
        len(shard_sets(shards)),
        len(reports) - len(shards),
    )
    logger.info(
        "verified %d shard%s in %d set%s: %d sound, %d damaged%s",
        len(shards),
        "" if len(shards) == 1 else "s",
        sets,
        "" if sets == 1 else "s",
        len(shards) - damaged,
        damaged,
        f", {leftovers} leftover temporary file{'' if leftovers == 1 else 's'}"
        if leftovers
        else "",
    )
    return reports


def _log_report(report: ShardReport, logged: set[str]) -> None:
    """One shard's outcome: damage at WARNING, a sound shard at DEBUG (its note, if any, is
    in the report: ``grain-rox verify`` prints it); a set's unusable manifest once
    (``logged``: the problems said so far)."""
    if report.ok and report.note:
        logger.debug("shard %s is sound as far as checked; %s", report.path, report.note)
    elif report.ok:
        logger.debug(
            "shard %s is sound: %d block%s, %d tokens (%s), checksum %s",
            report.path,
            report.num_blocks,
            "" if report.num_blocks == 1 else "s",
            report.num_tokens,
            report.dtype,
            report.checksum,
        )
    elif (report.problem or "").startswith(UNCHECKED):
        if report.problem not in logged:  # said once for the set's shards
            logged.add(report.problem or "")
            logger.warning("the shards of the set %s are %s", report.set, report.problem)
    else:
        logger.warning("damaged shard %s: %s", report.path, report.problem)


def shard_sizes(
    paths: PathSpec,
    *,
    roxxel_names: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> int:
    """The bytes :func:`verify_rox` reads over ``paths`` (its ``on_bytes`` calls add up to it)."""
    found = resolve_shard_paths(paths, roxxel_names=roxxel_names, storage_options=storage_options)
    return sum(_size(p, storage_options) for p in found)


def shard_sets(reports: list[ShardReport]) -> dict[str, list[ShardReport]]:
    """The shard reports grouped by set, sets in the order their first shard was checked.

    >>> a, b = ShardReport("d/a_0000.rox", None, set="d/a"), ShardReport("d/b.rox", None, set="d/b")
    >>> {k: [r.path for r in v] for k, v in shard_sets([a, b]).items()}
    {'d/a': ['d/a_0000.rox'], 'd/b': ['d/b.rox']}
    """
    sets: dict[str, list[ShardReport]] = {}
    for r in reports:
        if r.kind == "shard":
            sets.setdefault(r.set, []).append(r)
    return sets


def _size(path: str, storage_options: dict[str, Any] | None = None) -> int:
    try:
        if is_url(path):
            return store_for(path, storage_options).info(path).size
        return os.path.getsize(path)
    except OSError:
        return 0


def _touched(path: str, record: ShardRecord) -> bool:
    """Whether a local shard's mtime differs from the one its manifest recorded."""
    return record.mtime_ns is not None and os.stat(path).st_mtime_ns != record.mtime_ns


def _check_sha256(path: str, record: ShardRecord, on_bytes: Callable[[int], None]) -> None:
    """Hash ``path`` in chunks (reporting each one) and compare with the manifest's record."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while block := f.read(_HASH_CHUNK):
            digest.update(block)
            on_bytes(len(block))
    if digest.hexdigest() != record.sha256:
        record.check_checksum(path)  # hashes again and raises the manifest's own error
