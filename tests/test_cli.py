"""grain-rox convert / inspect / verify, run through main(argv) and as a console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from grain_rox import open_rox
from grain_rox._text._convert import tokenize_in_order
from grain_rox._text._tokenizers import ByteTokenizer
from grain_rox.cli import main


def tokens_of(path: str) -> list[int]:
    with open_rox(path) as corpus:
        return corpus.tokens(0, corpus.num_tokens).tolist()


def test_convert_text_directory_one_document_per_file_in_sorted_order(tmp_path, capsys):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "b.txt").write_text("bb")
    (src / "a.txt").write_text("a")
    (src / "sub" / "c.md").write_text("c")
    (src / ".hidden").write_text("never")
    out = str(tmp_path / "out" / "t.rox")
    os.makedirs(os.path.dirname(out))
    assert main(["convert", str(src), "-o", out, "--block-size", "8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("wrote 3 documents, 7 bytes tokens (uint16)")
    # The tokenizer in use, and that the byte tokenizer was a default nobody asked for.
    assert lines[1] == (
        "tokenizer   bytes (vocabulary 257, EOS 256): the default, one token per UTF-8 byte; "
        "pass --tokenizer cl100k_base, o200k_base or a tokenizer.json for subword tokens"
    )
    assert tokens_of(out) == [97, 256, 98, 98, 256, 99, 256, 256]


def test_convert_jsonl_with_cl100k_gives_exact_ids(tmp_path, capsys):
    pytest.importorskip("tiktoken")
    src = tmp_path / "docs.jsonl"
    src.write_text(
        json.dumps({"body": "hello world", "id": 1}) + "\n\n" + json.dumps({"body": "hello"}) + "\n"
    )
    out = str(tmp_path / "c.rox")
    code = main(
        [
            "convert",
            str(src),
            "-o",
            out,
            "--tokenizer",
            "cl100k_base",
            "--text-column",
            "body",
            "--block-size",
            "20",
            "--workers",
            "2",
        ]
    )
    assert code == 0
    out_lines = capsys.readouterr().out.splitlines()
    assert out_lines[1] == "tokenizer   cl100k_base (vocabulary 100,277, EOS 100257)"
    with open_rox(out) as corpus:
        assert corpus.dtype == np.uint32
        assert corpus.tokens(0, 5).tolist() == [15339, 1917, 100257, 15339, 100257]
        assert corpus.tokenizer is not None and corpus.tokenizer["name"] == "cl100k_base"
        assert corpus.num_documents == 2


def test_convert_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    src = str(tmp_path / "d.parquet")
    pq.write_table(pa.table({"text": ["xy", None, "z"], "n": [1, 2, 3]}), src)
    out = str(tmp_path / "p.rox")
    assert main(["convert", src, "-o", out, "--block-size", "4", "--on-null", "skip"]) == 0
    assert tokens_of(out) == [120, 121, 256, 122, 256, 256]


def test_convert_builtin_corpus_is_deterministic(tmp_path):
    a, b = str(tmp_path / "a.rox"), str(tmp_path / "b.rox")
    for out in (a, b):
        assert main(["convert", "--builtin", "prose", "--limit", "5", "-o", out]) == 0
    assert open(a, "rb").read() == open(b, "rb").read()
    with open_rox(a) as corpus:
        assert corpus.num_documents == 5 and corpus.num_tokens > 1000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["convert", "-o", "x.rox"], "give input paths or --builtin"),
        (["convert", "missing.txt", "-o", "x.rox"], "input 'missing.txt' does not exist"),
        (["convert", "docs.jsonl", "-o", "x.rox"], "has no column 'text'"),
        (["convert", "docs.jsonl", "-o", "x.rox", "--tokenizer", "gpt9"], "gpt9"),
        (["inspect", "nothing.rox"], "no .rox shard found for 'nothing.rox'"),
        (["verify", "empty*.rox"], "no .rox shard matches the glob 'empty*.rox'"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"grain-rox {argv[0]}: error:") and message in err
    assert not (tmp_path / "x.rox").exists()


def test_convert_refuses_to_overwrite_without_if_exists(tmp_path, capsys):
    src = tmp_path / "a.txt"
    src.write_text("abc")
    out = str(tmp_path / "o.rox")
    assert main(["convert", str(src), "-o", out]) == 0
    capsys.readouterr()
    assert main(["convert", str(src), "-o", out]) == 2
    err = capsys.readouterr().err  # the flags a CLI user types, not the Python keywords
    assert f"{out} exists; pass --if-exists append to add to it (copy-on-write) or " in err
    assert "--if-exists overwrite to replace it" in err and "if_exists" not in err
    assert main(["convert", str(src), "-o", out, "--if-exists", "append"]) == 0
    with open_rox(out) as corpus:
        assert corpus.num_documents == 2


def test_appending_to_a_sharded_set_names_the_flag_it_needs(tmp_path, capsys):
    src = tmp_path / "a.txt"
    src.write_text("z" * 100)
    out = str(tmp_path / "s.rox")
    sharded = ["--block-size", "64", "--max-shard-bytes", "200"]
    assert main(["convert", str(src), "-o", out, *sharded]) == 0
    assert main(["convert", str(src), "-o", out, "--if-exists", "append"]) == 2
    err = capsys.readouterr().err
    assert "pass --max-shard-bytes to append new shards" in err and "max_shard_bytes" not in err


@pytest.mark.parametrize(
    ("message", "command", "expected"),
    [
        (
            "pass if_exists='overwrite' to replace",
            "convert",
            "pass --if-exists overwrite to replace",
        ),
        ("block_size=10 is not a multiple", "convert", "--block-size 10 is not a multiple"),
        ("is eos_id=7 right?", "export", "is --eos-id 7 right?"),
        # Already bilingual: kept as is (the Python spelling helps library users too).
        ("pass overwrite=True (--overwrite)", "export", "pass overwrite=True (--overwrite)"),
        # inspect and verify cannot write: the keyword stays, with the convert flag beside it.
        (
            "run the write again with if_exists='overwrite'",
            "inspect",
            "run the write again with if_exists='overwrite' (grain-rox convert --if-exists "
            "overwrite)",
        ),
        ("pass if_exists='append'", "export", "pass if_exists='append'"),  # no such flag there
    ],
)
def test_cli_wording_spells_keywords_as_flags(message, command, expected):
    from grain_rox.cli import cli_wording

    assert cli_wording(message, command) == expected


def test_inspect_and_verify_name_the_convert_flag_beside_the_keyword(tmp_path, capsys):
    src = tmp_path / "a.txt"
    src.write_text("w" * 100)
    out = str(tmp_path / "set.rox")
    sharded = ["--block-size", "64", "--max-shard-bytes", "200"]
    assert main(["convert", str(src), "-o", out, *sharded]) == 0
    manifest = tmp_path / "set.manifest.json"
    data = json.loads(manifest.read_text())
    data["version"], data["pending"] = 1, {"set_0002.rox": {}}  # an old writer's pending list
    manifest.write_text(json.dumps(data))
    capsys.readouterr()
    fix = "if_exists='overwrite' (grain-rox convert --if-exists overwrite)"
    assert main(["inspect", out]) == 2
    assert fix in capsys.readouterr().err
    assert main(["verify", out]) == 1
    assert fix in capsys.readouterr().out


def test_inspect_reports_tokens_without_padding_and_the_padding(tmp_path, capsys):
    out = str(tmp_path / "two.rox")
    assert main(["convert", "--builtin", "prose", "--limit", "2", "-o", out]) == 0
    capsys.readouterr()
    with open_rox(out) as corpus:
        everything = corpus.num_tokens  # the library's count: padding included (unchanged)
        stream = corpus.tokens(0, everything)
    # Padding repeats the EOS id (256) after the last document's own EOS; bytes are < 256.
    real = int(np.flatnonzero(stream != 256)[-1]) + 2  # through the last document's EOS
    assert 0 < everything - real < 2048  # less than one 4096-byte block of uint16
    assert main(["inspect", out, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["tokens"] == everything
    assert (info["document_tokens"], info["padding_tokens"]) == (real, everything - real)
    assert info["files"][0]["padding_tokens"] == everything - real
    assert main(["inspect", out]) == 0
    text = capsys.readouterr().out
    assert f"tokens      {real:,} (documents and their EOS, no padding)" in text
    assert f"padding     {everything - real:,} (filling each write's last block; " in text
    # Without a manifest nobody knows the padding: said so, never guessed.
    os.remove(tmp_path / "two.manifest.json")
    assert main(["inspect", out, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["padding_tokens"], info["document_tokens"]) == (None, None)
    assert main(["inspect", out]) == 0
    text = capsys.readouterr().out
    assert "padding     unknown" in text and f"tokens      {everything:,} (block padding" in text


def test_inspect_json_describes_shards_and_manifest(tmp_path, capsys):
    src = tmp_path / "a.txt"
    src.write_text("x" * 100)
    out = str(tmp_path / "s.rox")
    assert (
        main(["convert", str(src), "-o", out, "--block-size", "64", "--max-shard-bytes", "200"])
        == 0
    )
    capsys.readouterr()
    assert main(["inspect", out, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["shards"], info["dtype"], info["block_size"], info["blocks"]) == (
        2,
        "uint16",
        64,
        4,
    )
    assert (info["tokens"], info["documents"], info["eos_id"]) == (128, 1, 256)
    assert (info["document_tokens"], info["padding_tokens"]) == (101, 27)
    assert [os.path.basename(f["path"]) for f in info["files"]] == ["s_0000.rox", "s_0001.rox"]
    assert all(len(f["sha256"]) == 64 for f in info["files"])
    assert main(["inspect", out]) == 0
    text = capsys.readouterr().out
    assert "tokens      101 (documents" in text and "padding     27 (" in text
    assert "s_0001.rox" in text and "tokenizer   bytes" in text


def test_verify_reports_every_damaged_shard_and_exits_1(tmp_path, capsys):
    src = tmp_path / "a.txt"
    src.write_text("y" * 150)
    out = str(tmp_path / "v.rox")
    assert (
        main(["convert", str(src), "-o", out, "--block-size", "64", "--max-shard-bytes", "200"])
        == 0
    )
    assert main(["verify", out]) == 0
    assert "3 of 3 shards OK" in capsys.readouterr().out
    shard1, shard2 = tmp_path / "v_0001.rox", tmp_path / "v_0002.rox"
    data = bytearray(shard1.read_bytes())
    data[3] ^= 0xFF  # a flipped data byte: only the checksum can see it
    shard1.write_bytes(bytes(data))
    shard2.write_bytes(shard2.read_bytes()[:-5])  # a truncated tail
    assert main(["verify", str(tmp_path)]) == 1
    out_text = capsys.readouterr().out
    assert "OK   " + str(tmp_path / "v_0000.rox") in out_text
    assert "FAIL " + str(shard1) + ": sha256" in out_text
    assert "FAIL " + str(shard2) + ": the last 8 bytes are" in out_text
    assert "1 of 3 shards OK; 2 damaged" in out_text
    assert main(["verify", str(tmp_path), "--no-checksums"]) == 1


def test_console_script_runs_quietly_when_not_a_terminal(tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("hello")
    out = str(tmp_path / "q.rox")
    exe = os.path.join(os.path.dirname(sys.executable), "grain-rox")
    proc = subprocess.run(
        [exe, "convert", str(src), "-o", out], capture_output=True, text=True, check=True
    )
    assert proc.stderr == ""  # no progress bar in a pipe
    assert proc.stdout.startswith("wrote 1 documents, 6 bytes tokens")
    assert proc.stdout.splitlines()[1].startswith("tokenizer   bytes (vocabulary 257, EOS 256)")


def test_tokenize_in_order_keeps_order_across_threads_and_chunks():
    docs = [f"doc {i} " * (i % 7) for i in range(500)]
    tok = ByteTokenizer()
    got = list(tokenize_in_order(iter(docs), tok, workers=2, chunk_chars=50))
    assert [a.tolist() for a in got] == [tok.encode(d).tolist() for d in docs]


def test_convert_a_huggingface_dataset_saved_on_disk(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    saved = str(tmp_path / "hf_ds")
    datasets.Dataset.from_dict({"body": ["ab", "c", None], "n": [1, 2, 3]}).save_to_disk(saved)
    out = str(tmp_path / "h.rox")
    args = ["--text-column", "body", "--block-size", "4", "--on-null", "skip"]
    assert main(["convert", saved, "-o", out, *args]) == 0
    assert tokens_of(out) == [97, 98, 256, 99, 256, 256]
    assert main(["convert", saved, "-o", str(tmp_path / "x.rox")]) == 2
    assert "has no column 'text'" in capsys.readouterr().err
