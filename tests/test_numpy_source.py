"""NumpySource: .npy files (loaderx's NPDataset layout) as a memory-mapped Grain source."""

from __future__ import annotations

import os
import pickle
import time

import grain
import numpy as np
import pytest

from grain_rox import NumpySource, pack_documents, testing


@pytest.fixture
def npy_pair(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 255, size=(100, 4, 5), dtype=np.uint8)
    labels = np.arange(100, dtype=np.int64) * 7
    np.save(tmp_path / "train_data.npy", data)
    np.save(tmp_path / "train_label.npy", labels)
    return str(tmp_path / "train_data.npy"), str(tmp_path / "train_label.npy"), data, labels


def test_rows_and_batches_are_the_files_rows(npy_pair):
    xp, yp, data, _ = npy_pair
    src = NumpySource({"x": xp, "y": yp})
    assert len(src) == 100
    rec = src[42]
    assert np.array_equal(rec["x"], data[42]) and int(rec["y"]) == 294
    batch = src.get_batch([3, 99, 0])
    assert np.array_equal(batch["x"], data[[3, 99, 0]]) and batch["y"].tolist() == [21, 693, 0]
    assert [int(r["y"]) for r in src._getitems([5, 6])] == [35, 42]
    single = NumpySource(xp)
    assert np.array_equal(single[7], data[7]) and np.array_equal(
        single.get_batch([1, 2]), data[1:3]
    )
    assert isinstance(single._array("").base, np.memmap)  # memory-mapped, not loaded
    with pytest.raises(IndexError, match=r"rows \[100\] are out of range for 100 rows"):
        src.get_batch([1, 100])


def test_indices_follow_python_and_grain_map_datasets(npy_pair):
    src = NumpySource(npy_pair[0])
    with pytest.raises(
        IndexError, match=r"^row 100 is out of range for 100 rows \(valid: -100 to 99\)$"
    ):
        src[100]
    with pytest.raises(IndexError, match=r"^row -101 is out of range"):
        src[-101]
    with pytest.raises(TypeError, match="row index True is a bool; pass an int"):
        src[True]


def test_records_of_an_in_memory_array_are_read_only():
    array = np.arange(12).reshape(4, 3)
    src = NumpySource(array)
    with pytest.raises(ValueError, match="read-only"):
        src[1][0] = 99  # would have changed the user's array and every later read
    assert array[1, 0] == 3 and src[1].tolist() == [3, 4, 5]
    assert src.get_batch([1, 2]).tolist() == [[3, 4, 5], [6, 7, 8]]


@pytest.mark.parametrize(
    "values",
    [np.arange(6, dtype=">i4"), np.array(["ab", "abc", "x"], dtype="<U3")],
    ids=["big-endian-int", "fixed-width-text"],
)
def test_a_record_has_the_files_dtype_as_a_batch_row_does(tmp_path, values):
    """A single record of a 1-D file was a NumPy scalar made into an array: ``>i4`` came back
    as the native ``int32``, a ``<U3`` row as short as its text (``<U2``)."""
    np.save(tmp_path / "v.npy", values)
    src = NumpySource(str(tmp_path / "v.npy"))
    row, batch, items = src[0], src.get_batch([0]), src._getitems([0])
    assert (row.dtype, batch.dtype, items[0].dtype) == (values.dtype,) * 3
    assert (row.shape, items[0].shape) == ((), ())  # a 0-d array, as before
    assert row.tolist() == batch[0].tolist() == items[0].tolist() == values[0].tolist()
    named = NumpySource({"v": str(tmp_path / "v.npy")})
    assert named[0]["v"].dtype == named._getitems([0])[0]["v"].dtype == values.dtype


def test_batches_need_a_seed(npy_pair):
    with pytest.raises(
        ValueError, match=r"^batches\(\): seed=None; the order is a function of the seed"
    ):
        NumpySource(npy_pair[0]).batches(10, seed=None)


def test_pickles_paths_not_data_and_has_a_content_repr(npy_pair):
    xp, yp, _, _ = npy_pair
    src = NumpySource({"x": xp, "y": yp})
    src.get_batch([0])  # opens the memory maps
    testing.check_pickle(src, max_bytes=1_000)
    assert "uint8[100, 4, 5]" in repr(src)
    np.save(yp, np.zeros(100, np.int64))
    assert repr(NumpySource({"x": xp, "y": yp})) != repr(src)


def test_batches_cover_epochs_reshuffle_shard_and_resume(npy_pair):
    xp, yp, _, labels = npy_pair
    src = NumpySource({"x": xp, "y": yp})
    ds = src.batches(10, seed=4, num_epochs=-1)
    epoch0 = np.concatenate([ds[i]["y"] for i in range(10)])
    epoch1 = np.concatenate([ds[i]["y"] for i in range(10, 20)])
    assert sorted(epoch0.tolist()) == sorted(epoch1.tolist()) == labels.tolist()
    assert not np.array_equal(epoch0, epoch1)
    halves = [src.batches(10, seed=4, num_epochs=-1, shard=(i, 2)) for i in range(2)]
    assert np.array_equal(np.concatenate([h[13]["y"] for h in halves]), ds[13]["y"])
    it = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0)))
    for _ in range(17):
        next(it)
    state = it.get_state()
    expected = [next(it)["y"].tolist() for _ in range(6)]
    again = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0)))
    again.set_state(state)
    assert [next(again)["y"].tolist() for _ in range(6)] == expected


def test_grain_data_loader_and_packing_of_token_rows(npy_pair, tmp_path):
    xp, yp, _, labels = npy_pair
    src = NumpySource({"x": xp, "y": yp})
    loader = grain.DataLoader(
        data_source=src,
        sampler=grain.samplers.IndexSampler(
            num_records=100,
            shuffle=True,
            seed=0,
            num_epochs=1,
            shard_options=grain.sharding.NoSharding(),
        ),
        operations=[grain.transforms.Batch(25)],
        worker_count=0,
    )
    served = np.concatenate([b["y"] for b in loader])
    assert sorted(served.tolist()) == labels.tolist()
    tokens = np.arange(1, 61, dtype=np.int32).reshape(6, 10)
    np.save(tmp_path / "tokens.npy", tokens)
    packed = list(
        pack_documents(
            NumpySource(str(tmp_path / "tokens.npy")),
            seq_len=20,
            batch_size=1,
            num_epochs=1,
            shuffle=False,
        )
    )
    first = packed[0]
    assert first["inputs"][0, :9].tolist() == list(range(1, 10))
    assert first["targets"][0, :9].tolist() == list(range(2, 11))


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda d: {"x": d / "nope.npy", "y": d / "gone.npy"}, FileNotFoundError,
         r"do not exist: \['.*nope.npy', '.*gone.npy'\]"),
        (lambda d: {"x": d / "a.npy", "y": d / "b.npy"}, ValueError,
         r"disagree on their number of rows: \{'.*a.npy': 100, '.*b.npy': 99\}"),
        (lambda d: d / "trunc.npy", ValueError, r"trunc.npy: truncated: the header promises"),
        (lambda d: d / "text.npy", ValueError, r"text.npy: not a readable .npy file"),
        (lambda d: d / "obj.npy", ValueError, "holds Python objects"),
        (lambda d: np.float32(3), ValueError, "0-d array"),
        (lambda d: {}, ValueError, "at least one array"),
    ],
)  # fmt: skip
def test_bad_files_are_explained(tmp_path, make, error, match):
    np.save(tmp_path / "a.npy", np.zeros(100))
    np.save(tmp_path / "b.npy", np.zeros(99))
    np.save(tmp_path / "trunc.npy", np.zeros((50, 8)))
    with open(tmp_path / "trunc.npy", "r+b") as f:
        f.truncate(300)
    (tmp_path / "text.npy").write_text("hello")
    np.save(tmp_path / "obj.npy", np.array([{}, []], dtype=object), allow_pickle=True)
    spec = make(tmp_path)
    if not isinstance(spec, dict | np.generic):
        spec = str(spec)
    elif isinstance(spec, np.generic):
        spec = np.asarray(spec)
    with pytest.raises(error, match=match):
        NumpySource(spec)


def test_batches_become_global_jax_arrays_and_resume_through_the_iterator(npy_pair):
    import jax

    from grain_rox import MultiHostDataLoadIterator

    xp, yp, _, _ = npy_pair
    src = NumpySource({"x": xp, "y": yp})

    def batches():
        ds = src.batches(
            16, seed=1, num_epochs=-1, shard=(jax.process_index(), jax.process_count())
        )
        return ds.to_iter_dataset(grain.ReadOptions(num_threads=0))

    expected = src.batches(16, seed=1, num_epochs=-1)
    with MultiHostDataLoadIterator(batches()) as it:
        for k in range(3):
            batch = next(it)
            assert isinstance(batch["x"], jax.Array) and batch["x"].shape == (16, 4, 5)
            assert len(batch["x"].sharding.device_set) == jax.device_count()
            assert np.array_equal(np.asarray(batch["y"]), expected[k]["y"])
        state = it.get_state()
        following = [np.asarray(next(it)["y"]) for _ in range(7)]  # crosses into epoch 2
    with MultiHostDataLoadIterator(batches()) as again:
        again.set_state(state)
        assert all(np.array_equal(np.asarray(next(again)["y"]), f) for f in following)
    assert np.array_equal(following[-1], expected[9]["y"])


def test_a_memory_mapped_npy_array_is_served_by_its_path(npy_pair):
    xp, _, data, _ = npy_pair
    src = NumpySource(np.load(xp, mmap_mode="r"))
    assert src.paths == {"": xp}
    testing.check_pickle(src, max_bytes=1_000)
    part = NumpySource(np.load(xp, mmap_mode="r")[10:20])  # a slice: served as an array
    assert part.paths == {} and np.array_equal(part[0], data[10])


def test_a_view_or_copy_on_write_map_of_an_npy_is_served_as_it_reads(tmp_path):
    """Views of a mapped file with its shape (reversed, transposed) and a copy-on-write map
    edited in memory serve their own rows, not the file's as stored."""
    path = str(tmp_path / "square.npy")
    np.save(path, np.arange(9).reshape(3, 3))
    mapped = np.load(path, mmap_mode="r")
    for view in (mapped[::-1], mapped.T, mapped[:, ::-1]):
        src = NumpySource(view)
        assert src.paths == {}
        assert [src[i].tolist() for i in range(3)] == view.tolist()
    edited = np.load(path, mmap_mode="c")
    edited[0, 0] = 99
    src = NumpySource(edited)
    assert src.paths == {} and src[0].tolist() == [99, 1, 2]
    assert NumpySource(np.load(path, mmap_mode="r+")).paths == {"": path}


def test_identity_is_content_a_copy_restores_a_same_size_edit_does_not(npy_pair, tmp_path):
    import shutil

    xp, yp, _, _ = npy_pair
    src = NumpySource({"x": xp, "y": yp})
    (tmp_path / "copy").mkdir()
    copies = {
        k: shutil.copy(p, tmp_path / "copy" / f"renamed_{k}.npy") for k, p in [("x", xp), ("y", yp)]
    }
    assert repr(NumpySource({k: str(p) for k, p in copies.items()})) == repr(src)
    os.utime(xp, ns=(1, 1))  # another mtime, same bytes: the same data
    assert repr(NumpySource({"x": xp, "y": yp})) == repr(src)
    labels = np.load(yp)
    labels[50] += 1  # the same size, one value changed
    np.save(yp, labels)
    assert repr(NumpySource({"x": xp, "y": yp})) != repr(src)


def test_an_edit_in_place_that_puts_the_mtime_back_is_refused(npy_pair):
    """Size, inode and mtime kept (``rsync -t --inplace``, ``os.utime``): the open source served
    the new bytes and a new source got the old fingerprint, so an old state restored onto them.
    The ctime, which no user can set, gives the edit away."""
    xp, yp, data, _ = npy_pair
    old = os.stat(xp).st_mtime_ns - 10**10  # well past the 2 s "racy" window
    os.utime(xp, ns=(old, old))
    src = NumpySource({"x": xp, "y": yp})
    before = repr(src)
    assert np.array_equal(src.get_batch([1])["x"], data[1:2])
    edited = data.copy()
    edited[1] += 1
    with open(xp, "r+b") as f:  # the same size, one row changed
        f.seek(os.path.getsize(xp) - edited.nbytes)
        f.write(edited.tobytes())
    os.utime(xp, ns=(old, old))
    time.sleep(0.11)  # past the open source's recheck interval
    with pytest.raises(ValueError, match=r"train_data.npy changed after this NumpySource was made"):
        src.get_batch([1])
    assert repr(NumpySource({"x": xp, "y": yp})) != before


def test_a_file_replaced_after_opening_is_refused_when_reopened(npy_pair):
    xp, yp, data, _ = npy_pair
    src = NumpySource({"x": xp, "y": yp})
    worker = pickle.loads(pickle.dumps(src))  # a Grain worker reopens by path
    os.utime(xp, ns=(5, 5))  # touched, not changed: still served
    assert np.array_equal(worker[3]["x"], data[3])
    np.save(yp, np.arange(100, dtype=np.int64) + 1)  # rewritten in place: new values
    with pytest.raises(ValueError, match=r"train_label.npy changed after"):
        worker.get_batch([0])  # its map shows the new bytes: refused at the next batch
    time.sleep(0.11)
    with pytest.raises(
        ValueError,
        match=r"train_label.npy changed after this NumpySource was made \(928 -> 928 bytes, new content\).*Restore the original file",
    ):
        worker[0]
    with pytest.raises(ValueError, match=r"train_label.npy changed after"):
        pickle.loads(pickle.dumps(src)).get_batch([0])


def test_a_shrunk_or_removed_file_is_refused_when_reopened(npy_pair):
    xp, yp, _, _ = npy_pair
    src = NumpySource({"x": xp, "y": yp})
    np.save(yp, np.arange(50, dtype=np.int64))  # fewer rows: numpy's raw IndexError before
    with pytest.raises(
        ValueError,
        match=r"train_label.npy changed after this NumpySource was made \(928 -> 528 bytes",
    ):
        src[80]
    os.remove(xp)
    with pytest.raises(
        FileNotFoundError, match=r"train_data.npy: cannot be reopened \(No such file"
    ):
        pickle.loads(pickle.dumps(src))[1]


def test_an_invalid_npy_header_names_the_file(tmp_path):
    path = tmp_path / "neg.npy"
    np.save(path, np.zeros(5))
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b"'shape': (5,), ", b"'shape': (-5,),"))
    with pytest.raises(
        ValueError,
        match=r"neg.npy: the .npy header gives the invalid shape \(-5,\) \(a negative size\)",
    ):
        NumpySource(str(path))


def test_large_files_are_identified_by_evenly_spaced_samples(tmp_path):
    import hashlib

    from grain_rox._format._digest import BLOCK, content_digest

    path = tmp_path / "big.bin"
    data = bytearray(np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8))
    path.write_bytes(bytes(data))

    def digest(share):
        with open(path, "rb") as f:
            return content_digest(f, str(path), share=share)

    whole = digest(1)
    assert whole == hashlib.sha1(data).hexdigest()  # small enough: hashed whole
    sampled = digest(1 << 20)  # a budget of 2 blocks per file: its first and last
    assert sampled != whole
    data[BLOCK + 5] ^= 1  # between the samples: the documented blind spot of sampling
    path.write_bytes(bytes(data))
    assert digest(1 << 20) == sampled and digest(1) != whole
    data[-1] ^= 1  # inside the last sample
    path.write_bytes(bytes(data))
    assert digest(1 << 20) != sampled


def test_batches_read_through_a_subclass_get_batch():
    class Doubled(NumpySource):
        def get_batch(self, indices):
            return super().get_batch(indices) * 2

    rows = Doubled(np.arange(10)).batches(5, shuffle=False)
    assert rows[0].tolist() == [0, 2, 4, 6, 8]  # the override, not the plain rows
    assert NumpySource(np.arange(10)).batches(5, shuffle=False)[1].tolist() == [5, 6, 7, 8, 9]


def test_a_recent_file_is_hashed_at_most_every_half_second_and_once_after(tmp_path, monkeypatch):
    """A file written in the last 2 s has a stat that cannot vouch for it (a rewrite within
    the file system's timestamp tick keeps it), so checks hash it; every 0.1 s check hashed it
    whole (an HF source's Arrow copy, written just before: 1.4 s of 3 s stalled)."""
    from grain_rox._format import _digest
    from grain_rox._sources import _watched_files

    path = tmp_path / "rows.bin"
    path.write_bytes(b"x" * 1000)
    files = _watched_files.WatchedFiles({0: str(path)}, what="Demo")
    hashes = []
    real = _digest.content_digest
    monkeypatch.setattr(
        _digest, "content_digest", lambda *a, **k: hashes.append(1) or real(*a, **k)
    )
    for _ in range(10):
        files.recheck(0)
    assert hashes == []  # hashed when the source was made, under 0.5 s ago
    monkeypatch.setattr(_watched_files, "RECENT_RECHECK_S", 0.0)
    files.recheck(0)
    assert len(hashes) == 1
    for module in (_digest, _watched_files):  # the 2 s have passed
        monkeypatch.setattr(module, "racy", lambda stat: False)
    for _ in range(3):
        files.recheck(0)
    assert len(hashes) == 2  # once after the window; from then on the stat vouches
    path.write_bytes(b"y" * 1000)
    with pytest.raises(ValueError, match=r"rows.bin changed after this Demo was made"):
        files.recheck(0)


def test_the_rows_an_epoch_leaves_out_are_logged(caplog, monkeypatch):
    """Every batch is whole, so an epoch leaves out len % batch_size rows: in order the same
    ones every epoch (never served: a warning), shuffled other ones each epoch (a warning
    over 1% of the rows, else info); once a process for each configuration."""
    import logging

    from grain_rox._format import _log_once

    monkeypatch.setattr(_log_once, "_said", set())  # nothing said yet in this process
    counts = np.zeros(10, int)
    with caplog.at_level(logging.INFO, logger="grain_rox"):
        for batch in NumpySource(np.arange(10)).batches(4, num_epochs=3, shuffle=False):
            np.add.at(counts, batch, 1)  # a bare array source: each batch its rows
        NumpySource(np.arange(10)).batches(4, num_epochs=3, shuffle=False)  # said once
        NumpySource(np.arange(10)).batches(4, num_epochs=3)
        NumpySource(np.arange(1000)).batches(7)
        NumpySource(np.arange(12)).batches(4)  # nothing left out
    assert counts.tolist() == [3] * 8 + [0, 0]
    said = [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if "batches(batch_size=" in r.getMessage()
    ]
    assert len(said) == 3, said
    assert said[0][0] == "WARNING" and "the last 2 rows (of 10) are never served" in said[0][1]
    assert said[1][0] == "WARNING" and "2 of its 10 rows, other ones each epoch" in said[1][1]
    assert (
        said[2][0] == "INFO"
        and "6 of its 1000 rows" in said[2][1]
        and "(0.6% of an epoch)" in said[2][1]
    )
    assert all("pass a batch_size that divides" in m for _, m in said)


def test_a_subclass_batch_of_other_features_gives_its_rows_as_they_are(tmp_path):
    """A subclass's get_batch may add a feature that is no array (a list of names)."""

    class Named(NumpySource):
        def get_batch(self, indices):
            return {**super().get_batch(indices), "name": [f"row{i}" for i in indices]}

    src = Named({"x": np.arange(8, dtype=np.int32).reshape(4, 2)})
    rows = src.__getitems__([0, 3])
    assert [r["name"] for r in rows] == ["row0", "row3"]
    assert [r["x"].tolist() for r in rows] == [[0, 1], [6, 7]]
