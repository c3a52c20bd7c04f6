"""Any Hugging Face ``tokenizer.json``, run by the ``tokenizers`` package: its EOS and pad ids
found among the usual special tokens, and the file pinned by its sha256 across pickling.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from grain_rox._format._log_once import log_once
from grain_rox._text._tokenizer_base import INSTALL_FIX, check_text, identity_record, to_id_list

if TYPE_CHECKING:
    import tokenizers

_HF_EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<eos>", "<|end|>", "[EOS]", "<|end_of_text|>")
_HF_PAD_CANDIDATES = ("<pad>", "[PAD]", "<|pad|>")
_CONFIG = "tokenizer_config.json"


def _configured_eos(path: Path) -> str | None:
    """The ``eos_token`` of the ``tokenizer_config.json`` beside ``path`` (the model's own
    choice, a string or ``{"content": ...}``), or None where there is none to read."""
    config = path.parent / _CONFIG
    try:
        with open(config, encoding="utf-8") as f:
            value = json.load(f).get("eos_token")
    except (OSError, ValueError, AttributeError):  # none, unreadable, or not an object
        return None
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _resolve_tokenizer_json(path: str | os.PathLike[str]) -> Path:
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise FileNotFoundError(
            f"no tokenizer file at {p}; pass the path of a Hugging Face tokenizer.json "
            "(or a directory containing one)"
        )
    return p


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` (a file, or a directory containing one).

    Nothing is added around the text (``add_special_tokens=False``), special-token strings
    inside the text are encoded as ordinary text, and the file's truncation and padding (a
    model's input length) are not applied: a document is encoded whole. EOS is
    ``eos_token`` if given, else the ``eos_token`` of a ``tokenizer_config.json`` beside the
    file (the model's own), else the first of ``</s>``, ``<|endoftext|>``, ``<eos>``,
    ``<|end|>``, ``[EOS]``, ``<|end_of_text|>`` present in the vocabulary (a warning names
    the choice when it holds several). Pickling sends the path; the file is re-read lazily
    and must still have the same sha256.

    Args:
      path: a ``tokenizer.json`` file, or a directory containing one.
      eos_token: the token that ends a document; default as above.

    >>> HFTokenizer("/nonexistent/tokenizer.json")
    Traceback (most recent call last):
    FileNotFoundError: no tokenizer file at /nonexistent/tokenizer.json; pass the path of a Hugging Face tokenizer.json (or a directory containing one)
    """

    name: str
    vocab_size: int
    eos_id: int
    pad_id: int | None

    def __init__(self, path: str | os.PathLike[str], *, eos_token: str | None = None) -> None:
        self.path = _resolve_tokenizer_json(path)
        data = self.path.read_bytes()
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.eos_token = eos_token
        self._tok: tokenizers.Tokenizer | None = None
        tok = self._load(data)
        parent = self.path.parent.name if self.path.name == "tokenizer.json" else ""
        self.name = f"hf:{parent or self.path.name}"
        # ids may have gaps (a WordLevel vocabulary's): the ids go up to the largest one
        ids = tok.get_vocab(with_added_tokens=True).values()
        self.vocab_size = max(tok.get_vocab_size(with_added_tokens=True), max(ids, default=-1) + 1)
        named = eos_token if eos_token is not None else _configured_eos(self.path)
        if named is not None:
            where = "eos_token" if eos_token is not None else _CONFIG
            eos = tok.token_to_id(named)
            if eos is None:
                raise ValueError(
                    f"{where} {named!r} is not in {self.path}; pass eos_token= (grain-rox "
                    f"convert --eos-token) naming one of its tokens, e.g. one of its special "
                    f"tokens {self._special_tokens(tok)}"
                )
        else:
            found = [(t, i) for t in _HF_EOS_CANDIDATES if (i := tok.token_to_id(t)) is not None]
            if not found:
                raise ValueError(
                    f"{self.path} has none of the usual EOS tokens {list(_HF_EOS_CANDIDATES)}; "
                    f"pass eos_token= (grain-rox convert --eos-token) naming its "
                    f"end-of-document token, e.g. one of its special tokens "
                    f"{self._special_tokens(tok)}"
                )
            eos = found[0][1]
            if len(found) > 1:
                log_once(
                    logging.WARNING,
                    f"{self.path} holds several usual EOS tokens "
                    f"({', '.join(repr(t) for t, _ in found)}) and no {_CONFIG} beside it names "
                    f"one: documents end with {found[0][0]!r} (id {eos}), the first; pass "
                    "eos_token= (grain-rox convert --eos-token) if the model ends them with "
                    "another",
                )
        self.eos_id = int(eos)
        self._refuse_an_eos_text_can_hold(tok)
        pads = [i for t in _HF_PAD_CANDIDATES if (i := tok.token_to_id(t)) is not None]
        self.pad_id = int(pads[0]) if pads else None
        self._tok = tok

    def _refuse_an_eos_text_can_hold(self, tok: tokenizers.Tokenizer) -> None:
        """An EOS that is an added token not marked special is matched in the text itself
        (only special tokens are encoded as text there): a document holding it would fake a
        document boundary."""
        get = getattr(tok, "get_added_tokens_decoder", None)
        added = get().get(self.eos_id) if get is not None else None
        if added is not None and not getattr(added, "special", False):
            raise ValueError(
                f"{self.path}: its EOS token {added.content!r} (id {self.eos_id}) is an added "
                "token not marked special, so the same text inside a document would be encoded "
                "as the EOS id and fake a document boundary; mark it special in the "
                'tokenizer.json ("special": true), or pass eos_token= naming a special token'
            )

    def _checked(self, ids: list[int], text: str) -> np.ndarray:
        """``ids`` as an array, refused where the text encodes to the EOS id (a vocabulary
        whose EOS is an ordinary token text can merge into)."""
        out = np.asarray(ids, dtype=np.int64)
        at = np.flatnonzero(out == self.eos_id)
        if at.size:
            raise ValueError(
                f"{self.path}: the text {text[:80]!r}{'...' if len(text) > 80 else ''} encodes "
                f"to the EOS id {self.eos_id} (at token {int(at[0])}), which would fake a "
                "document boundary; pass eos_token= (grain-rox convert --eos-token) naming a "
                "special token that no text encodes to"
            )
        return out

    @staticmethod
    def _special_tokens(tok: tokenizers.Tokenizer) -> list[str]:
        get = getattr(tok, "get_added_tokens_decoder", None)
        if get is None:
            return []
        return [t.content for t in get().values() if getattr(t, "special", False)]

    def _load(self, data: bytes) -> tokenizers.Tokenizer:
        try:
            import tokenizers
        except ImportError:
            raise ImportError(
                f"HFTokenizer({str(self.path)!r}) needs the tokenizers package; fix: {INSTALL_FIX}"
            ) from None
        try:
            tok = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
        except Exception as e:  # tokenizers raises a bare Exception; bytes may not be UTF-8
            raise ValueError(
                f"{self.path} is not a Hugging Face tokenizer.json ({type(e).__name__}: {e}); "
                "pass the tokenizer.json saved by tokenizers or transformers "
                "(tokenizer.save(path) / save_pretrained), or a named tokenizer such as "
                "cl100k_base"
            ) from e
        if hasattr(tok, "encode_special_tokens"):
            tok.encode_special_tokens = True  # literal "</s>" in text stays text
        # A tokenizer.json saved with truncation or padding on (save_pretrained keeps a model's
        # max_length) cut every document to it or padded it with pad ids, unsaid: a document
        # is encoded whole, and the packer splits it
        tok.no_truncation()
        tok.no_padding()
        return tok

    @property
    def tokenizer(self) -> tokenizers.Tokenizer:
        """The underlying ``tokenizers.Tokenizer`` (re-read lazily after unpickling)."""
        if self._tok is None:
            data = _resolve_tokenizer_json(self.path).read_bytes()
            actual = hashlib.sha256(data).hexdigest()
            if actual != self.sha256:
                raise ValueError(
                    f"{self.path} changed since this HFTokenizer was created (sha256 {actual}, "
                    f"expected {self.sha256}); restore the file or create a new HFTokenizer"
                )
            self._tok = self._load(data)
        return self._tok

    def encode(self, text: str) -> np.ndarray:
        """Ids of ``text`` without added special tokens."""
        check_text(text, "HFTokenizer")
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return self._checked(ids, text)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Encode in parallel with ``tokenizers.Tokenizer.encode_batch``."""
        texts = list(texts)
        for t in texts:
            check_text(t, "HFTokenizer")
        out = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [self._checked(e.ids, t) for e, t in zip(out, texts, strict=True)]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text for ``ids``; special tokens such as EOS are kept in the output."""
        id_list = to_id_list(ids, vocab_size=self.vocab_size, who="HFTokenizer")
        text: str = self.tokenizer.decode(id_list, skip_special_tokens=False)
        return text

    def identity(self) -> dict[str, Any]:
        """JSON-serialisable description; ``sha256`` is that of the tokenizer.json bytes."""
        return identity_record(self, "hf", self.sha256)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tok"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"HFTokenizer({str(self.path)!r}, eos_token={self.eos_token!r})"
