"""Packed chunks strung together in two flat buffers, for the packed order's row lookups.

A plan of the packed order (``_order._packed``) reads rows of many chunks at once: each row is
a run of pieces of one packed chunk (``_bin_packing.PackedChunk``). Keeping every chunk's
arrays apart meant, per plan, one cache lookup a chunk and a concatenation of all their arrays
before one vectorised gather. Here a chunk's arrays are appended to shared buffers once, when
it is packed, and a lookup is one dictionary read a row and a few vectorised index operations:

* ``firsts``: for each stored chunk, ``rows + 1`` offsets into ``spans`` (row ``r``'s pieces
  are ``spans[:, firsts[base + r] : firsts[base + r + 1]]``);
* ``spans``: ``(3, pieces)``, each piece's offset in its chunk, length and offset in its row.

When the buffers would outgrow ``max_bytes`` they are rebuilt with only the chunks the lookup
at hand needs. A buffer is never written where a lookup may already read it (growth and
rebuilds make new arrays), so lookups in other threads need no lock once they hold theirs.

>>> from grain_rox._order._bin_packing import pack_chunk
>>> store = PackStore(max_bytes=1 << 20)
>>> pack = lambda key: pack_chunk(np.array([3, 10, 12]), 16, seq_len=7, rows=3)
>>> base, firsts, spans = store.rows([7], pack)  # the chunk named 7, packed when first asked
>>> for r in range(3):  # each row's pieces: offsets in the chunk, lengths, offsets in the row
...     print(spans[:, firsts[base[0] + r] : firsts[base[0] + r + 1]].tolist())
[[3], [7], [0]]
[[0, 12], [3, 4], [0, 3]]
[[10], [2], [0]]
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from grain_rox._order._bin_packing import PackedChunk


class PackStore:
    """Packed chunks by key (any int naming a chunk and its seq_len), in flat buffers."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        # key -> (where its firsts start, rows + 1, where its pieces start, pieces)
        self._extent: dict[int, tuple[int, int, int, int]] = {}
        self._firsts = np.empty(0, dtype=np.int64)
        self._spans = np.empty((3, 0), dtype=np.int64)
        self._used = (0, 0)  # firsts and pieces written
        # the keys held, sorted, and their firsts' starts: lookups by binary search
        self._index = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes of the chunks held (not counting spare capacity)."""
        firsts, pieces = self._used
        return 8 * (firsts + 3 * pieces)

    def rows(
        self, keys: Sequence[int] | np.ndarray, pack: Callable[[int], PackedChunk]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(base, firsts, spans)`` for the chunk of each of ``keys`` (packed with
        ``pack(key)`` where not held): row ``r`` of ``keys[i]``'s chunk holds the pieces
        ``spans[:, firsts[base[i] + r] : firsts[base[i] + r + 1]]``."""
        keys = np.asarray(keys, dtype=np.int64)
        with self._lock:
            bases, found = self._bases(keys)
            if found.all():
                return bases, self._firsts, self._spans
        while True:  # again only where another thread dropped some of keys meanwhile
            lacking = dict.fromkeys(keys[~found].tolist())
            missing = {key: pack(key) for key in lacking}  # each once, however many rows
            with self._lock:
                fresh = {k: p for k, p in missing.items() if k not in self._extent}
                firsts, pieces = self._used
                more = sum(p.first.size + 3 * p.spans.shape[1] for p in fresh.values())
                if 8 * (firsts + 3 * pieces) + 8 * more > self.max_bytes:
                    held = dict.fromkeys(keys.tolist())
                    self._rebuild(keep=[k for k in held if k in self._extent])
                for key, packed in fresh.items():
                    self._append(key, packed.first, packed.spans)
                self._index = self._sorted_index()
                # A chunk found held above may have been dropped since by another thread's
                # rebuild (while this one packed): its base would be a neighbour's (another
                # chunk's rows, silently). Those are packed again.
                bases, found = self._bases(keys)
                if found.all():
                    return bases, self._firsts, self._spans

    def _bases(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where each of ``keys``' firsts start, and whether it is held: one binary search of
        the sorted keys held, not a dictionary read a key (a plan's 256 rows: ~30 us)."""
        held, bases = self._index
        at = np.searchsorted(held, keys)
        np.minimum(at, max(held.size - 1, 0), out=at)
        if not held.size:
            return at, np.zeros(keys.size, dtype=bool)
        return bases.take(at), held.take(at) == keys

    def _sorted_index(self) -> tuple[np.ndarray, np.ndarray]:
        """The keys held, sorted, and where each one's firsts start (rebuilt when chunks are
        added: ~1 ms for 8,000, against ~0.1 ms to pack each chunk added)."""
        held = np.fromiter(self._extent, np.int64, len(self._extent))
        bases = np.fromiter((e[0] for e in self._extent.values()), np.int64, len(self._extent))
        order = np.argsort(held, kind="stable")
        return held[order], bases[order]

    def _append(self, key: int, first: np.ndarray, spans: np.ndarray) -> None:
        """Write a chunk's ``first`` (row offsets into its own ``spans``) and ``spans`` after
        the chunks held (growing the buffers into new arrays)."""
        firsts, pieces = self._used
        rows1, count = first.size, spans.shape[1]
        if firsts + rows1 > self._firsts.size:
            grown = np.empty(max(2 * self._firsts.size, firsts + rows1, 1024), dtype=np.int64)
            grown[:firsts] = self._firsts[:firsts]
            self._firsts = grown
        if pieces + count > self._spans.shape[1]:
            size = max(2 * self._spans.shape[1], pieces + count, 1024)
            wider = np.empty((3, size), dtype=np.int64)
            wider[:, :pieces] = self._spans[:, :pieces]
            self._spans = wider
        self._firsts[firsts : firsts + rows1] = first + pieces
        self._spans[:, pieces : pieces + count] = spans
        self._extent[key] = (firsts, rows1, pieces, count)
        self._used = (firsts + rows1, pieces + count)

    def _rebuild(self, keep: list[int]) -> None:
        """New buffers holding only the chunks of ``keep``."""
        old_firsts, old_spans, old = self._firsts, self._spans, self._extent
        self._firsts = np.empty(0, dtype=np.int64)
        self._spans = np.empty((3, 0), dtype=np.int64)
        self._extent, self._used = {}, (0, 0)
        for key in keep:
            f, rows1, p, count = old[key]
            self._append(key, old_firsts[f : f + rows1] - p, old_spans[:, p : p + count])
