"""MaxText records of token windows: the feature names, segment features from EOS, two layouts.

A window is ``seq_len + 1`` consecutive tokens; its MaxText record is ``inputs`` (the first
``seq_len``) and ``targets`` (the last ``seq_len``, shifted by one) and, when an EOS id is
known, four packing features computed from the tokens themselves (no document index): a new
segment starts after every EOS and at every chunk join (where an epoch stream joins two
unrelated chunks); ``*_position`` counts from 0 inside a segment; ``targets_segmentation`` is
0 where the target token lies across a chunk join (unrelated text: no loss there).

A batch is laid out one of two ways: six MaxText arrays (:func:`maxtext_record`), or
``{"windows": (B, seq_len + 1), "segments": (B, 3, seq_len)}`` (:func:`windows_record`), fewer
and larger transfers to the devices, which :func:`unpack_windows` turns back into the six
arrays inside a jit.

>>> MAXTEXT_FEATURES[:2], SEGMENT_FEATURES[0]
(('inputs', 'targets'), 'inputs_segmentation')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

# The feature names of a MaxText batch, spelled once for the whole package: the tokens, the
# next tokens, then the packing features (segment numbers, 0 = padding, and the positions
# inside each segment).
MAXTEXT_FEATURES = (
    "inputs",
    "targets",
    "inputs_segmentation",
    "inputs_position",
    "targets_segmentation",
    "targets_position",
)
(
    INPUTS,
    TARGETS,
    INPUTS_SEGMENTATION,
    INPUTS_POSITION,
    TARGETS_SEGMENTATION,
    TARGETS_POSITION,
) = MAXTEXT_FEATURES
SEGMENT_FEATURES = MAXTEXT_FEATURES[2:]
# The rows of a ``layout="windows"`` batch's ``"segments"`` array, in order
# (``targets_position`` is ``inputs_position``, so it is not sent twice).
STACKED_SEGMENT_FEATURES = (INPUTS_SEGMENTATION, INPUTS_POSITION, TARGETS_SEGMENTATION)
# Tokens a block of rows holds when segment features are built a block at a time.
_BLOCK_ELEMENTS = 1 << 16
# Up to this many segment starts inside rows (besides each row's first), each is written as
# two row-suffix slices; more are expanded in one vectorised pass. A (32, 1024) batch of
# random text with an EOS every ~50k tokens has one start in every other batch: the features
# took ~40 us with the vectorised pass, ~3 us a start with slices.
_FEW_STARTS = 8
# Where segment_features writes: (inputs_segmentation, inputs_position, targets_segmentation).
FeatureArrays = tuple[np.ndarray, np.ndarray, np.ndarray]
# Where windows cross a chunk join: (rows, columns), each (J,) int64, sorted by row then
# column; column c >= 1 starts new text. Sparse: a (256, 2049) boolean mask cost ~80 us a
# batch to allocate and scan, for a handful of joins.
Joins = tuple[np.ndarray, np.ndarray]


def segment_features(
    windows: np.ndarray,
    eos_id: int,
    joins: Joins | None,
    content: np.ndarray | None = None,
    *,
    out: FeatureArrays | None = None,
) -> dict[str, np.ndarray]:
    """MaxText packing features for (n, seq_len + 1) windows (see the module doc), as
    read-only arrays: ``targets_position`` is ``inputs_position``, and without chunk joins
    ``targets_segmentation`` is ``inputs_segmentation``. With ``content`` (packed rows: the
    tokens of each row, padding after them) the padding has segment 0 and position 0, and so
    does every target that is padding. ``joins``: where windows cross a chunk join, as
    ``(rows, columns)`` (column ``c >= 1`` starts new text). ``out`` (:func:`batch_arrays`)
    receives the features; its targets array only when they differ from the inputs'.

    >>> w = np.array([[5, 6, 0, 7, 8, 0, 9]])
    >>> f = segment_features(w, eos_id=0, joins=None)
    >>> f["inputs_segmentation"].tolist(), f["inputs_position"].tolist()
    ([[1, 1, 1, 2, 2, 2]], [[0, 1, 2, 0, 1, 2]])
    """
    n, width = windows.shape
    seq_len = width - 1
    total = n * seq_len
    # Segment starts as flat indices into (n, seq_len): each row's first token, each token
    # after an EOS (an EOS at window column c < seq_len - 1 starts one at c + 1) and each chunk
    # join (at window column 1 <= c < seq_len). They are few, so they are found sparsely and
    # the features expanded from them (measured 15 us for a (32, 1024) batch with no EOS,
    # 35 us with one every 500 tokens; a dense scan per row cost 50-60 us).
    # Large batches are scanned and expanded a block of rows at a time: a temporary array
    # the size of the batch, freed every batch, made glibc hand its pages back to the system
    # and fault them in again (a (256, 2048) batch took 4.9 ms instead of 0.9 ms).
    rows_per_block = max(1, _BLOCK_ELEMENTS // width)
    blocks = range(0, n, rows_per_block)
    # the rows with padding among their inputs or targets, and where it starts
    ends = np.flatnonzero(content <= seq_len) if content is not None else None
    padded = ends is not None and ends.size > 0
    # Packed rows are padded with token 0 (the reader writes it). When 0 is also the EOS id,
    # the padding is left out of the scan, or every one of its tokens would be a segment
    # start: a (256, 2048) batch took 16.8 ms, 1.3 ms with the padding left out. (Starts an
    # EOS puts in the padding otherwise are zeroed with it below.)
    live = content[:, None] - 1 if content is not None and padded and eos_id == 0 else None
    columns = np.arange(width) if live is not None else None

    def eos_at(r: int) -> np.ndarray:
        hit = windows[r : r + rows_per_block] == eos_id
        if live is not None:
            hit &= columns < live[r : r + rows_per_block]
        return np.flatnonzero(hit) + r * width

    hits = eos_at(0) if len(blocks) == 1 else np.concatenate([eos_at(r) for r in blocks])
    starts: list[int] | np.ndarray  # flat indices into (n, seq_len), ascending
    cuts: tuple[Any, Any] | None  # the targets across a join: (rows, columns)
    if content is None and hits.size + (0 if joins is None else joins[0].size) <= _FEW_STARTS:
        # nearly every batch of long documents: a handful, worked out in Python (~10 us less)
        starts, cuts = _few_starts(hits.tolist(), joins, width)
    else:
        starts, cuts = _many_starts(hits, joins, width)
    if out is None:
        position = np.empty((n, seq_len), dtype=np.int32)
        segmentation = np.empty((n, seq_len), dtype=np.int32)
        spare = None
    else:
        segmentation, position, spare = out
    ramp = np.arange(seq_len, dtype=np.int32)
    position[...] = ramp
    if len(starts) <= _FEW_STARTS:  # one segment a row, then each start (ascending) on top
        segmentation[...] = 1
        for start in starts if isinstance(starts, list) else starts.tolist():
            r, c = divmod(start, seq_len)
            position[r, c:] = ramp[: seq_len - c]
            segmentation[r, c:] += 1
    else:
        first = np.sort(np.concatenate([np.arange(0, total, seq_len), starts]))
        lengths = np.empty_like(first)
        np.subtract(first[1:], first[:-1], out=lengths[:-1])
        lengths[-1] = total - first[-1]
        start = (first % seq_len).astype(np.int32)
        # a segment's number: its index, less that of its row's first segment, plus one
        row_first = np.searchsorted(first, np.arange(0, total, seq_len))
        number = np.arange(1, first.size + 1, dtype=np.int32)
        number -= row_first[first // seq_len].astype(np.int32)
        # segments never cross rows: rows [r, r2) hold segments [row_first[r], row_first[r2])
        bounds = [*row_first[::rows_per_block].tolist(), first.size]
        for r, a, b in zip(blocks, bounds[:-1], bounds[1:], strict=True):
            r2 = min(n, r + rows_per_block)
            position[r:r2] -= start[a:b].repeat(lengths[a:b]).reshape(r2 - r, seq_len)
            segmentation[r:r2] = number[a:b].repeat(lengths[a:b]).reshape(r2 - r, seq_len)
    if padded:  # the padding, a suffix of its row: segment 0, position 0
        assert content is not None and ends is not None
        pad_at = content[ends]
        for r, c in zip(ends.tolist(), pad_at.tolist(), strict=True):
            segmentation[r, c:] = position[r, c:] = 0
    target_segmentation = segmentation
    if padded or (cuts is not None and len(cuts[0])):
        target_segmentation = segmentation.copy() if spare is None else spare
        if spare is not None:
            spare[...] = segmentation
    if cuts is not None and len(cuts[0]):
        target_segmentation[cuts] = 0
    if padded:  # and so is the target before it (one write for the batch: ~5 us less)
        target_segmentation[ends, np.maximum(pad_at - 1, 0)] = 0
    for array in (segmentation, position, target_segmentation):
        array.flags.writeable = False  # shared between features (and records): read-only
    return {
        INPUTS_SEGMENTATION: segmentation,
        INPUTS_POSITION: position,
        TARGETS_SEGMENTATION: target_segmentation,
        TARGETS_POSITION: position,
    }


def _many_starts(
    hits: np.ndarray, joins: Joins | None, width: int
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """:func:`_few_starts` for any number, vectorised.

    >>> _many_starts(np.array([3, 9]), (np.array([1]), np.array([2])), width=6)
    (array([4, 7, 9]), (array([1]), array([1])))
    """
    seq_len = width - 1
    row, col = np.divmod(hits, width)
    starts = (row * seq_len + col + 1)[col < seq_len - 1]
    if joins is None:
        return starts, None
    row, col = joins
    inside = col >= 1
    at_join = (row * seq_len + col)[inside & (col < seq_len)]
    if at_join.size:  # a join may also follow an EOS: one start
        both = np.sort(np.concatenate([starts, at_join]))
        starts = both[np.concatenate([[True], both[1:] != both[:-1]])]
    return starts, (row[inside], col[inside] - 1)


def _few_starts(
    hits: list[int], joins: Joins | None, width: int
) -> tuple[list[int], tuple[list[int], list[int]] | None]:
    """:func:`segment_features`' segment starts (flat indices into (n, seq_len), ascending,
    each once) and cut targets (rows, columns; None for none) from a few EOS ``hits`` (flat
    indices into the (n, width) windows) and ``joins``, in Python: cheaper than numpy for a
    handful.

    >>> _few_starts([3, 9], (np.array([1]), np.array([2])), width=6)
    ([4, 7, 9], ([1], [1]))
    """
    seq_len = width - 1
    starts = set()
    for hit in hits:
        r, c = divmod(hit, width)
        if c < seq_len - 1:  # an EOS at the last input column starts nothing in the row
            starts.add(r * seq_len + c + 1)
    cuts = None
    if joins is not None:
        cut_rows, cut_columns = [], []
        for r, c in zip(joins[0].tolist(), joins[1].tolist(), strict=True):
            if c >= 1:
                cut_rows.append(r)
                cut_columns.append(c - 1)
                if c < seq_len:
                    starts.add(r * seq_len + c)
        cuts = (cut_rows, cut_columns) if cut_rows else None
    return sorted(starts), cuts


def maxtext_record(windows: np.ndarray, features: Mapping[str, Any]) -> dict[str, Any]:
    """``inputs`` and ``targets`` as views of ``windows`` (its last axis holds
    ``seq_len + 1`` tokens), plus ``features`` (those of :func:`segment_features`, or none).

    >>> maxtext_record(np.arange(4), {})
    {'inputs': array([0, 1, 2]), 'targets': array([1, 2, 3])}
    """
    return {INPUTS: windows[..., :-1], TARGETS: windows[..., 1:], **features}


def batch_arrays(
    rows: int, seq_len: int, dtype: np.dtype, *, features: bool, stacked: bool
) -> tuple[np.ndarray, FeatureArrays | None, np.ndarray | None]:
    """A batch's output arrays carved from one allocation: the (rows, seq_len + 1) windows
    and, with ``features``, the three int32 (rows, seq_len) segment feature arrays
    (:data:`STACKED_SEGMENT_FEATURES` order), as rows of one (rows, 3, seq_len) ``segments``
    array when ``stacked`` (``layout="windows"``, returned third; no stacking copy).

    One block, not four arrays: glibc gave the pages of four 2 MB arrays freed every batch
    back to the system and faulted them in again for the next (a (256, 2048) MaxText batch
    took 4.9 ms; 2,000 page faults a batch).

    >>> w, (seg, pos, tgt), stacked = batch_arrays(2, 4, np.dtype(np.uint16), features=True,
    ...                                            stacked=True)
    >>> w.shape, seg.shape, stacked.shape, np.shares_memory(stacked, pos)
    ((2, 5), (2, 4), (2, 3, 4), True)
    """
    window_bytes = rows * (seq_len + 1) * dtype.itemsize
    head = -(-window_bytes // 64) * 64  # the features start 64-byte aligned
    size = head + (3 * rows * seq_len * 4 if features else 0)
    block = np.empty(size, dtype=np.uint8)
    windows = block[:window_bytes].view(dtype).reshape(rows, seq_len + 1)
    if not features:
        return windows, None, None
    cells = block[head:].view(np.int32)
    if stacked:
        segments = cells.reshape(rows, 3, seq_len)
        return windows, (segments[:, 0], segments[:, 1], segments[:, 2]), segments
    planes = cells.reshape(3, rows, seq_len)
    return windows, (planes[0], planes[1], planes[2]), None


def windows_record(
    windows: np.ndarray,
    features: Mapping[str, np.ndarray],
    segments: np.ndarray | None = None,
) -> dict[str, Any]:
    """A ``layout="windows"`` batch: the (B, seq_len + 1) ``windows`` and, with features, their
    (B, 3, seq_len) ``segments`` (:data:`STACKED_SEGMENT_FEATURES`); see :func:`unpack_windows`.
    ``segments``: the stacked array of :func:`batch_arrays` the features were written into.

    >>> w = np.array([[5, 0, 7]])
    >>> windows_record(w, segment_features(w, 0, None))["segments"].tolist()
    [[[1, 1], [0, 1], [1, 1]]]
    """
    record = {"windows": windows}
    if features and segments is not None:  # the features are its rows already
        if features[TARGETS_SEGMENTATION] is features[INPUTS_SEGMENTATION]:
            segments[:, 2] = segments[:, 0]
        segments.flags.writeable = False
        record["segments"] = segments
    elif features:
        record["segments"] = np.stack([features[k] for k in STACKED_SEGMENT_FEATURES], axis=1)
    return record


def unpack_windows(batch: Mapping[str, Any]) -> dict[str, Any]:
    """MaxText features from a ``layout="windows"`` batch (numpy or jax; cheap inside a jit).

    Args:
        batch: A ``TokenPipeline(..., layout="windows")`` batch: ``{"windows": (B, L + 1)}``
            and, with segmentation, ``"segments"``: ``(B, 3, L)``.

    Returns:
        ``inputs`` and ``targets`` (views of the windows) and, when the batch has
        ``"segments"``, ``inputs_segmentation``, ``inputs_position``,
        ``targets_segmentation`` and ``targets_position``.

    >>> import numpy as np
    >>> b = unpack_windows({"windows": np.arange(5)[None]})
    >>> b["inputs"].tolist(), b["targets"].tolist()
    ([[0, 1, 2, 3]], [[1, 2, 3, 4]])
    """
    w = batch["windows"]
    out = {INPUTS: w[:, :-1], TARGETS: w[:, 1:]}
    if "segments" in batch:
        seg = batch["segments"]
        for row, key in enumerate(STACKED_SEGMENT_FEATURES):
            out[key] = seg[:, row]
        out[TARGETS_POSITION] = seg[:, 1]  # the row of inputs_position
    return out
