"""Small token corpora the tests share: documents of random token ids, drawn reproducibly.

Write them with the ``make_rox`` fixture (``tests/conftest.py``). The draws are part of a
test's data: a test that pins token values pins the seed and every argument here, so change
the order of the draws only together with those tests.
"""

from __future__ import annotations

import numpy as np


def random_documents(
    seed: int,
    count: int | None = None,
    *,
    lengths: int | tuple[int, int] = (5, 200),
    high: int = 1000,
    low: int = 1,
    dtype: type = np.uint16,
    until_tokens: int | None = None,
) -> list[np.ndarray]:
    """``count`` documents of token ids drawn uniformly from ``[low, high)`` (by default none
    is 0, the EOS id the tests write between documents).

    Each document's length is ``lengths`` when an int, else drawn from ``[lo, hi)`` just
    before its tokens. With ``until_tokens`` instead of ``count``, documents are drawn until
    they hold that many tokens counting one separator after each.

    >>> docs = random_documents(0, 3, lengths=(2, 6), high=50)
    >>> len(docs), all(2 <= d.size < 6 and d.min() >= 1 and d.max() < 50 for d in docs)
    (3, True)
    >>> [d.size for d in random_documents(1, 4, lengths=7)]
    [7, 7, 7, 7]
    >>> sum(d.size + 1 for d in random_documents(2, until_tokens=1000)) >= 1000
    True
    """
    if (count is None) == (until_tokens is None):
        raise ValueError("random_documents: pass count or until_tokens, not both")
    rng = np.random.default_rng(seed)
    docs: list[np.ndarray] = []
    total = 0
    while len(docs) != count and (until_tokens is None or total < until_tokens):
        n = lengths if isinstance(lengths, int) else int(rng.integers(*lengths))
        docs.append(rng.integers(low, high, size=n, dtype=dtype))
        total += n + 1
    return docs


def unsealed(manifest: dict) -> dict:
    """A manifest's JSON without its checksum and its ``"sealed"`` claim, as a grain_rox from
    before checksums (or another tool) wrote it: a test's edit then reaches the checks behind
    the checksum."""
    manifest.pop("checksum", None)
    manifest.pop("sealed", None)
    return manifest
