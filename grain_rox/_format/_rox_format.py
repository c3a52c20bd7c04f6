"""The ROXXEL02 shard layout: parse and validate one shard's footer and index.

A shard is ``[raw blocks][int64 end offsets, one per block][32-byte footer]`` with the footer
``struct "<qq8s8s"`` = (number of blocks, raw size, dtype name, ``b"ROXXEL02"``). Nothing sits
at the start of the file: byte 0 is the first data byte. Roxxel checks only the signature and
the minimum size; we check everything that can make a read wrong, and every error names the
file, what is wrong and what to do.

This module is the one place that knows where the index sits (:func:`read_index`), how it is
validated (:func:`check_index`) and what a set of shards must share (:func:`check_same_dtype`).
Opening costs O(1) per shard (one 32-byte read and two index entries). The full index walk
(monotone, in bounds, whole tokens per block) is vectorised; it runs at open while the
corpus's indexes total at most :data:`FULL_INDEX_CHECK_LIMIT` entries, and otherwise once per
shard when that shard is first mapped. Every block read is also bounds-checked on its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import os
import stat
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

FOOTER = struct.Struct("<qq8s8s")
FOOTER_SIZE = FOOTER.size  # 32
SIGNATURE = b"ROXXEL02"
INDEX_ENTRY_SIZE = 8
INDEX_DTYPE = np.dtype("<i8")
# Up to 1M index entries in total (8 MiB, a 4 GiB corpus of 4 KiB blocks) are walked at open;
# beyond that each shard's index is walked when the shard is first mapped.
FULL_INDEX_CHECK_LIMIT = 1 << 20
_INDEX_CHUNK = 1 << 20


class RoxFormatError(ValueError):
    """A `.rox` shard (or a set of them) is damaged or inconsistent.

    The message names the file, the problem and the fix; the parts are also attributes.

    Args:
        path: The shard (or set) at fault; kept as ``err.path``.
        problem: What is wrong with it, as a clause; kept as ``err.problem``.
        fix: What to do about it; kept as ``err.fix``.

    >>> err = RoxFormatError("a.rox", "the footer signature is b'XXXXXXXX'", "re-write it")
    >>> str(err)
    "a.rox: the footer signature is b'XXXXXXXX'. Fix: re-write it."
    >>> isinstance(err, ValueError)
    True
    """

    def __init__(self, path: str | os.PathLike[str], problem: str, fix: str) -> None:
        self.path = os.fspath(path)
        self.problem = problem
        self.fix = fix
        super().__init__(f"{self.path}: {problem}. Fix: {fix}.")


_REWRITE = "re-create the shard from its source data (grain-rox convert or roxxel's write)"
# Roxxel cuts every write into blocks of block_size bytes, so an empty document, an empty
# string or an item of no tokens adds only its separator (or nothing) to a block, never an
# empty block: only a write(..., block_size=0) gives empty ones, and it never ends (its loop
# emits b"" blocks forever, finalizing shard after shard with max_shard_bytes) and never
# stores its items. Roxxel's stream() divides by zero on such a set, or over-counts its len().
_EMPTY_BLOCKS = (
    "roxxel writes empty blocks only when write() is given block_size=0, a write that never "
    "ends and stores none of its items, so they hold no data"
)
_EMPTY_BLOCKS_FIX = (
    "write the data again with a block size > 0 (roxxel's default is 4096) and delete the "
    "shards that write left (blocks before its empty ones hold earlier writes' data: "
    "re-create those from their source)"
)


def token_dtype(dtype: Any) -> np.dtype:
    """``np.dtype(dtype)``, with the name ``"bfloat16"`` too (numpy knows it only once
    ``ml_dtypes``, shipped with jax, is imported).

    >>> token_dtype("bfloat16").name, token_dtype("uint16")
    ('bfloat16', dtype('uint16'))
    """
    if isinstance(dtype, str) and dtype == "bfloat16":
        import ml_dtypes  # registers bfloat16 with numpy

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def decode_dtype(name_bytes: bytes, path: str) -> np.dtype:
    """Return the numpy dtype named by a footer's 8-byte dtype field.

    NULs are stripped from both ends, as roxxel's reader does (``.strip("\\x00")``), so a
    name another writer padded on the left reads as it does in roxxel.

    >>> decode_dtype(b"uint16\\x00\\x00", "x.rox"), decode_dtype(b"\\x00\\x00\\x00int32", "x.rox")
    (dtype('uint16'), dtype('int32'))
    """
    try:
        name = name_bytes.strip(b"\x00").decode("ascii")
    except UnicodeDecodeError:
        raise RoxFormatError(
            path, f"the footer's dtype field {name_bytes!r} is not an ASCII dtype name", _REWRITE
        ) from None
    if name == "bfloat16":  # (numpy's kind "V": not refused below as no number)
        return token_dtype(name)
    try:
        dtype = np.dtype(name)
    except Exception:  # numpy raises TypeError, ValueError or SyntaxError for odd names
        # a full field may be a longer name cut short; a shorter one is just not a dtype
        cut = len(name) == 8
        raise RoxFormatError(
            path,
            f"the footer's dtype {name!r} is not a numpy dtype"
            + (
                " (roxxel truncates names longer than 8 bytes, e.g. 'complex64' -> 'complex6')"
                if cut
                else ""
            ),
            "store tokens as an integer or float dtype of at most 8 characters",
        ) from None
    if dtype.kind not in "uif" or dtype.itemsize > 8:
        raise RoxFormatError(
            path,
            f"the footer's dtype {name!r} ({dtype}) is not an integer or float type of at most "
            "8 bytes",
            "store tokens as an integer or float dtype",
        )
    return dtype


def encode_dtype(dtype: np.dtype) -> bytes:
    """Return the footer's dtype field for ``dtype``: its name, NUL-padded to 8 bytes.

    >>> encode_dtype(np.dtype("int32"))
    b'int32\\x00\\x00\\x00'
    """
    if (dtype.kind not in "uif" or dtype.itemsize > 8) and dtype.name != "bfloat16":
        raise ValueError(
            f"dtype {dtype} cannot be stored in a .rox shard; use an int or float type"
        )
    name = str(dtype)  # what roxxel writes: 'uint16', '>u2', 'bfloat16'
    raw = name.encode("ascii")
    if len(raw) > 8:
        raise ValueError(f"dtype name {name!r} is longer than the footer's 8 bytes")
    return raw.ljust(8, b"\x00")


@dataclasses.dataclass(frozen=True)
class ShardHeader:
    """What a shard's footer says, checked against its size. Cheap: O(1) to build."""

    path: str
    file_size: int
    num_blocks: int
    raw_size: int
    dtype: np.dtype
    first_block_bytes: int  # roxxel's block size: the first record's length (0 if no blocks)
    last_end: int

    @property
    def num_tokens(self) -> int:
        return self.raw_size // self.dtype.itemsize

    @property
    def index_offset(self) -> int:
        return self.raw_size

    def facts(self) -> tuple[object, ...]:
        """The content-identifying facts used in reprs and checkpoint fingerprints."""
        return (
            os.path.basename(self.path),
            self.file_size,
            self.num_blocks,
            self.raw_size,
            self.dtype.str,
            self.first_block_bytes,
        )


def require_regular(path: str, st: os.stat_result, what: str = "shard") -> None:
    """Refuse a FIFO, device, socket or directory named like a shard (opening one can hang).

    >>> require_regular("/dev/null", os.stat("/dev/null"))
    Traceback (most recent call last):
    ...
    grain_rox._format._rox_format.RoxFormatError: /dev/null: it is a FIFO, device or socket, not a regular file, so it cannot be a shard. Fix: pass a .rox shard (a regular file), a folder of them or a glob.
    """
    if not stat.S_ISREG(st.st_mode):
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "FIFO, device or socket"
        if path.endswith(".rox"):  # found by a listing or a glob, or named so by hand
            raise RoxFormatError(
                path,
                f"it is a {kind}, not a regular file, but is named like a {what}",
                "rename or remove it; .rox shards are regular files",
            )
        raise RoxFormatError(  # given by hand, as /dev/null
            path,
            f"it is a {kind}, not a regular file, so it cannot be a {what}",
            "pass a .rox shard (a regular file), a folder of them or a glob",
        )


def read_header(path: str) -> ShardHeader:
    """Read and validate one shard's footer, its size equation and its first/last index entry.

    Raises :class:`RoxFormatError` for any inconsistency and ``FileNotFoundError`` if
    ``path`` does not exist.
    """
    require_regular(path, os.stat(path))  # opening a FIFO would block forever
    with open(path, "rb") as f:
        file_size = os.fstat(f.fileno()).st_size

        def read_at(offset: int, size: int) -> bytes:
            f.seek(offset)
            return f.read(size)

        return parse_header(path, file_size, read_at)


def parse_header(path: str, file_size: int, read_at: Callable[[int, int], bytes]) -> ShardHeader:
    """Validate the footer and first/last index entry of a ``file_size``-byte shard whose
    bytes ``read_at(offset, size)`` returns (a local file or ranged requests to an object).
    """
    if file_size < FOOTER_SIZE:
        what = "empty (0 bytes)" if file_size == 0 else f"only {file_size} bytes"
        raise RoxFormatError(
            path,
            f"the file is {what}, smaller than the 32-byte ROXXEL02 footer "
            "(left by an interrupted writer, or roxxel's write([]))",
            "delete the file or re-create it; grain_rox writers never leave such files",
        )
    num_blocks, raw_size, dtype_bytes, signature = FOOTER.unpack(
        read_at(file_size - FOOTER_SIZE, FOOTER_SIZE)
    )
    if signature != SIGNATURE:
        raise RoxFormatError(
            path,
            f"the last 8 bytes are {signature!r}, not the ROXXEL02 signature (truncated, "
            "extended with trailing bytes, or not a .rox file)",
            _REWRITE,
        )
    dtype = decode_dtype(dtype_bytes, path)
    if num_blocks < 0 or raw_size < 0:
        raise RoxFormatError(
            path,
            f"the footer says {num_blocks} blocks and {raw_size} raw bytes; both must be >= 0",
            _REWRITE,
        )
    expected = raw_size + INDEX_ENTRY_SIZE * num_blocks + FOOTER_SIZE
    if expected != file_size:
        raise RoxFormatError(
            path,
            f"the file is {file_size} bytes but its footer ({num_blocks} block(s), "
            f"{raw_size} raw bytes) implies raw + 8*N + 32 = {expected} bytes (truncated "
            "or damaged)",
            _REWRITE,
        )
    if num_blocks and not raw_size:
        raise RoxFormatError(
            path,
            f"the footer says {num_blocks} blocks but 0 raw bytes: every block is empty "
            f"(0 bytes); {_EMPTY_BLOCKS}",
            _EMPTY_BLOCKS_FIX,
        )
    if raw_size and not num_blocks:
        raise RoxFormatError(
            path, f"the footer says {num_blocks} blocks but {raw_size} raw bytes", _REWRITE
        )
    itemsize = dtype.itemsize
    if raw_size % itemsize:
        raise RoxFormatError(
            path,
            f"the raw region ({raw_size} bytes) is not a whole number of {dtype} tokens "
            f"({itemsize} bytes each)",
            "write shards with a block size that is a multiple of the token size",
        )
    first = last = 0
    if num_blocks:
        first = int.from_bytes(read_at(raw_size, 8), "little", signed=True)
        last_at = raw_size + INDEX_ENTRY_SIZE * (num_blocks - 1)
        last = int.from_bytes(read_at(last_at, 8), "little", signed=True)
        if first == 0 and last == raw_size:  # (with data after it: not roxxel's empty tail)
            raise RoxFormatError(
                path,
                f"block 0 is empty (its end offset is 0) though {raw_size} raw bytes follow: "
                "the block index is damaged",
                _REWRITE,
            )
        if not 0 < first <= last == raw_size:
            raise RoxFormatError(
                path,
                f"the block index is inconsistent: first end offset {first}, last {last}, "
                f"raw size {raw_size} (need 0 < first <= last == raw size)",
                _REWRITE,
            )
        if first % itemsize:
            raise RoxFormatError(
                path,
                f"the block size {first} bytes is not a multiple of the {dtype} token size "
                f"({itemsize} bytes): blocks would split tokens (roxxel garbles them)",
                f"re-write with a block size that is a multiple of {itemsize}",
            )
    return ShardHeader(path, file_size, num_blocks, raw_size, dtype, first, last)


def read_index(header: ShardHeader, mapped: mmap.mmap | None = None) -> np.ndarray:
    """Return a shard's block index: the byte offset where each block ends, as int64.

    The ``header.num_blocks`` entries sit right after the raw region (at
    ``header.index_offset``). They are viewed in ``mapped`` (the whole shard, memory-mapped)
    when given, else memory-mapped from the file on their own, so a huge index is paged in as
    :func:`check_index` walks it, never read whole. The entries are not validated here: walk
    them with :func:`check_index` before trusting them.

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "i.rox")
    >>> index = np.array([4, 6], INDEX_DTYPE).tobytes()
    >>> with open(path, "wb") as f:
    ...     _ = f.write(b"abcdef" + index + FOOTER.pack(2, 6, b"uint8", SIGNATURE))
    >>> header = read_header(path)
    >>> read_index(header).tolist(), check_index(header, read_index(header))
    ([4, 6], False)
    """
    count = header.num_blocks
    if count == 0:
        return np.empty((0,), INDEX_DTYPE)
    if mapped is not None:
        return np.frombuffer(mapped, INDEX_DTYPE, count=count, offset=header.index_offset)
    # Mapped on its own and read ahead forward only: a plain map's first fault reads around
    # it (the block device's read-ahead, 8 MiB on one host), so opening a cold 16 MiB shard
    # read its last 4 MiB of tokens as well as its 32 KiB index.
    start = header.index_offset // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
    with open(header.path, "rb") as f:
        length = header.index_offset + INDEX_DTYPE.itemsize * count - start
        if os.fstat(f.fileno()).st_size < start + length:  # (mmap: "length is greater than
            raise RoxFormatError(  # file size", naming no file)
                header.path,
                f"the file is shorter than its footer said when it was read ({header.file_size} "
                "bytes): it was replaced or truncated meanwhile (a write in progress?)",
                "open it again once the write has finished",
            )
        mm = mmap.mmap(f.fileno(), length, access=mmap.ACCESS_READ, offset=start)
    with contextlib.suppress(AttributeError, OSError):  # (a platform without madvise)
        mm.madvise(mmap.MADV_SEQUENTIAL)
    return np.frombuffer(mm, INDEX_DTYPE, count=count, offset=header.index_offset - start)


def check_index(header: ShardHeader, ends: np.ndarray) -> bool:
    """Walk a shard's whole index; return whether all blocks have the first block's size.

    Checks that end offsets strictly increase, stay within the raw region, end at it, and
    that every block holds whole tokens. Vectorised in 1M-entry chunks (bounded memory).
    """
    itemsize = header.dtype.itemsize
    block_bytes = header.first_block_bytes
    uniform = True
    prev = 0
    for lo in range(0, header.num_blocks, _INDEX_CHUNK):
        chunk = np.asarray(ends[lo : lo + _INDEX_CHUNK], dtype=np.int64)
        outside = np.flatnonzero((chunk <= 0) | (chunk > header.raw_size))
        if outside.size:
            i = lo + int(outside[0])
            raise RoxFormatError(
                header.path,
                f"block {i}'s end offset {int(chunk[outside[0]])} lies outside the "
                f"{header.raw_size}-byte raw region",
                _REWRITE,
            )
        sizes = np.diff(chunk, prepend=np.int64(prev))
        bad = np.flatnonzero((sizes <= 0) | (sizes % itemsize != 0))
        if bad.size:
            i = lo + int(bad[0])
            before = prev if bad[0] == 0 else int(chunk[bad[0] - 1])
            if sizes[bad[0]] == 0 and before == header.raw_size:  # empty to the end: roxxel's
                empty = _count_empty_blocks(ends)  # write(block_size=0) appended them
                raise RoxFormatError(
                    header.path,
                    f"block {i} is empty (it ends at offset {before}, where the previous block "
                    f"ended), one of {empty} empty blocks of {header.num_blocks}; "
                    f"{_EMPTY_BLOCKS}",
                    _EMPTY_BLOCKS_FIX,
                )
            damaged = " (an empty block with data after it: the index is damaged)"
            raise RoxFormatError(
                header.path,
                f"block {i} ends at offset {int(chunk[bad[0]])} after the previous block ended "
                f"at {before}: the index must increase by whole {header.dtype} tokens "
                f"({itemsize} bytes){damaged if sizes[bad[0]] == 0 else ''}",
                _REWRITE,
            )
        uniform = uniform and bool(np.all(sizes == block_bytes))
        prev = int(chunk[-1])
    if prev != header.raw_size:
        raise RoxFormatError(
            header.path,
            f"the index ends at {prev} but the raw region is {header.raw_size} bytes",
            _REWRITE,
        )
    return uniform


def _count_empty_blocks(ends: np.ndarray) -> int:
    """How many blocks of an index end where the one before ended (chunk by chunk)."""
    count, prev = 0, 0
    for lo in range(0, len(ends), _INDEX_CHUNK):
        chunk = np.asarray(ends[lo : lo + _INDEX_CHUNK], dtype=np.int64)
        count += int(np.count_nonzero(np.diff(chunk, prepend=np.int64(prev)) == 0))
        prev = int(chunk[-1])
    return count


def check_same_dtype(first: ShardHeader, header: ShardHeader) -> None:
    """Refuse a shard whose token dtype is not the dtype of the set's first shard ``first``.

    A corpus (and a set checked by verify) holds one token dtype; blocks may differ in size.

    >>> u8 = ShardHeader("a_0000.rox", 44, 1, 4, np.dtype("uint8"), 4, 4)
    >>> u16 = dataclasses.replace(u8, path="a_0001.rox", dtype=np.dtype("uint16"))
    >>> check_same_dtype(u8, u16)
    Traceback (most recent call last):
    ...
    grain_rox._format._rox_format.RoxFormatError: a_0001.rox: its dtype is uint16 but a_0000.rox (the corpus's first shard) is uint8; one corpus holds one token dtype. Fix: open shard sets of different dtypes as separate corpora (and mix them).
    """
    if header.dtype != first.dtype:
        raise RoxFormatError(
            header.path,
            f"its dtype is {header.dtype} but {first.path} (the corpus's first shard) "
            f"is {first.dtype}; one corpus holds one token dtype",
            "open shard sets of different dtypes as separate corpora (and mix them)",
        )
