"""MultiHostDataLoadIterator on one process with 8 CPU devices: layout, prefetch, state."""

from __future__ import annotations

import json
import re
import threading

import grain
import jax
import numpy as np
import pytest
from _corpora import random_documents
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from grain_rox import MultiHostDataLoadIterator, NumpySource, TokenPipeline
from grain_rox._devices import _multihost
from grain_rox._sources._segments import MAXTEXT_FEATURES


@pytest.fixture(autouse=True, params=[False, True], ids=["one_producer", "read_and_place"])
def split_producer(request, monkeypatch):
    """Every test in one producer thread, and with reading and placing in two threads."""
    monkeypatch.setattr(_multihost, "_SPLIT_PRODUCER", request.param)
    return request.param


def producer_threads(split: bool) -> set[str]:
    return {"grain_rox-prefetch", "grain_rox-read"} if split else {"grain_rox-prefetch"}


@pytest.fixture(scope="module")
def corpus(make_rox):
    return make_rox("mh", random_documents(0, 3000, lengths=(5, 200), high=1000), separator=0)


@pytest.fixture(scope="module")
def pipe(corpus):
    return TokenPipeline(corpus, seq_len=32, global_batch_size=16, seed=4, num_epochs=1)


def test_yields_global_arrays_sharded_over_the_data_axis(pipe):
    assert jax.device_count() == 8
    with MultiHostDataLoadIterator(pipe) as it:
        batch = next(it)
    assert set(batch) == set(MAXTEXT_FEATURES)
    x = batch["inputs"]
    assert isinstance(x, jax.Array) and x.shape == (16, 32) and x.dtype == np.int32
    assert x.sharding.spec == PartitionSpec("data")
    assert sorted(s.data.shape for s in x.addressable_shards) == [(2, 32)] * 8
    expected = pipe.map_dataset()[0]
    for key, value in batch.items():
        np.testing.assert_array_equal(np.asarray(value), expected[key])


def test_custom_mesh_and_sharding(pipe):
    mesh = Mesh(np.asarray(jax.devices()).reshape(4, 2), ("data", "model"))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    with MultiHostDataLoadIterator(pipe, data_sharding=sharding) as it:
        x = next(it)["targets"]
    assert x.sharding == sharding
    assert sorted(s.data.shape for s in x.addressable_shards) == [(4, 32)] * 8
    np.testing.assert_array_equal(np.asarray(x), pipe.map_dataset()[0]["targets"])
    with pytest.raises(ValueError, match="no 'data' axis"):
        MultiHostDataLoadIterator(pipe, mesh=Mesh(np.asarray(jax.devices()), ("batch",)))


def test_a_sharding_that_also_splits_the_sequence_axis(pipe):
    """Rows over 'data', the sequence over 'model' (context parallelism): the same batches,
    on the host path and gathered on the devices."""
    mesh = Mesh(np.asarray(jax.devices()).reshape(4, 2), ("data", "model"))
    sharding = NamedSharding(mesh, PartitionSpec("data", "model"))
    with MultiHostDataLoadIterator(pipe, data_sharding=sharding) as it:
        batch = next(it)
    assert it.local_rows == {16: (0, 16)}
    for key, value in pipe.map_dataset()[0].items():
        assert batch[key].sharding == sharding
        assert sorted(s.data.shape for s in batch[key].addressable_shards) == [(4, 16)] * 8
        np.testing.assert_array_equal(np.asarray(batch[key]), value)
    rows = NumpySource(np.arange(64 * 4, dtype=np.int32).reshape(64, 4)).batches(8, seed=0)
    with MultiHostDataLoadIterator(rows, data_sharding=sharding, placement="device") as it:
        x = next(it)
    assert x.sharding == sharding
    np.testing.assert_array_equal(np.asarray(x), rows[0])


def test_a_sharding_that_cannot_split_a_batch_array_names_the_array_and_the_fix(pipe):
    """layout="tokens" sends a sample as one row of seq_len + 2 columns: a sequence axis over
    4 devices got JAX's bare IndivisibleError about an axis of 34 the user never chose. A
    Grain input's array the mesh cannot split is named too."""
    mesh = Mesh(np.asarray(jax.devices()).reshape(2, 4), ("data", "model"))
    sharding = NamedSharding(mesh, PartitionSpec("data", "model"))
    tokens = pipe.with_layout("tokens")
    with (
        MultiHostDataLoadIterator(tokens, data_sharding=sharding) as it,
        pytest.raises(ValueError) as e,
    ):
        next(it)
    assert str(e.value) == (
        f"MultiHostDataLoadIterator: data_sharding {sharding.spec} splits axis 1 "
        "of the batch's ['tokens'] 4 ways, but that axis has 34 entries (shape (16, 34)); "
        "layout='tokens' sends each sample as rows that hold its tokens with what the features "
        "need, not one position of the sequence a column: split batches by rows only "
        "(PartitionSpec('data')) and the sequence inside your step "
        "(jax.lax.with_sharding_constraint on pipe.unpack's features), or use "
        "layout='maxtext', whose features are (batch, seq_len)"
    )
    rows = NumpySource(np.zeros((64, 6), np.int32)).batches(8, seed=0)
    said = re.escape(
        "splits axis 1 of the batch's (the batch) 4 ways, but that axis has 6 entries "
        "(shape (8, 6)); give it a sharding whose mesh axes divide it, or pad it"
    )
    with (
        MultiHostDataLoadIterator(rows, data_sharding=sharding) as it,
        pytest.raises(ValueError, match=said),
    ):
        next(it)


@pytest.mark.parametrize(
    ("arg", "value", "error", "message"),
    [
        ("prefetch", 0, ValueError, "prefetch=0 must be a positive int"),
        ("prefetch", 2.7, TypeError, "prefetch=2.7 is a float, not an int"),
        ("prefetch", True, TypeError, "prefetch=True is a bool, not an int"),
        ("worker_count", -1, ValueError, "worker_count=-1 must be >= 0"),
        ("features_on_device", "yes", TypeError, "features_on_device='yes' is not a bool"),
    ],
)
def test_arguments_are_checked_not_coerced(pipe, arg, value, error, message):
    """prefetch=0 (or 2.7, or True) became 1, worker_count=-1 went through int() and
    features_on_device="yes" counted as True, none said."""
    with pytest.raises(error, match=rf"^MultiHostDataLoadIterator: {re.escape(message)}"):
        MultiHostDataLoadIterator(pipe, **{arg: value})


def test_finite_length_and_clean_end(pipe):
    with MultiHostDataLoadIterator(pipe) as it:
        assert len(it) == pipe.num_batches
        count = sum(1 for _ in it)
        assert count == pipe.num_batches
        with pytest.raises(StopIteration):
            next(it)
    endless = TokenPipeline(pipe.paths, seq_len=32, global_batch_size=16)
    with pytest.raises(TypeError, match="endless"):
        len(MultiHostDataLoadIterator(endless))


def test_state_restores_the_next_batches_exactly(pipe):
    it = MultiHostDataLoadIterator(pipe, prefetch=3)
    for _ in range(5):
        next(it)
    state = it.get_state()
    assert json.loads(state)["step"] == 5
    following = [np.asarray(next(it)["inputs"]) for _ in range(4)]
    it.set_state(state)  # rewinding in place also works
    assert [np.array_equal(np.asarray(next(it)["inputs"]), f) for f in following] == [True] * 4
    fresh = MultiHostDataLoadIterator(pipe)
    fresh.set_state(state)
    assert all(np.array_equal(np.asarray(next(fresh)["inputs"]), f) for f in following)
    it.close()
    fresh.close()


def test_restoring_with_another_config_names_what_changed(pipe):
    it = MultiHostDataLoadIterator(pipe)
    next(it)
    state = it.get_state()
    it.close()
    other = TokenPipeline(pipe.paths, seq_len=16, global_batch_size=16, seed=5, num_epochs=1)
    with pytest.raises(
        ValueError,
        match=r"seed: saved 4 -> now 5.*phase 0, which ran from step 0, changed \(seq_len 32 -> 16\)",
    ):
        MultiHostDataLoadIterator(other).set_state(state)
    with pytest.raises(ValueError, match="not a MultiHostDataLoadIterator state"):
        MultiHostDataLoadIterator(pipe).set_state(b'{"step": 3}')


def test_worker_error_is_raised_in_the_caller_after_good_batches():
    class Flaky:
        def __len__(self):
            return 10

        def __getitem__(self, i):
            if i == 3:
                raise RuntimeError("disk on fire at record 3")
            return {"x": np.full((8, 2), i, np.int32)}

    ds = grain.MapDataset.source(Flaky()).to_iter_dataset()
    it = MultiHostDataLoadIterator(ds, prefetch=4)
    got = [int(np.asarray(next(it)["x"])[0, 0]) for _ in range(3)]
    assert got == [0, 1, 2]
    with pytest.raises(RuntimeError, match="disk on fire at record 3"):
        next(it)
    it.close()


def test_grain_dataset_input_keeps_grain_state(corpus):
    ds = (
        grain.MapDataset.source(list(range(40)))
        .map(lambda i: {"x": np.full((8, 3), i, np.int32)})
        .to_iter_dataset()
    )
    it = MultiHostDataLoadIterator(ds)
    for _ in range(6):
        next(it)
    state = it.get_state()
    after = [int(np.asarray(next(it)["x"])[0, 0]) for _ in range(3)]
    assert after == [6, 7, 8]
    again = MultiHostDataLoadIterator(ds)
    again.set_state(state)
    assert [int(np.asarray(next(again)["x"])[0, 0]) for _ in range(3)] == after
    it.close()
    again.close()


def test_close_stops_the_prefetch_thread(pipe, split_producer):
    before = {t.name for t in threading.enumerate()}
    it = MultiHostDataLoadIterator(pipe, prefetch=2)
    next(it)
    started = {t.name for t in threading.enumerate()} - before
    assert started == producer_threads(split_producer)
    it.close()
    assert {t.name for t in threading.enumerate()} - before == set()


def test_reading_and_placing_take_two_threads_only_on_accelerators(pipe, monkeypatch):
    """On accelerators one thread reads while another places (the transfer waits on the
    device); on CPU devices both stages would compete for the cores the step uses."""
    monkeypatch.setattr(_multihost, "_SPLIT_PRODUCER", None)
    before = {t.name for t in threading.enumerate()}
    with MultiHostDataLoadIterator(pipe) as it:
        on_cpu = all(d.platform == "cpu" for d in it.mesh.devices.flat)
        assert it._split_producer is not on_cpu
        next(it)
        started = {t.name for t in threading.enumerate()} - before
        assert started == producer_threads(not on_cpu)


def test_worker_count_reads_a_token_pipeline_in_process_and_says_why(pipe, caplog, split_producer):
    before = {t.name for t in threading.enumerate()}
    with caplog.at_level("WARNING", logger="grain_rox"):
        it = MultiHostDataLoadIterator(pipe, worker_count=2)
    assert "MultiHostDataLoadIterator(worker_count=2) reads this TokenPipeline in process" in (
        caplog.text
    )
    with it:
        got = [np.asarray(next(it)["inputs"]) for _ in range(3)]
        started = {t.name for t in threading.enumerate()} - before
    assert started == producer_threads(split_producer)  # no Grain workers (threads or processes)
    ds = pipe.map_dataset()
    assert all(np.array_equal(g, ds[k]["inputs"]) for k, g in enumerate(got))


def test_windows_layout_places_fewer_arrays_and_unpacks_to_maxtext(pipe):
    import dataclasses

    from grain_rox import unpack_windows

    compact = dataclasses.replace(pipe, layout="windows")
    with MultiHostDataLoadIterator(compact) as it:
        batch = next(it)
    assert set(batch) == {"windows", "segments"}
    assert batch["windows"].shape == (16, 33) and batch["segments"].shape == (16, 3, 32)
    expected = pipe.map_dataset()[0]
    unpacked = jax.jit(unpack_windows)(batch)
    assert set(unpacked) == set(expected)
    for key, value in unpacked.items():
        np.testing.assert_array_equal(np.asarray(value), expected[key])
    with pytest.raises(ValueError, match="layout='rows'"):
        dataclasses.replace(pipe, layout="rows")


def test_a_batch_size_the_data_axis_cannot_split_is_named_at_construction(corpus):
    pipe12 = TokenPipeline(corpus, seq_len=32, global_batch_size=12, num_epochs=1)
    message = (
        r"global_batch_size=12 cannot be split evenly over the 8 devices of the mesh's 'data' "
        r"axis: use a global_batch_size that is a multiple of 8 \(e.g. 16\)"
    )
    with pytest.raises(ValueError, match=message):
        MultiHostDataLoadIterator(pipe12)
    mesh = Mesh(np.asarray(jax.devices()).reshape(4, 2), ("data", "model"))
    with MultiHostDataLoadIterator(pipe12, mesh=mesh) as it:  # 4 devices on 'data': fine
        assert next(it)["inputs"].shape == (12, 32)


def test_a_later_phase_the_data_axis_cannot_split_is_named_at_construction(corpus):
    """Elastic resume onto another device count: a curriculum whose later phase's batch the
    new mesh cannot split is refused when the iterator is made (before a restore, or any
    batch), not when the run reaches that phase."""
    from grain_rox import Phase

    pipe = TokenPipeline(corpus, phases=[Phase(3, 8, 16), Phase(None, 12, 16)], seed=0)
    with pytest.raises(ValueError, match=r"^phase 1's batch_size=12 cannot be split evenly over "
                       r"the 8 devices of the mesh's 'data' axis: use a batch_size that is a "
                       r"multiple of 8 \(e.g. 16\)"):  # fmt: skip
        MultiHostDataLoadIterator(pipe)
    one = TokenPipeline(corpus, phases=[Phase(None, 12, 16)], seed=0)  # phases= of one
    with pytest.raises(ValueError, match=r"^phase 0's batch_size=12 cannot be split"):
        MultiHostDataLoadIterator(one)
    mesh = Mesh(np.asarray(jax.devices()).reshape(4, 2), ("data", "model"))
    with MultiHostDataLoadIterator(pipe, mesh=mesh) as it:  # 4 devices on 'data' split both
        assert [next(it)["inputs"].shape for _ in range(4)] == [(8, 16)] * 3 + [(12, 16)]


def grain_batches(batch_size, drop_remainder, rows=20):
    source = grain.MapDataset.range(rows).map(lambda i: np.full(3, i, np.int32))
    return source.batch(batch_size, drop_remainder=drop_remainder)


def test_a_last_partial_grain_batch_is_named_with_the_fix():
    with MultiHostDataLoadIterator(grain_batches(8, drop_remainder=False)) as it:
        assert [np.asarray(next(it))[:, 0].tolist()[0] for _ in range(2)] == [0, 8]
        with pytest.raises(
            ValueError,
            match=r"the last batch has 4 rows \(the earlier ones had 8\), which cannot be split "
            r"evenly over the 8 devices of the mesh's 'data' axis: drop the partial batch \(use "
            r"drop_remainder=True",
        ):
            next(it)
    with MultiHostDataLoadIterator(grain_batches(8, drop_remainder=True)) as it:
        assert len(list(it)) == 2
    with (
        MultiHostDataLoadIterator(grain_batches(6, drop_remainder=True)) as it,
        pytest.raises(ValueError, match=r"the batches have 6 rows, .* a multiple of 8"),
    ):
        next(it)
    # a .batches() dataset says its batch size when the iterator is made (JAX's
    # IndivisibleError, about a partition of axis 0, came first)
    from grain_rox import NumpySource

    with pytest.raises(ValueError, match=r"^the \.batches\(\) dataset's batch_size=6 cannot be "
                       r"split evenly over the 8 devices of the mesh's 'data' axis: use a batch "
                       r"size that is a multiple of 8 \(e\.g\. 8\)"):  # fmt: skip
        MultiHostDataLoadIterator(NumpySource(np.arange(48)).batches(6))


def test_no_traceback_at_interpreter_exit_and_len_of_a_data_loader_is_explained(tmp_path):
    import subprocess
    import sys

    script = (
        "import grain, numpy as np\n"
        "from grain_rox import MultiHostDataLoadIterator\n"
        "ds = grain.MapDataset.range(16).map(lambda i: np.full(2, i)).batch(8)\n"
        "it = MultiHostDataLoadIterator(ds)\n"
        "open_one = MultiHostDataLoadIterator(ds)\n"
        "next(open_one)\n"
        "it.close()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    loader = grain.DataLoader(
        data_source=[np.zeros(2)] * 16,
        sampler=grain.samplers.SequentialSampler(16, grain.sharding.NoSharding()),
        operations=[grain.transforms.Batch(8)],
    )
    with pytest.raises(TypeError, match=r"len\(\) is unknown for a DataLoader input"):
        len(MultiHostDataLoadIterator(loader))


@pytest.mark.parametrize("devices", [1, 8])
@pytest.mark.parametrize("layout", ["maxtext", "tokens", "windows"])
def test_a_batch_placed_by_one_jitted_call_equals_one_placed_by_device_put(
    corpus, layout, devices, monkeypatch
):
    """The two ways of placing a host batch give the same arrays: values, dtypes, shapes and
    shardings, features derived on the devices included."""
    mesh = Mesh(np.asarray(jax.devices()[:devices]), ("data",))
    pipe = TokenPipeline(
        corpus, seq_len=32, global_batch_size=16, seed=4, num_epochs=1, layout=layout
    )
    batches = {}
    for by_call in (True, False):
        monkeypatch.setattr(_multihost, "_PLACE_BY_CALL", by_call)
        with MultiHostDataLoadIterator(
            pipe, mesh=mesh, features_on_device=layout == "maxtext"
        ) as it:
            assert it._place_by_call is by_call
            batches[by_call] = [next(it) for _ in range(3)]
    host = pipe.map_dataset()
    for k, (called, put) in enumerate(zip(batches[True], batches[False], strict=True)):
        assert sorted(called) == sorted(put)
        for key, value in called.items():
            assert value.dtype == put[key].dtype, key
            assert value.sharding == put[key].sharding, key
            np.testing.assert_array_equal(np.asarray(value), np.asarray(put[key]), key)
            np.testing.assert_array_equal(np.asarray(value), host[k][key], key)


def test_batches_for_one_device_are_placed_by_one_call_and_for_several_by_device_put(
    pipe, monkeypatch
):
    """By one jitted call where a batch lands on one device of one process (its dispatch
    copies the arrays in C++: 4x cheaper than device_put there); device_put across several,
    where the call would shard the host arrays in Python (3x dearer on 8 CPU devices)."""
    monkeypatch.setattr(_multihost, "_PLACE_BY_CALL", None)
    one = Mesh(np.asarray(jax.devices()[:1]), ("data",))
    with MultiHostDataLoadIterator(pipe, mesh=one) as it:
        assert it._place_by_call
        assert next(it)["inputs"].sharding.device_set == {jax.devices()[0]}
    with MultiHostDataLoadIterator(pipe) as it:
        assert len(it.sharding.device_set) == 8
        assert not it._place_by_call


def test_a_grain_batch_placed_by_one_call_equals_one_placed_by_device_put(monkeypatch):
    """A user's Grain dataset on one device: the same arrays either way, int64 and float64
    leaves canonicalised alike (to int32 and float32 unless x64 is on)."""
    data = (
        grain.MapDataset.range(64)
        .map(lambda i: {"ids": np.full(4, i, np.int64), "weight": np.float64(i) / 2})
        .batch(8)
    )
    one = Mesh(np.asarray(jax.devices()[:1]), ("data",))
    batches = {}
    for by_call in (True, False):
        monkeypatch.setattr(_multihost, "_PLACE_BY_CALL", by_call)
        with MultiHostDataLoadIterator(data, mesh=one) as it:
            batches[by_call] = [next(it) for _ in range(3)]
    for k, (called, put) in enumerate(zip(batches[True], batches[False], strict=True)):
        for key in ("ids", "weight"):
            assert called[key].dtype == put[key].dtype, key
            np.testing.assert_array_equal(np.asarray(called[key]), np.asarray(put[key]))
        np.testing.assert_array_equal(np.asarray(called["ids"])[:, 0], np.arange(8 * k, 8 * k + 8))


def test_batches_of_many_shapes_place_the_new_ones_by_device_put(monkeypatch, caplog):
    """The call compiles once a shape: past the first few shapes (a Grain input padded per
    batch), new shapes go by device_put, said once; every batch is still served exactly."""
    monkeypatch.setattr(_multihost, "_PLACE_BY_CALL", True)
    monkeypatch.setattr(_multihost, "_CALL_SHAPES", 2)
    widths = [3, 4, 3, 5, 6, 4, 7]
    data = grain.MapDataset.source(widths).map(lambda w: {"x": np.full((2, w), w, np.int32)})
    one = Mesh(np.asarray(jax.devices()[:1]), ("data",))
    with (
        caplog.at_level("INFO", logger="grain_rox"),
        MultiHostDataLoadIterator(data, mesh=one) as it,
    ):
        got = [np.asarray(b["x"]) for b in it]
        shapes = {s for s in it._call_shapes if s is not None}
    assert [g.shape for g in got] == [(2, w) for w in widths]
    assert all((g == w).all() for g, w in zip(got, widths, strict=True))
    assert sorted(s[1][0][0] for s in shapes) == [(2, 3), (2, 4)]  # the first two, called
    said = [r.getMessage() for r in caplog.records if "more than 2 shapes" in r.getMessage()]
    assert len(said) == 1 and "placed by jax.device_put" in said[0]


class _Masked:
    """A user's pytree node whose metadata is a numpy array (compared elementwise)."""

    def __init__(self, x, mask):
        self.x, self.mask = x, mask


jax.tree_util.register_pytree_node(
    _Masked, lambda b: ((b.x,), b.mask), lambda mask, children: _Masked(children[0], mask)
)


@pytest.mark.parametrize(
    "setting",
    [
        ("jax_transfer_guard", "disallow"),
        ("jax_transfer_guard_host_to_device", "log"),
        ("jax_debug_nans", True),
        ("jax_disable_jit", True),
    ],
    ids=lambda s: f"{s[0]}={s[1]}",
)
def test_jax_settings_that_treat_a_call_otherwise_keep_device_put(corpus, setting):
    """A transfer guard allows device_put (an explicit transfer), not host arrays in a jitted
    call; NaN checks would refuse a batch holding a NaN; with jit disabled the call would hand
    out the host arrays. Under each, batches are placed by device_put, as before."""
    name, value = setting
    one = Mesh(np.asarray(jax.devices()[:1]), ("data",))
    floats = grain.MapDataset.source([0, 1, 2, 3]).map(
        lambda i: {"x": np.array([[i, np.nan], [1.0, 2.0]], np.float32)}
    )
    pipe = TokenPipeline(corpus, seq_len=16, global_batch_size=4, seed=1, num_epochs=1)
    before = getattr(jax.config, name)
    jax.config.update(name, value)
    try:
        served = []
        for data, kw in ((floats, {}), (pipe, {}), (pipe, {"features_on_device": True})):
            with MultiHostDataLoadIterator(data, mesh=one, **kw) as it:
                batches = [next(it) for _ in range(3)]
                assert not it._call_shapes  # none placed by the call
            for b in batches:
                for array in b.values():
                    assert isinstance(array, jax.Array) and array.sharding.mesh == one
            served.append(batches)
    finally:
        jax.config.update(name, before)
    host = pipe.map_dataset()
    for k in range(3):
        x = np.asarray(served[0][k]["x"])
        assert x[0, 0] == k and np.isnan(x[0, 1]) and x[1].tolist() == [1.0, 2.0]
        for batches in served[1:]:
            np.testing.assert_array_equal(np.asarray(batches[k]["inputs"]), host[k]["inputs"])


def test_arrays_jax_cannot_take_as_they_are_go_by_device_put(monkeypatch):
    """Byte-swapped arrays (the call served them swapped once a native batch of their shape
    had compiled), strings (the call's error spoke of static_argnums) and a pytree whose
    metadata is a numpy array (its shape key could not be compared) take device_put's path:
    JAX's own error, or the batch as device_put places it."""
    monkeypatch.setattr(_multihost, "_PLACE_BY_CALL", True)
    one = Mesh(np.asarray(jax.devices()[:1]), ("data",))
    swapped = grain.MapDataset.source([0, 1]).map(
        lambda i: {"x": np.array([[1, 258], [3, 2**20]], "<i4" if i == 0 else ">i4")}
    )
    with MultiHostDataLoadIterator(swapped, mesh=one) as it:
        assert np.asarray(next(it)["x"]).tolist() == [[1, 258], [3, 2**20]]
        with pytest.raises(TypeError, match=r"Dtype >i4 is not a valid JAX array type"):
            next(it)
    texts = grain.MapDataset.source([0]).map(lambda i: {"t": np.array(["a", "b"])})
    with (
        MultiHostDataLoadIterator(texts, mesh=one) as it,
        pytest.raises(TypeError, match=r"Dtype <U1 is not a valid JAX array type"),
    ):
        next(it)
    masked = grain.MapDataset.source([0, 1, 2]).map(
        lambda i: _Masked(np.full((2, 2), i, np.int32), np.array([1, 2]))
    )
    with MultiHostDataLoadIterator(masked, mesh=one) as it:
        got = [np.asarray(b.x) for b in it]
    assert [g[0, 0] for g in got] == [0, 1, 2]


@pytest.mark.parametrize("placement", ["host", "device"])
def test_64_bit_integers_jax_would_wrap_are_refused_naming_the_leaf(placement):
    """With jax_enable_x64 off (the default) JAX places int64 as int32: 2**32 + 7 became 7,
    silently, on the host path and with the rows held on the devices."""
    from grain_rox import NumpySource

    def batches(ids):
        source = NumpySource({"doc_id": ids, "x": np.arange(len(ids), dtype=np.int32)})
        return source.batches(8, shuffle=False)

    fits = np.arange(16, dtype=np.int64) - 2**31  # int32's least value and up: placed as before
    with MultiHostDataLoadIterator(batches(fits), placement=placement) as it:
        got = [next(it) for _ in range(2)]
    assert got[0]["doc_id"].dtype == np.int32
    np.testing.assert_array_equal(np.concatenate([np.asarray(b["doc_id"]) for b in got]), fits)
    wraps = np.arange(16, dtype=np.int64) + 2**31 - 8  # the second batch passes int32's max
    with (
        pytest.raises(ValueError) as info,
        MultiHostDataLoadIterator(batches(wraps), placement=placement) as it,
    ):
        next(it)
        next(it)
    assert str(info.value).endswith(
        "'s leaf ['doc_id'] holds int64 values up to 2147483655, which JAX places as int32 "
        "(jax_enable_x64 is off), so they would wrap (2147483655 -> -2147483641). Enable 64-bit "
        "JAX (jax.config.update('jax_enable_x64', True), before any array is made), or bring "
        "the values into int32's range (or leave the leaf out) before they reach the devices"
    )
    jax.config.update("jax_enable_x64", True)  # (global: the prefetch thread reads it too)
    try:
        with MultiHostDataLoadIterator(batches(wraps), placement=placement) as it:
            got = [next(it) for _ in range(2)]
        assert got[1]["doc_id"].dtype == np.int64
        np.testing.assert_array_equal(np.concatenate([np.asarray(b["doc_id"]) for b in got]), wraps)
    finally:
        jax.config.update("jax_enable_x64", False)


def test_a_uint32_pipeline_served_as_int64_is_refused_where_jax_would_narrow_it(tmp_path):
    """The uint32 check's own advice (dtype=np.int64) wrapped again on the devices."""
    from grain_rox import write_rox

    path = str(tmp_path / "u.rox")
    write_rox([np.arange(2**31 - 100, 2**31 + 3000, dtype=np.uint32)], path, separator=0)
    pipe = TokenPipeline(path, seq_len=8, global_batch_size=8, dtype=np.int64)
    with (
        pytest.raises(ValueError, match=r"leaf \['inputs'\] holds int64 values up to 2147"),
        MultiHostDataLoadIterator(pipe) as it,
    ):
        for _ in range(200):
            next(it)


def test_a_float64_leaf_rounded_to_32_bits_is_said_once(monkeypatch, caplog):
    """With jax_enable_x64 off JAX rounds float64 to float32: it continued without a word."""
    import logging

    from grain_rox._devices import _narrowing

    monkeypatch.setattr(_narrowing, "_ROUNDED_SAID", set())
    data = grain.MapDataset.range(32).map(lambda i: {"w": np.float64(i) / 3, "i": np.int32(i)})
    with (
        caplog.at_level(logging.WARNING, logger="grain_rox"),
        MultiHostDataLoadIterator(data.batch(8)) as it,
    ):
        got = [next(it) for _ in range(3)]
    assert got[0]["w"].dtype == np.float32
    said = [r.getMessage() for r in caplog.records if "rounded" in r.getMessage()]
    assert len(said) == 1, said  # once a process, not once a batch
    assert said[0].startswith("a batch of a Grain input (BatchMapDataset)'s leaf ['w'] is float64")
    assert said[0].endswith(
        "which JAX places as float32 (jax_enable_x64 is off): its values are rounded to "
        "float32's precision (said once a process). Make it float32 where it is made to say "
        "so, or enable 64-bit JAX (jax.config.update('jax_enable_x64', True)) to keep them"
    )
