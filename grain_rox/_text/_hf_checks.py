"""Checks both HuggingFace sources run on their data: missing values (None) anywhere in a
kept column, and data files that a library cannot read (named, with the fix, instead of
pyarrow's or ``datasets``' raw error). Nothing here runs on the happy path except the
null scan, which costs a look at each Arrow chunk's null counts.

>>> import pyarrow as pa
>>> find_nulls(pa.table({"y": [1, 2], "ids": [[1], [2, None]]}), ["y", "ids"])
('ids', 1, True, 1, "None not in r['ids']")
"""

from __future__ import annotations

import codecs
import glob
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np


def read_errors() -> tuple[type[BaseException], ...]:
    """What pyarrow and ``datasets`` raise, without a file name, on a damaged file."""
    import pyarrow as pa

    errors: list[type[BaseException]] = [pa.ArrowException, UnicodeDecodeError, StopIteration]
    try:
        from datasets.exceptions import DatasetGenerationError

        errors.append(DatasetGenerationError)
    except ImportError:  # pragma: no cover - older datasets
        pass
    return tuple(errors)


_FIX = "regenerate it, or leave it out of data_files"


def _file_problem(path: str, kind: str, fix: str = _FIX) -> str | None:
    """What is wrong with one data file, or ``None`` if nothing is found."""
    if os.path.getsize(path) == 0:
        return f"{path} is empty (0 bytes); leave it out of data_files or write its rows again"
    if kind in ("parquet", "arrow"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            if kind == "parquet":
                pq.read_metadata(path)
            else:
                with pa.memory_map(path) as f:
                    try:
                        pa.ipc.open_stream(f).read_all()
                    except pa.ArrowInvalid:
                        f.seek(0)
                        pa.ipc.open_file(f).read_all()
        except (pa.ArrowException, OSError) as e:
            name = "Parquet" if kind == "parquet" else "Arrow"
            return f"{path} is not a readable {name} file ({type(e).__name__}: {e}); {fix}"
        return None
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, blank = 0, True
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            try:
                blank = blank and not decoder.decode(chunk).strip()
            except UnicodeDecodeError as e:
                at = offset + e.start
                return (
                    f"{path} is not UTF-8: byte offset {at} holds 0x{chunk[e.start]:02x}; "
                    "convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                )
            offset += len(chunk)
    if blank:
        return f"{path} holds no records (only whitespace); {fix}"
    return None


def load_saved(path: str) -> Any:
    """``datasets.load_from_disk(path)``; a damaged Arrow file in it is an error naming it."""
    import datasets

    errors: tuple[type[BaseException], ...] = (*read_errors(), OSError)
    try:
        return datasets.load_from_disk(path)
    except IndexError:  # datasets cannot load a dataset saved with no rows (no Arrow file)
        if _saved_without_rows(path):
            raise ValueError(
                f"{path} is a dataset saved with no rows (its state.json lists no data files): "
                "there is nothing to read; leave it out, or save the dataset with its rows"
            ) from None
        raise
    except errors as e:
        if isinstance(e, FileNotFoundError | PermissionError):
            raise
        arrows = sorted(glob.glob(os.path.join(path, "**", "*.arrow"), recursive=True))
        fix = f"save the dataset again (save_to_disk) and load {path} anew"
        raise unreadable(arrows or [path], "arrow", e, fix=fix) from None


def _saved_without_rows(path: str) -> bool:
    """Whether ``path`` (or one of its splits) is a dataset saved with no data files."""
    for state in glob.glob(os.path.join(path, "**", "state.json"), recursive=True):
        try:
            with open(state, encoding="utf-8") as f:
                if json.load(f).get("_data_files") == []:
                    return True
        except (OSError, ValueError, AttributeError):
            continue
    return False


def unreadable(
    files: Sequence[str], kind: str, error: BaseException, *, fix: str = _FIX
) -> ValueError:
    """``error`` (a library's, naming no file) as an error naming the damaged file and the
    fix; every file is looked at only now, on the error path."""
    for path in files:
        problem = _file_problem(path, kind, fix)
        if problem is not None:
            return ValueError(problem)
    detail = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    root, depth = error, 0  # what the library's error wraps (datasets says only "An error
    while (inner := root.__cause__ or root.__context__) is not None and depth < 8:  # occurred")
        root, depth = inner, depth + 1
    if root is not error and str(root) and str(root) not in detail:
        detail += f", from {type(root).__name__}: {str(root)[:300]}"
    return ValueError(
        f"cannot read data files {list(files)} as {kind} ({detail}); check that each is a "
        f"complete {kind} file, and that their columns hold the same types"
    )


def is_number(arrow_type: Any) -> bool:
    import pyarrow as pa

    return bool(
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_boolean(arrow_type)
    )


def _is_list(arrow_type: Any) -> bool:
    import pyarrow as pa

    return bool(
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or pa.types.is_fixed_size_list(arrow_type)
    )


def null_rows(array: Any) -> np.ndarray:
    """Rows of ``array`` (an Arrow array) that are null or hold a null inside their lists or
    structs (an image's or audio's unset ``bytes``/``path`` field is no missing value)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = []
    if array.null_count:
        parts.append(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False)))
    kind = array.type
    if _is_list(kind):
        inner = null_rows(array.flatten())
        if inner.size:
            parts.append(pc.list_parent_indices(array).to_numpy()[inner])
    elif pa.types.is_struct(kind) and {f.name for f in kind} != {"bytes", "path"}:
        parts.extend(null_rows(child) for child in array.flatten())
    if not parts:
        return np.empty(0, np.int64)
    return np.unique(np.concatenate(parts).astype(np.int64))


def _column_nulls(
    table: Any, column: str, remap: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """(rows with a missing value anywhere, rows whose value is itself None) of one column,
    sorted, as dataset rows (after ``remap``, an HF indices mapping)."""
    found, top = [], []
    start = 0
    for chunk in table.column(column).chunks:
        rows = null_rows(chunk)
        if rows.size:
            found.append(rows + start)
            if chunk.null_count:
                mask = chunk.is_null().to_numpy(zero_copy_only=False)
                top.append(np.flatnonzero(mask) + start)
        start += len(chunk)
    empty = np.empty(0, np.int64)
    if not found:
        return empty, empty
    rows = np.concatenate(found)
    tops = np.concatenate(top) if top else empty
    if remap is not None:
        rows, tops = np.flatnonzero(np.isin(remap, rows)), np.flatnonzero(np.isin(remap, tops))
    return rows, tops


def rows_with_nulls(table: Any, columns: Sequence[str], remap: np.ndarray | None) -> np.ndarray:
    """Sorted dataset rows with a missing value in any of ``columns``."""
    parts = [_column_nulls(table, c, remap)[0] for c in columns]
    return np.unique(np.concatenate(parts)) if parts else np.empty(0, np.int64)


def find_nulls(
    table: Any, columns: Sequence[str], remap: np.ndarray | None = None
) -> tuple[str, int, bool, int, str] | None:
    """The first kept column with missing values: ``(column, first row, inside a list or
    struct?, rows affected, a filter predicate that drops them)``, rows counted after
    ``remap`` (an HF indices mapping)."""
    for column in columns:
        rows, tops = _column_nulls(table, column, remap)
        if rows.size:
            first = int(rows[0])
            keep = [f"r[{column!r}] is not None"] if tops.size else []
            if rows.size > tops.size:
                keep.append(f"None not in r[{column!r}]")
            inside = not bool(np.isin(first, tops))
            return column, first, inside, int(rows.size), " and ".join(keep)
    return None


def null_problem(column: str, row: int, inside: bool, count: str) -> str:
    """What both HF sources say of a missing value: where it is and why it is an error."""
    where = f"inside row {row} (an element of its value)" if inside else f"in row {row}"
    return (
        f"column {column!r} has a missing value (None) {where} ({count}); grain_rox serves "
        "no stand-in for it (a null text would be tokenized as 'None', a null number read "
        "as NaN)"
    )


NULLS = ("error", "skip")


def check_nulls_arg(nulls: Any) -> str:
    """``nulls`` if it is ``"error"`` or ``"skip"``, else an error naming the choices."""
    if nulls not in NULLS:
        raise ValueError(
            f"nulls={nulls!r} is not one of {NULLS}: 'error' (default) stops at a missing "
            "value, 'skip' leaves its rows out and counts them"
        )
    return str(nulls)


def python_null(value: Any) -> bool | None:
    """``None`` if ``value`` (a streamed row's Python value) holds no ``None``, else whether
    the ``None`` is inside it (``True``) or is the value itself (``False``)."""
    if value is None:
        return False
    if isinstance(value, dict) and set(value) != {"bytes", "path"}:  # not an image or audio
        value = list(value.values())
    if isinstance(value, list | tuple) and any(python_null(v) is not None for v in value):
        return True
    return None


def without_nulls(array: Any) -> Any:
    """``array`` with its nulls (at every list level) as zeros and empty lists, so that its
    dtype stays; only for tables whose null rows are never served (filtered out)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = array.type
    if is_number(kind):
        return pc.fill_null(array, pa.scalar(0).cast(kind)) if array.null_count else array
    if pa.types.is_fixed_size_list(kind):  # every row keeps its slots, a null row's too
        size = kind.list_size
        slots = array.values.slice(array.offset * size, len(array) * size)
        return pa.FixedSizeListArray.from_arrays(without_nulls(slots), size)
    large = pa.types.is_large_list(kind)
    if not (pa.types.is_list(kind) or large):
        return array
    lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
    offsets = pa.array(
        np.concatenate([[0], np.cumsum(lengths)]), pa.int64() if large else pa.int32()
    )
    cls = pa.LargeListArray if large else pa.ListArray
    return cls.from_arrays(offsets, without_nulls(array.flatten()))
