"""Document-aware packing: whole documents into (batch, seq_len) rows with Grain's packers.

Concat-then-split windows (:class:`~grain_rox.TokenPipeline`) use 100% of tokens but cut
documents at window edges; packing keeps every document (or piece of one) whole inside a row
and pads the rest. Here:

* :class:`RoxDocumentSource` turns a `.rox` corpus into documents: the tokens up to and
  including each EOS (found with one vectorised scan per shard, cached; O(#documents) index
  memory). A document longer than ``seq_len + 1`` tokens is split into pieces of
  ``seq_len + 1`` that overlap by one token (every next-token pair kept) or truncated.
* :func:`pack_documents` shuffles the documents per epoch (Grain's Feistel ``shuffle``),
  packs them with ``grain.experimental.BestFitPackIterDataset`` (or first-fit), renames the
  features to MaxText's names and batches. The result is a Grain ``IterDataset`` whose
  iterator state checkpoints and restores exactly.

Any Grain source of ``{"inputs", "targets"}`` token records (for example HF records) packs the
same way through :func:`pack_documents`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Literal

import grain
import numpy as np

from grain_rox._paths import PathSpec
from grain_rox._rox_corpus import RoxCorpus, open_rox

_RENAME = {"_segment_ids": "_segmentation", "_positions": "_position"}


class RoxDocumentSource:
    """Record ``i`` = document piece ``i``: ``inputs`` = tokens[:-1], ``targets`` = tokens[1:].

    >>> import tempfile, os, numpy as np
    >>> from grain_rox import write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "d.rox")
    >>> _ = write_rox([np.array([5, 6, 7], np.uint16), np.array([8], np.uint16)], path,
    ...               separator=0, block_size=16)
    >>> docs = RoxDocumentSource(path, seq_len=8)
    >>> len(docs), docs[0]["inputs"].tolist(), docs[0]["targets"].tolist()
    (2, [5, 6, 7], [6, 7, 0])
    """

    def __init__(
        self,
        paths: PathSpec | RoxCorpus,
        *,
        seq_len: int,
        eos_id: int | None = None,
        long_documents: Literal["split", "truncate"] = "split",
        dtype: Any = np.int32,
    ) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len={seq_len} must be >= 1")
        if long_documents not in ("split", "truncate"):
            raise ValueError(f"long_documents={long_documents!r}; use 'split' or 'truncate'")
        self.corpus = open_rox(paths)
        eos = eos_id if eos_id is not None else self.corpus.eos_id
        if eos is None:
            raise ValueError(
                f"{self.corpus.paths[0]}: no EOS id to split documents at (the shards have no "
                "manifest); pass eos_id="
            )
        self.eos_id = int(eos)
        self.seq_len = int(seq_len)
        self.long_documents = long_documents
        self.dtype = np.dtype(dtype)
        self._lock = threading.Lock()
        self._index: tuple[np.ndarray, np.ndarray] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_index"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _pieces(self) -> tuple[np.ndarray, np.ndarray]:
        """(start, length) of every piece, in corpus order; built once per process."""
        if self._index is None:
            with self._lock:
                if self._index is None:
                    self._index = self._build_index()
        return self._index

    def _build_index(self) -> tuple[np.ndarray, np.ndarray]:
        ends = [
            np.flatnonzero(self.corpus.shard_tokens(s) == self.eos_id) + sh.first_token
            for s, sh in enumerate(self.corpus.shards)
        ]
        eos = np.concatenate(ends) if ends else np.empty(0, np.int64)
        starts = np.concatenate([[0], eos[:-1] + 1]).astype(np.int64)
        lengths = eos - starts + 1  # the document and its EOS
        keep = lengths > 1  # a lone EOS (padding runs) is no document
        starts, lengths = starts[keep], lengths[keep]
        window = self.seq_len + 1
        if self.long_documents == "truncate":
            return starts, np.minimum(lengths, window)
        # Split: pieces of `window` tokens overlapping by one, so no next-token pair is lost.
        counts = np.maximum(1, -(-(lengths - 1) // self.seq_len))
        doc = np.repeat(np.arange(starts.size), counts)
        k = np.arange(doc.size) - np.repeat(np.cumsum(counts) - counts, counts)
        piece_start = starts[doc] + k * self.seq_len
        piece_len = np.minimum(window, starts[doc] + lengths[doc] - piece_start)
        return piece_start, piece_len

    def __len__(self) -> int:
        return int(self._pieces()[0].size)

    def __repr__(self) -> str:
        return (
            f"RoxDocumentSource(data={self.corpus.fingerprint}, seq_len={self.seq_len}, "
            f"eos_id={self.eos_id}, long_documents={self.long_documents})"
        )

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        starts, lengths = self._pieces()
        index = int(index)
        if not 0 <= index < starts.size:
            raise IndexError(f"document piece {index} is out of range for {starts.size}")
        a = int(starts[index])
        tokens = self.corpus.tokens(a, a + int(lengths[index])).astype(self.dtype)
        return {"inputs": tokens[:-1], "targets": tokens[1:]}

    def _getitems(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        return [self[i] for i in indices]

    __getitems__ = _getitems


def _rename(record: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for key, value in record.items():
        for old, new in _RENAME.items():
            if key.endswith(old):
                key = key[: -len(old)] + new
        out[key] = value
    return out


class _AsDocument(grain.transforms.Map):
    """A record as ``{"inputs", "targets"}`` of int32: a token array (bare, or under ``key``)
    becomes ``inputs`` = tokens[:-1], ``targets`` = tokens[1:], cut to ``seq_len``; an
    ``{"inputs", "targets"}`` record passes (as int32), so sources of both kinds mix."""

    def __init__(self, key: str | None, seq_len: int) -> None:
        self.key = key
        self.seq_len = seq_len

    def map(self, record: Any) -> Any:
        if isinstance(record, np.ndarray):
            tokens = record
        elif self.key is not None and self.key in record:
            tokens = np.asarray(record[self.key])
        elif "inputs" in record and "targets" in record:
            # one dtype for every document: Grain's packer casts to the first one's dtype
            return {
                **record,
                "inputs": np.asarray(record["inputs"], np.int32),
                "targets": np.asarray(record["targets"], np.int32),
            }
        else:
            raise KeyError(
                f"tokens_key={self.key!r} is not in the record (keys: {sorted(record)}); name "
                "the column that holds token ids"
            )
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise ValueError(
                f"a document must be a 1-D integer token array, got {tokens.dtype} of shape "
                f"{tokens.shape}; tokenize text first (HFEagerSource(tokenize=...))"
            )
        tokens = tokens[: self.seq_len + 1].astype(np.int32)
        return {"inputs": tokens[:-1], "targets": tokens[1:]}


def pack_documents(
    source: Any,
    *,
    seq_len: int,
    batch_size: int,
    seed: int = 0,
    num_epochs: int | None = None,
    method: Literal["best_fit", "first_fit"] = "best_fit",
    num_packing_bins: int | None = None,
    shard: tuple[int, int] = (0, 1),
    shuffle: bool = True,
    tokens_key: str | None = None,
) -> grain.IterDataset:
    """Pack ``source``'s ``{"inputs", "targets"}`` records into ``(batch_size, seq_len)``.

    ``source`` is a Grain source or ``MapDataset`` (for example a :func:`mix_datasets`
    mixture). A record that is a 1-D integer array (an ArrayRecord or ``.npy`` document), or
    that holds one under ``tokens_key`` (for example an :class:`~grain_rox.HFEagerSource`
    column read with ``tokenize=``), is a document: ``inputs`` = tokens[:-1] and ``targets`` =
    tokens[1:], cut to ``seq_len`` (:class:`RoxDocumentSource` splits long documents instead).

    Records are shuffled per epoch (``seed``), packed into ``num_packing_bins`` bins (default
    ``batch_size``) by best- or first-fit, and batched. Output features: ``inputs``,
    ``targets``, ``inputs_segmentation``, ``inputs_position``, ``targets_segmentation``,
    ``targets_position`` (segment 0 = padding). ``shard=(index, count)`` gives a process its
    slice of the documents; the packed stream then depends on ``count``.

    >>> import tempfile, os, numpy as np
    >>> from grain_rox import write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "p.rox")
    >>> docs = [np.arange(1, n, dtype=np.uint16) for n in (4, 6, 3, 8, 5, 2, 7)]
    >>> _ = write_rox(docs, path, separator=0, block_size=64)
    >>> ds = pack_documents(RoxDocumentSource(path, seq_len=8), seq_len=8, batch_size=2,
    ...                     num_epochs=1)
    >>> batch = next(iter(ds))
    >>> batch["inputs"].shape, sorted(batch)[:3]
    ((2, 8), ['inputs', 'inputs_position', 'inputs_segmentation'])
    """
    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"seq_len={seq_len} and batch_size={batch_size} must be >= 1")
    ds = source if isinstance(source, grain.MapDataset) else grain.MapDataset.source(source)
    ds = ds.map(_AsDocument(tokens_key, seq_len))
    index, count = shard
    if count > 1:
        ds = ds[index::count]
    if shuffle:
        ds = ds.shuffle(seed=seed)
    ds = ds.repeat(num_epochs)  # reshuffled every epoch (Grain seeds each epoch anew)
    it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=64))
    packer = (
        grain.experimental.BestFitPackIterDataset
        if method == "best_fit"
        else grain.experimental.FirstFitPackIterDataset
    )
    packed = packer(
        it_ds,
        length_struct={"inputs": seq_len, "targets": seq_len},
        num_packing_bins=num_packing_bins or batch_size,
        seed=seed,
        shuffle_bins=shuffle,
    )
    return packed.map(_rename).batch(batch_size, drop_remainder=True)


def padding_efficiency(batches: Sequence[dict[str, np.ndarray]]) -> float:
    """Fraction of positions that hold a real token (segmentation != 0).

    >>> padding_efficiency([{"inputs_segmentation": np.array([[1, 1, 2, 0]])}])
    0.75
    """
    real = sum(int(np.count_nonzero(b["inputs_segmentation"])) for b in batches)
    total = sum(int(b["inputs_segmentation"].size) for b in batches)
    return real / total if total else 0.0
