"""RoxTokenSource and RoxBlockSource as plain Grain sources: DataLoader, MapDataset, Batch.
(The index, pickle and read-only protocols: every source, in test_conformance.py.)"""

from __future__ import annotations

import collections

import grain
import numpy as np
import pytest

from grain_rox import RoxBlockSource, RoxTokenSource


@pytest.fixture(scope="module")
def docs_path(make_rox):
    docs = [np.arange(1, n + 1, dtype=np.uint16) * 10 + i for i, n in enumerate([3, 7, 2, 9] * 50)]
    return make_rox("s", docs, separator=0, block_size=128, max_shard_bytes=1000)


def test_windows_are_next_token_pairs_over_all_shards(docs_path):
    source = RoxTokenSource(docs_path, seq_len=8)
    padding = source.corpus.trailing_padding()[-1][0]  # the write's last block's padding
    stream = source.corpus.tokens(0, source.corpus.num_tokens - padding)
    assert len(source.paths) > 1 and padding > 0 and source.padding_left_out == padding
    assert stream[-1] == 0 and stream[-2] != 0  # served through the last document's EOS
    assert len(source) == (stream.size - 1) // 8
    for i in [0, 1, len(source) // 2, len(source) - 1]:
        rec = source[i]
        np.testing.assert_array_equal(rec["inputs"], stream[i * 8 : i * 8 + 8])
        np.testing.assert_array_equal(rec["targets"], stream[i * 8 + 1 : i * 8 + 9])
        assert rec["inputs"].dtype == np.int32


def test_segmentation_comes_from_the_manifest_eos(docs_path):
    rec = RoxTokenSource(docs_path, seq_len=12)[0]
    # stream: 10 20 30 0 | 11 21 31 41 51 61 71 0 | 12 ...
    assert rec["inputs"].tolist() == [10, 20, 30, 0, 11, 21, 31, 41, 51, 61, 71, 0]
    assert rec["inputs_segmentation"].tolist() == [1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2]
    assert rec["inputs_position"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7]
    plain = RoxTokenSource(docs_path, seq_len=12, eos_id=None)
    assert "inputs_segmentation" in plain[0]  # the manifest's EOS is used by default


@pytest.mark.parametrize("worker_count", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_data_loader_shuffle_and_batch(docs_path, worker_count):
    source = RoxTokenSource(docs_path, seq_len=8)
    sampler = grain.samplers.IndexSampler(
        num_records=len(source),
        shuffle=True,
        seed=3,
        num_epochs=1,
        shard_options=grain.sharding.NoSharding(),
    )
    loader = grain.DataLoader(
        data_source=source,
        sampler=sampler,
        worker_count=worker_count,
        operations=[grain.transforms.Batch(4, drop_remainder=True)],
    )
    batches = list(loader)
    n = len(source)  # each worker batches its own share of the records (k % workers)
    shares = (
        [n] if worker_count == 0 else [-(-(n - w) // worker_count) for w in range(worker_count)]
    )
    assert len(batches) == sum(share // 4 for share in shares)
    assert all(b["inputs"].shape == (4, 8) for b in batches)
    served = collections.Counter(tuple(row) for b in batches for row in b["inputs"].tolist())
    available = collections.Counter(tuple(source[i]["inputs"].tolist()) for i in range(len(source)))
    # Every record is served at most once, and all but the dropped remainder are served
    # (Grain decides how records are grouped into batches).
    assert sum(served.values()) == len(batches) * 4
    assert all(available[row] >= n for row, n in served.items())
    assert sum((available - served).values()) == n - 4 * len(batches)
    # The same seed gives the same batches.
    again = [b["inputs"] for b in loader]
    assert all(np.array_equal(a["inputs"], b) for a, b in zip(batches, again, strict=True))


def test_map_dataset_and_repr(docs_path):
    source = RoxTokenSource(docs_path, seq_len=8)
    ds = grain.MapDataset.source(source).shuffle(seed=1).batch(3)
    first = ds[0]
    assert first["inputs"].shape == (3, 8)
    assert "0x" not in repr(source)


def test_block_source(docs_path):
    blocks = RoxBlockSource(docs_path)
    assert len(blocks) == len(blocks.corpus)
    assert blocks[0].dtype == np.uint16 and blocks[0].size == 64
    np.testing.assert_array_equal(blocks[1], blocks.corpus.tokens(64, 128))
    ds = grain.MapDataset.source(blocks).batch(2)
    assert ds[0].shape == (2, 64)


def test_records_do_not_alias_writably(docs_path):
    """inputs and targets share one window: they are read-only (like TokenPipeline batches),
    so a user's map that edits inputs in place cannot change targets; a copying map works."""
    from grain_rox import RoxDocumentSource

    for source in (RoxTokenSource(docs_path, seq_len=8), RoxDocumentSource(docs_path, seq_len=8)):
        record = source[3]
        targets = record["targets"].copy()
        for key in ("inputs", "targets"):
            assert not record[key].flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                record[key][0] = 12345
        np.testing.assert_array_equal(source[3]["targets"], targets)

        def zero_first(r):
            inputs = r["inputs"].copy()
            inputs[0] = 0
            return {**r, "inputs": inputs}

        mapped = grain.MapDataset.source(source).map(zero_first)[3]
        assert mapped["inputs"][0] == 0
        np.testing.assert_array_equal(mapped["targets"], targets)


def test_segmentation_features_do_not_alias_writably(docs_path):
    """targets_position is inputs_position (and, without chunk joins, targets_segmentation is
    inputs_segmentation): the features are read-only, in records and in pipeline batches."""
    from grain_rox import TokenPipeline

    pipe = TokenPipeline(docs_path, seq_len=8, global_batch_size=2, num_epochs=1)
    for record in (RoxTokenSource(docs_path, seq_len=8)[3], pipe.map_dataset()[0]):
        for key in ("inputs_segmentation", "inputs_position", "targets_segmentation"):
            with pytest.raises(ValueError, match="read-only"):
                record[key][0] = 12345  # before: changed the targets_* feature too


# ---- the padding a write ends with is not served (as TokenPipeline reads it) ----------------
def test_windows_skip_the_padding_an_earlier_write_left_between_shards(tmp_path):
    """An append to a sharded set leaves the earlier write's last block padding mid-stream,
    between two shards: windows read across it as if it were not there, and the repr names
    it (a DataLoader state from before is refused); a set without padding keeps its repr."""
    from grain_rox import write_rox

    base = str(tmp_path / "a.rox")
    first = [np.arange(1, 11, dtype=np.uint16), np.arange(11, 16, dtype=np.uint16)]
    second = [np.arange(100, 120, dtype=np.uint16)]
    write_rox(first, base, separator=0, block_size=16, max_shard_bytes=32)
    write_rox(second, base, separator=0, block_size=16, max_shard_bytes=32, if_exists="append")
    source = RoxTokenSource(base, seq_len=5)
    want = np.concatenate([np.r_[d, 0] for d in first + second])  # the text, no padding
    assert source.padding_left_out == source.corpus.num_tokens - want.size > 0
    got = [
        [*source[i]["inputs"].tolist(), int(source[i]["targets"][-1])] for i in range(len(source))
    ]
    assert len(source) == (want.size - 1) // 5
    assert got == [want[i * 5 : i * 5 + 6].tolist() for i in range(len(source))]
    assert f"padding_left_out={source.padding_left_out})" in repr(source)
    exact = str(tmp_path / "exact.rox")
    write_rox([np.arange(1, 16, dtype=np.uint16)], exact, separator=0, block_size=32)
    assert "padding_left_out" not in repr(RoxTokenSource(exact, seq_len=4))  # 15 + EOS = 32 B


def test_documents_end_at_each_eos_and_at_the_end_of_each_write(tmp_path, caplog):
    """The text after a write's last EOS is a document of its own where the manifest says
    where the data ends; in a shard without a manifest (roxxel's), whose end may be a pad
    id, it is not served, and a warning names it."""
    from grain_rox import RoxDocumentSource, write_rox

    path = str(tmp_path / "t.rox")
    write_rox([np.array([5, 6, 7, 0, 8, 9, 10, 11], np.uint16)], path, block_size=32)
    docs = RoxDocumentSource(path, seq_len=16, eos_id=0)
    pieces = [[*docs[i]["inputs"].tolist(), int(docs[i]["targets"][-1])] for i in range(len(docs))]
    assert pieces == [[5, 6, 7, 0], [8, 9, 10, 11]]
    assert "unterminated_documents=1" in repr(docs)
    ended = str(tmp_path / "e.rox")
    write_rox([np.array([5, 6, 7], np.uint16)], ended, separator=0, block_size=32)
    assert repr(RoxDocumentSource(ended, seq_len=16)).endswith("dtype=int32)")  # as before
    bare = tmp_path / "bare.rox"  # as roxxel writes it: no manifest to record the padding
    write_rox([np.array([5, 6, 7, 9, 8, 3], np.uint16)], str(bare), block_size=16)
    (tmp_path / "bare.manifest.json").unlink()
    with caplog.at_level("WARNING", logger="grain_rox"):
        docs = RoxDocumentSource(str(bare), seq_len=16, eos_id=9)  # [8, 3, 0, 0] after it
        assert [docs[i]["inputs"].tolist() for i in range(len(docs))] == [[5, 6, 7]]
    assert "the last 4 tokens (from corpus offset 4) follow the last EOS 9 with no" in caplog.text
