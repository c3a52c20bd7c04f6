"""Restore matrix: a state restores onto the same data and order only, refused otherwise with
a message naming the change; the same data elsewhere and another shard count restore exactly.

Every ``.batches()`` source (NumPy, ArrayRecord, HF) and ``MultiHostDataLoadIterator`` over
them, over a ``grain.DataLoader`` and over a ``TokenPipeline``.
"""

from __future__ import annotations

import json
import re
import shutil

import grain
import numpy as np
import pytest

from grain_rox import (
    ArrayRecordSource,
    HFEagerSource,
    MultiHostDataLoadIterator,
    NumpySource,
    TokenPipeline,
)

ROWS, WIDTH = 48, 3
NO_THREADS = grain.ReadOptions(num_threads=0)


def rows(offset: int = 0, count: int = ROWS) -> np.ndarray:
    return np.arange(count * WIDTH, dtype=np.int32).reshape(count, WIDTH) + offset


def make_numpy(directory, data: np.ndarray) -> NumpySource:
    path = directory / "rows.npy"
    if not path.exists():
        np.save(path, data)
    return NumpySource(str(path))


def make_array_record(directory, data: np.ndarray) -> ArrayRecordSource:
    from array_record.python.array_record_module import ArrayRecordWriter

    path = directory / "rows.array_record"
    if not path.exists():
        writer = ArrayRecordWriter(str(path), "group_size:1")
        for row in data:
            writer.write(row.tobytes())
        writer.close()
    return ArrayRecordSource(str(path), dtype=np.int32, shape=(WIDTH,))


def make_hf(directory, data: np.ndarray) -> HFEagerSource:
    path = directory / "rows_hf"  # save_to_disk: memory-mapped Arrow, copied as it is
    if not path.exists():
        import datasets

        datasets.Dataset.from_dict({"x": data.tolist()}).save_to_disk(str(path))
    return HFEagerSource(str(path))


def values(batch) -> list:
    return np.asarray(batch["x"] if isinstance(batch, dict) else batch).tolist()


def make_hf_parquet(directory, data: np.ndarray) -> HFEagerSource:
    path = directory / "rows.parquet"  # loaded through HF's cache: paths differ per copy
    if not path.exists():
        import datasets

        datasets.Dataset.from_dict({"x": data.tolist()}).to_parquet(str(path))
    return HFEagerSource(data_files=str(path))


def make_hf_memory(directory, data: np.ndarray) -> HFEagerSource:
    return HFEagerSource(data={"x": data.tolist()})  # an Arrow copy made by the source


MAKERS = {
    "numpy": make_numpy,
    "array_record": make_array_record,
    "hf": make_hf,
    "hf_parquet": make_hf_parquet,
    "hf_memory": make_hf_memory,
}
# The other data has the same shape, dtype and file sizes: only the values differ.
OTHER = dict.fromkeys(MAKERS, rows(1000))


@pytest.fixture(params=sorted(MAKERS))
def sources(request, tmp_path):
    """(source over data A, source over other data B, source over a copy of A elsewhere)."""
    kind = request.param
    make = MAKERS[kind]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = make(tmp_path / "a", rows())
    other = make(tmp_path / "b", OTHER[kind])
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    copy = make(tmp_path / "copy", rows())
    return kind, first, other, copy


DATA_CHANGED = r"data: saved [\"'].*fingerprint=\w+\)[\"'] -> now [\"']"
CONFIG = {"seed": 0, "shuffle": True, "num_epochs": 2}


def batch_iter(source, batch_size: int = 4, shard=(0, 1), **changes):
    config = {**CONFIG, **changes}
    return iter(source.batches(batch_size, shard=shard, **config).to_iter_dataset(NO_THREADS))


def saved_state(source):
    """The state after 3 batches, and the 4 batches that follow it."""
    it = batch_iter(source)
    for _ in range(3):
        next(it)
    state = it.get_state()
    return state, [values(next(it)) for _ in range(4)]


def test_same_data_and_order_restore_exactly_also_from_a_copy_and_json(sources):
    _, first, _, copy = sources
    state, expected = saved_state(first)
    assert state["state"] == {"next_index": 3}
    for target in (first, copy):  # a byte-identical copy in another directory is the same data
        again = batch_iter(target)
        again.set_state(json.loads(json.dumps(state)))  # as written by Grain's checkpointer
        assert [values(next(again)) for _ in range(4)] == expected


def test_another_shard_count_restores_the_same_global_batches(sources):
    _, first, _, _ = sources
    state, expected = saved_state(first)
    halves = [batch_iter(first, shard=(i, 2)) for i in range(2)]
    for half in halves:
        half.set_state(state)
    got = [values(next(halves[0])) + values(next(halves[1])) for _ in range(4)]
    assert got == expected


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seed": 1}, r"\(seed: saved 0 -> now 1\)"),
        ({"batch_size": 8}, r"\(batch_size: saved 4 -> now 8\)"),
        ({"shuffle": False}, r"\(shuffle: saved True -> now False\)"),
        ({"num_epochs": None}, r"\(num_epochs: saved 2 -> now None\)"),
    ],
)
def test_another_order_is_refused_naming_the_change(sources, change, message):
    kind, first, _, _ = sources
    state, _ = saved_state(first)
    config = dict(change)
    it = batch_iter(first, config.pop("batch_size", 4), **config)
    what = {"numpy": "NumpySource", "array_record": "ArrayRecordSource"}.get(kind, "HFEagerSource")
    with pytest.raises(ValueError, match=rf"cannot restore this {what}\.batches\(\) state: "):
        it.set_state(state)
    with pytest.raises(ValueError, match=message):
        it.set_state(state)


def test_other_data_is_refused_naming_both_fingerprints(sources):
    _, first, other, _ = sources
    state, _ = saved_state(first)
    with pytest.raises(ValueError, match=r"data or config changed \(" + DATA_CHANGED):
        batch_iter(other).set_state(state)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s["state"], r"not a \w+\.batches\(\) state: \{'next_index': 3\}"),
        (lambda s: {"state": s["state"]}, r"with keys 'identity' and 'state'"),
        (lambda s: {**s, "identity": "x"}, r"its identity is 'x', not a dict"),
        (lambda s: {**s, "state": {"next_index": "3"}}, r"its position \{'next_index': '3'\}"),
        (lambda s: {**s, "state": {"next_index": -1}}, r"an int from 0 to 24"),
        (lambda s: {**s, "state": {"next_index": 25}}, r"an int from 0 to 24"),
        (lambda s: {**s, "state": {}}, r"its position \{\} is not"),
    ],
)
def test_edited_states_are_refused(sources, edit, message):
    _, first, _, _ = sources
    state, _ = saved_state(first)
    with pytest.raises(ValueError, match=message):
        batch_iter(first).set_state(edit(state))


def test_grains_index_hooks_and_numpy_positions_work_as_on_grains_iterator(sources):
    """grain.experimental.get_next_index / set_next_index reach the position under the
    identity (they raised NotImplementedError), after a Grain transformation too, as on
    Grain's own iterator over the same batches; a numpy int position restores."""
    _, first, _, _ = sources
    ours_ds = first.batches(4, **CONFIG)
    grains_ds = grain.MapDataset.source([ours_ds[i] for i in range(len(ours_ds))])
    for chain in (lambda d: d, lambda d: d.batch(2)):
        ours = iter(chain(ours_ds.to_iter_dataset(NO_THREADS)))
        grains = iter(chain(grains_ds.to_iter_dataset(NO_THREADS)))
        for it in (ours, grains):
            next(it)
        assert grain.experimental.get_next_index(ours) == grain.experimental.get_next_index(grains)
        for it in (ours, grains):
            grain.experimental.set_next_index(it, 3)
        assert values(next(ours)) == values(next(grains))
    state, expected = saved_state(first)
    again = batch_iter(first)
    again.set_state({**state, "state": {"next_index": np.int64(3)}})
    assert [values(next(again)) for _ in range(4)] == expected


def test_a_users_map_keeps_the_identity(sources):
    _, first, _, _ = sources
    ds = first.batches(4, **CONFIG).map(values).to_iter_dataset(NO_THREADS)
    it = iter(ds)
    next(it)
    state = it.get_state()
    assert state["identity"]["seed"] == 0 and state["state"] == {"next_index": 1}
    reseeded = first.batches(4, **{**CONFIG, "seed": 5}).map(values)
    with pytest.raises(ValueError, match=r"seed: saved 0 -> now 5"):
        iter(reseeded.to_iter_dataset(NO_THREADS)).set_state(state)


def ops_iter(source, ops, **changes):
    """An iterator over ``source.batches(4, ...)`` transformed by ``ops(ds)``."""
    ds = source.batches(4, **{**CONFIG, **changes})
    return iter(ops(ds).to_iter_dataset(NO_THREADS))


# Grain's transformations that choose or order elements, each with another of its kind: a
# state restored across them served other batches (the identity was dropped: the state was
# the bare position).
OPS = [
    (lambda ds: ds[:20], lambda ds: ds[2:22], "slice(0, 20, 1)", "slice(2, 22, 1)"),
    (lambda ds: ds.shuffle(seed=1), lambda ds: ds.shuffle(seed=2), "shuffle(seed=1)",
     "shuffle(seed=2)"),
    (lambda ds: ds.batch(2), lambda ds: ds.batch(2, drop_remainder=True),
     "batch(2, drop_remainder=False)", "batch(2, drop_remainder=True)"),
    (lambda ds: ds.repeat(3), lambda ds: ds.repeat(3, reseed_each_epoch=False),
     "repeat(3, reseed_each_epoch=True)", "repeat(3, reseed_each_epoch=False)"),
    (lambda ds: ds.seed(3).shuffle(), lambda ds: ds.seed(4).shuffle(), "seed(3)", "seed(4)"),
    (lambda ds: ds.random_map(lambda b, rng: np.asarray(values(b)) + rng.integers(9), seed=1),
     lambda ds: ds.random_map(lambda b, rng: np.asarray(values(b)) + rng.integers(9), seed=2),
     "random_map(seed=1)", "random_map(seed=2)"),
]  # fmt: skip


@pytest.mark.parametrize(("ops", "other_ops", "op", "other_op"), OPS)
def test_grain_transformations_keep_the_identity_and_name_their_arguments(
    sources, ops, other_ops, op, other_op
):
    _, first, other, copy = sources
    it = ops_iter(first, ops)
    next(it)
    state = it.get_state()
    assert op in state["identity"]["ops"]
    expected = [values(next(it)) for _ in range(3)]
    again = ops_iter(copy, ops)  # the same data elsewhere, the same transformations
    again.set_state(state)
    assert [values(next(again)) for _ in range(3)] == expected
    with pytest.raises(ValueError, match=DATA_CHANGED):
        ops_iter(other, ops).set_state(state)
    with pytest.raises(ValueError, match=r"seed: saved 0 -> now 5"):
        ops_iter(first, ops, seed=5).set_state(state)
    with pytest.raises(ValueError) as info:
        ops_iter(first, other_ops).set_state(state)
    assert f"ops: saved [{', '.join(repr(o) for o in state['identity']['ops'])}] -> now [" in str(
        info.value
    )
    assert repr(other_op) in str(info.value)
    with pytest.raises(ValueError, match=r"ops: saved \[.*\] -> now None\)"):  # or none at all
        iter(first.batches(4, **CONFIG).to_iter_dataset(NO_THREADS)).set_state(state)


def test_grain_transformations_of_a_source_give_grains_own_order(sources):
    """Grain derives a .seed()'s default seeds from the depth of the nodes after it: a wrapper
    of ours between them gave another .seed(5).shuffle() order than Grain's own chain."""
    _, first, _, _ = sources
    rows = [values(b) for b in first.batches(4, shuffle=False, num_epochs=1)]
    plain = grain.MapDataset.source(rows)
    for chain in (
        lambda ds: ds.seed(5).shuffle(),
        lambda ds: ds.seed(5).map(lambda b: b).shuffle(),
        lambda ds: ds.seed(5).random_map(lambda b, rng: [b, int(rng.integers(1000))]),
        lambda ds: ds[1:].seed(3).repeat(2).shuffle(),
    ):
        ours = chain(first.batches(4, shuffle=False, num_epochs=1).map(values))
        assert list(ours) == list(chain(plain))


def test_grain_iter_transformations_give_grains_own_order(sources):
    """The same after to_iter_dataset(): the IterDataset wrapper sat between a .seed() and the
    random_map/batch after it, one node deeper than Grain's own chain, so its default seeds
    (and the random values drawn) were not Grain's."""
    _, first, _, _ = sources
    rows = [values(b) for b in first.batches(4, shuffle=False, num_epochs=1)]
    plain = grain.MapDataset.source(rows)

    def draw(b, rng):
        return [b, int(rng.integers(1000))]

    for chain in (
        lambda ds: ds.seed(5).to_iter_dataset(NO_THREADS).random_map(draw),
        lambda ds: ds.seed(5).to_iter_dataset(NO_THREADS).map(lambda b: b).random_map(draw),
        lambda ds: ds.seed(5).to_iter_dataset(NO_THREADS).random_map(draw).batch(2),
        lambda ds: ds.to_iter_dataset(NO_THREADS).seed(7).filter(lambda b: True).random_map(draw),
    ):
        ours = chain(first.batches(4, shuffle=False, num_epochs=1).map(values))
        assert str(list(ours)) == str(list(chain(plain)))


def test_grain_iter_transformations_keep_the_identity_and_name_their_arguments(sources):
    """An IterDataset's batch/random_map/seed join "ops" (as "iter.": a MapDataset's batch(2)
    position counts batches, an IterDataset's elements), and a state restores across them
    only onto the same arguments; map/filter keep the position check."""
    _, first, _, copy = sources

    def it(source, op):
        ds = source.batches(4, shuffle=False, num_epochs=1).map(values)
        return iter(op(ds.to_iter_dataset(NO_THREADS)))

    two, three = (lambda ds: ds.batch(2)), (lambda ds: ds.batch(3))
    first_it = it(first, two)
    next(first_it)
    state = first_it.get_state()
    assert state["identity"]["ops"] == ["iter.batch(2, drop_remainder=False)"]
    expected = str([next(first_it) for _ in range(2)])
    again = it(copy, two)
    again.set_state(state)
    assert str([next(again) for _ in range(2)]) == expected
    with pytest.raises(ValueError, match=r"-> now \['iter.batch\(3, drop_remainder=False\)'\]"):
        it(first, three).set_state(state)
    mapped = it(first, lambda ds: ds.map(lambda b: b).filter(lambda b: True))
    with pytest.raises(ValueError, match=r"its position .* is not"):
        mapped.set_state({**mapped.get_state(), "state": {"next_index": 10**6}})
    seeded = it(first, lambda ds: ds.seed(1).random_map(lambda b, rng: b))
    next(seeded)
    with pytest.raises(ValueError, match=r"iter.seed\(1\).*iter.seed\(2\)"):
        it(first, lambda ds: ds.seed(2).random_map(lambda b, rng: b)).set_state(seeded.get_state())


def test_a_sliced_token_pipeline_dataset_is_refused_on_other_shards_or_seeds(tmp_path):
    """The endless pipeline's own advice for a shuffle, ds[:n].shuffle(seed=...), gave a
    dataset whose state named no data: it restored onto other shards and another seed."""
    from grain_rox import write_rox

    rng = np.random.default_rng(0)
    for name in "ab":
        docs = [rng.integers(1, 1000, 200, dtype=np.uint16) for _ in range(100)]
        write_rox(docs, str(tmp_path / f"{name}.rox"), separator=0)

    def it(name, seed):
        pipe = TokenPipeline(str(tmp_path / f"{name}.rox"), seq_len=16, global_batch_size=4,
                             seed=seed)  # fmt: skip
        return iter(pipe.map_dataset()[:50].shuffle(seed=1).to_iter_dataset(NO_THREADS))

    first = it("a", 0)
    next(first)
    state = first.get_state()
    want = values(next(first)["inputs"])
    with pytest.raises(ValueError, match=r"TokenPipeline state: its data or config changed \(data"):
        it("b", 0).set_state(state)
    with pytest.raises(ValueError, match=r"seed: saved 0 -> now 5"):
        it("a", 5).set_state(state)
    again = it("a", 0)
    again.set_state(state)
    assert values(next(again)["inputs"]) == want


# ---- MultiHostDataLoadIterator over a Grain input -----------------------------------------


def device_iter(source, **changes):
    config = {**CONFIG, **changes}
    batch_size = config.pop("batch_size", 8)
    ds = source.batches(batch_size, **config).to_iter_dataset(NO_THREADS)
    return MultiHostDataLoadIterator(ds, prefetch=1)


def device_state(source):
    with device_iter(source) as it:
        next(it), next(it)
        state = it.get_state()
        expected = [values(next(it)) for _ in range(3)]
    return state, expected


def test_device_iterator_restores_on_a_copy_and_refuses_other_data_and_order(sources):
    _, first, other, copy = sources
    state, expected = device_state(first)
    assert json.loads(state)["step"] == 2
    with device_iter(copy) as again:
        again.set_state(state)
        assert again.step == 2 and [values(next(again)) for _ in range(3)] == expected
    refusals = [
        (other, {}, DATA_CHANGED),
        (first, {"seed": 3}, r"seed: saved 0 -> now 3"),
        (first, {"batch_size": 16}, r"batch_size: saved 8 -> now 16"),
        (first, {"num_epochs": 1}, r"num_epochs: saved 2 -> now 1"),
    ]
    for source, change, message in refusals:
        with device_iter(source, **change) as it, pytest.raises(ValueError, match=message):
            it.set_state(state)  # refused here, not at the next batch


@pytest.mark.parametrize("placement", ["host", "device"])
def test_a_state_saved_before_the_first_batch_names_its_data_too(tmp_path, placement):
    """(A checkpoint at step 0, e.g. the one a trainer saves before it starts.)"""
    (tmp_path / "b").mkdir()
    first = make_numpy(tmp_path, rows())
    other = make_numpy(tmp_path / "b", rows(7))

    def make(source, **changes):
        ds = source.batches(8, **{**CONFIG, **changes}).to_iter_dataset(NO_THREADS)
        return MultiHostDataLoadIterator(ds, prefetch=1, placement=placement)

    with make(first) as it:
        state = it.get_state()
        expected = [values(next(it)) for _ in range(2)]
    saved = json.loads(state)["grain"]
    assert saved["state"] == {"next_index": 0} and saved["identity"]["seed"] == 0
    with make(first) as again:
        again.set_state(state)
        assert again.step == 0 and [values(next(again)) for _ in range(2)] == expected
    for source, change, message in [(other, {}, DATA_CHANGED), (first, {"seed": 3}, "seed")]:
        with make(source, **change) as it, pytest.raises(ValueError, match=message):
            it.set_state(state)
    with MultiHostDataLoadIterator(loader(first), prefetch=1) as it:
        state = it.get_state()
    with (
        MultiHostDataLoadIterator(loader(first, seed=1)) as it,
        pytest.raises(ValueError, match="Sampler in checkpoint does not match"),
    ):
        it.set_state(state)


def test_a_state_after_the_end_of_an_input_opens_no_new_iterator(monkeypatch):
    """get_state opens a Grain input's iterator before the first batch only (to name its
    data): at the end of an input whose iterator has no position, it opened another."""

    class Plain:  # an input whose iterators have no get_state
        def __iter__(self):
            return iter([{"x": np.arange(8).reshape(8, 1)}] * 2)

    with MultiHostDataLoadIterator(Plain(), prefetch=1) as it:
        assert len(list(it)) == 2
        monkeypatch.setattr(it._feed, "host_iterator", lambda *a: pytest.fail("reopened"))
        assert json.loads(it.get_state())["step"] == 2


def loader(source, seed: int = 0) -> grain.DataLoader:
    sampler = grain.samplers.IndexSampler(
        num_records=len(source),
        shuffle=True,
        seed=seed,
        num_epochs=1,
        shard_options=grain.sharding.NoSharding(),
    )
    return grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[grain.transforms.Batch(8, drop_remainder=True)],
        worker_count=0,
    )


def test_device_iterator_over_a_data_loader_restores_on_a_copy_only(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = make_numpy(tmp_path / "a", rows())
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    copy = make_numpy(tmp_path / "copy", rows())
    with MultiHostDataLoadIterator(loader(first), prefetch=1) as it:
        next(it)
        state = it.get_state()
        expected = [values(next(it)) for _ in range(2)]
    with MultiHostDataLoadIterator(loader(copy), prefetch=1) as again:
        again.set_state(state)
        assert [values(next(again)) for _ in range(2)] == expected
    other = make_numpy(tmp_path / "b", rows(7))
    with (
        MultiHostDataLoadIterator(loader(other)) as it,
        pytest.raises(ValueError, match="DataSource in checkpoint does not match"),
    ):
        it.set_state(state)
    with (
        MultiHostDataLoadIterator(loader(first, seed=1)) as it,
        pytest.raises(ValueError, match="Sampler in checkpoint does not match"),
    ):
        it.set_state(state)
    dataset_state = device_state(first)[0]
    with (
        MultiHostDataLoadIterator(loader(first)) as it,
        pytest.raises(ValueError, match="saved from an iterator over a Grain dataset, but this"),
    ):
        it.set_state(dataset_state)
    with device_iter(first) as it, pytest.raises(ValueError, match=r"over a grain\.DataLoader"):
        it.set_state(state)


# ---- TokenPipeline states and Grain states do not mix; edited states ----------------------


@pytest.fixture
def pipeline(make_rox) -> TokenPipeline:
    path = make_rox("p", [np.arange(1, 4000, dtype=np.uint16)])
    return TokenPipeline(path, seq_len=16, global_batch_size=8, num_epochs=1)


def pipeline_state(pipeline) -> bytes:
    with MultiHostDataLoadIterator(pipeline) as it:
        next(it)
        return it.get_state()


def test_pipeline_and_grain_states_do_not_mix(tmp_path, pipeline):
    source = make_numpy(tmp_path, rows())
    token_state = pipeline_state(pipeline)
    with (
        device_iter(source) as it,
        pytest.raises(ValueError, match="it was saved from an iterator over a TokenPipeline"),
    ):
        it.set_state(token_state)
    assert it.step == 0
    grain_state = device_state(source)[0]
    with (
        MultiHostDataLoadIterator(pipeline) as it,
        pytest.raises(ValueError, match="saved from an iterator fed by a Grain loader"),
    ):
        it.set_state(grain_state)


def test_a_batches_state_on_a_plain_grain_dataset_says_what_does_not_fit(tmp_path):
    """Grain's own error was a bare ``KeyError: 'next_index'``."""
    source = make_numpy(tmp_path, rows())
    state = device_state(source)[0]
    plain = grain.MapDataset.source(source).shuffle(seed=1).batch(8).to_iter_dataset(NO_THREADS)
    with (
        MultiHostDataLoadIterator(plain, prefetch=1) as it,
        pytest.raises(
            ValueError,
            match=r"^cannot restore this data state: its Grain position \{'identity': .* does not "
            r"fit this input's iterator, whose state looks like \{'next_index': 0\} \(Grain: "
            r"KeyError: 'next_index'\)\. It was saved from another input",
        ),
    ):
        it.set_state(state)
    assert it.step == 0


def test_a_plain_grain_dataset_state_says_it_holds_a_position_only(tmp_path, caplog):
    """Grain's own dataset state is a position: restored onto other data or another seed it
    was taken without a word. It still is (Grain decides), but now says so, and our
    .batches() states, which name their data, say nothing."""
    import logging

    source = make_numpy(tmp_path, rows())

    def plain(seed: int):
        ds = grain.MapDataset.source(source).shuffle(seed=seed).batch(8)
        return MultiHostDataLoadIterator(ds.to_iter_dataset(NO_THREADS), prefetch=1)

    with plain(1) as it:
        next(it)
        state = it.get_state()
    with caplog.at_level(logging.WARNING, logger="grain_rox"), plain(2) as it:
        it.set_state(state)
    assert caplog.messages == [
        "MultiHostDataLoadIterator.set_state: this Grain dataset's state holds a position only "
        "(step 1), not its data or order, so a restore onto other data or another seed goes "
        "unnoticed; build the dataset on a grain_rox source's .batches() or a TokenPipeline's "
        "map_dataset() (or mix_datasets / pack_documents), whose states name both"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="grain_rox"), device_iter(source) as it:
        it.set_state(device_state(source)[0])
    assert caplog.messages == []


def edited(state: bytes, **changes) -> bytes:
    decoded = {**json.loads(state), **changes}
    return json.dumps({k: v for k, v in decoded.items() if v is not ...}).encode()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"step": "5"}, r"step is '5' \(str\), not a non-negative int"),
        ({"step": 2.7}, r"step is 2.7 \(float\), not a non-negative int"),
        ({"step": True}, r"step is True \(bool\), not a non-negative int"),
        ({"step": -1}, r"step is -1 \(int\), not a non-negative int"),
        (
            {"step": 10**30},
            r"step 10{30} is (past the end of this TokenPipeline|beyond \d+, the last step)",
        ),
        ({"version": "2"}, r"version is '2' \(str\), not an int"),
        ({"version": 1}, r"format version 1, but this grain_rox reads versions 2 and 3"),
        ({"step": ...}, r"it lacks 'step'"),
        ({"version": ...}, r"it lacks 'version'"),
        ({"extra": 1}, r"unknown keys \['extra'\]"),
    ],
)
def test_edited_states_are_refused_on_both_kinds_of_input(tmp_path, pipeline, changes, message):
    token_state = pipeline_state(pipeline)
    source = make_numpy(tmp_path, rows())
    grain_state = device_state(source)[0]
    with MultiHostDataLoadIterator(pipeline) as it, pytest.raises(ValueError, match=message):
        it.set_state(edited(token_state, **changes))
    with device_iter(source) as it, pytest.raises(ValueError, match=message):
        it.set_state(edited(grain_state, **changes))


def test_a_step_past_the_end_names_the_length(tmp_path, pipeline):
    n = len(MultiHostDataLoadIterator(pipeline))
    state = pipeline_state(pipeline)
    with (
        MultiHostDataLoadIterator(pipeline) as it,
        pytest.raises(ValueError, match=rf"step {n + 1} is past the end of .* has {n} batches"),
    ):
        it.set_state(edited(state, step=n + 1))
    with MultiHostDataLoadIterator(pipeline) as it:  # the end itself is a valid position
        it.set_state(edited(state, step=n))
        with pytest.raises(StopIteration):
            next(it)
    endless = TokenPipeline(pipeline.paths, seq_len=16, global_batch_size=8, num_epochs=None)
    state = pipeline_state(endless)
    with (
        MultiHostDataLoadIterator(endless) as it,
        pytest.raises(
            ValueError,
            match=r"step 10{30} is beyond \d+, the last step this TokenPipeline \(endless",
        ),
    ):
        it.set_state(edited(state, step=10**30))
    source = make_numpy(tmp_path, rows())
    grain_state = device_state(source)[0]  # 12 batches of 8 in 2 epochs
    as_map = source.batches(8, **CONFIG)  # a MapDataset input has a len()
    with (
        MultiHostDataLoadIterator(as_map) as it,
        pytest.raises(
            ValueError, match="step 13 is past the end of this Grain input, which has 12"
        ),
    ):
        it.set_state(edited(grain_state, step=13))
    with device_iter(source) as it, pytest.raises(ValueError, match="holds no Grain position"):
        it.set_state(edited(grain_state, grain=None))


@pytest.mark.slow
def test_grain_worker_processes_carry_and_check_the_identity(tmp_path):
    from grain_rox._sources._grain_setup import ensure_absl_flags_parsed

    ensure_absl_flags_parsed()
    source = make_numpy(tmp_path, rows())

    def workers(seed: int = 0):
        ds = source.batches(4, **{**CONFIG, "seed": seed}).to_iter_dataset(NO_THREADS)
        return iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))

    it = workers()
    for _ in range(3):
        next(it)
    state = it.get_state()
    expected = [values(next(it)) for _ in range(3)]
    it.close()
    again = workers()
    again.set_state(state)
    assert [values(next(again)) for _ in range(3)] == expected
    again.close()
    in_process = source.batches(4, **CONFIG)
    assert expected == [values(in_process[i]) for i in range(3, 6)]
    other = workers(seed=1)
    with pytest.raises(ValueError, match=r"seed: saved 0 -> now 1"):
        other.set_state(state)
        next(other)
    other.close()


def test_a_source_without_its_own_repr_is_named_by_class_and_length():
    from grain_rox._sources._batches import shuffled_batches

    class Rows:  # no __repr__: object's names a memory address, different in every process
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def get_batch(self, idx):
            return np.asarray(idx)

    it = iter(shuffled_batches(Rows(12), 4, seed=1).to_iter_dataset(NO_THREADS))
    next(it)
    state = it.get_state()
    assert state["identity"]["data"] == "Rows(len=12)"
    again = iter(shuffled_batches(Rows(12), 4, seed=1).to_iter_dataset(NO_THREADS))
    again.set_state(state)
    assert values(next(again)) == values(next(it))
    longer = iter(shuffled_batches(Rows(16), 4, seed=1).to_iter_dataset(NO_THREADS))
    with pytest.raises(ValueError, match=r"data: saved 'Rows\(len=12\)' -> now 'Rows\(len=16\)'"):
        longer.set_state(state)


def test_a_token_pipelines_grain_datasets_carry_its_identity(tmp_path):
    """TokenPipeline.iter_dataset() and map_dataset().to_iter_dataset() states are Grain's
    position under the pipeline's identity: they restore exactly on the same pipeline (a
    copy of the data elsewhere too) and are refused, naming the change, over other data,
    another seed or another first_step (their position counts from it)."""
    from grain_rox import write_rox

    docs = [np.arange(1, 400 + 37 * k, dtype=np.uint16) % 600 + 1 for k in range(12)]
    (tmp_path / "a").mkdir()
    write_rox(docs, str(tmp_path / "a" / "c.rox"), separator=0)
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    write_rox(docs[::-1], str(tmp_path / "other.rox"), separator=0)

    def pipe(path, **changes):
        config = {"seq_len": 16, "global_batch_size": 4, "seed": 1, **changes}
        return TokenPipeline(str(path), **config)

    first = pipe(tmp_path / "a" / "c.rox")
    for make in (
        lambda p, **kw: p.iter_dataset(**kw),
        lambda p, **kw: p.map_dataset(**kw).to_iter_dataset(NO_THREADS),
    ):
        it = iter(make(first))
        for _ in range(3):
            next(it)
        state = json.loads(json.dumps(it.get_state()))  # as Grain's checkpointer writes it
        assert state["state"] == {"next_index": 3} and state["identity"]["seed"] == 1
        expected = [values(next(it)["inputs"]) for _ in range(2)]
        for same in (first, pipe(tmp_path / "copy" / "c.rox")):
            again = iter(make(same))
            again.set_state(state)
            assert [values(next(again)["inputs"]) for _ in range(2)] == expected
        for other, change in (
            (pipe(tmp_path / "other.rox"), r"data: saved \{'': '\w+'\} -> now \{'': '\w+'\}"),
            (pipe(tmp_path / "a" / "c.rox", seed=2), r"seed: saved 1 -> now 2"),
        ):
            with pytest.raises(ValueError, match=r"TokenPipeline state: its data or config "):
                iter(make(other)).set_state(state)
            with pytest.raises(ValueError, match=change):
                iter(make(other)).set_state(state)
        with pytest.raises(ValueError, match=r"first_step: saved 0 -> now 5"):
            iter(make(first, first_step=5)).set_state(state)
        with pytest.raises(ValueError, match=r"not a TokenPipeline state: \{'next_index': 3\}"):
            iter(make(first)).set_state(state["state"])  # a bare position names no data


def test_editing_a_state_it_handed_out_leaves_the_dataset_identity_alone(tmp_path):
    """``get_state`` handed out the dataset's own identity object: a caller who edited the
    state (a nested field) edited what every later restore was checked against, so an edited
    state restored and a true one was refused."""
    from grain_rox import write_rox

    path = str(tmp_path / "i.rox")
    write_rox([np.arange(1, 5000, dtype=np.uint16)], path, separator=0)
    ds = TokenPipeline(path, seq_len=16, global_batch_size=4, seed=0).map_dataset()
    it = iter(ds.to_iter_dataset(NO_THREADS))
    next(it)
    edited = it.get_state()
    edited["identity"]["phases"][0]["seq_len"] = 999
    with pytest.raises(ValueError, match="phases: saved"):
        iter(ds.to_iter_dataset(NO_THREADS)).set_state(edited)
    again = iter(ds.to_iter_dataset(NO_THREADS))
    again.set_state(it.get_state())
    np.testing.assert_array_equal(next(again)["inputs"], ds[1]["inputs"])


def test_a_refusal_over_other_data_says_what_the_fingerprint_covers_and_the_data_now(tmp_path):
    """It showed two fingerprints and nothing else: not where the data is, nor what changes
    a fingerprint."""
    from grain_rox import write_rox

    rng = np.random.default_rng(0)
    for name in "ab":
        docs = [rng.integers(1, 1000, 200, dtype=np.uint16) for _ in range(50)]
        write_rox(docs, str(tmp_path / f"{name}.rox"), separator=0)

    def pipe(name):
        return TokenPipeline(str(tmp_path / f"{name}.rox"), seq_len=16, global_batch_size=8)

    covers = (
        "a data fingerprint covers the content and, for files, their names and order: a file "
        "rewritten, added, removed or renamed since the save changes it; restore onto the data "
        "the run was saved with"
    )
    it = iter(pipe("a").iter_dataset())
    next(it)
    with pytest.raises(ValueError) as info:
        iter(pipe("b").iter_dataset()).set_state(it.get_state())
    assert str(info.value).endswith(f"or start a new run ({covers})")
    with MultiHostDataLoadIterator(pipe("a")) as first:
        next(first)
        state = first.get_state()
    with MultiHostDataLoadIterator(pipe("b")) as other, pytest.raises(ValueError) as info:
        other.set_state(state)
    assert str(info.value).endswith(
        f"or start a new run. The data now: {tmp_path / 'b.rox'}; {covers}"
    )


def test_a_pipeline_data_loader_names_what_changed_and_how_to_go_on(make_rox):
    """Grain's own refusals said only "does not match" (and "you may need to implement a
    custom __repr__"), a KeyError for another iterator's state and an AttributeError for a
    dict; each now names the change, the saving iterator or the worker counts, and the fix."""
    path = make_rox("dl_named", [np.arange(1, 400, dtype=np.uint16)] * 30, separator=0)
    other = make_rox("dl_named_b", [np.arange(2, 400, dtype=np.uint16)] * 30, separator=0)

    def pipe(data=path, **kw):
        return TokenPipeline(data, **{"seq_len": 16, "global_batch_size": 4, "seed": 5} | kw)

    it = iter(pipe().data_loader())
    next(it), next(it)
    state = it.get_state()
    expected = next(it)["inputs"]
    with pytest.raises(ValueError) as info:
        iter(pipe(seq_len=8).data_loader()).set_state(state)
    assert re.fullmatch(
        r"cannot restore this TokenPipeline\.data_loader\(\) state: its data or config changed "
        r"\(config: saved \w{16} -> now \w{16}\)\. The config digest covers the phases .*; this "
        r"pipeline's config is \{'phases': \[\{'steps': None, 'batch_size': 4, 'seq_len': 8, .*\}\. "
        r"Restore with the same data and config, or start a new run",
        str(info.value),
    ), info.value
    with pytest.raises(ValueError, match=r"changed \(data: saved \w+ -> now \w+; config: .*a "
                       r"data fingerprint covers the content"):  # fmt: skip
        iter(pipe(other).data_loader()).set_state(state)
    with pytest.raises(ValueError, match=r"\(seed: saved 5 -> now 6; config: "):
        iter(pipe(seed=6).data_loader()).set_state(state)
    with pytest.raises(
        ValueError,
        match=r"it was saved with worker_count=0, and this loader has worker_count=2; .*pass "
        r"data_loader\(worker_count=0\), or continue from step 2 with "
        r"data_loader\(first_step=2, worker_count=2\)$",
    ):
        iter(pipe().data_loader(worker_count=2)).set_state(state)
    # that advice holds: the batch at step 2
    assert np.array_equal(next(iter(pipe().data_loader(first_step=2)))["inputs"], expected)
    # another iterator's state, as it is or as JSON (Grain: AttributeError, KeyError)
    ds = iter(pipe().iter_dataset(first_step=1))
    next(ds)
    for given in (ds.get_state(), json.dumps(ds.get_state()).encode()):
        with pytest.raises(
            ValueError,
            match=r"state: it was saved by pipe\.iter_dataset\(\) or pipe\.map_dataset\(\) .*, or "
            r"continue from step 2 with data_loader\(first_step=2\)$",
        ):
            iter(pipe().data_loader()).set_state(given)
    for junk, shown in ((b"{", "it is not JSON"), ({"a": 1}, r"not a grain\.DataLoader's state")):
        with pytest.raises(ValueError, match=shown):
            iter(pipe().data_loader()).set_state(junk)
    again = iter(pipe().data_loader())
    again.set_state(state)
    assert np.array_equal(next(again)["inputs"], expected)
    assert isinstance(pipe().data_loader(), grain.DataLoader)


def test_a_pipeline_state_is_refused_over_the_same_sources_in_another_order(make_rox):
    """The mixture breaks its ties by the sources' order, so the same sources in another order
    serve other rows; the identity compared them as dicts (order-blind) and a state restored,
    replaying a row of 'a' and skipping one of 'c' (reviewer's reproducer)."""
    paths = {
        name: make_rox(
            f"order_{name}",
            [np.arange(1, 4001, dtype=np.uint32) + 10_000 * i],
            manifest=False,
            block_size=4000,
        )
        for i, name in enumerate("abc")
    }

    def pipe(names):
        return TokenPipeline({n: paths[n] for n in names}, seq_len=16, global_batch_size=8,
                             weights=dict.fromkeys("abc", 1), seed=1, chunk_tokens=500)  # fmt: skip

    assert not np.array_equal(pipe("abc").batch_source()[1]["inputs"],
                              pipe("cba").batch_source()[1]["inputs"])  # fmt: skip
    with MultiHostDataLoadIterator(pipe("abc")) as it:
        next(it)
        state = it.get_state()
        expected = np.asarray(next(it)["inputs"])
    changed = r"sources: saved \['a', 'b', 'c'\] -> now \['c', 'b', 'a'\]"
    with MultiHostDataLoadIterator(pipe("cba")) as it, pytest.raises(ValueError, match=changed):
        it.set_state(state)
    ds = iter(pipe("abc").iter_dataset())
    next(ds)
    with pytest.raises(ValueError, match=changed):
        iter(pipe("cba").iter_dataset()).set_state(ds.get_state())
    # a state saved before the order was recorded restores as it did
    legacy = json.loads(state)
    del legacy["pipeline"]["sources"]
    with MultiHostDataLoadIterator(pipe("abc")) as it:
        it.set_state(legacy)
        assert np.array_equal(np.asarray(next(it)["inputs"]), expected)
