"""Write items (text, bytes, token arrays) into ROXXEL02 shards that roxxel can read, atomically.

The byte layout is roxxel's: items are concatenated (each followed by the separator, if any),
cut into blocks of ``block_size`` bytes, the last block padded; with ``max_shard_bytes`` the
blocks are spread over ``<base>_0000.rox, <base>_0001.rox, ...`` by roxxel's rotation rule.
What differs is everything that can go wrong in roxxel:

* the dtype is chosen to fit the tokenizer's vocabulary (uint16 up to 65,536 ids, uint32
  above; never roxxel's int16 overflow) and every value is range-checked, never relabelled;
* the separator (EOS) is exactly one token; a block size that would split tokens is refused;
* every shard is written under a hidden temporary name and fsynced; the whole set is then
  published as one transaction recorded in the manifest (see :mod:`grain_rox._format._shard_set`):
  after a kill at any point the set opens as the complete old data, the complete new data, or
  refuses naming what to do; old shards are deleted only after the new ones are in place, and
  the next write to the set removes a killed writer's temporaries;
* an append never touches existing bytes: a single file is rewritten copy-on-write and a
  sharded set gets new shards after its last one;
* the index is arithmetic (blocks are uniform), so memory does not grow with the output.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import itertools
import os
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO, Literal

import numpy as np

from grain_rox._format._atomic import set_write_lock, temp_path_for
from grain_rox._format._manifest import (
    MANIFEST_SUFFIX,
    Manifest,
    ShardRecord,
    manifest_path_for,
    new_write_id,
    set_base,
)
from grain_rox._format._rox_format import (
    FOOTER,
    FOOTER_SIZE,
    INDEX_DTYPE,
    INDEX_ENTRY_SIZE,
    SIGNATURE,
    RoxFormatError,
    encode_dtype,
    read_header,
)
from grain_rox._format._shard_set import (
    clean_leftovers,
    previous_set,
    publish_set,
    roll_back_interrupted,
    scan_set,
    shard_number,
)
from grain_rox._text._tokenizers import Tokenizer, get_tokenizer, smallest_token_dtype

Item = str | bytes | bytearray | memoryview | np.ndarray | list[int] | tuple[int, ...]
IfExists = Literal["error", "append", "overwrite"]
_FLUSH_BYTES = 4 << 20
_COPY_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """What :func:`write_rox` wrote.

    >>> import tempfile, os
    >>> result = write_rox(["ab", "c"], os.path.join(tempfile.mkdtemp(), "w.rox"), block_size=4)
    >>> result.num_documents, result.num_tokens, result.num_padding_tokens, len(result.paths)
    (2, 3, 1, 1)
    """

    paths: tuple[str, ...]  # shards created or rewritten by this call, in order
    manifest_path: str | None
    num_tokens: int  # tokens written by this call, separators included, padding excluded
    num_padding_tokens: int
    num_documents: int
    dtype: np.dtype
    block_size: int


def _dtype_range_check(values: np.ndarray, dtype: np.dtype, where: str) -> None:
    if values.size == 0 or dtype.kind not in "ui":
        return
    if values.dtype.kind in "ui" and np.can_cast(values.dtype, dtype, "safe"):
        return  # every value of the source type fits
    info = np.iinfo(dtype)
    lo, hi = values.min(), values.max()
    if lo < info.min or hi > info.max:
        raise ValueError(
            f"{where} holds values in [{lo}, {hi}] that do not fit {dtype} [{info.min}, "
            f"{info.max}]; pass dtype= a wider type (e.g. uint32) or check the token ids"
        )


def _float_overflow_check(values: np.ndarray, stored: np.ndarray, where: str) -> None:
    """Refuse values that become inf in a float dtype (e.g. 1e6 in float16)."""
    if values.size == 0 or stored.dtype.kind in "ui":
        return
    lost = np.isinf(stored.astype(np.float64)) & ~np.isinf(values.astype(np.float64))
    if lost.any():
        bad = values.reshape(-1)[int(np.argmax(lost.reshape(-1)))]
        raise ValueError(
            f"{where} holds {bad.item()!r}, which overflows to inf in {stored.dtype}; pass "
            "dtype= a wider float type (e.g. float32) or scale the values"
        )


class _ItemEncoder:
    """Turns each item into a 1-D array of the target dtype, checking instead of relabelling."""

    def __init__(self, dtype: np.dtype, tokenizer: Tokenizer | None) -> None:
        self.dtype = dtype
        self.tokenizer = tokenizer
        # Ids below the vocabulary size fit a dtype chosen for it: no per-item range check.
        self.ids_fit = (
            tokenizer is not None
            and dtype.kind in "ui"
            and tokenizer.vocab_size - 1 <= np.iinfo(dtype).max
        )

    def _check_vocabulary(self, ids: np.ndarray, where: str) -> None:
        """Token arrays given with a tokenizer must be ids of its vocabulary."""
        assert self.tokenizer is not None
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= self.tokenizer.vocab_size:
            bad = low if low < 0 else high
            raise ValueError(
                f"{where} holds token id {bad}, outside the {self.tokenizer.name} vocabulary "
                f"(0..{self.tokenizer.vocab_size - 1}); pass the tokenizer these ids came from"
            )

    def __call__(self, item: Any, index: int) -> np.ndarray:
        where = f"item {index}"
        if isinstance(item, str):
            if self.tokenizer is not None:
                ids = self.tokenizer.encode(item)
                if not self.ids_fit:
                    _dtype_range_check(ids, self.dtype, where)
                return ids.astype(self.dtype, copy=False)
            item = item.encode("utf-8")
        if isinstance(item, (bytes, bytearray, memoryview)):
            if self.dtype != np.uint8:
                raise TypeError(
                    f"{where} is bytes but the shard dtype is {self.dtype}; pass token arrays "
                    "(np.frombuffer(b, dtype)) or text with a tokenizer="
                )
            return np.frombuffer(item, np.uint8)
        if isinstance(item, (list, tuple)):
            item = np.asarray(item)
        if isinstance(item, np.ndarray):
            arr = item.reshape(-1)
            if self.tokenizer is not None and arr.dtype.kind in "ui" and arr.size:
                self._check_vocabulary(arr, where)
            if arr.dtype == self.dtype:
                return arr
            if arr.dtype.kind not in "uif" or (arr.dtype.kind == "f" and self.dtype.kind in "ui"):
                raise TypeError(
                    f"{where} has dtype {arr.dtype}, which cannot be stored as {self.dtype} "
                    "without losing information; convert it first or pass dtype="
                )
            if not (self.ids_fit and arr.dtype.kind in "ui" and self.tokenizer is not None):
                _dtype_range_check(arr, self.dtype, where)
            with np.errstate(over="ignore"):
                stored = arr.astype(self.dtype)
            _float_overflow_check(arr, stored, where)
            return stored
        raise TypeError(
            f"{where} is a {type(item).__name__}; items must be str, bytes, numpy arrays or "
            "lists of ints"
        )


def _separator_token(separator: Any, dtype: np.dtype, tok: Tokenizer | None) -> int | float | None:
    if separator is None or separator is False:
        return None
    if isinstance(separator, str):
        separator = separator.encode("utf-8")
    if isinstance(separator, (bytes, bytearray)):
        if len(separator) != dtype.itemsize:
            raise ValueError(
                f"separator {bytes(separator)!r} is {len(separator)} bytes but one {dtype} token "
                f"is {dtype.itemsize}: the separator must be exactly one token (a multi-byte "
                "separator would misalign tokens); pass separator= one token id"
            )
        return np.frombuffer(bytes(separator), dtype)[0].item()
    if isinstance(separator, (int, np.integer, float, np.floating)):
        value = separator.item() if isinstance(separator, np.generic) else separator
        if dtype.kind in "ui" and isinstance(value, float):
            if not value.is_integer():
                raise ValueError(
                    f"separator={value!r} is not a whole number but the tokens are {dtype}: it "
                    f"would be stored as {int(value)}; pass separator= an integer token id"
                )
            value = int(value)
        _dtype_range_check(np.asarray([value]), dtype, f"separator {value!r}")
        if dtype.kind not in "ui":
            with np.errstate(over="ignore"):
                stored = np.asarray([value]).astype(dtype)
            _float_overflow_check(np.asarray([value]), stored, "separator")
        if tok is not None and dtype.kind in "ui" and not 0 <= value < tok.vocab_size:
            raise ValueError(
                f"separator={value} is outside the {tok.name} vocabulary (ids 0..{tok.vocab_size - 1}); "
                f"pass one of its ids, or leave separator= unset for its EOS id {tok.eos_id}"
            )
        return value
    raise TypeError(f"separator {separator!r} must be one token id (int) or one token of bytes")


class _ShardFile:
    """One shard being written under a temporary name; hashes everything it writes."""

    def __init__(self, final_path: str, dtype: np.dtype) -> None:
        self.final_path = final_path
        self.tmp_path = temp_path_for(final_path)
        self.dtype = dtype
        self.f: BinaryIO = open(self.tmp_path, "xb")
        self.hash = hashlib.sha256()
        self.raw_size = 0
        self.old_ends: tuple[str, int, int] | None = None  # (file, offset, count) to copy
        self.num_old_blocks = 0
        self.new_block_bytes = 0
        self.num_new_blocks = 0

    def _write(self, data: bytes | memoryview) -> None:
        self.hash.update(data)
        self.f.write(data)

    def copy_from(self, path: str) -> None:
        """Copy an existing shard's raw region and remember its index (append, copy-on-write)."""
        header = read_header(path)
        with open(path, "rb", buffering=0) as src:
            left = header.raw_size
            while left:
                chunk = src.read(min(_COPY_BYTES, left))
                if not chunk:
                    raise RoxFormatError(
                        path, "the shard ended early while copying", "re-create it"
                    )
                self._write(chunk)
                left -= len(chunk)
        self.raw_size = header.raw_size
        self.num_old_blocks = header.num_blocks
        self.old_ends = (path, header.raw_size, header.num_blocks)

    def write_blocks(self, data: np.ndarray, block_bytes: int) -> None:
        raw = np.ascontiguousarray(data).view(np.uint8)  # bytes of any dtype: bfloat16, >u2
        assert len(raw) % block_bytes == 0
        if self.num_new_blocks and block_bytes != self.new_block_bytes:
            raise AssertionError("one write uses one block size")
        self.new_block_bytes = block_bytes
        self._write(raw.data)
        self.raw_size += len(raw)
        self.num_new_blocks += len(raw) // block_bytes

    @property
    def num_blocks(self) -> int:
        return self.num_old_blocks + self.num_new_blocks

    def finish(self) -> tuple[int, int, str]:
        """Write index and footer, fsync, close. Returns (file size, raw size, sha256)."""
        old_raw = 0
        if self.old_ends is not None:
            path, offset, count = self.old_ends
            old_raw = offset
            for lo in range(0, count, 1 << 20):
                n = min(1 << 20, count - lo)
                ends = np.fromfile(path, INDEX_DTYPE, count=n, offset=offset + 8 * lo)
                self._write(ends.tobytes())
        bs = self.new_block_bytes
        for lo in range(0, self.num_new_blocks, 1 << 20):
            n = min(1 << 20, self.num_new_blocks - lo)
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
        with contextlib.suppress(OSError):
            self.f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp_path)


class _Plan:
    """Where blocks go: the shard files of this write, created on demand."""

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
        self.files: list[_ShardFile] = []
        self.base = path[:-4]
        name = os.path.basename(path)
        numbered = [n for n in disk if shard_number(n) >= 0]
        # A single file named like a shard (x_0003.rox) is one member of the set x: the other
        # members stay, as when shards of one set are written by separate jobs.
        self.member = max_shard_bytes is None and shard_number(name) >= 0
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
        self.copy_from = None
        self.next_index = 0
        if max_shard_bytes is None:
            self.capacity: int | None = None
            self.single = path
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

    def _new_file(self) -> _ShardFile:
        if self.capacity is None:
            f = _ShardFile(self.single, self.dtype)
            if self.copy_from is not None:
                f.copy_from(self.copy_from)
        else:
            f = _ShardFile(f"{self.base}_{self.next_index:04d}.rox", self.dtype)
            self.next_index += 1
        self.files.append(f)
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

    def discard(self) -> None:
        for f in self.files:
            f.discard()
        self.files = []


def _resolve_dtype(
    items: Iterator[Any], dtype: Any, tokenizer: Tokenizer | None
) -> tuple[np.dtype, Iterator[Any]]:
    if dtype is not None:
        return np.dtype(dtype), items
    if tokenizer is not None:
        return smallest_token_dtype(tokenizer.vocab_size), items
    first = next(items, None)
    if first is None:
        return np.dtype(np.uint8), items
    rest = itertools.chain([first], items)
    if isinstance(first, (str, bytes, bytearray, memoryview)):
        return np.dtype(np.uint8), rest
    if isinstance(first, np.ndarray):
        return first.dtype, rest
    raise TypeError(
        f"cannot infer a dtype from a first item of type {type(first).__name__}; pass dtype="
    )


def write_rox(
    items: Iterable[Item],
    path: str | os.PathLike[str],
    *,
    block_size: int = 4096,
    max_shard_bytes: int | None = None,
    dtype: Any = None,
    separator: Any = None,
    pad_id: int | None = None,
    tokenizer: str | os.PathLike[str] | Tokenizer | None = None,
    if_exists: IfExists = "error",
    manifest: bool = True,
    progress: bool = False,
) -> WriteResult:
    """Write ``items`` into ROXXEL02 shard(s) at ``path`` that both grain_rox and roxxel read.

    Args:
      items: str (UTF-8 bytes, or token ids with ``tokenizer``), bytes, numpy arrays or lists
        of token ids. Each item is followed by ``separator``.
      path: the shard file, or with ``max_shard_bytes`` the set's name (``x.rox`` gives
        ``x_0000.rox, x_0001.rox, ...``).
      block_size: bytes per block; a multiple of the token size.
      max_shard_bytes: split into shards of at most this many bytes (roxxel's rule: a shard
        holds at least one block).
      dtype: token dtype; default from the tokenizer's vocabulary, else the first item.
      separator: one token (an id, or ``itemsize`` bytes) written after every item; with a
        tokenizer it defaults to the tokenizer's EOS id.
      pad_id: the token that pads the final block; default the tokenizer's pad id, else the
        separator, else 0.
      tokenizer: ``"bytes"``, ``"cl100k_base"``, ``"o200k_base"``, a ``tokenizer.json`` path,
        or a tokenizer object; str items are encoded with it.
      if_exists: ``"error"`` (default), ``"append"`` (existing bytes are never modified) or
        ``"overwrite"``.
      manifest: write ``<base>.manifest.json`` with checksums, counts and tokenizer identity.
      progress: show a progress bar (tokens written) on a terminal.

    >>> import tempfile, os
    >>> from grain_rox import open_rox, write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "docs.rox")
    >>> result = write_rox(["hi", "yo!"], path, tokenizer="bytes", block_size=8)
    >>> result.num_documents, result.num_tokens, result.num_padding_tokens, str(result.dtype)
    (2, 7, 1, 'uint16')
    >>> with open_rox(path) as corpus:
    ...     print(corpus.tokens(0, 8).tolist(), corpus.eos_id)
    [104, 105, 256, 121, 111, 33, 256, 256] 256
    """
    path = os.fspath(path)
    if "*" in path or "?" in path:
        renamed = path.replace("*", "base").replace("?", "base")
        raise ValueError(
            f"the output path {path!r} contains glob characters (* or ?); roxxel would write "
            f"{renamed!r} or append to whatever the glob matches. Pass the real file name"
        )
    if not path.endswith(".rox"):
        raise ValueError(
            f"the output path {path!r} does not end in .rox; roxxel and grain_rox find shards "
            f"by that suffix. Pass e.g. {path + '.rox'!r}"
        )
    if if_exists not in ("error", "append", "overwrite"):
        raise ValueError(f"if_exists={if_exists!r}; use 'error', 'append' or 'overwrite'")
    if max_shard_bytes is not None and shard_number(os.path.basename(path)) >= 0:
        # Its set x_0003 would name x_0003.rox, a member of the set x, as one of its own.
        raise ValueError(
            f"the output path {path!r} ends in a shard number (_NNNN) but max_shard_bytes= "
            f"writes a shard set named after it ({path[:-4]}_NNNN.rox), whose names overlap "
            f"the set {set_base(path)}.rox; choose a base name without a shard number, e.g. "
            f"{set_base(path) + '-' + path[len(set_base(path)) + 1 :]!r}"
        )
    tok = get_tokenizer(tokenizer) if tokenizer is not None else None
    if isinstance(items, (str, bytes, np.ndarray)):
        items = [items]  # a single item, not an iterable of characters/rows
    target, item_iter = _resolve_dtype(iter(items), dtype, tok)
    encode_dtype(target)  # fails early on dtypes the footer cannot name
    itemsize = target.itemsize
    if block_size <= 0 or block_size % itemsize:
        raise ValueError(
            f"block_size={block_size} bytes is not a positive multiple of the {target} token size "
            f"({itemsize} bytes): blocks would split tokens; use e.g. "
            f"block_size={max(itemsize, block_size - block_size % itemsize)}"
        )
    if tok is not None and separator is None:
        separator = tok.eos_id
    sep = _separator_token(separator, target, tok)
    if pad_id is None:
        pad_id = tok.pad_id if tok is not None and tok.pad_id is not None else None
    pad = pad_id if pad_id is not None else (sep if sep is not None else 0)
    _dtype_range_check(np.asarray([pad]), target, f"pad_id {pad!r}")

    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    mpath = manifest_path_for(path) if max_shard_bytes is None else path[:-4] + MANIFEST_SUFFIX
    with set_write_lock(mpath, path):  # one writer per set at a time
        clean_leftovers(mpath)  # temporaries of killed writers to this set
        roll_back_interrupted(mpath)  # their uncommitted shards beside an intact previous set
        disk = scan_set(mpath)
        member = max_shard_bytes is None and shard_number(os.path.basename(path)) >= 0
        previous = previous_set(
            mpath,
            disk,
            strict=if_exists == "append" or member,
            replaced=os.path.basename(path) if member and if_exists == "overwrite" else None,
        )
        plan = _Plan(path, target, block_size, max_shard_bytes, if_exists, disk)
        if (if_exists == "append" or member) and previous.dtype:  # a set with a grain_rox manifest
            _check_append_compatible(previous, mpath, target, block_size, sep, tok)
        if plan.copy_from is not None:
            old = read_header(plan.copy_from)
            if old.dtype != target:
                raise ValueError(
                    f"cannot append {target} tokens to {plan.copy_from}, which holds {old.dtype}; "
                    f"pass dtype={old.dtype}"
                )

        encode = _ItemEncoder(target, tok)
        per_block = block_size // itemsize
        flush_tokens = max(per_block, (_FLUSH_BYTES // block_size) * per_block)
        sep_arr = None if sep is None else np.asarray([sep], dtype=target)
        pending: list[np.ndarray] = []
        pending_tokens = 0
        num_tokens = num_docs = 0
        # A document counts in the shard its first token lands in; shards have a fixed capacity.
        cap_tokens = None if plan.capacity is None else plan.capacity * per_block
        docs_per_file: collections.Counter[int] = collections.Counter()
        bar = _progress_bar(progress, path)
        try:
            for index, item in enumerate(item_iter):
                arr = encode(item, index)
                docs_per_file[0 if cap_tokens is None else num_tokens // cap_tokens] += 1
                num_docs += 1
                pending.append(arr)
                pending_tokens += arr.size
                num_tokens += arr.size
                if sep_arr is not None:
                    pending.append(sep_arr)
                    pending_tokens += 1
                    num_tokens += 1
                if pending_tokens >= flush_tokens:
                    buf = np.concatenate(pending).astype(target, copy=False)  # keeps >u2 order
                    whole = (buf.size // per_block) * per_block
                    plan.write(buf[:whole])
                    pending = [buf[whole:]]
                    pending_tokens = buf.size - whole
                    if bar is not None:
                        bar.update(whole)
            buf = (
                np.concatenate(pending).astype(target, copy=False)
                if pending
                else np.empty((0,), target)
            )
            num_pad = (-buf.size) % per_block
            if num_pad:
                buf = np.concatenate([buf, np.full(num_pad, pad, dtype=target)]).astype(
                    target, copy=False
                )
            if buf.size:
                plan.write(buf)
            if bar is not None:
                bar.update(buf.size)
            if not plan.files:
                if plan.copy_from is not None or if_exists == "append":
                    return WriteResult((), None, 0, 0, 0, target, block_size)
                raise ValueError(
                    f"nothing to write to {path}: the items hold no tokens (roxxel would leave an "
                    "unreadable 0-byte file here)"
                )
            results = [f.finish() for f in plan.files]
            mtimes = [os.stat(f.tmp_path).st_mtime_ns for f in plan.files]
        except BaseException:
            plan.discard()
            raise
        finally:
            if bar is not None:
                bar.close()

        last = len(plan.files) - 1
        for k in [k for k in docs_per_file if k > last]:  # documents starting in the final padding
            docs_per_file[last] += docs_per_file.pop(k)
        kept = previous.shards if if_exists == "append" or plan.member else {}
        final = _build_manifest(
            previous,
            kept,
            plan,
            results,
            mtimes,
            docs_per_file,
            num_pad,
            target,
            block_size,
            sep,
            pad,
            tok,
        )
        publish_set(
            mpath,
            disk,
            previous,
            final,
            [(f.tmp_path, f.final_path) for f in plan.files],
            discard=plan.discard,
            keep_manifest=manifest,
        )
        return WriteResult(
            paths=tuple(f.final_path for f in plan.files),
            manifest_path=mpath if manifest else None,
            num_tokens=num_tokens,
            num_padding_tokens=num_pad,
            num_documents=num_docs,
            dtype=target,
            block_size=block_size,
        )


def _progress_bar(enabled: bool, path: str) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(desc=f"writing {os.path.basename(path)}", unit="tok", unit_scale=True)


def _check_append_compatible(
    old: Manifest,
    mpath: str,
    dtype: np.dtype,
    block_size: int,
    sep: int | float | None,
    tok: Tokenizer | None,
) -> None:
    problems = []
    if old.dtype != str(dtype):
        problems.append(f"dtype {old.dtype} != {dtype}")
    if old.eos_id != sep:
        problems.append(f"eos/separator {old.eos_id} != {sep}")
    new_tok = tok.identity() if tok is not None else None
    if old.tokenizer != new_tok:
        old_name = (old.tokenizer or {}).get("name")
        new_name = (new_tok or {}).get("name")
        problems.append(f"tokenizer {old_name} != {new_name}")
    if problems:
        raise ValueError(
            f"cannot append to the shard set described by {mpath}: "
            + "; ".join(problems)
            + ". Write to a new path (and mix the two sets) or use the same settings"
        )


def _build_manifest(
    previous: Manifest,
    kept: dict[str, ShardRecord],
    plan: _Plan,
    results: list[tuple[int, int, str]],
    mtimes: list[int],
    docs_per_file: dict[int, int],
    num_pad: int,
    dtype: np.dtype,
    block_size: int,
    sep: int | float | None,
    pad: int | float,
    tok: Tokenizer | None,
) -> Manifest:
    """The new set's manifest: ``kept`` shards (an append's old ones) plus this write's."""
    shards = dict(kept)
    itemsize = dtype.itemsize
    last = len(plan.files) - 1
    for k, (f, (size, raw, digest)) in enumerate(zip(plan.files, results, strict=True)):
        name = os.path.basename(f.final_path)
        docs: int | None = docs_per_file.get(k, 0)
        padding = num_pad if k == last else 0
        if f.old_ends is not None:  # a copy-on-write append: add the old file's counts
            prev = shards.get(name)
            docs = (
                None
                if prev is None or prev.num_documents is None
                else prev.num_documents + (docs or 0)
            )
            padding += prev.num_padding_tokens if prev is not None else 0
        shards[name] = ShardRecord(
            file_size=size,
            num_blocks=f.num_blocks,
            raw_size=raw,
            sha256=digest,
            num_tokens=raw // itemsize,
            num_padding_tokens=padding,
            num_documents=docs,
            mtime_ns=mtimes[k],
        )
    shards = {n: shards[n] for n in sorted(shards, key=shard_number)}
    total_docs: int | None = None
    if all(r.num_documents is not None for r in shards.values()):
        total_docs = sum(r.num_documents or 0 for r in shards.values())
    appended = bool(kept) and previous.block_size > 0
    return Manifest(
        dtype=str(dtype),
        block_size=previous.block_size if appended else block_size,
        shards=shards,
        eos_id=None if sep is None else sep,  # type: ignore[arg-type]
        pad_id=pad,  # type: ignore[arg-type]
        tokenizer=tok.identity() if tok is not None else None,
        num_documents=total_docs,
        write_id=new_write_id(),
    )
