"""Publish a shard set written locally to a bucket, so that no reader ever opens half of it.

A bucket has no rename, but an object appears only when its upload completes, and fsspec's
``mode="create"`` makes an upload fail if the name was taken (GCS ``ifGenerationMatch=0``, S3
``If-None-Match: *``). :func:`publish_to_bucket` uses both:

1. it writes the set's manifest with ``pending`` set (create-only when the set is new). From
   now on :func:`grain_rox._format._remote_set.remote_manifest` refuses the set, naming the
   write, instead of opening a mix of two writes;
2. it uploads each shard, create-only (an object of the same name from the previous write is
   deleted first): a write that raced this one fails instead of being overwritten;
3. it deletes the previous write's shards that the new set does not have;
4. it checks that every shard object holds the bytes it uploaded (their md5, from one
   listing) and records each object's content hash in the final manifest, which it writes
   after checking that the manifest is still its own pending one (another writer's would have
   changed its version). A reader refuses an object whose content hash is not the recorded
   one, so a shard replaced later, or by a concurrent writer, is refused rather than read.

A request retried after its answer was lost is taken as done when it had already taken
effect: an upload whose name holds these very bytes, a delete of an object already gone.

A writer killed before step 1 leaves the previous set as it was (its uploads had not started);
one killed after it leaves a set that is refused until a write finishes (run it again with
``if_exists="overwrite"``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
from functools import partial
from typing import Any

from grain_rox._format._manifest import (
    Manifest,
    file_hexdigest,
    load_manifest,
    manifest_path_for,
    member_pattern,
)
from grain_rox._format._object_store import ObjectStore, store_for
from grain_rox._format._remote_set import object_sha256
from grain_rox._format._remote_shard import ObjectRef
from grain_rox._format._shard_set import shard_number

_log = logging.getLogger("grain_rox")


def _set_objects(store: ObjectStore, parent: str, manifest_name: str) -> tuple[list[str], bool]:
    members = member_pattern(manifest_name)
    names = [u.rsplit("/", 1)[1] for u in store.listdir(parent)]
    return sorted(n for n in names if members.fullmatch(n)), manifest_name in names


def _pending(store: ObjectStore, manifest_url: str) -> bool:
    """Whether the set's manifest marks a write that has not finished (False: unreadable)."""
    try:
        return (
            Manifest.from_json(store.read_all(manifest_url).decode(), manifest_url).pending
            is not None
        )
    except (OSError, ValueError):
        return False


def _existing_set(
    store: ObjectStore, target: str, manifest_name: str, if_exists: str
) -> tuple[list[str], bool]:
    """The set's shard objects and whether its manifest exists; refused unless overwriting,
    and refused for one member (``x_0003.rox``) of a set that has others."""
    existing, has_manifest = _set_objects(store, target.rsplit("/", 1)[0], manifest_name)
    name = target.rsplit("/", 1)[1]
    others = [n for n in existing if n != name]
    if shard_number(name) >= 0 and others:
        # A bucket's set is published whole: its manifest would record this member only and
        # the publish would delete the others.
        raise ValueError(
            f"{target}: writing one member of a set in a bucket would replace the whole set, "
            f"whose other {len(others)} shard object(s) ({', '.join(others[:4])}"
            f"{', ...' if len(others) > 4 else ''}) would be deleted. Fix: rewrite the whole "
            "set (its name without _NNNN, with max_shard_bytes= and if_exists='overwrite'), "
            "or write this member under another set name and read both with a list of URLs"
        )
    if (existing or has_manifest) and if_exists != "overwrite":
        what = "already exists in the bucket"
        if has_manifest and _pending(store, f"{target.rsplit('/', 1)[0]}/{manifest_name}"):
            what = "is an unfinished write (its manifest is pending: a write was killed, or runs)"
        raise FileExistsError(
            f"{target}: the shard set {what} ({len(existing)} shard "
            f"object(s){', and its manifest' if has_manifest else ''}). Fix: pass "
            "if_exists='overwrite' (grain-rox convert --if-exists overwrite) to replace it, or "
            "write another name; appending to a set in a bucket is not supported"
        )
    return existing, has_manifest


def check_can_publish(
    target: str, *, if_exists: str, storage_options: dict[str, Any] | None = None
) -> None:
    """Refuse, before any document is read, a write to a set that exists in the bucket when
    ``if_exists`` does not allow replacing it (the publish checks again at the end)."""
    name = os.path.basename(manifest_path_for(target))
    store = store_for(target, storage_options)
    existing, has_manifest = _existing_set(store, target, name, if_exists)
    # (an empty listing: a new set, or no bucket)
    if not existing and not has_manifest and (root := store.missing_bucket(target)):
        raise FileNotFoundError(
            f"{target}: the bucket {root} does not exist, or these credentials and endpoint "
            "cannot see it. Fix: create the bucket, or check the URL and the storage_options "
            "(endpoint, credentials)"
        )


def publish_to_bucket(
    local_paths: list[str],
    local_manifest: str,
    target: str,
    *,
    if_exists: str,
    storage_options: dict[str, Any] | None = None,
) -> tuple[list[str], str]:
    """Upload a set written locally (``local_paths`` and its manifest) beside ``target`` (the
    set's URL, ``gs://b/data/train.rox``); return the shard URLs and the manifest URL.

    Raises ``FileExistsError`` when the set exists and ``if_exists="error"``, and ``OSError``
    when another writer changed the set during this one (nothing of it is then readable until
    a write finishes).
    """
    store = store_for(target, storage_options)
    parent = target.rsplit("/", 1)[0]
    manifest_name = os.path.basename(local_manifest)
    murl = f"{parent}/{manifest_name}"
    existing, has_manifest = _existing_set(store, target, manifest_name, if_exists)
    final = load_manifest(local_manifest)
    assert final is not None
    final = dataclasses.replace(
        final,
        shards={n: dataclasses.replace(r, mtime_ns=None) for n, r in final.shards.items()},
    )
    pending = dataclasses.replace(final, shards={}, pending=final)
    _put_manifest(store, murl, pending, create=not has_manifest)
    written_version = store.info(murl).version
    urls, md5s = [], {}
    for path in local_paths:
        url = f"{parent}/{os.path.basename(path)}"
        md5s[url] = file_hexdigest(path, partial(hashlib.md5, usedforsecurity=False))
        if os.path.basename(path) in existing:
            _delete(store, url, "deleting the previous shard")
        _upload(store, path, url, md5s[url])
        urls.append(url)
    for name in existing:
        if name not in final.shards:
            _delete(store, f"{parent}/{name}", "deleting the previous shard")
    # Each object must hold the bytes this write uploaded (another writer's upload or a
    # replaced object is caught here); its content hash goes into the manifest, and a reader
    # refuses an object whose hash differs.
    infos = store.infos(urls)
    tags = {}
    for url in urls:
        info = infos[url]
        if info.md5 and info.md5 != md5s[url]:
            raise OSError(
                f"{url}: the object's md5 is {info.md5}, not that of the shard this write "
                f"uploaded ({md5s[url]}): another writer replaced it during this write; the set "
                "is refused until one write finishes. Fix: run one write of the set at a time, "
                "then run it again with if_exists='overwrite'"
            )
        tags[os.path.basename(url)] = info.content_tag or None
    final = dataclasses.replace(
        final,
        shards={n: dataclasses.replace(r, object_tag=tags.get(n)) for n, r in final.shards.items()},
    )
    now = store.info(murl).version
    if now != written_version:
        raise OSError(
            f"{murl}: another writer changed the set's manifest while this write uploaded its "
            f"shards (version {written_version!r} -> {now!r}); the set is refused until one "
            "write finishes. Fix: run one write of the set at a time, then run it again with "
            "if_exists='overwrite'"
        )
    _put_manifest(store, murl, final, create=False)
    _log.info("published %d shard(s) and %s", len(urls), murl)
    return urls, murl


def _upload(store: ObjectStore, path: str, url: str, md5: str) -> None:
    """Upload ``path`` to ``url`` create-only. If the name is taken by these very bytes, an
    earlier attempt whose answer was lost (a retried request) had already put them: done."""
    try:
        upload = partial(store.fs.put_file, path, url, mode="create")
        store.call("uploading the shard", url, upload, bounded=False)  # (takes its size's time)
    except FileExistsError as e:
        there = store.info(url)
        if there.md5 and there.md5 != md5:
            raise _another_writer(url, "uploaded the shard") from e
        if not there.md5 and not _same_bytes(ObjectRef(store, there), path):
            # (an S3 multipart ETag holds no md5: the object is read back and compared)
            raise _another_writer(url, "uploaded the shard") from e
        _log.info("%s: already uploaded by an earlier attempt of this request", url)


def _same_bytes(ref: ObjectRef, path: str) -> bool:
    """Whether object ``ref`` holds the bytes of file ``path``, compared by sha256 (the
    object read back in ranges: a retried upload whose store reports no md5)."""
    if ref.info.size != os.path.getsize(path):
        return False
    return object_sha256(ref) == file_hexdigest(path, hashlib.sha256)


def _another_writer(url: str, did: str) -> FileExistsError:
    """The error of a create-only write that found ``url`` taken by other bytes."""
    return FileExistsError(
        f"{url}: another writer {did} first (the store refused to replace it): two writes of "
        "the set ran at once, and it is refused until one finishes. Fix: run one write of "
        "the set at a time, then run it again with if_exists='overwrite'"
    )


def _delete(store: ObjectStore, url: str, what: str) -> None:
    """Delete ``url``; one already gone (an earlier attempt's, whose answer was lost) is fine."""
    with contextlib.suppress(FileNotFoundError):
        store.call(what, url, partial(store.fs.rm_file, url))


def _put_manifest(store: ObjectStore, url: str, manifest: Manifest, *, create: bool) -> None:
    data = manifest.to_json().encode("utf-8")
    try:
        store.call(
            "writing the manifest",
            url,
            lambda: store.fs.pipe_file(url, data, mode="create" if create else "overwrite"),
        )
    except FileExistsError as e:  # create-only: fine if an earlier attempt wrote these bytes
        if store.read_all(url) != data:
            raise _another_writer(url, "created the set's manifest") from e
