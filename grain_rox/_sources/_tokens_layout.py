"""One array a batch: the ``layout="tokens"`` wire format, and the MaxText features from it.

Every separate array a batch sends to an accelerator costs a transfer with a fixed price
that no host speed removes (measured on an H100 host: six arrays cost 3x one). So a batch
can travel as one array, ``tokens``, of shape ``(B, seq_len + 1 + joins + content + eos)``
in the corpus's own integer dtype (``uint16`` when the vocabulary fits: half the bytes of int32):

* columns ``[0, seq_len]``: the window, ``seq_len + 1`` tokens (inputs and shifted targets);
* then, with segment features, where the window crosses a join (unrelated text follows), the
  narrower of two ways at the longest ``seq_len``: as many *join columns* as a window can
  cross (1 for the default 64K-token chunks), each a position ``1..seq_len`` or 0 for none;
  or a *join mask*, one bit per position ``0..seq_len``, ``bits`` positions a column (packed
  rows, whose every document boundary is a join);
* with packed rows, a *content column*: the row's tokens before its padding (``seq_len + 1``
  when it has none);
* one last column, only when the sources use different EOS ids: each row's EOS id.

:meth:`TokensLayout.unpack` turns it into the six MaxText arrays with a handful of
vectorised operations (a cumulative sum and a cumulative max per row), in NumPy or inside
a ``jax.jit`` on the device, equal to the features computed on the host
(``_sources._segments.segment_features``).

>>> layout = TokensLayout(join_columns=1, eos_id=0, eos_column=False, dtype=np.dtype("uint16"))
>>> tokens = layout.empty(rows=1, seq_len=5)
>>> tokens[:, :6] = [5, 6, 0, 7, 8, 9]  # the window, as the reader writes it
>>> layout.fill(tokens, joins=None).tolist()  # then "no join"
[[5, 6, 0, 7, 8, 9, 0]]
>>> f = layout.unpack(tokens, out_dtype=np.int32)
>>> f["inputs"].tolist(), f["inputs_segmentation"].tolist(), f["inputs_position"].tolist()
([[5, 6, 0, 7, 8]], [[1, 1, 1, 2, 2]], [[0, 1, 2, 0, 1]])
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from grain_rox._sources._output_dtype import x64_enabled
from grain_rox._sources._segments import (
    INPUTS,
    INPUTS_POSITION,
    INPUTS_SEGMENTATION,
    TARGETS,
    TARGETS_POSITION,
    TARGETS_SEGMENTATION,
    Joins,
)

TOKENS = "tokens"  # the key of a layout="tokens" batch's one array


@dataclasses.dataclass(frozen=True)
class TokensLayout:
    """How a pipeline's batches are packed into one ``tokens`` array (see the module doc).

    Attributes:
      join_columns: columns holding chunk-join positions (0 without segment features, or
        with ``join_mask``).
      eos_id: the EOS id of every source (None without segment features, or when the
        sources differ: then ``eos_column`` is set).
      eos_column: whether a last column holds each row's EOS id.
      dtype: the array's dtype: the sources' integer token dtype, widened if a join position,
        a row's content or an EOS id would not fit.
      join_mask: whether the joins travel as a bit mask (:meth:`mask_columns` columns)
        instead of join columns.
      content_column: whether a column holds each row's tokens before its padding (packed
        rows).
    """

    join_columns: int
    eos_id: int | None
    eos_column: bool
    dtype: np.dtype
    join_mask: bool = False
    content_column: bool = False

    @functools.cached_property
    def bits(self) -> int:
        """Join-mask positions a column holds: every bit of the dtype but a sign bit, and 32
        at most (a column is unpacked as a ``uint32``); 64-bit columns hold 31, below 2**31,
        which JAX places as int32 without x64 (a 32nd bit was refused there as a wrap)."""
        info = np.iinfo(self.dtype)
        return min(32 if info.bits < 64 else 31, info.bits - (1 if info.min < 0 else 0))

    def mask_columns(self, seq_len: int) -> int:
        """Columns of the join mask of a ``seq_len`` window (0 without ``join_mask``)."""
        return -(-(seq_len + 1) // self.bits) if self.join_mask else 0

    @property
    def features(self) -> bool:
        """Whether the batches carry the four segment features."""
        return self.eos_id is not None or self.eos_column

    def _after_window(self, seq_len: int) -> int:
        """Columns after the window: joins, content, EOS id."""
        joins = self.mask_columns(seq_len) if self.join_mask else self.join_columns
        return joins + int(self.content_column) + int(self.eos_column)

    def width(self, seq_len: int) -> int:
        """Columns of a batch of ``seq_len``-token rows."""
        return seq_len + 1 + self._after_window(seq_len)

    def seq_len(self, width: int) -> int:
        """The ``seq_len`` of a batch ``width`` columns wide."""
        fixed = int(self.content_column) + int(self.eos_column)
        if not self.join_mask:
            return width - 1 - self.join_columns - fixed
        # width - fixed = (seq_len + 1) + ceil((seq_len + 1) / bits): one solution at most
        cells = width - fixed
        guess = cells * self.bits // (self.bits + 1)
        for window in (guess, guess + 1):
            if window >= 1 and window + -(-window // self.bits) == cells:
                return window - 1
        raise ValueError(f"no seq_len gives a batch {width} columns wide in {self}")

    def empty(self, rows: int, seq_len: int) -> np.ndarray:
        """A batch to fill: read the windows into ``out[:, :seq_len + 1]``, then :meth:`fill`."""
        return np.empty((rows, self.width(seq_len)), dtype=self.dtype)

    def fill(
        self,
        tokens: np.ndarray,
        joins: Joins | None,
        eos_ids: np.ndarray | None = None,
        content: np.ndarray | None = None,
    ) -> np.ndarray:
        """Write the joins (from ``joins``: the ``(rows, columns)`` where windows cross a join,
        sorted by row, or None), the content column (``content``: each packed row's tokens
        before its padding, None for full rows) and the EOS column (``eos_ids``: each row's) of
        a batch whose windows are in place; returns ``tokens``, read-only."""
        seq_len = self.seq_len(tokens.shape[1])
        extra = tokens[:, seq_len + 1 :]
        extra[...] = 0
        if self.content_column:
            extra[:, -1 - int(self.eos_column)] = seq_len + 1 if content is None else content
        if joins is not None and self.features:
            rows, positions = joins
            inside = positions >= 1  # column 0 never starts a segment
            rows, positions = rows[inside], positions[inside]
        else:
            rows = positions = np.empty(0, dtype=np.int64)
        if rows.size and self.join_mask:
            self._fill_mask(extra[:, : self.mask_columns(seq_len)], rows, positions)
        elif rows.size and self.join_columns:
            first = np.searchsorted(rows, rows, side="left")  # rows come out sorted
            column = np.arange(rows.size) - first
            if int(column.max()) >= self.join_columns:
                raise AssertionError(
                    f"a window crosses {int(column.max()) + 1} joins, more than the "
                    f"{self.join_columns} the layout holds"
                )
            extra[rows, column] = positions
        if self.eos_column:
            assert eos_ids is not None
            extra[:, -1] = eos_ids
        tokens.flags.writeable = False
        return tokens

    def _fill_mask(self, mask: np.ndarray, rows: np.ndarray, positions: np.ndarray) -> None:
        """Set bit ``c % bits`` of ``mask[r, c // bits]`` for every join ``(r, c)``, c >= 1
        (joins are distinct, so a sum of their bits is their OR)."""
        word, bit = np.divmod(positions, self.bits)
        cells = mask.shape[0] * mask.shape[1]
        # float64 weights hold a word's sum exactly (below 2**32: ``bits`` is 32 at most)
        words = np.bincount(rows * mask.shape[1] + word, np.left_shift(1, bit), minlength=cells)
        mask[...] = words.reshape(mask.shape).astype(mask.dtype)

    def unpack(self, tokens: Any, *, out_dtype: Any) -> dict[str, Any]:
        """The MaxText features of a ``tokens`` batch: NumPy in, NumPy out; a ``jax.Array``
        (or a tracer inside ``jax.jit``) in, ``jax.Array`` out. ``inputs``/``targets`` are
        ``out_dtype``; the segment features int32."""
        xp: Any = np if isinstance(tokens, np.ndarray) else _jnp()
        if xp is not np:
            _refuse_wrapping(np.dtype(tokens.dtype), np.dtype(out_dtype))
        seq_len = self.seq_len(tokens.shape[1])
        window = tokens[:, : seq_len + 1].astype(out_dtype)
        out = {INPUTS: window[:, :-1], TARGETS: window[:, 1:]}
        if not self.features:
            return out
        rows = tokens.shape[0]
        if self.eos_column:
            eos = tokens[:, -1:].astype(out_dtype)
        else:
            eos = xp.asarray(self.eos_id).astype(out_dtype)
        # position t starts a segment: t == 0, the token before it is EOS, or a join at t
        after_eos = window[:, : seq_len - 1] == eos
        starts = xp.concatenate([xp.ones((rows, 1), dtype=bool), after_eos], axis=1)
        join_at = None
        after = seq_len + 1  # the first column after the window
        if self.join_mask:
            words = tokens[:, after : after + self.mask_columns(seq_len)]
            join_at = _mask_bits(xp, words, self.bits, seq_len + 1)
        elif self.join_columns:
            columns = tokens[:, after : after + self.join_columns].astype(np.int32)
            join_at = _scatter_true(xp, (rows, seq_len + 1), columns)
        if join_at is not None:
            starts = starts | join_at[:, :seq_len]
        t = xp.arange(seq_len, dtype=np.int32)
        segmentation = xp.cumsum(starts, axis=1, dtype=np.int32)
        last_start = _cummax(xp.where(starts, t, 0))  # the latest segment start so far
        position = (t - last_start).astype(np.int32)
        target_segmentation = segmentation
        if join_at is not None:  # no loss on a target across a join (unrelated text)
            target_segmentation = xp.where(join_at[:, 1:], 0, segmentation).astype(np.int32)
        if self.content_column:  # packed rows: padding, and targets that are padding, are 0
            column = tokens.shape[1] - 1 - int(self.eos_column)
            content = tokens[:, column : column + 1].astype(np.int32)
            padding = t >= content
            segmentation = xp.where(padding, 0, segmentation).astype(np.int32)
            position = xp.where(padding, 0, position).astype(np.int32)
            target_segmentation = xp.where(t + 1 >= content, 0, target_segmentation)
            target_segmentation = target_segmentation.astype(np.int32)
        out[INPUTS_SEGMENTATION] = segmentation
        out[INPUTS_POSITION] = position
        out[TARGETS_SEGMENTATION] = target_segmentation
        out[TARGETS_POSITION] = position
        return out


def _refuse_wrapping(stored: np.dtype, out: np.dtype) -> None:
    """Refuse to make 64-bit tokens on the devices from unsigned 32-bit (or wider) ones while
    ``jax_enable_x64`` is off: JAX makes them int32, and ids from 2**31 on would wrap (the
    host refuses such values where it places them; inside a jit nobody would see them)."""
    wide = out.itemsize == 8 and stored.kind == "u" and stored.itemsize >= 4
    if wide and not x64_enabled():
        raise ValueError(
            f"unpack: dtype={out} needs jax_enable_x64, which is off, so JAX makes int32 "
            f"of these {stored} tokens, and ids from 2**31 on would wrap; pass "
            "TokenPipeline(dtype=np.uint32) (or np.int32, for ids below 2**31), or turn "
            "x64 on: jax.config.update('jax_enable_x64', True)"
        )


def _jnp() -> Any:
    import jax.numpy as jnp

    return jnp


def _scatter_true(xp: Any, shape: tuple[int, int], columns: Any) -> Any:
    """A boolean ``shape`` mask, True at ``(row, columns[row, k])`` for every column value
    above 0 (0 means "none": position 0 is never a join), in O(rows x width) memory.

    On the devices this is one elementwise comparison per join column, not a scatter: the
    rows are sharded over the mesh, and XLA partitions a scatter over sharded rows with
    collectives (an all-gather across processes, issued from the prefetch thread)."""
    if xp is np:
        mask = np.zeros(shape, dtype=bool)
        rows = np.arange(shape[0])[:, None]
        mask[rows, columns] = columns > 0  # distinct positions; zeros all land on column 0
        mask[:, 0] = False
        return mask
    positions = xp.arange(shape[1], dtype=np.int32)
    mask = xp.zeros(shape, dtype=bool)
    for k in range(columns.shape[1]):  # a static count: the layout's join columns
        column = columns[:, k : k + 1]
        mask = mask | ((column == positions) & (column > 0))
    return mask


def _mask_bits(xp: Any, words: Any, bits: int, width: int) -> Any:
    """The ``(rows, width)`` boolean mask whose position ``p`` is bit ``p % bits`` of
    ``words[:, p // bits]``: shifts and a reshape, elementwise per row (no gather)."""
    shifts = xp.arange(bits, dtype=np.uint32)
    cells = (words.astype(np.uint32)[:, :, None] >> shifts) & np.uint32(1)
    return cells.reshape(words.shape[0], -1)[:, :width].astype(bool)


def _cummax(x: Any) -> Any:
    """The running maximum along each row."""
    if isinstance(x, np.ndarray):
        return np.maximum.accumulate(x, axis=1)
    import jax

    return jax.lax.cummax(x, axis=1)


def tokens_layout(
    *,
    eos_ids: Sequence[int | None],
    max_joins: int,
    max_seq_len: int,
    token_dtypes: Sequence[np.dtype],
    packed: bool = False,
) -> TokensLayout | None:
    """The layout of a pipeline's sources (their EOS ids, None where features are off; the
    most joins a window of their orders crosses; stored dtypes; whether rows are packed), or
    None when its tokens are not integers. Joins travel as join columns or as a join mask,
    whichever is narrower at ``max_seq_len``.

    >>> tokens_layout(eos_ids=[0], max_joins=1, max_seq_len=1024,
    ...               token_dtypes=[np.dtype("uint16")])  # doctest: +NORMALIZE_WHITESPACE
    TokensLayout(join_columns=1, eos_id=0, eos_column=False, dtype=dtype('uint16'),
                 join_mask=False, content_column=False)
    >>> packed = tokens_layout(eos_ids=[0], max_joins=1024, max_seq_len=1024,
    ...                        token_dtypes=[np.dtype("uint16")], packed=True)
    >>> packed.join_mask, packed.content_column, packed.width(1024)  # 1025 + 65 + 1
    (True, True, 1091)
    """
    dtype = np.result_type(*token_dtypes)
    if dtype.kind not in "iu":
        return None
    features = bool(eos_ids) and all(e is not None for e in eos_ids)
    distinct = {int(e) for e in eos_ids if e is not None} if features else set()
    # a join position is at most max_seq_len; a packed row's content max_seq_len + 1
    largest = max([max_seq_len + int(packed), *distinct]) if features else 0
    if largest > np.iinfo(dtype).max:
        dtype = np.result_type(dtype, np.min_scalar_type(largest))
    layout = TokensLayout(
        join_columns=max_joins if features else 0,
        eos_id=distinct.pop() if len(distinct) == 1 else None,
        eos_column=len(distinct) > 1,
        dtype=np.dtype(dtype),
        content_column=features and packed,
    )
    as_mask = dataclasses.replace(layout, join_columns=0, join_mask=True)
    if features and as_mask.mask_columns(max_seq_len) < layout.join_columns:
        return as_mask
    return layout
