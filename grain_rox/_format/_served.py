"""The tokens a reader serves of a corpus: all of them but each write's block padding.

A write pads its last block with the pad id (roxxel's format has whole blocks), and each
shard's manifest records how much padding ends the shard
(:meth:`~grain_rox.RoxCorpus.trailing_padding`). Readers leave it out, as far as the run of pad
ids at the shard's end reaches (read once, a few tokens a shard): exactly a write's padding,
and never a token that is not the pad id, even where a manifest from before appends were
recorded mis-counts. An append to a single file leaves the earlier write's padding
mid-stream; the manifest records where (:meth:`~grain_rox.RoxCorpus.padding_spans`), and it is
left out too where those tokens are all the pad id. So a shard's served tokens are one or more
*stretches*. A shard without a manifest, as roxxel writes them, records none: it is read whole.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from grain_rox._format._log_once import log_once
from grain_rox._format._manifest import pad_run
from grain_rox._format._rox_corpus import RoxCorpus


def served_stretches(corpus: RoxCorpus) -> list[list[tuple[int, int]]]:
    """Each shard's served stretches ``[start, stop)`` (token offsets in the shard): one,
    empty where nothing is served, for a shard with no padding left mid-stream; one per gap
    between the paddings an append left in it.

    >>> import tempfile, os, numpy as np
    >>> from grain_rox import open_rox, write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "a.rox")
    >>> _ = write_rox([np.array([1, 2, 3], np.uint16)], path, separator=0, block_size=16)
    >>> _ = write_rox([np.array([4, 5], np.uint16)], path, separator=0, block_size=16,
    ...               if_exists="append")
    >>> corpus = open_rox(path)
    >>> corpus.tokens(0, corpus.num_tokens).tolist()  # the first write's padding mid-stream
    [1, 2, 3, 0, 0, 0, 0, 0, 4, 5, 0, 0, 0, 0, 0, 0]
    >>> served_stretches(corpus)
    [[(0, 4), (8, 11)]]
    """
    return _stretches(corpus, corpus.trailing_padding())


def _stretches(corpus: RoxCorpus, trailing: list[tuple[int, Any]]) -> list[list[tuple[int, int]]]:
    """:func:`served_stretches`, given the corpus's :meth:`~RoxCorpus.trailing_padding`."""
    ends = _served_ends(corpus, trailing)
    inner = corpus.padding_spans()
    checks = [
        (s, within)
        for s, (spans, _) in enumerate(inner)
        if (within := [(a, a + n) for a, n in spans if n > 0 and a + n <= ends[s]])
    ]
    out = [[(0, end)] for end in ends]
    if not checks:
        return out
    read = corpus.shard_spans_many(checks)  # all in one round trip for a bucket
    for (s, spans), tokens in zip(checks, read, strict=True):
        pad = inner[s][1]
        gaps = sorted(
            span for span, t in zip(spans, tokens, strict=True) if pad_run(t, pad) == t.size
        )
        if len(gaps) < len(spans):  # (the writer records only runs of its pad id)
            lo, hi = next(sp for sp in spans if sp not in gaps)
            more = len(spans) - len(gaps) - 1
            log_once(
                logging.WARNING,
                f"{corpus.paths[s]}: its manifest records block padding at tokens [{lo}, "
                f"{hi}){f' and {more} more places' if more else ''}, but they are not all its "
                f"pad id {pad}: served as text, as the shard holds them; run grain-rox verify "
                "on the set, and rewrite it if its checksums fail",
            )
        stretches: list[tuple[int, int]] = []
        at = 0
        for lo, hi in gaps:
            if lo > at:
                stretches.append((at, lo))
            at = max(at, hi)
        if ends[s] > at:
            stretches.append((at, ends[s]))
        out[s] = stretches or [(0, 0)]
    return out


def _served_ends(corpus: RoxCorpus, trailing: list[tuple[int, Any]]) -> list[int]:
    """Where each shard's served tokens end: its tokens but the run of pad ids at its end,
    as far as its manifest's trailing padding reaches."""
    counts = [sh.num_tokens for sh in corpus.shards]
    padded = [(s, n, pad) for s, (n, pad) in enumerate(trailing) if n]
    if not padded:
        return counts
    tails = corpus.shard_spans_many([(s, [(counts[s] - n, counts[s])]) for s, n, _ in padded])
    for (s, _, pad), (tail,) in zip(padded, tails, strict=True):
        counts[s] -= pad_run(tail, pad)
    return counts


@dataclasses.dataclass(frozen=True)
class ServedSpan:
    """Corpus tokens ``[start, stop)`` served as one stretch of text (consecutive stretches
    with no padding left out between them); ``known_end``: whether a manifest says where the
    stretch's data ends (its last shard's padding is known), so text after its last EOS is
    data, not possibly padding."""

    start: int
    stop: int
    known_end: bool


def served_spans(corpus: RoxCorpus) -> list[ServedSpan]:
    """The corpus's served tokens as stretches of corpus offsets, split where padding is left
    out.

    >>> import tempfile, os, numpy as np
    >>> from grain_rox import open_rox, write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "s.rox")
    >>> _ = write_rox([np.arange(1, 6, dtype=np.uint16)], path, separator=0, block_size=16)
    >>> served_spans(open_rox(path))
    [ServedSpan(start=0, stop=6, known_end=True)]
    """
    trailing = corpus.trailing_padding()
    stretches = _stretches(corpus, trailing)
    known = [pad is not None for _, pad in trailing]
    spans: list[ServedSpan] = []
    for s, shard in enumerate(corpus.shards):
        for a, b in stretches[s]:
            start, stop = shard.first_token + a, shard.first_token + b
            if stop == start:  # nothing served (an empty shard, or one of padding alone)
                continue
            if spans and spans[-1].stop == start:  # nothing left out between: one stretch
                start = spans.pop().start
            spans.append(ServedSpan(start, stop, known[s]))
    return spans
