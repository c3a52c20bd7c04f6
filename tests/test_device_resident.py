"""Device-resident batches (issue 20): ``MultiHostDataLoadIterator(ds, placement="device")``
gives the host path's batches and state for every source with fixed-shape rows, replicated
and sharded, across restores in both directions, with Orbax and on 2 real processes.

Data is tiny and the layouts are chosen by ``device_memory_budget`` (no huge arrays); 8 fake
CPU devices (conftest), in process (no Grain workers).
"""

from __future__ import annotations

import functools
import json
import math
import re

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from _corpora import random_documents
from array_record.python.array_record_module import ArrayRecordWriter
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from grain_rox import (
    ArrayRecordSource,
    HFEagerSource,
    MultiHostDataLoadIterator,
    NumpySource,
    RoxCheckpointRestore,
    RoxCheckpointSave,
    RoxTokenSource,
    TokenPipeline,
    shuffled_batches,
    testing,
    write_rox,
)

ROWS, BATCH = 45, 8  # 5 batches an epoch (5 rows wait for the next epoch), 1 row a device


def build_data(root: str) -> None:
    """Every kind of data once, with rows that differ (so any mix-up shows)."""
    rng = np.random.default_rng(20)
    pixels = rng.integers(0, 256, (ROWS, 4, 3), dtype=np.uint8)
    np.save(f"{root}/x.npy", pixels)
    np.save(f"{root}/y.npy", (np.arange(ROWS) * 7 - 100).astype(np.int64))
    np.save(f"{root}/f.npy", rng.standard_normal((ROWS, 2)).astype(np.float32))
    writer = ArrayRecordWriter(f"{root}/rows.array_record", "group_size:1")
    for row in pixels:
        writer.write(row.tobytes())
    writer.close()
    docs = random_documents(3, 40, lengths=(3, 30), high=900)
    write_rox(docs, f"{root}/c.rox", separator=0, block_size=64)


def npy_single(root: str) -> NumpySource:
    return NumpySource(f"{root}/x.npy")


def npy_dict(root: str) -> NumpySource:
    return NumpySource({k: f"{root}/{k}.npy" for k in ("x", "y", "f")})


def hf(root: str) -> HFEagerSource:
    x = np.load(f"{root}/x.npy")
    return HFEagerSource(data={"pixels": x.tolist(), "label": list(range(ROWS))})


def array_record(root: str) -> ArrayRecordSource:
    return ArrayRecordSource(f"{root}/rows.array_record", dtype=np.uint8, shape=(4, 3))


def rox(root: str) -> RoxTokenSource:
    return RoxTokenSource(f"{root}/c.rox", seq_len=8)


SOURCES = {
    "NumpySource": npy_single,
    "NumpySource(dict)": npy_dict,
    "HFEagerSource": hf,
    "ArrayRecordSource": array_record,
    "RoxTokenSource": rox,
}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("resident"))
    build_data(path)
    return path


def batches(root: str, name: str, **kwargs) -> grain.MapDataset:
    args = {"seed": 5, "num_epochs": 2, **kwargs}
    return shuffled_batches(SOURCES[name](root), BATCH, **args)


def row_bytes(source) -> int:
    """Bytes of one row on the devices (JAX's dtypes: int64 is int32 there)."""
    leaves = jax.tree_util.tree_leaves(source.get_batch([0]))
    return sum(
        math.prod(a.shape[1:]) * jax.dtypes.canonicalize_dtype(a.dtype).itemsize for a in leaves
    )


def budget_for(source, layout: str) -> int:
    """A device budget under which ``source``'s rows are ``layout`` on 8 devices."""
    total = len(source) * row_bytes(source)
    return total if layout == "replicated" else total - 1


def device(ds, source, layout: str, **kwargs) -> MultiHostDataLoadIterator:
    it = MultiHostDataLoadIterator(
        ds, placement="device", device_memory_budget=budget_for(source, layout), **kwargs
    )
    assert it.placement == layout
    return it


def take(it, count=None) -> list:
    out = []
    for batch in it:
        out.append(batch)
        if count is not None and len(out) == count:
            break
    return out


def assert_same(got: list, expected: list) -> None:
    """Exactly equal batches: structure, global shape, dtype, sharding and every bit."""
    assert len(got) == len(expected)
    for k, (a, e) in enumerate(zip(got, expected, strict=True)):
        assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(e), k
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(e), strict=True):
            assert isinstance(x, jax.Array) and x.shape == y.shape and x.dtype == y.dtype, k
            assert x.sharding == y.sharding, (k, x.sharding, y.sharding)
            assert np.asarray(x).tobytes() == np.asarray(y).tobytes(), f"batch {k} differs"


# ---- the same batches --------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["replicated", "sharded"])
@pytest.mark.parametrize("name", list(SOURCES))
def test_device_batches_equal_host_batches_over_two_epochs(root, name, layout):
    ds = batches(root, name)
    with MultiHostDataLoadIterator(ds) as host:
        expected = take(host)
    source = SOURCES[name](root)
    with device(ds, source, layout) as it:
        got = take(it)
        assert len(it) == len(got) == 2 * (len(source) // BATCH)
    assert_same(got, expected)


@pytest.mark.parametrize("layout", ["replicated", "sharded"])
def test_a_two_axis_mesh_and_the_iter_dataset_form(root, layout):
    mesh = Mesh(np.asarray(jax.devices()).reshape(4, 2), ("data", "model"))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    source = npy_dict(root)
    ds = shuffled_batches(source, BATCH, seed=1, num_epochs=1)
    with MultiHostDataLoadIterator(ds, data_sharding=sharding) as host:
        expected = take(host)
    read = grain.ReadOptions(num_threads=0)
    it = device(ds.to_iter_dataset(read), source, layout, data_sharding=sharding)
    with it:
        got = take(it)
    assert_same(got, expected)
    assert sorted(s.data.shape for s in got[0]["x"].addressable_shards) == [(2, 4, 3)] * 8


def test_unshuffled_and_endless_orders(root):
    source = npy_single(root)
    for kwargs in ({"shuffle": False, "num_epochs": 3}, {"num_epochs": None}):
        ds = shuffled_batches(source, BATCH, seed=2, **kwargs)
        with MultiHostDataLoadIterator(ds) as host, device(ds, source, "replicated") as it:
            assert_same(take(it, 17), take(host, 17))
    with pytest.raises(TypeError, match="endless"):
        len(it)


def test_a_replicated_gather_has_no_collectives(root):
    with device(batches(root, "NumpySource(dict)"), npy_dict(root), "replicated") as it:
        next(it)
        rows = it._feed.rows
        idx = jax.device_put(np.zeros((16, BATCH), np.int32), rows.index_sharding)
        text = rows._gather.lower(rows.data, idx).compile().as_text()
    for op in ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute"):
        assert op not in text, op


# ---- state: the same batch index on both paths -------------------------------------------------
@pytest.mark.parametrize("layout", ["replicated", "sharded"])
@pytest.mark.parametrize("name", ["NumpySource(dict)", "HFEagerSource", "RoxTokenSource"])
def test_restore_across_paths_both_ways(root, name, layout):
    ds, source = batches(root, name), SOURCES[name](root)
    with MultiHostDataLoadIterator(ds) as host:
        everything = take(host)
    for at in (0, 3, 7):  # before any batch, within the first epoch, within the second
        with MultiHostDataLoadIterator(ds) as host:
            take(host, at) if at else None
            host_state = host.get_state()
        with device(ds, source, layout) as it:
            it.set_state(host_state)
            assert it.step == at
            assert_same(take(it, 2), everything[at : at + 2])
            device_state = it.get_state()
        assert json.loads(device_state)["grain"]["state"] == {"next_index": at + 2}
        with MultiHostDataLoadIterator(ds) as host:
            host.set_state(device_state)
            assert_same(take(host), everything[at + 2 :])


@pytest.mark.parametrize("layout", ["replicated", "sharded"])
def test_the_device_path_restores_at_every_step(root, layout):
    source = npy_dict(root)
    ds = shuffled_batches(source, BATCH, seed=4, num_epochs=2)
    make = functools.partial(device, ds, source, layout)
    testing.check_checkpoint_every_step(testing.iterators(make))


def test_orbax_save_on_the_host_path_restores_on_the_device_path_and_back(root, tmp_path):
    source = npy_dict(root)
    ds = shuffled_batches(source, BATCH, seed=8, num_epochs=2)
    with MultiHostDataLoadIterator(ds) as host:
        everything = take(host)
    manager = ocp.CheckpointManager(str(tmp_path))
    with MultiHostDataLoadIterator(ds) as host:
        take(host, 4)
        manager.save(4, args=ocp.args.Composite(data=RoxCheckpointSave(host)))
        manager.wait_until_finished()
    with device(ds, source, "sharded") as it:
        manager.restore(4, args=ocp.args.Composite(data=RoxCheckpointRestore(it)))
        assert_same(take(it, 3), everything[4:7])
        manager.save(7, args=ocp.args.Composite(data=RoxCheckpointSave(it)))
        manager.wait_until_finished()
    with MultiHostDataLoadIterator(ds) as host:
        manager.restore(7, args=ocp.args.Composite(data=RoxCheckpointRestore(host)))
        assert_same(take(host), everything[7:])
    manager.close()


def test_a_state_of_other_data_or_order_is_refused(root):
    source = npy_dict(root)
    with MultiHostDataLoadIterator(shuffled_batches(source, BATCH, seed=1)) as host:
        take(host, 1)
        state = host.get_state()
    other = shuffled_batches(source, BATCH, seed=2)
    with device(other, source, "replicated") as it:
        with pytest.raises(
            ValueError, match=r"its data or config changed \(seed: saved 1 -> now 2\)"
        ):
            it.set_state(state)
        bad = json.loads(state)
        bad["grain"]["identity"]["seed"] = 2
        bad["grain"]["state"]["next_index"] = 99
        with pytest.raises(ValueError, match="not \\{'next_index': <an int from 0 to 5>\\}"):
            it.set_state(json.dumps(bad))


# ---- sizes and inputs ---------------------------------------------------------------------------
def test_rows_that_fit_nowhere_give_the_sizes_and_the_fixes(root):
    source = npy_dict(root)  # 45 rows x (12 + 4 + 8) bytes = 1,080 bytes; 6 rows a device
    ds = shuffled_batches(source, BATCH, seed=0)
    message = (
        "placement='device': the rows do not fit on the devices: 45 rows x 24 bytes = 1,080 "
        "bytes, i.e. 1,080 bytes per device replicated, or 144 bytes per device sharded over "
        "the 8 devices of the mesh's 'data' axis, but the budget is 143 bytes per device "
        "(device_memory_budget=143). Use placement='host'"
    )
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MultiHostDataLoadIterator(ds, placement="device", device_memory_budget=143)
    assert (
        MultiHostDataLoadIterator(ds, placement="device", device_memory_budget=144).placement
        == "sharded"
    )
    auto = MultiHostDataLoadIterator(ds, placement="auto", device_memory_budget=143)
    assert auto.placement == "host"
    assert MultiHostDataLoadIterator(ds, placement="auto").placement == "replicated"
    assert MultiHostDataLoadIterator(ds).placement == "host"  # the default stays the host path


def test_inputs_the_devices_cannot_hold_are_refused(root):
    source = npy_dict(root)
    with pytest.raises(ValueError, match=r"placement='device' takes a \.batches\(\) dataset"):
        MultiHostDataLoadIterator(
            shuffled_batches(source, BATCH).map(lambda b: b), placement="device"
        )
    pipe = TokenPipeline(f"{root}/c.rox", seq_len=8, global_batch_size=8)
    with pytest.raises(ValueError, match="got TokenPipeline"):
        MultiHostDataLoadIterator(pipe, placement="device")
    assert MultiHostDataLoadIterator(pipe, placement="auto").placement == "host"
    text = HFEagerSource(data={"t": [f"row {i}" for i in range(16)], "y": list(range(16))})
    with pytest.raises(ValueError, match="column 't' holds text, not numbers"):
        MultiHostDataLoadIterator(shuffled_batches(text, 8), placement="device")
    with pytest.raises(ValueError, match="batch_size=4 cannot be split evenly over the 8 devices"):
        MultiHostDataLoadIterator(shuffled_batches(source, 4), placement="device")
    with pytest.raises(ValueError, match="placement='gpu' must be one of"):
        MultiHostDataLoadIterator(shuffled_batches(source, 8), placement="gpu")
    other_share = shuffled_batches(source, 16, shard=(1, 2))  # not this process's rows:
    with pytest.raises(ValueError, match=r"shard=\(1, 2\) is neither this process's share"):
        MultiHostDataLoadIterator(other_share, placement="device")  # (it served all 16)
    # nor on the host, which made half of each batch of 16 a global batch of 8
    for placement in ("auto", "host"):
        with pytest.raises(ValueError, match=r"shard=\(1, 2\) gives this process rows \[8, 16\) "
                           r"of each global batch of 16, but its devices hold rows \[0, 16\)"):  # fmt: skip
            MultiHostDataLoadIterator(other_share, placement=placement)


# ---- processes ----------------------------------------------------------------------------------
def resident_in_process(
    root: str, state: bytes | None = None, budget: int | None = None
) -> MultiHostDataLoadIterator:
    """A device-resident iterator built in each process (each reads the rows it holds)."""
    ds = batches(root, "NumpySource(dict)")
    it = MultiHostDataLoadIterator(ds, placement="device", device_memory_budget=budget)
    if state is not None:
        it.set_state(state)
    return it


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["replicated", "sharded"])
def test_two_jax_processes_build_what_one_does_from_a_state_saved_on_the_host_path(root, layout):
    ds = batches(root, "NumpySource(dict)")
    with MultiHostDataLoadIterator(ds) as host:
        everything = take(host)
    with MultiHostDataLoadIterator(ds) as host:
        take(host, 3)
        state = host.get_state()  # one process, host path
    budget = budget_for(npy_dict(root), layout)
    with resident_in_process(root, state, budget) as it:
        assert it.placement == layout
        assert_same(take(it, 3), everything[3:6])
    make = functools.partial(resident_in_process, root, state, budget)
    testing.check_processes_equal(make, read=3)


@pytest.mark.slow
def test_orbax_roundtrip_of_the_device_path_in_a_fresh_process(root):
    make = functools.partial(resident_in_process, root)
    testing.check_orbax_roundtrip(lambda: testing.iterators(make), handler="grain_rox")


def test_rows_are_read_in_chunks_in_jax_dtypes(root, monkeypatch):
    from grain_rox._devices import _resident_data

    monkeypatch.setattr(_resident_data, "CHUNK_BYTES", 10 * 24)  # 10 rows a read
    source = npy_dict(root)
    calls = []
    original = type(source).get_batch
    monkeypatch.setattr(
        type(source), "get_batch", lambda self, idx: calls.append(len(idx)) or original(self, idx)
    )
    with MultiHostDataLoadIterator(shuffled_batches(source, BATCH), placement="device") as it:
        rows = it._feed.rows
        dtypes = {n: a.dtype for n, a in zip(rows.names, rows.data, strict=True)}
    assert dtypes == {"['f']": np.float32, "['x']": np.uint8, "['y']": np.int32}  # y: int64
    assert calls == [1, 10, 10, 10, 10, 5]  # row 0 for the layout, then every row once


def test_rows_of_another_dtype_than_row_0s_are_refused(monkeypatch):
    from grain_rox._devices import _resident_data

    monkeypatch.setattr(_resident_data, "CHUNK_BYTES", 8 * 4)  # 8 rows a read

    class Rows:  # rows 8.. read as float32 (8.5, 9.5, ...): the host path serves them so
        def __len__(self) -> int:
            return 16

        def __repr__(self) -> str:
            return "Rows()"

        def get_batch(self, idx):
            idx = np.asarray(idx)
            whole = (idx < 8).all()
            return np.where(idx < 8, idx, idx + 0.5).astype(np.int32 if whole else np.float32)

    ds = shuffled_batches(Rows(), 8, shuffle=False)
    with MultiHostDataLoadIterator(ds) as host:
        assert [np.asarray(b).dtype for b in host] == [np.int32, np.float32]
    message = "the rows of rows 8..15 of Rows() is float32, not int32 (row 0's"
    with pytest.raises(ValueError, match=re.escape(message)):  # was: 8, 9, ... as int32
        MultiHostDataLoadIterator(ds, placement="device")


@pytest.mark.parametrize("layout", ["replicated", "sharded"])
def test_bfloat16_rows_are_held_on_the_devices_bit_for_bit(layout):
    """ml_dtypes' floats are numpy kind "V": placement='device' refused them as not numeric
    (the host path placed them); the bit-level gather holds them exactly, -0.0 included."""
    import ml_dtypes

    class Rows:  # (np.save keeps no bfloat16: it loads as |V2)
        values = np.random.default_rng(0).standard_normal((48, 3)).astype(ml_dtypes.bfloat16)
        values[0, 0] = -0.0

        def __len__(self) -> int:
            return 48

        def __repr__(self) -> str:
            return "Rows(bfloat16, 48)"

        def get_batch(self, rows):
            return {"a": self.values[np.asarray(rows)]}

    source = Rows()
    ds = shuffled_batches(source, BATCH, seed=3, num_epochs=2)
    with MultiHostDataLoadIterator(ds) as host:
        expected = take(host)
    with device(ds, source, layout) as it:
        got = take(it)
    assert got[0]["a"].dtype == ml_dtypes.bfloat16
    assert_same(got, expected)
