"""Shard sets in a bucket: which objects a URL names, which manifest describes them, and
whether an object's bytes are the ones its manifest records.

A URL resolves by the rules of a local path (see :mod:`grain_rox._format._paths`): a glob
lists and sorts its matches, a prefix (``gs://b/data/``) its ``*.rox`` objects, an object
itself, and a set name (``gs://b/data/train.rox`` that is no object) its ``train_NNNN.rox``
objects, by number when the set has a manifest. A bucket has no renames, so a set written
there is published differently from a local one (see :mod:`grain_rox._format._object_upload`):
its manifest carries ``pending`` from before the first shard is put in place until after the
last, and a reader refuses a set in that state rather than guess which objects are whose.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from typing import Any

from grain_rox._format._lost_shards import refuse_lost_shards
from grain_rox._format._manifest import MANIFEST_SUFFIX, Manifest, ShardRecord, member_pattern
from grain_rox._format._object_store import ObjectStore, store_for
from grain_rox._format._remote_shard import ObjectRef, read_pinned
from grain_rox._format._rox_format import RoxFormatError

_HASH_CHUNK = 8 << 20


def _number(url: str) -> int:
    m = re.search(r"_(\d{4,})\.rox$", url)
    return int(m.group(1)) if m else -1


def resolve_url(
    entry: str, *, roxxel_names: bool, storage_options: dict[str, Any] | None
) -> tuple[list[str], str]:
    """The shard objects one URL entry names, in order; and what was searched if none (and
    whether the bucket itself is missing)."""
    store = store_for(entry, storage_options)
    found, searched = _resolve_url(store, entry, roxxel_names)
    if not found and (root := store.missing_bucket(entry)):
        searched += (
            f"; the bucket {root} does not exist, or these credentials and endpoint "
            "cannot see it (storage_options, or fsspec's FSSPEC_* environment)"
        )
    return found, searched


def _prefix_shards(store: ObjectStore, prefix: str) -> list[str]:
    """The ``*.rox`` objects directly under ``prefix``, sorted; hidden names (``.x.rox``) left
    out, as a local ``*.rox`` leaves them out."""
    return sorted(
        u
        for u in store.listdir(prefix)
        if u.endswith(".rox") and not u.rsplit("/", 1)[1].startswith(".")
    )


def _hidden_match(pattern: str, url: str) -> bool:
    """Whether a wildcard of ``pattern`` (``bucket/path``, no scheme) matched a hidden name
    in ``url``, which Python's glob does not do (``*`` skips ``.x``; ``.*`` matches it).

    >>> _hidden_match("b/t/*.rox", "gs://b/t/.x.rox"), _hidden_match("b/*/x.rox", "gs://b/.d/x.rox")
    (True, True)
    >>> _hidden_match("b/t/.*.rox", "gs://b/t/.x.rox"), _hidden_match("b/.d/*", "gs://b/.d/x.rox")
    (False, False)
    >>> _hidden_match("b/d/*.rox", "memory:///b/d/._x.rox"), _hidden_match("b/d/*/", "gs://b/d/.old")
    (True, True)
    """
    # (memory:// lists "/b/d/x.rox", a pattern may end in "/": compared without them)
    parts = url.split("://", 1)[1].strip("/").split("/")
    wanted = pattern.strip("/").split("/")
    return len(parts) == len(wanted) and any(
        name.startswith(".") and not want.startswith(".") and re.search(r"[*?\[]", want)
        for want, name in zip(wanted, parts, strict=True)
    )


def _resolve_url(store: ObjectStore, entry: str, roxxel_names: bool) -> tuple[list[str], str]:
    if "*" in entry or "?" in entry:
        # as a local path's glob (Python's, not recursive, as roxxel's): ** is *, one level
        # (fsspec's ** would descend into every prefix below, other sets included)
        # Each match resolves as a local glob's does: a prefix to its *.rox objects (and none
        # there is an error), an object as itself (a set's manifest is no shard).
        pattern = re.sub(r"\*\*+", "*", entry.split("://", 1)[1])
        found = []
        for url, is_prefix in store.glob(f"{store.protocol}://{pattern}"):
            if _hidden_match(pattern, url) or url.endswith(".manifest.json"):
                continue
            if not is_prefix:
                found.append(url)
                continue
            inside = _prefix_shards(store, url)
            if not inside:
                return [], f"the prefix {url!r} that the glob {entry!r} matches (no *.rox in it)"
            found.extend(inside)
        return found, f"the glob {entry!r} (no .rox object matches)"
    if entry.endswith("/") or store.isdir(entry):
        found = _prefix_shards(store, entry.rstrip("/"))
        manifests = {u for u in store.listdir(entry.rstrip("/")) if u.endswith(MANIFEST_SUFFIX)}
        refuse_lost_shards(
            found, entry, from_zero=False, has_manifest=lambda p: p + MANIFEST_SUFFIX in manifests
        )
        return found, f"the prefix {entry!r} (no *.rox object under it)"
    if store.exists(entry):
        return [entry], ""
    prefix = entry[: -len(".rox")] if entry.endswith(".rox") else entry
    parent, base = prefix.rsplit("/", 1)
    listing = store.listdir(parent)
    if roxxel_names:
        for pattern in (re.escape(base) + r"_.*\.rox", re.escape(base) + r".*\.rox"):
            found = sorted(u for u in listing if re.fullmatch(pattern, u.rsplit("/", 1)[1]))
            if found:
                return found, ""
        return [], f"{entry!r} (no object, no {base}*.rox objects beside it)"
    numbered = re.compile(re.escape(base) + r"_\d{4,}\.rox")
    found = [u for u in listing if numbered.fullmatch(u.rsplit("/", 1)[1])]
    if any(u == prefix + ".manifest.json" for u in listing):
        found.sort(key=_number)
    else:
        refuse_lost_shards(found, entry, from_zero=True, has_manifest=lambda p: False)
        found.sort()
    return found, f"{entry!r} (no object, no {base}_NNNN.rox objects beside it)"


def remote_manifest(store: ObjectStore, manifest_url: str) -> Manifest | None:
    """The manifest of a set in a bucket, checked against the objects named like its shards;
    None when the set has none. A set whose write has not finished is refused."""
    try:
        text = store.read_all(manifest_url)
    except FileNotFoundError:
        return None
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RoxFormatError(
            manifest_url,
            f"the manifest is not UTF-8 JSON ({e})",
            "delete it (the shards read without it) or re-create the shard set",
        ) from None
    m = Manifest.from_json(decoded, manifest_url)
    if m.pending is not None:
        raise RoxFormatError(
            manifest_url,
            f"a write of this set (write {m.pending.write_id}) has not finished: it is still "
            "running, or it was interrupted while it put its shards in place, so the objects "
            "may mix two writes",
            "wait for the write to finish, or run it again with if_exists='overwrite'",
        )
    members = member_pattern(os.path.basename(manifest_url))
    parent = manifest_url.rsplit("/", 1)[0]
    names = [u.rsplit("/", 1)[1] for u in store.listdir(parent)]
    objects = {n for n in names if members.fullmatch(n)}
    extras = sorted(objects - set(m.shards))
    if extras:
        raise RoxFormatError(
            f"{parent}/{extras[0]}",
            f"{len(extras)} object(s) named like shards of this set are not in its manifest "
            f"{manifest_url} ({', '.join(extras[:8])}): no write of this set made them",
            "rename them if they belong to another set, or run the write again; to read the "
            "objects without grain_rox's checks, delete the manifest",
        )
    missing = sorted(set(m.shards) - objects)
    if missing:
        raise RoxFormatError(
            manifest_url,
            f"{len(missing)} shard(s) that the manifest records are missing "
            f"({', '.join(missing[:8])})",
            "restore them from a copy of the set, or run the write again",
        )
    return m


def object_sha256(ref: ObjectRef, on_bytes: Callable[[int], None] | None = None) -> str:
    """The sha256 of a whole object, streamed in 8 MiB ranged reads (bounded memory)."""
    digest = hashlib.sha256()
    size = ref.info.size
    pins = {ref.url: ref.info}
    for lo in range(0, size, _HASH_CHUNK):
        data = read_pinned(ref.store, [(ref.url, lo, min(size, lo + _HASH_CHUNK))], pins)[0]
        digest.update(data)
        if on_bytes is not None:
            on_bytes(len(data))
    return digest.hexdigest()


def check_object_checksum(
    ref: ObjectRef, record: ShardRecord, on_bytes: Callable[[int], None] | None = None
) -> bool:
    """Compare an object's sha256 with its manifest record; False if none is recorded."""
    if record.sha256 is None:
        return False
    actual = object_sha256(ref, on_bytes)
    if actual != record.sha256:
        raise RoxFormatError(
            ref.url,
            f"sha256 is {actual} but the manifest records {record.sha256}: the object's "
            "bytes are damaged or were rewritten",
            "restore the shard from a good copy or re-create the set",
        )
    return True
