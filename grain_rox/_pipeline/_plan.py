"""A :class:`~grain_rox.TokenPipeline` resolved against its data: opened once, shared by all.

Resolving a pipeline opens every source's shards (validated against their indexes and
manifests), checks that the sources share one tokenizer, and builds every source's shuffled
order for the schedule (``_order._blocks`` by default, ``_order._lanes`` when asked). :class:`PipelinePlan` holds the result and
what follows from it (each source's EOS id for the segment features, the number of batches,
the first step past the end). ``TokenPipeline.plan`` builds it lazily, once per pipeline
object, and ``describe``, ``num_batches``, ``estimate_steps``, ``batch_source`` and
:class:`~grain_rox.MultiHostDataLoadIterator` all read that one; it is not pickled with the
pipeline (a Grain worker process that needs it builds its own).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from grain_rox._format._log_once import log_once
from grain_rox._format._rox_corpus import RoxCorpus, open_rox, tokenizer_key, tokenizer_words
from grain_rox._format._served_shards import ServedShards, served_shards
from grain_rox._order._blocks import DEFAULT_BLOCK_TOKENS, BlockOrder
from grain_rox._order._curriculum import SAMPLE_LIMIT
from grain_rox._order._lanes import DEFAULT_CHUNK_TOKENS, LaneOrder, auto_lanes
from grain_rox._order._packed import DEFAULT_PACKED_BLOCK_TOKENS, PackedOrder
from grain_rox._order._permutation import derive_key, int_arg
from grain_rox._sources._chunk_documents import EosDocuments
from grain_rox._sources._output_dtype import check_output_dtype
from grain_rox._sources._tokens_layout import TokensLayout, tokens_layout

if TYPE_CHECKING:
    from grain_rox._pipeline._pipeline import TokenPipeline

_log = logging.getLogger("grain_rox")


def auto_chunk_tokens(num_tokens: int) -> int:
    """Chunk size from the corpus size: 64K tokens, smaller for corpora under 4M tokens.

    >>> auto_chunk_tokens(10**9), auto_chunk_tokens(100_000)
    (65536, 1562)
    """
    return int(min(DEFAULT_CHUNK_TOKENS, max(64, num_tokens // 64)))


# Shard tails shorter than a chunk are never served. Where a source's usual chunk leaves more
# than this share of its tokens in them (small files, or shards just under a few chunks), a
# chunk that fits its shards better is chosen; whatever is left over this share is logged.
TAIL_SHARE_ALLOWED = 0.01
# a packed chunk passed by hand under this many rows is logged with the padding it costs
PACKED_CHUNK_ROWS = 16


def tail_share(shard_tokens: Sequence[int], chunk: int) -> float:
    """The share of a source's tokens in shard tails shorter than ``chunk`` (never served).

    >>> round(tail_share([100_000, 60_000], 65536), 4)  # 34,464 + 60,000 of 160,000 tokens
    0.5904
    """
    return float(_shares(*_distinct_sizes(shard_tokens), [chunk])[0])


def _distinct_sizes(shard_tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct sizes of a source's non-empty shards, and how many shards have each."""
    tokens = np.asarray(shard_tokens, dtype=np.int64)
    return np.unique(tokens[tokens > 0], return_counts=True)


def _shares(sizes: np.ndarray, counts: np.ndarray, chunks: Sequence[int]) -> np.ndarray:
    """The share of the tokens of shards of ``sizes`` (``counts`` of each) that each of
    ``chunks`` leaves in shard tails: by distinct size, a chunk at a time (a million shards
    of a thousand sizes take a few ms a chunk, not a (chunks, shards) array)."""
    total = max(1, int((sizes * counts).sum()))
    return np.array([int(((sizes % c) * counts).sum()) for c in chunks], np.int64) / total


def least_packed_chunk(seq_len: int) -> int:
    """The least chunk packing chooses by itself: two rows of ``seq_len + 1``, at least 64.

    >>> least_packed_chunk(8), least_packed_chunk(1024)
    (64, 2050)
    """
    return max(64, 2 * (seq_len + 1))


def chunk_tokens_for(shard_tokens: Sequence[int], seq_len: int, *, packed: bool) -> int:
    """The chunk size of a source's blocks or packed order (``seq_len``: the longest): the
    usual one (:func:`auto_chunk_tokens`; for packed rows :func:`packing_chunk_tokens`) unless
    it leaves more than ``TAIL_SHARE_ALLOWED`` of the tokens in shard tails. Then, among
    smaller sizes (down to 64 tokens; for packed rows twice ``seq_len + 1``): the largest that
    leaves no more than that (larger chunks mean fewer windows across a join), else the one
    losing least, counting the pair across each chunk join (not trained); for packed rows
    always the one losing least, counting about one row of padding a chunk. The blocks
    order's choice does not depend on ``seq_len``, so a phase added later never changes it.

    >>> chunk_tokens_for([10**8], 1024, packed=False)  # one large shard: the usual 64K
    65536
    >>> chunk_tokens_for([5_000_000] + [60_000] * 10, 1024, packed=False)  # small files too
    60000
    >>> chunk_tokens_for([98_000] * 52, 1024, packed=False)  # each shard in two chunks
    49000
    """
    usual = (
        packing_chunk_tokens(shard_tokens, seq_len)
        if packed
        else auto_chunk_tokens(sum(shard_tokens))
    )
    if tail_share(shard_tokens, usual) <= TAIL_SHARE_ALLOWED:
        return usual
    least = least_packed_chunk(seq_len) if packed else 64
    sizes, share = _tail_shares(shard_tokens, least, usual)
    if not packed and (fits := np.flatnonzero(share <= TAIL_SHARE_ALLOWED)).size:
        return int(sizes[fits[0]])
    per_chunk = seq_len + 1 if packed else 1
    return int(sizes[np.argmin(share + per_chunk / sizes)])


def _tail_shares(
    shard_tokens: Sequence[int], least: int, most: int
) -> tuple[np.ndarray, np.ndarray]:
    """Chunk sizes in ``[least, most]``, largest first, and the share of a source's tokens
    each leaves in shard tails. Candidates: powers of two, and the sizes that cut one of the
    three shard sizes holding the most tokens (the largest too) into 1 to 64 equal chunks."""
    sizes, counts = _distinct_sizes(shard_tokens)
    candidates = {most >> i for i in range(32) if most >> i >= least} | {most}
    if sizes.size:
        common = sizes[np.argsort(-(sizes * counts), kind="stable")[:3]].tolist()
        for size in {*common, int(sizes[-1])}:
            candidates |= {size // k for k in range(1, 65) if least <= size // k <= most}
    ordered = np.asarray(sorted(candidates, reverse=True), dtype=np.int64)
    return ordered, _shares(sizes, counts, ordered.tolist())


def packing_chunk_tokens(shard_tokens: Sequence[int], seq_len: int) -> int:
    """Chunk size for packed rows (``seq_len``: the longest), the one losing least of two
    costs: shard tails shorter than a chunk are never served, and each chunk, packed on its
    own, ends in about one row of padding. Candidates: powers of two up to 64 rows (at least
    64K, at most 1M tokens: a chunk is packed whole when first read) and the largest shard cut
    into 1 to 64 equal chunks.

    >>> packing_chunk_tokens([10**8], 1024), packing_chunk_tokens([10**8], 8192)
    (131072, 1048576)
    >>> packing_chunk_tokens([300_000] * 3, 1024)  # each shard in three chunks: no tail
    100000
    """
    total = sum(shard_tokens)
    cap = 1 << min(20, max(16, (64 * (seq_len + 1) - 1).bit_length()))
    least = min(auto_chunk_tokens(total), cap)
    largest = max(shard_tokens)
    candidates = {cap >> i for i in range(16) if cap >> i >= least}
    candidates |= {largest // k for k in range(1, 65) if least <= largest // k <= cap}

    def loss(chunk: int) -> float:
        return sum(t % chunk for t in shard_tokens) / total + (seq_len + 1) / chunk

    return min(sorted(candidates, reverse=True), key=loss)


def _source_seed(seed: int, name: str) -> int:
    # By name, so adding or reordering sources leaves every other source's order alone.
    return derive_key(seed, zlib.crc32(name.encode("utf-8")))


def source_label(name: str, corpus: RoxCorpus) -> str:
    """How an error names a source: its path when it is the only (unnamed) one."""
    return f"source {name!r} ({corpus.paths[0]}...)" if name else corpus.paths[0]


def _check_one_tokenizer(corpora: Mapping[str, RoxCorpus], *, eos_given: bool) -> None:
    """Refuse sources whose sets' manifests record different tokenizers or EOS ids (each set
    of each source compared, by content: a tokenizer.json copied elsewhere is the same; the EOS
    ids not where ``eos_given`` says one for all). The sets of one source are compared by
    :func:`_check_sets_within`."""
    facts = {n: c.set_facts() for n, c in corpora.items()}
    recorded = [
        (n, what, tok, eos)
        for n, sets in facts.items()
        for what, tok, eos in sets
        if tok is not None
    ]
    if len({n for n, *_ in recorded}) < 2:
        return
    keys = {
        json.dumps([tokenizer_key(tok), None if eos_given else eos]) for *_, tok, eos in recorded
    }
    if len(keys) <= 1:
        return

    def where(n: str, what: str) -> str:  # a source of one set by its paths, else the set
        paths = corpora[n].paths
        return what if len(facts[n]) > 1 else paths[0] + (", ..." if len(paths) > 1 else "")

    shown = "; ".join(
        f"{n!r} ({where(n, what)}): {tokenizer_words(tok)}, EOS id {eos}"
        for n, what, tok, eos in recorded
    )
    raise ValueError(
        f"TokenPipeline: the sources were tokenized differently ({shown}): the same token id "
        "means different text in each. Re-tokenize them with one tokenizer (grain-rox convert "
        "--tokenizer ...), or pass allow_mixed_tokenizers=True if mixing them is intended"
    )


def _check_sets_within(name: str, corpus: RoxCorpus, *, allow_mixed_tokenizers: bool,
                       eos_given: bool) -> None:  # fmt: skip
    """Refuse one source (a folder, glob or list) joining shard sets that disagree: on the EOS
    id (:meth:`RoxCorpus.eos_disagreement`) unless ``eos_given``, or, unless
    ``allow_mixed_tokenizers``, on the tokenizer."""
    label = (
        f"TokenPipeline: {f'source {name!r}' if name else 'the source'} ({corpus.paths[0]}, ...)"
    )
    # the tokenizers first: sets of other tokenizers differ in their EOS ids too, and the
    # advice for those (eos_id=) would only lead to this refusal
    recorded = {tokenizer_key(tok) for _, tok, _ in corpus.set_facts() if tok is not None}
    if len(recorded) > 1 and not allow_mixed_tokenizers:
        raise ValueError(
            f"{label} joins shard sets that were tokenized differently "
            f"({corpus.describe_sets()}): the same token id means different text in each. "
            "Re-tokenize them with one tokenizer (grain-rox convert --tokenizer ...), name each "
            "set as a source of its own, or pass allow_mixed_tokenizers=True if mixing them is "
            "intended"
        )
    disagreement = None if eos_given else corpus.eos_disagreement()
    if disagreement is not None:
        raise ValueError(
            f"{label}: {disagreement}: the segment features would cut one set's documents at "
            "another's EOS id. Name each set as a source of its own (with weights), or pass "
            "eos_id= if every set ends its documents with that id"
        )


def open_sources(
    sources: Mapping[str, Any], *, allow_mixed_tokenizers: bool, eos_given: bool = False
) -> dict[str, RoxCorpus]:
    """Every named source's shards, opened (validated; cheap), and checked to share one
    tokenizer unless ``allow_mixed_tokenizers`` (and, within a source, one EOS id unless
    ``eos_given``)."""
    corpora = {name: open_rox(spec) for name, spec in sources.items()}
    for name, corpus in corpora.items():
        _check_sets_within(
            name, corpus, allow_mixed_tokenizers=allow_mixed_tokenizers, eos_given=eos_given
        )
    if not allow_mixed_tokenizers:
        _check_one_tokenizer(corpora, eos_given=eos_given)
    return corpora


SourceOrder = BlockOrder | LaneOrder | PackedOrder
# How a state names the holes a seq_len change in mid-block reads: whole windows (a state
# saved while they were read one token short, without this, is refused where it matters).
HOLES = "whole windows"
# a source's served data and its shards' served tokens (see served_shards)
Served = tuple[RoxCorpus | ServedShards, list[int]]


def source_orders(
    pipeline: TokenPipeline,
    corpora: Mapping[str, RoxCorpus],
    served: Mapping[str, Served] | None = None,
) -> list[SourceOrder]:
    """Each source's order (``pipeline.order``: blocks or lanes) under ``pipeline``'s
    schedule, seed, chunk, block and lane sizes; a source too small for them is an error
    naming it. ``served``: each source's :func:`served_shards`, when already read."""
    orders: list[SourceOrder] = []
    schedule = pipeline.schedule
    assert pipeline.phases is not None
    longest = pipeline.max_seq_len or max(p.seq_len for p in pipeline.phases)
    batch = math.lcm(*(p.batch_size for p in pipeline.phases))
    for s, (name, corpus) in enumerate(corpora.items()):
        # grain_rox 0.1's lanes order read the padding too: kept, to continue its runs exactly
        raw = pipeline.order == "lanes"
        data, shard_tokens = (
            (corpus, [sh.num_tokens for sh in corpus.shards])
            if raw
            else (served[name] if served is not None else served_shards(corpus))
        )
        if not sum(shard_tokens):  # not "a smaller chunk_tokens": no chunk size would do
            held = "holds no tokens" if not corpus.num_tokens else "holds block padding only"
            raise ValueError(
                f"{source_label(name, corpus)}: it {held} ({len(corpus.shards)} shard(s), "
                f"{corpus.num_tokens} tokens written); write documents to it, or leave it out "
                "of the sources"
            )
        chunk = pipeline.chunk_tokens or (
            auto_chunk_tokens(sum(shard_tokens))
            if raw
            else chunk_tokens_for(shard_tokens, longest, packed=pipeline.packing is not None)
        )
        if (
            pipeline.packing
            and not pipeline.chunk_tokens
            and max(shard_tokens) < (least := least_packed_chunk(longest))
        ):
            raise ValueError(
                f"{source_label(name, corpus)}: its shards "
                f"({sorted(shard_tokens, reverse=True)[:5]} tokens, the largest first) are all "
                f"shorter than {least} tokens, the least chunk packing chooses by itself (two "
                "rows of seq_len + 1, at least 64; a chunk is packed on its own, in one shard); "
                "write fewer, larger shards, or pass chunk_tokens= (at most the largest shard) "
                "to pack anyway, with about one row of padding a chunk"
            )
        row = longest + 1
        if pipeline.chunk_tokens and pipeline.packing and chunk < PACKED_CHUNK_ROWS * row:
            padding = row / (chunk + row)  # packing each chunk on its own leaves about a row
            log_once(
                logging.WARNING,
                f"{source_label(name, corpus)}: chunk_tokens={chunk} holds about "
                f"{chunk / row:.1f} rows of {row} tokens, and packing each chunk on its own "
                f"leaves about one row of padding a chunk: some {100 * padding:.0f}% of the "
                f"rows' tokens; pass a chunk_tokens of at least {PACKED_CHUNK_ROWS * row}, or "
                "none (chosen from the data)",
            )
        elif pipeline.chunk_tokens and 1 / chunk > TAIL_SHARE_ALLOWED:
            log_once(
                logging.WARNING,
                f"{source_label(name, corpus)}: chunk_tokens={chunk} leaves the pair across each "
                f"chunk join untrained, {100 / chunk:.1f}% of its pairs; pass a chunk_tokens of "
                f"at least {math.ceil(1 / TAIL_SHARE_ALLOWED)}, or none (chosen from the data)",
            )
        padding = sum(sh.num_padding_tokens or 0 for sh in corpus.shards) if raw else 0
        if padding:
            log_once(
                logging.WARNING,
                f"{source_label(name, corpus)}: order='lanes' serves the {padding} tokens of "
                "block padding its writes left as text (grain_rox 0.1's order, kept to continue "
                "its runs exactly); the default order='blocks' leaves them out",
            )
        if (share := tail_share(shard_tokens, chunk)) > TAIL_SHARE_ALLOWED:
            log_once(
                logging.WARNING,
                f"{source_label(name, corpus)} ({len(corpus.shards)} shard(s)): "
                f"{100 * share:.1f}% of its tokens lie in shard tails shorter than a chunk of "
                f"{chunk} tokens and are never served"
                f"{' (chunk_tokens as passed)' if pipeline.chunk_tokens else ''}; write fewer, "
                "larger shards, or pass a smaller chunk_tokens",
            )
        usable = sum((t // chunk) * chunk for t in shard_tokens)
        seed = _source_seed(int(pipeline.seed), name)
        runs = schedule.source_runs(s)
        try:
            if pipeline.order == "lanes":
                lanes = pipeline.lanes or auto_lanes(usable, longest, multiple_of=batch)
                orders.append(
                    LaneOrder(
                        shard_tokens,
                        seed=seed,
                        chunk_tokens=chunk,
                        lanes=lanes,
                        runs=runs,
                        max_seq_len=longest,
                    )
                )
            elif pipeline.packing:
                eos = pipeline.eos_id if pipeline.eos_id is not None else corpus.eos_id
                if eos is None:
                    raise ValueError(
                        f"packing={pipeline.packing!r} finds documents by their EOS token, and "
                        "no manifest names one: pass eos_id="
                    )
                packed = PackedOrder(
                    shard_tokens,
                    seed=seed,
                    chunk_tokens=chunk,
                    runs=runs,
                    documents=EosDocuments(data, eos_id=eos, chunk_tokens=chunk),
                    packing=pipeline.packing,
                    block_tokens=pipeline.block_tokens or DEFAULT_PACKED_BLOCK_TOKENS,
                    max_seq_len=longest,
                )
                _say_padded_rests(source_label(name, corpus), packed)
                orders.append(packed)
            else:
                block = pipeline.block_tokens or DEFAULT_BLOCK_TOKENS
                orders.append(
                    BlockOrder(
                        shard_tokens,
                        seed=seed,
                        chunk_tokens=chunk,
                        block_tokens=block,
                        runs=runs,
                        max_seq_len=longest,
                    )
                )
        except ValueError as e:
            unused = len(corpora) > 1 and all(m.weights[s] == 0 for m in schedule.mixtures)
            hint = (
                " (it has weight 0 in every phase: leave it out of the sources instead)"
                if unused
                else ""
            )
            raise ValueError(f"{source_label(name, corpus)}: {e}{hint}") from None
    return orders


def _say_padded_rests(label: str, order: PackedOrder) -> None:
    """Warn where a phase's longer seq_len reads on a block packed at a shorter one: its rows
    are served one per row, mostly padding, until the block ends."""
    for rows, grid, seq_len in order.padded_rests():
        log_once(
            logging.WARNING,
            f"{label}: seq_len rises from {grid} to {seq_len} in the middle of a packed "
            f"block, so its next {rows} rows (packed at {grid}) are served one per row of "
            f"{seq_len}: at least {100 * (seq_len - grid) / (seq_len + 1):.0f}% "
            "padding in those rows, until the next block is packed at the new seq_len; to "
            "avoid it, pass a smaller block_tokens (blocks end more often) or change seq_len "
            "where a block ends",
        )


def check_step(step: Any, argument: str, total: int | None, limit: int) -> int:
    """``step`` as an int if a pipeline of ``total`` batches (None: endless, serving steps
    below ``limit``) can start there; else an error naming ``argument`` and the largest step
    that works."""
    step = int_arg(step, argument, where="TokenPipeline", minimum=0)
    if total is not None and step > total:
        raise ValueError(
            f"TokenPipeline: {argument}={step} is past the end of this pipeline ({total} "
            f"batches: steps 0 to {total - 1}, and {total} means done); pass a step <= "
            f"{total}, or the state saved with this pipeline"
        )
    if total is None and step >= limit:
        raise ValueError(
            f"TokenPipeline: {argument}={step} is past the largest step this endless pipeline "
            f"supports, {limit - 1} (its sample numbers stay below 2**61 = {SAMPLE_LIMIT}); "
            f"pass a step <= {limit - 1}, or the state saved with this pipeline"
        )
    return step


@dataclasses.dataclass(frozen=True, eq=False)
class PipelinePlan:
    """A pipeline's data, opened, and everything that follows from it (see the module doc).

    >>> import tempfile, os, numpy as np
    >>> from grain_rox import TokenPipeline, write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "plan.rox")
    >>> _ = write_rox([np.arange(1, 5001, dtype=np.uint16)], path, separator=0)
    >>> pipe = TokenPipeline(path, seq_len=16, global_batch_size=4, num_epochs=1)
    >>> plan = resolve_plan(pipe)
    >>> plan.num_batches, plan.eos_ids, plan.orders[0].name
    (77, (0,), 'blocks')
    """

    corpora: dict[str, RoxCorpus]  # name -> its opened shards, in the pipeline's order
    orders: tuple[SourceOrder, ...]  # each source's order, in the same order
    eos_ids: tuple[int | None, ...]  # each source's EOS id for segment features (None: none)
    num_batches: int | None  # global batches in all (None: endless)
    step_limit: int  # the first step the pipeline cannot start at (num_batches when finite)
    tokens: TokensLayout | None  # how a batch packs into one array (None: tokens not ints)
    # each source's block padding its order leaves out (see served_shards); none: not named
    padding_left_out: dict[str, int] = dataclasses.field(default_factory=dict)
    # what each source's readers read (its shards, or their served stretches as shards)
    readable: dict[str, RoxCorpus | ServedShards] = dataclasses.field(default_factory=dict)

    @property
    def reads_holes(self) -> bool:
        """Whether a source's blocks order reads a block's rest as holes (see ``HOLES``)."""
        return any(isinstance(o, BlockOrder) and o.reads_holes for o in self.orders)

    @property
    def has_segments(self) -> bool:
        """Whether batches carry segment features (every source has an EOS id)."""
        return all(e is not None for e in self.eos_ids)

    def check_step(self, step: Any, argument: str = "first_step") -> int:
        """``step`` as an int if the pipeline can start there (see :func:`check_step`)."""
        return check_step(step, argument, self.num_batches, self.step_limit)


def _whole_batches(label: str, num_epochs: int, rows_per_epoch: int, batch_size: int) -> int:
    """The batches of ``num_epochs`` epochs: whole ones; the rows left over (fewer than a
    batch) are logged, as a warning where they are over 1% of the rows (a small corpus)."""
    rows = rows_per_epoch * num_epochs
    total, left = divmod(rows, batch_size)
    if left:
        log_once(
            logging.WARNING if left > rows / 100 else logging.INFO,
            f"{label}: num_epochs={num_epochs}: the last {left} of its {rows} rows (fewer than "
            f"a batch of {batch_size}) are not served, so that every batch is whole "
            f"({100 * left / rows:.1f}%); pass a global_batch_size that divides {rows}, or "
            "more epochs",
        )
    return total


def resolve_plan(
    pipeline: TokenPipeline, corpora: Mapping[str, RoxCorpus] | None = None
) -> PipelinePlan:
    """``pipeline`` resolved against its data (``corpora``: its sources already opened)."""
    corpora = dict(pipeline.open() if corpora is None else corpora)
    # each source's tokens but the padding writes left, read once (a few tokens a padded
    # shard; a round trip for a bucket); grain_rox 0.1's lanes order reads the padding too
    lanes = pipeline.order == "lanes"
    served = {} if lanes else {name: served_shards(c) for name, c in corpora.items()}
    orders = tuple(source_orders(pipeline, corpora, served=served))
    eos_ids = tuple(
        (pipeline.eos_id if pipeline.eos_id is not None else c.eos_id)
        if pipeline.segmentation
        else None
        for c in corpora.values()
    )
    stored = {source_label(n, c): c.dtype for n, c in corpora.items()}
    check_output_dtype(pipeline.dtype, stored, eos_ids, where="TokenPipeline")
    schedule = pipeline.schedule
    total = schedule.total_steps
    if pipeline.num_epochs is not None:
        name, corpus = next(iter(corpora.items()))
        total = _whole_batches(source_label(name, corpus), pipeline.num_epochs,
                               orders[0].windows_per_epoch, schedule.phases[0].batch_size)  # fmt: skip
        if total > schedule.step_limit:  # its sample numbers would pass SAMPLE_LIMIT
            most = (
                schedule.step_limit * schedule.phases[0].batch_size // orders[0].windows_per_epoch
            )
            raise ValueError(
                f"TokenPipeline: num_epochs={pipeline.num_epochs} of {source_label(name, corpus)} "
                f"take {total} batches, past the {schedule.step_limit} whose sample numbers stay "
                f"below 2**61 = {SAMPLE_LIMIT}; pass num_epochs <= {most}, or None (endless)"
            )
    has_segments = all(e is not None for e in eos_ids)
    tokens = tokens_layout(
        eos_ids=eos_ids if has_segments else [],
        max_joins=max(o.max_joins for o in orders),
        max_seq_len=orders[0].max_seq_len,
        token_dtypes=[c.dtype for c in corpora.values()],
        packed=pipeline.packing is not None,
    )
    return PipelinePlan(
        corpora=corpora,
        orders=orders,
        eos_ids=eos_ids,
        num_batches=total,
        step_limit=schedule.step_limit if total is None else total,
        tokens=tokens,
        padding_left_out={
            name: left_out
            for name, (_, tokens) in served.items()
            if (left_out := corpora[name].num_tokens - sum(tokens))
        },
        readable={name: served[name][0] if name in served else c for name, c in corpora.items()},
    )
