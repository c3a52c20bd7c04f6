"""What a corpus learns about each shard when it opens, and what identifies its content.

:func:`load_shard_facts` reads every shard's footer (O(1) per shard), its file version, its
manifest record (checked against the footer) and, while the total stays under a budget, walks
its whole index. :func:`check_unchanged` tells whether a shard's bytes are still the ones its
manifest records, hashing only a shard whose size or mtime changed, and
:func:`content_fingerprint` hashes what identifies a corpus's data for checkpoints.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
from typing import Any, NamedTuple

import numpy as np

from grain_rox._format._hash_cache import cached_sha256
from grain_rox._format._log_once import log_once
from grain_rox._format._manifest import Manifest, ShardRecord, manifest_path_for
from grain_rox._format._mapped_shard import FileIdentity, file_identity
from grain_rox._format._object_store import ObjectStore, is_url, store_for
from grain_rox._format._remote_set import remote_manifest
from grain_rox._format._remote_shard import ObjectRef, open_object, read_pinned, read_tails
from grain_rox._format._rox_format import (
    RoxFormatError,
    ShardHeader,
    check_index,
    check_same_dtype,
    read_header,
    read_index,
)
from grain_rox._format._shard_set import current_manifest

_SAMPLE_BYTES = 4096


class ShardFacts(NamedTuple):
    """Per-shard facts of a corpus, one entry per shard in order (see :func:`load_shard_facts`).

    Attributes:
      headers: each shard's footer facts.
      records: each shard's manifest record, or None (no manifest, or not in it).
      manifests: the manifests that describe some of the shards, by path.
      uniform: whether every block of a shard has its first block's size; None while its
        index has not been walked.
      identities: each shard's file version when it was opened (an :class:`ObjectRef` for
        an object in a bucket).
      indexes: a remote shard's block index when it came with its footer, else None.
    """

    headers: list[ShardHeader]
    records: list[ShardRecord | None]
    manifests: dict[str, Manifest]
    uniform: list[bool | None]
    identities: list[FileIdentity | ObjectRef]
    indexes: list[np.ndarray | None]


def load_shard_facts(
    paths: list[str],
    *,
    index_check_limit: int,
    storage_options: dict[str, Any] | None = None,
) -> ShardFacts:
    """Read and check what a corpus needs to know about each shard of ``paths``.

    Args:
      paths: the shard files, in the corpus's order.
      index_check_limit: walk each shard's whole index now while the indexes walked so far
        total at most this many entries; the rest are walked when first mapped.
      storage_options: fsspec options for the paths that are URLs (None: fsspec's config).

    Raises :class:`RoxFormatError` naming the first shard that is damaged, disagrees with its
    manifest, or has another token dtype than the first shard.
    """
    facts = ShardFacts([], [], {}, [], [], [])
    tried: dict[str, Manifest | None] = {}
    index_budget = index_check_limit
    opened = _open_objects([p for p in paths if is_url(p)], storage_options)
    for path in paths:
        index = None
        if is_url(path):
            ref, header, index = opened[path]
            facts.identities.append(ref)
        else:
            # Before the footer is read: a file replaced after this stat is refused when mapped.
            facts.identities.append(file_identity(os.stat(path)))
            header = read_header(path)
        facts.indexes.append(index)
        if facts.headers:
            check_same_dtype(facts.headers[0], header)
        mpath = manifest_path_for(path)
        if mpath not in tried:
            tried[mpath] = (
                remote_manifest(store_for(path, storage_options), mpath)
                if is_url(path)
                else current_manifest(mpath)
            )
        manifest = tried[mpath]
        record = manifest.check_shard(header, mpath) if manifest else None
        if record is not None and isinstance(facts.identities[-1], ObjectRef):
            _check_object_tag(facts.identities[-1], record, mpath)
        if manifest is not None and record is not None:
            facts.manifests[mpath] = manifest
        if index is not None and header.num_blocks:  # a remote index that came with the footer
            facts.uniform.append(check_index(header, index))
        elif 0 < header.num_blocks <= index_budget and not is_url(path):
            # Small corpora: walk every index now. Large ones: each shard's index is walked
            # when the shard is first mapped, so opening stays O(1) per shard.
            index_budget -= header.num_blocks
            facts.uniform.append(check_index(header, read_index(header)))
        else:
            facts.uniform.append(True if header.num_blocks == 0 else None)
        facts.headers.append(header)
        facts.records.append(record)
    return facts


def _open_objects(
    urls: list[str], storage_options: dict[str, Any] | None
) -> dict[str, tuple[ObjectRef, ShardHeader, np.ndarray | None]]:
    """Each object's facts, footer and (small) index: one listing per prefix and one
    concurrent batch of tail reads, however many shards."""
    stores: dict[int, tuple[ObjectStore, list[str]]] = {}
    for url in dict.fromkeys(urls):
        store = store_for(url, storage_options)
        stores.setdefault(id(store), (store, []))[1].append(url)
    refs = []
    for store, group in stores.values():
        infos = store.infos(group)
        refs += [ObjectRef(store, infos[url]) for url in group]
    tails = read_tails(refs)
    return {ref.url: (ref, *open_object(ref, tail)) for ref, tail in zip(refs, tails, strict=True)}


def _check_object_tag(ref: ObjectRef, record: ShardRecord, manifest_path: str) -> None:
    """Raise if a shard object's content hash is not the one its manifest recorded when the
    set was published (the object was replaced since, or by a concurrent writer)."""
    now = ref.info.content_tag
    if not record.object_tag and not now:  # a store that hashes nothing (memory://, ...)
        log_once(
            logging.WARNING,
            f"{manifest_path}: this store ({ref.store.protocol}://) reports no content hashes "
            "for its objects, so none is recorded or compared: a shard replaced before the "
            "corpus is opened is served until grain-rox verify checks every shard against the "
            "manifest's sha256 (one replaced while it is read is refused by its version)",
        )
    elif not record.object_tag:  # copied in by another tool
        log_once(
            logging.WARNING,
            f"{manifest_path} records no content hashes for its objects (a set copied into "
            "the bucket by another tool, not published by write_rox): a shard changed since "
            "the copy is served until grain-rox verify checks every shard against the "
            "manifest's sha256; run it once, or publish the set with write_rox / grain-rox "
            "convert",
        )
    if record.object_tag and now and now != record.object_tag:
        raise RoxFormatError(
            ref.url,
            f"the object's content hash is {now!r} but {manifest_path} records "
            f"{record.object_tag!r}: the object was replaced after the set was written",
            "write the set again (if_exists='overwrite') or restore the object from a copy "
            "of the set; grain-rox verify checks every shard against the manifest's sha256",
        )


def check_unchanged(path: str, record: ShardRecord, *, twins: bool = False) -> None:
    """Raise if a shard's bytes are not the ones its manifest records (hashing only if its
    size or mtime_ns changed since the write, or if ``twins``: another shard of its set
    records the same size and mtime_ns, so a swap of the two would change neither)."""
    if record.sha256 is None or record.mtime_ns is None:
        return  # a manifest from before grain_rox recorded mtimes: not checked (re-write it)
    st = os.stat(path)
    if st.st_size == record.file_size and st.st_mtime_ns == record.mtime_ns and not twins:
        return
    digest = cached_sha256(path, st)
    if digest != record.sha256:
        raise RoxFormatError(
            path,
            f"its content changed after it was written: its sha256 is {digest} but "
            f"{manifest_path_for(path)} records {record.sha256}",
            "re-create the shard set (or restore the shard from a copy); a checkpoint made on "
            "the data as written cannot continue on these bytes",
        )


def _remote_samples(
    headers: list[ShardHeader], identities: list[FileIdentity | ObjectRef]
) -> dict[int, list[bytes]]:
    """The first and last 4 KiB of every remote shard's tokens, read concurrently (one call
    per object store)."""
    stores: dict[int, tuple[ObjectStore, list[tuple[int, str, int, int]]]] = {}
    for s, (header, identity) in enumerate(zip(headers, identities, strict=True)):
        if isinstance(identity, ObjectRef) and header.raw_size:
            first = min(_SAMPLE_BYTES, header.raw_size)
            last = max(0, header.raw_size - _SAMPLE_BYTES)
            spans = stores.setdefault(id(identity.store), (identity.store, []))[1]
            spans += [(s, identity.url, 0, first), (s, identity.url, last, header.raw_size)]
    out: dict[int, list[bytes]] = {}
    pins = {i.url: i.info for i in identities if isinstance(i, ObjectRef)}
    for store, spans in stores.values():
        found = read_pinned(store, [(url, a, b) for _, url, a, b in spans], pins)
        for (s, *_), data in zip(spans, found, strict=True):
            out.setdefault(s, []).append(data)
    return out


def content_fingerprint(
    headers: list[ShardHeader],
    records: list[ShardRecord | None],
    identities: list[FileIdentity | ObjectRef],
) -> str:
    """A short hash of a corpus's content (see :attr:`grain_rox.RoxCorpus.fingerprint`).

    Per shard: its name, size and footer, the manifest's sha256 (after :func:`check_unchanged`)
    and its first and last 4 KiB of tokens; for an object in a bucket, also the content hash
    the store keeps for it (GCS's crc32c, S3's ETag), which any rewrite of other bytes changes.
    """
    digest = hashlib.sha1()
    samples = _remote_samples(headers, identities)
    # shards written in one tick of a coarse clock can record the same size and mtime_ns:
    # those are hashed (once per file version), as two of them swapped would match by both
    seen: collections.Counter[tuple[int, int | None]] = collections.Counter(
        (r.file_size, r.mtime_ns) for r in records if r is not None and r.mtime_ns is not None
    )
    for s, (header, record, identity) in enumerate(zip(headers, records, identities, strict=True)):
        if isinstance(identity, ObjectRef):
            facts = [*header.facts(), record.sha256 if record else None, identity.info.content_tag]
            digest.update(json.dumps(facts).encode())
            for data in samples.get(s, ()):
                digest.update(data)
            digest.update(str(s).encode())
            continue
        if record is not None:
            twins = seen[(record.file_size, record.mtime_ns)] > 1
            check_unchanged(header.path, record, twins=twins)
        digest.update(json.dumps([*header.facts(), record.sha256 if record else None]).encode())
        if header.raw_size:
            with open(header.path, "rb") as f:
                digest.update(f.read(_SAMPLE_BYTES))
                f.seek(max(0, header.raw_size - _SAMPLE_BYTES))
                digest.update(f.read(min(_SAMPLE_BYTES, header.raw_size)))
        digest.update(str(s).encode())
    return digest.hexdigest()[:16]
