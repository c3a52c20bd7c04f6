"""A corpus of `.rox` shards: one virtual token stream and roxxel's global block order.

Opening reads each shard's footer and checks it (O(1) per shard, no data read), so a corpus of
any size opens in milliseconds with no memory proportional to its size. Shards are
memory-mapped lazily, per process, on first access; pickling drops the maps, so a corpus can be
sent to Grain worker processes and reopens there.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import hashlib
import json
import mmap
import os
import threading
from typing import Any

import numpy as np

from grain_rox._format._manifest import Manifest, ShardRecord, manifest_path_for
from grain_rox._format._paths import PathSpec, resolve_shard_paths
from grain_rox._format._rox_format import (
    FULL_INDEX_CHECK_LIMIT,
    INDEX_DTYPE,
    RoxFormatError,
    ShardHeader,
    check_index,
    read_header,
)
from grain_rox._format._shard_set import current_manifest, file_sha256, leftovers_of

_SAMPLE_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """Facts about one shard of a corpus (see :attr:`RoxCorpus.shards`).

    >>> import tempfile, os
    >>> from grain_rox import open_rox, write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "s.rox")
    >>> _ = write_rox(["abcdefgh"], path, block_size=4)
    >>> info = open_rox(path).shards[0]
    >>> info.num_blocks, info.num_tokens, info.num_documents
    (2, 8, 1)
    """

    path: str
    file_size: int
    num_blocks: int
    num_tokens: int
    first_block: int  # global index of this shard's first block
    first_token: int  # global offset of this shard's first token
    block_size: int  # bytes in this shard's first block (roxxel's notion of block size)
    sha256: str | None  # from the manifest, if any
    num_documents: int | None  # from the manifest, if any


FileIdentity = tuple[int, int, int, int]


def file_identity(st: os.stat_result) -> FileIdentity:
    """The (st_dev, st_ino, st_mtime_ns, st_size) of a file: which file version a path named
    when a corpus was opened (a replacement or an in-place edit changes it)."""
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


class _MappedShard:
    """One shard's memory map, opened on first use."""

    __slots__ = ("ends", "mm", "tokens")

    def __init__(self, header: ShardHeader, identity: FileIdentity) -> None:
        self.mm: mmap.mmap | None = None
        self.tokens: np.ndarray
        self.ends: np.ndarray
        if header.raw_size == 0:
            self.tokens = np.empty((0,), header.dtype)
            self.ends = np.empty((0,), INDEX_DTYPE)
            return
        with open(header.path, "rb") as f:
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
        self.ends = np.frombuffer(
            self.mm, INDEX_DTYPE, count=header.num_blocks, offset=header.raw_size
        )

    def close(self) -> None:
        mm, self.mm = self.mm, None
        if mm is not None:
            # Views handed out stay valid: if any is alive the map is released with the last one.
            with contextlib.suppress(BufferError):
                mm.close()


class RoxCorpus:
    """One or many `.rox` shards read as a single corpus. Make one with :func:`open_rox`.

    ``len(corpus)`` is the number of blocks (roxxel's records) over all shards in roxxel's
    order; ``corpus[i]`` is block ``i`` as a zero-copy numpy view; ``corpus.tokens(a, b)`` is a
    slice of the virtual concatenation of all shards' tokens (zero-copy inside one shard).

    >>> import tempfile, os, numpy as np
    >>> from grain_rox import open_rox, write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "demo.rox")
    >>> _ = write_rox([np.arange(6, dtype=np.uint16)], path, block_size=8)
    >>> with open_rox(path) as corpus:
    ...     print(len(corpus), corpus.dtype, corpus.block_size, corpus.num_tokens)
    ...     print(corpus[1], corpus.tokens(2, 6))
    2 uint16 8 8
    [4 5 0 0] [2 3 4 5]
    """

    def __init__(
        self,
        headers: list[ShardHeader],
        records: list[ShardRecord | None],
        manifests: dict[str, Manifest],
        uniform: list[bool | None],
        identities: list[FileIdentity],
    ) -> None:
        if not headers:
            raise FileNotFoundError("a RoxCorpus needs at least one shard")
        self._headers = headers
        self._records = records
        self._manifests = manifests
        self._uniform = uniform
        self._identities = identities  # pickled with the corpus: workers map the same files
        self._block_starts = np.cumsum([0] + [h.num_blocks for h in headers], dtype=np.int64)
        self._token_starts = np.cumsum([0] + [h.num_tokens for h in headers], dtype=np.int64)
        self._block_starts_list = self._block_starts.tolist()
        self._token_starts_list = self._token_starts.tolist()
        self._lock = threading.Lock()
        self._maps: list[_MappedShard | None] = [None] * len(headers)
        self._fingerprint: str | None = None

    # ---- facts -----------------------------------------------------------------------------
    @property
    def dtype(self) -> np.dtype:
        """The token dtype (the same in every shard)."""
        return self._headers[0].dtype

    @property
    def block_size(self) -> int:
        """Bytes per block, as roxxel defines it: the length of shard 0's first block."""
        return self._headers[0].first_block_bytes

    @property
    def block_tokens(self) -> int:
        """Tokens per block (``block_size // dtype.itemsize``)."""
        return self.block_size // self.dtype.itemsize

    @property
    def num_tokens(self) -> int:
        """Tokens in the virtual stream, padding included."""
        return self._token_starts_list[-1]

    @property
    def paths(self) -> tuple[str, ...]:
        """The shard files, in the corpus's (roxxel's) order."""
        return tuple(h.path for h in self._headers)

    @property
    def shards(self) -> tuple[ShardInfo, ...]:
        """Per-shard facts, in order."""
        return tuple(
            ShardInfo(
                path=h.path,
                file_size=h.file_size,
                num_blocks=h.num_blocks,
                num_tokens=h.num_tokens,
                first_block=self._block_starts_list[i],
                first_token=self._token_starts_list[i],
                block_size=h.first_block_bytes,
                sha256=r.sha256 if r else None,
                num_documents=r.num_documents if r else None,
            )
            for i, (h, r) in enumerate(zip(self._headers, self._records, strict=True))
        )

    def _shared_fact(self, name: str) -> Any:
        values = {json.dumps(getattr(m, name), sort_keys=True) for m in self._manifests.values()}
        return json.loads(values.pop()) if len(values) == 1 else None

    @property
    def eos_id(self) -> int | None:
        """The EOS / separator token id recorded in the manifest(s), or None if unknown."""
        return self._shared_fact("eos_id")

    @property
    def pad_id(self) -> int | None:
        """The padding token id recorded in the manifest(s), or None if unknown."""
        return self._shared_fact("pad_id")

    @property
    def tokenizer(self) -> dict[str, Any] | None:
        """The tokenizer identity recorded in the manifest(s), or None."""
        return self._shared_fact("tokenizer")

    @property
    def num_documents(self) -> int | None:
        """Documents written, when every shard's manifest records it; else None."""
        counts = [r.num_documents if r else None for r in self._records]
        return None if any(c is None for c in counts) else sum(c for c in counts if c)

    @property
    def manifest_paths(self) -> tuple[str, ...]:
        """The manifests that describe (some of) these shards."""
        return tuple(self._manifests)

    @property
    def leftover_temps(self) -> tuple[str, ...]:
        """Hidden temporary files that killed writers left beside these shards' sets (not part
        of the data; the next write to the set removes them). Scans the directories."""
        return tuple(leftovers_of(list(self.paths)))

    @property
    def uniform_blocks(self) -> bool | None:
        """Whether every block has :attr:`block_size` bytes (None: not checked yet, see verify)."""
        if any(h.first_block_bytes != self.block_size for h in self._headers if h.num_blocks):
            return False
        if any(u is False for u in self._uniform):
            return False
        return None if any(u is None for u in self._uniform) else True

    @property
    def fingerprint(self) -> str:
        """A short hash identifying the content, computed once, O(1) per unchanged shard.

        Per shard: its name, size and footer, the manifest's sha256, and a hash of its first
        and last 4 KiB of tokens. With a manifest, a shard whose size or mtime_ns differs from
        the recorded ones is re-hashed (once per process per file version) and must still have
        the recorded sha256, else :class:`RoxFormatError` names it: a shard changed in place at
        the same size cannot pass as the data a checkpoint was made on, while a byte-identical
        copy or a moved directory gives the same fingerprint. Without a manifest (files
        written by roxxel), or with one from a grain_rox that did not record mtimes, only the
        sampled bytes and sizes count: a same-size change outside the first and last 4 KiB is
        not detected.
        """
        if self._fingerprint is None:
            h = hashlib.sha1()
            for s, (header, record) in enumerate(zip(self._headers, self._records, strict=True)):
                if record is not None:
                    _check_unchanged(header.path, record)
                h.update(json.dumps([*header.facts(), record.sha256 if record else None]).encode())
                if header.raw_size:
                    with open(header.path, "rb") as f:
                        h.update(f.read(_SAMPLE_BYTES))
                        f.seek(max(0, header.raw_size - _SAMPLE_BYTES))
                        h.update(f.read(min(_SAMPLE_BYTES, header.raw_size)))
                h.update(str(s).encode())
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint

    def __repr__(self) -> str:
        return (
            f"RoxCorpus(shards={len(self._headers)}, dtype={self.dtype}, "
            f"blocks={len(self)}, tokens={self.num_tokens}, fingerprint={self.fingerprint})"
        )

    def __len__(self) -> int:
        return self._block_starts_list[-1]

    # ---- reading ---------------------------------------------------------------------------
    def _map(self, s: int) -> _MappedShard:
        m = self._maps[s]
        if m is None:
            with self._lock:
                m = self._maps[s]
                if m is None:
                    m = _MappedShard(self._headers[s], self._identities[s])
                    if self._uniform[s] is None:  # index not walked at open: walk it once now
                        self._uniform[s] = check_index(self._headers[s], m.ends)
                    self._maps[s] = m
        return m

    def shard_tokens(self, s: int) -> np.ndarray:
        """Shard ``s``'s whole token region as a zero-copy view."""
        return self._map(s).tokens

    def locate_block(self, index: int) -> tuple[int, int]:
        """Return (shard number, block number within the shard) of global block ``index``."""
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"block index {index} is out of range for {n} blocks")
        s = bisect.bisect_right(self._block_starts_list, i) - 1
        return s, i - self._block_starts_list[s]

    def __getitem__(self, index: int) -> np.ndarray:
        """Block ``index`` (negative counts from the end) as a zero-copy view of its tokens."""
        s, j = self.locate_block(int(index))
        m = self._map(s)
        h = self._headers[s]
        start = int(m.ends[j - 1]) if j else 0
        end = int(m.ends[j])
        isz = h.dtype.itemsize
        if not (0 <= start < end <= h.raw_size and start % isz == 0 and end % isz == 0):
            raise RoxFormatError(
                h.path,
                f"block {j} spans bytes [{start}, {end}) of a {h.raw_size}-byte raw region: "
                "the index is damaged",
                "re-create the shard; grain-rox verify checks every shard's whole index",
            )
        return m.tokens[start // isz : end // isz]

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the virtual stream (all shards' raw regions, in order).

        A zero-copy view when the range lies in one shard; a new array when it crosses shards.
        """
        n = self.num_tokens
        if not 0 <= start <= stop <= n:
            raise IndexError(f"token range [{start}, {stop}) is outside [0, {n}]")
        starts = self._token_starts_list
        if start == stop:
            return np.empty((0,), self.dtype)
        s = bisect.bisect_right(starts, start) - 1
        if stop <= starts[s + 1]:
            return self._map(s).tokens[start - starts[s] : stop - starts[s]]
        pieces = []
        pos = start
        while pos < stop:
            end = min(stop, starts[s + 1])
            pieces.append(self._map(s).tokens[pos - starts[s] : end - starts[s]])
            pos = end
            s += 1
        return np.concatenate(pieces)

    # ---- checking --------------------------------------------------------------------------
    def verify(self, *, checksums: bool = True) -> None:
        """Check every shard's whole index and, with a manifest, its sha256 checksum.

        Raises :class:`RoxFormatError` naming the first damaged shard.
        """
        for s, (h, r) in enumerate(zip(self._headers, self._records, strict=True)):
            if h.num_blocks:
                self._uniform[s] = check_index(h, self._map(s).ends)
            if checksums and r is not None:
                r.check_checksum(h.path)

    # ---- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        """Drop the memory maps (views already handed out stay valid). Reopens on next read."""
        with self._lock:
            maps, self._maps = self._maps, [None] * len(self._headers)
        for m in maps:
            if m is not None:
                m.close()

    def __enter__(self) -> RoxCorpus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_maps"] = [None] * len(self._headers)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def _check_unchanged(path: str, record: ShardRecord) -> None:
    """Raise if a shard's bytes are not the ones its manifest records (hashing only if its
    size or mtime_ns changed since the write)."""
    if record.sha256 is None or record.mtime_ns is None:
        return  # a manifest from before grain_rox recorded mtimes: not checked (re-write it)
    st = os.stat(path)
    if st.st_size == record.file_size and st.st_mtime_ns == record.mtime_ns:
        return
    digest = file_sha256(path, st)
    if digest != record.sha256:
        raise RoxFormatError(
            path,
            f"its content changed after it was written: its sha256 is {digest} but "
            f"{manifest_path_for(path)} records {record.sha256}",
            "re-create the shard set (or restore the shard from a copy); a checkpoint made on "
            "the data as written cannot continue on these bytes",
        )


def _load_shard_facts(
    paths: list[str],
) -> tuple[
    list[ShardHeader],
    list[ShardRecord | None],
    dict[str, Manifest],
    list[bool | None],
    list[FileIdentity],
]:
    headers: list[ShardHeader] = []
    identities: list[FileIdentity] = []
    records: list[ShardRecord | None] = []
    manifests: dict[str, Manifest] = {}
    uniform: list[bool | None] = []
    tried: dict[str, Manifest | None] = {}
    index_budget = FULL_INDEX_CHECK_LIMIT
    for path in paths:
        # Before the footer is read: a file replaced after this stat is refused when mapped.
        identities.append(file_identity(os.stat(path)))
        header = read_header(path)
        if headers and header.dtype != headers[0].dtype:
            raise RoxFormatError(
                path,
                f"its dtype is {header.dtype} but {headers[0].path} (the corpus's first shard) "
                f"is {headers[0].dtype}; one corpus holds one token dtype",
                "open shard sets of different dtypes as separate corpora (and mix them)",
            )
        mpath = manifest_path_for(path)
        if mpath not in tried:
            tried[mpath] = current_manifest(mpath)
        manifest = tried[mpath]
        record = manifest.shards.get(os.path.basename(path)) if manifest else None
        if manifest is not None and record is not None:
            record.check(header, mpath)
            if manifest.dtype != header.dtype.str and manifest.dtype != str(header.dtype):
                raise RoxFormatError(
                    path,
                    f"the manifest {mpath} says dtype {manifest.dtype} but the shard's footer "
                    f"says {header.dtype}",
                    "delete the stale manifest or re-create the shard set",
                )
            manifests[mpath] = manifest
        if 0 < header.num_blocks <= index_budget:
            # Small corpora: walk every index now. Large ones: each shard's index is walked
            # when the shard is first mapped, so opening stays O(1) per shard.
            index_budget -= header.num_blocks
            ends = np.fromfile(path, INDEX_DTYPE, count=header.num_blocks, offset=header.raw_size)
            uniform.append(check_index(header, ends))
        else:
            uniform.append(True if header.num_blocks == 0 else None)
        headers.append(header)
        records.append(record)
    return headers, records, manifests, uniform, identities


def open_rox(
    paths: PathSpec | RoxCorpus, *, verify: bool = False, roxxel_names: bool = False
) -> RoxCorpus:
    """Open `.rox` shards (a file, glob, directory, set name or list) as one :class:`RoxCorpus`.

    Globs, directories and lists are resolved and ordered as roxxel resolves them. A set name
    (``data/train.rox`` that is not a file) means ``data/train_NNNN.rox`` and nothing looser;
    ``roxxel_names=True`` restores roxxel's ``train*.rox`` fallback (see
    :func:`grain_rox._format._paths.resolve_shard_paths`). A set written by grain_rox must be exactly
    the set its manifest records (no extra, missing, resized or half-overwritten shards). Every shard's footer,
    size and index are validated (see :class:`RoxFormatError`); ``verify=True`` also checks
    sha256 checksums recorded in a manifest. Use it as a context manager.

    >>> import tempfile, os
    >>> from grain_rox import write_rox
    >>> d = tempfile.mkdtemp()
    >>> _ = write_rox(["hello ", "world"], os.path.join(d, "t.rox"), block_size=4)
    >>> with open_rox(d) as corpus:
    ...     print(bytes(corpus.tokens(0, corpus.num_tokens)))
    b'hello world\\x00'
    """
    if isinstance(paths, RoxCorpus):
        return paths
    resolved = resolve_shard_paths(paths, roxxel_names=roxxel_names)
    headers, records, manifests, uniform, identities = _load_shard_facts(resolved)
    corpus = RoxCorpus(headers, records, manifests, uniform, identities)
    if verify:
        corpus.verify(checksums=True)
    return corpus
