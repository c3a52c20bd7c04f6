"""A corpus's served stretches as shards of their own, for readers that number shards.

An append to a single file leaves the first write's block padding mid-stream, and its
manifest records where (``padding_spans``). The readers of the pipeline number text by
(shard, offset), each shard's served tokens a prefix of it; a shard with padding inside has
several served stretches, so each stretch is presented as a shard of its own: shard ``s`` of
a :class:`ServedShards` is tokens ``[start, stop)`` of one of the corpus's shards, read
through the corpus (memory maps or ranged requests) with the offsets moved.

>>> import tempfile, os, numpy as np
>>> from grain_rox import open_rox, write_rox
>>> path = os.path.join(tempfile.mkdtemp(), "s.rox")
>>> _ = write_rox([np.arange(10, 20, dtype=np.uint16)], path, block_size=32)
>>> shards = ServedShards(open_rox(path), [(0, 0, 3), (0, 6, 10)])  # tokens 0-2 and 6-9
>>> shards.shard_slice(1, 0, 9).tolist(), shards.gather(1, np.array([1]), 2).tolist()
([16, 17, 18, 19], [[17, 18]])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from grain_rox._format._rox_corpus import RoxCorpus
from grain_rox._format._served import served_stretches


class ServedShards:
    """Stretches ``(shard, start, stop)`` of ``corpus``'s shards, each read as a shard: the
    part of :class:`~grain_rox.RoxCorpus`'s reading interface the pipeline's readers use."""

    def __init__(self, corpus: RoxCorpus, stretches: Sequence[tuple[int, int, int]]) -> None:
        self.corpus = corpus
        self.stretches = tuple((int(s), int(a), int(b)) for s, a, b in stretches)
        self.paths = tuple(corpus.paths[s] for s, _, _ in self.stretches)

    @property
    def remote(self) -> bool:
        return self.corpus.remote

    def __repr__(self) -> str:
        return f"ServedShards({self.corpus!r}, {len(self.stretches)} stretches)"

    def _where(self, s: int) -> tuple[int, int, int]:
        """(corpus shard, first token, tokens) of stretch ``s``."""
        shard, a, b = self.stretches[s]
        return shard, a, b - a

    def shard_tokens(self, s: int) -> np.ndarray:
        shard, a, n = self._where(s)
        return self.corpus.shard_tokens(shard)[a : a + n]

    def shard_slice(self, s: int, start: int, stop: int) -> np.ndarray:
        shard, a, n = self._where(s)
        return self.corpus.shard_slice(shard, a + start, a + min(stop, n))

    def gather(self, s: int, starts: np.ndarray, width: int) -> np.ndarray:
        shard, a, _ = self._where(s)
        return self.corpus.gather(shard, np.asarray(starts) + a, width)

    def gather_many(self, requests: list[tuple[int, np.ndarray, int]]) -> list[np.ndarray]:
        moved = []
        for s, starts, width in requests:
            shard, a, _ = self._where(s)
            moved.append((shard, np.asarray(starts) + a, width))
        return self.corpus.gather_many(moved)

    def shard_spans_many(
        self, requests: list[tuple[int, list[tuple[int, int]]]]
    ) -> list[list[np.ndarray]]:
        moved = []
        for s, spans in requests:
            shard, a, _ = self._where(s)
            moved.append((shard, [(a + lo, a + hi) for lo, hi in spans]))
        return self.corpus.shard_spans_many(moved)


def served_shards(corpus: RoxCorpus) -> tuple[RoxCorpus | ServedShards, list[int]]:
    """What the pipeline's readers read of ``corpus``, and each of its shards' served tokens:
    the corpus itself where every shard's served tokens are a prefix of it (nearly always:
    padding is left out at shard ends), else a :class:`ServedShards` of its stretches.

    >>> import tempfile, os, numpy as np
    >>> from grain_rox import open_rox, write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "p.rox")
    >>> _ = write_rox([np.arange(1, 6, dtype=np.uint16)], path, separator=0, block_size=16)
    >>> data, counts = served_shards(open_rox(path))
    >>> type(data).__name__, counts
    ('RoxCorpus', [6])
    >>> _ = write_rox([np.array([7], np.uint16)], path, separator=0, block_size=16,
    ...               if_exists="append")
    >>> data, counts = served_shards(open_rox(path))
    >>> type(data).__name__, counts, data.stretches
    ('ServedShards', [6, 2], ((0, 0, 6), (0, 8, 10)))
    """
    stretches = served_stretches(corpus)
    if all(len(shard) == 1 and shard[0][0] == 0 for shard in stretches):
        return corpus, [shard[0][1] for shard in stretches]
    flat = [(s, a, b) for s, shard in enumerate(stretches) for a, b in shard if b > a]
    return ServedShards(corpus, flat), [b - a for _, a, b in flat]
