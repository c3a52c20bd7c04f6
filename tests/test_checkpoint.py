"""Orbax checkpoints of the data position beside a model, restored in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import grain
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from _corpora import random_documents

from grain_rox import (
    MultiHostDataLoadIterator,
    RoxCheckpointRestore,
    RoxCheckpointSave,
    TokenPipeline,
)
from grain_rox._devices._checkpoint import RoxCheckpointHandler

RESTORE_SCRIPT = textwrap.dedent(
    """
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import numpy as np, orbax.checkpoint as ocp, jax, jax.numpy as jnp
    from grain_rox import MultiHostDataLoadIterator, RoxCheckpointRestore, TokenPipeline

    corpus, ckpt, out, step, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    pipe = TokenPipeline(corpus, seq_len=24, global_batch_size=8, seed=11)
    it = MultiHostDataLoadIterator(pipe)
    manager = ocp.CheckpointManager(ckpt)
    abstract = {"w": jax.ShapeDtypeStruct((4, 4), jnp.float32)}
    restored = manager.restore(step, args=ocp.args.Composite(
        model=ocp.args.StandardRestore(abstract), data=RoxCheckpointRestore(it)))
    batches = {f"{k}_{i}": np.asarray(v) for i in range(count) for k, v in next(it).items()}
    np.savez(out, w=np.asarray(restored["model"]["w"]), step=it.step, **batches)
    it.close(); manager.close()
    """
)


@pytest.fixture(scope="module")
def corpus(make_rox):
    return make_rox("ck", random_documents(1, 500, lengths=400, high=500), separator=0)


def make_pipe(corpus: str, **overrides) -> TokenPipeline:
    kwargs = {"seq_len": 24, "global_batch_size": 8, "seed": 11} | overrides
    return TokenPipeline(corpus, **kwargs)


@pytest.mark.slow
def test_model_and_data_restore_in_a_fresh_process_bit_exactly(corpus, tmp_path):
    pipe = make_pipe(corpus)
    it = MultiHostDataLoadIterator(pipe)
    for _ in range(7):
        next(it)
    weights = {"w": jnp.arange(16, dtype=jnp.float32).reshape(4, 4) * 0.5}
    manager = ocp.CheckpointManager(str(tmp_path / "ckpt"))
    manager.save(
        7, args=ocp.args.Composite(model=ocp.args.StandardSave(weights), data=RoxCheckpointSave(it))
    )
    manager.wait_until_finished()
    manager.close()
    assert (
        json.loads((tmp_path / "ckpt" / "7" / "data" / "data_state.json").read_text())["step"] == 7
    )
    uninterrupted = [next(it) for _ in range(100)]
    it.close()

    script = tmp_path / "restore.py"
    script.write_text(RESTORE_SCRIPT)
    out = tmp_path / "restored.npz"
    subprocess.run(
        [sys.executable, str(script), corpus, str(tmp_path / "ckpt"), str(out), "7", "100"],
        check=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    restored = np.load(out)
    np.testing.assert_array_equal(restored["w"], np.asarray(weights["w"]))
    assert int(restored["step"]) == 107
    for i, batch in enumerate(uninterrupted):
        for key, value in batch.items():
            np.testing.assert_array_equal(restored[f"{key}_{i}"], np.asarray(value))


def saved_after_one_batch(corpus: str, tmp_path) -> ocp.CheckpointManager:
    """A checkpoint manager holding step 1: an iterator's data state after one batch."""
    it = MultiHostDataLoadIterator(make_pipe(corpus))
    next(it)
    manager = ocp.CheckpointManager(str(tmp_path / "ckpt"))
    manager.save(1, args=ocp.args.Composite(data=RoxCheckpointSave(it)))
    manager.wait_until_finished()
    it.close()
    return manager


def test_restore_into_other_data_is_refused_naming_the_change(corpus, make_rox, tmp_path):
    manager = saved_after_one_batch(corpus, tmp_path)
    other = make_rox("other", [np.arange(200_000, dtype=np.uint16)], separator=0)
    wrong_data = MultiHostDataLoadIterator(make_pipe(other))
    with pytest.raises(
        ValueError, match=r"the pipeline changed \(data: saved \{'': '[0-9a-f]{16}'\} -> now"
    ):
        manager.restore(1, args=ocp.args.Composite(data=RoxCheckpointRestore(wrong_data)))
    wrong_batch = MultiHostDataLoadIterator(make_pipe(corpus, global_batch_size=16))
    with pytest.raises(ValueError, match=r"changed \(batch_size 8 -> 16\)"):
        manager.restore(1, args=ocp.args.Composite(data=RoxCheckpointRestore(wrong_batch)))
    manager.close()


def test_a_damaged_or_missing_data_state_says_the_checkpoint_is_damaged(corpus, tmp_path):
    """A truncated state file gave a bare JSONDecodeError naming no file, and a deleted one
    blamed a change of process count that never happened."""
    manager = saved_after_one_batch(corpus, tmp_path)
    state = tmp_path / "ckpt" / "1" / "data" / "data_state.json"
    state.write_text(state.read_text()[:40])
    again = MultiHostDataLoadIterator(make_pipe(corpus))
    with pytest.raises(ValueError) as e:
        manager.restore(1, args=ocp.args.Composite(data=RoxCheckpointRestore(again)))
    assert str(e.value).startswith(f"{state}: the data state is not JSON (")
    assert str(e.value).endswith(
        "): the checkpoint is damaged (a truncated or edited file); restore an earlier step"
    )
    state.unlink()
    with pytest.raises(FileNotFoundError) as e:
        manager.restore(1, args=ocp.args.Composite(data=RoxCheckpointRestore(again)))
    assert str(e.value).endswith(
        "no data state file is there (data_state.json or process_<i>-of-<n>.json): the "
        "checkpoint is damaged or was saved without its data state; restore an earlier step"
    )
    again.close()
    manager.close()


def test_grain_own_checkpoint_handler_works_on_our_iterator(corpus, tmp_path):
    pipe = make_pipe(corpus)
    it = MultiHostDataLoadIterator(pipe)
    for _ in range(3):
        next(it)
    manager = ocp.CheckpointManager(str(tmp_path / "g"))
    manager.save(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
    manager.wait_until_finished()
    expected = np.asarray(next(it)["inputs"])
    fresh = MultiHostDataLoadIterator(pipe)
    manager.restore(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)))
    np.testing.assert_array_equal(np.asarray(next(fresh)["inputs"]), expected)
    it.close()
    fresh.close()
    manager.close()


def test_orbax_v1_checkpointables_take_our_iterator_as_they_take_grains(corpus, tmp_path):
    """Orbax v1 saves Grain's iterators (StatefulCheckpointables: async save/load); ours was
    refused ("Could not identify a valid handler"). Its save writes what RoxCheckpointSave
    does (one global file for a TokenPipeline), taken at the batch of the call."""
    v1 = pytest.importorskip("orbax.checkpoint.experimental.v1")
    pipe = make_pipe(corpus)
    it = MultiHostDataLoadIterator(pipe)
    for _ in range(3):
        next(it)
    v1.save_checkpointables(tmp_path / "c", {"data": it})
    expected = np.asarray(next(it)["inputs"])
    assert sorted(os.listdir(tmp_path / "c" / "data")) == ["data_state.json"]
    fresh = MultiHostDataLoadIterator(pipe)
    v1.load_checkpointables(tmp_path / "c", {"data": fresh})
    assert fresh.step == 3
    np.testing.assert_array_equal(np.asarray(next(fresh)["inputs"]), expected)
    wrong = MultiHostDataLoadIterator(make_pipe(corpus, seed=12))
    with pytest.raises(Exception) as refused:  # Orbax wraps the error it got in its own
        v1.load_checkpointables(tmp_path / "c", {"data": wrong})
    assert "seed: saved 11 -> now 12" in str(refused.value.__cause__)
    for x in (it, fresh, wrong):
        x.close()


@pytest.mark.parametrize("wrapped", [True, False])
def test_data_loader_iterators_restore_through_our_handler(corpus, tmp_path, wrapped):
    """A ``grain.DataLoader`` iterator, in a MultiHostDataLoadIterator or bare. A bare one's
    state is bytes, and the restore handed it text (``AttributeError: 'str' object has no
    attribute 'decode'``) after every save had worked."""

    def iterate(pipe: TokenPipeline):
        loader = pipe.data_loader()
        return MultiHostDataLoadIterator(loader) if wrapped else iter(loader)

    pipe = make_pipe(corpus)
    it = iterate(pipe)
    for _ in range(4):
        next(it)
    manager = ocp.CheckpointManager(str(tmp_path / "dl"))
    manager.save(4, args=ocp.args.Composite(data=RoxCheckpointSave(it)))
    manager.wait_until_finished()
    expected = [np.asarray(next(it)["targets"]) for _ in range(3)]
    fresh = iterate(pipe)
    manager.restore(4, args=ocp.args.Composite(data=RoxCheckpointRestore(fresh)))
    assert [np.array_equal(np.asarray(next(fresh)["targets"]), e) for e in expected] == [True] * 3
    other = iterate(make_pipe(corpus, seed=12))
    with pytest.raises(
        ValueError,
        match=r"data_loader\(\) state: its data or config changed \(seed: saved 11 -> now 12; config: saved ",
    ):
        manager.restore(4, args=ocp.args.Composite(data=RoxCheckpointRestore(other)))
    for opened in (it, fresh, other):
        if wrapped:
            opened.close()
    manager.close()


def test_a_state_that_does_not_fit_a_bare_grain_iterator_says_so(tmp_path):
    """Restored through our handler onto a plain Grain dataset's iterator, a ``.batches()``
    state failed with Grain's bare ``KeyError: 'next_index'``."""
    from grain_rox import NumpySource

    rows = NumpySource(np.arange(120, dtype=np.int32).reshape(40, 3))
    it = iter(rows.batches(4, seed=1).to_iter_dataset())
    next(it)
    manager = ocp.CheckpointManager(str(tmp_path / "misfit"))
    manager.save(1, args=ocp.args.Composite(data=RoxCheckpointSave(it)))
    manager.wait_until_finished()
    plain = iter(grain.MapDataset.source(rows).shuffle(seed=1).batch(4).to_iter_dataset())
    with pytest.raises(ValueError, match=r"does not fit this input's iterator, whose state looks"):
        manager.restore(1, args=ocp.args.Composite(data=RoxCheckpointRestore(plain)))
    manager.close()


def test_a_batches_state_restores_on_another_process_count(tmp_path):
    """Per-process states of a sharded ``.batches()`` input are all the same global position:
    files saved by 2 processes restore on 1 (the 2 files are those 2 processes would write)."""
    from grain_rox import NumpySource

    np.save(tmp_path / "rows.npy", np.arange(96, dtype=np.int32).reshape(48, 2))
    source = NumpySource(str(tmp_path / "rows.npy"))

    def device_iter():
        ds = source.batches(8, seed=2, num_epochs=1).to_iter_dataset(
            grain.ReadOptions(num_threads=0)
        )
        return MultiHostDataLoadIterator(ds)

    with device_iter() as it:
        next(it), next(it)
        state = json.loads(it.get_state())
        expected = [np.asarray(next(it)).tolist() for _ in range(2)]
    saved = tmp_path / "ckpt" / "2" / "data"
    saved.mkdir(parents=True)
    for i in range(2):
        (saved / f"process_{i}-of-2.json").write_text(json.dumps(state))
    handler = RoxCheckpointHandler()
    with device_iter() as again:
        handler.restore(saved, RoxCheckpointRestore(again))
        assert again.step == 2 and [np.asarray(next(again)).tolist() for _ in range(2)] == expected
    (saved / "process_1-of-2.json").write_text(json.dumps({**state, "step": 1}))
    with device_iter() as again, pytest.raises(FileNotFoundError, match="no data state for"):
        handler.restore(saved, RoxCheckpointRestore(again))  # states differ: not elastic

    # the Grain dataset iterator's own state (saved as it is) restores the same way
    def dataset_iter():
        return iter(source.batches(8, seed=2, num_epochs=1).to_iter_dataset())

    it = dataset_iter()
    next(it), next(it)
    grain_state = it.get_state()
    expected = [np.asarray(next(it)).tolist() for _ in range(2)]
    for i in range(2):
        (saved / f"process_{i}-of-2.json").write_text(json.dumps(grain_state))
    again = handler.restore(saved, RoxCheckpointRestore(dataset_iter()))
    assert [np.asarray(next(again)).tolist() for _ in range(2)] == expected


def test_grain_dataset_iterators_save_and_restore_through_our_handler(tmp_path):
    """RoxCheckpointSave takes a Grain dataset iterator's dict state, as Grain's own handler
    does (it raised a TypeError from Orbax's thread), for ``.batches()``, ``mix_datasets`` and
    ``pack_documents``; the restore in a fresh iterator continues exactly, and over other data
    it is refused."""
    from grain_rox import NumpySource, mix_datasets, pack_documents

    def make(offset: int) -> dict:
        rows = NumpySource(np.arange(120, dtype=np.int32).reshape(40, 3) + offset)
        more = NumpySource(np.arange(60, dtype=np.int32).reshape(20, 3) - offset)
        docs = [np.arange(1 + offset, 8 + offset + k % 9, dtype=np.int32) for k in range(60)]
        return {
            "batches": lambda: rows.batches(4, seed=1).to_iter_dataset(),
            "mix": lambda: mix_datasets(
                {"a": grain.MapDataset.source(rows), "b": grain.MapDataset.source(more)},
                weights={"a": 0.7, "b": 0.3},
                seed=2,
                length=30,
            ).to_iter_dataset(),
            "pack": lambda: pack_documents(docs, seq_len=16, batch_size=2, seed=3),
        }

    def flat(batch) -> list:
        items = sorted(batch.items()) if isinstance(batch, dict) else [("", batch)]
        return [(k, np.asarray(v).tolist()) for k, v in items]

    ours, others = make(0), make(500)
    for name, new_iter in ours.items():
        it = iter(new_iter())
        for _ in range(3):
            next(it)
        manager = ocp.CheckpointManager(str(tmp_path / name))
        manager.save(3, args=ocp.args.Composite(data=RoxCheckpointSave(it)))
        manager.wait_until_finished()
        expected = [flat(next(it)) for _ in range(3)]
        fresh = iter(new_iter())
        manager.restore(3, args=ocp.args.Composite(data=RoxCheckpointRestore(fresh)))
        assert [flat(next(fresh)) for _ in range(3)] == expected, name
        with pytest.raises(ValueError, match="data or config changed"):
            other = iter(others[name]())
            manager.restore(3, args=ocp.args.Composite(data=RoxCheckpointRestore(other)))
        manager.close()


def test_a_token_pipelines_per_process_states_restore_on_another_process_count(corpus, tmp_path):
    """iter_dataset(rows=...) states are the same global position in every process (rows are
    no part of them), yet only a .batches() identity was taken as one, and the error told a
    TokenPipeline user to use a TokenPipeline."""
    pipe = make_pipe(corpus)
    saved = tmp_path / "data"
    saved.mkdir()
    for i in range(2):
        it = iter(pipe.iter_dataset(rows=(4 * i, 4 * i + 4)))
        next(it)
        (saved / f"process_{i}-of-2.json").write_text(json.dumps(it.get_state()))
    whole = iter(pipe.iter_dataset())
    next(whole)
    expected = next(whole)["inputs"]
    again = RoxCheckpointHandler().restore(saved, RoxCheckpointRestore(iter(pipe.iter_dataset())))
    assert np.array_equal(next(again)["inputs"], expected)
    (saved / "process_1-of-2.json").write_text(json.dumps({"identity": {}, "state": {}}))
    with pytest.raises(FileNotFoundError) as info:
        RoxCheckpointHandler().restore(saved, RoxCheckpointRestore(iter(pipe.iter_dataset())))
    assert str(info.value).endswith(
        "these per-process states are not one position every process shares (as a "
        "TokenPipeline's or a .batches() dataset's are, saved whole), so they restore only on "
        "the number of processes that saved them"
    )


def test_a_state_of_the_other_kind_of_iterator_says_which_it_is(corpus, tmp_path):
    pipe = make_pipe(corpus)
    with MultiHostDataLoadIterator(pipe) as it:
        next(it), next(it)
        device_state = it.get_state()
        third = np.asarray(next(it)["inputs"])
    # the advice below continues at the same batch
    assert np.array_equal(next(iter(pipe.iter_dataset(first_step=2)))["inputs"], third)
    with pytest.raises(ValueError) as info:
        iter(pipe.iter_dataset()).set_state(json.loads(device_state))
    assert str(info.value) == (
        "not a TokenPipeline state: it is a MultiHostDataLoadIterator's (step 2); restore it "
        "with set_state on a MultiHostDataLoadIterator over the same input, or continue this "
        "iterator there with iter_dataset(first_step=2)"
    )
    dataset_it = iter(pipe.iter_dataset())
    next(dataset_it)
    with MultiHostDataLoadIterator(pipe) as it, pytest.raises(ValueError) as info:
        it.set_state(json.dumps(dataset_it.get_state()))
    assert str(info.value) == (
        "not a MultiHostDataLoadIterator state: it is a Grain dataset iterator's (keys "
        "'identity' and 'state', e.g. of TokenPipeline.iter_dataset() or .batches()); restore "
        "it with set_state on an iterator of that same dataset"
    )
