"""Tokenize documents in order, in batches encoded ahead on threads.

tiktoken and HF ``tokenizers`` release the GIL inside their Rust cores and spread one
``encode_batch`` over every core, so batches of about a megabyte of text, encoded on a thread
while the caller writes the previous batch, use the machine without pickling documents to
worker processes; batches come back in input order, so the shards written are deterministic.

>>> from grain_rox import ByteTokenizer
>>> [a.tolist() for a in tokenize_in_order(["ab", "c"], ByteTokenizer())]
[[97, 98], [99]]
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Iterable, Iterator
from typing import Any

from grain_rox._text._tokenizers import Tokenizer

_Pending = concurrent.futures.Future[list[Any]] | list[Any]


def tokenize_in_order(
    items: Iterable[Any],
    tokenizer: Tokenizer,
    *,
    workers: int | None = None,
    chunk_chars: int = 1 << 20,
) -> Iterator[Any]:
    """Yield ``tokenizer.encode(item)`` for each ``str`` item, in order, encoding ahead on
    threads; other items (token arrays, bytes) pass through in their place.

    Runs of ``str`` items are encoded in batches of about ``chunk_chars`` characters;
    ``workers`` batches are encoded concurrently (default 1: tiktoken and HF tokenizers already
    spread one ``encode_batch`` over all cores; more threads only oversubscribe).

    >>> from grain_rox import ByteTokenizer
    >>> out = tokenize_in_order(["ab", [7], "c"], ByteTokenizer(), workers=2)
    >>> [getattr(x, "tolist", lambda: x)() for x in out]
    [[97, 98], [7], [99]]
    """
    ahead = max(1, workers or 1)
    with concurrent.futures.ThreadPoolExecutor(ahead) as pool:
        pending: collections.deque[_Pending] = collections.deque()
        chunk: list[str] = []
        size = 0
        for item in items:
            if isinstance(item, str):
                chunk.append(item)
                size += len(item)
                if size < chunk_chars:
                    continue
            if chunk:
                pending.append(pool.submit(tokenizer.encode_batch, chunk))
                chunk, size = [], 0
            if not isinstance(item, str):
                pending.append([item])
            while len(pending) > ahead:
                yield from _ready(pending.popleft())
        if chunk:
            pending.append(pool.submit(tokenizer.encode_batch, chunk))
        while pending:
            yield from _ready(pending.popleft())


def _ready(pending: _Pending) -> list[Any]:
    return pending if isinstance(pending, list) else pending.result()
