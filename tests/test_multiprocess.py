"""Real multi-process JAX over loopback: global batches, rows per process, elastic resume.

Workers (tests/multiprocess_worker.py) are separate Python processes that call
``jax.distributed.initialize`` against a coordinator on 127.0.0.1 and each own a few CPU
devices. Everything they see is compared bit for bit with ``pipeline.map_dataset()[k]``
computed here, in one process. This process never calls ``jax.distributed``; it only saves
and restores single-process checkpoints (it is a one-process JAX program with 8 devices).

Cost: two waves of workers (2 processes, then 4), ~5 s of imports each per process.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
from _corpora import random_documents

import grain_rox
from grain_rox import (
    MultiHostDataLoadIterator,
    RoxCheckpointRestore,
    RoxCheckpointSave,
    TokenPipeline,
    testing,
)
from grain_rox._sources._segments import MAXTEXT_FEATURES

WORKER = Path(__file__).with_name("multiprocess_worker.py")
TIMEOUT = 120.0
SEQ_LEN = 64
BATCH = 16
SEED = 3
CONFIG = {"seq_len": SEQ_LEN, "global_batch_size": BATCH, "seed": SEED}


# ---- spawning workers ------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(num_processes: int, plan: dict, work: Path) -> tuple[float, float]:
    """Run ``num_processes`` workers on ``plan`` concurrently; return (wall, CPU) seconds.

    Every worker is killed on timeout, or shortly after another one fails (the others would
    wait for it at the next barrier). On failure every worker's stderr is printed and put
    in the assertion message.
    """
    work.mkdir(parents=True, exist_ok=True)
    plan = {**plan, "port": free_port(), "num_processes": num_processes}
    plan_path = work / "plan.json"
    plan_path.write_text(json.dumps(plan))
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={8 // num_processes}",
        "JAX_PLATFORMS": "cpu",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("JAX_NUM_PROCESSES", None)
    logs = [work / f"worker{i}.log" for i in range(num_processes)]
    procs: list[subprocess.Popen] = []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    try:
        for i in range(num_processes):
            with open(logs[i], "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, str(WORKER), str(plan_path), str(i)],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=str(work),
                    )
                )
        problem = None
        failed_at = None
        while problem is None:
            codes = [p.poll() for p in procs]
            if all(c == 0 for c in codes):
                break
            now = time.monotonic()
            if any(c not in (None, 0) for c in codes):
                failed_at = failed_at or now
                if all(c is not None for c in codes) or now - failed_at > 5:
                    problem = f"worker exit codes {codes}"
            if now - start > TIMEOUT:
                problem = f"timed out after {TIMEOUT:.0f} s (exit codes {codes})"
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
    if problem is not None:
        report = "\n".join(
            f"----- worker {i} of {num_processes} (exit {p.returncode}) -----\n"
            + logs[i].read_text(errors="replace")[-6000:]
            for i, p in enumerate(procs)
        )
        print(report, file=sys.stderr)
        pytest.fail(f"{num_processes}-process run failed: {problem}\n{report}", pytrace=False)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu


def load_outputs(out_dir: Path, tag: str, num_processes: int) -> list[dict]:
    """Per process: {"meta": dict, "local": {key: [step arrays]}, "global": {...}}."""
    result = []
    for p in range(num_processes):
        with np.load(out_dir / f"{tag}_p{p}.npz") as z:
            meta = json.loads(str(z["meta"]))
            n = meta["end_step"] - meta["start_step"]
            result.append(
                {
                    "meta": meta,
                    "local": {
                        k: [z[f"local__{k}__{i}"] for i in range(n)] for k in MAXTEXT_FEATURES
                    },
                    "global": {
                        k: [z[f"global__{k}__{i}"] for i in range(n)] for k in MAXTEXT_FEATURES
                    },
                }
            )
    return result


# ---- fixtures ----------------------------------------------------------------------------------
def save_data_checkpoint(directory: Path | str, it: MultiHostDataLoadIterator) -> None:
    """An Orbax checkpoint of ``it``'s data state alone at its step (what each wave restores)."""
    manager = ocp.CheckpointManager(directory)
    manager.save(it.step, args=ocp.args.Composite(data=RoxCheckpointSave(it)))
    manager.wait_until_finished()
    manager.close()


def checkpoint_after(pipe: TokenPipeline, steps: int, directory: Path | str) -> None:
    """:func:`save_data_checkpoint` of a one-process iterator over ``pipe`` after ``steps``
    batches."""
    with MultiHostDataLoadIterator(pipe) as it:
        for _ in range(steps):
            next(it)
        save_data_checkpoint(directory, it)


@pytest.fixture(scope="module")
def corpus(make_rox) -> str:
    """~300k random uint16 tokens in documents separated by 0 (so segmentation features)."""
    docs = random_documents(1234, lengths=(1, 3000), high=65535, until_tokens=300_000)
    return make_rox("mp", docs, separator=0)


@pytest.fixture(scope="module")
def pipeline(corpus) -> TokenPipeline:
    return TokenPipeline(corpus, **CONFIG)


@pytest.fixture(scope="module")
def expected(pipeline):
    """Global batch k computed in this one process, with numpy only."""
    ds = pipeline.map_dataset()
    cache: dict[int, dict[str, np.ndarray]] = {}

    def batch(k: int) -> dict[str, np.ndarray]:
        if k not in cache:
            cache[k] = {key: np.array(v) for key, v in ds[k].items()}
        return cache[k]

    first = batch(0)
    assert tuple(first) == MAXTEXT_FEATURES  # segmentation features are present
    # documents do end inside windows (of the first batches: one batch may hold no EOS)
    assert max(batch(k)["inputs_segmentation"].max() for k in range(8)) > 1
    return batch


@pytest.fixture(scope="module")
def ckpt_1proc(tmp_path_factory, pipeline, expected) -> Path:
    """A checkpoint at step 10 saved by this (single, 8-device) process."""
    directory = tmp_path_factory.mktemp("ckpt_1proc")
    with MultiHostDataLoadIterator(pipeline) as it:
        for k in range(10):
            batch = next(it)
            assert np.array_equal(np.asarray(batch["inputs"]), expected(k)["inputs"])
        save_data_checkpoint(directory, it)
    return directory


@pytest.fixture(scope="module")
def epoch_end(pipeline) -> int:
    """A step 3 batches before the first epoch ends: batches [k, k + 6) cross into epoch 1."""
    one_epoch = TokenPipeline(pipeline.paths, **CONFIG, num_epochs=1)
    assert 30 < one_epoch.num_batches == len(one_epoch.map_dataset()) < 1000
    return one_epoch.num_batches - 3


@pytest.fixture(scope="module")
def ckpt_near_epoch_end(tmp_path_factory, pipeline, epoch_end) -> Path:
    """A single-process checkpoint at step ``epoch_end`` (set directly: resume is O(1))."""
    directory = tmp_path_factory.mktemp("ckpt_epoch")
    with MultiHostDataLoadIterator(pipeline) as it:
        state = json.loads(it.get_state())
        it.set_state(json.dumps({**state, "step": epoch_end}).encode())
        save_data_checkpoint(directory, it)
    return directory


@pytest.fixture(scope="module")
def waves(tmp_path_factory, corpus, ckpt_1proc, ckpt_near_epoch_end, epoch_end):
    """Runs the worker waves once, on demand: 2 processes, then 4 (they need the 2's ckpt)."""
    root = tmp_path_factory.mktemp("mp")
    out_dir = root / "out"
    out_dir.mkdir()
    ckpt_2proc = root / "ckpt_2proc"
    done: dict[int, dict] = {}

    def wave(n: int) -> dict:
        if n in done:
            return done[n]
        base = {"corpus": corpus, "out_dir": str(out_dir), "pipeline": CONFIG}
        if n == 2:
            np.save(root / "rows.npy", np.arange(200 * 3, dtype=np.int32).reshape(200, 3))
            base["npy"] = {"path": str(root / "rows.npy"), "batch": 8, "seed": 5, "read": 30}
            base["features_on_device"] = True  # see multiprocess_worker.py
            runs = [
                # Fresh: 20 batches, checkpoint after 10 (then keep going).
                {"tag": "fresh2", "read": 20, "save": {"dir": str(ckpt_2proc), "after": 10}},
                # Elastic 1 -> 2: the single-process checkpoint at step 10.
                {"tag": "from1", "read": 10, "restore": {"dir": str(ckpt_1proc), "step": 10}},
            ]
        else:
            wave(2)  # the 2-process checkpoint must exist first
            runs = [
                {"tag": f"fresh{n}", "read": 20},
                {"tag": "from2", "read": 10, "restore": {"dir": str(ckpt_2proc), "step": 10}},
                # Across the end of the first epoch, from a single-process checkpoint.
                {
                    "tag": "epoch",
                    "read": 6,
                    "restore": {"dir": str(ckpt_near_epoch_end), "step": epoch_end},
                },
            ]
        wall, cpu = run_workers(n, {**base, "runs": runs}, root / f"work{n}")
        print(f"\n{n}-process wave: {wall:.1f} s wall, {cpu:.1f} s CPU in the workers")
        done[n] = {
            "out_dir": out_dir,
            "root": root,
            "ckpt_2proc": ckpt_2proc,
            **{run["tag"]: load_outputs(out_dir, run["tag"], n) for run in runs},
        }
        return done[n]

    return wave


def assert_batches_equal(outputs: list[dict], expected, first_step: int, count: int) -> None:
    """Every process's global view and own rows equal the single-process batches."""
    n = len(outputs)
    for proc in outputs:
        meta = proc["meta"]
        assert meta["start_step"] == first_step
        assert meta["end_step"] == first_step + count
        lo, hi = meta["rows"]
        for i in range(count):
            want = expected(first_step + i)
            for key in MAXTEXT_FEATURES:
                got_global = proc["global"][key][i]
                got_local = proc["local"][key][i]
                where = f"process {meta['process_index']}/{n}, step {first_step + i}, {key}"
                assert got_global.dtype == want[key].dtype, where
                assert got_global.shape == (BATCH, SEQ_LEN), where
                assert np.array_equal(got_global, want[key]), where
                assert got_local.shape == (BATCH // n, SEQ_LEN), where
                assert np.array_equal(got_local, want[key][lo:hi]), where


# ---- 1. global batches equal the single-process ones -------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("num_processes", [2, 4])
def test_global_batches_equal_single_process_bit_for_bit(waves, expected, num_processes):
    outputs = waves(num_processes)[f"fresh{num_processes}"]
    assert len(outputs) == num_processes
    assert_batches_equal(outputs, expected, first_step=0, count=20)


@pytest.mark.slow
@pytest.mark.parametrize("num_processes", [2, 4])
def test_each_process_reads_only_its_own_rows(waves, num_processes):
    """(TokenPipeline; see also the NumPy batches test below.)"""
    outputs = waves(num_processes)[f"fresh{num_processes}"]
    per_process = BATCH // num_processes
    spans = []
    for p, proc in enumerate(outputs):
        meta = proc["meta"]
        assert meta["process_index"] == p
        assert meta["process_count"] == num_processes
        assert meta["local_device_count"] == 8 // num_processes
        assert meta["device_count"] == 8
        assert meta["global_shapes"] == {k: [BATCH, SEQ_LEN] for k in MAXTEXT_FEATURES}
        lo, hi = meta["rows"]
        assert hi - lo == per_process
        spans.append((lo, hi))
        # The process's addressable shards are exactly rows [lo, hi), one slice per device.
        for shards in meta["shard_rows"]:
            assert len(shards) == 8 // num_processes
            assert shards[0][0] == lo and shards[-1][1] == hi
            for (a, b, size), nxt in zip(shards, [*shards[1:], [hi]], strict=True):
                assert size == b - a == BATCH // 8 and nxt[0] == b
        for key in MAXTEXT_FEATURES:
            assert all(x.shape == (per_process, SEQ_LEN) for x in proc["local"][key])
    # Together the processes hold every row once.
    assert sorted(spans) == [(i * per_process, (i + 1) * per_process) for i in range(num_processes)]


# ---- 2. elastic resume across process counts ---------------------------------------------------
@pytest.mark.slow
def test_two_process_checkpoint_is_one_global_file(waves):
    ckpt = waves(2)["ckpt_2proc"]
    data_dir = ckpt / "10" / "data"
    names = sorted(p.name for p in data_dir.iterdir())
    assert "data_state.json" in names
    assert not [name for name in names if name.startswith("process_")], names  # no per-process
    state = json.loads((data_dir / "data_state.json").read_text())
    assert state["step"] == 10
    assert state["pipeline"]["seed"] == SEED


@pytest.mark.slow
def test_resume_two_processes_into_one(waves, pipeline, expected):
    ckpt = waves(2)["ckpt_2proc"]
    with MultiHostDataLoadIterator(pipeline) as it:  # this process: 1 process, 8 devices
        manager = ocp.CheckpointManager(ckpt)
        restored = manager.restore(10, args=ocp.args.Composite(data=RoxCheckpointRestore(it)))
        manager.close()
        assert restored["data"] is it
        assert it.step == 10
        for k in range(10, 20):
            batch = next(it)
            for key in MAXTEXT_FEATURES:
                assert np.array_equal(np.asarray(batch[key]), expected(k)[key]), (k, key)
        assert it.step == 20


@pytest.mark.slow
def test_resume_two_processes_into_four(waves, expected):
    outputs = waves(4)["from2"]
    assert len(outputs) == 4
    assert_batches_equal(outputs, expected, first_step=10, count=10)


@pytest.mark.slow
def test_resume_one_process_into_two(waves, expected):
    outputs = waves(2)["from1"]
    assert len(outputs) == 2
    assert_batches_equal(outputs, expected, first_step=10, count=10)


@pytest.mark.slow
def test_resume_across_the_epoch_boundary_on_four_processes(waves, expected, epoch_end):
    outputs = waves(4)["epoch"]
    assert_batches_equal(outputs, expected, first_step=epoch_end, count=6)


# ---- 3. a changed config is refused --------------------------------------------------------------
@pytest.mark.parametrize("name", ["seed", "seq_len"])
def test_restore_into_changed_pipeline_is_refused(ckpt_1proc, corpus, name):
    old = CONFIG[name]
    new = {"seed": SEED + 1, "seq_len": SEQ_LEN // 2}[name]
    other = TokenPipeline(corpus, **{**CONFIG, name: new})
    # The message names what changed, with the saved value before the new one.
    says_what_changed = rf"\b{name}\b\W.*\b{old}\b.*\b{new}\b"
    with MultiHostDataLoadIterator(other) as it:
        manager = ocp.CheckpointManager(ckpt_1proc)
        with pytest.raises(ValueError, match=says_what_changed):
            manager.restore(10, args=ocp.args.Composite(data=RoxCheckpointRestore(it)))
        manager.close()
        assert it.step == 0  # nothing was applied
        # Direct set_state refuses the same way.
        saved = (ckpt_1proc / "10" / "data" / "data_state.json").read_text()
        with pytest.raises(ValueError, match=says_what_changed):
            it.set_state(saved)
        assert it.step == 0
    # The unchanged config restores fine from the same file.
    with MultiHostDataLoadIterator(TokenPipeline(corpus, **CONFIG)) as it:
        it.set_state(saved)
        assert it.step == 10


@pytest.mark.slow
def test_numpy_batches_on_two_processes_equal_single_process_batches(waves):
    """``NumpySource.batches(shard=(process, count))`` through the iterator on 2 processes:
    the global arrays are the single-process batches, each process holding its half."""
    wave = waves(2)
    expected = grain_rox.NumpySource(str(wave["root"] / "rows.npy")).batches(
        8, seed=5, num_epochs=-1
    )
    for p in range(2):
        with np.load(wave["out_dir"] / f"npy_p{p}.npz") as z:
            for i in range(30):  # 25 batches per epoch: crosses into the second epoch
                want = expected[i]
                assert np.array_equal(z[f"global__{i}"], want), (p, i)
                assert np.array_equal(z[f"local__{i}"], want[p * 4 : (p + 1) * 4]), (p, i)


def _whole_batches_on_a_mesh_whose_processes_share_the_rows(path: str):
    """(For the test below: built here and in each process.) The data axis within a process,
    the 'model' axis across processes: every process holds every row of a batch."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.asarray(jax.devices()).reshape(2, 4).T, ("data", "model"))
    ds = grain_rox.NumpySource(path).batches(8, seed=5)  # whole batches, in every process
    return MultiHostDataLoadIterator(ds, data_sharding=NamedSharding(mesh, PartitionSpec("data")))


@pytest.mark.slow
def test_a_grain_input_on_a_mesh_whose_processes_share_the_rows(tmp_path):
    """A Grain input's batch is as many rows as each process gives where the processes hold
    the same rows (it was taken for 2x as many, and JAX refused the host data)."""
    import functools

    np.save(tmp_path / "rows.npy", np.arange(64 * 4, dtype=np.int32).reshape(64, 4))
    make = functools.partial(
        _whole_batches_on_a_mesh_whose_processes_share_the_rows, str(tmp_path / "rows.npy")
    )
    with make() as it:
        assert np.asarray(next(it)).shape == (8, 4)
    testing.check_processes_equal(make, read=3)


def _rows_split_unevenly(path: str):
    """(For the test below: built in each process.) Process 0 gets 9 of the 17 rows (2 batches
    of up to 8), process 1 gets 8 (1 batch)."""
    import grain
    import jax

    rows = np.load(path)[jax.process_index() :: jax.process_count()]
    return MultiHostDataLoadIterator(grain.MapDataset.source(list(rows)).batch(8))


@pytest.mark.slow
def test_a_grain_input_with_more_batches_in_one_process_is_refused_when_made(tmp_path):
    """One process's input ending first would stop it, and the other would wait for it in its
    training step for ever: the lengths are compared when the iterator is made, and every
    process refuses, naming each one's count and the fix."""
    _refused_in_both_processes(
        tmp_path, 17, _rows_split_unevenly,
        says="the Grain input gives the processes different numbers of batches (process 0: 2, "
        "process 1: 1)",
        fix="shard=(jax.process_index(), jax.process_count())",
    )  # fmt: skip


def _last_batches_of_different_sizes(path: str):
    """(For the test below: built in each process.) Two batches in each process, of 12 rows
    then 8 (process 0, 20 rows) or 4 (process 1, 16 rows): each process's rows split over its
    4 devices, but the last global batches would be 16 rows in one process and 8 in the other.
    One process alone reads 24 rows in batches of 8."""
    import grain
    import jax

    rows = np.load(path)
    if jax.process_count() == 1:
        return MultiHostDataLoadIterator(grain.MapDataset.source(list(rows[:24])).batch(8))
    mine = rows[:20] if jax.process_index() == 0 else rows[20:36]
    return MultiHostDataLoadIterator(grain.MapDataset.source(list(mine)).batch(12))


@pytest.mark.slow
def test_a_grain_input_whose_last_batches_differ_between_processes_is_refused_when_made(tmp_path):
    """Each process's rows split over its devices, but their last batches differ: the two
    processes would make global arrays of different shapes (a Gloo "collective mismatch"
    abort, or a hang). The last batches' sizes are compared when the iterator is made."""
    _refused_in_both_processes(
        tmp_path, 40, _last_batches_of_different_sizes,
        says="the Grain input's last batch makes global batches of different numbers of rows "
        "in the processes (process 0: 16, process 1: 8)",
        fix="drop_remainder=True",
    )  # fmt: skip


def _refused_in_both_processes(
    tmp_path, rows: int, make, *, says: str, fix: str, count: int = 2
) -> None:
    """Two processes make ``make(path)``'s iterator over a file of ``rows`` rows: each refuses
    with a ValueError, ``count`` of them saying ``says`` and naming ``fix`` (the others that a
    process refused it)."""
    import functools

    np.save(tmp_path / "rows.npy", np.arange(rows * 4, dtype=np.int32).reshape(rows, 4))
    with pytest.raises(AssertionError) as failed:
        testing.check_processes_equal(functools.partial(make, str(tmp_path / "rows.npy")), read=1)
    message = str(failed.value)
    assert message.count(f"ValueError: {says}") == count, message
    assert message.count("ValueError: ") == 2 and fix in message, message


def _batches_on_meshes(path: str):
    """(For the test below: built in each process.) One NumpySource's .batches() read three
    ways, each step's global batches zipped: the whole batch on every process (shard (0, 1)),
    the same over a mesh listing the processes' devices last-first, and each process's own
    shard on the default mesh."""
    import jax
    from jax.sharding import Mesh

    from grain_rox import NumpySource

    rows = np.load(path)
    reversed_mesh = Mesh(np.asarray(jax.devices()[::-1]), ("data",))
    mine = (jax.process_index(), jax.process_count())
    ways = {
        "whole": MultiHostDataLoadIterator(NumpySource(rows).batches(16, seed=1)),
        "reversed": MultiHostDataLoadIterator(
            NumpySource(rows).batches(16, seed=1), mesh=reversed_mesh
        ),
        "own": MultiHostDataLoadIterator(NumpySource(rows).batches(16, seed=1, shard=mine)),
    }
    return (dict(zip(ways, step, strict=True)) for step in zip(*ways.values(), strict=False))


@pytest.mark.slow
def test_a_batches_dataset_gives_the_one_process_batches_whatever_its_shard_and_mesh(tmp_path):
    """A .batches() dataset's elements were taken as each process's rows: read whole on every
    process (shard (0, 1)), its rows were doubled into a (32, 4) batch (the device path gave
    the right (16, 4)); each process now keeps the rows its devices hold. The reversed mesh
    holds process 1's rows first: each process keeps them, not its index's."""
    import functools

    np.save(tmp_path / "rows.npy", np.arange(64 * 4, dtype=np.int32).reshape(64, 4))
    testing.check_processes_equal(
        functools.partial(_batches_on_meshes, str(tmp_path / "rows.npy")), read=3
    )


def _shards_refused(path: str):
    """(For the test below: built in each process.) Both processes give shard (0, 2): process
    1's devices hold rows [8, 16) of each batch of 16, which that shard does not read."""
    import jax

    from grain_rox import NumpySource

    rows = np.load(path)
    shard = (0, 2) if jax.process_count() == 2 else (0, 1)  # (one process: the batches to be)
    return MultiHostDataLoadIterator(NumpySource(rows).batches(16, seed=1, shard=shard))


@pytest.mark.slow
def test_a_batches_shard_that_is_not_the_processes_rows_is_refused_by_every_process(tmp_path):
    """A shard that does not read the rows a process's devices hold assembled the batch from
    the wrong rows (here process 0's rows twice), silently. That process refuses, naming the
    shard it needs; the other, whose shard is right, stops too instead of waiting for it in
    the iterator's collective."""
    import functools

    np.save(tmp_path / "rows.npy", np.arange(64 * 4, dtype=np.int32).reshape(64, 4))
    with pytest.raises(AssertionError) as failed:
        testing.check_processes_equal(
            functools.partial(_shards_refused, str(tmp_path / "rows.npy")), read=1
        )
    message = str(failed.value)
    assert (
        message.count(
            "ValueError: the .batches() dataset's shard=(0, 2) gives this process rows [0, 8) of "
            "each global batch of 16, but its devices hold rows [8, 16) under this mesh: the batch "
            "would be assembled from the wrong rows. Make it with shard=(1, 2), or pass "
            "placement='device'"
        )
        == 1
    ), message
    assert (
        message.count(
            "ValueError: process 1 refused this iterator's input when it was made (each says why "
            "in its own error); this process stops too rather than wait for them"
        )
        == 1
    ), message


def _whole_batches_mapped(path: str):
    """(For the test below: built in each process.) The whole batch on every process, then a
    .map: the rows each process's devices hold cannot be cut from what the map returns."""
    from grain_rox import NumpySource

    rows = np.load(path)
    return MultiHostDataLoadIterator(NumpySource(rows).batches(16, seed=1).map(lambda b: b + 1))


@pytest.mark.slow
def test_a_transformed_batches_dataset_of_the_whole_batch_is_refused_by_every_process(tmp_path):
    """Read whole on every process and mapped, its rows were doubled into the global batch,
    silently (only a bare .batches() keeps each process's rows); refused, naming the shard."""
    _refused_in_both_processes(
        tmp_path, 64, _whole_batches_mapped,
        says="the .batches() dataset's shard=(0, 1) gives this process rows [0, 16) of each "
        "global batch of 16 and transformed after it (its rows cannot be cut), but its devices "
        "hold rows [",
        fix="Make it with shard=(1, 2)",
    )  # fmt: skip


def _overlapping_mesh():
    """A (data=4, model=2) mesh whose model pairs span the processes: each process's devices
    hold rows of 3 of the 4 data pieces (12 of 16 rows)."""
    import jax
    from jax.sharding import Mesh

    devices = sorted(jax.devices(), key=lambda d: d.id)
    order = [0, 3, 1, 5, 2, 6, 4, 7]
    return Mesh(np.asarray([devices[i] for i in order]).reshape(4, 2), ("data", "model"))


def _pipeline_on_an_overlapping_mesh(path: str):
    """(For the test below: built in each process.)"""
    return MultiHostDataLoadIterator(TokenPipeline(path, **CONFIG), mesh=_overlapping_mesh())


def _grain_input_on_an_overlapping_mesh(path: str):
    """(For the test below: built in each process.)"""
    import grain

    rows = list(np.load(path))
    ds = grain.MapDataset.source(rows).batch(16)
    return MultiHostDataLoadIterator(ds, mesh=_overlapping_mesh())


@pytest.mark.slow
def test_a_pipeline_on_a_mesh_of_overlapping_process_rows_gives_the_one_process_batches(
    tmp_path, make_rox
):
    """Each process holds 12 of a batch's 16 rows: the global batch was taken as a multiple
    of that share (12 rows, replicas disagreeing), silently. A Grain input, which gives each
    process's rows as it reads them, cannot serve such a mesh: refused by every process."""
    import functools

    path = make_rox("overlap", random_documents(7, lengths=(1, 300), until_tokens=20_000),
                    separator=0)  # fmt: skip
    testing.check_processes_equal(functools.partial(_pipeline_on_an_overlapping_mesh, path), read=2)
    _refused_in_both_processes(
        tmp_path, 32, _grain_input_on_an_overlapping_mesh,
        says="this mesh gives the processes overlapping shares of each batch (in 4 pieces: "
        "[0, 3), [1, 4)), which a Grain input of each process's own rows cannot give",
        fix="read a TokenPipeline",
    )  # fmt: skip


# ---- 4. a mixture curriculum restores elastically across its phase change ------------------------
@pytest.mark.slow
def test_a_mixture_curriculum_restores_1_to_2_to_4_processes_across_its_phase_change(
    tmp_path, make_rox
):
    """Elastic resume with mixing and phases: saved on 1 process in phase 1 (batch 16 of 16
    tokens, weights 0.7/0.3), restored on 2 processes, read across the change to phase 2
    (batch 8 of 32 tokens, weights 0.2/0.8) and saved there, restored on 4: every global
    batch and every process's own rows are the single-process batches of the same steps."""

    from grain_rox import Phase

    sources = {
        "a": make_rox("elastic_a", random_documents(5, lengths=(1, 400), high=30000,
                                                    until_tokens=40_000), separator=0),
        "b": make_rox("elastic_b", random_documents(6, lengths=(1, 900), high=30000,
                                                    until_tokens=60_000), separator=0),
    }  # fmt: skip
    phases = [
        {"steps": 6, "batch_size": 16, "seq_len": 16, "weights": {"a": 0.7, "b": 0.3}},
        {"steps": None, "batch_size": 8, "seq_len": 32, "weights": {"a": 0.2, "b": 0.8}},
    ]
    config = {"phases": phases, "seed": 8}
    pipe = TokenPipeline(sources, phases=[Phase(**p) for p in phases], seed=8)
    ds = pipe.map_dataset()
    ckpt1, ckpt2, out = tmp_path / "ckpt1", tmp_path / "ckpt2", tmp_path / "out"
    out.mkdir()
    checkpoint_after(pipe, 4, ckpt1)
    base = {"corpus": sources, "out_dir": str(out), "pipeline": config}
    two = [{"tag": "from1", "read": 6, "restore": {"dir": str(ckpt1), "step": 4},
            "save": {"dir": str(ckpt2), "after": 6}}]  # fmt: skip
    four = [{"tag": "from2", "read": 3, "restore": {"dir": str(ckpt2), "step": 10}}]
    run_workers(2, {**base, "runs": two}, tmp_path / "work2")
    run_workers(4, {**base, "runs": four}, tmp_path / "work4")
    for n, tag, first, count in [(2, "from1", 4, 6), (4, "from2", 10, 3)]:
        outputs = load_outputs(out, tag, n)
        assert len(outputs) == n
        for proc in outputs:
            meta = proc["meta"]
            assert (meta["start_step"], meta["end_step"]) == (first, first + count), meta
            for i in range(count):
                want = {key: np.asarray(v) for key, v in ds[first + i].items()}
                lo, hi = meta["rows_by_batch_size"][str(want["inputs"].shape[0])]
                assert hi - lo == want["inputs"].shape[0] // n
                for key in MAXTEXT_FEATURES:
                    where = f"{tag}: process {meta['process_index']}/{n}, step {first + i}, {key}"
                    assert np.array_equal(proc["global"][key][i], want[key]), where
                    assert np.array_equal(proc["local"][key][i], want[key][lo:hi]), where


def _rows_of_a_six_device_mesh(path: str):
    """(For the test below: built in each process.) Each process gives its devices' rows of
    every 18-row batch on a mesh over the first 6 devices: with 2 processes of 4 devices,
    process 0 holds 4 of the 6 pieces (rows [0, 12)), process 1 holds 2 (rows [12, 18))."""
    import grain
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = jax.devices()[:6]
    mesh = Mesh(np.asarray(devices), ("data",))
    mine = [i for i, d in enumerate(devices) if d.process_index == jax.process_index()]
    lo, hi = mine[0] * 3, (mine[-1] + 1) * 3
    rows = np.load(path)
    batches = [rows[k * 18 + lo : k * 18 + hi] for k in range(len(rows) // 18)]
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    return MultiHostDataLoadIterator(grain.MapDataset.source(batches), data_sharding=sharding)


@pytest.mark.slow
def test_a_grain_input_on_a_mesh_of_unequal_process_shares_gives_the_one_process_batches(
    tmp_path,
):
    """A global batch was taken for the local rows times processes // pieces held (4 // 6 = 1
    for the process holding 4 of 6 pieces): a MapDataset's correct input was refused as
    "last batches differ", an IterDataset's placed as a (12, 4) global array in one process
    and (18, 4) in the other, then aborted in the next collective."""
    import functools

    np.save(tmp_path / "rows.npy", np.arange(18 * 4 * 4, dtype=np.int32).reshape(18 * 4, 4))
    make = functools.partial(_rows_of_a_six_device_mesh, str(tmp_path / "rows.npy"))
    with make() as it:
        assert np.asarray(next(it)).shape == (18, 4)
    testing.check_processes_equal(make, read=3)


def _pipelines_of_another_seed_per_process(path: str):
    """(For the test below: built in each process.) A TokenPipeline whose seed is 3 plus the
    process index: each process would read its rows of its own run's batches."""
    import jax

    pipe = TokenPipeline(path, seq_len=16, global_batch_size=8, seed=3 + jax.process_index())
    return MultiHostDataLoadIterator(pipe)


@pytest.mark.slow
def test_processes_that_read_different_pipelines_are_refused_when_made(tmp_path, corpus):
    """Each process reads its own rows, so processes built with another seed (or config, or
    copy of the data) joined rows of different runs into one global batch, silently."""
    import functools

    with pytest.raises(AssertionError) as failed:
        make = functools.partial(_pipelines_of_another_seed_per_process, corpus)
        testing.check_processes_equal(make, read=1)
    message = str(failed.value)
    says = "ValueError: the processes read different TokenPipelines (by pipeline: process 0 | "
    assert message.count(says + "process 1; each group its own data, config or seed)") == 2, message
    assert '"seed": 3' in message and '"seed": 4' in message


def _rows_by_device_position(path: str, batch: int):
    """(For the test below: built in each process.) Each process gives its devices' rows of
    every ``batch``-row batch on the default mesh, found from its devices' positions on it."""
    import grain
    import jax

    devices = jax.devices()
    per_device = batch // len(devices)
    mine = [i for i, d in enumerate(devices) if d.process_index == jax.process_index()]
    lo, hi = mine[0] * per_device, (mine[-1] + 1) * per_device
    rows = np.load(path)
    batches = [rows[k * batch + lo : k * batch + hi] for k in range(len(rows) // batch)]
    return MultiHostDataLoadIterator(grain.MapDataset.source(batches))


@pytest.mark.slow
def test_processes_holding_unequal_numbers_of_devices(tmp_path, corpus):
    """With 3 devices in one process and 1 in the other, the checks the processes make
    together failed inside JAX (process_allgather: "cannot reshape array of size 4 into shape
    (2,3)"), for a Grain input and a pipeline alike."""
    import functools

    np.save(tmp_path / "rows.npy", np.arange(16 * 4 * 4, dtype=np.int32).reshape(16 * 4, 4))
    grain_rows = functools.partial(_rows_by_device_position, str(tmp_path / "rows.npy"), 16)
    # (the expected batches come from this process's 8 devices: 16 rows split by 8, then 4)
    testing.check_processes_equal(grain_rows, read=3, devices=(3, 1))
    pipe = TokenPipeline(corpus, seq_len=16, global_batch_size=8, seed=1)
    testing.check_processes_equal(lambda: MultiHostDataLoadIterator(pipe), read=3, devices=(3, 1))


def _a_last_batch_that_a_process_cannot_split(path: str):
    """(For the test below: built in each process.) On a mesh over the first 6 devices,
    process 0 holds 4 pieces and process 1 holds 2: batches of 12 and 6 rows, then a last one
    of 6 rows (process 0's 4 devices cannot split it) and 2. One process reads 18-row batches."""
    import grain
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    rows = list(np.load(path))
    sharding = NamedSharding(Mesh(np.asarray(jax.devices()[:6]), ("data",)), PartitionSpec("data"))
    if jax.process_count() == 1:
        batches = [np.stack(rows[i : i + 18]) for i in (0, 18)]
    elif jax.process_index() == 0:
        batches = [np.stack(rows[a:b]) for a, b in ((0, 12), (18, 30), (36, 42))]
    else:
        batches = [np.stack(rows[a:b]) for a, b in ((12, 18), (30, 36), (42, 44))]
    return MultiHostDataLoadIterator(grain.MapDataset.source(batches), data_sharding=sharding)


@pytest.mark.slow
def test_a_last_batch_a_process_cannot_split_is_refused_by_every_process_when_made(tmp_path):
    """Its rows were compared as if global (6 local rows against 2 * 6 / 2 = 6): the iterator
    was made, and at the last batch one process raised while the other waited for ever."""
    _refused_in_both_processes(
        tmp_path, 44, _a_last_batch_that_a_process_cannot_split,
        says="this process's last batch has 6 rows, which its devices cannot split evenly: "
        "they hold 4 of the 6 pieces",
        fix="the last batch of process 0 cannot be split evenly by its devices",
        count=1,
    )  # fmt: skip
