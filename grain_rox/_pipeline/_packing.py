"""Document-aware packing: whole documents into (batch, seq_len) rows with Grain's packers.

Concat-then-split windows (:class:`~grain_rox.TokenPipeline`) use 100% of tokens but cut
documents at window edges; packing keeps every document (or piece of one) whole inside a row
and pads the rest. :class:`~grain_rox.RoxDocumentSource` (``grain_rox._sources._rox_documents``)
turns a `.rox` corpus into documents; :func:`pack_documents` shuffles the documents per epoch
(Grain's Feistel ``shuffle``), packs them with ``grain.experimental.BestFitPackIterDataset``
(or first-fit), renames the features to MaxText's names and batches. The result is a Grain
``IterDataset`` whose iterator state checkpoints and restores exactly, and whose stream under
``mp_prefetch`` is the in-process one whatever the worker count (each worker keeps every n-th
packed batch: ``_worker_share``).

Any Grain source of ``{"inputs", "targets"}`` token records (for example HF records) packs the
same way through :func:`pack_documents`, with the same ``long_documents=`` choice: nothing is
cut without the user asking for it. Its iterator states name the input data and the packing
config, and a state from other data or another config is refused (``_identity``).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

import grain
import numpy as np

from grain_rox._order._permutation import int_arg, seed_arg
from grain_rox._pipeline._mixing import describe_dataset
from grain_rox._pipeline._worker_share import WorkerShare
from grain_rox._sources._grain_setup import make_grain_workers_usable
from grain_rox._sources._identity import with_identity
from grain_rox._sources._process_local import ProcessLocal, process_local
from grain_rox._sources._rox_documents import LongDocuments, check_long_documents, too_long
from grain_rox._sources._segments import INPUTS, INPUTS_SEGMENTATION, TARGETS
from grain_rox._text._item_encoding import item_name

logger = logging.getLogger("grain_rox")

# Grain's packers name the packing features <feature>_segment_ids and <feature>_positions;
# MaxText's names end in _segmentation and _position.
_RENAME = {"_segment_ids": "_segmentation", "_positions": "_position"}


class _FullBatch:
    """Grain's ``batch_fn``: a batch's packed rows stacked, and a last, shorter batch (the
    end of a finite stream) filled with rows of padding (every feature 0: segment 0), so
    every packed row is served and every batch has the same shape (a dropped remainder lost
    the last rows' documents, counted nowhere)."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size

    def __call__(self, rows: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        short = self.batch_size - len(rows)
        out = {}
        for key in rows[0]:
            stacked = np.stack([row[key] for row in rows])
            if short > 0:
                fill = np.zeros((short, *stacked.shape[1:]), dtype=stacked.dtype)
                stacked = np.concatenate([stacked, fill])
            out[key] = stacked
        return out


def _rename(record: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for key, value in record.items():
        for old, new in _RENAME.items():
            if key.endswith(old):
                key = key[: -len(old)] + new
        out[key] = value
    return out


class PackingStats(ProcessLocal):
    """What :func:`pack_documents` did to long documents, counted as documents are read in
    this process (Grain worker processes keep their own counts; a restore re-reads the
    document it stopped in). Thread-safe.

    >>> PackingStats()
    PackingStats(documents_split=0, pieces=0, documents_truncated=0, tokens_dropped=0)
    """

    PROCESS_LOCAL = process_local(_lock=threading.Lock)
    _lock: threading.Lock

    def __init__(self) -> None:
        self.start_process_local()
        self.documents_split = 0
        self.pieces = 0
        self.documents_truncated = 0
        self.tokens_dropped = 0

    def _add(
        self, *, split: int = 0, pieces: int = 0, truncated: int = 0, dropped: int = 0
    ) -> None:
        with self._lock:
            self.documents_split += split
            self.pieces += pieces
            self.documents_truncated += truncated
            self.tokens_dropped += dropped

    def __repr__(self) -> str:
        return (
            f"PackingStats(documents_split={self.documents_split}, pieces={self.pieces}, "
            f"documents_truncated={self.documents_truncated}, "
            f"tokens_dropped={self.tokens_dropped})"
        )


def _as_int32(values: np.ndarray, index: int, name: Callable[[int], str], what: str) -> np.ndarray:
    """``values`` as int32, the packed batches' dtype, or a ValueError naming the document
    (``name(index)``) where an id does not fit (a cast would wrap it: 3,000,000,000 became
    -1,294,967,296).

    >>> _as_int32(np.array([2**31], np.int64), 4, "document {}".format, "tokens")
    Traceback (most recent call last):
    ...
    ValueError: pack_documents: document 4 holds the id 2147483648 in its tokens, which int32 ...
    """
    if np.can_cast(values.dtype, np.int32) or not values.size:
        return values.astype(np.int32)
    if values.dtype.kind not in "iu":
        raise ValueError(
            f"pack_documents: {name(index)}'s {what} are {values.dtype}, not integer token "
            "ids (a cast to int32 would drop fractions); pass token ids"
        )
    info = np.iinfo(np.int32)
    low, high = values.min(), values.max()
    if low < info.min or high > info.max:
        raise ValueError(
            f"pack_documents: {name(index)} holds the id {high if high > info.max else low} "
            f"in its {what}, which int32 (the packed batches' dtype) cannot hold; token ids of "
            "a vocabulary fit (below 2**31): check the data, or map the ids to a smaller range"
        )
    return values.astype(np.int32)


class _AsDocument(grain.transforms.MapWithIndex):
    """Record ``index`` as a list of ``{"inputs", "targets"}`` int32 pieces of at most
    ``seq_len`` each: a token array (bare, or under ``key``) gives ``inputs`` = tokens[:-1],
    ``targets`` = tokens[1:]; an ``{"inputs", "targets"}`` record passes (as int32), so
    sources of both kinds mix. A longer document is split, truncated or refused."""

    def __init__(
        self,
        key: str | None,
        seq_len: int,
        long_documents: str,
        stats: PackingStats,
        describe: Callable[[int], str] | None = None,
    ):
        self.key = key
        self.seq_len = seq_len
        self.long_documents = long_documents
        self.stats = stats
        self.describe = describe  # where record i is (an ArrayRecord file and record)
        self._warned = False

    def _document(self, index: int, noun: str = "document") -> str:
        """``document <index>``, with its file and record where the source can say (worded
        only for an error; an index past one epoch names no record)."""
        return item_name(noun, index, self.describe)

    def _pairs(
        self, index: int, record: Any
    ) -> tuple[dict[str, Any], np.ndarray, np.ndarray, bool]:
        """(other features, inputs, targets, whether the record was a bare token document)."""
        if isinstance(record, np.ndarray):
            tokens = record
        elif self.key is not None and self.key in record:
            tokens = np.asarray(record[self.key])
        elif INPUTS in record and TARGETS in record:
            # one dtype for every document: Grain's packer casts to the first one's dtype
            rest = {k: v for k, v in record.items() if k not in (INPUTS, TARGETS)}
            inputs = _as_int32(np.asarray(record[INPUTS]), index, self._document, INPUTS)
            targets = _as_int32(np.asarray(record[TARGETS]), index, self._document, TARGETS)
            if inputs.shape != targets.shape:  # (a piece is cut by inputs' length alone)
                raise ValueError(
                    f"pack_documents: {self._document(index, 'record')} has inputs of shape "
                    f"{inputs.shape} but "
                    f"targets of shape {targets.shape}; it packs next-token pairs, one target "
                    "a token of inputs: give both the same length (or pass the token "
                    "documents themselves, with tokens_key=)"
                )
            return rest, inputs, targets, False
        else:
            raise KeyError(
                f"pack_documents: tokens_key={self.key!r} is not in "
                f"{self._document(index, 'record')} (keys: {sorted(record)}); name the column "
                "that holds token ids"
            )
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise ValueError(
                f"pack_documents: {self._document(index)}: a document must be a 1-D integer "
                f"token array, got {tokens.dtype} of shape {tokens.shape}; tokenize text first "
                "(HFEagerSource(tokenize=...)), or read integer records (dtype=)"
            )
        signed = tokens.dtype.kind == "i"
        tokens = _as_int32(tokens, index, self._document, "tokens")
        # (an {"inputs", "targets"} record may mark a target to ignore so; a document holds ids)
        if signed and tokens.size and tokens.min() < 0:
            raise ValueError(
                f"pack_documents: {self._document(index)} holds the id {int(tokens.min())} in "
                "its tokens; token ids are >= 0 (a negative one would index an embedding table "
                "from its end): check the data, or map the ids"
            )
        return {}, tokens[:-1], tokens[1:], True

    def map_with_index(self, index: int, record: Any) -> list[dict[str, Any]]:
        rest, inputs, targets, bare = self._pairs(index, record)
        n, length = inputs.shape[0], self.seq_len
        if n <= length:
            return [{**rest, INPUTS: inputs, TARGETS: targets}]
        size = n + 1 if bare else n  # a token document's own length
        if self.long_documents == "error":
            raise too_long("pack_documents", self._document(index), size, length)
        if self.long_documents == "truncate":
            self.stats._add(truncated=1, dropped=n - length)
            if not self._warned:
                self._warned = True
                logger.warning(
                    "pack_documents(seq_len=%d, long_documents='truncate'): document %d has %d "
                    "tokens; its last %d are dropped (later ones are counted in "
                    "packing_stats, not logged)",
                    length,
                    index,
                    size,
                    n - length,
                )
            return [{**rest, INPUTS: inputs[:length], TARGETS: targets[:length]}]
        pieces = [
            {**rest, INPUTS: inputs[i : i + length], TARGETS: targets[i : i + length]}
            for i in range(0, n, length)
        ]
        self.stats._add(split=1, pieces=len(pieces))
        return pieces


class _Unlist(grain.experimental.FlatMapTransform):
    """A document's pieces, one element each (Grain checkpoints the position inside)."""

    max_fan_out = 1 << 30

    def flat_map(self, element: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return element


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
    long_documents: LongDocuments = "split",
) -> grain.IterDataset:
    """Pack ``source``'s ``{"inputs", "targets"}`` records into ``(batch_size, seq_len)``.

    ``source`` is a Grain source or ``MapDataset`` (for example a :func:`mix_datasets`
    mixture). A record that is a 1-D integer array (an ArrayRecord or ``.npy`` document), or
    that holds one under ``tokens_key`` (for example an :class:`~grain_rox.HFEagerSource`
    column read with ``tokenize=``), is a document: ``inputs`` = tokens[:-1] and ``targets`` =
    tokens[1:]; a negative id in one is an error naming it (and, for a source that can say, its
    file and record, as an id above int32 is).

    A document with more than ``seq_len`` next-token pairs is, by ``long_documents``:
    ``"split"`` (default) into consecutive pieces of ``seq_len`` pairs, each its own segment,
    so every token is served exactly once; ``"truncate"``: cut to its first ``seq_len`` pairs
    (the dropped tokens are counted in the result's ``packing_stats`` and the first cut is
    logged to the ``"grain_rox"`` logger); or an ``"error"`` naming the document.

    Records are shuffled per epoch (``seed``), packed into ``num_packing_bins`` bins (default
    ``batch_size``) by best- or first-fit, and batched; a finite stream's last batch is filled
    with rows of padding (segment 0), so every row is served and every batch has one shape.
    Output features: ``inputs``, ``targets``, ``inputs_segmentation``, ``inputs_position``,
    ``targets_segmentation``, ``targets_position`` (segment 0 = padding).
    ``shard=(index, count)`` gives a process its slice of the documents; the packed stream
    then depends on ``count``. The iterator's state
    names the input data and this config; a state from others is refused.

    ``.mp_prefetch(...)`` on the result (or on a ``.map``/``.batch`` of it) yields the same
    stream as in-process, for any number of Grain workers: each worker packs the whole stream
    and keeps every n-th batch, so packing runs beside the training loop but is not split
    between workers (to split the reading, give each process its ``shard=``). An endless
    source (``len == sys.maxsize``) is packed once through (``num_epochs`` must be None).

    Args:
        source: A Grain source or ``MapDataset`` of documents or ``{"inputs", "targets"}``
            records (see above).
        seq_len: The row length: next-token pairs per row.
        batch_size: Rows per batch.
        seed: Seeds the per-epoch shuffle and the packer (32 bits).
        num_epochs: Passes over ``source`` (None: endless; required for an endless source).
        method: ``"best_fit"`` (default) or ``"first_fit"``, Grain's two packers.
        num_packing_bins: Rows the packer fills at once (default ``batch_size``); more bins
            pad less and cost more memory.
        shard: ``(index, count)``: this process's slice of the documents (default all).
        shuffle: Shuffle the documents (per epoch) and the packed bins (default True).
        tokens_key: The record key holding a document's token array (for dict records that
            are not ``{"inputs", "targets"}``).
        long_documents: ``"split"`` (default), ``"truncate"`` or ``"error"``, as above.

    Returns:
        A ``grain.IterDataset`` of packed batches (dicts of ``(batch_size, seq_len)``
        arrays) with a ``packing_stats`` attribute counting split and truncated documents.

    Raises:
        ValueError: A bad argument (named in the message), or with
            ``long_documents="error"``, the first document longer than ``seq_len``.

    >>> import tempfile, os, numpy as np
    >>> from grain_rox import RoxDocumentSource, write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "p.rox")
    >>> docs = [np.arange(1, n, dtype=np.uint16) for n in (4, 6, 3, 8, 5, 2, 7)]
    >>> _ = write_rox(docs, path, separator=0, block_size=64)
    >>> ds = pack_documents(RoxDocumentSource(path, seq_len=8), seq_len=8, batch_size=2,
    ...                     num_epochs=1)
    >>> batch = next(iter(ds))
    >>> batch["inputs"].shape, sorted(batch)[:3]
    ((2, 8), ['inputs', 'inputs_position', 'inputs_segmentation'])
    >>> long = pack_documents([np.arange(1, 12)], seq_len=4, batch_size=1, num_epochs=1,
    ...                       shuffle=False)
    >>> [b["inputs"][0].tolist() for b in long]
    [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 0, 0]]
    >>> long.packing_stats
    PackingStats(documents_split=1, pieces=3, documents_truncated=0, tokens_dropped=0)
    """
    where = "pack_documents"
    make_grain_workers_usable()
    seq_len = int_arg(seq_len, "seq_len", where=where)
    batch_size = int_arg(batch_size, "batch_size", where=where)
    seed = seed_arg(seed, where=where, bits=32)  # Grain's shuffle and packers take 32 bits
    if num_epochs is not None:
        num_epochs = int_arg(num_epochs, "num_epochs", where=where)
    if num_packing_bins is not None:
        num_packing_bins = int_arg(num_packing_bins, "num_packing_bins", where=where)
    if method not in ("best_fit", "first_fit"):
        raise ValueError(f"{where}: method={method!r}; use 'best_fit' or 'first_fit'")
    check_long_documents(long_documents, where)
    if not isinstance(shard, (tuple, list)) or len(shard) != 2:
        raise TypeError(f"{where}: shard={shard!r} must be (index, count), e.g. shard=(0, 2)")
    index = int_arg(shard[0], "shard index", where=where, minimum=0)
    count = int_arg(shard[1], "shard count", where=where)
    if index >= count:
        raise ValueError(f"{where}: shard={tuple(shard)!r} needs 0 <= index < count")
    stats = PackingStats()
    ds = source if isinstance(source, grain.MapDataset) else grain.MapDataset.source(source)
    identity = {
        "inputs": describe_dataset(source),
        "seq_len": seq_len,
        "batch_size": batch_size,
        "seed": seed,
        "num_epochs": num_epochs,
        "method": method,
        "num_packing_bins": num_packing_bins or batch_size,
        "shard": [index, count],
        "shuffle": bool(shuffle),
        "tokens_key": tokens_key,
        "long_documents": long_documents,
    }
    describe = getattr(source, "describe_item", None)  # an ArrayRecord file and record
    ds = ds.map_with_index(_AsDocument(tokens_key, seq_len, long_documents, stats, describe))
    if count > 1:
        ds = ds[index::count]
    if shuffle:
        ds = ds.shuffle(seed=seed)
    if len(ds) < sys.maxsize:
        ds = ds.repeat(num_epochs)  # reshuffled every epoch (Grain seeds each epoch anew)
    elif num_epochs is not None:
        raise ValueError(
            f"{where}: num_epochs={num_epochs} for an endless source (len == sys.maxsize); "
            "pass num_epochs=None, or a finite source"
        )
    it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=64))
    it_ds = grain.experimental.FlatMapIterDataset(it_ds, _Unlist())
    packer = (
        grain.experimental.BestFitPackIterDataset
        if method == "best_fit"
        else grain.experimental.FirstFitPackIterDataset
    )
    packed = packer(
        it_ds,
        length_struct={INPUTS: seq_len, TARGETS: seq_len},
        num_packing_bins=num_packing_bins or batch_size,
        seed=seed,
        shuffle_bins=shuffle,
    )
    batched = packed.map(_rename).batch(batch_size, batch_fn=_FullBatch(batch_size))
    result = with_identity(WorkerShare(batched), identity, what="pack_documents")
    result.packing_stats = stats
    return result


def padding_efficiency(batches: Sequence[dict[str, np.ndarray]]) -> float:
    """Fraction of positions that hold a real token (segmentation != 0).

    Args:
        batches: Batches with an ``inputs_segmentation`` array (segment 0 = padding), such
            as those of :func:`pack_documents`.

    Returns:
        Real positions over all positions (0.0 for no positions).

    >>> padding_efficiency([{"inputs_segmentation": np.array([[1, 1, 2, 0]])}])
    0.75
    """
    real = sum(int(np.count_nonzero(b[INPUTS_SEGMENTATION])) for b in batches)
    total = sum(int(b[INPUTS_SEGMENTATION].size) for b in batches)
    return real / total if total else 0.0
