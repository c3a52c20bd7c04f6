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


def segment_features(
    windows: np.ndarray,
    eos_id: int,
    joins: np.ndarray | None,
    content: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """MaxText packing features for (n, seq_len + 1) windows (see the module doc), as
    read-only arrays: ``targets_position`` is ``inputs_position``, and without chunk joins
    ``targets_segmentation`` is ``inputs_segmentation``. With ``content`` (packed rows: the
    tokens of each row, padding after them) the padding has segment 0 and position 0, and so
    does every target that is padding.

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
    hits = np.flatnonzero(windows == eos_id)
    row, col = np.divmod(hits, width)
    inner = (row * seq_len + col + 1)[col < seq_len - 1]
    cuts = None  # the targets that lie across a join: (rows, columns)
    if joins is not None:
        row, col = np.divmod(np.flatnonzero(joins), width)
        inside = col >= 1
        cuts = row[inside], col[inside] - 1
        at_join = (row * seq_len + col)[inside & (col < seq_len)]
        if at_join.size:  # a join may also follow an EOS: one start
            both = np.sort(np.concatenate([inner, at_join]))
            inner = both[np.concatenate([[True], both[1:] != both[:-1]])]
    position = np.empty((n, seq_len), dtype=np.int32)
    position[...] = np.arange(seq_len, dtype=np.int32)
    if not inner.size:  # one segment a row
        segmentation = np.ones((n, seq_len), dtype=np.int32)
    else:
        first = np.sort(np.concatenate([np.arange(0, total, seq_len), inner]))
        lengths = np.empty_like(first)
        np.subtract(first[1:], first[:-1], out=lengths[:-1])
        lengths[-1] = total - first[-1]
        position.reshape(-1)[...] -= (first % seq_len).astype(np.int32).repeat(lengths)
        # a segment's number: its index, less that of its row's first segment, plus one
        row_first = np.searchsorted(first, np.arange(0, total, seq_len))
        number = np.arange(1, first.size + 1, dtype=np.int32)
        number -= row_first[first // seq_len].astype(np.int32)
        segmentation = number.repeat(lengths).reshape(n, seq_len)
    target_segmentation = segmentation
    if cuts is not None and cuts[0].size:
        target_segmentation = segmentation.copy()
        target_segmentation[cuts] = 0
    if content is not None and (content <= seq_len).any():
        if target_segmentation is segmentation:
            target_segmentation = segmentation.copy()
        for r in np.flatnonzero(content <= seq_len).tolist():
            c = int(content[r])
            segmentation[r, c:] = position[r, c:] = 0  # padding: a suffix of the row
            target_segmentation[r, max(c - 1, 0) :] = 0  # a target that is padding
    for array in (segmentation, position, target_segmentation):
        array.flags.writeable = False  # shared between features (and records): read-only
    return {
        INPUTS_SEGMENTATION: segmentation,
        INPUTS_POSITION: position,
        TARGETS_SEGMENTATION: target_segmentation,
        TARGETS_POSITION: position,
    }


def maxtext_record(windows: np.ndarray, features: Mapping[str, Any]) -> dict[str, Any]:
    """``inputs`` and ``targets`` as views of ``windows`` (its last axis holds
    ``seq_len + 1`` tokens), plus ``features`` (those of :func:`segment_features`, or none).

    >>> maxtext_record(np.arange(4), {})
    {'inputs': array([0, 1, 2]), 'targets': array([1, 2, 3])}
    """
    return {INPUTS: windows[..., :-1], TARGETS: windows[..., 1:], **features}


def windows_record(windows: np.ndarray, features: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """A ``layout="windows"`` batch: the (B, seq_len + 1) ``windows`` and, with features, their
    (B, 3, seq_len) ``segments`` (:data:`STACKED_SEGMENT_FEATURES`); see :func:`unpack_windows`.

    >>> w = np.array([[5, 0, 7]])
    >>> windows_record(w, segment_features(w, 0, None))["segments"].tolist()
    [[[1, 1], [0, 1], [1, 1]]]
    """
    record = {"windows": windows}
    if features:
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
