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
    stream = np.concatenate([source.corpus.tokens(0, source.corpus.num_tokens)])
    assert len(source.paths) > 1
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
    assert len(batches) == len(source) // 4
    assert all(b["inputs"].shape == (4, 8) for b in batches)
    served = collections.Counter(tuple(row) for b in batches for row in b["inputs"].tolist())
    available = collections.Counter(tuple(source[i]["inputs"].tolist()) for i in range(len(source)))
    # Every record is served at most once, and all but the dropped remainder are served
    # (Grain decides how records are grouped into batches).
    assert sum(served.values()) == len(batches) * 4
    assert all(available[row] >= n for row, n in served.items())
    assert sum((available - served).values()) == len(source) % 4
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
