"""Bad inputs stop with an exact error naming the file, the problem and the fix; what is
skipped is counted. Converter (grain-rox convert) first, then the HuggingFace sources."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import logging
import lzma
import os
import re
import sys

import numpy as np
import pytest

from grain_rox import open_rox, read_documents
from grain_rox._text._convert import ReadStats, read_files
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
        "surrogate.jsonl",
        b'{"text": "a"}\n{"text": "x\\ud800y"}\n',
        [],
        "{p}:2: the text holds a lone surrogate '\\ud800' at character 1 (a JSON escape that is "
        "no character, so no tokenizer can take it); pass --encoding-errors replace "
        "(encoding_errors='replace') to read it as U+FFFD",
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
        "{p}[1] is a JSON int (7), not a record: each record must be an object with a 'text' "
        "field holding its text",
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
    ("name", "data", "flags", "expected"),
    CONVERT_BAD_INPUTS,
    ids=[c[0] for c in CONVERT_BAD_INPUTS],
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


def test_a_parquet_file_without_rows_is_an_error_that_points_at_no_skipped_file(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "rowless.parquet"
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), path)
    out = tmp_path / "o.rox"
    assert main(["convert", str(path), "-o", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"grain-rox convert: error: no documents to convert in {path}: 1 file read; the files "
        "read hold no records (no lines, rows or documents); check that these are the files meant"
    )
    assert not out.exists()


def test_a_parquet_file_naming_the_text_column_twice_is_an_error_naming_it(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "twice.parquet"
    table = pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["text", "text"])
    pq.write_table(table, path)
    out = tmp_path / "o.rox"
    assert main(["convert", str(path), "-o", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"grain-rox convert: error: {path} has 2 columns named 'text', so which one holds the "
        "text is not known; rewrite the file with one such column, or pass --text-column "
        "naming another"
    )
    assert not out.exists()


def test_zstd_without_the_zstandard_package_names_the_file_and_the_package(tmp_path, monkeypatch):
    from grain_rox._text._convert import read_files

    path = tmp_path / "a.txt.zst"
    path.write_bytes(b"(not read)")
    monkeypatch.setitem(sys.modules, "zstandard", None)  # as if it were not installed
    with pytest.raises(ImportError) as info:
        list(read_files([str(path)]))
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
    from grain_rox._text._convert import read_files

    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "zz"}\n'))
    assert list(read_files([str(path)])) == ["zz"]


def test_zstd_frames_are_all_read_and_a_cut_or_foreign_file_is_an_error(tmp_path, capsys):
    zstandard = pytest.importorskip("zstandard")
    text = "".join(f"line {i} of a text that zstd cannot squeeze to nothing\n" for i in range(9000))
    packed = zstandard.ZstdCompressor().compress(text.encode())
    two = tmp_path / "two.txt.zst"  # two frames, as pzstd or `cat a.zst b.zst` write
    two.write_bytes(packed + zstandard.ZstdCompressor().compress(b"second frame"))
    assert list(read_files([str(two)])) == [text + "second frame"]
    cut = tmp_path / "cut.txt.zst"  # a download or copy that stopped: its first part decodes
    cut.write_bytes(packed[: len(packed) // 2])
    foreign = tmp_path / "plain.txt.zst"
    foreign.write_bytes(b"plain text, named .zst")
    for path, why in (
        (cut, "EOFError: Compressed file ended before the end-of-stream marker was reached"),
        (foreign, "OSError: zstd decompressor error: Unknown frame descriptor"),
    ):
        out = tmp_path / f"{path.name}.rox"
        assert main(["convert", str(path), "-o", str(out), "--no-progress"]) == 2
        assert capsys.readouterr().err.strip() == (
            f"grain-rox convert: error: {path} is not a readable zstd file ({why}); it is "
            "damaged or misnamed: regenerate it, or leave it out of the inputs"
        )
        assert not out.exists()


def test_a_zstd_read_returns_at_most_the_bytes_asked(tmp_path):
    """A read gave all that its compressed piece decoded to: 34 MB of repeated text (3 KB
    compressed) came back as one chunk, where gzip, bz2 and xz give at most the size asked."""
    zstandard = pytest.importorskip("zstandard")
    from grain_rox._text._text_files import open_input

    text = b"the same line of text, again and again\n" * 800_000
    packed = zstandard.ZstdCompressor().compress(text) + zstandard.ZstdCompressor().compress(b"!")
    reader = open_input(io.BytesIO(packed), "zstd", "x.zst")
    sizes, got = [], []
    while chunk := reader.read(1 << 16):
        sizes.append(len(chunk))
        got.append(chunk)
    assert max(sizes) == 1 << 16 and b"".join(got) == text + b"!"


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
        assert main(["convert", str(src), "-o", out, "--no-progress", "--on-null", "skip"]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("wrote 2 documents, 8 bytes tokens (uint16) into 1 shard(s) in ")
    assert line.endswith(
        "; 2 files read, skipped 4 files (2 binary, 1 empty, 1 not a regular file) and 1 null "
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


def test_a_lone_surrogate_in_json_reads_as_u_fffd_with_encoding_errors_replace(tmp_path):
    """JSON can escape a lone surrogate (no character, no UTF-8): an error by default (above),
    U+FFFD when asked, in a list of records as in JSON Lines."""
    lines, listed = tmp_path / "s.jsonl", tmp_path / "s.json"
    lines.write_text('{"text": "x\\udc80y"}\n')
    listed.write_text('[{"text": "x\\udc80y"}]')
    for path in (lines, listed):
        out = str(tmp_path / f"{path.suffix[1:]}.rox")
        assert main(["convert", str(path), "-o", out, "--encoding-errors", "replace"]) == 0
        assert tokens_of(out) == [120, 0xEF, 0xBF, 0xBD, 121, 256]
    with pytest.raises(ValueError, match=r"s\.json\[0\]: the text holds a lone surrogate"):
        list(read_files([str(listed)], text_column="text"))


def test_a_json_list_of_records_is_read_record_by_record(tmp_path):
    path = tmp_path / "l.json"
    path.write_text(json.dumps([{"text": "ab"}, {"text": None}, {"text": "c"}], indent=1))
    out = str(tmp_path / "o.rox")
    assert main(["convert", str(path), "-o", out, "--on-null", "skip"]) == 0
    assert tokens_of(out) == [97, 98, 256, 99, 256]


# --- HuggingFace sources: missing values and damaged files ------------------------------

NULL_WHY = (
    "grain_rox serves no stand-in for it (a null text would be tokenized as 'None', a null "
    "number read as NaN)"
)


def _eager_null(column: str, where: str, rows: str, keep: str) -> str:
    return (
        f"column {column!r} has a missing value (None) {where} ({rows}); {NULL_WHY}. Drop such "
        f"rows first, dataset = dataset.filter(lambda r: {keep}), pass nulls='skip' to leave "
        "them out (counted), fill them (dataset.map), or leave the column out "
        f"(exclude_keys=[{column!r}])"
    )


EAGER_NULLS = [
    (
        "text-tokenized",
        {"t": ["a", None, "b"]},
        {"tokenize": ["t"], "tokenizer": "bytes"},
        _eager_null("t", "in row 1", "1 row in all", "r['t'] is not None"),
    ),
    (
        "text",
        {"t": ["a", "b", None, None]},
        {},
        _eager_null("t", "in row 2", "2 rows in all", "r['t'] is not None"),
    ),
    (
        "int-list-element",
        {"ids": [[1, 2], [3, None], [4]]},
        {},
        _eager_null(
            "ids",
            "inside row 1 (an element of its value)",
            "1 row in all",
            "None not in r['ids']",
        ),
    ),
    (
        "int-list-and-element",
        {"ids": [[1, None], None, [4]], "y": [1, 2, 3]},
        {},
        _eager_null(
            "ids",
            "inside row 0 (an element of its value)",
            "2 rows in all",
            "r['ids'] is not None and None not in r['ids']",
        ),
    ),
    (
        "int",
        {"y": [1, None]},
        {},
        _eager_null("y", "in row 1", "1 row in all", "r['y'] is not None"),
    ),
    (
        "nested-struct",
        {"s": [{"a": 1, "b": "x"}, {"a": None, "b": "y"}]},
        {},
        _eager_null(
            "s", "inside row 1 (an element of its value)", "1 row in all", "None not in r['s']"
        ),
    ),
]


@pytest.mark.parametrize(
    ("data", "kwargs", "expected"), [c[1:] for c in EAGER_NULLS], ids=[c[0] for c in EAGER_NULLS]
)
def test_hf_eager_null_is_an_exact_error(data, kwargs, expected):
    datasets = pytest.importorskip("datasets")
    from grain_rox import HFEagerSource

    with pytest.raises(ValueError) as info:
        HFEagerSource(datasets.Dataset.from_dict(data), **kwargs)
    assert str(info.value) == expected


def test_hf_eager_null_in_a_column_left_out_is_no_error():
    datasets = pytest.importorskip("datasets")
    from grain_rox import HFEagerSource

    source = HFEagerSource(
        datasets.Dataset.from_dict({"t": ["a", None], "y": [1, 2]}), exclude_keys=["t"]
    )
    assert source.get_batch([0, 1])["y"].tolist() == [1, 2]


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_hf_filtered_files_with_nulls_serve_exact_ints_after_the_suggested_filter(tmp_path):
    datasets = pytest.importorskip("datasets")
    from grain_rox import HFEagerSource

    rows = [{"ids": [1, 2]}, {"ids": [3, None]}, {"ids": [5]}, {"ids": None}, {"ids": [7, 8]}]
    path = _jsonl(tmp_path / "n.jsonl", rows)
    with pytest.raises(ValueError, match=r"inside row 1 .* \(2 rows in all\)"):
        HFEagerSource(data_files=path)
    ds = datasets.load_dataset("json", data_files=path, split="train", cache_dir=str(tmp_path))
    kept = ds.filter(lambda r: r["ids"] is not None and None not in r["ids"])
    source = HFEagerSource(kept)  # memory-mapped with an indices map: the nulls stay in Arrow
    assert not source.files[0].startswith(str(tmp_path / "grain_rox_hf_"))
    served = [source[i]["ids"] for i in range(len(source))]
    assert [a.tolist() for a in served] == [[1, 2], [5], [7, 8]]
    assert {a.dtype.name for a in served} == {"int64"}  # not float64 with NaN


def test_hf_filtered_fixed_size_lists_with_nulls_serve_exact_ints(tmp_path):
    """A fixed-size list column (``Sequence(..., length=n)``) kept its nulls in the Arrow table
    under a filter: a null element in a row filtered out made the rows beside it float64
    (2**53 + 1 came out as 2**53), and a null row made the first read raise AttributeError."""
    datasets = pytest.importorskip("datasets")
    import pyarrow as pa

    from grain_rox import HFEagerSource

    big = 2**53 + 1
    table = pa.table(
        {
            "rows": pa.array([[1, 2], None, [5, 6], [7, 8]], pa.list_(pa.int32(), 2)),
            "cells": pa.array([[big, 2], [None, 4], [big + 2, 6], [9, 9]], pa.list_(pa.int64(), 2)),
            "keep": pa.array([1, 0, 1, 1], pa.int8()),
        }
    )
    datasets.Dataset(table).save_to_disk(str(tmp_path / "fixed"))
    kept = datasets.load_from_disk(str(tmp_path / "fixed")).filter(lambda r: r["keep"] == 1)
    source = HFEagerSource(kept, include_keys=["rows", "cells"])  # an indices map: nulls stay
    served = [source[i] for i in range(len(source))]
    assert [r["rows"].tolist() for r in served] == [[1, 2], [5, 6], [7, 8]]
    assert [r["cells"].tolist() for r in served] == [[big, 2], [big + 2, 6], [9, 9]]
    assert {r["cells"].dtype.name for r in served} == {"int64"}
    batch = source.get_batch([0, 1])
    assert batch["cells"].dtype.name == "int64"
    assert batch["cells"].tolist() == [[big, 2], [big + 2, 6]]


def _stream_null(path: str, column: str, where: str) -> str:
    return (
        f"{path}: column {column!r} has a missing value (None) {where} (of this host's stream, "
        f"shard=(0, 1), epoch 0); {NULL_WHY}. Drop or fill such rows in the files, pass "
        f"nulls='skip' to leave them out (counted), or leave the column out "
        f"(exclude_keys=[{column!r}])"
    )


def test_hf_streaming_nulls_are_exact_errors(tmp_path):
    pytest.importorskip("datasets")
    from grain_rox import HFStreamingSource

    path = _jsonl(
        tmp_path / "s.jsonl",
        [{"ids": [1], "t": "a"}, {"ids": [2], "t": None}, {"ids": [3, None], "t": "c"}],
    )
    cases = [
        (
            {"include_keys": ["t"], "tokenize": ["t"], "tokenizer": "bytes"},
            _stream_null(path, "t", "in row 1"),
        ),
        (
            {"include_keys": ["ids"], "shuffle_buffer": 2},
            _stream_null(path, "ids", "inside row 2 (an element of its value)"),
        ),
    ]
    for kwargs, expected in cases:
        with pytest.raises(ValueError) as info:
            list(HFStreamingSource(path, **kwargs).dataset(num_epochs=1))
        assert str(info.value) == expected
    # A refused row stays the next one: a retry (or a state saved after the error) served
    # the rows after it, without it, and the state counted it as kept.
    rows = iter(HFStreamingSource(path, include_keys=["t"]).dataset(num_epochs=1))
    assert str(next(rows)["t"]) == "a"
    state = rows.get_state()
    for _ in range(2):
        with pytest.raises(ValueError, match="in row 1"):
            next(rows)
        assert rows.get_state() == state


def test_hf_streaming_dates_out_of_pythons_range_name_the_file_and_row(tmp_path):
    """Year 10000 streamed as a bare OverflowError ("date value out of range") naming no file
    or row; the eager source serves it as datetime64."""
    pytest.importorskip("datasets")
    from grain_rox import HFEagerSource, HFStreamingSource

    path = str(tmp_path / "t.parquet")
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    pq.write_table(pa.table({"ts": pa.array([0, 253402300800], pa.timestamp("s"))}), path)
    assert HFEagerSource(data_files=path)[1]["ts"] == np.datetime64("10000-01-01T00:00:00")
    rows = iter(HFStreamingSource(path).dataset(num_epochs=1))
    assert next(rows)["ts"] == np.datetime64("1970-01-01T00:00:00")
    with pytest.raises(ValueError, match=re.escape(
        f"{path}: row 1 of this host's stream (shard=(0, 1), epoch 0) holds a date or time "
        "outside Python's range (years 1-9999; "
    )):  # fmt: skip
        next(rows)


def _hf_files():
    return [
        (
            "corrupt.parquet",
            b"PAR1 not parquet",
            "re:{p} is not a readable Parquet file \\(ArrowInvalid: Parquet magic bytes not "
            "found in footer.*\\); regenerate it, or leave it out of data_files$",
        ),
        (
            "empty.jsonl",
            b"",
            "{p} is empty (0 bytes); leave it out of data_files or write its rows again",
        ),
        (
            "latin1.jsonl",
            b'{"text": "ok"}\n{"text": "caf\xe9"}\n',
            "{p} is not UTF-8: byte offset 28 holds 0xe9; convert it to UTF-8 (e.g. iconv -f "
            "latin1 -t utf-8)",
        ),
        (
            "corrupt.arrow",
            b"not an arrow file at all",
            "re:{p} is not a readable Arrow file \\(ArrowInvalid: .*\\); regenerate it, or "
            "leave it out of data_files$",
        ),
    ]


@pytest.mark.parametrize("streaming", [False, True], ids=["eager", "streaming"])
@pytest.mark.parametrize(("name", "data", "expected"), _hf_files(), ids=[c[0] for c in _hf_files()])
def test_hf_damaged_file_is_an_exact_error_naming_it(tmp_path, streaming, name, data, expected):
    pytest.importorskip("datasets")
    from grain_rox import HFEagerSource, HFStreamingSource

    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ValueError) as info:
        if streaming:
            list(HFStreamingSource(str(path)).dataset(num_epochs=1))
        else:
            source = HFEagerSource(data_files=str(path))
            [source[i] for i in range(len(source))]
    message = str(info.value)
    if expected.startswith("re:"):
        assert re.match(expected[3:].replace("{p}", re.escape(str(path))), message), message
    else:
        assert message == expected.format(p=path)


def test_hf_nulls_skip_leaves_rows_out_counts_and_logs_them(tmp_path, caplog):
    datasets = pytest.importorskip("datasets")
    from grain_rox import HFEagerSource, HFStreamingSource

    rows = [
        {"ids": [1, 2], "t": "a"},
        {"ids": [3, None], "t": "b"},
        {"ids": [5], "t": None},
        {"ids": [7, 8], "t": "d"},
    ]
    path = _jsonl(tmp_path / "n.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="grain_rox"):
        eager = HFEagerSource(
            datasets.Dataset.from_list(rows), nulls="skip", tokenize=["t"], tokenizer="bytes"
        )
        assert eager.skipped_rows == 2 and len(eager) == 2
        assert [eager[i]["ids"].tolist() for i in range(2)] == [[1, 2], [7, 8]]
        assert eager[1]["t"].tolist() == [100, 256]
        stream = HFStreamingSource(path, nulls="skip", include_keys=["ids"])
        it = iter(stream.dataset(num_epochs=1))
        assert [next(it)["ids"].tolist() for _ in range(3)] == [[1, 2], [5], [7, 8]]
        assert it.get_state()["state"]["skipped"] == 1
        assert list(it) == []
    assert [r.getMessage() for r in caplog.records] == [
        "HFEagerSource(nulls='skip') leaves out 2 of 4 rows, which have a missing value (None) "
        "in ['ids', 't']; the first is row 1",
        "HFStreamingSource(nulls='skip') left out 1 of 4 rows of epoch 0 (shard=(0, 1)): they "
        "have a missing value (None)",
    ]
    with pytest.raises(ValueError, match="nulls='drop' is not one of \\('error', 'skip'\\)"):
        HFStreamingSource(path, nulls="drop")
    refused = iter(HFStreamingSource(path, include_keys=["ids"]).dataset(num_epochs=1))
    with pytest.raises(ValueError, match="nulls: saved 'skip' -> now 'error'"):
        refused.set_state(it.get_state())


def test_convert_a_saved_hf_dataset_checks_the_column_type_and_counts_null_texts(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    saved = str(tmp_path / "hf")
    datasets.Dataset.from_dict({"text": ["ab", None, "c"], "n": [1, 2, 3]}).save_to_disk(saved)
    out = str(tmp_path / "o.rox")
    assert main(["convert", saved, "-o", out, "--no-progress", "--on-null", "skip"]) == 0
    assert "; 1 file read, skipped 1 null text; manifest" in capsys.readouterr().out
    assert tokens_of(out) == [97, 98, 256, 99, 256]
    assert (
        main(["convert", saved, "-o", out, "--text-column", "n", "--if-exists", "overwrite"]) == 2
    )
    assert capsys.readouterr().err == (
        f"grain-rox convert: error: {saved}: column 'n' holds Value('int64'), not text; pass "
        "--text-column naming a column of text ('text')\n"
    )


def test_a_hf_arrow_file_named_alone_says_to_pass_its_folder(tmp_path, capsys, caplog):
    """A saved dataset's .arrow file, named alone, was skipped as "binary" with no word of
    the folder that converts."""
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": ["a", "b"]}).save_to_disk(str(tmp_path / "saved"))
    (arrow,) = (tmp_path / "saved").glob("*.arrow")
    with caplog.at_level(logging.WARNING, logger="grain_rox"):
        assert main(["convert", str(arrow), "-o", str(tmp_path / "o.rox"), "--no-progress"]) == 2
    assert "a HF dataset's Arrow file: pass the folder save_to_disk wrote" in caplog.text
    assert main(["convert", str(tmp_path / "saved"), "-o", str(tmp_path / "o.rox"),
                 "--no-progress"]) == 0  # fmt: skip


def test_only_a_folder_save_to_disk_wrote_is_read_as_a_saved_hf_dataset(tmp_path, capsys, caplog):
    """A folder holding any state.json (a run's, an app's) was read as a saved HF dataset and
    stopped the conversion with datasets' bare message; --format hf named a file a directory,
    and --format text skipped a saved dataset as 'a FIFO, socket or device'."""
    from grain_rox._text._convert import expand_inputs, is_hf_dataset_dir

    datasets = pytest.importorskip("datasets")
    tree = tmp_path / "tree"
    (tree / "proj").mkdir(parents=True)
    (tree / "proj" / "a.txt").write_text("hi")
    datasets.Dataset.from_dict({"text": ["from hf"]}).save_to_disk(str(tree / "saved"))
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["t"]})})
    splits.save_to_disk(str(tmp_path / "splits"))
    run = tmp_path / "run"  # a folder of an app's JSON files
    run.mkdir()
    (run / "state.json").write_text('{"step": 3}')
    (run / "dataset_dict.json").write_text('{"splits": 2}')
    assert not is_hf_dataset_dir(str(run)) and not is_hf_dataset_dir(str(tree / "proj"))
    assert is_hf_dataset_dir(str(tree / "saved")) and is_hf_dataset_dir(str(tmp_path / "splits"))
    assert list(read_files(expand_inputs([str(tree)]))) == ["hi", "from hf"]
    # its JSON files are read as records (and say what they lack), not as a dataset
    with pytest.raises(KeyError, match=r"run/dataset_dict\.json:1 has no column 'text'"):
        list(read_files(expand_inputs([str(run)])))
    with caplog.at_level(logging.INFO, logger="grain_rox"):
        assert list(read_files([str(tree / "saved")], fmt="text")) == []
    assert "a saved HF dataset, not text (pass --format hf)" in caplog.text
    capsys.readouterr()  # (datasets' progress bars)
    for given, path in ((tree / "proj" / "a.txt",) * 2, (run, run / "dataset_dict.json")):
        out = str(tmp_path / "o.rox")  # (a folder is walked: its first file is named)
        assert main(["convert", str(given), "-o", out, "--format", "hf", "--no-progress"]) == 2
        assert capsys.readouterr().err == (
            f"grain-rox convert: error: {path} is not a saved HF dataset: that is the folder "
            "save_to_disk writes (with state.json and dataset_info.json, or dataset_dict.json); "
            "drop --format hf to read it by its name's format\n"
        )


def test_json_past_pythons_limits_is_read_or_named(tmp_path, capsys):
    """An int of 5,000 digits in any field stopped convert with Python's "Exceeds the limit
    (4300 digits)" naming no file or line, and deep nesting with a bare RecursionError. Such
    an int in another field is read past now (in the text field it is a number, refused);
    nesting past the recursion limit names the line."""
    big = "9" * 5000
    (tmp_path / "other.jsonl").write_text(f'{{"text": "a", "n": {big}}}\n{{"text": "b"}}\n')
    (tmp_path / "list.json").write_text(f'[{{"text": "a", "n": {big}}}]')
    (tmp_path / "text.jsonl").write_text(f'{{"text": {big}, "body": "x"}}\n')
    (tmp_path / "deep.jsonl").write_text('{"text": "a", "n": ' + "[" * 10**5 + "]" * 10**5 + "}\n")
    out = str(tmp_path / "o.rox")
    for name, docs in (("other.jsonl", [[97], [98]]), ("list.json", [[97]])):
        args = ["convert", str(tmp_path / name), "-o", out, "--no-progress"]
        assert main([*args, "--if-exists", "overwrite"]) == 0
        capsys.readouterr()
        with open_rox(out) as corpus:
            assert corpus.tokens(0, corpus.num_tokens).tolist()[: 2 * len(docs)] == [
                t for d in docs for t in (*d, 256)
            ]
    # a pretty-printed object (the first line fails, the whole file is tried as one document)
    (tmp_path / "pretty.jsonl").write_text(f'{{\n "text": "a",\n "n": {big}\n}}\n')
    (tmp_path / "pdeep.jsonl").write_text('{\n"n": ' + "[" * 10**5 + "]" * 10**5 + "}\n")
    for name, message in (
        ("text.jsonl", ":1: column 'text' holds int, not text; pass --text-column naming a "
         "column of text ('body')"),
        ("deep.jsonl", ":1 cannot be read as JSON here: it nests arrays or objects deeper than "
         "Python's recursion limit; flatten it"),
        ("pretty.jsonl", " holds one JSON object (keys ['n', 'text']), not JSON Lines"),
        ("pdeep.jsonl", ":1 is not valid JSON: Expecting property name"),
    ):  # fmt: skip
        assert main(["convert", str(tmp_path / name), "-o", out, "--no-progress"]) == 2
        assert f"{tmp_path / name}{message}" in capsys.readouterr().err


def test_a_text_column_without_text_names_the_columns_that_hold_some(tmp_path, capsys):
    """The error named the file and the column's type but no fix; it now names the columns of
    text to pass (or says there are none)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {"text": [1, 2], "body": ["a", "b"], "tag": pa.array(["x", "y"]).dictionary_encode()}
    )
    pq.write_table(table, tmp_path / "t.parquet")
    (tmp_path / "t.jsonl").write_text('{"text": 3, "body": "a", "n": 1}\n')
    pq.write_table(pa.table({"text": [1.5]}), tmp_path / "f.parquet")
    out = str(tmp_path / "o.rox")
    for name, fix in [
        ("t.parquet", "pass --text-column naming a column of text ('body', 'tag')"),
        ("t.jsonl", "pass --text-column naming a column of text ('body')"),
        ("f.parquet", "no column here holds text: convert the values to text first"),
    ]:
        assert main(["convert", str(tmp_path / name), "-o", out, "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert "column 'text' holds" in err and f"not text; {fix}" in err, err


def test_convert_reads_a_saved_dataset_whatever_format_it_was_saved_with(tmp_path, capsys):
    """save_to_disk keeps a with_format in state.json: the texts are read as Python strings
    all the same (the arrow format gave pyarrow scalars, a tokenizer error naming no file; a
    format on other columns hid the text column: "error: text")."""
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": ["ab", None, "c"], "n": [1, 2, 3]})
    for name, formatted in (
        ("arrow", ds.with_format("arrow")),
        ("numpy_n", ds.with_format("numpy", columns=["n"])),
        ("pandas", ds.with_format("pandas")),
    ):
        saved = str(tmp_path / name)
        formatted.save_to_disk(saved)
        out = str(tmp_path / f"{name}.rox")
        assert main(["convert", saved, "-o", out, "--no-progress", "--on-null", "skip"]) == 0
        assert "; 1 file read, skipped 1 null text; manifest" in capsys.readouterr().out
        assert tokens_of(out) == [97, 98, 256, 99, 256]


def test_a_saved_dataset_dict_says_which_splits_it_leaves_out(tmp_path, capsys, caplog):
    """Only the train split of a saved DatasetDict is converted (a test split must not be
    trained on by default): the others are named, with how to convert one (they were left
    out unsaid)."""
    datasets = pytest.importorskip("datasets")
    saved = str(tmp_path / "dict")
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": ["ab", "c"]}),
            "test": datasets.Dataset.from_dict({"text": ["held out"]}),
        }
    ).save_to_disk(saved)
    out = str(tmp_path / "o.rox")
    with caplog.at_level(logging.WARNING, logger="grain_rox"):
        assert main(["convert", saved, "-o", out, "--no-progress"]) == 0
    assert tokens_of(out) == [97, 98, 256, 99, 256]
    assert (
        f"{saved}: converting its 'train' split only (2 rows); splits ['test'] are left out; "
        f"pass a split's folder (e.g. {saved}/test) to convert it"
    ) in caplog.text
    test_out = str(tmp_path / "t.rox")
    assert main(["convert", f"{saved}/test", "-o", test_out, "--no-progress"]) == 0
    assert tokens_of(test_out) == [*b"held out", 256]


def test_a_dataset_saved_without_rows_is_named_not_a_traceback(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    from grain_rox import HFEagerSource

    saved = str(tmp_path / "empty")
    features = datasets.Features({"text": datasets.Value("string")})
    datasets.Dataset.from_dict({"text": []}, features=features).save_to_disk(saved)
    capsys.readouterr()  # the datasets progress bar
    message = (
        f"{saved} is a dataset saved with no rows (its state.json lists no data files): there "
        "is nothing to read; leave it out, or save the dataset with its rows"
    )
    assert main(["convert", saved, "-o", str(tmp_path / "o.rox"), "--no-progress"]) == 2
    assert capsys.readouterr().err == f"grain-rox convert: error: {message}\n"
    with pytest.raises(ValueError) as info:
        HFEagerSource(saved)
    assert str(info.value) == message


def test_a_damaged_saved_hf_dataset_names_its_arrow_file(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    from grain_rox import HFEagerSource

    saved = tmp_path / "hf"
    datasets.Dataset.from_dict({"text": ["x" * 100] * 100}).save_to_disk(str(saved))
    (arrow,) = saved.glob("*.arrow")
    arrow.write_bytes(arrow.read_bytes()[:5000])  # cut short, as by a full disk or a kill
    capsys.readouterr()
    expected = (
        f"re:{re.escape(str(arrow))} is not a readable Arrow file \\((OSError|ArrowInvalid): "
        f".*\\); save the dataset again \\(save_to_disk\\) and load {re.escape(str(saved))} "
        "anew$"
    )
    with pytest.raises(ValueError) as info:
        HFEagerSource(str(saved))
    assert re.match(expected[3:], str(info.value)), str(info.value)
    assert main(["convert", str(saved), "-o", str(tmp_path / "o.rox")]) == 2
    err = capsys.readouterr().err
    assert re.match(expected[3:], err.removeprefix("grain-rox convert: error: ").strip()), err


@pytest.mark.parametrize(
    ("name", "data", "where"),
    [
        ("a.jsonl", b'{"text": "x"}\n{"text": null}\n', "a.jsonl:2"),
        ("b.json", b'[{"text": "x"}, {"text": null}]', "b.json[1]"),
    ],
)
def test_a_null_text_stops_convert_unless_skipping_is_chosen(tmp_path, capsys, name, data, where):
    path = tmp_path / name
    path.write_bytes(data)
    out = str(tmp_path / "o.rox")
    assert main(["convert", str(path), "-o", out, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path}/{where}: the text is null (missing), and a document cannot be made" in err
    assert "pass --on-null skip (on_null='skip') to skip such records (they are counted)" in err
    assert not os.path.exists(out)
    assert main(["convert", str(path), "-o", out, "--no-progress", "--on-null", "skip"]) == 0
    assert "1 file read, skipped 1 null text;" in capsys.readouterr().out
    assert tokens_of(out) == [120, 256]


def test_read_documents_counts_what_it_skips_when_asked(tmp_path):
    import grain_rox

    (tmp_path / "a.jsonl").write_bytes(b'{"text": "x"}\n{"text": null}\n{"text": "y"}\n')
    (tmp_path / "b.bin").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ValueError, match=r"a\.jsonl:2: the text is null"):
        list(grain_rox.read_documents(tmp_path))
    stats = grain_rox.ReadStats()
    docs = list(grain_rox.read_documents(tmp_path, on_null="skip", stats=stats))
    assert docs == ["x", "y"]
    assert (stats.files_read, stats.documents, stats.null_texts) == (1, 2, 1)
    assert stats.skipped == {"binary": [str(tmp_path / "b.bin")]}
    assert stats.summary() == "1 file read, skipped 1 file (1 binary) and 1 null text"


def test_a_null_parquet_text_names_its_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["a", "b", None]}), path)
    with pytest.raises(ValueError, match=rf"^{path} row 2: the text is null"):
        list(read_files([str(path)]))
    stats = ReadStats()
    assert list(read_files([str(path)], on_null="skip", stats=stats)) == ["a", "b"]
    assert stats.null_texts == 1


def test_a_utf8_bom_is_not_text(tmp_path):
    """A UTF-8 byte order mark (how some editors mark UTF-8) opened a JSONL file with an
    error pointing at Python's utf-8-sig, and became three tokens of a text file."""
    (tmp_path / "a.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "a"}\n{"text": "b"}\n')
    (tmp_path / "b.txt").write_bytes(b"\xef\xbb\xbfhello")
    (tmp_path / "c.json").write_bytes(b'\xef\xbb\xbf[{"text": "c"}]')
    for name, tokens in (
        ("a.jsonl", [97, 256, 98, 256]),
        ("b.txt", [*b"hello", 256]),
        ("c.json", [99, 256]),
    ):
        out = str(tmp_path / f"{name}.rox")
        assert main(["convert", str(tmp_path / name), "-o", out, "--no-progress"]) == 0
        assert tokens_of(out) == tokens
    bad = tmp_path / "d.txt"  # an error still names the file's own byte offset
    bad.write_bytes(b"\xef\xbb\xbfab\xff")
    with pytest.raises(ValueError, match=r"d\.txt is not UTF-8: byte offset 5 holds 0xff"):
        list(read_files([str(bad)]))


def test_utf16_and_utf32_text_with_a_byte_order_mark_is_read_as_text(tmp_path):
    """Windows tools write UTF-16 with a byte order mark: such a file was skipped as binary
    (a NUL byte at offset 3) and its text lost."""
    text = "héllo\r\nwörld ☃ 𝄞"
    (tmp_path / "a.txt").write_bytes(text.encode("utf-16"))  # the platform's order, with a mark
    (tmp_path / "b.txt").write_bytes(b"\xfe\xff" + text.encode("utf-16-be"))
    (tmp_path / "c.jsonl").write_bytes(
        ('{"text": "xé"}\n{"text": "%s"}\n' % ("y" * 5000)).encode("utf-32")
    )
    (tmp_path / "d.json").write_bytes('[{"text": "z"}]'.encode("utf-16"))
    stats = ReadStats()
    docs = list(read_files(sorted(map(str, tmp_path.iterdir())), stats=stats))
    assert docs == [text, text, "xé", "y" * 5000, "z"]
    assert (stats.files_read, stats.files_skipped) == (4, 0)


def test_text_that_is_not_what_its_byte_order_mark_says_names_the_file(tmp_path):
    bad = tmp_path / "s.txt"
    bad.write_bytes(b"\xff\xfeh\x00\x00\xd8i\x00")  # a lone high surrogate
    with pytest.raises(ValueError) as info:
        list(read_files([str(bad)]))
    assert str(info.value) == (
        f"{bad} opens with a UTF-16 byte order mark but is not UTF-16 text near byte offset 4 "
        "(illegal UTF-16 surrogate); convert it to UTF-8 (e.g. iconv -f UTF-16 -t utf-8), or "
        "pass --encoding-errors replace (encoding_errors='replace') to read it with U+FFFD "
        "replacement characters"
    )
    assert list(read_files([str(bad)], encoding_errors="replace")) == ["h\ufffdi"]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-8-sig"])
def test_a_utf16_file_of_one_json_object_is_said_to_be_one(tmp_path, encoding):
    path = tmp_path / "one.json"
    path.write_bytes('{\n  "text": "hello"\n}\n'.encode(encoding))  # with a byte order mark
    with pytest.raises(
        ValueError, match=r"one\.json holds one JSON object \(keys \['text'\]\), not"
    ):
        list(read_files([str(path)]))


def test_a_large_jsonl_whose_first_line_is_no_record_is_not_read_whole(tmp_path, monkeypatch):
    """To say a file is one JSON object, the reader parsed it whole: a 1 GB JSONL with a
    comment for its first line took 2 GB of memory before its error. Past a size it says what
    line 1 is instead (the limit made small here: the same code path)."""
    from grain_rox._text import _document_readers

    path = tmp_path / "big.jsonl"
    lines = ["# a header line", *(json.dumps({"text": f"doc {i}"}) for i in range(200))]
    path.write_text("\n".join(lines) + "\n")
    read = []
    real = _document_readers.byte_chunks

    def counted(p, size=1 << 20, **kwargs):  # in chunks of 100 bytes: what is read shows
        for chunk in real(p, 100, **kwargs):
            read.append(len(chunk))
            yield chunk

    monkeypatch.setattr(_document_readers, "byte_chunks", counted)
    monkeypatch.setattr(_document_readers, "_WHOLE_JSON_BYTES", 1000)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:1 is not valid JSON: "):
        list(read_files([str(path)]))
    assert sum(read) <= 1100 < path.stat().st_size  # up to the limit, not the whole file
    pretty = tmp_path / "pretty.jsonl"  # a small one is still said to be one object
    pretty.write_text(json.dumps({"text": "x", "n": 1}, indent=2))
    with pytest.raises(ValueError, match=r"pretty\.jsonl holds one JSON object"):
        list(read_files([str(pretty)]))


def test_utf16_without_a_mark_is_skipped_with_the_command_that_converts_it(tmp_path, caplog):
    (tmp_path / "le.txt").write_bytes("no mark here".encode("utf-16-le"))
    (tmp_path / "be.txt").write_bytes("no mark here".encode("utf-16-be"))
    (tmp_path / "zip.bin").write_bytes(b"PK\x03\x04\x00\x00")
    stats = ReadStats()
    with caplog.at_level(logging.WARNING, logger="grain_rox"):
        assert list(read_files(sorted(map(str, tmp_path.iterdir())), stats=stats)) == []
    said = "\n".join(r.getMessage() for r in caplog.records)
    for order, name in (("LE", "le.txt"), ("BE", "be.txt")):
        assert (
            f"skipped {tmp_path / name}: it looks binary (a NUL byte at offset "
            f"{1 if order == 'LE' else 0}; every second byte is NUL, as in UTF-16{order} text "
            f"without a byte order mark: convert it to UTF-8 (iconv -f UTF-16{order} -t utf-8))"
        ) in said
    assert f"skipped {tmp_path / 'zip.bin'}: it looks binary (a NUL byte at offset 4); " in said


@pytest.mark.parametrize(
    ("content", "where", "problem"),
    [
        ('{"text": "a"}\n[1, 2]\n', "a.jsonl:2", "is a JSON array ([1, 2]), not a record"),
        ('{"text": "a"}\n"b"\n', "a.jsonl:2", 'is a JSON str ("b"), not a record'),
        ("[1]", "a.jsonl[0]", "is a JSON int (1), not a record"),
    ],
)
def test_a_jsonl_record_that_is_no_object_says_so(tmp_path, content, where, problem):
    """It was "has no column 'text' (it has int); pass --text-column": no column would do."""
    (tmp_path / "a.jsonl").write_text(content)
    with pytest.raises(ValueError) as info:
        list(read_files([str(tmp_path / "a.jsonl")]))
    assert str(info.value) == (
        f"{tmp_path / where} {problem}: each record must be an object with a 'text' field "
        "holding its text"
    )


def test_a_record_naming_its_text_field_twice_is_an_error_not_the_last_value(tmp_path):
    """JSON keeps the last of two equal keys: the first text was dropped without a word."""
    (tmp_path / "a.jsonl").write_text(
        '{"text": "a", "meta": {"text": "inner"}}\n{"text": "b", "text": "c"}\n'
    )
    (tmp_path / "b.json").write_text('[{"body": "a"}, {"body": "b", "x": 1, "body": "c"}]')
    with pytest.raises(ValueError) as info:
        list(read_files([str(tmp_path / "a.jsonl")]))
    assert str(info.value) == (
        f"{tmp_path / 'a.jsonl'}:2 names the field 'text' more than once; JSON keeps only the "
        "last value, so the others would be lost without a word: write the record with one "
        "'text' field"
    )
    with pytest.raises(ValueError, match=r"b\.json\[1\] names the field 'body' more than once"):
        list(read_files([str(tmp_path / "b.json")], text_column="body"))
    (tmp_path / "e.jsonl").write_text('{"text": "a", "\\u0074ext": "b"}\n')  # one key escaped
    with pytest.raises(ValueError, match=r"e\.jsonl:1 names the field 'text' more than once"):
        list(read_files([str(tmp_path / "e.jsonl")]))
    (tmp_path / "f.jsonl").write_text('{"a/b": "x", "a\\/b": "y"}\n')  # "/" escaped as "\/"
    with pytest.raises(ValueError, match=r"f\.jsonl:1 names the field 'a/b' more than once"):
        list(read_files([str(tmp_path / "f.jsonl")], text_column="a/b"))
    (tmp_path / "c.jsonl").write_text('{"text": "a", "title": "text"}\n{"text": "\\"text\\""}\n')
    assert list(read_files([str(tmp_path / "c.jsonl")])) == ["a", '"text"']  # no key twice


def test_a_line_longer_than_a_read_is_joined_once():
    """Each chunk of a line that had not ended was joined to all before it: a 200 MB JSONL
    line took 33 s and 2.5 GB. Now the pieces are joined once, when the line ends."""
    from grain_rox._text._text_files import lines

    piece = b"x" * (1 << 20)
    chunks = [piece] * 64 + [b"y\nz", b"", b"\n", b"w"]
    joined = list(lines(chunks))
    n = 64 * len(piece)
    assert [(o, len(t)) for o, t in joined] == [(0, n + 1), (n + 2, 1), (n + 4, 1)]
    assert joined[0][1].endswith(b"xy") and joined[1][1] == b"z" and joined[2][1] == b"w"


def test_parquet_text_columns_of_every_string_kind_and_bytes_that_are_not_utf8(tmp_path, capsys):
    """A dictionary-encoded string column (pandas, Spark) was refused as "not text"; bytes
    that are not UTF-8 in a string column were a bare codec error naming no file or row."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": pa.array(["ab", "c", "ab"]).dictionary_encode()}),
                   tmp_path / "dict.parquet")  # fmt: skip
    out = str(tmp_path / "d.rox")
    assert main(["convert", str(tmp_path / "dict.parquet"), "-o", out, "--no-progress"]) == 0
    assert tokens_of(out) == [97, 98, 256, 99, 256, 97, 98, 256]
    bad = tmp_path / "bad.parquet"
    pq.write_table(
        pa.table({"text": pa.array([b"ok", b"ab\xffcd"], pa.binary()).view(pa.string())}), bad
    )
    capsys.readouterr()
    assert main(["convert", str(bad), "-o", str(tmp_path / "b.rox"), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"grain-rox convert: error: {bad} row 1: column 'text' holds bytes that are not UTF-8 "
        "(invalid start byte at byte 2), though Arrow strings must be; rewrite the file with "
        "valid UTF-8 text (e.g. decode the source with errors='replace' before writing it)\n"
    )


def test_a_saved_dataset_whose_strings_are_not_utf8_names_the_row_as_parquet_does(tmp_path, capsys):
    """Bytes that are not UTF-8 in a saved dataset's string column were a bare codec error
    ("'utf-8' codec can't decode byte 0xff ..."), naming no dataset or row."""
    datasets = pytest.importorskip("datasets")
    import pyarrow as pa

    bad = str(tmp_path / "saved")
    texts = pa.array([b"ok", b"ab\xffcd"], pa.binary()).view(pa.string())
    datasets.Dataset(pa.table({"text": texts})).save_to_disk(bad)
    capsys.readouterr()  # the datasets progress bar
    assert main(["convert", bad, "-o", str(tmp_path / "b.rox"), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"grain-rox convert: error: {bad} row 1: column 'text' holds bytes that are not UTF-8 "
        "(invalid start byte at byte 2), though Arrow strings must be; rewrite the file with "
        "valid UTF-8 text (e.g. decode the source with errors='replace' before writing it)\n"
    )
    assert not (tmp_path / "b.rox").exists()


def test_jsonl_with_lone_cr_line_endings_names_them(tmp_path):
    """Old Mac line endings made one line of all records: "Extra data", nothing more."""
    path = tmp_path / "cr.jsonl"
    path.write_bytes(b'{"text": "a"}\r{"text": "b"}\r')
    with pytest.raises(ValueError) as info:
        list(read_documents(str(path)))
    assert str(info.value) == (
        f"{path}:1 is not valid JSON: Extra data: line 1 column 15 (char 14); its records end in "
        "a lone CR (old Mac line endings): convert them to LF (e.g. tr '\\r' '\\n')"
    )
    path.write_bytes(b'{"text": "a"}\r\n{"text": "b"}\r\n')  # CRLF: read as before
    assert list(read_documents(str(path))) == ["a", "b"]
