"""write_rox: exact bytes, dtype and separator rules, sharding, appends, manifests, atomicity."""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import struct

import numpy as np
import pytest

from grain_rox import ByteTokenizer, open_rox, write_rox
from grain_rox._format._rox_format import FOOTER


def footer(path: str) -> tuple[int, int, bytes, bytes]:
    with open(path, "rb") as f:
        f.seek(-32, os.SEEK_END)
        return FOOTER.unpack(f.read())


def test_text_with_newline_separator_matches_roxxel_hexdump(tmp_path):
    path = str(tmp_path / "a.rox")
    write_rox(["hello", "world", "abc"], path, separator=b"\n", block_size=8, manifest=False)
    expected = (
        b"hello\nworld\nabc\n"
        + struct.pack("<qq", 8, 16)
        + struct.pack("<qq8s8s", 2, 16, b"uint8", b"ROXXEL02")
    )
    assert open(path, "rb").read() == expected


def test_uint16_arrays_pad_last_block_with_separator(tmp_path):
    path = str(tmp_path / "b.rox")
    items = [np.arange(1, 6, dtype=np.uint16), np.array([10, 11, 12], np.uint16)]
    write_rox(items, path, separator=0xFFFF, block_size=8, manifest=False)
    raw = np.array([1, 2, 3, 4, 5, 0xFFFF, 10, 11, 12, 0xFFFF, 0xFFFF, 0xFFFF], "<u2").tobytes()
    expected = raw + struct.pack("<qqq", 8, 16, 24) + FOOTER.pack(3, 24, b"uint16", b"ROXXEL02")
    assert open(path, "rb").read() == expected


def test_byte_tokenizer_writes_uint16_with_eos_and_manifest(tmp_path):
    path = str(tmp_path / "t.rox")
    result = write_rox(["hi", "", "yo"], path, tokenizer="bytes", block_size=6)
    assert result.dtype == np.uint16
    assert (result.num_documents, result.num_tokens, result.num_padding_tokens) == (3, 7, 2)
    with open_rox(path) as corpus:
        assert corpus.tokens(0, 9).tolist() == [104, 105, 256, 256, 121, 111, 256, 256, 256]
        assert (corpus.eos_id, corpus.pad_id, corpus.num_documents) == (256, 256, 3)
        assert corpus.tokenizer == ByteTokenizer().identity()
    manifest = json.load(open(tmp_path / "t.manifest.json"))
    assert manifest["format"] == "grain_rox.manifest"
    assert manifest["pending"] is None and len(manifest["write_id"]) == 16
    assert manifest["shards"]["t.rox"]["mtime_ns"] == os.stat(path).st_mtime_ns
    shard = manifest["shards"]["t.rox"]
    assert shard["num_tokens"] == 9 and shard["num_padding_tokens"] == 2
    assert shard["num_documents"] == 3 and len(shard["sha256"]) == 64


class _WideVocab:
    """A real (if tiny) tokenizer with a large vocabulary: ids are code points + offset."""

    def __init__(self, vocab_size: int) -> None:
        self.name = f"wide{vocab_size}"
        self.vocab_size = vocab_size
        self.eos_id = vocab_size - 1
        self.pad_id = None

    def encode(self, text: str) -> np.ndarray:
        return np.array([self.vocab_size - 300 + (ord(c) % 200) for c in text], np.int64)

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def decode(self, ids):
        return "".join(chr(i - self.vocab_size + 300) for i in ids)

    def identity(self):
        return {"kind": "test", "name": self.name, "vocab_size": self.vocab_size}


@pytest.mark.parametrize(
    ("vocab", "dtype"),
    [(257, np.uint16), (50257, np.uint16), (65536, np.uint16), (65537, np.uint32)],
)
def test_dtype_fits_vocabulary_never_int16(tmp_path, vocab, dtype):
    tok = _WideVocab(vocab)
    path = str(tmp_path / "v.rox")
    result = write_rox(["abc", "de"], path, tokenizer=tok, block_size=64)
    assert result.dtype == dtype
    with open_rox(path) as corpus:
        got = corpus.tokens(0, 7).tolist()
    assert got == [*tok.encode("abc").tolist(), vocab - 1, *tok.encode("de").tolist(), vocab - 1]


def test_values_out_of_dtype_range_are_refused_not_relabelled(tmp_path):
    with pytest.raises(ValueError, match=r"item 1 holds values in \[0, 70000\].*uint16"):
        write_rox(
            [np.array([1], np.int32), np.array([0, 70000], np.int32)],
            str(tmp_path / "x.rox"),
            dtype="uint16",
        )
    with pytest.raises(TypeError, match="item 0 has dtype float32"):
        write_rox([np.array([1.5], np.float32)], str(tmp_path / "x.rox"), dtype="int32")
    assert not glob.glob(str(tmp_path / "*")) and not glob.glob(str(tmp_path / ".*"))


def test_later_items_are_converted_with_checks(tmp_path):
    path = str(tmp_path / "m.rox")
    write_rox([np.array([1, 2], np.int32), [3, 4], np.array([5], np.uint8)], path, block_size=8)
    with open_rox(path) as corpus:
        assert corpus.dtype == np.int32
        assert corpus.tokens(0, 6).tolist() == [1, 2, 3, 4, 5, 0]


U16 = [np.arange(3, dtype=np.uint16)]


@pytest.mark.parametrize(
    ("items", "kwargs", "error", "match"),
    [
        (["a"], {"separator": b"<|eos|>"}, ValueError, "exactly one token"),
        ([np.arange(3, dtype=np.uint16)], {"separator": b"\n"}, ValueError, "exactly one token"),
        ([np.arange(3, dtype=np.uint16)], {"separator": 70000}, ValueError, "do not fit uint16"),
        ([np.arange(3, dtype=np.uint16)], {"block_size": 9}, ValueError, "block_size=9 bytes"),
        ([np.arange(3, dtype=np.uint16)], {"block_size": 0}, ValueError, "block_size=0"),
        ([b"raw"], {"dtype": "uint16"}, TypeError, "item 0 is bytes"),
        ([3.5], {}, TypeError, "cannot infer a dtype"),
        ([{"a": 1}], {"dtype": "uint8"}, TypeError, "item 0 is a dict"),
        ([np.arange(3, dtype=np.complex64)], {}, ValueError, "cannot be stored"),
        ([], {}, ValueError, "nothing to write"),
        ([""], {}, ValueError, "nothing to write"),
        (["a"], {"if_exists": "replace"}, ValueError, "if_exists='replace'"),
        # each was written, then refused by every reader ("eos_id is True"), or a NumPy
        # TypeError / a 1 TiB MemoryError
        (U16, {"separator": True}, TypeError, "separator=True is a bool, not a token"),
        (U16, {"pad_id": True}, TypeError, "write_rox: pad_id=True is a bool, not a token"),
        (U16, {"pad_id": 2.5}, ValueError, "pad_id=2.5 is not a whole number"),
        (U16, {"block_size": True}, TypeError, "block_size=True is a bool, not an int"),
        (U16, {"block_size": 8.0}, TypeError, "block_size=8.0 is a float, not an int"),
        (U16, {"block_size": 2**40}, ValueError, "is over the 1024 MiB a block may hold"),
    ],
)
def test_bad_arguments_fail_before_anything_is_written(tmp_path, items, kwargs, error, match):
    with pytest.raises(error, match=match):
        write_rox(items, str(tmp_path / "x.rox"), **kwargs)
    assert os.listdir(tmp_path) == []


def test_a_numpy_pad_id_is_its_value(tmp_path):
    path = str(tmp_path / "p.rox")  # it was a TypeError from json: uint16 is not serializable
    write_rox([np.arange(1, 4, dtype=np.uint16)], path, pad_id=np.uint16(5), block_size=16)
    corpus = open_rox(path)
    assert corpus.pad_id == 5 and corpus.tokens(0, 8).tolist() == [1, 2, 3, 5, 5, 5, 5, 5]


def test_existing_path_is_an_error_by_default(tmp_path):
    path = str(tmp_path / "e.rox")
    write_rox(["a"], path, block_size=4)
    with pytest.raises(FileExistsError, match="if_exists='append'"):
        write_rox(["b"], path, block_size=4)
    write_rox(["bb"], path, block_size=4, if_exists="overwrite")
    with open_rox(path) as corpus:
        assert bytes(corpus.tokens(0, 4)) == b"bb\x00\x00"
        assert corpus.num_documents == 1


def test_single_file_append_is_copy_on_write(tmp_path):
    path = str(tmp_path / "s.rox")
    write_rox(["first doc"], path, separator=b"\n", block_size=8)
    before = open(path, "rb").read()
    old = open_rox(path)
    old_view = old[0]  # a live zero-copy view of the old file's map
    result = write_rox(["second"], path, separator=b"\n", block_size=8, if_exists="append")
    assert result.paths == (path,)
    assert bytes(old_view) == b"first do"  # the old inode was never written to
    with open_rox(path) as corpus:
        assert bytes(corpus.tokens(0, corpus.num_tokens)) == b"first doc\n\n\n\n\n\n\nsecond\n\n"
        assert [len(corpus[i]) for i in range(len(corpus))] == [8, 8, 8]
        assert corpus.uniform_blocks is True
        assert corpus.num_documents == 2
        corpus.verify()
    assert open(path, "rb").read()[:16] == before[:16]
    old.close()


def test_an_append_with_another_block_size_is_refused_and_changes_nothing(tmp_path):
    """roxxel reads every block of a set as its first block's size: a single file appended
    with another block size, or a set given shards of another, was written without a word and
    roxxel then served 43,008 of its 67,584 tokens (grain_rox read them all)."""
    single, sharded = str(tmp_path / "s.rox"), str(tmp_path / "c.rox")
    write_rox([np.arange(1, 40, dtype=np.uint16)], single, block_size=16, separator=0)
    write_rox([np.arange(1, 40, dtype=np.uint16)], sharded, block_size=16, max_shard_bytes=64)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    beside = str(tmp_path / "b.rox")  # a single file, and a member written beside it
    write_rox([np.arange(1, 40, dtype=np.uint16)], beside, block_size=16)
    cases = [
        (str(tmp_path / "b_0001.rox"), {}, beside),
        (single, {}, single),
        (sharded, {"max_shard_bytes": 64}, str(tmp_path / "c_0000.rox")),
        (str(tmp_path / "c_0001.rox"), {}, str(tmp_path / "c_0000.rox")),  # one member
    ]
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for path, kwargs, named in cases:
        with pytest.raises(ValueError) as e:
            write_rox([np.arange(3, dtype=np.uint16)], path, block_size=8, separator=0 if
                      path == single else None, if_exists="append" if kwargs or path == single
                      else "overwrite", **kwargs)  # fmt: skip
        assert str(e.value) == (
            f"cannot write block_size=8 into the set of {named}, whose blocks are 16 bytes: "
            "roxxel reads every block of a set as its first block's size, so a mix is "
            "misread; pass block_size=16 (grain-rox convert --block-size 16), or write to a "
            "new path"
        )
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_sharded_write_follows_roxxel_rotation_and_append_adds_shards(tmp_path):
    base = str(tmp_path / "c.rox")
    data = np.arange(100, dtype=np.uint16)
    # 16-byte blocks; M=100 -> floor((100-32)/(16+8)) = 2 blocks per shard.
    write_rox([data], base, block_size=16, max_shard_bytes=100, separator=0)
    names = sorted(os.listdir(tmp_path))
    assert names == ["c.manifest.json"] + [f"c_{i:04d}.rox" for i in range(7)]
    sizes = [os.path.getsize(tmp_path / f"c_{i:04d}.rox") for i in range(7)]
    assert sizes == [32 + 2 * 24] * 6 + [32 + 24]
    snapshot = {n: open(tmp_path / n, "rb").read() for n in names if n.endswith(".rox")}
    write_rox(
        [np.array([7, 7], np.uint16)],
        base,
        block_size=16,
        max_shard_bytes=100,
        separator=0,
        if_exists="append",
    )
    for name, content in snapshot.items():
        assert open(tmp_path / name, "rb").read() == content
    with open_rox(base) as corpus:
        assert corpus.paths[-1].endswith("c_0007.rox")
        tokens = corpus.tokens(0, corpus.num_tokens)
        assert tokens[:100].tolist() == list(range(100))
        assert tokens[104:108].tolist() == [7, 7, 0, 0]
        # arange(100) starts with the separator 0: a document ends there too
        assert corpus.num_documents == 3


def test_block_larger_than_max_shard_bytes_gets_one_shard_each(tmp_path):
    write_rox([b"x" * 300], str(tmp_path / "big.rox"), block_size=128, max_shard_bytes=100)
    sizes = sorted(os.path.getsize(p) for p in glob.glob(str(tmp_path / "big_*.rox")))
    assert sizes == [168, 168, 168]


def test_generator_failure_leaves_existing_data_and_no_temp_files(tmp_path):
    path = str(tmp_path / "g.rox")
    write_rox(["keep me"], path, block_size=4)
    before = open(path, "rb").read()
    manifest_before = open(tmp_path / "g.manifest.json").read()

    def failing():
        yield "more"
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        write_rox(failing(), path, block_size=4, if_exists="append")
    assert open(path, "rb").read() == before
    assert open(tmp_path / "g.manifest.json").read() == manifest_before
    assert sorted(os.listdir(tmp_path)) == ["g.manifest.json", "g.rox"]


def test_pending_write_that_finished_its_renames_is_accepted(tmp_path):
    """A writer killed after its renames, before its final manifest: the new set is in place."""
    import dataclasses

    from grain_rox._format._manifest import load_manifest, write_manifest

    base = str(tmp_path / "q.rox")
    write_rox([np.arange(64, dtype=np.uint16)], base, block_size=16, max_shard_bytes=100)
    mpath = str(tmp_path / "q.manifest.json")
    final = load_manifest(mpath)
    assert final is not None
    before = dataclasses.replace(final, shards={}, write_id=None)  # nothing was there before
    write_manifest(mpath, dataclasses.replace(before, pending=final))
    with open_rox(base, verify=True) as corpus:
        assert corpus.tokens(0, 64).tolist() == list(range(64))
        assert corpus.num_documents == 1


def test_manifest_false_removes_a_manifest_that_would_be_stale(tmp_path):
    path = str(tmp_path / "n.rox")
    write_rox(["abc"], path, block_size=4)
    write_rox(["abcdef"], path, block_size=4, if_exists="overwrite", manifest=False)
    assert not os.path.exists(tmp_path / "n.manifest.json")
    with open_rox(path) as corpus:
        assert corpus.eos_id is None and corpus.num_documents is None


def test_append_with_other_tokenizer_settings_is_refused(tmp_path):
    path = str(tmp_path / "k.rox")
    write_rox(["abc"], path, tokenizer="bytes", block_size=8)
    with pytest.raises(ValueError, match=r"eos/separator 256 != 0"):
        write_rox([np.array([1], np.uint16)], path, separator=0, block_size=8, if_exists="append")


def test_append_with_another_pad_id_is_refused_so_padding_is_never_read_as_text(tmp_path):
    """The set's padding is found by its one pad id: an append that pads with another one
    recorded none of the first write's padding and served its tokens as text."""
    from grain_rox._format._served import served_stretches

    path = str(tmp_path / "p.rox")
    write_rox([np.array([1, 2, 3], np.uint16)], path, separator=0, pad_id=5, block_size=16)
    with pytest.raises(ValueError, match=r"pad_id 5 != 9 \(pass pad_id=5\)"):
        write_rox([np.array([4, 6], np.uint16)], path, separator=0, pad_id=9, block_size=16,
                  if_exists="append")  # fmt: skip
    with pytest.raises(ValueError, match=r"pad_id 5 != 0 \(pass pad_id=5\)"):  # the default
        write_rox([np.array([4, 6], np.uint16)], path, separator=0, block_size=16,
                  if_exists="append")  # fmt: skip
    write_rox([np.array([4, 6], np.uint16)], path, separator=0, pad_id=5, block_size=16,
              if_exists="append")  # fmt: skip
    with open_rox(path) as corpus:
        tokens = corpus.tokens(0, corpus.num_tokens)
        served = [tokens[a:b].tolist() for a, b in served_stretches(corpus)[0]]
    assert tokens.tolist() == [1, 2, 3, 0, 5, 5, 5, 5, 4, 6, 0, 5, 5, 5, 5, 5]
    assert served == [[1, 2, 3, 0], [4, 6, 0]]


def test_recorded_padding_that_is_not_the_pad_id_is_served_and_said(tmp_path, caplog):
    """A manifest (unsealed: an older grain_rox's, or edited) recording padding over tokens
    that are not its pad id: they were served as text without a word."""
    from _corpora import unsealed

    from grain_rox._format._served import served_stretches

    path = str(tmp_path / "p.rox")
    write_rox([np.array([1, 2, 3], np.uint16)], path, separator=0, pad_id=5, block_size=16)
    write_rox([np.array([4, 6], np.uint16)], path, separator=0, pad_id=5, block_size=16,
              if_exists="append")  # fmt: skip
    mpath = tmp_path / "p.manifest.json"
    manifest = unsealed(json.loads(mpath.read_text()))
    manifest["shards"]["p.rox"]["padding_spans"] = [[2, 4]]  # over [3, 0, 5, 5]
    mpath.write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger="grain_rox"), open_rox(path) as corpus:
        served = served_stretches(corpus)
    assert served == [[(0, 11)]]  # the shard's tokens, as they are, but its trailing padding
    assert (
        f"{path}: its manifest records block padding at tokens [2, 6), but they are not all its "
        "pad id 5: served as text" in caplog.text
    )


def test_a_float_pad_or_eos_given_another_way_is_the_same_token(tmp_path):
    """0.1 and np.float16(0.1) are one float16 token; the append check compared the Python
    numbers (0.1 != 0.0999755859375) and refused an append with the set's own pad and EOS."""
    path = str(tmp_path / "f.rox")
    first = np.array([1.5, 2.5], np.float16)
    write_rox([first], path, dtype=np.float16, pad_id=0.1, separator=0.3)
    write_rox([np.array([3.5], np.float16)], path, dtype=np.float16, pad_id=np.float16(0.1),
              separator=np.float16(0.3), if_exists="append")  # fmt: skip
    write_rox([np.array([4.5], np.float16)], path, dtype=np.float16, pad_id=0.1, separator=0.3,
              if_exists="append")  # fmt: skip
    with pytest.raises(ValueError, match=r"pad_id 0\.(1|0999755859375) != 0\.2"):
        write_rox([np.array([5.5], np.float16)], path, dtype=np.float16, pad_id=0.2,
                  separator=0.3, if_exists="append")  # fmt: skip


def test_sharded_write_named_like_a_member_is_refused_and_deletes_nothing(tmp_path):
    """``x_0003.rox`` with max_shard_bytes= would make the set x_0003, whose names cover
    x_0003.rox, a member of the set x: an overwrite would delete it."""
    write_rox([np.full(8, 1, np.uint16)], tmp_path / "x_0000.rox", block_size=16)
    write_rox([np.full(8, 2, np.uint16)], tmp_path / "x_0003.rox", block_size=16)
    before = sorted(os.listdir(tmp_path))
    for mode in ("error", "overwrite", "append"):
        with pytest.raises(ValueError) as info:
            write_rox(
                [np.full(8, 5, np.uint16)] * 4,
                tmp_path / "x_0003.rox",
                max_shard_bytes=100,
                block_size=16,
                if_exists=mode,
            )
        assert str(info.value) == (
            f"the output path '{tmp_path}/x_0003.rox' ends in a shard number (_NNNN) but "
            f"max_shard_bytes= writes a shard set named after it ({tmp_path}/x_0003_NNNN.rox), "
            f"whose names overlap the set {tmp_path}/x.rox; choose a base name without a shard "
            f"number, e.g. '{tmp_path}/x-0003.rox'"
        )
    assert sorted(os.listdir(tmp_path)) == before
    assert open_rox(str(tmp_path / "x.rox")).tokens(0, 16).tolist() == [1] * 8 + [2] * 8


def test_text_is_encoded_in_batches_ahead_yet_lands_in_item_order(tmp_path, monkeypatch):
    """write_rox encodes str items in batches on a thread; token arrays given between them keep
    their places, and an error still names the item's index in the input."""
    from grain_rox._text._tokenize_ahead import tokenize_in_order

    monkeypatch.setattr(
        "grain_rox._text._rox_writer.tokenize_in_order",
        lambda items, tok: tokenize_in_order(items, tok, chunk_chars=7),
    )
    calls: list[int] = []
    tok = ByteTokenizer()
    encode_batch = tok.encode_batch
    monkeypatch.setattr(
        tok, "encode_batch", lambda docs: calls.append(len(docs)) or encode_batch(docs)
    )
    items = ["abc", "defgh", np.array([1, 2], np.uint16), "ij", "klmnopq", "r", [3]]
    result = write_rox(items, tmp_path / "a.rox", tokenizer=tok)
    expected: list[int] = []
    for item in items:
        ids = tok.encode(item).tolist() if isinstance(item, str) else list(np.asarray(item))
        expected += [*ids, tok.eos_id]
    with open_rox(tmp_path / "a.rox") as corpus:
        assert corpus.tokens(0, result.num_tokens).tolist() == expected
    assert calls == [2, 2, 1]  # runs of text, cut at 7 characters and at each token array
    with pytest.raises(ValueError, match="item 2 holds token id 300"):
        write_rox(["ab", "c", [300]], tmp_path / "b.rox", tokenizer=tok)


def test_a_token_array_holding_the_separator_is_counted_and_logged(tmp_path, caplog):
    """Readers see a document end at every separator, also one inside an item's array: the
    manifest counts those documents (it said 2 where RoxDocumentSource read 3), and the
    first such item is logged once, naming it and the fix."""
    import logging

    from grain_rox import RoxDocumentSource, open_rox

    path = str(tmp_path / "eos.rox")
    items = [
        np.array([5, 0, 6], np.uint16),
        np.array([7], np.uint16),
        np.array([8, 0, 9], np.uint16),
    ]
    with caplog.at_level(logging.WARNING, logger="grain_rox"):
        written = write_rox(items, path, separator=0)
    corpus = open_rox(path)
    assert corpus.tokens(0, 10).tolist() == [5, 0, 6, 0, 7, 0, 8, 0, 9, 0]
    assert written.num_documents == corpus.num_documents == 5
    assert len(RoxDocumentSource(path, seq_len=8)) == 5
    logged = [r.getMessage() for r in caplog.records if "separator (EOS) id" in r.getMessage()]
    assert logged == [
        "item 0 holds the separator (EOS) id 0 1 time(s): readers see a document end at each, "
        "and the manifest counts them as documents. Drop it from the items, or pass "
        "separator=None if they carry their own"
    ]


def test_separators_inside_items_count_where_their_documents_start(tmp_path):
    """Raw text holding its separator byte counts those documents too (readers see them), and
    each counts in the shard where it starts, not where its item began."""
    from grain_rox import RoxDocumentSource

    lines = str(tmp_path / "lines.rox")
    write_rox(["one\ntwo", "three"], lines, separator=b"\n")
    assert open_rox(lines).num_documents == len(RoxDocumentSource(lines, seq_len=8)) == 3
    spread = str(tmp_path / "spread.rox")
    doc = np.tile(np.array([1, 2, 3, 4, 5, 6, 7, 0], np.uint16), 5)[:-1]  # 4 EOS inside
    write_rox([doc, np.array([9], np.uint16)], spread, separator=0, block_size=16,
              max_shard_bytes=80)  # fmt: skip
    records = json.loads((tmp_path / "spread.manifest.json").read_text())["shards"]
    with open_rox(spread) as corpus:
        tokens = corpus.tokens(0, corpus.num_tokens)
        per_shard = [s.num_tokens for s in corpus.shards]
    starts = np.r_[0, np.flatnonzero(tokens == 0)[:-1] + 1]  # each document's first token
    starts = starts[starts < 42]  # documents, not the padding after the last
    expected = np.bincount(np.searchsorted(np.cumsum(per_shard), starts, side="right"),
                           minlength=len(per_shard))  # fmt: skip
    assert [r["num_documents"] for r in records.values()] == expected.tolist()
    assert sum(expected) == 6


def test_an_append_with_another_tokenizer_names_both_by_name_and_checksum(tmp_path):
    """Two tokenizer.json files in folders of one name were refused as "tokenizer hf:tok !=
    hf:tok"; a pad id that follows the tokenizer was told to be passed (the CLI has no flag)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    def tokenizer_json(where, vocab):
        lib = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        lib.pre_tokenizer = pre_tokenizers.Whitespace()
        lib.add_special_tokens(["</s>"])
        (tmp_path / where / "tok").mkdir(parents=True)
        lib.save(str(tmp_path / where / "tok" / "tokenizer.json"))
        return str(tmp_path / where / "tok")

    one = tokenizer_json("v1", {"[UNK]": 0, "</s>": 1, "hello": 2})
    two = tokenizer_json("v2", {"[UNK]": 0, "</s>": 1, "hello": 3})
    path = str(tmp_path / "t.rox")
    write_rox(["hello"], path, tokenizer=one)
    with pytest.raises(ValueError) as info:
        write_rox(["hello"], path, tokenizer=two, if_exists="append")
    assert re.search(
        r": tokenizer 'hf:tok' sha256 (\w{12}) != tokenizer 'hf:tok' sha256 (?!\1)\w{12}\. Write ",
        str(info.value),
    ), info.value
    bytes_set = str(tmp_path / "b.rox")
    write_rox(["hello"], bytes_set, tokenizer="bytes")
    with pytest.raises(ValueError) as info:
        write_rox(["hello"], bytes_set, tokenizer=one, if_exists="append")
    assert re.search(
        r": dtype uint16 != uint8; eos/separator 256 != 1; pad_id 256 != 1; tokenizer 'bytes' != "
        r"tokenizer 'hf:tok' "
        r"sha256 \w{12}\. Write to a new path",
        str(info.value),
    ), str(info.value)


def test_writer_errors_name_the_item_kind_and_the_dtype_that_fits(tmp_path):
    """Text without a tokenizer into uint16 was called bytes; an int64 overflow suggested uint32;
    dtype='bfloat16' worked only once something had imported ml_dtypes."""
    with pytest.raises(TypeError, match=r"^item 0 is text \(str\) but the shard dtype is uint16 "
                       r"and no tokenizer= is given; pass tokenizer="):  # fmt: skip
        write_rox(["hi"], str(tmp_path / "s.rox"), dtype="uint16")
    with pytest.raises(ValueError, match=re.escape(
        "item 0 holds values in [9223372036854775809, 9223372036854775809] that do not fit "
        "int64 [-9223372036854775808, 9223372036854775807]; pass dtype='uint64', or check"
    )):  # fmt: skip
        write_rox([np.array([2**63 + 1], np.uint64)], str(tmp_path / "c.rox"), dtype="int64")
    with pytest.raises(ValueError, match=r"that do not fit uint16 \[0, 65535\]; pass "
                       r"dtype='int32', or check"):  # fmt: skip
        write_rox([np.array([-1, 70000])], str(tmp_path / "d.rox"), dtype="uint16")
    import subprocess
    import sys

    code = (  # a fresh interpreter: nothing has imported ml_dtypes
        "import sys, numpy as np; from grain_rox import write_rox, open_rox; "
        "assert 'ml_dtypes' not in sys.modules; "
        f"write_rox([np.array([1.5, 2.25], np.float32)], {str(tmp_path / 'b.rox')!r}, "
        "dtype='bfloat16', block_size=4); "
        f"print(open_rox({str(tmp_path / 'b.rox')!r}).tokens(0, 2).astype(np.float32).tolist())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.stdout == "[1.5, 2.25]\n", done.stderr


def test_integer_ids_that_a_float_dtype_would_round_are_refused(tmp_path):
    """70001 as bfloat16 was stored as 70144, another id, silently."""
    path = str(tmp_path / "f.rox")
    with pytest.raises(ValueError, match=r"^item 0 holds integers that bfloat16 cannot store "
                       r"exactly \(70001 would be stored as 70144\); pass an integer dtype"):  # fmt: skip
        write_rox([[1, 70001]], path, dtype="bfloat16")
    write_rox([[1, 256]], path, dtype="bfloat16")  # exact: written
    write_rox([[1, 70001]], path, dtype="float32", if_exists="overwrite")
    assert open_rox(path).tokens(0, 2).tolist() == [1.0, 70001.0]
