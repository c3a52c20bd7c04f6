"""Turn the items given to :func:`~grain_rox._text._rox_writer.write_rox` into token arrays.

:func:`plan_layout` settles what one write stores: the token dtype (from ``dtype=``, the
tokenizer's vocabulary or the first item), the block size, the one-token separator and the
padding token, each checked against the dtype. :class:`ItemEncoder` then turns every item into
a 1-D array of that dtype, range-checking values instead of relabelling them (no int16
overflow, no float that becomes inf).

>>> layout, items = plan_layout(iter(["hi"]), None, 4, None, None, None)
>>> str(layout.dtype), layout.tokens_per_block, layout.separator, layout.pad
('uint8', 4, None, 0)
>>> ItemEncoder(layout.dtype, None)(next(items), 0).tolist()
[104, 105]
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from grain_rox._format._rox_format import encode_dtype, token_dtype
from grain_rox._order._permutation import int_arg
from grain_rox._text._tokenizers import Tokenizer, smallest_token_dtype

Item = str | bytes | bytearray | memoryview | np.ndarray | list[int] | tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class TokenLayout:
    """How one write lays out its tokens.

    Attributes:
      dtype: the token dtype of every shard of the write.
      block_size: bytes per block, a multiple of ``dtype.itemsize``.
      separator: the token written after every item, or ``None`` for none.
      pad: the token that pads the final block.
      tokenizer: the tokenizer str items are encoded with, if any.
    """

    dtype: np.dtype
    block_size: int
    separator: int | float | None
    pad: int | float
    tokenizer: Tokenizer | None

    @property
    def tokens_per_block(self) -> int:
        """Tokens in one block."""
        return self.block_size // self.dtype.itemsize


# The largest block a write builds (in memory) and a read fetches whole.
MAX_BLOCK_BYTES = 1 << 30


def plan_layout(
    items: Iterator[Any],
    dtype: Any,
    block_size: int,
    separator: Any,
    pad_id: int | None,
    tok: Tokenizer | None,
) -> tuple[TokenLayout, Iterator[Any]]:
    """Settle a write's :class:`TokenLayout`; returns it and ``items`` (whole again if its first
    item was looked at to infer the dtype)."""
    block_size = int_arg(block_size, "block_size", where="write_rox")
    if block_size > MAX_BLOCK_BYTES:  # a block is built in memory (2**40 asked for 1 TiB)
        raise ValueError(
            f"write_rox: block_size={block_size} bytes is over the {MAX_BLOCK_BYTES >> 20} MiB "
            "a block may hold (a block is built in memory and is the unit of a read); pass "
            "e.g. block_size=4096, the default, up to a few MiB"
        )
    target, items = resolve_dtype(items, dtype, tok)
    encode_dtype(target)  # fails early on dtypes the footer cannot name
    itemsize = target.itemsize
    if block_size <= 0 or block_size % itemsize:
        raise ValueError(
            f"block_size={block_size} bytes is not a positive multiple of the {target} token size "
            f"({itemsize} bytes): blocks would split tokens; use e.g. "
            f"block_size={max(itemsize, block_size - block_size % itemsize)}"
        )
    if tok is not None and separator is None:
        separator = tok.eos_id
    sep = separator_token(separator, target, tok)
    given: int | float | None = None if pad_id is None else _one_token(pad_id, "pad_id", target)
    if given is None and tok is not None:
        given = tok.pad_id
    pad = given if given is not None else (sep if sep is not None else 0)
    check_dtype_range(np.asarray([pad]), target, f"pad_id {pad!r}")
    return TokenLayout(target, block_size, sep, pad, tok), items


def resolve_dtype(
    items: Iterator[Any], dtype: Any, tokenizer: Tokenizer | None
) -> tuple[np.dtype, Iterator[Any]]:
    """The token dtype: ``dtype``, else the smallest that holds the tokenizer's vocabulary, else
    that of the first item (uint8 for text and bytes)."""
    if dtype is not None:
        return token_dtype(dtype), items
    if tokenizer is not None:
        return smallest_token_dtype(tokenizer.vocab_size), items
    first = next(items, None)
    if first is None:
        return np.dtype(np.uint8), items
    rest = itertools.chain([first], items)
    if isinstance(first, (str, bytes, bytearray, memoryview)):
        return np.dtype(np.uint8), rest
    if isinstance(first, np.ndarray):
        return first.dtype, rest
    raise TypeError(
        f"cannot infer a dtype from a first item of type {type(first).__name__}; pass dtype="
    )


def check_dtype_range(values: np.ndarray, dtype: np.dtype, where: str) -> None:
    """Refuse integer values that do not fit an integer ``dtype``."""
    if values.size == 0 or dtype.kind not in "ui":
        return
    if values.dtype.kind in "ui" and np.can_cast(values.dtype, dtype, "safe"):
        return  # every value of the source type fits
    info = np.iinfo(dtype)
    lo, hi = values.min(), values.max()
    if lo < info.min or hi > info.max:
        wider = next(
            (
                t
                for t in ("uint16", "uint32", "int32", "uint64", "int64")
                if np.dtype(t).itemsize >= dtype.itemsize
                and np.iinfo(t).min <= lo
                and hi <= np.iinfo(t).max
            ),
            None,
        )
        fix = f"pass dtype={wider!r}" if wider else "no integer dtype holds them"
        raise ValueError(
            f"{where} holds values in [{lo}, {hi}] that do not fit {dtype} [{info.min}, "
            f"{info.max}]; {fix}, or check the token ids"
        )


def check_float_overflow(values: np.ndarray, stored: np.ndarray, where: str) -> None:
    """Refuse values that become inf in a float dtype (e.g. 1e6 in float16)."""
    if values.size == 0 or stored.dtype.kind in "ui":
        return
    lost = np.isinf(stored.astype(np.float64)) & ~np.isinf(values.astype(np.float64))
    if lost.any():
        bad = values.reshape(-1)[int(np.argmax(lost.reshape(-1)))]
        raise ValueError(
            f"{where} holds {bad.item()!r}, which overflows to inf in {stored.dtype}; pass "
            "dtype= a wider float type (e.g. float32) or scale the values"
        )


def item_name(noun: str, index: int, describe: Callable[[int], str] | None) -> str:
    """``<noun> <index>``, with where it came from where ``describe`` says (an ArrayRecord
    file and record; an index past the source's records names none).

    >>> item_name("item", 2, lambda i: f"a.array_record: record {i - 1}"), item_name("item", 2, None)
    ('item 2 (a.array_record: record 1)', 'item 2')
    """
    if describe is not None:
        with contextlib.suppress(IndexError):
            return f"{noun} {index} ({describe(index)})"
    return f"{noun} {index}"


class _Where:
    """:func:`item_name` of item ``index``, worded only when an error is (no cost per item)."""

    def __init__(self, index: int, describe: Callable[[int], str]) -> None:
        self.index, self.describe = index, describe

    def __format__(self, spec: str) -> str:
        return format(item_name("item", self.index, self.describe), spec)

    __str__ = __repr__ = lambda self: format(self, "")


class ItemEncoder:
    """Turns each item into a 1-D array of the target dtype, checking instead of relabelling."""

    def __init__(
        self,
        dtype: np.dtype,
        tokenizer: Tokenizer | None,
        describe: Callable[[int], str] | None = None,
    ) -> None:
        self.dtype = dtype
        self.tokenizer = tokenizer
        # where item i came from (an ArrayRecord file and record), named in errors
        self.describe = describe
        # Ids below the vocabulary size fit a dtype chosen for it: no per-item range check.
        self.ids_fit = (
            tokenizer is not None
            and dtype.kind in "ui"
            and tokenizer.vocab_size - 1 <= np.iinfo(dtype).max
        )

    def _check_vocabulary(self, ids: np.ndarray, where: str) -> None:
        """Token arrays given with a tokenizer must be ids of its vocabulary."""
        assert self.tokenizer is not None
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= self.tokenizer.vocab_size:
            bad = low if low < 0 else high
            raise ValueError(
                f"{where} holds token id {bad}, outside the {self.tokenizer.name} vocabulary "
                f"(0..{self.tokenizer.vocab_size - 1}); pass the tokenizer these ids came from"
            )

    def __call__(self, item: Any, index: int) -> np.ndarray:
        where: Any = f"item {index}" if self.describe is None else _Where(index, self.describe)
        if isinstance(item, str):
            if self.tokenizer is not None:
                ids = self.tokenizer.encode(item)
                if not self.ids_fit:
                    check_dtype_range(ids, self.dtype, where)
                return ids.astype(self.dtype, copy=False)
            if self.dtype != np.uint8:
                raise TypeError(
                    f"{where} is text (str) but the shard dtype is {self.dtype} and no "
                    "tokenizer= is given; pass tokenizer= (e.g. 'bytes' or 'cl100k_base'), or "
                    "token arrays"
                )
            item = item.encode("utf-8")
        if isinstance(item, (bytes, bytearray, memoryview)):
            if self.dtype != np.uint8:
                raise TypeError(
                    f"{where} is bytes but the shard dtype is {self.dtype}; pass token arrays "
                    "(np.frombuffer(b, dtype)) or text with a tokenizer="
                )
            return np.frombuffer(item, np.uint8)
        if isinstance(item, (list, tuple)):  # [] is an empty document, not numpy's float64
            item = np.asarray(item) if len(item) else np.empty((0,), self.dtype)
        if isinstance(item, np.ndarray):
            arr = item.reshape(-1)
            if self.tokenizer is not None and arr.dtype.kind in "ui" and arr.size:
                self._check_vocabulary(arr, where)
            if arr.dtype == self.dtype:
                return arr
            if arr.dtype.kind not in "uif" or (arr.dtype.kind == "f" and self.dtype.kind in "ui"):
                raise TypeError(
                    f"{where} has dtype {arr.dtype}, which cannot be stored as {self.dtype} "
                    "without losing information; convert it first or pass dtype="
                )
            if not (self.ids_fit and arr.dtype.kind in "ui" and self.tokenizer is not None):
                check_dtype_range(arr, self.dtype, where)
            with np.errstate(over="ignore"):
                stored = arr.astype(self.dtype)
            check_float_overflow(arr, stored, where)
            if arr.dtype.kind in "ui" and stored.dtype.kind not in "ui" and arr.size:
                _refuse_rounded_integers(arr, stored, where)
            return stored
        raise TypeError(
            f"{where} is a {type(item).__name__}; items must be str, bytes, numpy arrays or "
            "lists of ints"
        )


def _refuse_rounded_integers(values: np.ndarray, stored: np.ndarray, where: Any) -> None:
    """Refuse integers (token ids) that a float dtype stores rounded (70001 as bfloat16 is
    70144): another id, silently."""
    back = stored.astype(np.float64)
    wrong = np.flatnonzero(back != values.astype(np.float64))
    if wrong.size:
        i = int(wrong[0])
        raise ValueError(
            f"{where} holds integers that {stored.dtype} cannot store exactly ({values[i]} "
            f"would be stored as {back[i]:.0f}); pass an integer dtype (e.g. uint32) or a "
            "wider float one"
        )


def _one_token(value: Any, name: str, dtype: np.dtype) -> int | float:
    """``value`` as the Python number of one ``dtype`` token (a NumPy scalar's value), or a
    ``TypeError`` naming ``name`` where it is no number (a bool included)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise TypeError(
            f"write_rox: {name}={value!r} is a {type(value).__name__}, not a token id; pass "
            f"one {dtype} token"
        )
    number = value.item() if isinstance(value, np.generic) else value
    if dtype.kind in "ui" and isinstance(number, float):
        if not number.is_integer():
            raise ValueError(
                f"{name}={number!r} is not a whole number but the tokens are {dtype}: it would "
                f"be stored as {int(number)}; pass {name}= an integer token id"
            )
        number = int(number)
    return number


def separator_token(separator: Any, dtype: np.dtype, tok: Tokenizer | None) -> int | float | None:
    """The one token written after every item (``None``/``False``: none), checked to fit."""
    if separator is None or separator is False:
        return None
    if separator is True or isinstance(separator, np.bool_):
        raise TypeError(
            f"separator={separator!r} is a bool, not a token: pass the token id written after "
            "every item (e.g. the tokenizer's EOS id), or None for none"
        )
    if isinstance(separator, str):
        separator = separator.encode("utf-8")
    if isinstance(separator, (bytes, bytearray)):
        if len(separator) != dtype.itemsize:
            raise ValueError(
                f"separator {bytes(separator)!r} is {len(separator)} bytes but one {dtype} token "
                f"is {dtype.itemsize}: the separator must be exactly one token (a multi-byte "
                "separator would misalign tokens); pass separator= one token id"
            )
        return np.frombuffer(bytes(separator), dtype)[0].item()
    if isinstance(separator, (int, np.integer, float, np.floating)):
        value = _one_token(separator, "separator", dtype)
        check_dtype_range(np.asarray([value]), dtype, f"separator {value!r}")
        if dtype.kind not in "ui":
            with np.errstate(over="ignore"):
                stored = np.asarray([value]).astype(dtype)
            check_float_overflow(np.asarray([value]), stored, "separator")
        if tok is not None and dtype.kind in "ui" and not 0 <= value < tok.vocab_size:
            raise ValueError(
                f"separator={value} is outside the {tok.name} vocabulary (ids 0..{tok.vocab_size - 1}); "
                f"pass one of its ids, or leave separator= unset for its EOS id {tok.eos_id}"
            )
        return value
    raise TypeError(f"separator {separator!r} must be one token id (int) or one token of bytes")
