"""Where the documents of a stretch of a `.rox` shard end: after each EOS token.

The packed order (``_order._packed``) asks this of each chunk it packs; the scan is one
vectorised comparison over the chunk's tokens, read from the memory map the rows are copied
from anyway, so no document index is built, stored or kept in memory.

>>> import tempfile, os, numpy as np
>>> from grain_rox import open_rox, write_rox
>>> path = os.path.join(tempfile.mkdtemp(), "d.rox")
>>> _ = write_rox([np.array([5, 6], np.uint16), np.array([7], np.uint16)], path, separator=0)
>>> EosDocuments(open_rox(path), eos_id=0, chunk_tokens=5)(0, 0).tolist()
[3, 5]
"""

from __future__ import annotations

import numpy as np

from grain_rox._format._rox_corpus import RoxCorpus
from grain_rox._format._served_shards import ServedShards


class EosDocuments:
    """``(shard, start) -> `` the exclusive ends of the documents in tokens ``[start, start +
    chunk_tokens)`` of the shard (offsets from ``start``, just after each EOS)."""

    def __init__(self, corpus: RoxCorpus | ServedShards, *, eos_id: int, chunk_tokens: int) -> None:
        self.corpus = corpus
        self.eos_id = int(eos_id)
        self.chunk_tokens = int(chunk_tokens)

    def __call__(self, shard: int, start: int) -> np.ndarray:
        tokens = self.corpus.shard_slice(shard, start, start + self.chunk_tokens)
        return np.flatnonzero(tokens == self.eos_id) + 1
