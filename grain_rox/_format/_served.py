"""The tokens a reader serves of a corpus: all of them but each write's block padding.

A write pads its last block with the pad id (roxxel's format has whole blocks), and each
shard's manifest records how much padding ends the shard
(:meth:`~grain_rox.RoxCorpus.trailing_padding`). Readers leave it out, as far as the run of pad
ids at the shard's end reaches (read once, a few tokens a shard): exactly a write's padding,
and never a token that is not the pad id, even where a manifest from before appends were
recorded mis-counts. A shard without a manifest, as roxxel writes them, records none: it is
read whole. Padding that an append to a single file left mid-stream is read as written.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from grain_rox._format._manifest import pad_run
from grain_rox._format._rox_corpus import RoxCorpus


def served_tokens(corpus: RoxCorpus) -> list[int]:
    """Each shard's tokens a reader serves: all of them but the padding at its end.

    >>> import tempfile, os, numpy as np
    >>> from grain_rox import open_rox, write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "p.rox")
    >>> _ = write_rox([np.arange(1, 6, dtype=np.uint16)], path, separator=0, block_size=16)
    >>> corpus = open_rox(path)
    >>> corpus.tokens(0, corpus.num_tokens).tolist(), served_tokens(corpus)
    ([1, 2, 3, 4, 5, 0, 0, 0], [6])
    """
    return _served(corpus, corpus.trailing_padding())


def _served(corpus: RoxCorpus, trailing: list[tuple[int, Any]]) -> list[int]:
    """:func:`served_tokens`, given the corpus's :meth:`~RoxCorpus.trailing_padding`."""
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
    """Corpus tokens ``[start, stop)`` served as one stretch of text (consecutive shards with
    no padding left out between them); ``known_end``: whether a manifest says where the
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
    served = _served(corpus, trailing)
    known = [pad is not None for _, pad in trailing]
    spans: list[ServedSpan] = []
    for s, shard in enumerate(corpus.shards):
        start, stop = shard.first_token, shard.first_token + served[s]
        if stop == start:  # nothing served (an empty shard, or one of padding alone)
            continue
        if spans and spans[-1].stop == start:  # nothing left out between: one stretch
            start = spans.pop().start
        spans.append(ServedSpan(start, stop, known[s]))
    return spans
