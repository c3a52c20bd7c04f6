"""Writes are transactions: a writer SIGKILLed at any rename, unlink or fsync leaves the old
complete data, the new complete data, or a set that refuses to open naming what to do.

A driver process writes the old data, then forks one child per kill point. The child counts
its calls to ``os.replace``, ``os.unlink``, ``os.remove``, ``os.rename`` and ``os.fsync`` and
sends itself SIGKILL just before the N-th one; N runs from 1 until a child finishes without
being killed. Every resulting directory is then opened in the test process and its tokens are
compared with the complete old and new data (never just "it opens").
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _corpora import unsealed
from _kill_points import child_env

from grain_rox import RoxFormatError, open_rox, write_rox
from grain_rox._format._verify import verify_rox
from grain_rox.cli import main as cli_main

DRIVER = r"""
import json, os, signal, sys
import numpy as np
from grain_rox import write_rox
from grain_rox.cli import main as cli_main
from _kill_points import kill_before

spec = json.loads(sys.argv[1])

def docs(seed, n):
    return [(np.arange(7) + 100 * seed + 10 * i).astype(np.uint16) for i in range(n)]

def write(d, which, hooked):
    s = spec[which]
    path = os.path.join(d, "set.rox")
    if spec["cli"]:
        src = os.path.join(d, f"{which}.txt")
        if not hooked:
            with open(src, "w") as f:
                f.write("".join(f"{which} document {i}\n" for i in range(s["n"])))
        argv = ["convert", src, "-o", path, "--block-size", "16", "--no-progress",
                "--if-exists", s["mode"]]
        if s["shard"]:
            argv += ["--max-shard-bytes", str(s["shard"])]
        assert cli_main(argv) == 0
    else:
        write_rox(docs(s["seed"], s["n"]), path, block_size=16, separator=0,
                  max_shard_bytes=s["shard"], if_exists=s["mode"], manifest=s["manifest"])

killed = []
for n in range(1, 200):
    d = os.path.join(spec["root"], f"k{n:03d}")
    os.makedirs(d)
    if spec["old"] is not None:
        write(d, "old", False)
    if spec["cli"]:
        with open(os.path.join(d, "new.txt"), "w") as f:
            f.write("".join(f"new document {i}\n" for i in range(spec["new"]["n"])))
    pid = os.fork()
    if pid == 0:
        kill_before(n)
        try:
            write(d, "new", True)
        except BaseException:
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        killed.append(d)
        continue
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    break
print(json.dumps({"killed": killed, "complete": d}))
"""


def _tokens(path: str) -> list[int]:
    with open_rox(path) as corpus:
        return corpus.tokens(0, corpus.num_tokens).tolist()


def _reference(tmp_path: Path, spec: dict) -> tuple[list[int] | None, list[int]]:
    """The complete old and new data, written without interruption."""
    d = tmp_path / "reference"
    d.mkdir()
    path = str(d / "set.rox")

    def write(which: str, mode: str) -> None:
        s = spec[which]
        if spec["cli"]:
            src = d / f"{which}.txt"
            src.write_text("".join(f"{which} document {i}\n" for i in range(s["n"])))
            argv = ["convert", str(src), "-o", path, "--block-size", "16", "--no-progress"]
            argv += ["--if-exists", mode]
            if s["shard"]:
                argv += ["--max-shard-bytes", str(s["shard"])]
            assert cli_main(argv) == 0
        else:
            items = [
                (np.arange(7) + 100 * s["seed"] + 10 * i).astype(np.uint16) for i in range(s["n"])
            ]
            write_rox(
                items,
                path,
                block_size=16,
                separator=0,
                max_shard_bytes=s["shard"],
                if_exists=mode,
                manifest=s["manifest"],
            )

    old = None
    if spec["old"] is not None:
        write("old", "error")
        old = _tokens(path)
    write("new", spec["new"]["mode"])
    return old, _tokens(path)


def _side(n: int, shard: int | None, seed: int, mode: str, manifest: bool = True) -> dict:
    return {"n": n, "shard": shard, "seed": seed, "mode": mode, "manifest": manifest}


# Shard size 100 bytes = 2 blocks of 16 bytes = 16 uint16 tokens = 2 documents of 7 + EOS.
SCENARIOS = {
    "single-new": (None, _side(6, None, 2, "error")),
    "single-append": (_side(4, None, 1, "error"), _side(3, None, 2, "append")),
    "single-overwrite": (_side(4, None, 1, "error"), _side(9, None, 2, "overwrite")),
    "single-overwrite-same-size": (_side(4, None, 1, "error"), _side(4, None, 2, "overwrite")),
    "sharded-new": (None, _side(8, 100, 2, "error")),
    "sharded-append": (_side(4, 100, 1, "error"), _side(5, 100, 2, "append")),
    "sharded-overwrite-grow": (_side(4, 100, 1, "error"), _side(10, 100, 2, "overwrite")),
    "sharded-overwrite-shrink": (_side(10, 100, 1, "error"), _side(3, 100, 2, "overwrite")),
    "sharded-overwrite-same-size": (_side(6, 100, 1, "error"), _side(6, 100, 2, "overwrite")),
    "sharded-to-single": (_side(6, 100, 1, "error"), _side(3, None, 2, "overwrite")),
    "single-to-sharded": (_side(3, None, 1, "error"), _side(6, 100, 2, "overwrite")),
    "sharded-overwrite-no-manifest": (
        _side(8, 100, 1, "error", manifest=False),
        _side(3, 100, 2, "overwrite", manifest=False),
    ),
}
CLI_SCENARIOS = {
    "cli-overwrite-shrink": (_side(12, 100, 0, "error"), _side(3, 100, 0, "overwrite")),
    "cli-overwrite-grow": (_side(3, 100, 0, "error"), _side(12, 100, 0, "overwrite")),
    "cli-append": (_side(4, 100, 0, "error"), _side(4, 100, 0, "append")),
}


def _run(tmp_path: Path, old: dict | None, new: dict, cli: bool) -> None:
    spec = {"old": old, "new": new, "cli": cli}
    old_tokens, new_tokens = _reference(tmp_path, spec)
    assert old_tokens != new_tokens
    root = tmp_path / "kills"
    root.mkdir()
    spec["root"] = str(root)
    result = _run_driver(DRIVER, spec)
    assert len(result["killed"]) >= 3, result
    assert _tokens(os.path.join(result["complete"], "set.rox")) == new_tokens
    outcomes: dict[str, int] = {}
    for d in result["killed"]:
        path = os.path.join(d, "set.rox")
        try:
            got = _tokens(path)
        except FileNotFoundError:
            assert old_tokens is None, f"{d}: the old data vanished"
            outcome = "nothing"
        except RoxFormatError as e:
            assert "interrupted" in e.problem and "Fix: " in str(e), e
            assert "run the write again" in e.fix or "delete the" in e.fix, e
            outcome = "refused"
            # grain-rox verify reports the refusal for the set instead of crashing.
            assert any(not r.ok and "interrupted" in (r.problem or "") for r in verify_rox(path))
        else:
            assert got in (old_tokens, new_tokens), f"{d}: a mix of the old and new data: {got}"
            outcome = "old" if got == old_tokens else "new"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        # The next write to the set succeeds, removes the killed writer's temporaries and
        # leaves exactly its data.
        write_rox([np.array([7, 7, 7], np.uint16)], path, block_size=16, if_exists="overwrite")
        assert _tokens(path) == [7, 7, 7, 0, 0, 0, 0, 0]
        hidden = [n for n in os.listdir(d) if n.startswith(".")]
        assert hidden == [], f"{d}: leftover temporaries {hidden}"
    # Every scenario passes through both complete states (killed before and after its commit).
    expected_first = "nothing" if old_tokens is None else "old"
    assert outcomes.get(expected_first, 0) >= 1 and outcomes.get("new", 0) >= 1, outcomes


@pytest.mark.slow
@pytest.mark.parametrize(("old", "new"), SCENARIOS.values(), ids=SCENARIOS.keys())
def test_killed_api_write_leaves_old_new_or_refuses(tmp_path, old, new):
    _run(tmp_path, old, new, cli=False)


@pytest.mark.slow
@pytest.mark.parametrize(("old", "new"), CLI_SCENARIOS.values(), ids=CLI_SCENARIOS.keys())
def test_killed_cli_convert_leaves_old_new_or_refuses(tmp_path, old, new):
    _run(tmp_path, old, new, cli=True)


# A writer killed at any point of its rerun after a killed write: the driver kills the first
# write at each point N (as DRIVER does), copies each killed state that lacks the new data,
# and kills the rerun of the same write at each point M of it, up to the first that finishes.
RERUN_DRIVER = r"""
import json, os, shutil, signal, sys
import numpy as np
from grain_rox import open_rox, write_rox
from _kill_points import kill_before

spec = json.loads(sys.argv[1])

def write(d, seed, n, mode):
    docs = [(np.arange(7) + 100 * seed + 10 * i).astype(np.uint16) for i in range(n)]
    write_rox(docs, os.path.join(d, "set.rox"), block_size=16, separator=0,
              max_shard_bytes=100, if_exists=mode)

def killed_at(d, n, new):
    pid = os.fork()
    if pid == 0:
        kill_before(n)
        try:
            write(d, *new)
        except BaseException:
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        return True
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (d, status)
    return False

def committed(d):  # the killed write's data is all there: a rerun would write it twice
    try:
        with open_rox(os.path.join(d, "set.rox")) as corpus:
            return corpus.tokens(0, corpus.num_tokens).tolist() == spec["new_tokens"]
    except Exception:
        return False

states = []
for n in range(1, 200):
    d = os.path.join(spec["root"], f"k{n:03d}")
    os.makedirs(d)
    write(d, *spec["old"])
    if not killed_at(d, n, spec["new"]):
        break
    if committed(d):
        continue
    for m in range(1, 200):
        again = os.path.join(spec["root"], f"k{n:03d}_r{m:03d}")
        shutil.copytree(d, again)
        done = not killed_at(again, m, spec["new"])
        states.append(again)
        if done:
            break
print(json.dumps(states))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("old", "new"),
    [((1, 4, "error"), (2, 4, "append")), ((1, 10, "error"), (2, 3, "overwrite"))],
    ids=["sharded-append", "sharded-overwrite-shrink"],
)
def test_a_rerun_killed_at_any_point_after_a_killed_write_leaves_old_new_or_refuses(
    tmp_path, old, new
):
    """The advice after a killed write is to run it again; that rerun (which first cleans up
    or rolls back the killed one) killed at any rename, unlink or fsync of its own still
    leaves the complete old data, the complete new data or a refusal, and a third run
    finishes with exactly the new data (where it was not yet there)."""
    reference = str(tmp_path / "reference" / "set.rox")
    os.makedirs(os.path.dirname(reference))
    _write(reference, old[0], old[1])
    old_tokens = _tokens(reference)
    _write(reference, *new)
    new_tokens = _tokens(reference)
    root = tmp_path / "kills"
    root.mkdir()
    spec = {"root": str(root), "old": old, "new": new, "new_tokens": new_tokens}
    states = _run_driver(RERUN_DRIVER, spec)
    assert len(states) >= 20, states
    outcomes: dict[str, int] = {}
    for d in states:
        path = os.path.join(d, "set.rox")
        try:
            got = _tokens(path)
        except RoxFormatError as e:
            assert "interrupted" in e.problem and "Fix: " in str(e), f"{d}: {e}"
            outcome = "refused"
        else:
            assert got in (old_tokens, new_tokens), f"{d}: a mix of the old and new data: {got}"
            outcome = "old" if got == old_tokens else "new"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if outcome != "new":  # (a rerun killed after its commit may leave its hidden lock)
            _write(path, *new)  # the write run once more finishes it
            assert [n for n in os.listdir(d) if n.startswith(".")] == [], d
        assert _tokens(path) == new_tokens, d
    assert outcomes.get("old", 0) >= 1 and outcomes.get("new", 0) >= 1, outcomes


# ---------------------------------------------------------------------------------------------
# Exact states and messages. A writer is stopped in-process at its N-th os.replace / os.unlink
# (an exception where the kill would land leaves the same files as a SIGKILL).
# ---------------------------------------------------------------------------------------------


class _Stop(BaseException):
    pass


def _stop_at(monkeypatch, name: str, n: int) -> None:
    real = getattr(os, name)
    count = [0]

    def stop(*args, **kwargs):
        count[0] += 1
        if count[0] == n:
            raise _Stop
        return real(*args, **kwargs)

    monkeypatch.setattr(os, name, stop)


def _docs(seed: int, n: int) -> list[np.ndarray]:
    return [(np.arange(7) + 100 * seed + 10 * i).astype(np.uint16) for i in range(n)]


def _write(path, seed: int, n: int, mode: str = "error") -> None:
    write_rox(_docs(seed, n), path, block_size=16, separator=0, max_shard_bytes=100, if_exists=mode)


def test_shrink_stopped_before_deleting_old_shards_names_them(tmp_path, monkeypatch, capsys):
    path = str(tmp_path / "set.rox")
    _write(path, 1, 10)  # 5 shards
    _stop_at(monkeypatch, "unlink", 1)  # after both renames, before the first old shard goes
    with pytest.raises(_Stop):
        _write(path, 2, 3, "overwrite")  # 2 shards
    monkeypatch.undo()
    with pytest.raises(RoxFormatError) as info:
        open_rox(path)
    assert str(info.value) == (
        f"{tmp_path}/set.manifest.json: a write to this shard set (write "
        f"{json.loads((tmp_path / 'set.manifest.json').read_text())['pending']['write_id']}) "
        "was interrupted while it published its shards: on disk are 2 of its 2 new shard(s) "
        "and 3 of the 5 shard(s) of the data it replaces, so the files are neither the old nor "
        "the new data. Fix: the new data is complete: delete the 3 leftover shard(s) of the old "
        "data (set_0002.rox, set_0003.rox, set_0004.rox), or run the write again."
    )
    # grain-rox inspect and verify report the refusal (inspect: exit 2; verify: every shard).
    assert cli_main(["inspect", path]) == 2
    assert "was interrupted while it published its shards" in capsys.readouterr().err
    assert cli_main(["verify", path]) == 1
    assert "0 of 5 shards OK; 5 not checked (a file of their set is unusable)" in (
        capsys.readouterr().out
    )
    for name in ["set_0002.rox", "set_0003.rox", "set_0004.rox"]:
        os.unlink(tmp_path / name)  # the fix as stated
    with open_rox(path) as corpus:
        assert (
            corpus.tokens(0, 24).tolist()
            == np.concatenate([np.append(d, 0) for d in _docs(2, 3)]).tolist()
        )


def test_append_stopped_between_renames_names_the_new_shards(tmp_path, monkeypatch):
    path = str(tmp_path / "set.rox")
    _write(path, 1, 4)  # set_0000, set_0001
    before = _tokens(path)
    _stop_at(monkeypatch, "replace", 3)  # pending manifest, first new shard, then stop
    with pytest.raises(_Stop):
        _write(path, 2, 4, "append")  # set_0002, set_0003
    monkeypatch.undo()
    with pytest.raises(RoxFormatError, match=r"on disk are 1 of its 2 new shard\(s\)") as info:
        open_rox(path)
    assert info.value.problem.endswith(
        "on disk are 1 of its 2 new shard(s) and 2 of the 2 shard(s) of the set had before it, "
        "so the files are neither the old nor the new data"
    )
    assert info.value.problem.startswith("an append to this shard set (write ")
    assert info.value.fix == (
        "the previous data is intact: the next write to this set removes the 1 uncommitted "
        "shard(s) of the interrupted write (set_0002.rox) first, so running the write again "
        "works; or delete them to read the previous data now"
    )
    os.unlink(tmp_path / "set_0002.rox")
    assert _tokens(path) == before
    assert len(open_rox(path).leftover_temps) == 1  # set_0003's temporary is listed ...
    _write(path, 2, 4, "append")
    assert _tokens(path)[: len(before)] == before
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []  # ... and removed


def test_same_size_overwrite_stopped_between_renames_is_refused(tmp_path, monkeypatch):
    path = str(tmp_path / "set.rox")
    _write(path, 1, 6)
    _stop_at(monkeypatch, "replace", 3)
    with pytest.raises(_Stop):
        _write(path, 2, 6, "overwrite")  # same names, same sizes: only mtime/sha256 differ
    monkeypatch.undo()
    with pytest.raises(RoxFormatError) as info:
        open_rox(path)
    assert "on disk are 1 of its 3 new shard(s) and 2 of the 3 shard(s)" in info.value.problem
    assert info.value.fix == (
        "run the write again with if_exists='overwrite' (it rewrites the whole set); the "
        "previous data was partly replaced and cannot be recovered from these files"
    )
    _write(path, 2, 6, "overwrite")
    assert _tokens(path)[:8] == [200, 201, 202, 203, 204, 205, 206, 0]


def test_extra_and_missing_shards_of_a_committed_set_are_refused(tmp_path):
    path = str(tmp_path / "set.rox")
    _write(path, 1, 6)
    (tmp_path / "set_0007.rox").write_bytes((tmp_path / "set_0000.rox").read_bytes())
    with pytest.raises(RoxFormatError) as info:
        open_rox(path)
    assert str(info.value) == (
        f"{tmp_path}/set_0007.rox: 1 file(s) named like shards of this set are not in its "
        f"manifest {tmp_path}/set.manifest.json (set_0007.rox): no write of this set made "
        "them. Fix: rename them if they belong to another set, or run the write again; to "
        "read the files without grain_rox's checks, delete the manifest."
    )
    os.unlink(tmp_path / "set_0007.rox")
    os.unlink(tmp_path / "set_0001.rox")
    with pytest.raises(RoxFormatError) as info:
        open_rox(tmp_path / "set_0000.rox")  # even a subset: the set is damaged
    assert str(info.value) == (
        f"{tmp_path}/set.manifest.json: 1 shard(s) that the manifest records are missing "
        "(set_0001.rox). Fix: restore them from a copy of the set, or run the write again."
    )


def test_same_size_in_place_change_fails_the_fingerprint_copies_do_not(tmp_path, monkeypatch):
    import shutil

    import grain_rox._format._hash_cache as hash_cache

    path = str(tmp_path / "a" / "set.rox")
    _write(path, 1, 6)
    with open_rox(path) as corpus:
        fingerprint = corpus.fingerprint
    # Unchanged files are never hashed on open or fingerprint: O(1) per shard.
    monkeypatch.setattr(hash_cache, "sha256_file", lambda p: pytest.fail(f"hashed {p}"))
    assert open_rox(path).fingerprint == fingerprint
    monkeypatch.undo()
    shutil.copytree(tmp_path / "a", tmp_path / "b", copy_function=shutil.copy)  # new mtimes
    os.rename(tmp_path / "b", tmp_path / "moved")
    assert open_rox(str(tmp_path / "moved" / "set.rox")).fingerprint == fingerprint
    # The copy was hashed once: another process on this host (a fresh memory) reads the
    # remembered digests instead of the whole corpus again.
    hash_cache._MEMORY.clear()
    monkeypatch.setattr(hash_cache, "sha256_file", lambda p: pytest.fail(f"hashed {p}"))
    assert open_rox(str(tmp_path / "moved" / "set.rox")).fingerprint == fingerprint
    monkeypatch.undo()
    os.utime(tmp_path / "a" / "set_0001.rox", ns=(1, 1))  # touched, same bytes
    assert open_rox(path).fingerprint == fingerprint
    shard = tmp_path / "a" / "set_0001.rox"
    data = bytearray(shard.read_bytes())
    data[6] ^= 1  # one token in the middle, same size
    shard.write_bytes(bytes(data))
    corpus = open_rox(path)  # still O(1): opening does not hash
    with pytest.raises(RoxFormatError) as info:
        _ = corpus.fingerprint
    assert info.value.path == str(shard)
    assert info.value.problem.startswith("its content changed after it was written: its sha256")
    assert info.value.fix == (
        "re-create the shard set (or restore the shard from a copy); a checkpoint made on the "
        "data as written cannot continue on these bytes"
    )
    # The Grain sources check when they are made (they read the edited token silently)
    from grain_rox import RoxBlockSource, RoxDocumentSource, RoxTokenSource

    for make in (
        lambda: RoxTokenSource(path, seq_len=4),
        lambda: RoxBlockSource(path),
        lambda: RoxDocumentSource(path, seq_len=4),
    ):
        with pytest.raises(RoxFormatError, match="its content changed after it was written"):
            make()


BAD_WRITES = {
    "separator-outside-vocabulary": (
        dict(items=["a"], tokenizer="bytes", separator=1000),
        "separator=1000 is outside the bytes vocabulary (ids 0..256); pass one of its ids, or "
        "leave separator= unset for its EOS id 256",
    ),
    "fractional-separator": (
        dict(items=[np.array([1, 2], np.uint16)], separator=1.5),
        "separator=1.5 is not a whole number but the tokens are uint16: it would be stored as "
        "1; pass separator= an integer token id",
    ),
    "float-token-overflow": (
        dict(items=[np.array([1.0, 1e6], np.float32)], dtype="float16"),
        "item 0 holds 1000000.0, which overflows to inf in float16; pass dtype= a wider float "
        "type (e.g. float32) or scale the values",
    ),
    "float-separator-overflow": (
        dict(items=[np.array([1.0], np.float16)], separator=1e6),
        "separator holds 1000000.0, which overflows to inf in float16; pass dtype= a wider "
        "float type (e.g. float32) or scale the values",
    ),
}


@pytest.mark.parametrize(("kwargs", "message"), BAD_WRITES.values(), ids=BAD_WRITES.keys())
def test_bad_write_arguments_are_refused_exactly(tmp_path, kwargs, message):
    kwargs = dict(kwargs)
    items = kwargs.pop("items")
    with pytest.raises(ValueError) as info:
        write_rox(items, tmp_path / "x.rox", block_size=8, **kwargs)
    assert str(info.value) == message
    assert os.listdir(tmp_path) == []


def test_output_path_must_end_in_rox(tmp_path):
    with pytest.raises(ValueError) as info:
        write_rox(["a"], tmp_path / "x.bin")
    assert str(info.value) == (
        f"the output path {str(tmp_path / 'x.bin')!r} does not end in .rox after a name; "
        "roxxel and grain_rox find shards by that suffix. Pass e.g. "
        f"{str(tmp_path / 'x.bin.rox')!r}"
    )


@pytest.mark.parametrize(("given", "suggested"), [("out/", "out/train.rox"), ("out/.rox", "out/train.rox"), (".rox", "train.rox")])  # fmt: skip
def test_an_output_folder_or_hidden_name_is_refused_with_a_file_name(
    tmp_path, monkeypatch, given, suggested
):
    # ``*.rox`` globs leave hidden files out: a set named ``.rox`` would not be found again
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=f"Pass e.g. {suggested!r}$"):
        write_rox(["a"], given)
    assert os.listdir(tmp_path) == []


def _no_hang(seconds: int = 20):
    import signal

    def fail(*_):
        raise AssertionError("hung on a FIFO")

    signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)


def test_fifo_named_like_a_shard_is_refused_without_hanging(tmp_path, capsys):
    os.mkfifo(tmp_path / "f.rox")
    _no_hang()
    try:
        message = (
            f"{tmp_path}/f.rox: it is a FIFO, device or socket, not a regular file, but is "
            "named like a shard. Fix: rename or remove it; .rox shards are regular files."
        )
        for spec in [tmp_path / "f.rox", tmp_path, str(tmp_path / "*.rox")]:
            with pytest.raises(RoxFormatError) as info:
                open_rox(spec)
            assert str(info.value) == message
        [report] = verify_rox(str(tmp_path))
        assert report.problem == message.split(": ", 1)[1].replace(". Fix: ", ". Fix: ")
        assert cli_main(["inspect", str(tmp_path / "f.rox")]) == 2
        assert cli_main(["verify", str(tmp_path / "f.rox")]) == 1
        assert "not a regular file" in capsys.readouterr().out
        # A FIFO inside a grain_rox set (named like one of its shards) is refused as well.
        _write(str(tmp_path / "s.rox"), 1, 2)
        os.mkfifo(tmp_path / "s_0005.rox")
        with pytest.raises(RoxFormatError, match=r"s_0005\.rox: it is a FIFO"):
            open_rox(tmp_path / "s.rox")
    finally:
        import signal

        signal.alarm(0)


def test_a_device_given_as_a_shard_is_refused_by_what_it_is_not_by_its_name(capsys):
    message = (
        "/dev/null: it is a FIFO, device or socket, not a regular file, so it cannot be a "
        "shard. Fix: pass a .rox shard (a regular file), a folder of them or a glob."
    )
    with pytest.raises(RoxFormatError) as info:
        open_rox("/dev/null")
    assert str(info.value) == message
    assert cli_main(["verify", "/dev/null"]) == 1
    assert f"FAIL {message}" in capsys.readouterr().out


def test_fifo_named_like_a_manifest_is_refused_without_hanging(tmp_path):
    path = str(tmp_path / "set.rox")
    _write(path, 1, 2)
    os.unlink(tmp_path / "set.manifest.json")
    os.mkfifo(tmp_path / "set.manifest.json")
    _no_hang()
    try:
        with pytest.raises(RoxFormatError) as info:
            open_rox(path)
    finally:
        import signal

        signal.alarm(0)
    assert str(info.value) == (
        f"{tmp_path}/set.manifest.json: the manifest is not a regular file (a FIFO, device or "
        "directory). Fix: remove it or rename it; a manifest is a JSON file written by grain_rox."
    )


@pytest.mark.parametrize("name", ["/etc/hostname", "../x.rox", "sub/set.rox", "other_0000.rox"])
@pytest.mark.parametrize("where", ["shards", "pending"])
def test_manifest_names_outside_the_set_are_refused(tmp_path, name, where):
    path = str(tmp_path / "set.rox")
    _write(path, 1, 2)
    mpath = tmp_path / "set.manifest.json"
    data = json.loads(mpath.read_text())
    record = data["shards"]["set_0000.rox"]
    if where == "pending":
        data["pending"] = {**data, "shards": {name: record}, "pending": None}
    else:
        data["shards"][name] = record
    mpath.write_text(json.dumps(unsealed(data)))
    for action in (lambda: open_rox(path), lambda: _write(path, 2, 2, "append")):
        with pytest.raises(RoxFormatError) as info:
            action()
        assert str(info.value) == (
            f"{mpath}: the manifest names {name!r}, which is not a shard of this set (expected "
            "set.rox or set_NNNN.rox in the manifest's own directory). Fix: the manifest was "
            "edited or damaged: re-create the shard set, or delete this manifest to read the "
            "shards without its extras."
        )
    # An overwrite replaces the manifest; it only ever deletes files of its own set.
    _write(path, 2, 2, "overwrite")
    assert _tokens(path)[:8] == [200, 201, 202, 203, 204, 205, 206, 0]
    assert name not in mpath.read_text()


def test_leftover_temporaries_are_reported_by_inspect_and_verify(tmp_path, capsys):
    path = str(tmp_path / "set.rox")
    _write(path, 1, 4)
    tmp = tmp_path / ".set_0001.rox.999999999.0badcafe.tmp"  # a killed writer's pid
    tmp.write_bytes(b"x" * 100)
    unrelated = tmp_path / ".other_0000.rox.999999999.0badcafe.tmp"
    unrelated.write_bytes(b"y")
    assert open_rox(path).leftover_temps == (str(tmp),)
    assert cli_main(["inspect", path]) == 0
    assert (
        f"leftover    {tmp}: a hidden temporary file of a killed write" in capsys.readouterr().out
    )
    assert cli_main(["verify", path]) == 0  # harmless: reported, not damage
    out = capsys.readouterr().out
    assert f"WARN {tmp}: a hidden temporary file (100 bytes) of a write to this set" in out
    assert "2 of 2 shards OK; 1 leftover temporary file(s)" in out
    _write(path, 2, 2, "overwrite")
    assert not tmp.exists() and unrelated.exists()  # only this set's leftovers are removed


def test_single_files_named_like_shards_are_members_of_one_set(tmp_path):
    """Separate jobs may each write one shard (x_0000.rox, x_0001.rox) of one set."""
    write_rox([np.arange(4, dtype=np.uint16)], tmp_path / "t_0001.rox", block_size=8)
    write_rox([np.arange(4, 8, dtype=np.uint16)], tmp_path / "t_0000.rox", block_size=8)
    manifest = json.loads((tmp_path / "t.manifest.json").read_text())
    assert list(manifest["shards"]) == ["t_0000.rox", "t_0001.rox"]
    assert _tokens(str(tmp_path / "t.rox")) == [4, 5, 6, 7, 0, 1, 2, 3]
    with pytest.raises(FileExistsError, match=r"t_0001\.rox exists; pass if_exists='append'"):
        write_rox([np.arange(4, dtype=np.uint16)], tmp_path / "t_0001.rox", block_size=8)
    nines = np.array([9, 9, 9, 9], np.uint16)
    write_rox([nines], tmp_path / "t_0000.rox", block_size=8, if_exists="overwrite")
    assert _tokens(str(tmp_path / "t.rox")) == [9, 9, 9, 9, 0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"eos/separator None != 0"):
        write_rox([np.array([1], np.uint16)], tmp_path / "t_0002.rox", separator=0, block_size=4)


def test_a_second_writer_of_the_same_set_is_refused_while_the_first_runs(tmp_path):
    from grain_rox._format._atomic import ShardSetBusyError

    path = str(tmp_path / "set.rox")
    seen: list[str] = []

    def documents():
        yield np.arange(1, 6, dtype=np.uint16)
        try:  # the first write is running: a second one of this set must not interleave
            write_rox([np.arange(3, dtype=np.uint16)], path, if_exists="overwrite")
        except ShardSetBusyError as e:
            seen.append(str(e))
        write_rox([np.arange(3, dtype=np.uint16)], str(tmp_path / "other.rox"))  # another set
        yield np.arange(6, 9, dtype=np.uint16)

    write_rox(documents(), path, separator=0)
    assert seen == [
        f"another process is writing the shard set {path} now (it holds the lock "
        f"{tmp_path}/.set.write-lock); wait for that write to finish, or write to another name"
    ]
    with open_rox(path) as corpus:
        assert corpus.tokens(0, 8).tolist() == [1, 2, 3, 4, 5, 0, 6, 7]
    assert sorted(os.listdir(tmp_path)) == [
        "other.manifest.json",
        "other.rox",
        "set.manifest.json",
        "set.rox",
    ]


def test_a_set_between_two_writes_while_its_writer_runs_is_named_a_live_write(
    tmp_path, monkeypatch
):
    """A reader that opened a set while a healthy writer published it was told the write was
    interrupted, with fixes (run it again, delete shards) that would undo it. While a writer
    holds the set's lock the reader looks again, and then names a write in progress."""
    from grain_rox._format import _shard_set
    from grain_rox._format._atomic import set_write_lock

    path = str(tmp_path / "set.rox")
    _write(path, 1, 4)
    _stop_at(monkeypatch, "replace", 3)  # the state of a write between two renames
    with pytest.raises(_Stop):
        _write(path, 2, 4, "append")
    monkeypatch.undo()
    monkeypatch.setattr(_shard_set, "_LIVE_WRITE_LOOKS", 2)
    mpath = str(tmp_path / "set.manifest.json")
    with set_write_lock(mpath, path), pytest.raises(RoxFormatError) as e:
        open_rox(path)
    assert e.value.problem.startswith(
        "a write to this shard set is publishing its shards now (its writer holds the set's "
        "lock), so the files are between two sets (an append to this shard set (write "
    )
    assert e.value.fix == (
        "open the set again when the write has ended; do not delete or rewrite files meanwhile"
    )
    with pytest.raises(RoxFormatError, match="the next write to this set removes the 1"):
        open_rox(path)  # no writer: the interrupted write, as before
    # A problem of the set's own while a writer holds the lock but publishes nothing (still
    # encoding): said at once, as it is (it waited 2 s, then blamed the writer).
    other = str(tmp_path / "other.rox")
    _write(other, 1, 4)
    (tmp_path / "other_0042.rox").write_bytes((tmp_path / "other_0000.rox").read_bytes())
    monkeypatch.setattr(_shard_set, "_LIVE_WRITE_LOOKS", 40)
    with (
        set_write_lock(str(tmp_path / "other.manifest.json"), other),
        pytest.raises(RoxFormatError) as e,
    ):
        open_rox(other)
    assert e.value.problem.startswith(
        "1 file(s) named like shards of this set are not in its manifest"
    )


def test_rerun_of_an_interrupted_append_removes_its_uncommitted_shards(tmp_path, monkeypatch):
    path = str(tmp_path / "set.rox")
    _write(path, 1, 4)  # set_0000, set_0001
    before = _tokens(path)
    _stop_at(monkeypatch, "replace", 3)  # pending manifest, set_0002 renamed, then stop
    with pytest.raises(_Stop):
        _write(path, 2, 4, "append")
    monkeypatch.undo()
    with pytest.raises(RoxFormatError, match=r"the next write to this set removes the 1"):
        open_rox(path)
    _write(path, 2, 4, "append")  # as advised: the rerun rolls the interrupted append back
    assert _tokens(path) == before + np.concatenate([np.append(d, 0) for d in _docs(2, 4)]).tolist()
    assert sorted(os.listdir(tmp_path)) == [
        "set.manifest.json",
        "set_0000.rox",
        "set_0001.rox",
        "set_0002.rox",
        "set_0003.rox",
    ]


def test_an_append_stopped_after_its_renames_is_completed_not_rolled_back(tmp_path, monkeypatch):
    """Stopped after its shards were in place but before its final manifest, an append's set
    opens as the new data (readers are served it); the next write rolled it back as
    uncommitted, so those rows vanished without a word. It completes the append instead."""
    path = str(tmp_path / "set.rox")
    _write(path, 1, 4)  # set_0000, set_0001
    before = _tokens(path)
    _stop_at(monkeypatch, "replace", 4)  # pending manifest, set_0002, set_0003, then stop
    with pytest.raises(_Stop):
        _write(path, 2, 4, "append")
    monkeypatch.undo()
    appended = np.concatenate([np.append(d, 0) for d in _docs(2, 4)]).tolist()
    assert _tokens(path) == before + appended  # served as the new data
    _write(path, 3, 4, "append")
    more = np.concatenate([np.append(d, 0) for d in _docs(3, 4)]).tolist()
    assert _tokens(path) == before + appended + more
    assert json.loads((tmp_path / "set.manifest.json").read_text()).get("pending") is None


def test_interrupted_overwrite_of_a_refused_set_stays_refused(tmp_path, monkeypatch):
    """An overwrite replaces a set already refused (a mix): killed before its first shard
    rename, the files are that mix again, which must not open as a set without a manifest."""
    path = str(tmp_path / "set.rox")
    _write(path, 1, 10)  # 5 shards
    _stop_at(monkeypatch, "replace", 3)  # pending manifest, one shard renamed, then stop
    with pytest.raises(_Stop):
        _write(path, 2, 10, "overwrite")
    monkeypatch.undo()
    with pytest.raises(RoxFormatError, match=r"neither the old nor the new data"):
        open_rox(path)
    _stop_at(monkeypatch, "replace", 2)  # only its pending manifest is in place
    with pytest.raises(_Stop):
        _write(path, 3, 2, "overwrite")
    monkeypatch.undo()
    with pytest.raises(RoxFormatError) as info:
        open_rox(path)
    assert info.value.problem.startswith("an overwrite of this shard set (write ")
    assert (
        "was interrupted before it put its shards in place, and the files it was to replace "
        "were already refused (set.manifest.json: a write to this shard set (write "
    ) in info.value.problem
    assert info.value.fix == "run the overwrite again (if_exists='overwrite')"
    _write(path, 3, 2, "overwrite")
    assert _tokens(path) == np.concatenate([np.append(d, 0) for d in _docs(3, 2)]).tolist()


def test_interrupted_v1_manifest_advises_only_an_overwrite(tmp_path):
    path = str(tmp_path / "set.rox")
    _write(path, 1, 4)
    mpath = tmp_path / "set.manifest.json"
    data = json.loads(mpath.read_text())
    data["version"], data["pending"] = 1, {"set_0002.rox": {}}
    mpath.write_text(json.dumps(unsealed(data)))
    with pytest.raises(RoxFormatError) as info:
        open_rox(path)
    assert info.value.fix == (
        "run the write again with if_exists='overwrite' (the files may mix the old and the new "
        "data)"
    )


def test_leftovers_of_killed_writers_with_live_pids_are_reported_and_removed(tmp_path):
    """A killed writer's pid may be alive again (pid 1 in a container, pid reuse): without a
    writer holding the set's lock, every temporary of the set is a leftover."""
    from grain_rox._format._atomic import set_write_lock

    path = str(tmp_path / "set.rox")
    _write(path, 1, 4)
    live = tmp_path / f".set_0001.rox.{os.getppid()}.0badcafe.tmp"
    live.write_bytes(b"x" * 1000)
    dead = tmp_path / ".set.manifest.json.999999999.0badcafe.tmp"
    dead.write_bytes(b"{")
    assert open_rox(path).leftover_temps == (str(dead), str(live))
    (tmp_path / ".set.write-lock").write_bytes(b"")  # left by a killed writer, not locked
    reports = verify_rox(path)
    assert [r.path for r in reports if r.kind == "leftover"] == [str(dead), str(live)]
    with set_write_lock(str(tmp_path / "set.manifest.json"), path):  # a writer runs now
        assert open_rox(path).leftover_temps == (str(dead),)  # its live pid's file may be its
    _write(path, 2, 2, "overwrite")
    assert not live.exists() and not dead.exists()
    assert sorted(os.listdir(tmp_path)) == ["set.manifest.json", "set_0000.rox"]


def test_append_refuses_a_kept_shard_edited_in_place(tmp_path):
    """An append re-records the kept shards' mtimes: it must not launder an in-place edit."""
    path = str(tmp_path / "set.rox")
    _write(path, 1, 4)  # set_0000, set_0001
    with open(tmp_path / "set_0000.rox", "r+b") as f:  # same-size edit in place
        f.write(np.uint16(7).tobytes())
    manifest = (tmp_path / "set.manifest.json").read_text()
    with pytest.raises(RoxFormatError) as info:
        _write(path, 3, 1, "append")
    assert info.value.path == str(tmp_path / "set_0000.rox")
    assert info.value.problem.startswith("its content changed after it was written: its sha256 ")
    assert info.value.problem.endswith(
        "so appending to the set would record the changed bytes as the set's"
    )
    assert info.value.fix == (
        "restore the shard from a copy, or re-create the set with if_exists='overwrite'"
    )
    assert (tmp_path / "set.manifest.json").read_text() == manifest
    assert sorted(os.listdir(tmp_path)) == ["set.manifest.json", "set_0000.rox", "set_0001.rox"]
    os.utime(tmp_path / "set_0001.rox")  # a new mtime alone (touch, a copy) is no change
    with open(tmp_path / "set_0000.rox", "r+b") as f:
        f.write(np.uint16(100).tobytes())  # the recorded bytes again, at a new mtime
    _write(path, 3, 1, "append")
    assert (
        _tokens(path)
        == np.concatenate([np.append(d, 0) for d in _docs(1, 4) + _docs(3, 1)]).tolist()
    )


def test_a_single_file_append_refuses_damage_its_copy_would_record_as_valid(tmp_path):
    """A byte flipped with the file's size and mtime kept (bit rot): the append copied the
    damaged file and recorded a new sha256 over it, so verify failed before the append and
    passed after it. The copy is checked against the manifest's sha256; nothing is left."""
    path = tmp_path / "x.rox"
    write_rox([np.arange(1, 200, dtype=np.uint16)], path, block_size=64, separator=0)
    stat = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(RoxFormatError) as e:
        write_rox([np.arange(5, dtype=np.uint16)], path, block_size=64, separator=0,
                  if_exists="append")  # fmt: skip
    assert e.value.problem.startswith("damaged shard: sha256 is ")
    assert e.value.problem.endswith(", so an append would record the damage as valid")
    assert e.value.fix == (
        "restore the shard from a copy, or write the set again (if_exists='overwrite'); "
        "nothing was appended"
    )
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files  # no temporary left


@pytest.mark.parametrize("sharded", [False, True])
def test_a_full_disk_names_the_set_and_says_nothing_changed(tmp_path, monkeypatch, sharded):
    """A full disk gave a bare "[Errno 28] No space left on device" naming no file; a single
    file's append also left its partial copy (a temporary) on the full disk."""
    import errno

    from grain_rox._text import _shard_files

    path = str(tmp_path / "set.rox")
    msb = 100 if sharded else None
    write_rox(_docs(1, 4), path, block_size=16, separator=0, max_shard_bytes=msb)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_shard_files.ShardFile, "_write", full)
    with pytest.raises(OSError) as e:
        write_rox(_docs(2, 4), path, block_size=16, separator=0, max_shard_bytes=msb,
                  if_exists="append")  # fmt: skip
    assert e.value.errno == errno.ENOSPC
    assert str(e.value) == (
        f"[Errno 28] No space left on device while writing {path}: nothing was changed (the "
        "set is as it was, and this write's temporary files are deleted); free space, or "
        "write smaller shards (max_shard_bytes=), and run the write again"
    )
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files


def test_an_append_without_a_manifest_does_not_delete_the_sets(tmp_path):
    """manifest=False on an append deleted the set's manifest (checksums, EOS, tokenizer and
    document counts of every old shard), without a word."""
    path = str(tmp_path / "set.rox")
    _write(path, 1, 4)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ValueError, match=re.escape(
        f"manifest=False would delete {tmp_path / 'set.manifest.json'}, the manifest of the "
        "set this write adds to"
    )):  # fmt: skip
        write_rox(_docs(2, 4), path, block_size=16, separator=0, max_shard_bytes=100,
                  if_exists="append", manifest=False)  # fmt: skip
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files


def test_member_overwrite_of_an_edited_member_is_allowed(tmp_path):
    write_rox([np.arange(4, dtype=np.uint16)], tmp_path / "t_0000.rox", block_size=8)
    write_rox([np.arange(4, 8, dtype=np.uint16)], tmp_path / "t_0001.rox", block_size=8)
    with open(tmp_path / "t_0001.rox", "r+b") as f:
        f.write(np.uint16(9).tobytes())
    fives = np.array([5, 5, 5, 5], np.uint16)
    write_rox([fives], tmp_path / "t_0001.rox", block_size=8, if_exists="overwrite")
    assert _tokens(str(tmp_path / "t.rox")) == [0, 1, 2, 3, 5, 5, 5, 5]


HASHER = r"""
import os, sys
from grain_rox._format._hash_cache import cached_sha256
print("ready", flush=True)
print(cached_sha256(sys.argv[1], os.stat(sys.argv[1])), flush=True)
"""


def test_processes_hashing_one_file_version_wait_for_the_first(tmp_path, monkeypatch):
    """Processes starting together on one host hash a copied shard once: while one holds the
    entry's lock, another waits and then reads the digest the first remembered."""
    import time

    from grain_rox._format import _hash_cache

    monkeypatch.setenv("GRAIN_ROX_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "copy.rox"
    data.write_bytes(b"abc")
    st = os.stat(data)
    key = (os.path.realpath(data), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    entry = _hash_cache._entry_path(key)
    remembered = "0" * 64  # not the file's sha256: proves the waiter read the entry
    with _hash_cache._entry_lock(entry):  # this process is hashing it now
        child = subprocess.Popen(
            [sys.executable, "-c", HASHER, str(data)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        time.sleep(1.0)  # the child reaches the lock and waits
        _hash_cache._write_entry(entry, remembered)
    out, _ = child.communicate(timeout=60)
    assert out == remembered + "\n"


def test_a_killed_first_write_is_named_where_no_shard_is_found(tmp_path, capsys):
    """A write killed before its first rename leaves only temporaries: opening the set (or its
    directory) and ``inspect`` say so, naming them and the fix, not only "no .rox shard"."""
    names = [".set_0000.rox.999999999.0badcafe.tmp", ".set.manifest.json.999999999.0badcafe.tmp"]
    for name in names:
        (tmp_path / name).write_bytes(b"\0" * 64)
    note = (
        f"a killed write left 2 temporary files beside it ({names[1]}, {names[0]}), none of "
        "them a shard: run the write again (it removes them) or delete them"
    )
    for spec in (str(tmp_path / "set.rox"), str(tmp_path)):
        with pytest.raises(FileNotFoundError) as info:
            open_rox(spec)
        assert str(info.value).startswith("no .rox shard found for ")
        assert note in str(info.value)
    assert cli_main(["inspect", str(tmp_path / "set.rox")]) != 0
    assert note in capsys.readouterr().err
    _write(str(tmp_path / "set.rox"), 1, 2)  # the next write removes them
    assert not any(name in os.listdir(tmp_path) for name in names)


def _trace_file_operations(monkeypatch) -> list[tuple[str, ...]]:
    """Record, in order, each fsync (as the path its descriptor names), replace / rename
    (source, destination) and unlink / remove of this process."""
    events: list[tuple[str, ...]] = []
    real = {name: getattr(os, name) for name in ("fsync", "replace", "rename", "unlink", "remove")}

    def fsync(fd):
        events.append(("fsync", os.path.realpath(os.readlink(f"/proc/self/fd/{int(fd)}"))))
        return real["fsync"](fd)

    def moved(name):
        def move(src, dst, *args, **kwargs):
            events.append(("replace", os.path.realpath(src), os.path.realpath(dst)))
            return real[name](src, dst, *args, **kwargs)

        return move

    def removed(name):
        def remove(path, *args, **kwargs):
            events.append(("unlink", os.path.realpath(path)))
            return real[name](path, *args, **kwargs)

        return remove

    monkeypatch.setattr(os, "fsync", fsync)
    for name in ("replace", "rename"):
        monkeypatch.setattr(os, name, moved(name))
    for name in ("unlink", "remove"):
        monkeypatch.setattr(os, name, removed(name))
    return events


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names descriptors via /proc")
@pytest.mark.parametrize(
    ("old", "new", "shard", "manifest"),
    [
        (None, (2, 6, "error"), None, True),
        ((1, 4, "error"), (2, 3, "append"), None, True),
        ((1, 4, "error"), (2, 9, "overwrite"), None, True),
        (None, (2, 8, "error"), 100, True),
        ((1, 4, "error"), (2, 5, "append"), 100, True),
        ((1, 10, "error"), (2, 3, "overwrite"), 100, True),
        ((1, 8, "error"), (2, 3, "overwrite"), 100, False),
    ],
    ids=[
        "single-new",
        "single-append",
        "single-overwrite",
        "sharded-new",
        "sharded-append",
        "sharded-overwrite-shrink",
        "sharded-overwrite-no-manifest",
    ],
)
def test_every_file_is_fsynced_before_its_rename_and_every_rename_is_made_durable(
    tmp_path, monkeypatch, old, new, shard, manifest
):
    """Atomic writes survive a power loss, which a kill does not show: each file renamed into
    place was fsynced under its temporary name first, the directory is fsynced after every
    rename and deletion before the write returns, and the pending manifest's rename is durable
    before the first shard is renamed (else a crash could show new shards and no record of
    the write that put them there)."""
    path = str(tmp_path / "set.rox")

    def write(seed: int, n: int, mode: str) -> None:
        write_rox(_docs(seed, n), path, block_size=16, separator=0, max_shard_bytes=shard,
                  if_exists=mode, manifest=manifest)  # fmt: skip

    if old is not None:
        write(*old)
    events = _trace_file_operations(monkeypatch)
    write(*new)
    monkeypatch.undo()
    directory = os.path.realpath(tmp_path)
    renames = [i for i, e in enumerate(events) if e[0] == "replace"]
    assert renames, events
    for i in renames:
        _, src, dst = events[i]
        assert ("fsync", src) in events[:i], f"{dst} renamed from {src}, never fsynced: {events}"

    def stage(e: tuple[str, ...]) -> str | None:
        """A visible change of the directory: shard renames, manifest renames, deletions."""
        name = os.path.basename(e[-1])
        if e[0] not in ("replace", "unlink") or name.startswith("."):  # a lock, a temporary
            return None
        return "unlink" if e[0] == "unlink" else os.path.splitext(name)[1]

    changes = [(i, stage(e)) for i, e in enumerate(events) if stage(e)]
    for i, kind in changes:  # durable before the next change of another kind (or the return)
        end = next((j for j, k in changes if j > i and k != kind), len(events))
        assert ("fsync", directory) in events[i + 1 : end], f"{events[i]} not durable: {events}"
    manifests = [i for i in renames if events[i][2].endswith(".manifest.json")]
    shards = [i for i in renames if events[i][2].endswith(".rox")]
    if shard is not None and manifests:  # a set: its pending manifest comes first
        assert manifests[0] < shards[0], events
        assert ("fsync", directory) in events[manifests[0] + 1 : shards[0]], events


def _run_driver(driver: str, spec: dict) -> Any:
    """Run a kill-test driver script in a child process; the JSON of its last output line."""
    out = subprocess.run(
        [sys.executable, "-c", driver, json.dumps(spec)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_open_that_races_a_growing_overwrite_reads_the_whole_new_set(tmp_path, monkeypatch):
    """The files were listed, then an overwrite that adds shards finished, then their facts
    were read: consistent with the new manifest, so a prefix of the new set was served (32 of
    80 tokens), neither old nor new, silently. The files are listed again after the facts."""
    import grain_rox._format._rox_corpus as rox_corpus

    path = str(tmp_path / "set.rox")
    old = [np.arange(1, 13, dtype=np.uint16)] * 2
    new = [np.arange(100, 116, dtype=np.uint16)] * 5
    write_rox(old, path, separator=0, block_size=32, max_shard_bytes=100)
    real, raced = rox_corpus.load_shard_facts, []

    def overwritten_meanwhile(*args, **kwargs):
        if not raced:
            raced.append(True)
            write_rox(new, path, separator=0, block_size=32, max_shard_bytes=100,
                      if_exists="overwrite")  # fmt: skip
        return real(*args, **kwargs)

    monkeypatch.setattr(rox_corpus, "load_shard_facts", overwritten_meanwhile)
    for spec in (path, str(tmp_path), str(tmp_path / "set_*.rox")):
        raced.clear()
        write_rox(old, path, separator=0, block_size=32, max_shard_bytes=100,
                  if_exists="overwrite")  # fmt: skip
        with open_rox(spec) as corpus:
            served = corpus.tokens(0, corpus.num_tokens)
        expected = np.concatenate([np.append(d, 0) for d in new])
        assert raced and np.array_equal(served[: expected.size], expected), spec
        assert corpus.num_documents == 5


def test_a_full_disk_at_the_final_manifest_says_the_write_is_in_place(tmp_path, monkeypatch):
    """The final manifest is written after the shards are in place: a full disk there raised
    a bare ENOSPC, though readers already saw the append, and running it again appended the
    documents twice."""
    import errno

    import grain_rox._format._shard_set as shard_set

    path = str(tmp_path / "a.rox")
    first, second = [np.arange(1, 9, dtype=np.uint16)], [np.arange(20, 28, dtype=np.uint16)]
    write_rox(first, path, separator=0, block_size=16, max_shard_bytes=64)
    real, calls = shard_set.write_manifest, []

    def full_at_the_end(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(shard_set, "write_manifest", full_at_the_end)
    with pytest.raises(OSError) as info:
        write_rox(second, path, separator=0, block_size=16, max_shard_bytes=64,
                  if_exists="append")  # fmt: skip
    assert info.value.errno == errno.ENOSPC
    assert str(info.value).endswith(
        f"No space left on device while publishing {tmp_path / 'a'}, after every shard of this "
        "write was in place: readers see the new set, and the next write to it finishes this "
        "one (its manifest). Do not run this write again: an append would add its documents "
        "twice"
    )
    monkeypatch.setattr(shard_set, "write_manifest", real)
    with open_rox(path) as corpus:
        assert corpus.num_documents == 2
