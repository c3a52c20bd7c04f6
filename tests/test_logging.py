"""The ``grain_rox`` logger: what a log collector hears of a conversion, a verify and a restore,
and the command line's ``--log-level`` flag that shows it on stderr."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys

import grain
import numpy as np
import pytest

from grain_rox import MultiHostDataLoadIterator, TokenPipeline, write_rox
from grain_rox._format._verify import verify_rox
from grain_rox.cli import main

SECONDS = re.compile(r", \d+\.\ds;")  # the one part of a record that varies between runs


def records(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str]]:
    """(logger, level, message) of every record captured, a duration shown as ``<t>``."""
    return [(r.name, r.levelname, SECONDS.sub(", <t>;", r.getMessage())) for r in caplog.records]


@pytest.fixture
def inputs(tmp_path):
    """Two text inputs (three documents) and one binary file that is skipped."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello")
    (src / "b.jsonl").write_text('{"text": "xy"}\n{"text": "z"}\n')
    (src / "c.bin").write_bytes(b"\0\1")
    return src


def test_a_conversion_logs_its_start_each_file_each_shard_the_skip_and_its_end(
    tmp_path, inputs, caplog
):
    out = tmp_path / "o.rox"
    argv = ["convert", str(inputs), "-o", str(out), "--block-size", "8"]
    argv += ["--max-shard-bytes", "40", "--no-progress", "--log-level", "debug"]
    with caplog.at_level(logging.DEBUG, logger="grain_rox"):
        assert main(argv) == 0
    shard = [tmp_path / f"o_000{i}.rox" for i in range(3)]
    digests = ["d8eea9f52d751c46", "789ccebd4ed7e913", "04fe4632b1b8c9d1"]
    assert records(caplog) == [
        (
            "grain_rox",
            "INFO",
            f"converting 3 files ({inputs}; format auto) into {out} with the bytes tokenizer "
            "(the default)",
        ),
        ("grain_rox", "DEBUG", f"read {inputs / 'a.txt'} (text): 1 document"),
        ("grain_rox", "DEBUG", f"read {inputs / 'b.jsonl'} (jsonl): 2 documents"),
        (
            "grain_rox",
            "WARNING",
            f"skipped {inputs / 'c.bin'}: it looks binary (a NUL byte at offset 0); pass "
            "--on-binary error to stop instead",
        ),
        *[
            (
                "grain_rox",
                "DEBUG",
                f"writing shard {s}, under a temporary name until the set is published",
            )
            for s in shard
        ],
        *[
            ("grain_rox", "DEBUG", f"finished shard {s}: 1 block, 48 bytes, sha256 {d}, fsynced")
            for s, d in zip(shard, digests, strict=True)
        ],
        *[("grain_rox", "DEBUG", f"committed shard {s}") for s in shard],
        (
            "grain_rox",
            "INFO",
            f"published 3 shard(s) of {tmp_path / 'o'}; manifest {tmp_path / 'o.manifest.json'}",
        ),
        (
            "grain_rox",
            "INFO",
            f"converted into {out}: 3 documents, 11 tokens (uint16, no padding), 3 shard(s), "
            f"<t>; 2 files read, skipped 1 file (1 binary); manifest {tmp_path / 'o.manifest.json'}",
        ),
        # the read-back after writing
        ("grain_rox", "INFO", "verifying 3 shards (structure and checksums)"),
        *[
            ("grain_rox", "DEBUG", f"shard {s} is sound: 1 block, 4 tokens (uint16), checksum ok")
            for s in shard
        ],
        ("grain_rox", "INFO", "verified 3 shards in 1 set: 3 sound, 0 damaged"),
    ]


def test_info_leaves_out_the_detail_and_a_library_user_sees_nothing_unasked(
    tmp_path, inputs, caplog
):
    out = tmp_path / "o.rox"
    argv = ["convert", str(inputs), "-o", str(out), "--no-progress", "--no-verify"]
    with caplog.at_level(logging.DEBUG, logger="grain_rox"):
        assert main([*argv, "--log-level", "info"]) == 0
    assert [(level, message[:12]) for _, level, message in records(caplog)] == [
        ("INFO", "converting 3"),
        ("WARNING", f"skipped {inputs}"[:12]),
        ("INFO", "published 1 "),
        ("INFO", "converted in"),
    ]
    # Python's own default (no handler configured, the "grain_rox" logger at NOTSET): the
    # milestones and detail are not even created, and the level is as it was after main().
    caplog.clear()
    assert logging.getLogger("grain_rox").getEffectiveLevel() == logging.WARNING
    assert verify_rox(str(out))[0].ok
    assert caplog.records == []


def test_verify_logs_its_start_each_damaged_shard_and_its_outcome(tmp_path, caplog):
    path = str(tmp_path / "v.rox")
    write_rox(["y" * 150], path, tokenizer="bytes", block_size=64, max_shard_bytes=200)
    shard1, shard2 = tmp_path / "v_0001.rox", tmp_path / "v_0002.rox"
    data = bytearray(shard1.read_bytes())
    data[3] ^= 0xFF  # a flipped data byte: only the checksum sees it
    shard1.write_bytes(bytes(data))
    shard2.write_bytes(shard2.read_bytes()[:-5])  # a truncated tail
    with caplog.at_level(logging.INFO, logger="grain_rox"):
        reports = verify_rox(path)
    problem1, problem2 = reports[1].problem, reports[2].problem
    assert problem1 is not None and problem1.startswith("sha256 ")
    assert problem2 is not None and problem2.startswith("the last 8 bytes are")
    assert records(caplog) == [
        ("grain_rox", "INFO", "verifying 3 shards (structure and checksums)"),
        ("grain_rox", "WARNING", f"damaged shard {shard1}: {problem1}"),
        ("grain_rox", "WARNING", f"damaged shard {shard2}: {problem2}"),
        ("grain_rox", "INFO", "verified 3 shards in 1 set: 1 sound, 2 damaged"),
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="grain_rox"):
        verify_rox(str(tmp_path / "v_0000.rox"), checksums=False)
    assert records(caplog) == [
        ("grain_rox", "INFO", "verifying 1 shard (structure only, no checksums)"),
        ("grain_rox", "INFO", "verified 1 shard in 1 set: 1 sound, 0 damaged"),
    ]


def test_a_restore_logs_the_step_and_the_input_and_a_refusal_logs_nothing(make_rox, caplog):
    path = make_rox("lg", [np.arange(1, 20_000, dtype=np.uint16)], separator=0)
    pipe = TokenPipeline(path, seq_len=32, global_batch_size=8, num_epochs=1)
    with MultiHostDataLoadIterator(pipe) as it:
        next(it), next(it)
        state = it.get_state()
    fingerprint = pipe.describe()["data"][""]
    caplog.clear()  # (the 7 rows num_epochs=1 leaves after its last whole batch were logged)
    with caplog.at_level(logging.INFO, logger="grain_rox"), MultiHostDataLoadIterator(pipe) as it:
        it.set_state(state)
        resumed = np.asarray(next(it)["inputs"])
    np.testing.assert_array_equal(resumed, pipe.map_dataset()[2]["inputs"])
    assert records(caplog) == [
        (
            "grain_rox",
            "INFO",
            "MultiHostDataLoadIterator.set_state: resuming at step 2; input: a TokenPipeline "
            f"over data {fingerprint}",
        )
    ]
    caplog.clear()
    rows = grain.MapDataset.source(np.arange(64, dtype=np.int32).reshape(16, 4)).batch(8)
    with MultiHostDataLoadIterator(rows) as it:
        next(it)
        grain_state = it.get_state()
    with caplog.at_level(logging.INFO, logger="grain_rox"), MultiHostDataLoadIterator(rows) as it:
        it.set_state(grain_state)
        with pytest.raises(ValueError, match="saved from an iterator over a TokenPipeline"):
            it.set_state(state)  # refused: an exception, and no log line
    kind = type(rows).__name__
    assert json.loads(grain_state)["step"] == 1
    assert records(caplog) == [
        (  # a plain Grain dataset's state names no data: said at its restore
            "grain_rox",
            "WARNING",
            "MultiHostDataLoadIterator.set_state: this Grain dataset's state holds a position "
            "only (step 1), not its data or order, so a restore onto other data or another "
            "seed goes unnoticed; build the dataset on a grain_rox source's .batches() or a "
            "TokenPipeline's map_dataset() (or mix_datasets / pack_documents), whose states "
            "name both",
        ),
        (
            "grain_rox",
            "INFO",
            f"MultiHostDataLoadIterator.set_state: resuming at step 1; input: a Grain input ({kind})",
        ),
    ]


def grain_rox_cli(*args: str, cwd: object) -> subprocess.CompletedProcess[str]:
    """Run the installed ``grain-rox`` (stderr a pipe: no progress bars, logging unconfigured)."""
    exe = os.path.join(os.path.dirname(sys.executable), "grain-rox")
    return subprocess.run([exe, *args], capture_output=True, text=True, cwd=cwd, check=False)


@pytest.mark.slow
def test_the_log_level_flag_goes_before_or_after_the_command(tmp_path, inputs):
    # the default (warning): only the skipped file, as its bare message
    proc = grain_rox_cli("convert", "src", "-o", "o.rox", "--no-verify", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stderr.splitlines() == [
        "skipped src/c.bin: it looks binary (a NUL byte at offset 0); pass --on-binary error "
        "to stop instead"
    ]
    proc = grain_rox_cli("--log-level", "info", "verify", "o.rox", cwd=tmp_path)
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
    assert [re.sub(stamp, "<time>", line) for line in proc.stderr.splitlines()] == [
        "<time> INFO grain_rox: verifying 1 shard (structure and checksums)",
        "<time> INFO grain_rox: verified 1 shard in 1 set: 1 sound, 0 damaged",
    ]
    proc = grain_rox_cli("verify", "o.rox", "--log-level", "debug", cwd=tmp_path)
    assert [re.sub(stamp, "<time>", line) for line in proc.stderr.splitlines()] == [
        "<time> INFO grain_rox: verifying 1 shard (structure and checksums)",
        "<time> DEBUG grain_rox: shard o.rox is sound: 1 block, 2048 tokens (uint16), checksum ok",
        "<time> INFO grain_rox: verified 1 shard in 1 set: 1 sound, 0 damaged",
    ]
    proc = grain_rox_cli("verify", "o.rox", "--log-level", "verbose", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        "grain-rox verify: error: argument --log-level: invalid choice: 'verbose' (choose "
        "from 'warning', 'info', 'debug')"
    )


def test_main_sets_the_level_it_is_given_and_leaves_the_logger_as_it_was(tmp_path, caplog):
    path = str(tmp_path / "o.rox")
    write_rox(["abc"], path, tokenizer="bytes")
    # logging configured by the caller (here pytest): its handlers hear the records, and
    # main() adds none of its own
    handlers = list(logging.getLogger().handlers)
    with caplog.at_level(logging.DEBUG, logger="grain_rox"):
        assert main(["verify", path, "--log-level", "info"]) == 0
        assert main(["verify", path]) == 0  # the default, warning: nothing at INFO
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "verifying 1 shard (structure and checksums)"),
        ("INFO", "verified 1 shard in 1 set: 1 sound, 0 damaged"),
    ]
    assert logging.getLogger("grain_rox").level == logging.NOTSET  # as before main()
    assert logging.getLogger().handlers == handlers  # none added, none left behind


def test_log_lines_spell_python_keywords_as_the_commands_flags():
    from grain_rox._cli._logging import cli_handler

    record = logging.makeLogRecord(
        {
            "name": "grain_rox",
            "levelno": logging.INFO,
            "levelname": "INFO",
            "created": 0.0,
            "msg": "wrote %d shards; pass if_exists='append' to add more",
            "args": (2,),
        }
    )
    assert cli_handler("warning", "convert").format(record) == (
        "wrote 2 shards; pass --if-exists append to add more"
    )
    assert cli_handler("info", "convert").format(record).split(" ", 2)[2] == (
        "INFO grain_rox: wrote 2 shards; pass --if-exists append to add more"
    )
    with pytest.raises(ValueError, match=r"log level 'loud' is not one of \['debug', 'info'"):
        cli_handler("loud", "convert")
