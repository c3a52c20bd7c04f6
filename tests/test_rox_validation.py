"""Every way a `.rox` shard set can be broken gives the right error, naming the file and problem.

Shards are built by hand (``make_shard``) so each test controls every byte: raw blocks from
byte 0, then one int64 LE end offset per block, then the 32-byte footer
``struct "<qq8s8s"`` = (num_blocks, raw_size, dtype name NUL-padded, b"ROXXEL02").
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from _corpora import unsealed
from _threads import run_released_together
from shard_bytes import make_shard

from grain_rox import RoxCorpus, RoxDocumentSource, RoxFormatError, open_rox, write_rox
from grain_rox._format._verify import verify_rox

FOOTER = struct.Struct("<qq8s8s")
SIGNATURE = b"ROXXEL02"


def u16(*values: int) -> bytes:
    return np.asarray(values, dtype="<u2").tobytes()


@pytest.fixture
def shard_file(tmp_path: Path):
    """Write shard bytes to ``tmp_path/<name>`` and return the path as a str."""

    def write(data: bytes, name: str = "shard.rox") -> str:
        path = tmp_path / name
        path.write_bytes(data)
        return str(path)

    return write


def assert_open_fails(path: str, phrase: str, *, error_path: str | None = None) -> RoxFormatError:
    """Open ``path``; assert a RoxFormatError naming ``error_path`` (default ``path``) and
    containing ``phrase``, with the "<path>: <problem>. Fix: <fix>." message layout."""
    error_path = path if error_path is None else error_path
    with pytest.raises(RoxFormatError, match=re.escape(phrase)) as info:
        open_rox(path)
    assert_well_formed(info.value, error_path)
    return info.value


def assert_well_formed(err: RoxFormatError, path: str) -> None:
    assert isinstance(err, ValueError)
    assert err.path == path
    assert err.problem
    assert err.fix
    assert str(err) == f"{path}: {err.problem}. Fix: {err.fix}."


# ---- footer and size ---------------------------------------------------------------------------
GOOD = make_shard([b"abcdefgh", b"ijklmnop"])  # 2 blocks, raw 16, file 16 + 16 + 32 = 64 bytes


def test_good_shard_opens(shard_file):
    path = shard_file(GOOD)
    with open_rox(path) as corpus:
        assert len(corpus) == 2
        assert corpus.num_tokens == 16
        assert corpus.dtype == np.uint8
        assert corpus.block_size == 8
        assert bytes(corpus[1]) == b"ijklmnop"
        assert bytes(corpus.tokens(0, 16)) == b"abcdefghijklmnop"


def test_zero_byte_file(shard_file):
    path = shard_file(b"")
    assert_open_fails(path, "the file is empty (0 bytes), smaller than the 32-byte ROXXEL02 footer")


def test_eight_byte_file(shard_file):
    path = shard_file(SIGNATURE)
    assert_open_fails(path, "the file is only 8 bytes, smaller than the 32-byte ROXXEL02 footer")


def test_tail_truncated_by_five_bytes(shard_file):
    data = GOOD[:-5]
    path = shard_file(data)
    err = assert_open_fails(path, "not the ROXXEL02 signature")
    assert f"the last 8 bytes are {data[-8:]!r}" in err.problem


def test_trailing_garbage_after_footer(shard_file):
    path = shard_file(GOOD + b"junk")
    assert_open_fails(path, "the last 8 bytes are b'EL02junk', not the ROXXEL02 signature")


def test_roxxel01_signature(shard_file):
    path = shard_file(make_shard([b"abcdefgh"], signature=b"ROXXEL01"))
    assert_open_fails(path, "the last 8 bytes are b'ROXXEL01', not the ROXXEL02 signature")


def test_data_region_truncated_with_footer_intact(shard_file):
    path = shard_file(GOOD[4:])  # 4 data bytes lost: 60 bytes on disk, footer says 64
    assert_open_fails(
        path,
        "the file is 60 bytes but its footer (2 block(s), 16 raw bytes) implies "
        "raw + 8*N + 32 = 64 bytes (truncated or damaged)",
    )


def test_raw_size_too_big(shard_file):
    path = shard_file(make_shard([b"abcdefgh", b"ijklmnop"], raw_size=1000))
    assert_open_fails(
        path, "the file is 64 bytes but its footer (2 block(s), 1000 raw bytes) implies raw + 8*N"
    )


def test_num_blocks_one_million(shard_file):
    path = shard_file(make_shard([b"abcdefgh", b"ijklmnop"], num_blocks=10**6))
    assert_open_fails(
        path,
        "the file is 64 bytes but its footer (1000000 block(s), 16 raw bytes) implies "
        "raw + 8*N + 32 = 8000048 bytes",
    )


def test_num_blocks_negative(shard_file):
    path = shard_file(make_shard([b"abcdefgh", b"ijklmnop"], num_blocks=-1))
    assert_open_fails(path, "the footer says -1 blocks and 16 raw bytes; both must be >= 0")


def test_raw_size_negative(shard_file):
    path = shard_file(make_shard([b"abcdefgh", b"ijklmnop"], raw_size=-8))
    assert_open_fails(path, "the footer says 2 blocks and -8 raw bytes; both must be >= 0")


def test_zero_blocks_but_raw_bytes(shard_file):
    # Sizes agree (8 raw + 0 index + 32 = 40 bytes) so only the blocks/raw rule can catch it.
    path = shard_file(make_shard([b"abcdefgh"], ends=[]))
    assert os.path.getsize(path) == 40
    assert_open_fails(path, "the footer says 0 blocks but 8 raw bytes")


def test_blocks_but_zero_raw_bytes(shard_file):
    path = shard_file(make_shard([], ends=[0]))
    assert_open_fails(path, "the footer says 1 blocks but 0 raw bytes")


def test_valid_empty_shard_opens_with_len_zero(shard_file):
    path = shard_file(make_shard([]))
    assert os.path.getsize(path) == 32
    with open_rox(path) as corpus:
        assert len(corpus) == 0
        assert corpus.num_tokens == 0
        assert corpus.dtype == np.uint8
        assert corpus.uniform_blocks is True
        corpus.verify()
        with pytest.raises(IndexError, match=re.escape("block index 0 is out of range for 0")):
            corpus[0]


def test_block_size_comes_from_the_first_shard_with_blocks(shard_file):
    """An empty first shard made the corpus report (and `inspect` print) a block size of 0."""
    shard_file(make_shard([], "uint16"), "a.rox")
    full = shard_file(make_shard([u16(1, 2, 3, 4), u16(5, 6, 7, 8)], "uint16"), "b.rox")
    with open_rox(os.path.join(os.path.dirname(full), "*.rox")) as corpus:
        assert (corpus.block_size, corpus.block_tokens, corpus.num_tokens) == (8, 4, 8)
        assert corpus.uniform_blocks is True


def test_tokens_empty_range_at_end_of_empty_shard(shard_file):
    with open_rox(shard_file(make_shard([]))) as corpus:
        assert corpus.tokens(0, 0).shape == (0,)


def test_tokens_empty_range_at_end_of_stream(shard_file):
    with open_rox(shard_file(GOOD)) as corpus:
        assert corpus.tokens(16, 16).shape == (0,)


def test_tokens_empty_range_inside_stream(shard_file):
    with open_rox(shard_file(GOOD)) as corpus:
        assert corpus.tokens(0, 0).shape == (0,)
        assert corpus.tokens(8, 8).shape == (0,)
        with pytest.raises(IndexError, match=re.escape("token range [0, 17) is outside [0, 16]")):
            corpus.tokens(0, 17)


# ---- dtype field -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field",
    [b"\xffint16\x00\x00", "µint8".encode().ljust(8, b"\x00")],
    ids=["non-utf8", "utf8-non-ascii"],
)
def test_dtype_field_not_ascii(shard_file, field):
    path = shard_file(make_shard([b"abcdefgh"], dtype_field=field))
    assert_open_fails(path, f"the footer's dtype field {field!r} is not an ASCII dtype name")


def test_unknown_dtype_name(shard_file):
    path = shard_file(make_shard([b"abcdefgh"], dtype="foo"))
    err = assert_open_fails(path, "the footer's dtype 'foo' is not a numpy dtype")
    assert "truncates" not in err.problem  # a short name was not cut from a longer one


def test_truncated_complex64_dtype(shard_file):
    path = shard_file(make_shard([b"abcdefgh"], dtype="complex6"))
    err = assert_open_fails(path, "the footer's dtype 'complex6' is not a numpy dtype")
    assert "'complex64' -> 'complex6'" in err.problem


@pytest.mark.parametrize("name", ["bool", "S8", "M8", "c8"])
def test_non_numeric_dtype(shard_file, name):
    path = shard_file(make_shard([b"abcdefgh"], dtype=name))
    assert_open_fails(path, f"the footer's dtype {name!r} (")


@pytest.mark.parametrize("name", ["3et<", "|,289z"])
def test_dtype_name_numpy_cannot_parse(shard_file, name):
    path = shard_file(make_shard([b"abcdefgh"], dtype=name))
    assert_open_fails(path, f"the footer's dtype {name!r} is not a numpy dtype")


def test_big_endian_dtype_keeps_byte_order(shard_file):
    path = shard_file(make_shard([np.arange(4, dtype=">u2").tobytes()], dtype=">u2"))
    with open_rox(path) as corpus:
        assert corpus.dtype == np.dtype(">u2")
        assert corpus.tokens(0, 4).tolist() == [0, 1, 2, 3]


# ---- index -------------------------------------------------------------------------------------
FOUR_BLOCKS = [b"aaaa", b"bbbb", b"cccc", b"dddd"]


def test_non_monotonic_index_caught_at_open(shard_file):
    path = shard_file(make_shard(FOUR_BLOCKS, ends=[4, 12, 8, 16]))  # entries 1 and 2 swapped
    assert_open_fails(
        path,
        "block 2 ends at offset 8 after the previous block ended at 12: the index must "
        "increase by whole uint8 tokens (1 bytes)",
    )


def test_index_entry_beyond_raw(shard_file):
    path = shard_file(make_shard(FOUR_BLOCKS, ends=[4, 100, 12, 16]))
    assert_open_fails(path, "block 1's end offset 100 lies outside the 16-byte raw region")


def test_damaged_index_of_huge_corpus_caught_on_first_read_and_by_verify(shard_file, monkeypatch):
    # Past FULL_INDEX_CHECK_LIMIT entries an index is walked when its shard is first mapped.
    monkeypatch.setattr("grain_rox._format._rox_corpus.FULL_INDEX_CHECK_LIMIT", 0)
    path = shard_file(make_shard(FOUR_BLOCKS, ends=[4, 100, 12, 16]))
    expected = "block 1's end offset 100 lies outside the 16-byte raw region"
    with open_rox(path) as corpus:
        assert corpus.uniform_blocks is None
        assert len(corpus) == 4
        with pytest.raises(RoxFormatError, match=re.escape(expected)) as info:
            corpus[0]
        assert_well_formed(info.value, path)
        with pytest.raises(RoxFormatError, match=re.escape(expected)):
            corpus.tokens(0, 4)
        with pytest.raises(RoxFormatError, match=re.escape(expected)):
            corpus.verify(checksums=False)


def test_first_index_entry_beyond_raw(shard_file):
    path = shard_file(make_shard(FOUR_BLOCKS, ends=[100, 8, 12, 16]))
    assert_open_fails(
        path,
        "the block index is inconsistent: first end offset 100, last 16, raw size 16 "
        "(need 0 < first <= last == raw size)",
    )


def test_first_index_entry_zero(shard_file):
    path = shard_file(make_shard(FOUR_BLOCKS, ends=[0, 8, 12, 16]))
    assert_open_fails(
        path,
        "block 0 is empty (its end offset is 0) though 16 raw bytes follow: the block index is "
        "damaged",
    )


def test_an_empty_block_with_data_after_it_is_a_damaged_index_not_roxxels_empty_tail(
    shard_file,
):
    """Only empty blocks up to the end are roxxel's write(block_size=0); one in the middle is
    a damaged index, and the error must not send the user to re-write with a block size."""
    path = shard_file(make_shard(FOUR_BLOCKS, ends=[4, 8, 8, 16]))
    message = str(
        assert_open_fails(path, "block 2 ends at offset 8 after the previous block ended at 8")
    )
    assert "block 2 ends at offset 8 after the previous block ended at 8" in message, message
    assert "an empty block with data after it: the index is damaged" in message, message
    assert "block_size=0" not in message, message


def test_index_not_ending_at_raw_size(shard_file):
    path = shard_file(make_shard(FOUR_BLOCKS, ends=[4, 8, 12, 14]))
    assert_open_fails(
        path, "the block index is inconsistent: first end offset 4, last 14, raw size 16"
    )


def test_first_block_not_whole_tokens(shard_file):
    # uint16 written with block_size=9 (roxxel allows it and garbles tokens): caught at open.
    raw = u16(*range(1, 10))
    path = shard_file(make_shard([raw[:9], raw[9:]], dtype="uint16"))
    assert_open_fails(
        path, "the block size 9 bytes is not a multiple of the uint16 token size (2 bytes)"
    )


def test_raw_region_not_whole_tokens(shard_file):
    path = shard_file(make_shard([b"\x01\x00\x02\x00\x03"], dtype="uint16"))
    assert_open_fails(
        path, "the raw region (5 bytes) is not a whole number of uint16 tokens (2 bytes each)"
    )


def test_middle_block_not_whole_tokens(shard_file):
    raw = u16(1, 2, 3, 4, 5, 6)
    path = shard_file(make_shard([raw], dtype="uint16", ends=[4, 7, 12]))
    assert_open_fails(
        path,
        "block 1 ends at offset 7 after the previous block ended at 4: the index must "
        "increase by whole uint16 tokens (2 bytes)",
    )


def test_non_uniform_blocks_are_valid(shard_file):
    # An append with another block size (roxxel allows it) gives a valid, non-uniform index.
    path = shard_file(make_shard([u16(1, 2, 3, 4), u16(5, 6), u16(7, 8)], dtype="uint16"))
    with open_rox(path) as corpus:
        assert corpus.uniform_blocks is False
        assert corpus.block_size == 8
        assert [corpus[i].tolist() for i in range(3)] == [[1, 2, 3, 4], [5, 6], [7, 8]]


def test_shards_with_different_dtypes(tmp_path):
    first = tmp_path / "set_0000.rox"
    second = tmp_path / "set_0001.rox"
    first.write_bytes(make_shard([b"abcd"], dtype="uint8"))
    second.write_bytes(make_shard([u16(1, 2)], dtype="uint16"))
    with pytest.raises(RoxFormatError, match="one corpus holds one token dtype") as info:
        open_rox(str(tmp_path))
    err = info.value
    assert_well_formed(err, str(second))
    assert err.problem == (
        f"its dtype is uint16 but {first} (the corpus's first shard) is uint8; "
        "one corpus holds one token dtype"
    )


# ---- manifest ----------------------------------------------------------------------------------
@pytest.fixture
def written(tmp_path: Path) -> tuple[str, str]:
    """A write_rox shard with its manifest; returns (shard path, manifest path)."""
    path = str(tmp_path / "train.rox")
    result = write_rox([np.arange(40, dtype=np.uint16)], path, block_size=16)
    assert result.manifest_path == str(tmp_path / "train.manifest.json")
    return path, result.manifest_path


def test_manifest_is_read(written):
    path, manifest_path = written
    with open_rox(path, verify=True) as corpus:
        assert corpus.manifest_paths == (manifest_path,)
        assert corpus.shards[0].sha256 == hashlib.sha256(Path(path).read_bytes()).hexdigest()
        corpus.verify()


def test_manifest_sha256_mismatch(written):
    path, manifest_path = written
    data = bytearray(Path(path).read_bytes())
    data[2] ^= 0xFF  # token 1 of block 0; same size, so the cheap checks at open still pass
    Path(path).write_bytes(bytes(data))
    recorded = json.loads(Path(manifest_path).read_text())["shards"]["train.rox"]["sha256"]
    actual = hashlib.sha256(bytes(data)).hexdigest()
    phrase = f"sha256 is {actual} but the manifest records {recorded}"

    with open_rox(path) as corpus:
        assert corpus[0][1] == 1 ^ 0xFF
        corpus.verify(checksums=False)
        with pytest.raises(RoxFormatError, match=re.escape(phrase)) as info:
            corpus.verify()
        assert_well_formed(info.value, path)

    with pytest.raises(RoxFormatError, match=re.escape(phrase)) as info:
        open_rox(path, verify=True)
    assert_well_formed(info.value, path)


def test_stale_manifest(written):
    path, manifest_path = written
    Path(path).write_bytes(make_shard([u16(1, 2, 3, 4)], dtype="uint16"))  # rewritten by hand
    err = assert_open_fails(
        path,
        f"the manifest {manifest_path} records (file size, blocks, raw bytes) = (152, 5, 80) "
        "but the shard has (48, 1, 8): the shard changed after the manifest was written",
    )
    assert "delete the stale manifest" in err.fix


def test_an_edited_manifest_is_refused_by_its_checksum_and_an_older_one_is_read(written):
    """A manifest records a checksum of its content: an edit that keeps it valid JSON (an EOS
    id changed, which would change every segment id served) is refused, naming the file; a
    manifest from before checksums were recorded is read as before."""
    path, manifest_path = written
    text = Path(manifest_path).read_text()
    data = json.loads(text)
    assert data["checksum"].startswith("sha256:")
    data["eos_id"] = 5
    Path(manifest_path).write_text(json.dumps(data))
    err = assert_open_fails(path, "the manifest was edited or damaged after it was written: "
                                  f"its checksum {data['checksum']!r} is not that of its content",
                            error_path=manifest_path)  # fmt: skip
    assert "delete the manifest to read the shards without its extras" in err.fix
    [report] = verify_rox(path)
    assert not report.ok and "edited or damaged" in (report.problem or "")
    older = unsealed(json.loads(text))
    Path(manifest_path).write_text(json.dumps(older))
    with open_rox(path) as corpus:
        assert corpus.eos_id == json.loads(text)["eos_id"]


def test_a_sealed_manifest_whose_checksum_was_removed_is_refused(written):
    """Deleting the checksum made an edit pass as a manifest from before the seal: every
    manifest now says it was sealed, and one that says so without its checksum is refused,
    by open_rox and verify alike."""
    path, manifest_path = written
    data = json.loads(Path(manifest_path).read_text())
    assert data["sealed"] is True and data["checksum"].startswith("sha256:")
    data["eos_id"] = 5
    del data["checksum"]
    Path(manifest_path).write_text(json.dumps(data))
    err = assert_open_fails(path, "its checksum is missing", error_path=manifest_path)
    assert err.problem == (
        'its checksum is missing, but it says it was sealed ("sealed": true, as grain_rox '
        "writes every manifest): the seal was removed, and an edit of its facts (EOS id, "
        "counts, checksums of the shards) would pass unseen"
    )
    assert err.fix == (
        "restore the manifest from a copy of the set (grain-rox verify then checks the shards "
        "against it) or re-create the shard set with grain-rox; to read the shards without "
        "its extras, delete the manifest"
    )
    [report] = verify_rox(path)
    assert not report.ok and "its checksum is missing" in (report.problem or "")
    data["checksum"] = None  # a checksum of any value is checked
    Path(manifest_path).write_text(json.dumps(data))
    assert_open_fails(
        path, "its checksum None is not that of its content", error_path=manifest_path
    )


def test_manifest_dtype_disagrees_with_footer(written):
    path, manifest_path = written
    data = json.loads(Path(manifest_path).read_text())
    data["dtype"] = "int32"
    Path(manifest_path).write_text(json.dumps(unsealed(data)))
    message = f"the manifest {manifest_path} says dtype int32 but the shard's footer says uint16"
    assert_open_fails(path, message)
    # verify_rox reports what open_rox refuses: it never says OK about a set that won't open.
    [report] = verify_rox(path)
    assert not report.ok
    assert (
        report.problem == f"{message}. Fix: delete the stale manifest or re-create the shard set."
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(num_documents=-3), "num_documents is -3, not a count"),
        (lambda d: d.update(block_size="4096"), "block_size is '4096', not a count"),
        (lambda d: d.update(eos_id="0"), "eos_id is '0', not a token id"),
        (lambda d: d["shards"]["train.rox"].update(num_tokens=-1), "num_tokens is -1, not a"),
        (
            lambda d: d["shards"]["train.rox"].update(num_padding_tokens=1.5),
            "padding_tokens is 1.5",
        ),
        (lambda d: d["shards"].update({"train.rox": 7}), "the record of 'train.rox' is 7, not a"),
    ],
)
def test_a_manifest_with_impossible_counts_is_refused_not_believed(written, edit, message):
    """Counts are whole numbers >= 0 and ids are numbers: a hand edit like num_documents: -3
    passed open and verify; it is now the invalid-manifest error, naming the field."""
    path, manifest_path = written
    data = json.loads(Path(manifest_path).read_text())
    edit(data)
    Path(manifest_path).write_text(json.dumps(unsealed(data)))
    with pytest.raises(
        RoxFormatError, match="the manifest is not valid grain_rox manifest JSON"
    ) as e:
        open_rox(path)
    assert message in e.value.problem and e.value.path == manifest_path


MANIFEST_HEAD = '"format": "grain_rox.manifest", "version": 1'


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        ("{not json", "(JSONDecodeError: "),
        ("[1, 2]", "(ValueError: expected a JSON object with a 'shards' object)"),
        (f'{{{MANIFEST_HEAD}, "shards": []}}', "with a 'shards' object)"),
        ('{"format": "other", "shards": {}}', "'format' is 'other', not 'grain_rox.manifest')"),
        (f'{{{MANIFEST_HEAD}, "shards": {{}}}}', "(KeyError: 'dtype')"),
        (
            f'{{{MANIFEST_HEAD}, "dtype": "uint16", "block_size": 16, '
            '"shards": {"train.rox": {"file_size": 152}}}',
            "(TypeError: ",
        ),
    ],
    ids=["not-json", "json-list", "shards-list", "wrong-format", "missing-key", "bad-record"],
)
def test_malformed_manifest(written, text, phrase):
    path, manifest_path = written
    Path(manifest_path).write_text(text)
    err = assert_open_fails(path, phrase, error_path=manifest_path)
    assert err.problem.startswith("the manifest is not valid grain_rox manifest JSON (")


def test_manifest_not_utf8(written):
    path, manifest_path = written
    Path(manifest_path).write_bytes(b'\xff\xfe{"format"')
    assert_open_fails(path, "the manifest is not UTF-8 JSON", error_path=manifest_path)


def test_manifest_from_newer_version(written):
    path, manifest_path = written
    data = json.loads(Path(manifest_path).read_text())
    data["version"] = 99
    Path(manifest_path).write_text(json.dumps(unsealed(data)))
    err = assert_open_fails(
        path, "manifest version 99 is newer than this grain_rox", error_path=manifest_path
    )
    assert err.fix == "upgrade grain_rox"


def test_manifest_without_checksum_verifies(written):
    path, manifest_path = written
    data = json.loads(Path(manifest_path).read_text())
    data["shards"]["train.rox"]["sha256"] = None
    Path(manifest_path).write_text(json.dumps(unsealed(data)))
    with open_rox(path) as corpus:
        assert corpus.shards[0].sha256 is None
        corpus.verify()


# ---- missing paths -----------------------------------------------------------------------------
def test_nonexistent_file(tmp_path):
    path = str(tmp_path / "nope.rox")
    prefix = str(tmp_path / "nope")
    expected = (
        f"no .rox shard found for {path!r} (not a file or directory; no "
        f"{prefix + '_NNNN.rox'!r} shards)"
    )
    with pytest.raises(FileNotFoundError, match=re.escape(expected)):
        open_rox(path)
    roxxel_expected = (
        f"no .rox shard found for {path!r} (not a file or directory; "
        f"{prefix + '_*.rox'!r} and {prefix + '*.rox'!r} matched nothing)"
    )
    with pytest.raises(FileNotFoundError, match=re.escape(roxxel_expected)):
        open_rox(path, roxxel_names=True)


def test_a_missing_directory_is_named_as_one(tmp_path):
    """A path ending in '/' or in a directory that is not there was searched as a set name
    ('nope/_NNNN.rox' shards), which it cannot be."""
    gone = tmp_path / "nope"
    for roxxel_names in (False, True):
        expected = f"no .rox shard found for the directory {str(gone) + '/'!r} (it does not exist)"
        with pytest.raises(FileNotFoundError, match=re.escape(expected) + "$"):
            open_rox(str(gone) + "/", roxxel_names=roxxel_names)
        inside = str(gone / "train.rox")
        expected = (
            f"no .rox shard found for {inside!r} (its directory {str(gone)!r} does not exist)"
        )
        with pytest.raises(FileNotFoundError, match=re.escape(expected) + "$"):
            open_rox(inside, roxxel_names=roxxel_names)
    # roxxel's prefix fallback globs a directory part too: no such directory is needed
    from grain_rox._format._paths import resolve_shard_paths

    (tmp_path / "part1").mkdir()
    (tmp_path / "part1" / "name_0000.rox").write_bytes(GOOD)
    found = resolve_shard_paths([str(tmp_path / "part*" / "name")], roxxel_names=True)
    assert found == [str(tmp_path / "part1" / "name_0000.rox")]


def test_empty_glob(tmp_path):
    (tmp_path / "other.rox").write_bytes(GOOD)
    pattern = str(tmp_path / "train_*.rox")
    with pytest.raises(
        FileNotFoundError, match=re.escape(f"no .rox shard matches the glob {pattern!r}")
    ):
        open_rox(pattern)


def test_empty_list():
    with pytest.raises(FileNotFoundError, match=re.escape("the list of .rox shards is empty")):
        open_rox([])


def test_directory_without_shards(tmp_path):
    (tmp_path / "notes.txt").write_text("not a shard")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "nested.rox").write_bytes(GOOD)  # not found: the search is not recursive
    expected = f"no .rox shard found for the directory {str(tmp_path)!r} (no *.rox in it)"
    with pytest.raises(FileNotFoundError, match=re.escape(expected)):
        open_rox(str(tmp_path))


def test_list_with_a_missing_file(tmp_path):
    good = tmp_path / "good.rox"
    good.write_bytes(GOOD)
    missing = str(tmp_path / "missing.rox")
    with pytest.raises(FileNotFoundError) as info:
        open_rox([good, missing])
    assert str(info.value).startswith(f"no .rox shard found for {missing!r} (not a file")
    assert str(good) not in str(info.value)


def test_shard_resized_after_open(shard_file):
    path = shard_file(GOOD)
    corpus = open_rox(path)
    Path(path).write_bytes(make_shard([b"abcdefgh"]))  # replaced before the first read
    phrase = (
        "the shard is now 48 bytes but was 64 when the corpus was opened: it was modified or "
        "replaced"
    )
    with pytest.raises(RoxFormatError, match=re.escape(phrase)) as info:
        corpus[0]
    assert_well_formed(info.value, path)
    with pytest.raises(RoxFormatError, match=re.escape(phrase)):
        corpus.tokens(0, 4)


# ---- pickling and repr -------------------------------------------------------------------------
class _RecordingUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.classes: set[tuple[str, str]] = set()

    def find_class(self, module: str, name: str):
        self.classes.add((module, name))
        return super().find_class(module, name)


def _three_shard_corpus_path(tmp_path: Path, name: str = "c", offset: int = 0) -> str:
    path = str(tmp_path / f"{name}.rox")
    tokens = np.arange(offset, offset + 19200, dtype=np.uint16)
    # 64-byte blocks (32 tokens), 250 blocks per shard: 600 blocks in shards of 250, 250, 100.
    write_rox([tokens], path, block_size=64, max_shard_bytes=72 * 250 + 32)
    return path


def test_pickle_is_small_and_holds_no_map(tmp_path):
    corpus = open_rox(_three_shard_corpus_path(tmp_path))
    expected = corpus.tokens(7000, 9000).copy()  # crosses shards 0/1: both are mapped now
    assert corpus[599].tolist() == list(range(19168, 19200))

    data = pickle.dumps(corpus)
    assert len(data) < 10_000
    unpickler = _RecordingUnpickler(data)
    copy = unpickler.load()
    modules = {module for module, _ in unpickler.classes}
    assert all(m.startswith(("grain_rox.", "numpy", "copyreg", "builtins")) for m in modules)
    assert not any("mmap" in m or m.strip("_") == "io" for m in modules)
    assert ("builtins", "open") not in unpickler.classes

    assert isinstance(copy, RoxCorpus)
    assert np.array_equal(copy.tokens(7000, 9000), expected)
    assert copy[599].tolist() == list(range(19168, 19200))
    assert repr(copy) == repr(corpus)
    assert "0x" not in repr(corpus)
    assert repr(corpus).startswith("RoxCorpus(shards=3, dtype=uint16, blocks=600, tokens=19200, ")
    # The original keeps its maps and keeps reading.
    assert np.array_equal(corpus.tokens(7000, 9000), expected)
    corpus.close()
    copy.close()


def test_repr_identifies_content(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _three_shard_corpus_path(tmp_path / "a")
    same_shape_other_tokens = _three_shard_corpus_path(tmp_path / "b", offset=1)
    with open_rox(first) as one, open_rox(first) as again:
        assert repr(one) == repr(again)
        assert one.fingerprint == again.fingerprint
        with open_rox(same_shape_other_tokens) as other:  # its manifest's sha256 differs
            assert repr(other) != repr(one)
    small = tmp_path / "small.rox"
    small.write_bytes(GOOD)
    bigger = tmp_path / "bigger.rox"
    bigger.write_bytes(make_shard([b"abcdefgh"] * 3))
    with open_rox(str(small)) as a, open_rox(str(bigger)) as b:
        assert repr(a) != repr(b)
        assert "0x" not in repr(a)


# ---- threads -----------------------------------------------------------------------------------
def test_concurrent_reads_from_fresh_corpus(tmp_path):
    expected = np.arange(19200, dtype=np.uint16)
    corpus = open_rox(_three_shard_corpus_path(tmp_path))  # no shard mapped yet

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(400):
            i = int(rng.integers(len(corpus)))
            block = corpus[i]
            if not np.array_equal(block, expected[32 * i : 32 * (i + 1)]):
                raise AssertionError(f"block {i} read {block[:4]}...")
            a, b = sorted(int(x) for x in rng.integers(0, 19200, size=2))
            if not np.array_equal(corpus.tokens(a, b), expected[a:b]):
                raise AssertionError(f"tokens({a}, {b}) are wrong")

    run_released_together(reader, 8)  # a reader's failure is raised here
    corpus.close()


def test_shard_replaced_at_the_same_size_after_open_is_refused_in_copies_too(tmp_path):
    """A corpus (and its pickled copies in Grain workers) maps the file versions it opened: a
    shard replaced or edited in place at the same size after open is refused when mapped."""
    path = str(tmp_path / "s.rox")

    def docs(value: int) -> list[np.ndarray]:
        return [np.full(8, value, np.uint16) for _ in range(6)]

    write_rox(docs(1), path, max_shard_bytes=100, block_size=16, dtype=np.uint16)
    corpus = open_rox(path)
    blob = pickle.dumps(corpus)  # as handed to a worker
    assert corpus.tokens(0, 8).tolist() == [1] * 8  # shard 0 is mapped now
    write_rox(
        docs(2), path, max_shard_bytes=100, block_size=16, dtype=np.uint16, if_exists="overwrite"
    )
    assert corpus.tokens(0, 8).tolist() == [1] * 8  # the map of the version opened
    message = (
        r"s_0001\.rox: the shard was modified or replaced after the corpus was opened .*"
        r"Fix: reopen the corpus \(open_rox\) / make a new pipeline; a checkpoint made on the "
        r"data as opened cannot continue on these bytes\."
    )
    with pytest.raises(RoxFormatError, match=message):
        corpus.tokens(0, corpus.num_tokens)
    with pytest.raises(RoxFormatError, match=r"s_0000\.rox: the shard was modified or replaced"):
        pickle.loads(blob).tokens(0, 8)
    fresh = open_rox(path)
    with open(tmp_path / "s_0002.rox", "r+b") as f:  # same-size edit in place
        f.write(np.uint16(7).tobytes())
    with pytest.raises(RoxFormatError, match=r"s_0002\.rox: the shard was modified or replaced"):
        fresh.tokens(0, fresh.num_tokens)
    assert open_rox(path).tokens(0, 8).tolist() == [2] * 8
    # Rewritten with fewer shards: the one deleted is named, where a bare FileNotFoundError
    # named no fix.
    fewer = open_rox(path)
    write_rox(
        docs(3)[:2], path, max_shard_bytes=100, block_size=16, dtype=np.uint16,
        if_exists="overwrite",
    )  # fmt: skip
    assert not os.path.exists(tmp_path / "s_0002.rox")
    with pytest.raises(RoxFormatError) as e:
        fewer.shard_tokens(2)
    assert str(e.value) == (
        f"{tmp_path / 's_0002.rox'}: the shard was deleted after the corpus was opened (its set "
        "was rewritten with fewer shards, or removed). Fix: reopen the corpus (open_rox) / make "
        "a new pipeline; a checkpoint made on the data as opened cannot continue without it."
    )


def test_a_mapped_shard_rewritten_in_place_is_refused_as_it_is_read(tmp_path, monkeypatch):
    """A memory map shows an in-place rewrite at once, so a run would mix two versions of its
    data: a mapped shard's file is checked as it is read (here every read), and one whose
    inode now holds another mtime or size is refused; a shard replaced by a rename (as every
    grain_rox write does) leaves the map on the old file, read on unchanged."""
    from grain_rox._format import _rox_corpus

    monkeypatch.setattr(_rox_corpus, "WATCH_SECONDS", 0.0)
    path = str(tmp_path / "s.rox")
    write_rox([np.full(8, 1, np.uint16) for _ in range(6)], path, block_size=16)
    corpus = open_rox(path)
    assert corpus.tokens(0, 8).tolist() == [1] * 8  # mapped now
    write_rox([np.full(8, 2, np.uint16) for _ in range(6)], path, block_size=16,
              if_exists="overwrite")  # fmt: skip
    assert corpus.tokens(0, 8).tolist() == [1] * 8  # renamed over: the old file, unchanged
    edited = open_rox(path)
    assert edited.tokens(0, 8).tolist() == [2] * 8
    with open(path, "r+b") as f:  # the same bytes, rewritten in place (a new mtime)
        f.write(np.full(8, 2, np.uint16).tobytes())
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # past a coarse clock's tick
    with pytest.raises(RoxFormatError, match=r"s\.rox: the shard was rewritten in place while it "
                       r"was being read .* Fix: never rewrite a shard in place while a run reads "
                       r"it"):  # fmt: skip
        edited.tokens(0, 8)


def test_two_shards_of_one_size_and_mtime_swapped_by_rename_are_refused(tmp_path):
    """Shards written in one tick of a coarse clock can record the same size and mtime_ns;
    swapped by rename, each would match the other's record by both. Such twins are hashed
    when the set is read (once per file version), so the swap is refused, naming the shard."""
    from grain_rox import TokenPipeline

    path = str(tmp_path / "t.rox")
    docs = [np.arange(i * 100, i * 100 + 100, dtype=np.uint16) for i in range(30)]
    write_rox(docs, path, separator=65535, block_size=64, max_shard_bytes=2000)
    manifest = tmp_path / "t.manifest.json"
    data = json.loads(manifest.read_text())
    a, b = "t_0000.rox", "t_0001.rox"
    assert data["shards"][a]["file_size"] == data["shards"][b]["file_size"]
    tick = data["shards"][a]["mtime_ns"]
    for name in (a, b):  # as if both were written in the same tick
        os.utime(tmp_path / name, ns=(tick, tick))
        data["shards"][name]["mtime_ns"] = tick
    manifest.write_text(json.dumps(unsealed(data)))
    TokenPipeline(path, seq_len=16, global_batch_size=4).map_dataset()[0]  # twins, hashed: fine
    os.rename(tmp_path / a, tmp_path / "x")
    os.rename(tmp_path / b, tmp_path / a)
    os.rename(tmp_path / "x", tmp_path / b)
    with pytest.raises(RoxFormatError, match=r"t_0000\.rox: its content changed after it was "
                       r"written: its sha256 is"):  # fmt: skip
        TokenPipeline(path, seq_len=16, global_batch_size=4).map_dataset()[0]


@pytest.mark.parametrize(
    "spec", [3, [3], None, {"a.rox"}], ids=["int", "list-of-int", "none", "set"]
)
def test_shard_paths_of_another_type_are_a_type_error_naming_them(spec):
    """A path, or a list of paths (an ordered one: a set has no order): anything else says
    what it got and what is taken (open_rox(3) was "'int' object is not iterable")."""
    with pytest.raises(TypeError, match=r"shard paths must be a path \(str or os.PathLike") as e:
        open_rox(spec)
    assert f"got {spec!r} ({type(spec).__name__})" in str(e.value)


def test_a_record_with_null_padding_has_none_at_its_end(written):
    """A hand-made manifest may say "num_padding_tokens": null (allowed: unknown); the
    padding left out at the shard's end is then none, not a TypeError."""
    path, manifest_path = written
    data = json.loads(Path(manifest_path).read_text())
    data["shards"]["train.rox"]["num_padding_tokens"] = None
    Path(manifest_path).write_text(json.dumps(unsealed(data)))
    assert open_rox(path).trailing_padding() == [(0, data["pad_id"])]


def test_a_set_without_a_manifest_that_lost_a_shard_is_refused(tmp_path):
    """A set's shards are numbered from _0000 without gaps; a hole in a set named, or in a
    directory's set holding _0000, is a lost shard, read on without it (silently) before."""
    write_rox([np.arange(1000, dtype=np.uint16)], str(tmp_path / "t.rox"), block_size=64,
              max_shard_bytes=400, manifest=False)  # fmt: skip
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[:2] == ["t_0000.rox", "t_0001.rox"] and len(names) > 4
    (tmp_path / "t_0001.rox").unlink()
    (tmp_path / "t_0003.rox").unlink()
    for spec in (tmp_path / "t.rox", tmp_path / "t", tmp_path):
        with pytest.raises(FileNotFoundError) as info:
            open_rox(str(spec))
        assert str(info.value) == (
            f"{spec}: the shard set {tmp_path / 't'}.rox has no t_0001.rox, t_0003.rox: a "
            "writer numbers a set's shards from _0000 without gaps, so 2 shards are missing "
            "(deleted, or a copy that did not finish). Restore them; to read the shards that "
            f"are there anyway, pass them as a list or a glob such as '{tmp_path / 't'}_*.rox'"
        )
    with open_rox(str(tmp_path / "t_*.rox")) as corpus:  # what the user names
        assert len(corpus.paths) == len(names) - 2
    # not a writer's set: numbered files without a _0000, in a directory
    other = tmp_path / "other"
    other.mkdir()
    for name in ("logs_2024.rox", "logs_2026.rox", "day_0000.rox", "day_20240517.rox"):
        (other / name).write_bytes((tmp_path / "t_0000.rox").read_bytes())
    with open_rox(str(other)) as corpus:  # (day_: more holes than files, another numbering)
        assert [os.path.basename(p) for p in corpus.paths] == [
            "day_0000.rox", "day_20240517.rox", "logs_2024.rox", "logs_2026.rox",
        ]  # fmt: skip


@pytest.mark.parametrize("damaged", [0, 2])
def test_verify_blames_only_the_shard_whose_footer_dtype_was_damaged(tmp_path, damaged):
    """The set's first shard was the dtype reference before the manifest was consulted: its
    damaged footer reported every sound shard as another dtype ("open sets of different
    dtypes as separate corpora"), and a later damaged one got that advice too."""
    write_rox([np.arange(3000, dtype=np.uint16)], str(tmp_path / "x.rox"), block_size=256,
              max_shard_bytes=1200)  # fmt: skip
    shards = sorted(str(p) for p in tmp_path.glob("x_*.rox"))
    assert len(shards) >= 4
    path = shards[damaged]
    kept = os.stat(path)
    data = bytearray(Path(path).read_bytes())
    data[-16:-8] = b"int16\0\0\0"
    Path(path).write_bytes(bytes(data))
    os.utime(path, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    reports = verify_rox(str(tmp_path / "x.rox"))
    assert [r.path for r in reports if not r.ok] == [path]
    assert reports[damaged].problem.startswith(
        f"the manifest {tmp_path / 'x.manifest.json'} says dtype uint16 but the shard's footer "
        "says int16"
    )


def test_a_dangling_symlink_among_the_shards_is_named_as_one(tmp_path):
    """A link to nothing gave a bare ``FileNotFoundError`` (a directory), or, by name or glob,
    "neither b.rox nor b_NNNN.rox exist, but 1 file(s) start with that name (b.rox)"."""
    write_rox([np.arange(100, dtype=np.uint16)], str(tmp_path / "a.rox"), block_size=16,
              manifest=False)  # fmt: skip
    os.symlink("gone.rox", tmp_path / "b.rox")
    for spec in (tmp_path, tmp_path / "*.rox", tmp_path / "b.rox"):
        with pytest.raises(FileNotFoundError) as info:
            open_rox(str(spec))
        assert str(info.value) == (
            f"no .rox shard found for '{tmp_path / 'b.rox'}' (a symbolic link to 'gone.rox', "
            "which does not exist: restore its target, or delete the link)"
        )


def test_a_set_whose_manifest_records_no_eos_says_so(tmp_path):
    """It said "(the shards have no manifest)" beside the manifest."""
    path = str(tmp_path / "m.rox")
    write_rox([np.arange(10, dtype=np.uint16)], path, block_size=8)
    with pytest.raises(ValueError) as info:
        RoxDocumentSource(path, seq_len=4)
    assert str(info.value) == (
        f"{path}: no EOS id to split documents at ({tmp_path / 'm.manifest.json'} records no "
        "EOS id: it was written without one); pass eos_id="
    )


def test_a_shard_cut_short_between_its_footer_and_its_index_is_named(tmp_path):
    """A write replacing the file with a smaller one between the two reads gave numpy's bare
    "mmap length is greater than file size", naming no file."""
    from grain_rox._format._rox_format import read_header, read_index

    path = tmp_path / "s.rox"
    write_rox([np.arange(5000, dtype=np.uint16)], str(path), block_size=64, manifest=False)
    header = read_header(str(path))
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(RoxFormatError, match=re.escape(
        f"{path}: the file is shorter than its footer said when it was read ({header.file_size} "
        "bytes): it was replaced or truncated meanwhile"
    )):  # fmt: skip
        read_index(header)
