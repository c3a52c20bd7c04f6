"""The shard files one write creates: where blocks go, under hidden temporary names.

:class:`ShardSetWriter` decides, from the output path, ``max_shard_bytes`` and ``if_exists``,
which files a write creates (one file, copied first for a copy-on-write append, or
``<base>_NNNN.rox`` shards numbered after the existing ones) and spreads blocks over them by
roxxel's rotation rule. Each :class:`ShardFile` is written under a temporary name, hashed as it
is written and fsynced when finished; publishing them is
:func:`grain_rox._format._shard_set.publish_set`'s job. Each shard begun and each shard
finished (fsynced under its temporary name) is logged at DEBUG to the ``"grain_rox"`` logger.

>>> import tempfile, os
>>> import numpy as np
>>> path = os.path.join(tempfile.mkdtemp(), "s.rox")
>>> shards = ShardSetWriter(path, np.dtype(np.uint8), 4, 10, "error", {})
>>> shards.write(np.arange(12, dtype=np.uint8))
>>> [os.path.basename(f.final_path) for f in shards.files], shards.capacity
(['s_0000.rox', 's_0001.rox', 's_0002.rox'], 1)
>>> shards.discard()
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from typing import BinaryIO, Literal, NamedTuple

import numpy as np

from grain_rox._format._atomic import temp_path_for
from grain_rox._format._manifest import set_base
from grain_rox._format._rox_format import (
    FOOTER,
    FOOTER_SIZE,
    INDEX_DTYPE,
    INDEX_ENTRY_SIZE,
    SIGNATURE,
    RoxFormatError,
    ShardHeader,
    encode_dtype,
    read_header,
    read_index,
)
from grain_rox._format._shard_set import shard_number

IfExists = Literal["error", "append", "overwrite"]
_COPY_BYTES = 8 << 20
_INDEX_CHUNK = 1 << 20  # index entries written at a time (bounded memory)

logger = logging.getLogger("grain_rox")


class FinishedShard(NamedTuple):
    """A shard file written in full, as its manifest record needs it."""

    file_size: int
    raw_size: int
    sha256: str
    mtime_ns: int


def is_set_member(path: str, max_shard_bytes: int | None) -> bool:
    """Whether a write to ``path`` writes one member of a shard set (``x_0003.rox`` as a single
    file) rather than a whole set.

    >>> is_set_member("d/x_0003.rox", None), is_set_member("d/x.rox", None)
    (True, False)
    """
    return max_shard_bytes is None and shard_number(os.path.basename(path)) >= 0


class ShardFile:
    """One shard being written under a temporary name; hashes everything it writes."""

    def __init__(self, final_path: str, dtype: np.dtype) -> None:
        self.final_path = final_path
        self.tmp_path = temp_path_for(final_path)
        self.dtype = dtype
        self.f: BinaryIO = open(self.tmp_path, "xb")
        self.hash = hashlib.sha256()
        self.raw_size = 0
        self.copied_from: ShardHeader | None = None  # the old shard of a copy-on-write append
        self.copied_tail = b""  # its raw region's last block (where its padding lies)
        self.new_block_bytes = 0
        self.num_new_blocks = 0

    def _write(self, data: bytes | memoryview) -> None:
        self.hash.update(data)
        self.f.write(data)

    def copy_from(self, path: str, sha256: str | None = None) -> None:
        """Copy an existing shard's raw region and remember its index (append, copy-on-write).
        With ``sha256`` (the manifest's), the whole old file is hashed as it is read and a
        mismatch refused: the append records a new sha256 over the copy, so damage that left
        the file's size and mtime alone (bit rot) would pass every later check."""
        header = read_header(path)
        keep = max(header.first_block_bytes, 4096)
        old = hashlib.sha256()
        with open(path, "rb", buffering=0) as src:
            left = header.raw_size
            while left:
                chunk = src.read(min(_COPY_BYTES, left))
                if not chunk:
                    raise RoxFormatError(
                        path, "the shard ended early while copying", "re-create it"
                    )
                self._write(chunk)
                old.update(chunk)
                self.copied_tail = (self.copied_tail + chunk[-keep:])[-keep:]
                left -= len(chunk)
            if sha256 is not None:
                while chunk := src.read(_COPY_BYTES):  # its index and footer
                    old.update(chunk)
                if old.hexdigest() != sha256:
                    raise RoxFormatError(
                        path,
                        f"damaged shard: sha256 is {old.hexdigest()} but the manifest records "
                        f"{sha256}, so an append would record the damage as valid",
                        "restore the shard from a copy, or write the set again "
                        "(if_exists='overwrite'); nothing was appended",
                    )
        self.raw_size = header.raw_size
        self.copied_from = header

    def write_blocks(self, data: np.ndarray, block_bytes: int) -> None:
        """Append whole blocks of ``block_bytes`` bytes (the same for every call)."""
        raw = np.ascontiguousarray(data).view(np.uint8)  # bytes of any dtype: bfloat16, >u2
        assert len(raw) % block_bytes == 0
        if self.num_new_blocks and block_bytes != self.new_block_bytes:
            raise AssertionError("one write uses one block size")
        self.new_block_bytes = block_bytes
        self._write(raw.data)
        self.raw_size += len(raw)
        self.num_new_blocks += len(raw) // block_bytes

    @property
    def num_old_blocks(self) -> int:
        return 0 if self.copied_from is None else self.copied_from.num_blocks

    @property
    def num_blocks(self) -> int:
        return self.num_old_blocks + self.num_new_blocks

    def finish(self) -> tuple[int, int, str]:
        """Write index and footer, fsync, close. Returns (file size, raw size, sha256)."""
        old_raw = 0
        if self.copied_from is not None:
            old_raw = self.copied_from.raw_size
            old_index = read_index(self.copied_from)
            for lo in range(0, self.num_old_blocks, _INDEX_CHUNK):
                self._write(np.asarray(old_index[lo : lo + _INDEX_CHUNK]).tobytes())
            del old_index  # unmap the old shard
        bs = self.new_block_bytes
        for lo in range(0, self.num_new_blocks, _INDEX_CHUNK):
            n = min(_INDEX_CHUNK, self.num_new_blocks - lo)
            ends = old_raw + bs * np.arange(lo + 1, lo + n + 1, dtype=np.int64)
            self._write(ends.astype(INDEX_DTYPE).tobytes())
        self._write(
            FOOTER.pack(self.num_blocks, self.raw_size, encode_dtype(self.dtype), SIGNATURE)
        )
        self.f.flush()
        os.fsync(self.f.fileno())
        size = self.f.tell()
        self.f.close()
        assert size == self.raw_size + INDEX_ENTRY_SIZE * self.num_blocks + FOOTER_SIZE
        return size, self.raw_size, self.hash.hexdigest()

    def discard(self) -> None:
        """Close and delete the temporary file."""
        with contextlib.suppress(OSError):
            self.f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp_path)


class ShardSetWriter:
    """Where one write's blocks go: its shard files, created on demand.

    Args:
      path: the output path (the single file, or the set's name with ``max_shard_bytes``).
      dtype: the token dtype.
      block_bytes: bytes per block.
      max_shard_bytes: ``None`` for one file, else the size limit of each shard.
      if_exists: what to do with the set's existing shards.
      disk: the set's files on disk (:func:`grain_rox._format._shard_set.scan_set`).
    """

    def __init__(
        self,
        path: str,
        dtype: np.dtype,
        block_bytes: int,
        max_shard_bytes: int | None,
        if_exists: IfExists,
        disk: dict[str, os.stat_result],
    ) -> None:
        self.dtype = dtype
        self.block_bytes = block_bytes
        self.files: list[ShardFile] = []
        self.base = path[:-4]
        name = os.path.basename(path)
        numbered = [n for n in disk if shard_number(n) >= 0]
        # A single file named like a shard (x_0003.rox) is one member of the set x: the other
        # members stay, as when shards of one set are written by separate jobs.
        self.member = is_set_member(path, max_shard_bytes)
        if if_exists == "error" and (name in disk or (disk and not self.member)):
            if name in disk:
                raise FileExistsError(
                    f"{path} exists; pass if_exists='append' to add to it (copy-on-write) or "
                    "if_exists='overwrite' to replace it"
                )
            first = os.path.join(os.path.dirname(path), next(iter(disk)))
            raise FileExistsError(
                f"{len(disk)} shard(s) of the set {set_base(path)}.rox / "
                f"{set_base(path)}_NNNN.rox exist "
                f"(e.g. {first}); pass if_exists='append' to add to the set or "
                "if_exists='overwrite' to replace it"
            )
        self.copy_from: str | None = None  # the file a copy-on-write append starts from
        self.copy_sha256: str | None = None  # its sha256 in the manifest, checked as copied
        self.next_index = 0
        if max_shard_bytes is None:
            self.capacity: int | None = None  # blocks per shard; None: one file
            self.single_path = path
            if if_exists == "append" and numbered and not self.member:
                raise ValueError(
                    f"cannot append a single file to {path}: the set is sharded "
                    f"({self.base}_NNNN.rox exist); pass max_shard_bytes= to append new shards"
                )
            if if_exists == "append" and name in disk:
                self.copy_from = path
        else:
            if max_shard_bytes <= 0:
                raise ValueError(f"max_shard_bytes={max_shard_bytes} must be positive")
            self.capacity = max(
                1, (max_shard_bytes - FOOTER_SIZE) // (block_bytes + INDEX_ENTRY_SIZE)
            )
            if if_exists == "append" and name in disk:
                raise ValueError(
                    f"cannot append shards to {path}: it is a single file, not a sharded set; "
                    "append without max_shard_bytes= (copy-on-write) or write a new set"
                )
            if if_exists == "append" and numbered:
                self.next_index = shard_number(numbered[-1]) + 1

    def _new_file(self) -> ShardFile:
        if self.capacity is None:
            f = ShardFile(self.single_path, self.dtype)
            if self.copy_from is not None:
                try:
                    f.copy_from(self.copy_from, self.copy_sha256)
                except BaseException:  # not yet in self.files: discard() would miss it
                    f.discard()
                    raise
        else:
            f = ShardFile(f"{self.base}_{self.next_index:04d}.rox", self.dtype)
            self.next_index += 1
        self.files.append(f)
        logger.debug(
            "writing shard %s%s, under a temporary name until the set is published",
            f.final_path,
            "" if f.copied_from is None else " (a copy of it, then the appended blocks)",
        )
        return f

    def write(self, blocks: np.ndarray) -> None:
        """Write whole blocks (a flat token array), rotating shards by roxxel's rule."""
        per_block = self.block_bytes // self.dtype.itemsize
        n = blocks.size // per_block
        done = 0
        while done < n:
            if not self.files or (
                self.capacity is not None and self.files[-1].num_new_blocks >= self.capacity
            ):
                self._new_file()
            f = self.files[-1]
            room = n - done if self.capacity is None else self.capacity - f.num_new_blocks
            take = min(room, n - done)
            f.write_blocks(blocks[done * per_block : (done + take) * per_block], self.block_bytes)
            done += take

    def finish(self) -> list[FinishedShard]:
        """Finish every file (index, footer, fsync); what each holds, in order."""
        results = []
        for f in self.files:
            size, raw, digest = f.finish()
            logger.debug(
                "finished shard %s: %d block%s, %d bytes, sha256 %s, fsynced",
                f.final_path,
                f.num_blocks,
                "" if f.num_blocks == 1 else "s",
                size,
                digest[:16],
            )
            results.append((size, raw, digest))
        mtimes = [os.stat(f.tmp_path).st_mtime_ns for f in self.files]
        return [FinishedShard(*r, mtime) for r, mtime in zip(results, mtimes, strict=True)]

    def discard(self) -> None:
        """Close and delete every temporary file of this write."""
        for f in self.files:
            f.discard()
        self.files = []
