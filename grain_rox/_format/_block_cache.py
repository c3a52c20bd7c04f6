"""A bounded, per-process cache of fixed-size blocks of remote objects, least recently used out.

Reads of byte ranges go through :meth:`BlockCache.read`: the blocks the ranges touch that are
not cached are fetched together (runs of adjacent missing blocks as one range each, all runs
in one concurrent call), kept up to the byte budget, and the ranges cut out of them. With a
budget of 0 nothing is kept and the ranges themselves are fetched, nearby ones merged.

``GRAIN_ROX_OBJECT_CACHE_MB`` (default 256) sets the budget and ``GRAIN_ROX_OBJECT_BLOCK_KB``
(default 64) the block size, read when the process first reads an object.

>>> fetched = []
>>> def fetch(ranges):
...     fetched.extend(ranges)
...     return [bytes(range(a, b)) for a, b in ranges]
>>> cache = BlockCache(capacity_bytes=64, block_bytes=8)
>>> cache.read(("obj", "v1"), [(3, 5), (9, 12)], fetch, size=40)
[b'\\x03\\x04', b'\\t\\n\\x0b']
>>> fetched  # blocks 0 and 1, adjacent: one range
[(0, 16)]
>>> cache.read(("obj", "v1"), [(10, 18)], fetch, size=40), fetched[1:]
([b'\\n\\x0b\\x0c\\r\\x0e\\x0f\\x10\\x11'], [(16, 24)])
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable, Hashable, Sequence

from grain_rox._format._object_store import count

Fetch = Callable[[Sequence[tuple[int, int]]], list[bytes]]
# (object number, a, b) spans of several objects -> their bytes, in one round trip.
FetchMany = Callable[[Sequence[tuple[int, int, int]]], list[bytes]]

# Ranges closer than this are fetched as one when nothing is cached: one request instead of
# two costs less than the bytes between them.
_MERGE_GAP = 32 << 10


class BlockCache:
    """LRU blocks of ``block_bytes`` of objects, at most ``capacity_bytes`` in all.

    Args:
      capacity_bytes: the budget; 0 disables caching (ranges are fetched as asked).
      block_bytes: the block size (objects are cut at multiples of it).
    """

    def __init__(self, capacity_bytes: int, block_bytes: int) -> None:
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be > 0, got {block_bytes}")
        self.capacity_bytes = max(0, capacity_bytes)
        self.block_bytes = block_bytes
        self._blocks: collections.OrderedDict[tuple[Hashable, int], bytes] = (
            collections.OrderedDict()
        )
        self._held = 0
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()
            self._held = 0

    def read(
        self, key: Hashable, ranges: Sequence[tuple[int, int]], fetch: Fetch, *, size: int
    ) -> list[bytes]:
        """Bytes ``[a, b)`` of the object ``key`` (``size`` bytes long) for each range."""
        return self.read_objects(
            [(key, size, ranges)], lambda spans: fetch([(a, b) for _, a, b in spans])
        )[0]

    def read_objects(
        self, objects: Sequence[tuple[Hashable, int, Sequence[tuple[int, int]]]], fetch: FetchMany
    ) -> list[list[bytes]]:
        """:meth:`read` of several objects, given as ``(key, size, ranges)``, with one call of
        ``fetch`` for every object's missing blocks: it gets ``(object number, a, b)`` spans and
        returns their bytes, so all of a batch's requests can be in flight at once."""
        if self.capacity_bytes == 0:
            return _read_merged(objects, fetch)
        bb = self.block_bytes
        haves: list[dict[int, bytes]] = []
        missing: list[list[int]] = []
        hits = misses = 0
        with self._lock:
            for key, _, ranges in objects:
                wanted = {i for a, b in ranges if b > a for i in range(a // bb, (b - 1) // bb + 1)}
                have: dict[int, bytes] = {}
                absent = []
                for i in sorted(wanted):
                    block = self._blocks.get((key, i))
                    if block is None:
                        absent.append(i)
                    else:
                        self._blocks.move_to_end((key, i))
                        have[i] = block
                haves.append(have)
                missing.append(absent)
                hits, misses = hits + len(have), misses + len(absent)
        count(cache_hits=hits, cache_misses=misses)
        runs = [(o, lo, hi) for o, absent in enumerate(missing) for lo, hi in _runs(absent)]
        if runs:
            spans = [(o, lo * bb, min(objects[o][1], (hi + 1) * bb)) for o, lo, hi in runs]
            for (o, lo, hi), data in zip(runs, fetch(spans), strict=True):
                for i in range(lo, hi + 1):
                    haves[o][i] = data[(i - lo) * bb : (i - lo + 1) * bb]
            for o, absent in enumerate(missing):
                if absent:
                    self._keep(objects[o][0], {i: haves[o][i] for i in absent})
        return [
            [_cut(have, bb, a, b) for a, b in ranges]
            for have, (_, _, ranges) in zip(haves, objects, strict=True)
        ]

    def _keep(self, key: Hashable, blocks: dict[int, bytes]) -> None:
        with self._lock:
            for i, block in blocks.items():
                if (key, i) not in self._blocks:
                    self._blocks[(key, i)] = block
                    self._held += len(block)
            while self._held > self.capacity_bytes and self._blocks:
                _, old = self._blocks.popitem(last=False)
                self._held -= len(old)


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    """Sorted block ids as (first, last) runs of consecutive ids."""
    runs: list[tuple[int, int]] = []
    for i in ids:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def _cut(blocks: dict[int, bytes], bb: int, a: int, b: int) -> bytes:
    if b <= a:
        return b""
    first, last = a // bb, (b - 1) // bb
    if first == last:
        return blocks[first][a - first * bb : b - first * bb]
    return b"".join(blocks[i] for i in range(first, last + 1))[a - first * bb : b - first * bb]


def _read_merged(
    objects: Sequence[tuple[Hashable, int, Sequence[tuple[int, int]]]], fetch: FetchMany
) -> list[list[bytes]]:
    """Fetch every object's ranges, nearby ones of an object merged into one request, in one
    call; cut each range back out."""
    spans: list[list[int]] = []  # [object, a, b]
    where: list[list[int]] = []  # per object, per range: its span
    for o, (_, _, ranges) in enumerate(objects):
        order = sorted(range(len(ranges)), key=lambda k: ranges[k])
        index = [0] * len(ranges)
        first = len(spans)
        for k in order:
            a, b = ranges[k]
            if len(spans) > first and a <= spans[-1][2] + _MERGE_GAP:
                spans[-1][2] = max(spans[-1][2], b)
            else:
                spans.append([o, a, b])
            index[k] = len(spans) - 1
        where.append(index)
    data = fetch([(o, a, b) for o, a, b in spans]) if spans else []
    return [
        [
            data[j][a - spans[j][1] : b - spans[j][1]]
            for (a, b), j in zip(ranges, where[o], strict=True)
        ]
        for o, (_, _, ranges) in enumerate(objects)
    ]


_cache: BlockCache | None = None
_cache_lock = threading.Lock()


def shared_cache() -> BlockCache:
    """This process's cache, sized from the environment on first use."""
    global _cache
    if _cache is None:
        with _cache_lock:
            if _cache is None:
                mb = float(os.environ.get("GRAIN_ROX_OBJECT_CACHE_MB", "256"))
                kb = int(os.environ.get("GRAIN_ROX_OBJECT_BLOCK_KB", "64"))
                _cache = BlockCache(int(mb * (1 << 20)), kb << 10)
    return _cache


def configure_cache(*, capacity_mb: float | None = None, block_kb: int | None = None) -> None:
    """Replace this process's cache (emptied) with one of the given budget and block size.

    >>> configure_cache(capacity_mb=0)  # no caching: ranges are fetched as asked
    >>> shared_cache().capacity_bytes
    0
    >>> configure_cache(capacity_mb=256, block_kb=64)
    """
    global _cache
    old = shared_cache()
    with _cache_lock:
        _cache = BlockCache(
            old.capacity_bytes if capacity_mb is None else int(capacity_mb * (1 << 20)),
            old.block_bytes if block_kb is None else block_kb << 10,
        )
