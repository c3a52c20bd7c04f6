"""Bad inputs stop with an exact error naming the file, the problem and the fix; what is
skipped is counted. Converter (grain-rox convert) first, then the HuggingFace sources."""

from __future__ import annotations

import bz2
import gzip
import json
import logging
import lzma
import os
import re
import sys

import pytest

from grain_rox import open_rox
from grain_rox.cli import main


def tokens_of(path: str) -> list[int]:
    """The documents' tokens, each with its EOS (256), without the block padding (256s)."""
    with open_rox(path) as corpus:
        tokens = corpus.tokens(0, corpus.num_tokens).tolist()
    while tokens[-2:] == [256, 256]:
        tokens.pop()
    return tokens


def _gzip_truncated() -> bytes:
    return gzip.compress(b"hello world " * 50)[:-12]


# name -> bytes written; the error message expected (str.format'ed with {p}, the file's path;
# a regex where it holds the third-party library's own words, marked by "re:").
CONVERT_BAD_INPUTS = [
    (
        "latin1.txt",
        b"caf\xe9 au lait",
        [],
        "{p} is not UTF-8: byte offset 3 holds 0xe9; convert it to UTF-8 (e.g. iconv -f "
        "latin1 -t utf-8), or pass --encoding-errors replace (encoding_errors='replace') to "
        "read it with U+FFFD replacement characters",
    ),
    (
        "latin1.jsonl",
        b'{"text": "a"}\n{"text": "caf\xe9"}\n',
        [],
        "{p} is not UTF-8: line 2, byte offset 27 holds 0xe9; convert it to UTF-8 (e.g. iconv "
        "-f latin1 -t utf-8), or pass --encoding-errors replace (encoding_errors='replace') to "
        "read it with U+FFFD replacement characters",
    ),
    (
        "latin1.txt.gz",
        gzip.compress(b"caf\xe9"),
        [],
        "{p} is not UTF-8: byte offset 3 of the decompressed data holds 0xe9; convert it to "
        "UTF-8 (e.g. iconv -f latin1 -t utf-8), or pass --encoding-errors replace "
        "(encoding_errors='replace') to read it with U+FFFD replacement characters",
    ),
    (
        "blob.dat",
        b"\x7fELF\x02\x01\x01\x00\x00\x00",
        ["--on-binary", "error"],
        "{p} looks binary (a NUL byte at offset 7), not text; leave it out of the inputs, or "
        "pass --on-binary skip (on_binary='skip') to skip such files",
    ),
    (
        "config.json",
        json.dumps({"name": "x", "version": 2}, indent=2).encode(),
        [],
        "{p} holds one JSON object (keys ['name', 'version']), not JSON Lines: expected one "
        "record per line, or a JSON list of records, each with a 'text' field; leave it out of "
        "the inputs (e.g. a glob such as DIR/**/*.jsonl) or pass --format text to read it as "
        "one text document",
    ),
    (
        "list.json",
        b'[{"text": "a"}, 7]',
        [],
        "{p}[1] has no column 'text' (it has int); pass --text-column",
    ),
    (
        "broken.jsonl",
        b'{"text": "a"}\n{"text": \n',
        [],
        "{p}:2 is not valid JSON: Expecting value: line 1 column 10 (char 9)",
    ),
    (
        "corrupt.parquet",
        b"PAR1 this is not parquet at all",
        [],
        "re:{p} is not a readable Parquet file \\(ArrowInvalid: .*\\); it is damaged or not "
        "Parquet: regenerate it, or leave it out of the inputs$",
    ),
    (
        "packed.parquet.gz",
        gzip.compress(b"PAR1"),
        [],
        "{p}: compressed Parquet files are not read; decompress it first (Parquet compresses "
        "its own pages)",
    ),
    (
        "cut.jsonl.gz",
        _gzip_truncated(),
        [],
        "{p} is not a readable gzip file (EOFError: Compressed file ended before the "
        "end-of-stream marker was reached); it is damaged or misnamed: regenerate it, or leave "
        "it out of the inputs",
    ),
    (
        "fake.xz",
        b"this is not xz data",
        [],
        "{p} is not a readable xz file (LZMAError: Input format not supported by decoder); it "
        "is damaged or misnamed: regenerate it, or leave it out of the inputs",
    ),
    (
        "empty.jsonl",
        b"",
        [],
        "no documents to convert in {p}: 0 files read, skipped 1 file (1 empty); the lines "
        "logged above say why each file was skipped",
    ),
    (
        "only.bin",
        b"\x00" * 100,
        [],
        "no documents to convert in {p}: 0 files read, skipped 1 file (1 binary); the lines "
        "logged above say why each file was skipped",
    ),
]


@pytest.mark.parametrize(
    ("name", "data", "flags", "expected"), CONVERT_BAD_INPUTS, ids=[c[0] for c in CONVERT_BAD_INPUTS]
)
def test_convert_bad_input_is_an_exact_error(tmp_path, capsys, name, data, flags, expected):
    path = tmp_path / name
    path.write_bytes(data)
    out = tmp_path / "o.rox"
    assert main(["convert", str(path), "-o", str(out), "--no-progress", *flags]) == 2
    err = capsys.readouterr().err.strip()
    prefix = "grain-rox convert: error: "
    assert err.startswith(prefix)
    message = err[len(prefix) :].splitlines()[-1] if "\n" in err else err[len(prefix) :]
    if expected.startswith("re:"):
        assert re.match(expected[3:].replace("{p}", re.escape(str(path))), message), message
    else:
        assert message == expected.format(p=path)
    assert not out.exists()


def test_zstd_without_the_zstandard_package_names_the_file_and_the_package(
    tmp_path, monkeypatch
):
    from grain_rox._convert import read_documents

    path = tmp_path / "a.txt.zst"
    path.write_bytes(b"(not read)")
    monkeypatch.setitem(sys.modules, "zstandard", None)  # as if it were not installed
    with pytest.raises(ImportError) as info:
        list(read_documents([str(path)]))
    assert str(info.value) == (
        f"{path} is zstd-compressed: reading it needs the zstandard package (pip install "
        "zstandard), or decompress it first (zstd -d)"
    )


def test_compressed_text_and_jsonl_give_the_same_tokens_as_plain(tmp_path, capsys):
    records = b'{"text": "hello"}\n{"text": "w\xc3\xb6rld"}\n'
    text = "plain text \u00e9\n".encode()
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    (plain / "a.jsonl").write_bytes(records)
    (plain / "b.txt").write_bytes(text)
    (plain / "c.txt").write_bytes(text * 2)
    (plain / "d.txt").write_bytes(text * 3)
    (packed / "a.jsonl.gz").write_bytes(gzip.compress(records))
    (packed / "b.txt.bz2").write_bytes(bz2.compress(text))
    (packed / "c.txt.xz").write_bytes(lzma.compress(text * 2))
    (packed / "d.gz").write_bytes(gzip.compress(text * 3))
    outs = []
    for src in (plain, packed):
        out = str(tmp_path / f"{src.name}.rox")
        assert main(["convert", str(src), "-o", out, "--no-progress"]) == 0
        outs.append(tokens_of(out))
        assert "5 documents" in capsys.readouterr().out
    assert outs[0] == outs[1]
    assert outs[0][:6] == [104, 101, 108, 108, 111, 256]  # "hello" + EOS


def test_zstd_text_is_read_when_zstandard_is_installed(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    from grain_rox._convert import read_documents

    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "zz"}\n'))
    assert list(read_documents([str(path)])) == ["zz"]


def test_skipped_binaries_empties_and_fifos_are_counted_logged_and_summarised(
    tmp_path, capsys, caplog
):
    src = tmp_path / "docs"
    src.mkdir()
    (src / "a.txt").write_text("hello")
    (src / "b.jsonl").write_text('{"text": "x"}\n{"text": null}\n[]\n'[:-3])
    (src / "c.tar.gz").write_bytes(gzip.compress(b"c.txt\x00\x00\x00\x00 0000644"))
    (src / "d.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (src / "e.txt").write_bytes(b"")
    os.mkfifo(src / "f.rox")  # would block a reader forever
    out = str(tmp_path / "o.rox")
    with caplog.at_level(logging.WARNING, logger="grain_rox"):
        assert main(["convert", str(src), "-o", out, "--no-progress"]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("wrote 2 documents, 8 bytes tokens (uint16) into 1 shard(s) in ")
    assert line.endswith(
        "; 2 files read, skipped 4 files (2 binary, 1 empty, 1 not regular files) and 1 null "
        f"text; manifest {tmp_path / 'o.manifest.json'}"
    )
    assert tokens_of(out) == [104, 101, 108, 108, 111, 256, 120, 256]
    assert [r.getMessage() for r in caplog.records] == [
        f"skipped {src / 'c.tar.gz'}: it looks binary (a NUL byte at offset 5); pass "
        "--on-binary error to stop instead",
        f"skipped {src / 'd.png'}: it looks binary (a NUL byte at offset 8); pass --on-binary "
        "error to stop instead",
        f"skipped {src / 'e.txt'}: it is empty",
        f"skipped {src / 'f.rox'}: not a regular file (a FIFO, socket or device)",
    ]


def test_encoding_errors_replace_reads_with_replacement_characters(tmp_path):
    path = tmp_path / "l.txt"
    path.write_bytes(b"caf\xe9")
    out = str(tmp_path / "o.rox")
    assert main(["convert", str(path), "-o", out, "--encoding-errors", "replace"]) == 0
    assert tokens_of(out) == [99, 97, 102, 0xEF, 0xBF, 0xBD, 256]


def test_a_json_list_of_records_is_read_record_by_record(tmp_path):
    path = tmp_path / "l.json"
    path.write_text(json.dumps([{"text": "ab"}, {"text": None}, {"text": "c"}], indent=1))
    out = str(tmp_path / "o.rox")
    assert main(["convert", str(path), "-o", out]) == 0
    assert tokens_of(out) == [97, 98, 256, 99, 256]
