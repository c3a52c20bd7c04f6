"""grain-rox convert / inspect / verify, run through main(argv) and as a console script."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from _corpora import unsealed

from grain_rox import RoxDocumentSource, open_rox, write_rox
from grain_rox._text._tokenize_ahead import tokenize_in_order
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
        (
            ["convert", "a.txt", "-o", "x.rox", "--tokenizer", "bad.json"],
            "bad.json is not a Hugging Face tokenizer.json (Exception: expected",
        ),
        (
            ["convert", "a.txt", "-o", "x.rox", "--record-dtype", "uint16"],
            "--record-dtype uint16 applies to ArrayRecord token documents only, and a.txt is read",
        ),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    (tmp_path / "a.txt").write_text("some text\n")
    (tmp_path / "bad.json").write_text('{"a" 1}')
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"grain-rox {argv[0]}: error:") and message in err
    assert not (tmp_path / "x.rox").exists()


@pytest.mark.parametrize(
    ("flag", "value"), [("--limit", "0"), ("--limit", "-1"), ("--workers", "0"), ("--limit", "x")]
)
def test_a_count_flag_below_1_is_refused_before_anything_is_read(tmp_path, capsys, flag, value):
    (tmp_path / "a.txt").write_text("some text\n")
    out = tmp_path / "x.rox"
    with pytest.raises(SystemExit) as exit_:
        main(["convert", str(tmp_path / "a.txt"), "-o", str(out), flag, value])
    assert exit_.value.code == 2
    assert f"argument {flag}: '{value}' is not a count of at least 1" in capsys.readouterr().err
    assert not out.exists()


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
    manifest.write_text(json.dumps(unsealed(data)))
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
    # without checksums, the flipped shard's mtime is the one sign of its change (set here:
    # a write right after the conversion may share its coarse timestamp)
    os.utime(shard1, ns=(shard1.stat().st_atime_ns, shard1.stat().st_mtime_ns + 10**9))
    assert main(["verify", str(tmp_path), "--no-checksums"]) == 1
    lines = capsys.readouterr().out.splitlines()
    flipped = next(line for line in lines if line.startswith(f"OK   {shard1}: "))
    assert flipped.endswith("checksum none; WARN: modified since it was written (its mtime is "
                            "not the manifest's), so only its checksum can tell whether its "
                            "tokens changed; reading it hashes it and refuses a mismatch. Fix: "
                            "run grain-rox verify without --no-checksums")  # fmt: skip
    untouched = next(line for line in lines if line.startswith(f"OK   {tmp_path / 'v_0000'}"))
    assert untouched.endswith("checksum none")
    # beside a healthy set, a set whose one shard lost its footer: no dtype to show ('?')
    two = tmp_path / "two"
    for name in ("l", "m"):
        assert main(["convert", str(src), "-o", str(two / f"{name}.rox")]) == 0
    (two / "l.rox").write_bytes((two / "l.rox").read_bytes()[:-5])
    assert main(["verify", str(two)]) == 1
    said = capsys.readouterr().out
    assert f"set {two / 'l'}: one shard, dtype unreadable\n" in said
    assert f"set {two / 'm'}: one shard, uint16\n" in said


def test_verify_refuses_a_manifest_whose_token_count_is_not_the_shards(tmp_path, capsys):
    out = tmp_path / "v.rox"
    assert main(["convert", "--builtin", "prose", "--limit", "3", "-o", str(out)]) == 0
    manifest = tmp_path / "v.manifest.json"
    data = json.loads(manifest.read_text())
    data["shards"]["v.rox"]["num_tokens"] -= 1
    manifest.write_text(json.dumps(unsealed(data)))
    assert main(["verify", str(out)]) == 1
    text = capsys.readouterr().out
    assert f"FAIL {out}: the manifest {manifest} records " in text
    assert "tokens but the shard holds" in text and "edited or belongs to other data" in text


def test_console_script_runs_quietly_when_not_a_terminal(tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("hello")
    out = str(tmp_path / "q.rox")
    exe = os.path.join(os.path.dirname(sys.executable), "grain-rox")
    proc = subprocess.run(
        [exe, "convert", str(src), "-o", out], capture_output=True, text=True, check=True
    )
    assert proc.stderr == ""  # no progress bar in a pipe
    assert proc.stdout.startswith("wrote 1 document, 6 bytes tokens")
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


def test_verify_tells_two_shard_sets_of_different_dtypes_apart(tmp_path, capsys):
    """The README's case: a uint32 set and a uint16 set side by side are two sets, not damage."""
    data = tmp_path / "data"
    data.mkdir()
    src = tmp_path / "a.txt"
    src.write_text("x" * 150)
    code = ["convert", str(src), "-o", str(data / "code.rox"), "--block-size", "64"]
    assert main([*code, "--max-shard-bytes", "200"]) == 0  # bytes tokens, uint16: 3 shards
    write_rox([np.arange(20, dtype=np.uint32)], str(data / "train.rox"), separator=0)
    capsys.readouterr()
    assert main(["verify", str(data)]) == 0
    d = str(data)
    assert capsys.readouterr().out.splitlines() == [
        f"set {d}/code: three shards, uint16",
        f"OK   {d}/code_0000.rox: 2 blocks, checksum ok",
        f"OK   {d}/code_0001.rox: 2 blocks, checksum ok",
        f"OK   {d}/code_0002.rox: 1 blocks, checksum ok",
        f"set {d}/train: one shard, uint32",
        f"OK   {d}/train.rox: 1 blocks, checksum ok",
        "4 of 4 shards OK, in two shard sets",
        f"two shard sets of different dtypes: {d}/code (uint16), {d}/train (uint32); different "
        "sets, not damage: one corpus holds one dtype, so open each set on its own (e.g. "
        f"grain-rox inspect {d}/code.rox, open_rox('{d}/code.rox')), not all as one corpus",
    ]
    # Damage is still damage, inside a set: a uint32 shard among uint16 ones.
    (data / "code_0003.rox").write_bytes((data / "train.rox").read_bytes())
    assert main(["verify", str(data), "--json"]) == 1
    reports = {os.path.basename(r["path"]): r for r in json.loads(capsys.readouterr().out)}
    assert (reports["code_0003.rox"]["set"], reports["train.rox"]["dtype"]) == (
        f"{d}/code",
        "uint32",
    )
    # (named by the set's manifest first: the shard is none of the set's)
    assert reports["code_0003.rox"]["problem"].startswith(
        f"1 file(s) named like shards of this set are not in its manifest {d}/code.manifest.json "
        "(code_0003.rox)"
    )
    assert reports["train.rox"]["problem"] is None
    # without a manifest, by the set's first shard
    os.remove(data / "code.manifest.json")
    assert main(["verify", str(data), "--json"]) == 1
    reports = {os.path.basename(r["path"]): r for r in json.loads(capsys.readouterr().out)}
    assert reports["code_0003.rox"]["problem"].startswith(
        f"its dtype is uint32 but {d}/code_0000.rox (the corpus's first shard) is uint16"
    )


def run_in_a_terminal(*args: str, cwd: object = None) -> tuple[str, str]:
    """Run the installed ``grain-rox`` with stderr on a real pseudo-terminal (250 columns):
    returns (stdout, what the terminal showed)."""
    import fcntl
    import struct
    import termios

    exe = os.path.join(os.path.dirname(sys.executable), "grain-rox")
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 250, 0, 0))
    proc = subprocess.Popen(
        [exe, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, cwd=cwd
    )
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # the terminal closed: the process has exited
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    stdout = proc.stdout.read().decode() if proc.stdout else ""
    assert proc.wait() == 0, shown.decode()
    return stdout, shown.decode()


def last_frames(shown: str) -> list[str]:
    """Each progress bar's final frame, as the terminal was left showing it (log lines,
    which have no frames, left out)."""
    frames = [line.rsplit("\r", 1)[-1] for line in shown.split("\r\n")]
    return [frame for frame in frames if "%|" in frame]


def test_progress_bars_show_a_total_percent_and_eta_on_a_terminal(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a" * 1_500_000)
    (src / "b.jsonl").write_text('{"text": "bb"}\n' * 40_000)  # 600,000 bytes
    (src / "c.bin").write_bytes(b"\0" * 100_000)  # skipped, but its bytes count as read
    stdout, shown = run_in_a_terminal("convert", "src", "-o", "o.rox", cwd=tmp_path)
    assert stdout.startswith("wrote 40001 documents, 1620001 bytes tokens (uint16)")
    # The log line of the skipped file is printed above the bar, not through it.
    assert (
        "\rskipped src/c.bin: it looks binary (a NUL byte at offset 0); pass --on-binary " in shown
    )
    converting, verifying = last_frames(shown)
    # The total: the inputs' bytes, 1,500,000 + 600,000 + 100,000; then the shard's, hashed.
    size = os.path.getsize(tmp_path / "o.rox")
    frame = r"100%\|█+\| {0}/{0} \[\d\d:\d\d<00:00, +[\d.]+[kMG]?{1}/s\]"
    assert re.fullmatch(r"converting src \(bytes\): " + frame.format("2.20MB", "B"), converting)
    shard = f"{size / 1e6:.2f}MB"
    assert re.fullmatch("verifying o.rox: " + frame.format(re.escape(shard), "B"), verifying)
    stdout, shown = run_in_a_terminal("verify", "o.rox", cwd=tmp_path)
    assert stdout.splitlines()[-1] == "1 of 1 shards OK"
    [verifying] = last_frames(shown)
    assert re.fullmatch("verifying o.rox: " + frame.format(re.escape(shard), "B"), verifying)
    # Where only the number of documents is known (--limit), the bar counts documents to it.
    args = ["convert", "src", "-o", "l.rox", "--limit", "7", "--no-verify"]
    _, shown = run_in_a_terminal(*args, cwd=tmp_path)
    [converting] = last_frames(shown)
    assert re.fullmatch(r"converting src \(bytes\): " + frame.format("7", "doc"), converting)


def test_reading_reports_the_bytes_of_every_input_file_as_it_goes(tmp_path):
    import gzip

    from grain_rox._text._convert import expand_inputs, input_bytes, read_files

    (tmp_path / "a.txt").write_bytes(b"x" * (5 << 19))  # 2.5 MiB: three 1 MiB reads
    (tmp_path / "b.bin").write_bytes(b"\0\1")  # skipped
    with gzip.open(tmp_path / "c.jsonl.gz", "wb") as f:
        f.write(b'{"text": "c"}\n' * 1000)
    (tmp_path / "d.txt").write_bytes(b"")  # skipped
    files = expand_inputs([str(tmp_path)])
    read: list[int] = []
    docs = read_files(files, on_bytes=read.append)
    assert next(docs) == "x" * (5 << 19)
    assert read == [1 << 20, 1 << 20, 1 << 19]  # the first file, as it was read
    assert list(docs) == ["c"] * 1000
    gz = os.path.getsize(tmp_path / "c.jsonl.gz")
    assert read[3:] == [2, gz]
    assert sum(read) == input_bytes(files) == (5 << 19) + 2 + gz


def test_verify_reports_the_bytes_it_hashes(tmp_path):
    from grain_rox._format._verify import shard_sizes, verify_rox

    path = str(tmp_path / "h.rox")
    write_rox([np.arange(3 << 20, dtype=np.uint32)], path, separator=0, max_shard_bytes=9 << 20)
    sizes = [os.path.getsize(tmp_path / f"h_000{i}.rox") for i in range(2)]
    read: list[int] = []
    assert all(r.ok for r in verify_rox(path, on_bytes=read.append))
    assert read == [8 << 20, sizes[0] - (8 << 20), sizes[1]]  # 8 MiB hash reads, then the rest
    assert sum(read) == shard_sizes(path) == sum(sizes)
    read.clear()
    verify_rox(path, checksums=False, on_bytes=read.append)
    assert read == sizes  # not hashed: each shard's bytes at once


PNG = b"\x89PNG\r\n\x1a\n"


def test_inspect_plots_the_document_lengths(tmp_path, capsys):
    wide = str(tmp_path / "wide.rox")  # lengths 3 .. 1000: over 100x, a log-scaled x axis
    write_rox(["abc", "hello", "x" * 10, "y" * 1000], wide, tokenizer="bytes", block_size=64)
    png = str(tmp_path / "hist.png")
    assert main(["inspect", wide, "--plot", png]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == (
        "plotted 4 documents, tokens per document (EOS not counted): min 3, median 7.5, "
        f"max 1,000, log-scaled x; wrote {png}"
    )
    with open(png, "rb") as f:
        assert f.read(8) == PNG
    narrow = str(tmp_path / "narrow.rox")
    write_rox(["abc", "hello", "x" * 10], narrow, tokenizer="bytes", block_size=64)
    svg = str(tmp_path / "hist.svg")  # the suffix picks the format
    assert main(["inspect", narrow, "--plot", svg, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["plot"] == {
        "path": svg,
        "documents": 3,
        "min": 3,
        "median": 5.0,
        "max": 10,
        "log_x": False,
        "summary": "3 documents, tokens per document (EOS not counted): min 3, median 5, max 10",
    }
    with open(svg) as f:
        assert "<svg" in f.read(2000)


def test_plotted_lengths_leave_out_padding_and_say_what_the_manifest_counts(tmp_path, capsys):
    from grain_rox._cli._plot import document_lengths

    path = str(tmp_path / "p.rox")  # a pad token (9) that is not the EOS (0), then an append
    docs = [np.array([5, 6, 7], np.uint16), np.array([], np.uint16)]
    write_rox(docs, path, separator=0, pad_id=9, block_size=16)
    more = [np.array([9, 8], np.uint16)]
    write_rox(more, path, separator=0, pad_id=9, block_size=16, if_exists="append")
    with open_rox(path) as corpus:
        assert corpus.num_tokens == 16
        assert corpus.tokens(0, 8).tolist() == [5, 6, 7, 0, 0, 9, 9, 9]
        assert corpus.tokens(8, 16).tolist() == [9, 8, 0, 9, 9, 9, 9, 9]
        # the first write's padding is not part of the next document, which begins with the
        # pad id: [9, 8], not 9 9 9 9 8, nor [8] (the pad id guessed as padding)
        assert document_lengths(corpus, 0).tolist() == [3, 2]
    png = str(tmp_path / "p.png")
    assert main(["inspect", path, "--plot", png]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "plotted 2 documents, tokens per document (EOS not counted): min 2, median 2.5, max 3 "
        "(the manifests record 3 documents: empty ones, or an EOS id inside documents, make "
        f"the difference); wrote {png}"
    )


def test_inspect_plot_without_an_eos_id_or_matplotlib_says_what_to_do(
    tmp_path, capsys, monkeypatch
):
    path = str(tmp_path / "bare.rox")  # no manifest, as roxxel writes
    write_rox(
        [np.array([5, 6], np.uint16), np.array([7], np.uint16)], path, separator=0, manifest=False
    )
    png = str(tmp_path / "h.png")
    assert main(["inspect", path, "--plot", png]) == 2
    assert capsys.readouterr().err == (
        f"grain-rox inspect: error: {path}: no EOS id to find the documents at (the shards "
        "have no manifest, or their manifests disagree); pass --eos-id\n"
    )
    assert main(["inspect", path, "--plot", png, "--eos-id", "0"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "plotted 2 documents, tokens per document (EOS not counted): min 1, median 1.5, max 2; "
        f"wrote {png}"
    )
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as if not installed
    assert main(["inspect", path, "--plot", png, "--eos-id", "0"]) == 2
    assert capsys.readouterr().err == (
        "grain-rox inspect: error: drawing the histogram (--plot) needs matplotlib: "
        "pip install matplotlib\n"
    )


def test_log_lines_are_printed_above_the_progress_bars(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a" * 1_500_000)
    (src / "c.bin").write_bytes(b"\0" * 1000)
    args = ("convert", "src", "-o", "o.rox", "--log-level", "info")
    _, shown = run_in_a_terminal(*args, cwd=tmp_path)
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "
    logged = [
        re.sub(stamp, "", line.rsplit("\r", 1)[-1])
        for line in shown.split("\r\n")
        if re.search(stamp, line)
    ]
    assert [re.sub(r", \d+\.\ds;", ", <t>;", line) for line in logged] == [
        "INFO grain_rox: converting 2 files (src; format auto) into o.rox with the bytes "
        "tokenizer (the default)",
        "WARNING grain_rox: skipped src/c.bin: it looks binary (a NUL byte at offset 0); pass "
        "--on-binary error to stop instead",
        "INFO grain_rox: published 1 shard(s) of o; manifest o.manifest.json",
        "INFO grain_rox: converted into o.rox: 1 document, 1500001 tokens (uint16, no "
        "padding), 1 shard(s), <t>; 1 file read, skipped 1 file (1 binary); manifest "
        "o.manifest.json",
        "INFO grain_rox: verifying 1 shard (structure and checksums)",
        "INFO grain_rox: verified 1 shard in 1 set: 1 sound, 0 damaged",
    ]
    converting, verifying = last_frames(shown)  # each bar drawn whole, below the lines
    assert converting.startswith("converting src (bytes): 100%|")
    assert verifying.startswith("verifying o.rox: 100%|")


# ---- convert --runner (Apache Beam; needs the [beam] extra) -----------------------------------
BEAM_TWO_PROCESSES = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]


@pytest.mark.slow  # two Beam worker processes: ~15 s here
def test_convert_runner_on_array_record_token_documents_equals_the_local_conversion(
    tmp_path, capsys
):
    pytest.importorskip("apache_beam")
    from array_record.python.array_record_module import ArrayRecordWriter

    rng = np.random.default_rng(7)
    for part in range(2):
        writer = ArrayRecordWriter(str(tmp_path / f"part-{part}.array_record"), "group_size:1")
        for _ in range(40):
            writer.write(rng.integers(0, 256, rng.integers(1, 90), dtype=np.uint16).tobytes())
        writer.close()
    common = ["--record-dtype", "uint16", "--block-size", "256", "--max-shard-bytes", "1KiB"]
    inputs = str(tmp_path / "part-*.array_record")
    local, ours = str(tmp_path / "local" / "a.rox"), str(tmp_path / "beam" / "a.rox")
    assert main(["convert", inputs, "-o", local, "--no-progress", *common]) == 0
    capsys.readouterr()
    argv = ["convert", inputs, "-o", ours, *common, "--runner", "DirectRunner"]
    assert main([*argv, *BEAM_TWO_PROCESSES]) == 0
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(
        r"wrote 80 documents, \d+ bytes tokens \(uint16\) into \d+ shard\(s\) on DirectRunner "
        r"in [\d.]+s \([\d,]+ tokens/s\); nothing skipped; manifest .*/beam/a\.manifest\.json",
        out[0],
    )
    assert out[1].startswith("beam counters: 80 documents, ") and out[-1].startswith("verified ")
    names = sorted(n for n in os.listdir(tmp_path / "local") if n.endswith(".rox"))
    assert len(names) >= 2 and names == sorted(
        n for n in os.listdir(tmp_path / "beam") if n.endswith(".rox")
    )
    for name in names:
        assert (tmp_path / "beam" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()


def test_convert_runner_refuses_what_beam_cannot_do_and_unknown_options_stay_errors(
    tmp_path, capsys
):
    src = tmp_path / "a.txt"
    src.write_text("hi")
    out = str(tmp_path / "o.rox")
    with pytest.raises(SystemExit) as info:  # Beam options only with --runner
        main(["convert", str(src), "-o", out, "--direct_num_workers=2"])
    assert info.value.code == 2
    assert "unrecognized arguments: --direct_num_workers=2" in capsys.readouterr().err
    pytest.importorskip("apache_beam")
    assert main(["convert", str(src), "-o", out, "--runner", "DirectRunner", "--workers", "2"]) == 2
    assert "on Beam the runner picks the workers" in capsys.readouterr().err
    argv = ["convert", str(src), "-o", out, "--runner", "DirectRunner", "--limit", "1"]
    assert main(argv) == 2
    assert "select the input files instead" in capsys.readouterr().err
    assert not os.path.exists(out)


def test_inspect_names_the_tokenizer_a_manifest_records_or_none(tmp_path, capsys):
    """A set written from token ids has a manifest with no tokenizer: inspect says so (it said
    "unknown (no manifest)" beside the manifest's path); without a manifest it is unknown."""
    out = str(tmp_path / "ids.rox")
    write_rox([np.arange(1, 50, dtype=np.uint16)], out, separator=0)
    assert main(["inspect", out]) == 0
    assert "tokenizer   none (written as token ids)\n" in capsys.readouterr().out
    os.remove(tmp_path / "ids.manifest.json")
    assert main(["inspect", out]) == 0
    assert "tokenizer   unknown (no manifest)\n" in capsys.readouterr().out


def test_verify_blames_a_broken_manifest_not_the_shards_it_covers(tmp_path, capsys):
    """A manifest that cannot be read leaves its set's shards unchecked: verify says that of
    each (it called each one a damaged shard) and fails."""
    out = str(tmp_path / "m.rox")
    kw = {"separator": 0, "block_size": 64, "max_shard_bytes": 512}
    write_rox([np.arange(1, 600, dtype=np.uint16)], out, **kw)
    (tmp_path / "m.manifest.json").write_text("{not json")
    assert main(["verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    lines = [x for x in out if x.startswith("FAIL")]
    shards = sorted(str(p) for p in tmp_path.glob("m_*.rox"))
    assert len(lines) == len(shards) > 1
    manifest = str(tmp_path / "m.manifest.json")
    # the manifest's problem is said once, the other shards point at it (it was said in full
    # for each), and the summary counts them as not checked, not as damaged
    assert lines[0].startswith(f"FAIL {shards[0]}: not checked: the set's {manifest} is "
                               "unusable: the manifest is not valid")  # fmt: skip
    assert lines[1:] == [f"FAIL {s}: not checked, as above" for s in shards[1:]]
    assert out[-1] == (
        f"0 of {len(shards)} shards OK; {len(shards)} not checked (a file of their set is unusable)"
    )


def test_inputs_expand_to_every_file_a_user_named(tmp_path, capsys):
    """A glob's matched directories are read as if named (they were dropped, unsaid), a link
    to a directory is followed once (it was skipped; a loop ends), a file named like a glob
    (``a[1].txt``) is that file (the glob read ``a1.txt`` instead, or matched nothing)."""
    from grain_rox._text._convert import expand_inputs

    root = tmp_path / "in"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "sub" / "b.txt").write_text("b")
    (root / "sub" / "deeper" / "c.txt").write_text("c")
    (root / "z.txt").write_text("z")
    (root / ".hidden.txt").write_text("hidden")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "s.txt").write_text("s")
    (root / "linked").symlink_to(shared, target_is_directory=True)
    (shared / "back").symlink_to(root, target_is_directory=True)  # a loop through the link
    rel = lambda paths: [os.path.relpath(p, tmp_path) for p in paths]  # noqa: E731
    named = ["in/a.txt", "in/z.txt", "in/linked/s.txt", "in/sub/b.txt", "in/sub/deeper/c.txt"]
    assert rel(expand_inputs([str(root)])) == named
    assert rel(expand_inputs([str(root / "*")])) == [
        "in/a.txt", "in/linked/s.txt", "in/sub/b.txt", "in/sub/deeper/c.txt", "in/z.txt"
    ]  # fmt: skip
    assert rel(expand_inputs([str(root / "su*")])) == ["in/sub/b.txt", "in/sub/deeper/c.txt"]
    # "in/**" matches directories and the files in them: each file read once (it was twice)
    assert rel(expand_inputs([str(root / "**")])) == named
    # a directory named again, or under one named, adds nothing (it was "holds no files")
    assert rel(expand_inputs([str(root), str(root / "sub")])) == named
    assert rel(expand_inputs([str(root / "a.txt")] * 2)) == ["in/a.txt", "in/a.txt"]  # as asked
    # reached through a link, a link back up is still a loop (it read the link's parent)
    (tmp_path / "via").symlink_to(root / "sub", target_is_directory=True)
    (root / "sub" / "up").symlink_to("..", target_is_directory=True)
    assert rel(expand_inputs([str(tmp_path / "via")])) == ["via/b.txt", "via/deeper/c.txt"]
    (root / "sub" / "up").unlink()
    (root / "empty").mkdir()
    assert rel(expand_inputs([str(root / "e*"), str(root / "a.txt")])) == ["in/a.txt"]
    with pytest.raises(FileNotFoundError, match=r"hold no files: what they match are folders"):
        expand_inputs([str(root / "e*")])  # matched, and holds nothing: said so
    with pytest.raises(FileNotFoundError, match=r"the input directory .*empty' holds no files"):
        expand_inputs([str(root / "empty")])
    brackets = tmp_path / "br"
    brackets.mkdir()
    (brackets / "a[1].txt").write_text("THE BRACKET FILE")
    (brackets / "a1.txt").write_text("other file")
    assert rel(expand_inputs([str(brackets / "a[1].txt")])) == ["br/a[1].txt"]
    assert rel(expand_inputs([str(brackets / "a[0-9].txt")])) == ["br/a1.txt"]  # still a glob
    out = tmp_path / "o.rox"
    assert main(["convert", str(brackets / "a[1].txt"), "-o", str(out), "--no-progress"]) == 0
    from grain_rox import open_rox

    corpus = open_rox(str(out))
    assert bytes(corpus.tokens(0, 16).astype(np.uint8)).decode() == "THE BRACKET FILE"
    assert main(["convert", str(root / "*"), "-o", str(tmp_path / "g.rox"), "--no-progress"]) == 0
    assert "5 files read" in capsys.readouterr().out


def test_a_file_both_listed_and_named_is_read_once_in_any_order(tmp_path):
    """A directory then a file in it read the file twice (the other order once), and a glob
    then the directory it matched was "holds no files"; a file named twice is still read
    twice, as asked."""
    from grain_rox._text._convert import expand_inputs

    d = tmp_path / "dup"
    d.mkdir()
    (d / "a.txt").write_text("one")
    (d / "b.txt").write_text("two")
    rel = lambda paths: sorted(os.path.relpath(p, tmp_path) for p in paths)  # noqa: E731
    both = ["dup/a.txt", "dup/b.txt"]
    assert rel(expand_inputs([str(d), str(d / "a.txt")])) == both
    assert rel(expand_inputs([str(d / "a.txt"), str(d)])) == both
    assert rel(expand_inputs([str(d / "*.txt"), str(d)])) == both
    assert rel(expand_inputs([str(d / "a.txt"), str(d / "a.txt"), str(d)])) == [
        "dup/a.txt", "dup/a.txt", "dup/b.txt"
    ]  # fmt: skip


def test_an_output_inside_an_input_directory_is_never_read_back(tmp_path, capsys, caplog):
    """Run again into a directory it reads, convert read its own set back: the old shard was
    skipped as binary, its manifest failed as JSONL, and --format text (the advice) wrote the
    manifest as a training document. The set's own files are left out, and said."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("alpha")
    (corpus / "b.txt").write_text("beta")
    out = str(corpus / "train.rox")
    assert main(["convert", str(corpus), "-o", out, "--no-progress"]) == 0
    for extra in ([], ["--format", "text"]):
        with caplog.at_level("WARNING", logger="grain_rox"):
            code = main(["convert", str(corpus), "-o", out, "--if-exists", "overwrite",
                         "--no-progress", *extra])  # fmt: skip
        assert code == 0
        said = [r.getMessage() for r in caplog.records if "output set's own" in r.getMessage()]
        assert said and "train.manifest.json" in said[-1] and "train.rox" in said[-1]
        with open_rox(out) as written:
            assert written.num_documents == 2
            assert written.tokens(0, 11).tolist() == [*b"alpha", 256, *b"beta", 256]
    only = tmp_path / "only"
    only.mkdir()
    assert main(["convert", str(corpus / "a.txt"), "-o", str(only / "x.rox"), "--no-progress"]) == 0
    assert main(["convert", str(only), "-o", str(only / "x.rox"), "--if-exists", "overwrite",
                 "--no-progress"]) != 0  # fmt: skip
    assert "hold only the output set's own files" in capsys.readouterr().err


def test_limit_reads_no_record_past_the_last_it_converts(tmp_path, capsys):
    """``--limit 2`` read a third record: a malformed one there failed the conversion."""
    src = tmp_path / "l.jsonl"
    src.write_text('{"text": "a"}\n{"text": "b"}\nnot json\n')
    out = str(tmp_path / "l.rox")
    assert main(["convert", str(src), "-o", out, "--limit", "2", "--no-progress"]) == 0
    assert "wrote 2 documents" in capsys.readouterr().out
    corpus = open_rox(out)
    assert corpus.tokens(0, 4).tolist() == [97, 256, 98, 256]


def test_an_output_under_a_file_and_a_broken_link_among_the_inputs(tmp_path, capsys, caplog):
    """An output path under a file was "[Errno 17] File exists"; a link to nothing in an
    input directory stopped the conversion with "[Errno 2]". The first names the file that
    should be a folder; the second is skipped, said and counted like an empty file."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("hi")
    (tmp_path / "in" / "dead").symlink_to(tmp_path / "nowhere")
    bad = str(tmp_path / "afile" / "o.rox")
    assert main(["convert", str(tmp_path / "in"), "-o", bad, "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"grain-rox convert: error: the output path {bad!r} lies under "
        f"{str(tmp_path / 'afile')!r}, which is a file, not a folder; pass an output path "
        "inside a folder\n"
    )
    out = str(tmp_path / "o.rox")
    with caplog.at_level(logging.WARNING, logger="grain_rox"):
        assert main(["convert", str(tmp_path / "in"), "-o", out, "--no-progress"]) == 0
    link = tmp_path / "in" / "dead"
    assert f"skipped {link}: a link to {str(tmp_path / 'nowhere')!r}, which does not exist" in (
        caplog.text
    )
    assert "1 file read, skipped 1 file (1 broken link)" in capsys.readouterr().out
    assert open_rox(out).tokens(0, 3).tolist() == [104, 105, 256]


def test_a_shard_cap_below_one_block_is_refused(tmp_path, capsys):
    """``--max-shard-bytes 1`` quietly wrote one 4,136-byte shard a block."""
    (tmp_path / "a.txt").write_text("hello")
    out = str(tmp_path / "o.rox")
    assert main(["convert", str(tmp_path / "a.txt"), "-o", out, "--max-shard-bytes", "1"]) == 2
    assert capsys.readouterr().err == (
        "grain-rox convert: error: --max-shard-bytes 1 is below one block (--block-size 4096): "
        "a shard holds whole blocks, at least one; pass at least 4096, e.g. 64MiB\n"
    )
    assert not os.path.exists(out)


def test_ctrl_c_ends_with_a_line_not_a_traceback(tmp_path, capsys, monkeypatch):
    import grain_rox.cli as cli

    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "expand_inputs", interrupted)  # as if Ctrl-C came while reading
    (tmp_path / "a.txt").write_text("hello")
    assert main(["convert", str(tmp_path / "a.txt"), "-o", str(tmp_path / "o.rox")]) == 130
    assert capsys.readouterr().err == (
        "grain-rox convert: interrupted (a set is published whole or not at all)\n"
    )


def documents_in(path: str) -> int | None:
    with open_rox(path) as corpus:
        return corpus.num_documents


def run_with_stdout_closed(*args: str) -> subprocess.CompletedProcess:
    """Run the console script with stdout a pipe its reader has already closed (``| head -0``)."""
    exe = os.path.join(os.path.dirname(sys.executable), "grain-rox")
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([exe, *args], stdout=write, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write)


def test_a_closed_stdout_after_the_commit_is_no_failure_and_loses_no_write(tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("hello")
    out = str(tmp_path / "o.rox")
    first = run_with_stdout_closed("convert", str(src), "-o", out)
    assert first.returncode == 0, first.stderr
    assert first.stderr == (
        f"grain-rox convert: wrote {out} (committed and whole), but its summary on stdout could "
        "not be printed: [Errno 32] Broken pipe\n"
    )
    # A retry wrapper saw success: it does not append the same documents again.
    assert documents_in(out) == 1 and tokens_of(out)[:6] == [*b"hello", 256]
    again = run_with_stdout_closed("convert", str(src), "-o", out, "--if-exists", "append")
    assert again.returncode == 0 and "Traceback" not in again.stderr
    assert documents_in(out) == 2


def test_a_full_stdout_after_the_commit_is_said_on_stderr(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    src = tmp_path / "a.txt"
    src.write_text("hi")
    out = str(tmp_path / "o.rox")
    exe = os.path.join(os.path.dirname(sys.executable), "grain-rox")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([exe, "convert", str(src), "-o", out], stdout=full, text=True,
                              stderr=subprocess.PIPE)  # fmt: skip
    assert proc.returncode == 0
    assert proc.stderr.endswith("could not be printed: [Errno 28] No space left on device\n")
    assert documents_in(out) == 1 and tokens_of(out)[:3] == [*b"hi", 256]


def test_inspect_into_a_closed_pipe_ends_quietly_as_sigpipe_would(tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("x" * 50_000)
    out = str(tmp_path / "o.rox")
    assert main(["convert", str(src), "-o", out, "--max-shard-bytes", "4KiB"]) == 0
    proc = run_with_stdout_closed("inspect", out)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_convert_warns_when_it_writes_beside_sets_of_another_tokenizer(tmp_path, caplog):
    """A pipeline over a directory refuses to join sets of two tokenizers; the conversion that
    put a second tokenizer's set there said nothing (the README's advice: a directory each)."""
    src = tmp_path / "a.txt"
    src.write_text("some text\n")
    data = tmp_path / "data"

    def convert(name, *tokenizer):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="grain_rox"):
            assert main(["convert", str(src), "-o", str(data / name), *tokenizer]) == 0
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    assert convert("a.rox") == []
    assert convert("b.rox") == []  # the same tokenizer beside it
    said = convert("c.rox", "--tokenizer", "cl100k_base")
    assert said == [
        f"{data / 'c.rox'} is written beside shard sets of another tokenizer ("
        f"{data / 'a.manifest.json'} (tokenizer 'bytes'); {data / 'b.manifest.json'} (tokenizer "
        "'bytes')): a TokenPipeline over their directory refuses to join them (the same token "
        "id is other text in each); write each tokenizer's sets to a directory of their own"
    ]
    # a set rewritten with another tokenizer: its own old manifest is not named
    said = convert("a.rox", "--tokenizer", "cl100k_base", "--if-exists", "overwrite")
    assert len(said) == 1 and f"beside shard sets of another tokenizer ({data / 'b.manifest.json'}" \
        " (tokenizer 'bytes')): " in said[0]  # fmt: skip


def test_convert_eos_token_chooses_a_tokenizer_jsons_eos(tmp_path, capsys):
    """A tokenizer.json whose EOS is none of the usual tokens (ChatML's '<|im_end|>') could be
    used from Python only (HFTokenizer(eos_token=...)); the error pointed there too."""
    from tokenizers import Tokenizer as HFLib
    from tokenizers import models, pre_tokenizers

    vocab = {"[UNK]": 0, "<|im_end|>": 1, "hello": 2, "world": 3}
    lib = HFLib(models.WordLevel(vocab, unk_token="[UNK]"))
    lib.pre_tokenizer = pre_tokenizers.Whitespace()
    lib.add_special_tokens(["<|im_end|>"])
    tok = tmp_path / "chatml" / "tokenizer.json"
    tok.parent.mkdir()
    lib.save(str(tok))
    src = tmp_path / "a.txt"
    src.write_text("hello world")
    out = str(tmp_path / "o.rox")
    assert main(["convert", str(src), "-o", out, "--tokenizer", str(tok)]) == 2
    assert "pass eos_token= (grain-rox convert --eos-token) naming its" in capsys.readouterr().err
    argv = ["convert", str(src), "-o", out, "--tokenizer", str(tok), "--eos-token", "<|im_end|>"]
    assert main([*argv, "--no-progress"]) == 0
    with open_rox(out) as corpus:
        assert corpus.eos_id == 1 and corpus.tokens(0, 3).tolist() == [2, 3, 1]
    capsys.readouterr()
    bytes_eos = ["convert", str(src), "-o", str(tmp_path / "b.rox"), "--eos-token", "</s>"]
    assert main(bytes_eos) == 2
    assert "eos_token='</s>' chooses a tokenizer.json's EOS, and 'bytes' is not one" in (
        capsys.readouterr().err
    )
    beam = [*argv[:3], str(tmp_path / "c.rox"), *argv[4:], "--runner", "DirectRunner"]
    assert main(beam) == 2
    assert "--eos-token is not sent to Beam workers; put a tokenizer_config.json" in (
        capsys.readouterr().err
    )


def test_a_rox_shard_among_the_inputs_is_never_read_as_text(tmp_path, capsys, caplog):
    """A shard of byte tokens (no manifest: as roxxel writes one) has text-like bytes, an index
    and a footer that pass as UTF-8: it was tokenized as one more document, silently."""
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.txt").write_text("real doc\n")
    write_rox(["0123456789abcdef" * 768], str(src / "old.rox"), block_size=4096, manifest=False)
    (src / "renamed.bin").write_bytes((src / "old.rox").read_bytes())  # by content, not name
    out = str(tmp_path / "out" / "x.rox")
    assert main(["convert", str(src), "-o", out, "--no-progress"]) == 0
    shown = capsys.readouterr()
    docs = RoxDocumentSource(out, seq_len=64)
    assert len(docs) == 1 and bytes(docs[0]["inputs"].astype(np.uint8)) == b"real doc\n"
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"skipped {src / name}: it is a .rox shard: token ids ending in a ROXXEL02 footer, "
        "not text; pass --on-binary error to stop"
        for name in ("old.rox", "renamed.bin")
    ]
    assert "skipped 2 files (2 rox shard)" in shown.out
    again = str(tmp_path / "again" / "x.rox")
    assert main(["convert", str(src), "-o", again, "--no-progress", "--on-binary", "error"]) == 2
    assert capsys.readouterr().err == (
        f"grain-rox convert: error: {src / 'old.rox'} is a .rox shard: token ids ending in a "
        "ROXXEL02 footer, not text; leave it out of the inputs (name the text files, or a glob "
        "of them)\n"
    )


def test_inspect_of_sets_with_different_tokenizers_shows_each(tmp_path, capsys):
    """Sets that disagree gave no shared EOS id or tokenizer, and inspect printed that as
    "eos id None" and "tokenizer none (written as token ids)", although both recorded one."""
    a, b, c = (str(tmp_path / f"{n}.rox") for n in "abc")
    write_rox(["hello"], a, tokenizer="bytes")
    write_rox([np.array([5, 6], np.uint16)], b, separator=0)
    write_rox([np.array([5, 6], np.uint16)], c, separator=0, manifest=False)
    assert main(["inspect", a, b, c]) == 0
    text = capsys.readouterr().out
    assert (
        "eos id      differs by set (below)\n"
        "tokenizer   differs by set:\n"
        f"  {tmp_path / 'a.manifest.json'}: tokenizer 'bytes', EOS id 256\n"
        f"  {tmp_path / 'b.manifest.json'}: no tokenizer recorded, EOS id 0\n"
        f"  1 shard(s) without a manifest (first: {c}): no tokenizer recorded, EOS id None\n"
    ) in text
    assert main(["inspect", a, b, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["eos_id"], info["tokenizer"]) == (None, None)
    assert [(s["tokenizer"] or {}).get("name") for s in info["sets"]] == ["bytes", None]
    assert main(["inspect", b]) == 0  # one set: as before
    assert "eos id      0\ntokenizer   none (written as token ids)\n" in capsys.readouterr().out
