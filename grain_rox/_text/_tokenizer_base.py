"""What the tokenizers share: the checks on ``encode``/``decode`` arguments, the install hint
for their optional packages, the identity record a shard set's manifest stores and the label
that names a tokenizer by content in a source's repr.

>>> to_id_list([3, 1], vocab_size=4, who="Tok")
[3, 1]
>>> check_text(b"x", "Tok")
Traceback (most recent call last):
TypeError: Tok.encode expects str, got bytes; decode bytes first, e.g. data.decode('utf-8')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from grain_rox._format._digest import facts_digest

if TYPE_CHECKING:
    from grain_rox._text._tokenizers import Tokenizer

INSTALL_FIX = "pip install 'grain_rox[tokenizers]'"


def to_id_list(ids: Sequence[int] | np.ndarray, *, vocab_size: int, who: str) -> list[int]:
    """Validate ``ids`` against ``0 .. vocab_size - 1`` and return them as Python ints."""
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise ValueError(f"{who}.decode expects a 1-D sequence of ids, got shape {arr.shape}")
    if arr.size == 0:
        return []
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{who}.decode expects integer ids, got dtype {arr.dtype}")
    bad = (arr < 0) | (arr >= vocab_size)
    if bad.any():
        first = int(arr[int(np.argmax(bad))])
        raise ValueError(
            f"{who}.decode got id {first}, outside 0..{vocab_size - 1}; "
            "decode only ids produced by this tokenizer"
        )
    out: list[int] = arr.tolist()
    return out


def check_text(text: object, who: str) -> None:
    if not isinstance(text, str):
        raise TypeError(
            f"{who}.encode expects str, got {type(text).__name__}; "
            "decode bytes first, e.g. data.decode('utf-8')"
        )


def identity_record(tok: Tokenizer, kind: str, sha256: str | None) -> dict[str, Any]:
    """The JSON-serialisable identity of ``tok`` (``kind``, name, ids, ``sha256`` of its
    vocabulary), which pins down exactly which ids it emits."""
    return {
        "kind": kind,
        "name": tok.name,
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "pad_id": tok.pad_id,
        "sha256": sha256,
    }


def tokenizer_label(tok: Tokenizer) -> str:
    """``tok`` named by what decides its ids, short enough for a repr: its name (``hf`` for a
    tokenizer.json, whose name is its folder's), its vocabulary's sha256 (16 hex digits; a
    digest of its :meth:`~Tokenizer.identity` for a tokenizer that has none) and its EOS id.
    Another tokenizer.json in a folder of the same name, the same file rewritten, or another
    EOS token give another label; the same file in another folder gives the same.

    >>> from grain_rox._text._tokenizers import ByteTokenizer
    >>> tokenizer_label(ByteTokenizer())
    'bytes identity:3d74760d3fc76651 eos=256'
    """
    identity = tok.identity()
    sha256 = identity.get("sha256")
    content = f"sha256:{sha256[:16]}" if sha256 else f"identity:{facts_digest(identity)}"
    # a tokenizer.json is named by its folder (hf:<folder>): the same file elsewhere is the
    # same tokenizer, so its content names it, and its kind
    name = "hf" if sha256 and identity.get("kind") == "hf" else tok.name
    return f"{name} {content} eos={tok.eos_id}"
