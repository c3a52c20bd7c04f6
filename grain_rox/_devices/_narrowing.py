"""Integers JAX would narrow: with ``jax_enable_x64`` off (JAX's default) an ``int64`` or
``uint64`` array is placed as ``int32``/``uint32``, and values outside that range wrap without
a word (``2**32 + 7`` becomes ``7``). A batch holding such a value is refused, naming the leaf,
the value and the fix; a batch whose values fit is placed as before (one min and max per such
leaf, only for 64-bit integer leaves). A ``float64`` or ``complex128`` leaf is rounded to 32
bits, which JAX documents: that is said once a process, a warning naming the leaf and the fix.

>>> import numpy as np
>>> refuse_narrowing([np.array([1, 2], np.int64)], where="a batch")  # fits int32: placed
>>> refuse_narrowing([np.array([2**32 + 7], np.int64)], where="a batch")
Traceback (most recent call last):
...
ValueError: a batch's leaf [0] holds int64 values up to 4294967303, which JAX places as int32 (jax_enable_x64 is off), so they would wrap (4294967303 -> 7). Enable 64-bit JAX (jax.config.update('jax_enable_x64', True), before any array is made), or bring the values into int32's range (or leave the leaf out) before they reach the devices
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from grain_rox._sources._output_dtype import x64_enabled


@functools.lru_cache(maxsize=64)
def _placed_as(dtype: np.dtype, x64: bool) -> np.dtype | None:
    """The narrower dtype JAX places ``dtype`` as (integers, floats, complex), or None when it
    keeps its width."""
    if x64 or dtype.kind not in "iufc":
        return None
    placed = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
    return placed if placed.itemsize < dtype.itemsize else None


def _wrapped(value: int, dtype: np.dtype) -> int:
    """What ``value`` becomes as ``dtype`` (two's complement, as the device copy makes it)."""
    return int(np.array([value], np.uint64 if value >= 0 else np.int64).astype(dtype)[0])


_log = logging.getLogger("grain_rox")
_ROUNDED_SAID: set[np.dtype] = set()  # float dtypes said to be rounded, once a process


def refuse_narrowing(
    arrays: Sequence[np.ndarray],
    *,
    where: str | Callable[[], str],
    names: Sequence[str] | Callable[[], Sequence[str]] | None = None,
) -> None:
    """Raise ``ValueError`` if JAX would wrap an integer of ``arrays`` (the leaves of one
    batch), naming the leaf, the value and the fix; say once a process (a warning) that a
    ``float64``/``complex128`` leaf is rounded to 32 bits. ``where`` (what holds them) and
    ``names`` (each leaf's name; by index without) may be functions, asked only to word a
    message: on a hot path a batch that fits costs no words. The cost: a min and a max of each
    64-bit integer leaf, with ``jax_enable_x64`` off; nothing otherwise."""
    x64 = x64_enabled()
    for i, a in enumerate(arrays):
        placed = _placed_as(a.dtype, x64)
        if placed is None or a.size == 0:
            continue
        if placed.kind in "fc":
            if a.dtype not in _ROUNDED_SAID:
                _ROUNDED_SAID.add(a.dtype)
                _log.warning(
                    "%s's leaf %s is %s, which JAX places as %s (jax_enable_x64 is off): its "
                    "values are rounded to %s's precision (said once a process). Make it %s "
                    "where it is made to say so, or enable 64-bit JAX "
                    "(jax.config.update('jax_enable_x64', True)) to keep them",
                    _said(where),
                    _name(names, i),
                    a.dtype.name,
                    placed.name,
                    placed.name,
                    placed.name,
                )
            continue
        info = np.iinfo(placed)
        lo, hi = int(a.min()), int(a.max())
        if info.min <= lo and hi <= info.max:
            continue
        bad = hi if hi > info.max else lo
        raise ValueError(
            f"{_said(where)}'s leaf {_name(names, i)} holds {a.dtype.name} values "
            f"{'up to' if bad > 0 else 'down to'} {bad}, which JAX places as {placed.name} "
            f"(jax_enable_x64 is off), so they would wrap ({bad} -> {_wrapped(bad, placed)}). "
            "Enable 64-bit JAX (jax.config.update('jax_enable_x64', True), before any array is "
            f"made), or bring the values into {placed.name}'s range (or leave the leaf out) "
            "before they reach the devices"
        )


def _said(where: str | Callable[[], str]) -> str:
    return where() if callable(where) else where


def _name(names: Sequence[str] | Callable[[], Sequence[str]] | None, i: int) -> str:
    shown = names() if callable(names) else names
    return shown[i] if shown is not None else f"[{i}]"


def leaf_names(tree: Any) -> list[str]:
    """Each leaf's key path in ``tree`` (``['doc_id']``), in flattening order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [jax.tree_util.keystr(path) or "(the batch)" for path, _ in flat]
