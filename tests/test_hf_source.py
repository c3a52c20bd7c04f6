"""HFEagerSource: HuggingFace data as a Grain source, offline, memory-mapped, picklable."""

from __future__ import annotations

import json
import pickle

import grain
import numpy as np
import pytest

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from grain_rox import HFEagerSource  # noqa: E402


@pytest.fixture
def table():
    return {
        "ids": [[i, i + 1, i + 2] for i in range(20)],
        "ragged": [list(range(i % 4 + 1)) for i in range(20)],
        "label": list(range(20)),
        "text": [f"doc {i}" for i in range(20)],
    }


def test_records_are_numpy_dicts_and_batches_are_one_take(table):
    source = HFEagerSource(data=table, exclude_keys=["text"])
    assert len(source) == 20 and source.columns == ["ids", "ragged", "label"]
    rec = source[3]
    assert rec["ids"].tolist() == [3, 4, 5] and int(rec["label"]) == 3
    assert [r["label"].item() for r in source._getitems([5, 1, 7])] == [5, 1, 7]
    batch = HFEagerSource(data=table, include_keys=["ids", "label"]).get_batch([2, 0])
    assert batch["ids"].tolist() == [[2, 3, 4], [0, 1, 2]] and batch["label"].tolist() == [2, 0]
    with pytest.raises(ValueError, match=r"column 'ragged' is ragged: row 0 has shape \(1,\)"):
        source.get_batch([0, 1, 2])


def test_in_memory_data_is_cached_to_arrow_and_workers_get_paths_not_data(table, tmp_path):
    source = HFEagerSource(data=table, cache_dir=str(tmp_path / "cache"))
    assert source.files and all(f.startswith(str(tmp_path)) for f in source.files)
    blob = pickle.dumps(source)
    assert len(blob) < 2_000
    clone = pickle.loads(blob)
    assert repr(clone) == repr(source) and "0x" not in repr(source)
    assert clone[19]["text"].item() == "doc 19"


def test_parquet_and_arrow_files(table, tmp_path):
    path = str(tmp_path / "t.parquet")
    pq.write_table(pa.table({"label": table["label"], "text": table["text"]}), path)
    source = HFEagerSource(data_files=path)
    assert len(source) == 20 and source[4]["text"].item() == "doc 4"
    arrow = HFEagerSource(data_files=source.files)
    assert arrow[7]["label"].item() == 7


def test_grain_data_loader_and_map_dataset(table):
    source = HFEagerSource(data=table, include_keys=["ids", "label"])
    loader = grain.DataLoader(
        data_source=source,
        sampler=grain.samplers.IndexSampler(
            num_records=len(source),
            shuffle=True,
            seed=1,
            num_epochs=1,
            shard_options=grain.sharding.NoSharding(),
        ),
        operations=[grain.transforms.Batch(5)],
        worker_count=0,
    )
    labels = np.concatenate([b["label"] for b in loader])
    assert sorted(labels.tolist()) == list(range(20)) and labels.tolist() != list(range(20))
    ds = grain.MapDataset.source(source).shuffle(seed=2).batch(4)
    assert ds[0]["ids"].shape == (4, 3)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"data": {"a": []}}, ValueError, "the dataset is empty"),
        ({"data": {"a": [1]}, "include_keys": ["b"]}, ValueError, r"missing columns \['b'\]"),
        ({"data": {"a": [1]}, "exclude_keys": ["a"]}, ValueError, "no column left"),
        ({"data_files": "/nonexistent/x.parquet"}, FileNotFoundError, "not found"),
        ({"data_files": "/etc/hostname"}, ValueError, "must all be .parquet"),
        ({}, ValueError, "exactly one of"),
    ],
)
def test_bad_input_is_explained(kwargs, error, match):
    with pytest.raises(error, match=match):
        HFEagerSource(**kwargs)


@pytest.fixture
def parquet_files(tmp_path):
    paths = []
    for i in range(4):
        path = str(tmp_path / f"part{i}.parquet")
        pq.write_table(pa.table({"x": list(range(i * 25, i * 25 + 25)), "y": ["s"] * 25}), path)
        paths.append(path)
    return paths


def test_streaming_resumes_mid_epoch_exactly(parquet_files):
    from grain_rox._hf_source import HFStreamingSource

    source = HFStreamingSource(parquet_files, shuffle_buffer=16, seed=3, exclude_keys=["y"])
    ds = source.dataset(num_epochs=2)
    it = iter(ds)
    first = [int(next(it)["x"]) for _ in range(37)]
    state = it.get_state()
    rest = [int(r["x"]) for r in it]
    assert sorted(first + rest) == sorted(list(range(100)) * 2)
    assert (first + rest)[:100] != (first + rest)[100:]  # a new shuffle in epoch 2
    again = iter(ds)
    again.set_state(json.loads(json.dumps(state)))  # what a checkpoint file holds
    assert [int(r["x"]) for r in again] == rest
    assert set(next(iter(ds))) == {"x"}


def test_streaming_shards_per_host_are_disjoint_and_complete(parquet_files):
    from grain_rox._hf_source import HFStreamingSource

    parts = [
        [int(r["x"]) for r in HFStreamingSource(parquet_files, shard=(i, 2)).dataset()]
        for i in range(2)
    ]
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == list(range(100))
    with pytest.raises(FileNotFoundError, match="not found"):
        HFStreamingSource(["/nonexistent.parquet"])
