"""A corpus of `.rox` shards: one virtual token stream and roxxel's global block order.

Opening reads each shard's footer and checks it (O(1) per shard, no data read), so a corpus of
any size opens in milliseconds with no memory proportional to its size. Shards are
memory-mapped lazily, per process, on first access; pickling drops the maps, so a corpus can be
sent to Grain worker processes and reopens there.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from grain_rox._format._leftovers import leftovers_of
from grain_rox._format._manifest import Manifest, ShardRecord, manifest_path_for
from grain_rox._format._mapped_shard import FileIdentity, MappedShard, file_identity
from grain_rox._format._object_store import ObjectInfo, is_url
from grain_rox._format._paths import PathSpec, resolve_shard_paths
from grain_rox._format._remote_set import check_object_checksum
from grain_rox._format._remote_shard import (
    ObjectRef,
    RemoteShard,
    gather_remote,
    spans_remote,
)
from grain_rox._format._rox_format import (
    FULL_INDEX_CHECK_LIMIT,
    RoxFormatError,
    ShardHeader,
    check_index,
)
from grain_rox._format._shard_facts import content_fingerprint, load_shard_facts

# A mapped shard's file is checked for an in-place rewrite at most this often, as it is read
# (one stat; a rewrite is refused within this long of its first byte, instead of mixed in).
WATCH_SECONDS = 0.05


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """Facts about one shard of a corpus (see :attr:`RoxCorpus.shards`).

    Attributes:
      path: the shard file.
      file_size: its size in bytes (raw region, index and footer).
      num_blocks: its blocks (roxxel's records).
      num_tokens: the tokens in its raw region, padding included.
      first_block: the corpus-wide index of its first block.
      first_token: the corpus-wide offset of its first token.
      block_size: bytes in its first block (roxxel's notion of block size).
      sha256: its checksum from the manifest, or None without one.
      num_documents: the documents written to it, from the manifest, or None.
      num_padding_tokens: the padding that fills its last block after the documents, from
        the manifest, or None without one.

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
    first_block: int
    first_token: int
    block_size: int
    sha256: str | None
    num_documents: int | None
    num_padding_tokens: int | None = None


def tokenizer_key(tok: dict[str, Any] | None) -> str:
    """What makes two recorded tokenizers the same: their kind, vocabulary size, EOS id and
    content (the sha256 where one is recorded, else the name: a tokenizer.json copied to
    another folder, whose name is that folder's, is the same tokenizer).

    >>> a = {"kind": "hf", "name": "hf:llama", "sha256": "ab", "vocab_size": 9, "eos_id": 1}
    >>> tokenizer_key(a) == tokenizer_key({**a, "name": "hf:copy"})
    True
    """
    if tok is None:
        return "null"
    content = tok.get("sha256") or tok.get("name")
    return json.dumps([tok.get("kind"), content, tok.get("vocab_size"), tok.get("eos_id")])


def tokenizer_words(tok: dict[str, Any] | None) -> str:
    """A recorded tokenizer in words: ``tokenizer 'cl100k_base' sha256 223921b76ee9``."""
    if tok is None:
        return "no tokenizer recorded"
    sha = f" sha256 {tok['sha256'][:12]}" if tok.get("sha256") else ""
    return f"tokenizer {tok.get('name')!r}{sha}"


class RoxCorpus:
    """One or many `.rox` shards read as a single corpus. Make one with :func:`open_rox`.

    ``len(corpus)`` is the number of blocks (roxxel's records) over all shards in roxxel's
    order; ``corpus[i]`` is block ``i`` as a zero-copy numpy view; ``corpus.tokens(a, b)`` is a
    slice of the virtual concatenation of all shards' tokens (zero-copy inside one shard).

    Args:
      headers: each shard's checked footer (:func:`grain_rox._format._rox_format.read_header`),
        in order; at least one.
      records: each shard's manifest record, or None.
      manifests: the manifests that describe some of the shards, by path.
      uniform: per shard, whether all its blocks have its first block's size (None: its index
        is walked when the shard is first mapped).
      identities: each shard's file version when it was opened; a shard that is no longer
        that version is refused when mapped.

    :func:`open_rox` reads and checks all of these; build a corpus with it, not by hand.

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
        identities: list[FileIdentity | ObjectRef],
        indexes: list[np.ndarray | None] | None = None,
    ) -> None:
        if not headers:
            raise FileNotFoundError("a RoxCorpus needs at least one shard")
        self._headers = headers
        self._records = records
        self._bare = any(r is None for r in records)  # a shard without a manifest (roxxel's)
        self._manifests = manifests
        self._uniform = uniform
        self._identities = identities  # pickled with the corpus: workers map the same files
        self._indexes = indexes or [None] * len(headers)  # remote indexes read with footers
        self._remote = any(isinstance(i, ObjectRef) for i in identities)
        self._block_starts = np.cumsum([0] + [h.num_blocks for h in headers], dtype=np.int64)
        self._token_starts = np.cumsum([0] + [h.num_tokens for h in headers], dtype=np.int64)
        self._block_starts_list = self._block_starts.tolist()
        self._token_starts_list = self._token_starts.tolist()
        self._lock = threading.Lock()
        self._maps: list[MappedShard | RemoteShard | None] = [None] * len(headers)
        self._watch_at = [0.0] * len(headers)  # when each mapped shard's file is next checked
        self._fingerprint: str | None = None

    # ---- facts -----------------------------------------------------------------------------
    @property
    def dtype(self) -> np.dtype:
        """The token dtype (the same in every shard)."""
        return self._headers[0].dtype

    @property
    def block_size(self) -> int:
        """Bytes per block, as roxxel defines it: the length of the first block (of the
        first shard that has one; 0 when none has)."""
        return next((h.first_block_bytes for h in self._headers if h.num_blocks), 0)

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
                num_padding_tokens=r.num_padding_tokens if r else None,
            )
            for i, (h, r) in enumerate(zip(self._headers, self._records, strict=True))
        )

    def set_facts(self) -> list[tuple[str, Any, Any]]:
        """``(what, tokenizer, eos_id)`` of each shard set this corpus joins: ``what`` is a
        set's manifest path (with the facts it records), or, for shards no manifest covers
        (roxxel's), ``"<n> shard(s) without a manifest (first: <path>)"`` with ``None, None``."""
        facts: list[tuple[str, Any, Any]] = [
            (path, m.tokenizer, m.eos_id) for path, m in self._manifests.items()
        ]
        bare = [h.path for h, r in zip(self._headers, self._records, strict=True) if r is None]
        if bare:
            facts.append(
                (f"{len(bare)} shard(s) without a manifest (first: {bare[0]})", None, None)
            )
        return facts

    def describe_sets(self) -> str:
        """Each set's tokenizer and EOS id, for messages (``a.manifest.json: tokenizer
        'bytes', EOS id 256; ...``)."""
        return "; ".join(
            f"{what}: {tokenizer_words(tok)}, EOS id {eos}" for what, tok, eos in self.set_facts()
        )

    def eos_disagreement(self) -> str | None:
        """What is wrong when this corpus's shard sets do not share one EOS id, some recording
        one (a set of other EOS ids, or one without a manifest beside one with): the segment
        features would cut one set's documents at another's EOS id; None when they agree or
        none records one (roxxel's own files)."""
        facts = self.set_facts()
        if len({json.dumps(eos) for _, _, eos in facts}) <= 1:
            return None
        return (
            "its shard sets end their documents with different EOS ids, or not every set "
            f"records one ({self.describe_sets()})"
        )

    def why_no_eos(self) -> str:
        """Why :attr:`eos_id` is None, for messages: the sets disagree, no manifest, or a
        manifest that records none (a set written as token ids without a separator)."""
        if self.manifest_paths and not self.eos_disagreement():
            return f"{', '.join(self.manifest_paths)} records no EOS id: it was written without one"
        return self.eos_disagreement() or "the shards have no manifest"

    def _shared_fact(self, name: str) -> Any:
        """The manifests' ``name`` when every shard has a manifest and all of them agree; else
        None (unknown: shards without one, roxxel's, are not to be read by another's facts)."""
        if self._bare:  # (asked for each record a source serves: no pass over the shards)
            return None
        values = {json.dumps(getattr(m, name), sort_keys=True) for m in self._manifests.values()}
        if len(values) != 1:
            return None
        return json.loads(values.pop())

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

    def trailing_padding(self) -> list[tuple[int, Any]]:
        """Each shard's ``(tokens of padding at its end, the pad id)`` as its own manifest
        records them (its last write's padding; ``(0, None)`` where no manifest says).

        >>> import tempfile, os, numpy as np
        >>> from grain_rox import write_rox
        >>> path = os.path.join(tempfile.mkdtemp(), "t.rox")
        >>> _ = write_rox([np.arange(1, 6, dtype=np.uint16)], path, separator=0, block_size=16)
        >>> open_rox(path).trailing_padding()
        [(2, 0)]
        """
        return [
            (0, None) if pad is None else (min(record.trailing_padding, header.num_tokens), pad)
            for header, record, pad in self._padded_records()
        ]

    def padding_spans(self) -> list[tuple[list[tuple[int, int]], Any]]:
        """Each shard's ``([(token offset, count), ...], pad id)`` of the padding appends to
        a single file left mid-stream, as its own manifest records it (``([], None)`` where no
        manifest says).

        >>> import tempfile, os, numpy as np
        >>> from grain_rox import write_rox
        >>> path = os.path.join(tempfile.mkdtemp(), "t.rox")
        >>> _ = write_rox([np.arange(1, 6, dtype=np.uint16)], path, separator=0, block_size=16)
        >>> _ = write_rox([np.arange(1, 3, dtype=np.uint16)], path, separator=0, block_size=16,
        ...               if_exists="append")
        >>> open_rox(path).padding_spans()
        [([(6, 2)], 0)]
        """
        return [
            ([(int(a), int(n)) for a, n in record.padding_spans], pad)
            if pad is not None and record.padding_spans
            else ([], None)
            for _, record, pad in self._padded_records()
        ]

    def _padded_records(self) -> list[tuple[ShardHeader, Any, Any]]:
        """Each shard's header, manifest record and the pad id its manifest names (the pad
        None where there is no manifest or no record: no padding is known)."""
        out = []
        for header, record in zip(self._headers, self._records, strict=True):
            manifest = self._manifests.get(manifest_path_for(header.path))
            pad = None if manifest is None or record is None else manifest.pad_id
            out.append((header, record, pad))
        return out

    @property
    def manifest_paths(self) -> tuple[str, ...]:
        """The manifests that describe (some of) these shards."""
        return tuple(self._manifests)

    @property
    def leftover_temps(self) -> tuple[str, ...]:
        """Hidden temporary files that killed writers left beside these shards' sets (not part
        of the data; the next write to the set removes them). Scans the directories."""
        return tuple(leftovers_of([p for p in self.paths if not is_url(p)]))

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
            self._fingerprint = content_fingerprint(self._headers, self._records, self._identities)
        return self._fingerprint

    def __repr__(self) -> str:
        return (
            f"RoxCorpus(shards={len(self._headers)}, dtype={self.dtype}, "
            f"blocks={len(self)}, tokens={self.num_tokens}, fingerprint={self.fingerprint})"
        )

    def __len__(self) -> int:
        return self._block_starts_list[-1]

    # ---- reading ---------------------------------------------------------------------------
    @property
    def remote(self) -> bool:
        """Whether any shard is an object in a bucket (read by ranged requests, not mapped)."""
        return self._remote

    def _map(self, s: int, now: ObjectInfo | None = None) -> MappedShard | RemoteShard:
        mapped = self._maps[s]
        if mapped is not None and isinstance(mapped, MappedShard):
            if time.monotonic() >= self._watch_at[s]:
                self._check_not_rewritten(s)
            return mapped
        if mapped is None:
            with self._lock:
                mapped = self._maps[s]
                if mapped is None:
                    identity = self._identities[s]
                    if isinstance(identity, ObjectRef):
                        mapped = RemoteShard(self._headers[s], identity, self._indexes[s], now)
                    else:
                        mapped = MappedShard(self._headers[s], identity)
                    if self._uniform[s] is None:  # index not walked at open: walk it once now
                        self._uniform[s] = check_index(self._headers[s], mapped.ends)
                    self._maps[s] = mapped
        return mapped

    def _check_not_rewritten(self, s: int) -> None:
        """Refuse shard ``s`` if its file was rewritten in place since it was mapped (checked
        at most every :data:`WATCH_SECONDS` a shard, as it is read): a memory map shows the new
        bytes at once, so batches would mix two versions of the data (a file replaced by a
        rename leaves the map on the old one, which reads on unchanged)."""
        self._watch_at[s] = time.monotonic() + WATCH_SECONDS
        identity = self._identities[s]
        path = self._headers[s].path
        try:
            now = file_identity(os.stat(path))
        except OSError:  # deleted: the map holds the file it was, unchanged
            return
        if not isinstance(identity, ObjectRef) and now[:2] == identity[:2] and now != identity:
            raise RoxFormatError(
                path,
                f"the shard was rewritten in place while it was being read (size {identity[3]} "
                f"-> {now[3]} bytes, mtime_ns {identity[2]} -> {now[2]}): its memory map now "
                "shows the new bytes, and batches would mix two versions of the data",
                "never rewrite a shard in place while a run reads it (write a new file and "
                "rename it over the old one, as grain-rox convert does); then make a new "
                "pipeline, or restore the run from a checkpoint of the data it was trained on",
            )

    def _map_many(self, shards: list[int]) -> None:
        """Map the remote ones of ``shards`` not mapped yet, their version checks looked up
        together (one listing per prefix) rather than one round trip each."""
        new = [s for s in dict.fromkeys(shards) if self._maps[s] is None]
        refs = [(s, i) for s in new if isinstance(i := self._identities[s], ObjectRef)]
        if len(refs) < 2:
            return
        stores: dict[int, list[tuple[int, ObjectRef]]] = {}
        for s, ref in refs:
            stores.setdefault(id(ref.store), []).append((s, ref))
        for group in stores.values():
            try:
                infos = group[0][1].store.infos([ref.url for _, ref in group])
            except FileNotFoundError:  # one was removed: each looked up alone, to name it
                infos = {}
            for s, ref in group:
                self._map(s, infos.get(ref.url))

    def shard_tokens(self, s: int) -> np.ndarray:
        """Shard ``s``'s whole token region as a zero-copy view of its memory map.

        A shard in a bucket has no map: read it with :meth:`shard_slice` or :meth:`gather`.
        """
        tokens = self._map(s).tokens
        if tokens is None:
            raise TypeError(
                f"{self._headers[s].path} is an object in a bucket, read by ranged requests: "
                "it has no memory map to view whole. Fix: read it with corpus.shard_slice(s, "
                "start, stop), corpus.gather(s, starts, width) or corpus.tokens(start, stop)"
            )
        return tokens

    def shard_slice(self, s: int, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of shard ``s``: a zero-copy view of a local shard's map, a
        new array read by one ranged request (through the block cache) for a remote one."""
        return self._map(s).slice(start, stop)

    def gather_many(self, requests: list[tuple[int, np.ndarray, int]]) -> list[np.ndarray]:
        """:meth:`gather` for several ``(shard, starts, width)`` at once: the remote ones in one
        concurrent round trip (a batch whose windows lie in eight shards waits once).

        >>> import tempfile, os, numpy as np
        >>> from grain_rox import open_rox, write_rox
        >>> path = os.path.join(tempfile.mkdtemp(), "m.rox")
        >>> _ = write_rox([np.arange(10, dtype=np.uint16)], path, block_size=8, max_shard_bytes=8)
        >>> [a.tolist() for a in open_rox(path).gather_many([(0, np.array([1]), 2), (2, np.array([0]), 2)])]
        [[[1, 2]], [[8, 9]]]
        """
        if not self._remote:
            return [self._map(s).gather(starts, width) for s, starts, width in requests]
        self._map_many([s for s, _, _ in requests])
        out: list[np.ndarray | None] = [None] * len(requests)
        remote: list[tuple[int, RemoteShard]] = []
        for i, (s, starts, width) in enumerate(requests):
            shard = self._map(s)
            if isinstance(shard, RemoteShard):
                remote.append((i, shard))
            else:
                out[i] = shard.gather(starts, width)
        got = gather_remote([(shard, requests[i][1], requests[i][2]) for i, shard in remote])
        for (i, _), rows in zip(remote, got, strict=True):
            out[i] = rows
        return [rows for rows in out if rows is not None]

    def shard_spans_many(
        self, requests: list[tuple[int, list[tuple[int, int]]]]
    ) -> list[list[np.ndarray]]:
        """:meth:`shard_spans` for several ``(shard, spans)`` at once: the remote ones in one
        concurrent round trip."""
        if not self._remote:
            return [self._map(s).spans(spans) for s, spans in requests]
        self._map_many([s for s, _ in requests])
        out: list[list[np.ndarray] | None] = [None] * len(requests)
        remote: list[tuple[int, RemoteShard]] = []
        for i, (s, spans) in enumerate(requests):
            shard = self._map(s)
            if isinstance(shard, RemoteShard):
                remote.append((i, shard))
            else:
                out[i] = shard.spans(spans)
        got = spans_remote([(shard, requests[i][1]) for i, shard in remote])
        for (i, _), pieces in zip(remote, got, strict=True):
            out[i] = pieces
        return [pieces for pieces in out if pieces is not None]

    def shard_spans(self, s: int, spans: list[tuple[int, int]]) -> list[np.ndarray]:
        """Tokens ``[a, b)`` of shard ``s`` for each span: views of a local shard's map, one
        concurrent batch of ranged requests (through the block cache) for a remote one."""
        return self._map(s).spans(spans)

    def iter_shard(self, s: int, chunk_tokens: int = 1 << 24) -> Iterator[tuple[int, np.ndarray]]:
        """Shard ``s``'s tokens as (offset, tokens) chunks of ``chunk_tokens``: a scan in
        bounded memory, local or remote.

        >>> import tempfile, os, numpy as np
        >>> from grain_rox import open_rox, write_rox
        >>> path = os.path.join(tempfile.mkdtemp(), "c.rox")
        >>> _ = write_rox([np.arange(5, dtype=np.uint16)], path, block_size=10)
        >>> [(at, c.tolist()) for at, c in open_rox(path).iter_shard(0, chunk_tokens=2)]
        [(0, [0, 1]), (2, [2, 3]), (4, [4])]
        """
        n = self._headers[s].num_tokens
        for lo in range(0, n, chunk_tokens):
            yield lo, self.shard_slice(s, lo, min(n, lo + chunk_tokens))

    def gather(self, s: int, starts: np.ndarray, width: int) -> np.ndarray:
        """Shard ``s``'s ``width``-token windows that start at token offsets ``starts``, as
        an (n, width) array: one vectorised copy from a local shard's map, one concurrent
        batch of ranged requests (through the block cache) for a remote one.

        >>> import tempfile, os, numpy as np
        >>> from grain_rox import open_rox, write_rox
        >>> path = os.path.join(tempfile.mkdtemp(), "g.rox")
        >>> _ = write_rox([np.arange(10, dtype=np.uint16)], path, block_size=20)
        >>> open_rox(path).gather(0, np.array([4, 0]), 3).tolist()
        [[4, 5, 6], [0, 1, 2]]
        """
        return self._map(s).gather(starts, width)

    def shard_index(self, s: int) -> np.ndarray:
        """Shard ``s``'s block index, walked and checked: where each block ends, in bytes from
        the start of the shard (int64, a zero-copy view).

        >>> import tempfile, os
        >>> from grain_rox import open_rox, write_rox
        >>> path = os.path.join(tempfile.mkdtemp(), "x.rox")
        >>> _ = write_rox(["abcdef"], path, block_size=4)
        >>> open_rox(path).shard_index(0).tolist()
        [4, 8]
        """
        return self._map(s).ends

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
        mapped = self._map(s)
        header = self._headers[s]
        start = int(mapped.ends[j - 1]) if j else 0
        end = int(mapped.ends[j])
        itemsize = header.dtype.itemsize
        if not (
            0 <= start < end <= header.raw_size and start % itemsize == 0 and end % itemsize == 0
        ):
            raise RoxFormatError(
                header.path,
                f"block {j} spans bytes [{start}, {end}) of a {header.raw_size}-byte raw region: "
                "the index is damaged",
                "re-create the shard; grain-rox verify checks every shard's whole index",
            )
        return mapped.slice(start // itemsize, end // itemsize)

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the virtual stream (all shards' raw regions, in order).

        A zero-copy view when the range lies in one shard; a new array when it crosses shards,
        in the corpus's dtype too (numpy's concatenate would make big-endian tokens native).
        """
        n = self.num_tokens
        if not 0 <= start <= stop <= n:
            raise IndexError(f"token range [{start}, {stop}) is outside [0, {n}]")
        starts = self._token_starts_list
        if start == stop:
            return np.empty((0,), self.dtype)
        s = bisect.bisect_right(starts, start) - 1
        if stop <= starts[s + 1]:
            return self._map(s).slice(start - starts[s], stop - starts[s])
        pieces = []
        pos = start
        while pos < stop:
            end = min(stop, starts[s + 1])
            pieces.append(self._map(s).slice(pos - starts[s], end - starts[s]))
            pos = end
            s += 1
        return np.concatenate(pieces, dtype=self.dtype)

    # ---- checking --------------------------------------------------------------------------
    def verify(self, *, checksums: bool = True) -> None:
        """Check every shard's whole index and, with a manifest, its sha256 checksum.

        Raises :class:`RoxFormatError` naming the first damaged shard.
        """
        for s, (header, record) in enumerate(zip(self._headers, self._records, strict=True)):
            if header.num_blocks:
                self._uniform[s] = check_index(header, self._map(s).ends)
            if checksums and record is not None:
                identity = self._identities[s]
                if isinstance(identity, ObjectRef):
                    check_object_checksum(identity, record)
                else:
                    record.check_checksum(header.path)

    # ---- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        """Drop the memory maps (views already handed out stay valid). Reopens on next read."""
        with self._lock:
            maps, self._maps = self._maps, [None] * len(self._headers)
        for mapped in maps:
            if mapped is not None:
                mapped.close()

    def __enter__(self) -> RoxCorpus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_maps"] = [None] * len(self._headers)
        state["_watch_at"] = [0.0] * len(self._headers)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def open_unchanged(paths: PathSpec | RoxCorpus) -> RoxCorpus:
    """:func:`open_rox`, and a shard changed in place since it was written refused now, not
    read: the corpus's fingerprint compares the manifest's sha256 where a shard's size or
    mtime changed (once per file version). What a data source reads from; ``open_rox`` itself
    stays O(1) and checks on ``fingerprint`` and ``verify``."""
    corpus = open_rox(paths)
    _ = corpus.fingerprint
    return corpus


_OPEN_TRIES = 3  # listings an open may find changed by a write before it is refused


def open_rox(
    paths: PathSpec | RoxCorpus,
    *,
    verify: bool = False,
    roxxel_names: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> RoxCorpus:
    """Open `.rox` shards (a file, glob, directory, set name or list) as one :class:`RoxCorpus`.

    Globs, directories and lists are resolved and ordered as roxxel resolves them. A set name
    (``data/train.rox`` that is not a file) means ``data/train_NNNN.rox`` and nothing looser;
    ``roxxel_names=True`` restores roxxel's ``train*.rox`` fallback (see
    :func:`grain_rox._format._paths.resolve_shard_paths`). A set written by grain_rox must be
    exactly the set its manifest records (no extra, missing, resized or half-overwritten
    shards). Every shard's footer, size and index are validated (see :class:`RoxFormatError`);
    ``verify=True`` also checks sha256 checksums recorded in a manifest. Use it as a context
    manager.

    Args:
      paths: the shards: a file, glob, directory, set name or list of them; an open
        :class:`RoxCorpus` is returned as it is.
      verify: also check every shard's whole index and, with a manifest, its sha256 now
        (reads every byte; see :meth:`RoxCorpus.verify`).
      roxxel_names: resolve a set name with roxxel's looser ``name*.rox`` fallback.
      storage_options: fsspec options (endpoint, credentials) for paths that are URLs
        (``gs://``, ``s3://``, any fsspec scheme); None uses fsspec's configuration and the
        environment, which is also how Grain worker processes reach the bucket.

    URLs resolve by the same rules as local paths (a prefix lists its ``*.rox`` objects). A
    shard in a bucket is not copied: its footer is read with one ranged request at open, and
    its tokens by ranged requests as they are read, through a bounded per-process block cache
    (``GRAIN_ROX_OBJECT_CACHE_MB``, default 256), each batch's requests issued concurrently.

    Returns:
      The opened :class:`RoxCorpus` (memory maps open lazily; ``close()`` or ``with``).

    Raises:
      FileNotFoundError: no shard matches ``paths`` (the message says what was searched).
      RoxFormatError: a shard is damaged or inconsistent, or the set differs from its
        manifest (the message names the file and the fix).

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
    resolved: list[str] = []
    for _ in range(_OPEN_TRIES):
        resolved = resolve_shard_paths(
            paths, roxxel_names=roxxel_names, storage_options=storage_options
        )
        # Read at call time, so a test can lower the limit to exercise the lazy walk.
        facts = load_shard_facts(
            resolved, index_check_limit=FULL_INDEX_CHECK_LIMIT, storage_options=storage_options
        )
        # A write that finished between the listing and the facts leaves them consistent
        # with its manifest, and the listing a part of the new set: listed again, the same
        # files, or it is opened again
        again = resolve_shard_paths(
            paths, roxxel_names=roxxel_names, storage_options=storage_options
        )
        if again == resolved:
            break
    else:
        raise RoxFormatError(
            resolved[0],
            f"the shards that {paths!r:.200} names changed while they were opened, "
            f"{_OPEN_TRIES} times in a row (a writer keeps publishing the set)",
            "wait for the writes to finish, then open the set again",
        )
    corpus = RoxCorpus(*facts)
    if verify:
        corpus.verify(checksums=True)
    return corpus
