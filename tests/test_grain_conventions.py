"""Grain's conventions, as a Grain user meets them: endless means ``len == sys.maxsize``;
sources index like Grain's (numpy ints, negative from the end, IndexError past the end);
a missing seed is a clear error; a packed stream does not depend on the worker count; and
Grain's worker processes start without the user parsing absl flags (issue #12 items 2, 4, 6,
7 on the pipeline side)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap

import grain
import numpy as np
import pytest

from grain_rox import (
    NumpySource,
    Phase,
    RoxBlockSource,
    RoxDocumentSource,
    RoxTokenSource,
    TokenPipeline,
    mix_datasets,
    pack_documents,
)


@pytest.fixture(scope="module")
def paths(make_rox):
    return {
        name: make_rox(
            name,
            [first + np.arange(n, dtype=np.uint16) for n in (700, 1300, 900, 2100)],
            separator=0,
            block_size=512,
        )
        for name, first in (("a", 1), ("b", 20_000))
    }


def inputs(batch):
    return batch["inputs"].tolist()


# ---- item 2: endless is len == sys.maxsize, and every step up to the limit reads -------------
def test_an_endless_pipeline_has_grains_infinite_length(paths):
    pipe = TokenPipeline(paths["a"], seq_len=16, global_batch_size=4, seed=1)
    endless_numpy = NumpySource(np.arange(40).reshape(10, 4)).batches(2, num_epochs=None)
    assert len(pipe.map_dataset()) == len(endless_numpy) == sys.maxsize  # before: 2**62
    assert len(pipe.batch_source(first_step=10**6)) == sys.maxsize  # still endless
    finite = TokenPipeline(paths["a"], seq_len=16, global_batch_size=4, num_epochs=1)
    assert len(finite.batch_source(first_step=3)) == finite.num_batches - 3
    # Grain's own answer to repeating an endless dataset (before: OverflowError)
    with pytest.raises(ValueError, match="Repeating already infinite dataset"):
        pipe.map_dataset().repeat(2)


@pytest.mark.parametrize("two_sources", [False, True])
def test_every_step_up_to_the_limit_reads_and_past_it_is_explained(paths, two_sources):
    sources = {"a": paths["a"], "b": paths["b"]} if two_sources else paths["a"]
    weights = {"a": 0.5, "b": 0.5} if two_sources else None
    pipe = TokenPipeline(sources, seq_len=16, global_batch_size=1, seed=3, weights=weights)
    md = pipe.map_dataset()
    last = pipe.step_limit - 1
    assert last == 2**61 - 1
    for step in (0, 2**40, 2**60, last):  # before: 2**60 overflowed, 2**61 - 1 a cast error
        batch = md[step]
        assert batch["inputs"].shape == (1, 16)
        assert np.array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
    assert inputs(pipe.map_dataset(first_step=last)[0]) == inputs(md[last])
    with pytest.raises(IndexError) as info:
        md[last + 1]
    assert str(info.value).startswith(
        f"batch {last + 1} is past the last batch this endless pipeline serves, {last} "
        f"(step {last}: sample numbers stay below 2**61). Its len is sys.maxsize, Grain's "
        "'endless'. Its batches are already shuffled (by the pipeline's seed); to shuffle them "
        "again or index from the end, take a finite prefix first: ds[:n].shuffle(seed=...)"
    )


def test_a_shuffle_of_an_endless_pipeline_is_explained_and_of_a_prefix_works(paths):
    pipe = TokenPipeline(paths["a"], seq_len=16, global_batch_size=4, seed=1)
    md = pipe.map_dataset()
    with pytest.raises(IndexError, match=r"take a finite prefix first: ds\[:n\]\.shuffle"):
        md.shuffle(seed=1)[0]  # an index anywhere below sys.maxsize
    with pytest.raises(IndexError, match="an endless pipeline has no last batch to count from"):
        pipe.batch_source()[-1]
    shuffled = md[:8].shuffle(seed=1)
    assert sorted(inputs(shuffled[i]) for i in range(8)) == sorted(inputs(md[i]) for i in range(8))


def test_mix_and_pack_take_endless_inputs():
    endless, finite = grain.MapDataset.range(10).repeat(), grain.MapDataset.range(100, 105)
    mixed = mix_datasets({"a": endless, "b": finite}, {"a": 0.5, "b": 0.5})
    assert len(mixed) == sys.maxsize  # before: "Repeating already infinite dataset" ValueError
    assert [mixed[i] for i in range(8)] == [0, 100, 1, 103, 2, 102, 3, 101]
    assert mixed[2**62] == 2**61 % 10  # sample 2**61 of the endless input, in its own order
    docs = [np.arange(1, n) for n in (5, 9, 3, 12)]
    looped = pack_documents(grain.MapDataset.source(docs).repeat(), seq_len=8, batch_size=2,
                            shuffle=False)  # fmt: skip
    repeated = pack_documents(docs, seq_len=8, batch_size=2, shuffle=False)
    a, b = iter(looped), iter(repeated)
    assert [as_list(next(a)) for _ in range(6)] == [as_list(next(b)) for _ in range(6)]
    with pytest.raises(ValueError, match=r"num_epochs=1 for an endless source .*num_epochs=None"):
        pack_documents(grain.MapDataset.range(3).repeat(), seq_len=8, batch_size=1, num_epochs=1)


def test_a_data_loader_over_an_endless_pipeline_restores_in_a_new_loader(paths):
    def loader():
        return TokenPipeline(paths["a"], seq_len=16, global_batch_size=4, seed=2).data_loader()

    it = iter(loader())
    for _ in range(3):
        next(it)
    state = it.get_state()
    assert f"IndexSampler(num_records={sys.maxsize}," in json.loads(state)["sampler"]
    expected = [inputs(next(it)) for _ in range(3)]
    again = iter(loader())  # new pipeline, source and sampler objects: their reprs match
    again.set_state(state)
    assert [inputs(next(again)) for _ in range(3)] == expected


# ---- item 6: indices, numpy integers, seeds --------------------------------------------------
def per_record_sources(paths):
    finite = TokenPipeline(paths["a"], seq_len=16, global_batch_size=4, num_epochs=1)
    return {
        "RoxTokenSource": (RoxTokenSource(paths["a"], seq_len=16), "window", "windows"),
        "RoxDocumentSource": (RoxDocumentSource(paths["a"], seq_len=64), "document piece", None),
        "RoxBlockSource": (RoxBlockSource(paths["a"]), "block", "blocks"),
        "GlobalBatchSource": (finite.batch_source(), "batch", "batches"),
    }


def as_list(record):
    if isinstance(record, dict):
        return {k: v.tolist() for k, v in record.items()}
    return record.tolist()


@pytest.mark.parametrize(
    "name", ["RoxTokenSource", "RoxDocumentSource", "RoxBlockSource", "GlobalBatchSource"]
)
def test_sources_index_like_grain_sources_and_lists(paths, name):
    """numpy and negative indices read like a list's for every source in test_conformance.py
    (grain_rox.testing.check_random_access_source); here: the IndexError past either end
    names the index and the valid range, and a float is a TypeError."""
    source, what, whats = per_record_sources(paths)[name]
    n = len(source)
    assert as_list(grain.MapDataset.source(source)[-1]) == as_list(source[n - 1])
    for index in (n, -n - 1):  # Grain's sources refuse these with IndexError too
        with pytest.raises(IndexError) as info:
            source[index]
        assert str(info.value) == (
            f"{what} {index} is out of range for {n} {whats or what + 's'} (valid: {-n} to {n - 1})"
        )
    with pytest.raises(TypeError):
        source[1.0]  # as a list: not an index


def test_a_batch_dataset_reads_and_names_its_source_as_grains_source_dataset_does(paths):
    """map_dataset() and .batches() read their source directly (grain_rox's BatchDataset,
    without Grain's per-read byte counters); as Grain's ``MapDataset.source`` they take
    indices modulo their length and slice; they describe themselves by their source (the
    BatchDataset) or their identity (map_dataset()), so a mix or a packing over them keeps
    the identity its checkpoints were saved with, and their position is Grain's."""
    from grain_rox._pipeline._mixing import describe_dataset

    pipe = TokenPipeline(paths["a"], seq_len=16, global_batch_size=4, seed=1, num_epochs=1)
    ours, grains = pipe.map_dataset(), grain.MapDataset.source(pipe.batch_source())
    n = len(ours)
    assert n == len(grains) and n > 3
    for index in (0, 2, n - 1, -1, n, n + 2):
        assert inputs(ours[index]) == inputs(grains[index]), index
    assert [inputs(b) for b in ours[1:3]] == [inputs(grains[1]), inputs(grains[2])]
    batches = ours._parent  # the BatchDataset under the pipeline's identity
    assert str(batches) == "BatchDataset(source=GlobalBatchSource)"
    assert describe_dataset(batches) == describe_dataset(grains)
    again = TokenPipeline(paths["a"], seq_len=16, global_batch_size=4, seed=1, num_epochs=1)
    other = TokenPipeline(paths["a"], seq_len=16, global_batch_size=4, seed=2, num_epochs=1)
    assert describe_dataset(again.map_dataset()) == describe_dataset(ours)
    assert describe_dataset(other.map_dataset()) != describe_dataset(ours)
    it = iter(ours.to_iter_dataset(grain.ReadOptions(num_threads=0)))
    next(it)
    assert it.get_state()["state"] == {"next_index": 1}  # the position Grain's dataset saves


@pytest.mark.parametrize("workers", [1, 2, 3, 7])
def test_each_worker_reads_the_share_grains_source_dataset_gives_it(paths, workers):
    """mp_prefetch(..., sequential_slice=True) slices each worker's copy of the dataset in
    place (set_slice, called through the iter dataset as in a worker): worker i reads the same
    contiguous batches from map_dataset() and .batches() as from Grain's MapDataset.source,
    the first len % workers shares one batch longer, and the shares make up the whole."""
    pipe = TokenPipeline(paths["a"], seq_len=16, global_batch_size=4, seed=1, num_epochs=1)
    numpy = NumpySource(np.arange(90).reshape(30, 3))
    cases = [  # (ours, Grain's source dataset over the same source, batch -> comparable)
        (  # under the pipeline's identity
            lambda: pipe.map_dataset()._parent,
            lambda: grain.MapDataset.source(pipe.batch_source()),
            inputs,
        ),
        (
            lambda: numpy.batches(4, seed=1, num_epochs=1)._parent,  # under the identity
            lambda: grain.MapDataset.source(numpy.batches(4, seed=1, num_epochs=1)._parent.source),
            lambda batch: batch.tolist(),
        ),
    ]

    def share(ds: grain.MapDataset, worker: int, as_list) -> list:
        it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=0))
        it_ds.set_slice(slice(worker, None, workers), sequential_slice=True)
        return [as_list(batch) for batch in it_ds]

    for ours, grains, as_list in cases:
        assert type(ours()).__name__ == "BatchDataset"
        shares = [share(ours(), w, as_list) for w in range(workers)]
        assert shares == [share(grains(), w, as_list) for w in range(workers)]
        whole = [as_list(batch) for batch in ours()]
        assert [batch for s in shares for batch in s] == whole
        assert [len(s) for s in shares] == [
            len(whole) // workers + (w < len(whole) % workers) for w in range(workers)
        ]


def test_reading_in_the_calling_thread_is_grains_iterator_without_its_bookkeeping(paths):
    """to_iter_dataset(ReadOptions(num_threads=0)) of a batch dataset (map_dataset(), the
    dataset under .batches(), iter_dataset()) reads in order in the calling thread: the same
    batches, the same state after each, the same restores, strided worker slices and errors
    as Grain's own iterator dataset over the same MapDataset; other read options keep
    Grain's."""
    from grain_rox._sources._batch_dataset import InOrderIterDataset

    pipe = TokenPipeline(paths["a"], seq_len=16, global_batch_size=4, seed=1, num_epochs=1)
    numpy = NumpySource(np.arange(90).reshape(30, 3))
    zero = grain.ReadOptions(num_threads=0)
    assert isinstance(pipe.iter_dataset()._parent, InOrderIterDataset)  # under the identity
    assert not isinstance(
        pipe.map_dataset().to_iter_dataset(grain.ReadOptions())._parent, InOrderIterDataset
    )
    for ds, as_list in (
        (pipe.map_dataset()._parent, inputs),
        (numpy.batches(4, seed=1, num_epochs=1)._parent, lambda batch: batch.tolist()),
    ):
        ours_ds, grains_ds = ds.to_iter_dataset(zero), grain.MapDataset.to_iter_dataset(ds, zero)
        assert isinstance(ours_ds, InOrderIterDataset)
        assert not isinstance(grains_ds, InOrderIterDataset)
        ours, grains = iter(ours_ds), iter(grains_ds)
        for _ in range(len(ds)):
            assert as_list(next(ours)) == as_list(next(grains))
            assert ours.get_state() == grains.get_state()
        for it in (ours, grains):
            with pytest.raises(StopIteration):
                next(it)
            it.set_state({"next_index": 2})
        assert [as_list(b) for b in ours] == [as_list(b) for b in grains]
        for it in (ours_ds, grains_ds):  # a worker's strided share, as mp_prefetch slices it
            it.set_slice(slice(1, None, 3))
        assert [as_list(b) for b in ours_ds] == [as_list(b) for b in grains_ds]
        # then in place, below the strided slice, as Grain does (on a worker's own copy: it
        # slices the dataset itself)
        ours_copy, grains_copy = copy.deepcopy(ours_ds), copy.deepcopy(grains_ds)
        for it in (ours_copy, grains_copy):
            it.set_slice(slice(1, None, 2), sequential_slice=True)
        assert [as_list(b) for b in ours_copy] == [as_list(b) for b in grains_copy]
        with pytest.raises(IndexError, match="out of range"):
            ours.set_state({"next_index": len(ds) + 1})
        with pytest.raises(ValueError, match="'next_index': <an int from 0 to"):
            ours.set_state({"next_index": "3"})
        with pytest.raises(ValueError, match="'next_index': <an int from 0 to"):
            ours.set_state({"next_index": True})
        for it in (ours, grains):  # no next_index: the KeyError Grain's iterator raises
            with pytest.raises(KeyError):
                it.set_state({})
        with pytest.raises(ValueError, match=r"not a state of this dataset: \{\}; it takes"):
            ours.set_state({})
        ours.set_state({"next_index": np.int64(1)})  # as a checkpoint may hand it back
        grains.set_state({"next_index": 1})
        assert as_list(next(ours)) == as_list(next(grains))
        for it in (ours, grains):  # Grain's index hooks (mp_prefetch uses them)
            assert grain.experimental.get_next_index(it) == 2
            grain.experimental.set_next_index(it, 3)
        assert as_list(next(ours)) == as_list(next(grains))
        # any chain of Grain transformations may follow it
        chain = lambda d: d.map(lambda x: x).filter(lambda x: True).batch(2)  # noqa: E731
        got = iter(chain(ds.to_iter_dataset(zero)))
        want = iter(chain(grain.MapDataset.to_iter_dataset(ds, zero)))
        for _ in range(2):
            a, b = next(got), next(want)
            flat = lambda t: sorted(t.items()) if isinstance(t, dict) else [("", t)]  # noqa: E731
            assert [(k, v.tolist()) for k, v in flat(a)] == [(k, v.tolist()) for k, v in flat(b)]
            assert got.get_state() == want.get_state()


@pytest.mark.slow
def test_sequential_slices_in_grain_worker_processes_read_as_grains_source_dataset(paths):
    pipe = TokenPipeline(paths["a"], seq_len=16, global_batch_size=4, seed=1, num_epochs=1)
    options = grain.MultiprocessingOptions(num_workers=2)

    def served(ds: grain.MapDataset) -> list:
        it = iter(ds.to_iter_dataset().mp_prefetch(options, sequential_slice=True))
        out = [inputs(batch) for batch in it]
        it.close()
        return out

    ours = served(pipe.map_dataset())  # before: "Cannot slice `MapDataset` source"
    assert ours == served(grain.MapDataset.source(pipe.batch_source()))
    assert sorted(ours) == sorted(inputs(batch) for batch in pipe.map_dataset())


def test_numpy_integers_are_accepted_by_every_argument(paths):
    i64, i32 = np.int64, np.int32
    assert Phase(steps=i64(10), batch_size=i32(4), seq_len=i64(16)) == Phase(10, 4, 16)
    for cls in (RoxTokenSource, RoxDocumentSource):
        plain, numpy = cls(paths["a"], seq_len=16, eos_id=0), cls(paths["a"], seq_len=i64(16),
                                                                  eos_id=i32(0))  # fmt: skip
        assert repr(plain) == repr(numpy) and as_list(plain[3]) == as_list(numpy[3])
    pipe = TokenPipeline(paths["a"], seq_len=16, global_batch_size=4, chunk_tokens=i64(256),
                         block_tokens=i32(2000), max_seq_len=i64(32), eos_id=i64(0))  # fmt: skip
    same = TokenPipeline(paths["a"], seq_len=16, global_batch_size=4, chunk_tokens=256, block_tokens=2000,
                         max_seq_len=32, eos_id=0)  # fmt: skip
    assert pipe.describe() == same.describe()
    assert as_list(pipe.batch_source(rows=(i64(1), i32(3)))[i64(2)]) == as_list(
        same.batch_source(rows=(1, 3))[2]
    )
    loader = pipe.data_loader(worker_count=i64(0), worker_buffer_size=i32(3))
    assert as_list(next(iter(loader))) == as_list(same.map_dataset()[0])
    assert as_list(next(iter(pipe.iter_dataset(worker_count=i32(0))))) == as_list(
        same.map_dataset()[0]
    )
    with pytest.raises(TypeError, match=r"TokenPipeline: worker_count=2\.0 is a float, not an int"):
        pipe.iter_dataset(worker_count=2.0)
    parts = {"a": grain.MapDataset.range(50), "b": grain.MapDataset.range(100, 120)}
    mixed = mix_datasets(parts, phases=[(i64(6), {"a": 1}), (None, {"a": 1, "b": i32(1)})],
                         seed=i64(4), length=i64(12))  # fmt: skip
    plain = mix_datasets(parts, phases=[(6, {"a": 1}), (None, {"a": 1, "b": 1})], seed=4,
                         length=12)  # fmt: skip
    assert list(mixed) == list(plain)
    docs = [np.arange(1, n) for n in (5, 9, 3, 12)]
    packed = pack_documents(docs, seq_len=i64(8), batch_size=i32(2), seed=np.uint32(3),
                            num_epochs=i64(1), num_packing_bins=i64(2), shard=(i64(0), i64(1)))  # fmt: skip
    plain_packed = pack_documents(docs, seq_len=8, batch_size=2, seed=3, num_epochs=1,
                                  num_packing_bins=2)  # fmt: skip
    assert [as_list(b) for b in packed] == [as_list(b) for b in plain_packed]


def test_a_config_of_numpy_values_gives_states_json_writes_and_restores(paths):
    """Grain's checkpoint handler writes a state with json.dumps: weights or epochs given as
    NumPy scalars (as a config computed with NumPy gives them) must not end up in it."""
    from grain_rox import MultiHostDataLoadIterator

    weights = {"a": np.float32(0.3), "b": np.float32(0.7)}
    pipe = TokenPipeline(paths, seq_len=16, global_batch_size=8, weights=weights)
    it = iter(pipe.map_dataset().to_iter_dataset(grain.ReadOptions(num_threads=0)))
    next(it)
    state = json.loads(json.dumps(it.get_state()))
    want = [inputs(next(it)) for _ in range(3)]
    again = iter(pipe.map_dataset().to_iter_dataset(grain.ReadOptions(num_threads=0)))
    again.set_state(state)
    assert [inputs(next(again)) for _ in range(3)] == want
    with MultiHostDataLoadIterator(pipe) as batches:
        next(batches)
        saved = batches.get_state()
        assert json.loads(saved)["pipeline"]["phases"][0]["weights"] == {
            "a": float(np.float32(0.3)), "b": float(np.float32(0.7))
        }  # fmt: skip
    rows = NumpySource({"x": np.arange(40, dtype=np.int32)}).batches(4, num_epochs=np.int64(2))
    it = iter(rows.to_iter_dataset(grain.ReadOptions(num_threads=0)))
    next(it)
    assert json.loads(json.dumps(it.get_state())) == it.get_state()


@pytest.mark.slow
def test_a_state_of_grain_workers_restores_with_as_many_and_names_the_count_otherwise(paths):
    """Grain's state of worker processes is one per worker: it restores exactly with as many,
    and another worker_count is refused naming it (it was 'not a TokenPipeline state', or a
    KeyError from inside Grain)."""
    pipe = TokenPipeline(paths["a"], seq_len=16, global_batch_size=4, num_epochs=1)
    it = iter(pipe.iter_dataset(worker_count=2))
    try:
        for _ in range(3):
            next(it)
        state = json.loads(json.dumps(it.get_state()))
        want = [inputs(next(it)) for _ in range(2)]
    finally:
        it.close()
    again = iter(pipe.iter_dataset(worker_count=2))
    try:
        again.set_state(state)
        assert [inputs(next(again)) for _ in range(2)] == want
    finally:
        again.close()
    with pytest.raises(ValueError, match=r"\(worker_count: saved 2 -> now 0\)") as e:
        iter(pipe.iter_dataset()).set_state(state)  # (a state without workers names none)
    assert str(e.value).endswith(
        "(Grain's state of worker processes restores only with as many workers; the batches "
        "do not depend on them: continue on another worker count from the saved step with "
        "iter_dataset(first_step=step, worker_count=...))"
    )
    plain = iter(pipe.iter_dataset())
    next(plain)
    three = iter(pipe.iter_dataset(worker_count=3))
    try:
        with pytest.raises(ValueError, match=r"\(worker_count: saved 0 -> now 3\)"):
            three.set_state(plain.get_state())
    finally:
        three.close()


def _noisy(x, rng):
    return int(x) * 1000 + int(rng.integers(0, 1000))


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        ({"seed": 2}, "rng_pool.seed=1"),
        ({"weights": [1, 3]}, "selection_map.proportions=[100, 100]"),
        ({"window": 8}, "window_size=4"),
        ({"reseed": False}, "reseed_each_epoch=False"),
    ],
)
def test_a_mixture_state_is_refused_when_a_hidden_input_setting_changed(changed, named):
    """A random_map's seed and a MapDataset.mix's weights live in helper objects that the
    nodes' str does not show, a window shuffle's size and a repeat's reseeding in attributes
    it does not show; a state saved with others is refused, naming them."""

    def build(seed: int = 1, weights=(1, 1), window=4, reseed=True):
        a = grain.MapDataset.range(50).random_map(_noisy, seed=seed)
        b = grain.MapDataset.mix([grain.MapDataset.range(100, 150), grain.MapDataset.range(200, 250)],
                                 list(weights))  # fmt: skip
        c = grain.experimental.WindowShuffleMapDataset(
            grain.MapDataset.range(300, 350), window_size=window, seed=3
        )
        d = grain.MapDataset.range(400, 425).shuffle(seed=4).repeat(2, reseed_each_epoch=reseed)
        inputs = {"a": a, "b": b, "c": c, "d": d}
        return mix_datasets(inputs, dict.fromkeys(inputs, 0.25), seed=0, length=40)

    it = iter(build().to_iter_dataset(grain.ReadOptions(num_threads=0)))
    next(it)
    state = it.get_state()
    again = iter(build().to_iter_dataset(grain.ReadOptions(num_threads=0)))
    again.set_state(state)
    assert next(again) == next(it)
    other = iter(build(**changed).to_iter_dataset(grain.ReadOptions(num_threads=0)))
    with pytest.raises(ValueError, match="its data or config changed") as refused:
        other.set_state(state)
    assert named in str(refused.value)


# ---- item 4: a packed stream does not depend on the number of Grain workers ------------------
def packed_docs(workers: int = 0, shard=(0, 1)):
    rng = np.random.default_rng(0)
    docs = [1000 * (i + 1) + np.arange(n) for i, n in enumerate(rng.integers(2, 30, 60))]
    ds = pack_documents(docs, seq_len=16, batch_size=2, num_epochs=1, shard=shard)
    if workers:
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    return ds


def test_packing_in_process_keeps_its_state_shape_and_checkpoints():
    grain.experimental.assert_equal_output_after_checkpoint(packed_docs())
    ds = packed_docs()
    share = ds.parents[0]
    for sl, sequential in ((slice(0, 4, 1), False), (slice(0, None, 2), True)):
        with pytest.raises(ValueError, match=r"pack_documents: cannot take the slice"):
            share.set_slice(sl, sequential)
    it = iter(ds)
    with pytest.raises(ValueError, match="not a pack_documents state"):
        it.set_state({**it.get_state(), "state": {"parent": None, "skip": -1}})


@pytest.mark.slow
def test_packed_stream_with_grain_workers_equals_in_process_and_restores():
    expected = [as_list(b) for b in packed_docs()]
    it = iter(packed_docs(workers=2))  # before: each worker packed its half of the documents
    head = [as_list(next(it)) for _ in range(5)]
    state = it.get_state()
    tail = [as_list(b) for b in it]
    it.close()
    assert head + tail == expected
    again = iter(packed_docs(workers=2))
    again.set_state(state)
    assert [as_list(b) for b in again] == tail
    again.close()


# ---- item 7: Grain workers without absl parsing, and the user's flags left alone -------------
def run_user_script(tmp_path, code: str, *args: str) -> str:
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(code))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_a_users_own_data_loader_with_workers_starts_without_parsing_flags(paths, tmp_path):
    code = f"""
        import json
        import grain
        import grain_rox
        from absl import flags

        def loader(source, workers):
            sampler = grain.samplers.IndexSampler(
                num_records=len(source), shard_options=grain.sharding.NoSharding(),
                shuffle=False, num_epochs=1)
            return grain.DataLoader(data_source=source, sampler=sampler, worker_count=workers,
                                    operations=[grain.transforms.Batch(4)])

        if __name__ == "__main__":
            source = grain_rox.RoxTokenSource({paths["a"]!r}, seq_len=8)
            it = iter(loader(source, 2))  # before: UnparsedFlagAccessError
            firsts = [next(it)["inputs"][:, 0].tolist() for _ in range(3)]
            # Grain batches within a worker: worker 0 gives records 0, 2, 4, 6 first
            assert firsts[0] == [source[i]["inputs"][0] for i in (0, 2, 4, 6)], firsts
            state = it.get_state()
            pipe = grain_rox.TokenPipeline({paths["a"]!r}, seq_len=16, global_batch_size=4)
            endless = iter(loader(pipe.batch_source(), 2))
            for _ in range(2):
                next(endless)
            saved = endless.get_state()
            nxt = next(endless)["inputs"].tolist()
            again = iter(loader(pipe.batch_source(), 2))
            again.set_state(saved)
            assert again.__next__()["inputs"].tolist() == nxt
            assert not flags.FLAGS.is_parsed()  # the user's choice, left alone
            print("ok")
    """
    assert run_user_script(tmp_path, code).split() == ["ok"]


def test_a_users_own_flags_still_parse_and_fail_as_absl_says(paths, tmp_path):
    code = f"""
        import sys
        import grain_rox
        from absl import app, flags

        source = grain_rox.RoxTokenSource({paths["a"]!r}, seq_len=8)
        grain_rox.pack_documents([[1, 2, 3]], seq_len=4, batch_size=1)
        pipe = grain_rox.TokenPipeline({paths["a"]!r}, seq_len=16, global_batch_size=4)
        pipe.data_loader(worker_count=2)  # before: marked every flag parsed
        pipe.iter_dataset(worker_count=2)
        STEPS = flags.DEFINE_integer("user_steps", 1, "defined after grain_rox ran")
        try:
            STEPS.value
        except flags.UnparsedFlagAccessError:
            print("unparsed")

        def main(argv):
            print(STEPS.value, flags.FLAGS.grain_enable_multiprocess_worker_profiling)

        if __name__ == "__main__":
            app.run(main)
    """
    out = run_user_script(
        tmp_path, code, "--user_steps=7", "--grain_enable_multiprocess_worker_profiling"
    )
    assert out.split() == ["unparsed", "7", "True"]


def test_sources_and_nodes_name_themselves_as_grain_shows_and_compares_them(paths, tmp_path):
    """A source's repr tells apart what reads differently (RoxDocumentSource's output dtype;
    HFStreamingSource's files and config, where it showed an object address), the in-order
    iterator has a name in Grain's summaries, and an endless map_dataset()[-1] says there is
    no last batch (index % len read a batch past the schedule's end and said so)."""
    from grain_rox import HFStreamingSource

    docs = [RoxDocumentSource(paths["a"], seq_len=8, dtype=d) for d in (np.int32, np.int64)]
    assert repr(docs[0]) != repr(docs[1]) and repr(docs[1]).endswith("dtype=int64)")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"x": [i, i + 1]}) + "\n" for i in range(6)))
    stream = [HFStreamingSource(str(rows), seed=s) for s in (0, 0, 1)]
    assert repr(stream[0]) == repr(stream[1]) != repr(stream[2])
    assert repr(stream[0]).startswith("HFStreamingSource(identity=")
    pipe = TokenPipeline(paths["a"], seq_len=16, global_batch_size=4, seed=1)
    it = iter(pipe.iter_dataset())
    next(it)
    assert str(it._parent) == "InOrderIterator(next_index=1)"  # under the pipeline's identity
    with pytest.raises(IndexError, match="an endless pipeline has no last batch to count from"):
        pipe.map_dataset()[-1]


def test_a_data_loader_over_our_map_datasets_restores_by_their_identity(paths):
    """A grain_rox MapDataset is a RandomAccessDataSource to Grain's DataLoader, which compares
    the source's repr on restore: it was an object address, so a loader refused its own state
    on the same data; it is the identity now, so other data is refused."""
    from grain_rox import NumpySource

    def loader(dataset):
        sampler = grain.samplers.IndexSampler(len(dataset), shuffle=False, num_epochs=1)
        return grain.DataLoader(data_source=dataset, sampler=sampler, worker_count=0,
                                read_options=grain.ReadOptions(num_threads=0))  # fmt: skip

    def batches(seed):
        return NumpySource(np.arange(40)).batches(4, seed=seed)

    def pipeline(seed):
        return TokenPipeline(paths["a"], seq_len=16, global_batch_size=4, seed=seed, num_epochs=1)

    for make, other in (
        (lambda: batches(1), batches(2)),
        (lambda: pipeline(2).map_dataset(), pipeline(3).map_dataset()),
    ):
        it = iter(loader(make()))
        next(it)
        state = it.get_state()
        expected = as_list(next(it))
        again = iter(loader(make()))
        again.set_state(state)
        assert as_list(next(again)) == expected
        assert repr(make()) == repr(make()) != repr(other)
        assert " at 0x" not in repr(make())
        with pytest.raises(ValueError, match=r"DataSource in checkpoint does not match"):
            iter(loader(other)).set_state(state)
    # the batches' form may change, as for the pipeline's other iterators
    tokens = iter(loader(pipeline(2).with_layout("tokens").map_dataset()))
    tokens.set_state(state)
    assert repr(pipeline(2).with_layout("tokens").map_dataset()) == repr(pipeline(2).map_dataset())
    expected = pipeline(2).map_dataset()[1]["inputs"]
    assert np.array_equal(pipeline(2).unpack(next(tokens))["inputs"], expected)


class _Rows(grain.experimental.FlatMapTransform):
    """A batch of 4 rows -> its rows, one element each."""

    max_fan_out = 4

    def flat_map(self, batch):
        return list(batch)


@pytest.mark.parametrize("level", ["map", "iter"])
def test_a_flat_map_through_apply_keeps_the_batches_identity(level):
    """Grain's ``apply`` makes a FlatMap's node itself: a state of the chain was a bare
    ``{"next_index": 5}`` that restored onto another seed, silently (reviewer)."""
    rows = np.arange(40 * 3, dtype=np.int32).reshape(40, 3)
    no_threads = grain.ReadOptions(num_threads=0)

    def chain(seed):
        ds = NumpySource(rows).batches(4, seed=seed, num_epochs=2)
        if level == "map":
            return ds.apply([_Rows()]).to_iter_dataset(no_threads)
        return ds.to_iter_dataset(no_threads).apply([_Rows(), grain.transforms.Batch(2)])

    it = iter(chain(2))
    for _ in range(5):
        next(it)
    state = it.get_state()
    assert any("flat_map(" in op and "_Rows" in op for op in state["identity"]["ops"])
    expected = [np.asarray(next(it)).tolist() for _ in range(3)]
    with pytest.raises(ValueError, match=r"changed \(seed: saved 2 -> now 9\)"):
        iter(chain(9)).set_state(state)
    again = iter(chain(2))
    again.set_state(state)
    assert [np.asarray(next(again)).tolist() for _ in range(3)] == expected
