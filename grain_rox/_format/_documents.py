"""Where a corpus's documents are: the served stretches (each write's padding left out, see
:mod:`grain_rox._format._served`) split after each EOS, found by one vectorised scan per
chunk of each shard. :class:`~grain_rox.RoxDocumentSource` serves them and
``grain-rox inspect --plot`` counts their lengths.

>>> import tempfile, os, numpy as np
>>> from grain_rox import open_rox, write_rox
>>> from grain_rox._format._served import served_spans
>>> path = os.path.join(tempfile.mkdtemp(), "d.rox")
>>> _ = write_rox([np.array([5, 6], np.uint16), np.array([7], np.uint16)], path, separator=0)
>>> with open_rox(path) as corpus:
...     found = split_documents(served_spans(corpus), token_offsets(corpus, 0))
>>> found.starts.tolist(), found.stops.tolist(), found.ended.tolist()
([0, 3], [3, 5], [True, True])
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np

from grain_rox._format._rox_corpus import RoxCorpus
from grain_rox._format._served import ServedSpan


def token_offsets(corpus: RoxCorpus, token: int, chunk_tokens: int = 1 << 24) -> np.ndarray:
    """Every corpus offset of ``token``, in order (``chunk_tokens`` compared at a time)."""
    found = [np.empty(0, np.int64)]
    for s, shard in enumerate(corpus.shards):
        for lo, tokens in corpus.iter_shard(s, chunk_tokens):
            found.append(
                np.flatnonzero(tokens == token).astype(np.int64) + (shard.first_token + lo)
            )
    return np.concatenate(found)


@dataclasses.dataclass(frozen=True)
class Documents:
    """The documents of some stretches, in corpus order."""

    starts: np.ndarray  # each one's first corpus offset
    stops: np.ndarray  # its end (exclusive): after its EOS, or the stretch's end
    ended: np.ndarray  # whether it ends with an EOS (text after a stretch's last EOS does not)
    # text after a stretch's last EOS where no manifest says the data ends there (a shard
    # without one, whose end may be a pad id other than the EOS): [start, stop), left out
    unknown_tails: list[tuple[int, int]]


def split_documents(spans: list[ServedSpan], eos: np.ndarray) -> Documents:
    """``spans`` split after each EOS (``eos``: the corpus offsets of every EOS, in order).
    Text after a stretch's last EOS is a document too, EOS or not, where a manifest says
    where the data ends (``known_end``); else it is left out, listed in ``unknown_tails``."""
    starts: list[np.ndarray] = [np.empty(0, np.int64)]
    stops: list[np.ndarray] = [np.empty(0, np.int64)]
    ended: list[np.ndarray] = [np.empty(0, bool)]
    unknown: list[tuple[int, int]] = []
    for span in spans:
        inside = eos[np.searchsorted(eos, span.start) : np.searchsorted(eos, span.stop)]
        first = np.concatenate([[span.start], inside + 1]).astype(np.int64)
        stop = np.concatenate([inside + 1, [span.stop]]).astype(np.int64)
        done = np.concatenate([np.ones(inside.size, bool), [False]])
        tail = int(first[-1])  # after the last EOS: the span's last document, or none
        if not (tail < span.stop and span.known_end):
            first, stop, done = first[:-1], stop[:-1], done[:-1]
            if tail < span.stop:
                unknown.append((tail, span.stop))
        starts.append(first)
        stops.append(stop)
        ended.append(done)
    return Documents(np.concatenate(starts), np.concatenate(stops), np.concatenate(ended), unknown)


def warn_unknown_tail(who: str, verb: str, path: str, count: int, offset: int, eos: Any) -> None:
    """Say that ``count`` tokens from corpus ``offset`` after the last EOS, which no manifest
    says are text, are not ``verb`` (``who``: the reader, as its call is written)."""
    logging.getLogger("grain_rox").warning(
        "%s(%s, ...): the last %d tokens (from corpus offset %d) follow the last EOS %s with "
        "no manifest to say whether they are text or a writer's padding, and are not %s; "
        "write the shards with grain_rox (a manifest) or end every document with the EOS",
        who,
        path,
        count,
        offset,
        eos,
        verb,
    )
