"""The :class:`WriteRox` transform: keyed documents -> a `.rox` shard set, committed once.

Stages (each a Beam step, so any runner spreads them over workers):

1. tokenize batches of documents (:class:`~grain_rox._beam._tokenize.TokenizeFn`);
2. order: per part, the documents' offsets from their lengths (one group per part), and from
   every part's total a :class:`~grain_rox._beam._plan.ShardPlan` (a side input of one entry
   per part);
3. place: each document's tokens joined with its offset and cut at shard boundaries;
4. write: one worker per shard writes it under a temporary name
   (:func:`~grain_rox._beam._write_shard.write_shard`);
5. commit: once every shard is reported, one step publishes them and the manifest
   (:func:`~grain_rox._beam._commit.commit_shards`).

The shards are a pure function of the documents, their keys and the options; their bytes are
those :func:`~grain_rox.write_rox` writes for the documents in key order.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.pvalue import AsList, AsSingleton

from grain_rox._beam._commit import (
    commit_shards,
    conversion_layout,
    manifest_path,
    set_on_disk,
    shard_writer,
)
from grain_rox._beam._metrics import counter
from grain_rox._beam._plan import ShardPlan, part_offsets
from grain_rox._beam._tokenize import TokenizeFn, tokenizer_spec
from grain_rox._beam._write_shard import write_shard
from grain_rox._format._manifest import new_write_id
from grain_rox._text._rox_writer import _check_output_path
from grain_rox._text._shard_files import IfExists


@dataclasses.dataclass(frozen=True)
class CommitResult:
    """What :class:`WriteRox` published (its output PCollection's one element).

    Attributes:
      manifest_path: the set's manifest, or ``None`` when there were no documents (nothing
        was written).
      paths: the shard files, in order.
      num_documents: documents written.
      num_tokens: tokens written, EOS tokens included, padding excluded.
      num_padding_tokens: tokens padding the last block.
      dtype: the shards' token dtype.
    """

    manifest_path: str | None
    paths: tuple[str, ...]
    num_documents: int
    num_tokens: int
    num_padding_tokens: int
    dtype: str


class _PartOffsetsFn(beam.DoFn):
    """``(part, [(index, tokens)])`` -> ``((part, index), offset in part)``; and, tagged
    ``totals``, ``(part, tokens, documents)``."""

    def process(self, element: tuple[Any, Iterable[tuple[int, int]]]) -> Iterator[Any]:
        part, entries = element
        listed = list(entries)
        indices, offsets = part_offsets(part, listed)
        for index, offset in zip(indices, offsets, strict=True):
            yield (part, index), offset
        yield beam.pvalue.TaggedOutput("totals", (part, sum(n for _, n in listed), len(listed)))


class _PlaceFn(beam.DoFn):
    """A document's bytes and offset -> its pieces ``(shard, (start, bytes, documents))``:
    the documents that start in each piece, its own and (as :func:`~grain_rox.write_rox`
    counts them) each after a separator inside a token-array item."""

    def __init__(self, dtype: str, eos: Any) -> None:
        self.dtype, self.eos = np.dtype(dtype), eos

    def process(self, element: Any, plan: ShardPlan) -> Iterator[Any]:
        key, joined = element
        (data,), (offset,) = joined["tokens"], joined["offset"]
        start = plan.part_start[key[0]] + offset
        size = self.dtype.itemsize
        tokens = np.frombuffer(data, self.dtype)
        inner = np.flatnonzero(tokens[:-1] == self.eos) + 1  # the last token is its own EOS
        for p in plan.pieces(start, len(data) // size):
            chunk = data[p.offset * size : (p.offset + p.stop - p.start) * size]
            lo, hi = p.offset, p.offset + p.stop - p.start
            starts = int(p.offset == 0) + int(np.count_nonzero((inner >= lo) & (inner < hi)))
            yield p.shard, (p.start, chunk, starts)


class _WriteShardFn(beam.DoFn):
    def __init__(
        self,
        path: str,
        max_shard_bytes: int | None,
        tokenizer: str,
        block_size: int,
        dtype: str | None,
    ) -> None:
        self.path, self.max_shard_bytes = path, max_shard_bytes
        self.tokenizer, self.block_size, self.dtype = tokenizer, block_size, dtype

    def setup(self) -> None:
        self.layout = conversion_layout(
            self.tokenizer, block_size=self.block_size, dtype=self.dtype
        )

    def process(self, element: Any, plan: ShardPlan) -> Iterator[Any]:
        shard, pieces = element
        yield write_shard(self.path, self.max_shard_bytes, shard, pieces, plan, self.layout)
        counter("shards").inc()


class _CommitFn(beam.DoFn):
    def __init__(self, write: WriteRox) -> None:
        self.w = write

    def process(self, _: Any, written: list[Any], plan: ShardPlan) -> Iterator[CommitResult]:
        w = self.w
        layout = conversion_layout(w.tokenizer, block_size=w.block_size, dtype=w.dtype)
        if plan.num_tokens == 0:
            yield CommitResult(None, (), 0, 0, 0, str(layout.dtype))
            return
        m = commit_shards(
            w.path, w.max_shard_bytes, written, plan, layout, run_id=w.run_id, if_exists=w.if_exists
        )
        directory = os.path.dirname(w.path)
        yield CommitResult(
            manifest_path(w.path, w.max_shard_bytes),
            tuple(os.path.join(directory, name) for name in m.shards),
            m.num_documents if m.num_documents is not None else plan.num_documents,
            plan.num_tokens,
            plan.num_padding_tokens,
            m.dtype,
        )


def _plan(
    totals: list[tuple[Any, int, int]], tokens_per_block: int, blocks: int | None
) -> ShardPlan:
    return ShardPlan.from_parts(totals, tokens_per_block=tokens_per_block, blocks_per_shard=blocks)


class WriteRox(beam.PTransform):
    """Write keyed documents into a `.rox` shard set that grain_rox and roxxel read.

    The input is a PCollection of ``((part, index), document)``: ``document`` a ``str``
    (tokenized on the workers) or a 1-D array / list of token ids of the tokenizer's
    vocabulary; ``part`` an int or str and ``index`` an int >= 0, unique together (e.g. an
    input file's number and the document's position in it, as :class:`ReadDocuments` keys
    them). Documents are written in key order, each followed by the EOS token, in blocks and
    shards laid out as :func:`~grain_rox.write_rox` lays them out: the same bytes for the same
    documents in that order, whatever the runner, bundling, retries or number of workers.

    Shards are written under hidden temporary names and published by one final step, with the
    manifest (checksums, counts, tokenizer), only when every shard is there; a failed
    pipeline leaves no shard set that opens. The output is a PCollection of one
    :class:`CommitResult`. The set's directory must be one filesystem that every worker and
    the final step see (a local disk for the DirectRunner; a shared mount elsewhere).

    Args:
      path: the shard file, or with ``max_shard_bytes`` the set's name (``x.rox`` gives
        ``x_0000.rox, x_0001.rox, ...``).
      tokenizer: ``"bytes"``, ``"cl100k_base"``, ``"o200k_base"`` or a ``tokenizer.json``
        path every worker can read; loaded once per worker.
      block_size: bytes per block.
      max_shard_bytes: split into shards of at most this many bytes. Without it the whole
        set is one file, written by one worker: give it for large corpora.
      dtype: token dtype; default from the tokenizer's vocabulary.
      if_exists: ``"error"`` (default) or ``"overwrite"`` (as one transaction).
      run_id: the conversion's id (its manifest's ``write_id``); default a fresh random one.

    Raises:
      FileExistsError: the set exists and ``if_exists="error"`` (checked when the transform is
        made, and again at the commit).
      ValueError: a bad output path, block size or ``if_exists="append"``.

    >>> import os, tempfile
    >>> import apache_beam as beam
    >>> from grain_rox import open_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "docs.rox")
    >>> with beam.Pipeline() as p:
    ...     docs = p | beam.Create([((0, 1), "yo!"), ((0, 0), "hi")])
    ...     _ = docs | WriteRox(path, tokenizer="bytes", block_size=8)
    >>> with open_rox(path) as corpus:
    ...     print(corpus.tokens(0, 8).tolist(), corpus.num_documents)
    [104, 105, 256, 121, 111, 33, 256, 256] 2
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        tokenizer: str | os.PathLike[str] = "bytes",
        block_size: int = 4096,
        max_shard_bytes: int | None = None,
        dtype: Any = None,
        if_exists: IfExists = "error",
        run_id: str | None = None,
    ) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.tokenizer = tokenizer_spec(tokenizer)
        self.block_size = block_size
        self.max_shard_bytes = max_shard_bytes
        self.if_exists = if_exists
        self.run_id = run_id or new_write_id()
        _check_output_path(self.path, if_exists, max_shard_bytes)
        layout = conversion_layout(self.tokenizer, block_size=block_size, dtype=dtype)
        self.dtype = None if dtype is None else layout.dtype.str
        mpath = manifest_path(self.path, max_shard_bytes)
        disk = set_on_disk(mpath, self.path)
        writer = shard_writer(self.path, max_shard_bytes, layout, if_exists, disk)
        self.tokens_per_block = layout.tokens_per_block
        self.blocks_per_shard = writer.capacity
        self.itemsize = layout.dtype.itemsize
        self.layout_dtype, self.eos = layout.dtype.str, layout.separator

    def expand(self, docs: Any) -> Any:
        if os.path.dirname(self.path):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tokens = (
            docs
            | "Batch" >> beam.BatchElements(min_batch_size=16, max_batch_size=1024)
            | "Tokenize" >> beam.ParDo(TokenizeFn(self.tokenizer, self.block_size, self.dtype))
        )
        size = self.itemsize
        offsets = (
            tokens
            | "Lengths" >> beam.Map(lambda kv: (kv[0][0], (kv[0][1], len(kv[1]) // size)))
            | "By part" >> beam.GroupByKey()
            | "Offsets" >> beam.ParDo(_PartOffsetsFn()).with_outputs("totals", main="offsets")
        )
        plan = (
            offsets.totals
            | "All parts" >> beam.combiners.ToList()
            | "Plan" >> beam.Map(_plan, self.tokens_per_block, self.blocks_per_shard)
        )
        written = (
            {"tokens": tokens, "offset": offsets.offsets}
            | "Join" >> beam.CoGroupByKey()
            | "Place" >> beam.ParDo(_PlaceFn(self.layout_dtype, self.eos), AsSingleton(plan))
            | "By shard" >> beam.GroupByKey()
            | "Write shards"
            >> beam.ParDo(
                _WriteShardFn(
                    self.path, self.max_shard_bytes, self.tokenizer, self.block_size, self.dtype
                ),
                AsSingleton(plan),
            )
        )
        return (
            docs.pipeline
            | "Commit trigger" >> beam.Create([None])
            | "Commit" >> beam.ParDo(_CommitFn(self), AsList(written), AsSingleton(plan))
        )
