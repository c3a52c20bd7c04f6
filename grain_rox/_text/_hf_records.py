"""What both HuggingFace sources share: local files only, column filters, numpy records.

A record is a dict of numpy arrays: numbers and lists become arrays, images (``datasets``
decodes them to PIL) become ``uint8`` arrays, nested features become nested dicts, and
strings are kept (``np.str_``) or, for the columns named in ``tokenize``, turned into
``int32`` token ids with an offline tokenizer (EOS appended, so documents stay apart when
packed).
"""

from __future__ import annotations

import datetime
import glob
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from grain_rox._text._hf_checks import (
    is_number,
    null_rows,
    read_errors,
    unreadable,
    without_nulls,
)
from grain_rox._text._lost_nuls import is_text_type
from grain_rox._text._tokenizer_base import tokenizer_label

_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".json": "json", ".jsonl": "json",
            ".arrow": "arrow"}  # fmt: skip


def hf_datasets() -> Any:
    """The ``datasets`` module, or an ImportError that names the extra to install."""
    try:
        import datasets
    except ImportError:
        raise ImportError(
            "HuggingFace sources need the datasets package: pip install 'grain_rox[hf]'"
        ) from None
    return datasets


def file_kind(files: Sequence[str]) -> str:
    """The one format of ``files`` (parquet, json or arrow); errors name the bad files."""
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        raise FileNotFoundError(
            f"data files not found: {missing}; grain_rox reads local files only (never the Hub)"
        )
    kinds = {_FORMATS.get(os.path.splitext(f)[1].lower()) for f in files}
    if len(kinds) != 1 or None in kinds:
        raise ValueError(
            f"data files {list(files)} must all be .parquet, .json/.jsonl or .arrow (one kind)"
        )
    return str(kinds.pop())


def kept_columns(
    columns: Sequence[str], include: Sequence[str] | None, exclude: Sequence[str] | None
) -> list[str]:
    """``columns`` filtered by include/exclude keys; unknown keys are errors."""
    for name, keys in (("include_keys", include), ("exclude_keys", exclude)):
        unknown = sorted(set(keys or ()) - set(columns))
        if unknown:
            raise ValueError(f"{name} names missing columns {unknown}; columns: {list(columns)}")
    keep = [c for c in columns if (include is None or c in include) and c not in set(exclude or ())]
    if not keep:
        raise ValueError(f"no column left after include/exclude keys; columns: {list(columns)}")
    return keep


def literal_files(files: Sequence[str]) -> list[str]:
    """``files`` as ``datasets`` patterns that match each file alone: ``datasets`` reads every
    ``data_files`` entry as a glob, so ``data[1].parquet`` read ``data1.parquet`` and ``a*.jsonl``
    every ``a...jsonl`` beside it, silently.

    >>> literal_files(["data[1].parquet", "a*.jsonl"])
    ['data[[]1].parquet', 'a[*].jsonl']
    """
    return [glob.escape(str(f)) for f in files]


def load_files(files: Sequence[str]) -> Any:
    """One ``datasets.Dataset`` over local Parquet, JSON or Arrow files; an unreadable file
    is an error naming it (see :func:`unreadable`)."""
    datasets = hf_datasets()
    kind = file_kind(files)
    try:
        if kind == "arrow":
            parts = [datasets.Dataset.from_file(f) for f in files]
            return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
        dataset = datasets.load_dataset(kind, data_files=literal_files(files), split="train")
        if kind == "json":  # HF's JSON reader stores bytes that are not UTF-8 as they are
            dataset.data.table.validate(full=True)
        return dataset
    except read_errors() as e:
        raise unreadable(files, kind, e) from None


def to_numpy(value: Any, dtypes: Any = None) -> Any:
    """A value from a numpy-formatted dataset or a stream as arrays (nested dicts stay dicts),
    its numbers in ``dtypes`` where given (from :func:`number_dtypes`), made straight in them:
    exact, as the numbers were stored so (``np.asarray`` alone makes Python's ``[2**64 - 1,
    1]`` float64, ``[2**64, 1]``).

    >>> out = to_numpy({"a": [2**64 - 1, 1], "s": "x"}, {"a": np.dtype("uint64")})
    >>> out["a"].tolist(), out["a"].dtype.name, str(out["s"])
    ([18446744073709551615, 1], 'uint64', 'x')
    """
    if isinstance(value, dict):
        inner = dtypes if isinstance(dtypes, dict) else {}
        return {k: to_numpy(v, inner.get(k)) for k, v in value.items()}
    if isinstance(dtypes, np.dtype) and dtypes.kind == "M":
        value = _utc(value)
    if isinstance(dtypes, np.dtype) and dtypes.kind == "m":
        value = _timedeltas(value)
    return np.asarray(value, dtype=dtypes if isinstance(dtypes, np.dtype) else None)


def _timedeltas(value: Any) -> Any:
    """``value`` with every pandas ``Timedelta`` (at any list depth) as numpy's, nanoseconds
    kept (numpy reads one as a ``datetime.timedelta``, to the microsecond)."""
    if isinstance(value, list | tuple):
        return [_timedeltas(v) for v in value]
    return value.to_timedelta64() if hasattr(value, "to_timedelta64") else value


def _utc(value: Any) -> Any:
    """``value`` with every time-zone-aware datetime (at any list depth) as the naive UTC
    instant: what Arrow stores and the eager source serves (numpy's datetimes have no zone)."""
    if isinstance(value, list | tuple):
        return [_utc(v) for v in value]
    if hasattr(value, "to_datetime64"):  # a pandas Timestamp (ns columns): its nanoseconds,
        return (value.tz_convert(None) if value.tzinfo else value).to_datetime64()  # kept
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return value.astimezone(datetime.UTC).replace(tzinfo=None)
    return value


def _is_text(value: Any) -> bool:
    if isinstance(value, str):
        return True
    return isinstance(value, np.ndarray) and value.dtype.kind in "US" and value.ndim == 0


class RecordFormat:
    """Turns numpy-formatted rows into records; tokenizes the ``tokenize`` columns.

    >>> fmt = RecordFormat(columns=["t", "y"], tokenize=["t"], tokenizer="bytes")
    >>> rec = fmt.rows({"t": np.array(["hi"]), "y": np.array([7])}, 1)[0]
    >>> rec["t"].tolist(), rec["t"].dtype.name, int(rec["y"])
    ([104, 105, 256], 'int32', 7)
    """

    def __init__(
        self,
        *,
        columns: Sequence[str],
        tokenize: Sequence[str] | None = None,
        tokenizer: Any = None,
        append_eos: bool = True,
        dtypes: dict[str, Any] | None = None,
    ) -> None:
        self.tokenize = list(tokenize or ())
        # column -> the dtype of its numbers as Arrow stores them (see arrow_dtypes)
        self.dtypes = {k: v for k, v in (dtypes or {}).items() if k not in self.tokenize}
        unknown = sorted(set(self.tokenize) - set(columns))
        if unknown:
            raise ValueError(f"tokenize names columns {unknown} that are not kept: {list(columns)}")
        if self.tokenize and tokenizer is None:
            raise ValueError(
                f"tokenize={self.tokenize} needs a tokenizer: tokenizer='cl100k_base', 'bytes' "
                "or a path to a tokenizer.json"
            )
        if tokenizer is not None and not self.tokenize:
            raise ValueError("a tokenizer was given but no column to tokenize: pass tokenize=[...]")
        if tokenizer is not None:
            from grain_rox._text._tokenizers import get_tokenizer

            tokenizer = get_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self.append_eos = bool(append_eos)

    def describe(self) -> dict[str, Any]:
        """What the records depend on besides the data (for reprs and restore checks): the
        tokenizer by content and EOS id (see :func:`tokenizer_label`), not by name alone.

        >>> RecordFormat(columns=["t"], tokenize=["t"], tokenizer="bytes").describe()
        {'tokenize': ['t'], 'tokenizer': 'bytes identity:3d74760d3fc76651 eos=256', 'eos': True}
        """
        if not self.tokenize:
            return {}
        return {
            "tokenize": self.tokenize,
            "tokenizer": tokenizer_label(self.tokenizer),
            "eos": self.append_eos,
        }

    def encode(self, column: str, texts: Sequence[Any]) -> list[np.ndarray]:
        """Token ids (``int32``, EOS appended unless disabled) of ``column``'s texts."""
        bad = next((t for t in texts if not _is_text(t)), None)
        if bad is not None:
            raise ValueError(
                f"column {column!r} holds {type(bad).__name__}, not text: cannot tokenize"
            )
        ids = self.tokenizer.encode_batch([str(t) for t in texts])
        tail = [self.tokenizer.eos_id] if self.append_eos else []
        return [np.asarray([*row.tolist(), *tail], dtype=np.int32) for row in ids]

    def numbers(self, key: str, values: Any) -> Any:
        """Column ``key`` of a numpy-formatted batch with its numbers in their Arrow dtypes
        (see :func:`to_numpy`): one array, or one value per row (other shapes, dicts)."""
        dtypes = self.dtypes.get(key)
        if dtypes is None:
            return values
        if isinstance(values, np.ndarray) and values.dtype != object:
            return values.astype(dtypes, copy=False) if isinstance(dtypes, np.dtype) else values
        return [to_numpy(v, dtypes) for v in values]

    def rows(self, columns: dict[str, Any], count: int) -> list[dict[str, Any]]:
        """``count`` records from a numpy-formatted batch (``ds[list_of_indices]``)."""
        per_column: dict[str, list[Any]] = {}
        for key, value in columns.items():
            items = list(value) if isinstance(value, np.ndarray) and value.dtype == object else None
            if key in self.tokenize:
                per_column[key] = self.encode(key, items if items is not None else list(value))
                continue
            value = self.numbers(key, value)
            if isinstance(value, list):
                per_column[key] = value
            elif items is not None:
                per_column[key] = [to_numpy(v) for v in items]
            else:
                per_column[key] = [np.asarray(value[j]) for j in range(count)]
        return [{k: v[j] for k, v in per_column.items()} for j in range(count)]

    def row(self, record: dict[str, Any]) -> dict[str, Any]:
        """One record from one numpy-formatted (or plain) row; nested lists of different
        lengths are an error naming the column and the fix (numpy's says neither)."""
        out = {}
        for key, value in record.items():
            if key in self.tokenize:
                out[key] = self.encode(key, [value])[0]
                continue
            try:
                out[key] = to_numpy(value, self.dtypes.get(key))
            except ValueError as e:
                if "inhomogeneous" not in str(e):
                    raise
                raise ValueError(
                    f"column {key!r}: a row holds nested lists of different lengths, which make "
                    f"no array; {_ragged_fix(key)}"
                ) from None
        return out


def stack_column(key: str, values: Any, indices: Sequence[int]) -> Any:
    """Rows of one column as one array (nested dicts: one array per leaf), or a clear error."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        if values.dtype.kind in "US":
            raise ValueError(_not_numbers(key, values.reshape(-1)[:1]))
        return values
    items = list(values)
    if items and all(isinstance(v, dict) for v in items):
        return {k: stack_column(f"{key}.{k}", [v[k] for v in items], indices) for k in items[0]}
    arrays = [np.asarray(v) for v in items]
    bad = next((a for a in arrays if a.dtype.kind in "USO"), None)
    if bad is not None:  # (an array's truth is ambiguous: "if bad" raised numpy's error)
        raise ValueError(_not_numbers(key, bad))
    shapes = [a.shape for a in arrays]
    if len(set(shapes)) > 1:
        first = shapes[0]
        rows = [int(indices[j]) for j, s in enumerate(shapes) if s != first][:5]
        raise ValueError(
            f"column {key!r} is ragged: row {int(indices[0])} has shape {first} but rows {rows} "
            "differ; pack or pad it (grain_rox.pack_documents) or exclude it"
        )
    return np.stack(arrays)


def _not_numbers(key: str, values: np.ndarray) -> str:
    """Why column ``key`` cannot be stacked, from some of its ``values``: text (tokenize it),
    bytes or other objects (decimals, times, lists of structs: leave it out or cast it).

    >>> _not_numbers("d", np.asarray([b"x"]))[:48]
    "column 'd' holds bytes, not numbers, so it canno"
    """
    sample = values.reshape(-1)[0] if values.size else None
    if values.dtype.kind == "U" or isinstance(sample, str):
        return (
            f"column {key!r} holds text, not numbers, so it cannot be an array; tokenize it "
            f"(tokenize=[{key!r}], tokenizer='cl100k_base') or leave it out "
            f"(exclude_keys=[{key!r}])"
        )
    what = "bytes" if values.dtype.kind == "S" or isinstance(sample, bytes) else (
        f"{type(sample).__name__} values"
    )  # fmt: skip
    return (
        f"column {key!r} holds {what}, not numbers, so it cannot be an array; leave it out "
        f"(exclude_keys=[{key!r}]) or cast it to numbers first (e.g. dataset.cast_column)"
    )


def _innermost(arrow_type: Any) -> Any:
    """The value type under every list level of ``arrow_type``."""
    import pyarrow as pa

    while (
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or pa.types.is_fixed_size_list(arrow_type)
    ):
        arrow_type = arrow_type.value_type
    return arrow_type


def arrow_numeric(arrow_type: Any) -> bool:
    """Whether a column of this Arrow type is numbers or (nested) lists of numbers: such
    columns are read straight from Arrow (dtype kept), not through ``datasets``' formatter."""
    return is_number(_innermost(arrow_type))


def _flatten_uniform(array: Any) -> tuple[Any, list[int]] | None:
    """(innermost values, shape after the row axis) if every list level has one length."""
    shape: list[int] = []
    while not is_number(array.type):
        lengths = array.value_lengths().to_numpy(zero_copy_only=False)
        if lengths.size and (lengths != lengths[0]).any():
            return None
        shape.append(int(lengths[0]) if lengths.size else 0)
        array = array.flatten()
    return array, shape


def _differing_lengths(row: Any) -> tuple[int, list[int]]:
    """(depth, lengths) of the first list level of ``row`` (an Arrow array of one row) whose
    lists differ in length; depth 1 is the row's inner lists."""
    depth = 0
    while not is_number(row.type):
        lengths = row.value_lengths().to_numpy(zero_copy_only=False)
        if lengths.size and (lengths != lengths[0]).any():
            return depth, lengths.tolist()
        depth += 1
        row = row.flatten()
    return depth, []


def _ragged_row_problem(key: str, index: int, row: Any) -> str:
    """Why row ``index`` of column ``key`` (``row``: its one-row Arrow array) makes no array:
    the lengths its nested lists have, and the two ways out.

    >>> import pyarrow as pa
    >>> _ragged_row_problem("sents", 4, pa.array([[[1, 2], [3]]]))
    "column 'sents': row 4 holds inner lists of different lengths [2, 1], which make no array; pad them to one length first (dataset.map) or leave the column out (exclude_keys=['sents'])"
    """
    depth, lengths = _differing_lengths(row)
    where = "inner lists" if depth == 1 else f"lists {depth} levels down"
    shown = ", ".join(str(n) for n in lengths[:8]) + (", ..." if len(lengths) > 8 else "")
    return (
        f"column {key!r}: row {index} holds {where} of different lengths [{shown}], which make "
        f"no array; {_ragged_fix(key)}"
    )


def _ragged_fix(key: str) -> str:
    """The two ways out of a column whose nested lists differ in length."""
    return (
        "pad them to one length first (dataset.map) or leave the column out "
        f"(exclude_keys=[{key!r}])"
    )


class ArrowColumn:
    """One numeric (list) column of a memory-mapped Arrow table, read with numpy.

    Each chunk whose lists all have one length is a zero-copy ``(rows, *shape)`` view, so a
    batch is one fancy-index gather per chunk it touches (no Arrow ``take``, which on a
    chunked list column concatenates the chunks first); a chunk of variable-length lists keeps
    its offsets and values, so a row is a slice. Nothing is copied until rows are read.
    """

    def __init__(self, column: Any, key: str, remap: np.ndarray | None = None) -> None:
        import pyarrow as pa

        self.key = key
        self.remap = remap  # dataset row -> table row (an HF indices mapping), or None
        self.starts = np.cumsum([0, *(len(c) for c in column.chunks)]).tolist()
        self.views: list[np.ndarray | None] = []
        self.ragged: list[tuple[np.ndarray, Any] | None] = []
        for chunk in column.chunks:
            if null_rows(chunk).size:  # in rows a filter left out: HFEagerSource checked
                chunk = without_nulls(chunk)
            flat = _flatten_uniform(chunk)
            if flat is not None:
                values, shape = flat
                view = values.to_numpy(zero_copy_only=False).reshape(len(chunk), *shape)
                self.views.append(view)
                self.ragged.append(None)
            else:
                self.views.append(None)
                if pa.types.is_fixed_size_list(chunk.type):  # (no offsets of its own)
                    chunk = chunk.cast(pa.list_(chunk.type.value_type))
                inner = pa.types.is_list(chunk.type) and is_number(chunk.type.value_type)
                offsets = chunk.offsets.to_numpy()
                values = chunk.values.to_numpy(zero_copy_only=False) if inner else chunk
                self.ragged.append((offsets, values))

    def _split(self, rows: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """(chunk, positions in ``rows``, rows within the chunk) for each chunk touched."""
        if self.remap is not None:
            rows = self.remap[rows]
        chunk_of = np.searchsorted(self.starts, rows, side="right") - 1
        parts = []
        for c in np.unique(chunk_of).tolist():
            where = np.flatnonzero(chunk_of == c)
            parts.append((c, where, rows[where] - self.starts[c]))
        return parts

    def row(self, chunk: int, i: int, index: int) -> np.ndarray:
        """Row ``i`` of chunk ``chunk`` (row ``index`` of the dataset, named in errors)."""
        view = self.views[chunk]
        if view is not None:
            return np.array(view[i])
        ragged = self.ragged[chunk]
        assert ragged is not None
        offsets, values = ragged
        if isinstance(values, np.ndarray):
            return values[offsets[i] : offsets[i + 1]].copy()
        flat = _flatten_uniform(values.slice(i, 1))  # nested lists, uniform inside the row
        if flat is None:
            raise ValueError(_ragged_row_problem(self.key, index, values.slice(i, 1)))
        inner, shape = flat
        return inner.to_numpy(zero_copy_only=False).reshape(shape)

    def rows(self, rows: Sequence[int]) -> list[np.ndarray]:
        """One array per row (rows may differ in length)."""
        index = np.asarray(rows, dtype=np.int64)
        out: list[np.ndarray] = [np.empty(0)] * index.size
        for c, where, local in self._split(index):
            for w, i in zip(where.tolist(), local.tolist(), strict=True):
                out[w] = self.row(c, i, int(index[w]))
        return out

    def stack(self, rows: Sequence[int]) -> np.ndarray:
        """The rows as one array ``(len(rows), *shape)``; ragged rows are an error naming them."""
        index = np.asarray(rows, dtype=np.int64)
        parts = self._split(index)
        if all(self.views[c] is not None for c, _, _ in parts):
            shapes = {self.views[c].shape[1:] for c, _, _ in parts}  # type: ignore[union-attr]
            if len(shapes) == 1:
                first = self.views[parts[0][0]]
                assert first is not None
                out = np.empty((index.size, *first.shape[1:]), first.dtype)
                for c, where, local in parts:
                    out[where] = self.views[c][local]  # type: ignore[index]
                return out
        return stack_column(self.key, self.rows(rows), index.tolist())


def refuse_untyped_lists(
    schema: Any, columns: Sequence[str], where: str, *, typing: str | None = None
) -> None:
    """Refuse a kept column holding Arrow ``list<null>`` (at any list depth, also in a struct
    field): lists that are all empty or hold only None (``Dataset.from_dict({"tokens": [[],
    []]})``) carry no element type, and numpy would make them object (eager) or float64
    (streamed) arrays that a packer, a tokenizer or a model then refuses with an error about
    object or float data. ``typing``: how to give the column its type, where a dataset's
    ``cast_column`` does not apply (a stream's files)."""
    found = _first_inside(schema, columns, _untyped_list)
    if found is not None:
        key, fields, arrow_type = found
        what = f" a field {'.'.join((key, *fields))!r} of" if fields else ""
        if typing is None and fields:  # cast the whole column, that field typed in it
            at = "".join(f"[{name!r}]" for name in fields)
            typing = (
                f"e.g. features = dataset.features.copy(); features[{key!r}]{at} = "
                "datasets.Sequence(datasets.Value('int32')); dataset = dataset.cast(features) "
                "(write files with that schema)"
            )
        typing = typing or (
            f"e.g. dataset = dataset.cast_column({key!r}, "
            "datasets.Sequence(datasets.Value('int32'))) (write files with that schema)"
        )
        raise ValueError(
            f"{where}: column {key!r} has{what} Arrow type {arrow_type}: every list in "
            "it is empty or holds only None, so its elements have no type (an empty list is "
            "typed only by other rows' values) and no dtype to serve them in. Give the column "
            f"its type, {typing}, or leave the column out (exclude_keys=[{key!r}])"
        )


def _nanosecond_time(arrow_type: Any) -> bool:
    """Whether ``arrow_type`` is ``time64[ns]`` (or lists of it)."""
    import pyarrow as pa

    inner = _innermost(arrow_type)
    return bool(pa.types.is_time64(inner) and inner.unit == "ns")


def refuse_nanosecond_times(schema: Any, columns: Sequence[str], where: str) -> None:
    """Refuse a kept column holding Arrow ``time64[ns]`` (a time of day in nanoseconds, also
    in lists and struct fields): a stream's rows arrive as Python ``datetime.time``, which
    keeps microseconds, so the nanoseconds were dropped without a word (and the eager
    source's numpy formatter raised Arrow's bare "Value 1 has non-zero nanoseconds").

    >>> import pyarrow as pa
    >>> refuse_nanosecond_times(pa.schema([("t", pa.time64("ns"))]), ["t"], "HFEagerSource")
    Traceback (most recent call last):
    ...
    ValueError: HFEagerSource: column 't' holds times of day in nanoseconds (time64[ns]), which neither source serves exactly (a stream's rows hold Python times, to the microsecond); cast it to int64 nanoseconds or to time64[us] first (dataset.cast_column / the files' schema), or leave the column out (exclude_keys=['t'])
    """
    found = _first_inside(schema, columns, _nanosecond_time)
    if found is not None:
        key, fields, _ = found
        what = f" (in its field {'.'.join(fields)})" if fields else ""
        raise ValueError(
            f"{where}: column {key!r}{what} holds times of day in nanoseconds "
            "(time64[ns]), which neither source serves exactly (a stream's rows hold Python "
            "times, to the microsecond); cast it to int64 nanoseconds or to time64[us] first "
            "(dataset.cast_column / the files' schema), or leave the column out "
            f"(exclude_keys=[{key!r}])"
        )


def _untyped_list(arrow_type: Any) -> bool:
    """Whether ``arrow_type`` is a ``list<null>`` (at any list depth; a plain null column is
    every value missing, which the readers name as such)."""
    import pyarrow as pa

    return bool(pa.types.is_null(_innermost(arrow_type)) and not pa.types.is_null(arrow_type))


def _first_inside(
    schema: Any, columns: Sequence[str], matches: Callable[[Any], bool]
) -> tuple[str, tuple[str, ...], Any] | None:
    """``(column, struct fields down to it, type)`` of the first type in a kept column that
    ``matches`` (the column's own, or a struct field's at any list depth), or None."""
    for field in schema:
        if field.name in columns:
            found = _inside(field.type, matches)
            if found is not None:
                return (field.name, *found)
    return None


def _inside(arrow_type: Any, matches: Callable[[Any], bool]) -> tuple[tuple[str, ...], Any] | None:
    """``(struct fields down to it, type)`` of the first type in ``arrow_type`` (unwrapped of
    ``datasets``' extension types) that ``matches``, or None."""
    import pyarrow as pa

    if isinstance(arrow_type, pa.ExtensionType):
        arrow_type = arrow_type.storage_type
    if matches(arrow_type):
        return (), arrow_type
    inner = _innermost(arrow_type)
    if pa.types.is_struct(inner):
        for field in inner:
            found = _inside(field.type, matches)
            if found is not None:
                return (field.name, *found[0]), found[1]
    return None


def number_dtypes(arrow_type: Any) -> Any:
    """The numpy dtype of the numbers in values of this Arrow type: one dtype for numbers,
    (nested) lists of them and ``datasets``' ``Array2D``..``Array5D``; a dict for a struct
    (its fields that hold numbers); ``None`` for none (text, images, lists of structs).

    Also the dtype the eager source's values of two other types have, so that a streamed
    value (a Python one) is served the same: ``datetime64[unit]`` for a timestamp (the
    instant in UTC: numpy's datetimes have no time zone) and ``datetime64[D]`` for a date
    (also in lists), and ``object`` for (nested) lists of strings or of bytes (a single string
    is numpy text in both)."""
    import pyarrow as pa

    if isinstance(arrow_type, pa.ExtensionType):  # datasets' ArrayXD: lists in storage
        arrow_type = arrow_type.storage_type
    if arrow_numeric(arrow_type):
        return np.dtype(_innermost(arrow_type).to_pandas_dtype())
    inner = _innermost(arrow_type)
    if pa.types.is_timestamp(inner):  # (in lists too)
        return np.dtype(f"datetime64[{inner.unit}]")
    if pa.types.is_date32(inner):
        return np.dtype("datetime64[D]")
    if pa.types.is_date64(inner):  # milliseconds, as the eager source serves them
        return np.dtype("datetime64[ms]")
    if pa.types.is_duration(inner):
        return np.dtype(f"timedelta64[{inner.unit}]")
    lists = pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list
    if any(is_list(arrow_type) for is_list in lists) and is_text_type(inner):
        return np.dtype(object)
    if pa.types.is_struct(arrow_type) and {f.name for f in arrow_type} != {"bytes", "path"}:
        fields = {f.name: number_dtypes(f.type) for f in arrow_type}
        return {k: v for k, v in fields.items() if v is not None} or None
    return None


def arrow_dtypes(schema: Any) -> dict[str, Any]:
    """The dtypes of each column's numbers (see :func:`number_dtypes`), for values that
    arrive as Python or ``datasets``-formatted ones (a stream, structs, ``Array2D``): the
    dtypes the eager source reads from Arrow."""
    found = {field.name: number_dtypes(field.type) for field in schema}
    return {k: v for k, v in found.items() if v is not None}
