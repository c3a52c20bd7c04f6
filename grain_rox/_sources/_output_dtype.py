"""The output dtype of token windows must keep every token id as it is stored."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def x64_enabled() -> bool:
    """Whether JAX places 64-bit values as they are (``jax_enable_x64``, asked each time: a
    program may turn it on or off)."""
    import jax

    config: Any = jax.config
    return bool(config.jax_enable_x64)


def check_output_dtype(
    dtype: np.dtype,
    stored: Mapping[str, np.dtype],
    eos_ids: Sequence[int | None],
    *,
    where: str,
) -> None:
    """Refuse an output ``dtype`` that would change token ids: one narrower than a source's
    stored dtype (``stored``: how errors name each source -> its dtype; ``uint16`` ids above
    32767 wrap in ``int16``, ``float16`` rounds ids above 2048), or one that cannot hold an
    EOS id, or an EOS id that no token of its source can be (``eos_ids``, when one a source,
    in the order of ``stored``). Unsigned to signed ints of 4 bytes or more (``uint32`` -> the
    default ``int32``) are allowed: no vocabulary reaches 2**31.

    >>> check_output_dtype(np.dtype("int32"), {}, [2**31], where="TokenPipeline")
    Traceback (most recent call last):
    ...
    ValueError: TokenPipeline: dtype=int32 cannot hold the EOS id 2147483648; pass dtype=np.int64
    """
    for label, source_dtype in stored.items():
        wide_ints = (
            source_dtype.kind == "u"
            and dtype.kind == "i"
            and dtype.itemsize >= source_dtype.itemsize >= 4
        )
        if not (np.can_cast(source_dtype, dtype) or wide_ints):
            raise ValueError(
                f"{where}: dtype={dtype.name} would change token ids of {label}, stored as "
                f"{source_dtype.name}; pass a dtype that holds every {source_dtype.name} value "
                f"(e.g. dtype=np.{source_dtype.name}, the stored one)"
            )
    if len(eos_ids) == len(stored):  # each source's EOS id, in order: it must be a token
        for (label, source_dtype), eos in zip(stored.items(), eos_ids, strict=True):
            if eos is None or source_dtype.kind not in "iu":
                continue
            held = np.iinfo(source_dtype)
            if not held.min <= eos <= held.max:
                raise ValueError(
                    f"{where}: eos_id={eos} can never occur in {label}, stored as "
                    f"{source_dtype.name} (ids {held.min} to {held.max}): no document would "
                    "end; pass the id its documents end with (the manifest's, by default)"
                )
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        for eos in eos_ids:
            if eos is not None and not info.min <= eos <= info.max:
                raise ValueError(
                    f"{where}: dtype={dtype.name} cannot hold the EOS id {eos}; pass dtype=np.int64"
                )


def may_wrap(dtype: np.dtype, stored: np.dtype) -> bool:
    """Whether ids ``stored`` this way may wrap in the output ``dtype``: an unsigned int served
    as the signed int of its width (``uint32`` as the default ``int32``), which
    :func:`check_output_dtype` allows because no vocabulary reaches 2**31; each read of such a
    source is checked by :func:`refuse_wrapped_ids`.

    >>> may_wrap(np.dtype("int32"), np.dtype("uint32")), may_wrap(np.dtype("int64"), np.dtype("uint32"))
    (True, False)
    """
    return stored.kind == "u" and dtype.kind == "i" and dtype.itemsize == stored.itemsize


def refuse_wrapped_ids(
    values: np.ndarray, dtype: np.dtype, label: str, *, where: str, pad_id: int | None = None
) -> None:
    """Refuse ids read from ``label`` that ``dtype`` cannot hold (see :func:`may_wrap`):
    ``values`` are the ids already cast to ``dtype`` (where one wrapped, it is negative), or
    as stored or wider (cast later, on the devices). The source's ``pad_id`` (its manifest's)
    is let through: where padding is served (the lanes order) it was served cast, and still
    is. A corpus of other such ids is damaged or holds no token ids: served, each would have
    become another id without a word.

    >>> refuse_wrapped_ids(np.array([5, -2], np.int32), np.dtype("int32"), "a.rox", where="X")
    Traceback (most recent call last):
    ...
    ValueError: X: a.rox holds the token id 4294967294, which dtype=int32 cannot hold (it would become -2): no vocabulary has ids from 2**31 on, so the data is damaged or not token ids; check it with `grain-rox verify`, or serve the ids as stored with dtype=np.int64 (and jax_enable_x64 on, or JAX narrows them to 32 bits again on the devices)
    >>> refuse_wrapped_ids(np.array([5, -1], np.int32), np.dtype("int32"), "a.rox", where="X",
    ...                    pad_id=2**32 - 1)
    """
    if not values.size or not wrapped(np.array([values.min(), values.max()]), dtype).any():
        return
    info = np.iinfo(dtype)
    bits = 8 * dtype.itemsize
    bad = values[wrapped(values, dtype)]
    if values.dtype == dtype:  # cast already: the ids as stored
        bad = bad.view(np.dtype(f"u{dtype.itemsize}"))
    if pad_id is not None:  # in Python ints: a pad id outside bad's dtype compares safely
        left = [v for v in bad.tolist() if v != pad_id]
        if not left:
            return
        bad = np.asarray(left[:1], dtype=bad.dtype)
    stored = int(bad[0])
    served = (stored - info.min) % 2**bits + info.min
    wide = "int64" if dtype.itemsize < 8 else "uint64"
    raise ValueError(
        f"{where}: {label} holds the token id {stored}, which dtype={dtype.name} cannot hold "
        f"(it would become {served}): no vocabulary has ids from 2**{bits - 1} on, so the data "
        "is damaged or not token ids; check it with `grain-rox verify`, or serve the ids as "
        f"stored with dtype=np.{wide} (and jax_enable_x64 on, or JAX narrows them to 32 bits "
        "again on the devices)"
    )


def wrapped(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Where ids read from an unsigned source wrap in ``dtype`` (see :func:`may_wrap`):
    ``values`` already cast to ``dtype`` are negative there; as stored or wider, they lie
    outside what ``dtype`` holds.

    >>> wrapped(np.array([5, -2], np.int32), np.dtype("int32")).tolist()
    [False, True]
    """
    return values < 0 if values.dtype == dtype else outside_of(values, dtype)


def outside_of(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Where integer ``values`` lie outside what ``dtype`` holds, each bound compared in
    ``values``' own dtype (a bound it cannot hold is no bound: a uint32 is never below
    int32's least; a comparison with a Python int outside the dtype crashed NumPy 2.0.0).

    >>> outside_of(np.array([1, 2**31], np.uint32), np.dtype("int32")).tolist()
    [False, True]
    """
    have, held = np.iinfo(values.dtype), np.iinfo(dtype)
    outside = np.zeros(values.shape, dtype=bool)
    if have.min < held.min:
        outside |= values < values.dtype.type(held.min)
    if have.max > held.max:
        outside |= values > values.dtype.type(held.max)
    return outside


def refuse_wrapped_in(corpus: Any, values: np.ndarray, dtype: np.dtype, *, where: str) -> None:
    """:func:`refuse_wrapped_ids` for ids read from one ``corpus`` (named by its first shard,
    its manifest's pad id let through)."""
    refuse_wrapped_ids(values, dtype, corpus.paths[0], where=where, pad_id=corpus.pad_id)
