"""One shard in a bucket, read by ranged requests: the remote counterpart of a memory map.

:func:`open_object` reads a shard's footer (and, for a small shard, its whole index) with one
ranged request from its end; :class:`RemoteShard` then serves token ranges and window gathers
through the process's :class:`grain_rox._format._block_cache.BlockCache`, each batch's missing
blocks fetched concurrently in one call. Its object version is checked again when a process
first reads it, so an object rewritten after the corpus was opened is refused, not mixed in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from grain_rox._format._block_cache import shared_cache
from grain_rox._format._object_store import ObjectChangedError, ObjectInfo, ObjectStore
from grain_rox._format._rox_format import (
    INDEX_DTYPE,
    INDEX_ENTRY_SIZE,
    RoxFormatError,
    ShardHeader,
    parse_header,
)

# The footer is read with this much before it, so a small shard's index comes in the same
# request.
_TAIL_BYTES = 64 << 10


@dataclasses.dataclass(frozen=True)
class ObjectRef:
    """Which object version a corpus opened for a shard (pickled with the corpus).

    Attributes:
      store: the object store it lives in.
      info: its size, version and content tag when the corpus was opened.
    """

    store: ObjectStore
    info: ObjectInfo

    @property
    def url(self) -> str:
        return self.info.url


def read_tails(refs: list[ObjectRef]) -> list[bytes]:
    """The last 64 KiB (or all) of each object: footers, and small indexes with them, read
    concurrently, one call per object store."""
    out: list[bytes] = [b""] * len(refs)
    by_store: dict[int, list[int]] = {}
    for i, ref in enumerate(refs):
        if ref.info.size:
            by_store.setdefault(id(ref.store), []).append(i)
    for members in by_store.values():
        store = refs[members[0]].store
        spans = [(refs[i].url, _tail_start(refs[i]), refs[i].info.size) for i in members]
        pins = {refs[i].url: refs[i].info for i in members}
        for i, data in zip(members, read_pinned(store, spans, pins), strict=True):
            out[i] = data
    return out


def _tail_start(ref: ObjectRef) -> int:
    return max(0, ref.info.size - _TAIL_BYTES)


def open_object(ref: ObjectRef, tail: bytes | None = None) -> tuple[ShardHeader, np.ndarray | None]:
    """Read and check a remote shard's footer (from ``tail``, its :func:`read_tails`, when
    given); returns it and, when the tail also held the whole block index, the index (else
    None: :class:`RemoteShard` fetches it)."""
    url, size = ref.url, ref.info.size
    tail_start = _tail_start(ref)
    pins = {url: ref.info}
    if tail is None:
        tail = read_pinned(ref.store, [(url, tail_start, size)], pins)[0] if size else b""

    def read_at(offset: int, n: int) -> bytes:
        if offset >= tail_start:
            return tail[offset - tail_start : offset - tail_start + n]
        return read_pinned(ref.store, [(url, offset, offset + n)], pins)[0]

    header = parse_header(url, size, read_at)
    if header.num_blocks == 0:
        return header, np.empty((0,), INDEX_DTYPE)
    if header.index_offset < tail_start:
        return header, None
    at = header.index_offset - tail_start
    index = np.frombuffer(tail, INDEX_DTYPE, count=header.num_blocks, offset=at).copy()
    return header, index


class RemoteShard:
    """A remote shard's tokens and block index, read on demand (see the module docstring).

    Args:
      header: the shard's footer facts, read when the corpus was opened.
      ref: the object version the corpus opened; another version is refused.
      index: the block index if it was read with the footer, else None (fetched here).
      now: the object's facts looked up just now (None: looked up here).
    """

    tokens = None  # no memory map: read through slice() and gather()

    def __init__(
        self,
        header: ShardHeader,
        ref: ObjectRef,
        index: np.ndarray | None,
        now: ObjectInfo | None = None,
    ) -> None:
        if now is None:  # the object's facts now, unless the caller looked several up at once
            try:
                now = ref.store.info(ref.url)
            except FileNotFoundError:
                raise RoxFormatError(
                    ref.url,
                    "the object was removed after the corpus was opened",
                    "restore it, or reopen the corpus (open_rox) / make a new pipeline; a "
                    "checkpoint made on the data as opened cannot continue without it",
                ) from None
        if (now.size, now.version) != (ref.info.size, ref.info.version):
            raise RoxFormatError(
                ref.url,
                f"the object was rewritten after the corpus was opened (size {ref.info.size} "
                f"-> {now.size}, version {ref.info.version!r} -> {now.version!r})",
                "reopen the corpus (open_rox) / make a new pipeline; a checkpoint made on the "
                "data as opened cannot continue on these bytes",
            )
        self.header = header
        self.ref = ref
        self._key = (ref.url, ref.info.version)
        if index is None:
            lo = header.index_offset
            span = (ref.url, lo, lo + INDEX_ENTRY_SIZE * header.num_blocks)
            data = read_pinned(ref.store, [span], {ref.url: ref.info})[0]
            index = np.frombuffer(data, INDEX_DTYPE)
        self.ends = index

    def _read(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        return read_remote([self], [ranges])[0]

    def slice(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the shard (a new array; clipped to the shard, like a
        numpy slice)."""
        return self.spans([(start, stop)])[0]

    def spans(self, spans: list[tuple[int, int]]) -> list[np.ndarray]:
        """Tokens ``[a, b)`` for each span (clipped to the shard), read by one concurrent
        batch of ranged requests through the block cache."""
        return spans_remote([(self, spans)])[0]

    def gather(self, starts: np.ndarray, width: int) -> np.ndarray:
        """The ``width``-token windows that start at ``starts``, as an (n, width) array."""
        return gather_remote([(self, starts, width)])[0]

    def close(self) -> None:
        """Nothing to release (the cache is the process's)."""


def read_remote(
    shards: list[RemoteShard], ranges: list[list[tuple[int, int]]]
) -> list[list[bytes]]:
    """Byte ranges of several remote shards (``ranges[i]`` of ``shards[i]``) through the block
    cache, every missing block of all of them requested in one concurrent call per store: a
    batch that touches eight shards waits for one round trip, not eight."""

    def fetch(spans: Sequence[tuple[int, int, int]]) -> list[bytes]:
        out: list[bytes] = [b""] * len(spans)
        by_store: dict[int, list[int]] = {}
        for k, (o, _, _) in enumerate(spans):
            by_store.setdefault(id(shards[o].ref.store), []).append(k)
        for ks in by_store.values():
            store = shards[spans[ks[0]][0]].ref.store
            pins = {shards[spans[k][0]].ref.url: shards[spans[k][0]].ref.info for k in ks}
            wanted = [(shards[spans[k][0]].ref.url, *spans[k][1:]) for k in ks]
            got = read_pinned(store, wanted, pins)
            for k, data in zip(ks, got, strict=True):
                out[k] = data
        return out

    objects = [(sh._key, sh.header.file_size, r) for sh, r in zip(shards, ranges, strict=True)]
    return shared_cache().read_objects(objects, fetch)


def read_pinned(
    store: ObjectStore,
    spans: Sequence[tuple[str, int, int]],
    pins: Mapping[str, ObjectInfo],
) -> list[bytes]:
    """``store.read_many(spans, pins)``: the bytes of the object versions a corpus opened; an
    object rewritten or removed since is refused, naming the fix, never read."""
    try:
        return store.read_many(spans, pins)
    except ObjectChangedError as e:
        raise RoxFormatError(
            e.url,
            f"the object was rewritten or removed after the corpus was opened (it was version "
            f"{e.version!r})",
            "reopen the corpus (open_rox) / make a new pipeline; a checkpoint made on the "
            "data as opened cannot continue on these bytes",
        ) from e


def gather_remote(requests: list[tuple[RemoteShard, np.ndarray, int]]) -> list[np.ndarray]:
    """``(shard, starts, width)`` window gathers of several remote shards in one round trip
    (see :func:`read_remote`); one (n, width) array each."""
    spans = []
    for shard, starts, width in requests:
        item = shard.header.dtype.itemsize
        windows = max(0, shard.header.num_tokens - width + 1)  # as a local shard's window view:
        at = np.asarray(starts, dtype=np.int64).reshape(-1)  # a negative start counts from
        at = np.where(at < 0, at + windows, at)  # the last window, one past is an IndexError
        if at.size and (at.min() < 0 or at.max() >= windows):
            bad = np.asarray(starts).reshape(-1)[(at < 0) | (at >= windows)][:5].tolist()
            raise IndexError(
                f"window starts {bad} are out of range for {shard.ref.url}: it holds {windows} "
                f"windows of {width} tokens ({shard.header.num_tokens} tokens)"
            )
        spans.append([(a * item, (a + width) * item) for a in at.tolist()])
    out = []
    for (shard, _, width), got in zip(
        requests, read_remote([r[0] for r in requests], spans), strict=True
    ):
        rows = np.empty((len(got), width), shard.header.dtype)
        for row, data in enumerate(got):
            rows[row] = np.frombuffer(data, shard.header.dtype)
        out.append(rows)
    return out


def spans_remote(
    requests: list[tuple[RemoteShard, list[tuple[int, int]]]],
) -> list[list[np.ndarray]]:
    """Token spans ``[a, b)`` (read as numpy slices read them: a negative bound counts from
    the end, both are clipped to the shard) of several remote shards in one round trip (see
    :func:`read_remote`)."""
    ranges = []
    for shard, spans in requests:
        item, n = shard.header.dtype.itemsize, shard.header.num_tokens
        clipped = [slice(a, b).indices(n)[:2] for a, b in spans]
        ranges.append([(a * item, max(a, b) * item) for a, b in clipped])
    got = read_remote([shard for shard, _ in requests], ranges)
    return [
        [np.frombuffer(d, shard.header.dtype) for d in data]
        for (shard, _), data in zip(requests, got, strict=True)
    ]
