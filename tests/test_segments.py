"""segment_features against a token-by-token reference, on random windows, joins and padding.

The fast implementation works from the sparse segment starts; this reference walks each row
the way the module doc defines the features, so any disagreement is a bug in the fast one.
"""

from __future__ import annotations

import numpy as np
import pytest

from grain_rox._sources import _segments
from grain_rox._sources._segments import (
    SEGMENT_FEATURES,
    STACKED_SEGMENT_FEATURES,
    batch_arrays,
    segment_features,
    windows_record,
)


def reference(windows, eos_id, joins, content):
    n, width = windows.shape
    seq_len = width - 1
    seg = np.zeros((n, seq_len), np.int32)
    pos = np.zeros((n, seq_len), np.int32)
    tseg = np.zeros((n, seq_len), np.int32)
    for r in range(n):
        number, position = 0, 0
        for t in range(seq_len):
            joined = joins is not None and t >= 1 and joins[r, t]
            if t == 0 or windows[r, t - 1] == eos_id or joined:
                number, position = number + 1, 0
            seg[r, t], pos[r, t] = number, position
            position += 1
            across = joins is not None and joins[r, t + 1]
            tseg[r, t] = 0 if across else number
        if content is not None and content[r] <= seq_len:
            c = int(content[r])
            seg[r, c:] = pos[r, c:] = 0
            tseg[r, max(c - 1, 0) :] = 0
    return {
        "inputs_segmentation": seg,
        "inputs_position": pos,
        "targets_segmentation": tseg,
        "targets_position": pos,
    }


def _sparse(joins):
    """A boolean joins mask as the readers hand joins over: (rows, columns), by row."""
    return None if joins is None else np.nonzero(joins)


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.uint32, np.int64])
@pytest.mark.parametrize("into", [None, "planes", "stacked"])
@pytest.mark.parametrize("block", [None, 1])  # None: the default blocks; 1: a block per row
@pytest.mark.parametrize("eos", [1, 0])  # 0: also the padding token of packed rows
@pytest.mark.parametrize("few", [None, -1, 10**9])  # the starts one by one: default, never, always
def test_features_equal_the_reference_on_random_windows(dtype, into, block, eos, few, monkeypatch):
    if block is not None:
        monkeypatch.setattr(_segments, "_BLOCK_ELEMENTS", block)
    if few is not None:
        monkeypatch.setattr(_segments, "_FEW_STARTS", few)
    rng = np.random.default_rng(int(np.dtype(dtype).itemsize))
    for _ in range(150):
        n, seq_len = int(rng.integers(1, 6)), int(rng.integers(1, 30))
        # 0-3 ids: EOS from never to often, runs of EOS, EOS in the first and last columns
        windows = rng.integers(0, int(rng.choice([2, 4, 50])), (n, seq_len + 1)).astype(dtype)
        joins = (
            rng.random((n, seq_len + 1)) < rng.choice([0.0, 0.05, 0.3])
            if rng.random() < 0.6
            else None
        )
        content = rng.integers(0, seq_len + 2, n) if rng.random() < 0.3 else None
        if content is not None and rng.random() < 0.5:  # padded with 0, as the reader pads
            windows[np.arange(seq_len + 1) >= content[:, None]] = 0
        out = segments = None
        if into is not None:
            w, out, segments = batch_arrays(
                n, seq_len, np.dtype(dtype), features=True, stacked=into == "stacked"
            )
            w[...] = windows
            windows = w
        got = segment_features(windows, eos, _sparse(joins), content, out=out)
        want = reference(windows, eos, joins, content)
        for key in SEGMENT_FEATURES:
            assert got[key].dtype == np.int32 and got[key].shape == (n, seq_len), key
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"{key}\n{windows}\n{joins}")
            assert not got[key].flags.writeable
        if into == "stacked":  # the record's segments are the features, written in place
            record = windows_record(windows, got, segments)
            for row, key in enumerate(STACKED_SEGMENT_FEATURES):
                np.testing.assert_array_equal(record["segments"][:, row], want[key])


def test_a_large_batch_is_built_a_block_of_rows_at_a_time():
    rng = np.random.default_rng(3)
    windows = rng.integers(0, 300, (40, 2049)).astype(np.uint16)  # EOS (id 1) every ~300
    joins = rng.random(windows.shape) < 0.001
    assert _segments._BLOCK_ELEMENTS // 2049 < 40  # several blocks
    got = segment_features(windows, 1, _sparse(joins))
    want = reference(windows, 1, joins, None)
    for key in SEGMENT_FEATURES:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_a_join_right_after_an_eos_starts_one_segment():
    windows = np.array([[5, 1, 6, 7, 8]])  # EOS at column 1: column 2 starts a segment
    joins = np.zeros(windows.shape, bool)
    joins[0, 2] = True  # and a chunk join there too: still one new segment, not two
    f = segment_features(windows, 1, _sparse(joins))
    assert f["inputs_segmentation"].tolist() == [[1, 1, 2, 2]]
    assert f["inputs_position"].tolist() == [[0, 1, 0, 1]]
    assert f["targets_segmentation"].tolist() == [[1, 0, 2, 2]]  # target 1 lies across the join
