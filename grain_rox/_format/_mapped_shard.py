"""One shard's memory map, opened on first use, and the file version it must still be.

A corpus records each shard's :func:`file_identity` when it opens (before reading the footer).
:class:`MappedShard` maps the file only if it is still that version, so a shard replaced or
edited after the corpus was opened is refused instead of read with a stale footer.
"""

from __future__ import annotations

import contextlib
import mmap
import os

import numpy as np

from grain_rox._format._rox_format import RoxFormatError, ShardHeader, read_index

FileIdentity = tuple[int, int, int, int]


def file_identity(st: os.stat_result) -> FileIdentity:
    """The (st_dev, st_ino, st_mtime_ns, st_size) of a file: which file version a path named
    when a corpus was opened (a replacement or an in-place edit changes it)."""
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


class MappedShard:
    """One shard's memory map: its tokens and its block index as zero-copy views.

    Args:
      header: the shard's footer facts, read when the corpus was opened.
      identity: the shard's :func:`file_identity` then; a file that is no longer that version
        is refused with :class:`RoxFormatError`.

    Attributes:
      tokens: the raw region as ``header.num_tokens`` tokens of ``header.dtype``.
      ends: the block index (:func:`grain_rox._format._rox_format.read_index`), not walked here.
      mm: the map (None for a shard with no blocks, or after :meth:`close`).
    """

    __slots__ = ("_windows", "ends", "mm", "tokens")

    def __init__(self, header: ShardHeader, identity: FileIdentity) -> None:
        self.mm: mmap.mmap | None = None
        self._windows: dict[int, np.ndarray] = {}
        self.tokens: np.ndarray
        self.ends: np.ndarray
        if header.raw_size == 0:
            self.tokens = np.empty((0,), header.dtype)
            self.ends = read_index(header)
            return
        try:
            f = open(header.path, "rb")
        except FileNotFoundError:
            raise RoxFormatError(
                header.path,
                "the shard was deleted after the corpus was opened (its set was rewritten with "
                "fewer shards, or removed)",
                "reopen the corpus (open_rox) / make a new pipeline; a checkpoint made on the "
                "data as opened cannot continue without it",
            ) from None
        with f:
            now = file_identity(os.fstat(f.fileno()))
            if now != identity:
                raise RoxFormatError(
                    header.path,
                    f"the shard is now {now[3]} bytes but was {identity[3]} when the corpus "
                    "was opened: it was modified or replaced"
                    if now[3] != identity[3]
                    else "the shard was modified or replaced after the corpus was opened (its "
                    f"(device, inode, mtime_ns) was {identity[:3]}, is {now[:3]})",
                    "reopen the corpus (open_rox) / make a new pipeline; a checkpoint made on the "
                    "data as opened cannot continue on these bytes",
                )
            self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        with contextlib.suppress(AttributeError, OSError):
            self.mm.madvise(mmap.MADV_RANDOM)
        self.tokens = np.frombuffer(self.mm, header.dtype, count=header.num_tokens)
        self.ends = read_index(header, self.mm)

    def slice(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the shard (a zero-copy view)."""
        return self.tokens[start:stop]

    def spans(self, spans: list[tuple[int, int]]) -> list[np.ndarray]:
        """Tokens ``[a, b)`` for each span (zero-copy views)."""
        return [self.tokens[a:b] for a, b in spans]

    def gather(self, starts: np.ndarray, width: int) -> np.ndarray:
        """The ``width``-token windows that start at ``starts``, as an (n, width) array: one
        vectorised copy from a strided view of all the shard's windows."""
        view = self._windows.get(width)
        if view is None:
            n = max(0, self.tokens.size - width + 1)
            step = self.tokens.strides[0]
            view = np.lib.stride_tricks.as_strided(
                self.tokens, shape=(n, width), strides=(step, step), writeable=False
            )
            self._windows[width] = view
        return view[starts]

    def close(self) -> None:
        self._windows = {}
        mm, self.mm = self.mm, None
        if mm is not None:
            # Views handed out stay valid: if any is alive the map is released with the last one.
            with contextlib.suppress(BufferError):
                mm.close()
