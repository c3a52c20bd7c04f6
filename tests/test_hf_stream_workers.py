"""HFStreamingSource conforms to Grain: a constant state shape (Grain's own checkpoint helper
holds), its worker-slicing hook, and real ``mp_prefetch`` workers equal to one process."""

from __future__ import annotations

import json

import grain
import pytest

pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from grain_rox import HFStreamingSource  # noqa: E402


@pytest.fixture
def files(tmp_path):
    """23 rows in three Parquet files (a row count no worker count divides), and a text column."""
    paths = []
    for i, n in enumerate((9, 6, 8)):
        path = str(tmp_path / f"part{i}.parquet")
        first = 100 * i
        table = {"x": list(range(first, first + n)), "t": [f"row {first + j}" for j in range(n)]}
        pq.write_table(pa.table(table), path)
        paths.append(path)
    return paths


def rows(ds) -> list[int]:
    return [int(r["x"]) for r in ds]


ALL = [*range(9), *range(100, 106), *range(200, 208)]


@pytest.mark.parametrize("shuffle_buffer", [0, 5])
@pytest.mark.parametrize("tokens", [False, True], ids=["columns", "tokenized"])
def test_grains_checkpoint_helper_holds_at_every_step(files, shuffle_buffer, tokens):
    kwargs = {"tokenize": ["t"], "tokenizer": "bytes"} if tokens else {}
    source = HFStreamingSource(files, shuffle_buffer=shuffle_buffer, seed=7, **kwargs)
    ds = source.dataset(num_epochs=2)
    # before: the state held the buffered rows and HF's dict, both changing shape
    grain.experimental.assert_equal_output_after_checkpoint(ds)
    served = rows(ds)
    assert sorted(served[:23]) == sorted(served[23:]) == ALL
    if shuffle_buffer:
        assert served[:23] != ALL and served[23:] != served[:23]  # reshuffled each epoch
        assert sorted(served[:5]) == ALL[:5] and sorted(served[20:23]) == ALL[20:]  # windows
    else:
        assert served == ALL + ALL
    if tokens:
        first = next(iter(ds))
        assert first["t"].tolist() == [*f"row {int(first['x'])}".encode(), 256]


def test_grains_checkpoint_helper_holds_with_rows_left_out(tmp_path):
    path = tmp_path / "n.jsonl"
    lines = [{"ids": None if i % 4 == 1 else [i, i + 1]} for i in range(13)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    ds = HFStreamingSource(str(path), nulls="skip", shuffle_buffer=3, seed=2).dataset(num_epochs=2)
    grain.experimental.assert_equal_output_after_checkpoint(ds)
    served = [int(r["ids"][0]) for r in ds]
    kept = [i for i in range(13) if i % 4 != 1]
    assert sorted(served[:10]) == sorted(served[10:]) == kept
    halves = []
    for start in (0, 1):  # every worker reads every row: a left-out row shifts all the same
        half = HFStreamingSource(str(path), nulls="skip", shuffle_buffer=3, seed=2)
        half_ds = half.dataset(num_epochs=2)
        half_ds.set_slice(slice(start, None, 2))
        halves.append([int(r["ids"][0]) for r in half_ds])
    assert [halves[g % 2][g // 2] for g in range(20)] == served
    # nulls="error": the worker whose row it is stops, naming the row (rows 1, 5, 9: odd)
    strict = [HFStreamingSource(str(path), include_keys=["ids"]).dataset() for _ in range(2)]
    for start, one in enumerate(strict):
        one.set_slice(slice(start, None, 2))
    assert [int(r["ids"][0]) for r in strict[0]] == [0, 2, 4, 6, 8, 10, 12]
    with pytest.raises(ValueError, match=r"column 'ids' has a missing value \(None\) in row 1 "):
        next(iter(strict[1]))


def sliced(files, start: int, step: int, **kwargs):
    ds = HFStreamingSource(files, **kwargs).dataset(num_epochs=3)
    ds.set_slice(slice(start, None, step))
    return ds


@pytest.mark.parametrize("workers", [2, 3])
def test_worker_slices_interleaved_in_turn_are_the_one_process_stream(files, workers):
    kwargs = {"shuffle_buffer": 4, "seed": 1}
    expected = rows(HFStreamingSource(files, **kwargs).dataset(num_epochs=3))
    parts = [rows(sliced(files, i, workers, **kwargs)) for i in range(workers)]
    # Grain's mp_prefetch takes one element of each worker in turn
    assert [parts[g % workers][g // workers] for g in range(69)] == expected
    assert sum(map(len, parts)) == 69
    one = sliced(files, 1, workers, **kwargs)
    grain.experimental.assert_equal_output_after_checkpoint(one)
    assert iter(one).get_state()["identity"]["worker_slice"] == [1, workers]
    nested = sliced(files, 1, 2, **kwargs)
    nested.set_slice(slice(1, None, 2))  # rows 3, 7, ...: slices of slices compose
    assert rows(nested) == expected[3::4]
    # a host's shard (HF's split_dataset_by_node, by rows for 3 files on 2 hosts) too
    host = HFStreamingSource(files, shard=(1, 2), **kwargs).dataset(num_epochs=2)
    grain.experimental.assert_equal_output_after_checkpoint(host)
    assert sorted(rows(host)) == sorted(ALL[1::2] * 2)


def test_slices_a_stream_cannot_take_are_refused(files):
    ds = HFStreamingSource(files).dataset()
    with pytest.raises(ValueError) as info:
        ds.set_slice(slice(0, None, 2), sequential_slice=True)
    assert str(info.value) == (
        "HFStreamingSource cannot take mp_prefetch(sequential_slice=True): a worker's contiguous "
        "part needs the stream's length, which a stream only knows once read; use "
        "mp_prefetch(sequential_slice=False) (the default: worker i serves rows i, "
        "i + num_workers, ..., in the same order as one process)"
    )
    for sl in (slice(0, 10, 2), slice(-1, None, 2), slice(0, None, -1)):
        with pytest.raises(ValueError) as info:
            ds.set_slice(sl)
        assert str(info.value) == (
            "HFStreamingSource streams can be sliced as slice(start, None, step) with start >= 0 "
            f"and step >= 1 (Grain's worker slices), not {sl!r}"
        )
    state = iter(sliced(files, 0, 2)).get_state()
    with pytest.raises(ValueError, match=r"worker_slice: saved \[0, 2\] -> now \[0, 1\]"):
        iter(HFStreamingSource(files).dataset(num_epochs=3)).set_state(state)


def workers(files, count: int):
    source = HFStreamingSource(files, shuffle_buffer=4, seed=1, tokenize=["t"], tokenizer="bytes")
    ds = source.dataset(num_epochs=2)
    return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=count)) if count else ds


def as_lists(record) -> dict:
    return {k: v.tolist() for k, v in record.items()}


@pytest.mark.slow
def test_two_grain_workers_serve_the_one_process_stream_and_restore_exactly(files):
    expected = [as_lists(r) for r in workers(files, 0)]
    it = iter(workers(files, 2))  # before: ValueError: Cannot slice `IterDataset` source
    head = [as_lists(next(it)) for _ in range(17)]
    state = json.loads(json.dumps(it.get_state()))
    tail = [as_lists(r) for r in it]
    it.close()
    assert head + tail == expected and len(expected) == 46
    again = iter(workers(files, 2))
    again.set_state(state)
    assert [as_lists(r) for r in again] == tail
    again.close()
