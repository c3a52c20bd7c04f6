"""Tokenize keyed documents on Beam workers, the tokenizer loaded once per worker.

:class:`TokenizeFn` takes batches of ``(key, document)`` (from ``beam.BatchElements``), loads
the tokenizer in ``DoFn.setup`` (once per worker process, however many bundles it runs) and
encodes each batch's texts with one ``encode_batch`` (tiktoken and HF tokenizers spread it over
the worker's cores). Token arrays pass through checked as the local writer checks them (ids of
the vocabulary, values that fit the dtype). Each document leaves as ``(key, bytes)``: its
tokens and the EOS token in the shard dtype, the bytes ``write_rox`` writes for it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
import numpy as np

from grain_rox._beam._commit import conversion_layout
from grain_rox._beam._metrics import counter
from grain_rox._beam._plan import check_key
from grain_rox._text._item_encoding import ItemEncoder, check_dtype_range


def _where(key: Any) -> str:
    return f"the document keyed {key!r}"


class TokenizeFn(beam.DoFn):
    """Batches of ``(key, str | token array)`` -> ``(key, token bytes + EOS)``."""

    def __init__(self, tokenizer: str, block_size: int, dtype: str | None) -> None:
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.dtype = dtype

    def setup(self) -> None:
        layout = conversion_layout(self.tokenizer, block_size=self.block_size, dtype=self.dtype)
        assert layout.tokenizer is not None and layout.separator is not None
        self.tok = layout.tokenizer
        self.target = layout.dtype
        self.encoder = ItemEncoder(layout.dtype, layout.tokenizer)
        self.eos = np.asarray([layout.separator], layout.dtype).tobytes()
        self.documents = counter("documents")
        self.tokens = counter("tokens")

    def _array(self, key: Any, item: Any) -> np.ndarray:
        try:
            return self.encoder(item, 0)
        except (ValueError, TypeError) as e:
            raise type(e)(str(e).replace("item 0", _where(key), 1)) from None

    def process(self, batch: Sequence[tuple[Any, Any]]) -> Iterator[tuple[Any, bytes]]:
        for key, _ in batch:
            check_key(key)
        texts = [item for _, item in batch if isinstance(item, str)]
        encoded = iter(self.tok.encode_batch(texts) if texts else [])
        n = 0
        for key, item in batch:
            if isinstance(item, str):
                ids = next(encoded)
                if not self.encoder.ids_fit:
                    check_dtype_range(ids, self.target, _where(key))
                arr = ids.astype(self.target, copy=False)
            else:
                arr = self._array(key, item)
            n += arr.size + 1
            yield key, np.ascontiguousarray(arr).tobytes() + self.eos
        self.documents.inc(len(batch))
        self.tokens.inc(n)


def tokenizer_spec(tokenizer: str | os.PathLike[str]) -> str:
    """The tokenizer as the workers will load it: a name or a path, never an object."""
    if not isinstance(tokenizer, (str, os.PathLike)):
        raise TypeError(
            f"tokenizer={tokenizer!r}: on Beam give the tokenizer's name ('bytes', "
            "'cl100k_base', 'o200k_base') or the path of a tokenizer.json every worker can "
            "read, so each worker loads it once"
        )
    return os.fspath(tokenizer)
