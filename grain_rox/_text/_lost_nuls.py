"""Text and bytes values that numpy would serve without their trailing NULs.

Numpy's fixed-width text and bytes (``<U``, ``S``) end a value at its first trailing NUL:
``np.asarray("ab\\x00")`` holds ``"ab"``. Both HuggingFace sources serve a text or bytes
value (a column's, a struct field's, a nested list's) as such an array, so a value ending in
NULs would reach the user shorter than it is stored, without a word. These checks find such
values where they are served, so that the sources refuse them, naming the column, the row
and the fix; values served as objects (a list of strings) keep their NULs and pass.

>>> import numpy as np
>>> lost_nul("ab\\x00", np.asarray("ab\\x00"))
((), 'ab\\x00')
>>> lost_nul({"s": b"x\\x00", "n": 1}, {"s": np.asarray(b"x\\x00"), "n": np.asarray(1)})
(('s',), b'x\\x00')
>>> lost_nul(["p\\x00"], np.asarray(["p\\x00"], dtype=object)) is None  # objects keep NULs
True
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from typing import Any

import numpy as np

_NULS = ("\x00", b"\x00")


def _nul_ended(value: Any) -> str | bytes | None:
    """The first text or bytes value in ``value`` (at any list depth) ending in a NUL."""
    if isinstance(value, str):
        return value if value.endswith("\x00") else None
    if isinstance(value, bytes):
        return value if value.endswith(b"\x00") else None
    if isinstance(value, list | tuple):
        for item in value:
            found = _nul_ended(item)
            if found is not None:
                return found
    return None


def lost_nul(original: Any, served: Any) -> tuple[tuple[str, ...], str | bytes] | None:
    """Where ``served`` (a value's numpy form) lost trailing NULs of ``original`` (the value
    as Python holds it): the struct field path and the whole value, or ``None``. Elements of
    an ``object`` array are Python objects or numpy scalars, which keep their NULs; only the
    arrays among them are looked into."""
    if isinstance(served, dict):
        if not isinstance(original, Mapping):
            return None
        for key, inner in served.items():
            found = lost_nul(original.get(key), inner)
            if found is not None:
                return (key, *found[0]), found[1]
        return None
    if not isinstance(served, np.ndarray):
        return None
    if served.dtype.kind in "US":
        value = _nul_ended(original)
        return None if value is None else ((), value)
    listed = isinstance(original, list | tuple) and served.dtype == object and served.ndim == 1
    if listed and len(original) == served.shape[0]:
        for inner_original, inner in zip(original, served, strict=True):
            if isinstance(inner, np.ndarray):
                found = lost_nul(inner_original, inner)
                if found is not None:
                    return found
    return None


def is_text_type(kind: Any) -> bool:
    """Whether Arrow type ``kind`` holds text or bytes (of any layout: offsets, views, a
    fixed width)."""
    import pyarrow as pa

    views = (getattr(pa.types, "is_string_view", None), getattr(pa.types, "is_binary_view", None))
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
        or any(is_view is not None and is_view(kind) for is_view in views)
    )


def may_lose_nuls(kind: Any) -> bool:
    """Whether values of Arrow type ``kind`` hold text or bytes that numpy serves fixed-width
    (a column's value, a struct field's, a fixed-size list's or ``Array2D``'s elements): not
    those under a variable-length list, which both sources serve as objects.

    >>> import pyarrow as pa
    >>> [may_lose_nuls(t) for t in (pa.string(), pa.struct([("u", pa.binary())]),
    ...  pa.list_(pa.string()), pa.int32())]
    [True, True, False, False]
    """
    import pyarrow as pa

    if isinstance(kind, pa.ExtensionType):
        kind = kind.storage_type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_struct(kind):
        return any(may_lose_nuls(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_fixed_size_list(kind):
        return may_lose_nuls(kind.value_type)
    return is_text_type(kind)


def _leaves(array: Any, per_row: int = 1) -> list[tuple[Any, int]]:
    """The text and bytes arrays inside one Arrow ``array`` that numpy serves fixed-width
    (see :func:`may_lose_nuls`), each with its values per row of ``array``: plain string or
    binary arrays (views, dictionaries and fixed widths decoded into them: a copy)."""
    import pyarrow as pa

    kind = array.type
    if isinstance(kind, pa.ExtensionType):
        array, kind = array.storage, array.storage.type
    if pa.types.is_dictionary(kind):
        array = array.dictionary_decode()
        kind = array.type
    if pa.types.is_struct(kind):
        return [leaf for i in range(kind.num_fields) for leaf in _leaves(array.field(i), per_row)]
    if pa.types.is_fixed_size_list(kind):  # its values, a null row's slots kept (flatten
        size = kind.list_size  # drops them, and the rows after it would be misread)
        values = array.values.slice(array.offset * size, len(array) * size)
        return _leaves(values, per_row * size)
    if not is_text_type(kind):
        return []
    plain = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary)
    if not any(is_plain(kind) for is_plain in (*plain, pa.types.is_large_binary)):
        array = array.cast(pa.large_binary())  # views and fixed widths: into offsets and bytes
    return [(array, per_row)]


class NulEndedRows:
    """Which rows of one Arrow column hold a value that numpy would serve without trailing
    NULs, read from the column's maps: each served text or bytes value's end offset and last
    byte (a few Python reads a value, nothing copied; HF's chunks of 1,000 rows made a numpy
    pass per chunk cost more than the rows).

    >>> import pyarrow as pa
    >>> rows = NulEndedRows(pa.chunked_array([["a", "b\\x00"], ["", "c"]]))
    >>> rows.any([0, 2, 3]), rows.any([3, 1])
    (False, True)
    """

    def __init__(self, column: Any) -> None:
        import pyarrow as pa

        self.starts = np.cumsum([0, *(len(c) for c in column.chunks)]).tolist()
        # per chunk, per leaf: (its end offsets, its bytes, its first offset, values a row)
        self.leaves: list[list[tuple[memoryview, memoryview, int, int]]] = []
        for chunk in column.chunks:
            readers = []
            for leaf, per_row in _leaves(chunk):
                _, offsets, data = leaf.buffers()[:3]
                large = pa.types.is_large_string(leaf.type) or pa.types.is_large_binary(leaf.type)
                ends = memoryview(offsets).cast("q" if large else "i")
                last = memoryview(data).cast("B") if data is not None else memoryview(b"")
                readers.append((ends, last, leaf.offset, per_row))
            self.leaves.append(readers)

    def any(self, rows: Any) -> bool:
        """Whether a value of table rows ``rows`` ends in a NUL where numpy would drop it."""
        for row in np.asarray(rows, dtype=np.int64).tolist():
            c = bisect.bisect_right(self.starts, row) - 1
            for ends, last, first, per_row in self.leaves[c]:
                at = (row - self.starts[c]) * per_row + first
                for i in range(at, at + per_row):
                    stop = ends[i + 1]
                    if stop > ends[i] and last[stop - 1] == 0:
                        return True
        return False


def lost_nul_problem(column: str, fields: tuple[str, ...], where: str, value: str | bytes) -> str:
    """What both HF sources say of a value numpy would serve without its trailing NULs.

    >>> print(lost_nul_problem("t", (), "row 3", "ab\\x00"))
    column 't' holds text ending in a NUL character in row 3 ('ab\\x00'), which numpy's fixed-width text would serve without its trailing NULs ('ab'); grain_rox serves a value whole or refuses it
    """
    what = "text" if isinstance(value, str) else "bytes"
    nul = "a NUL character" if isinstance(value, str) else "a NUL byte"
    shown = repr(value) if len(value) <= 60 else repr(value[-60:]) + " (its last 60)"
    trimmed = value.rstrip(_NULS[isinstance(value, bytes)])  # type: ignore[arg-type]
    path = "".join(f"[{f!r}]" for f in fields)
    field = f" (in its field {path})" if fields else ""
    cut = f" ({trimmed!r})" if len(value) <= 60 else ""
    return (
        f"column {column!r}{field} holds {what} ending in {nul} in {where} ({shown}), which "
        f"numpy's fixed-width {what} would serve without its trailing NULs{cut}; grain_rox "
        "serves a value whole or refuses it"
    )


def lost_nul_fix(column: str, fields: tuple[str, ...], value: str | bytes, *, files: bool) -> str:
    """The ways out, as a sentence, for a dataset (``files=False``) or a stream's files."""
    if fields:  # a struct field: neither tokenized nor cast alone
        change = "in the files" if files else "first (dataset.map)"
        what = "bytes as a list of byte values" if isinstance(value, bytes) else "text without them"
        serve = f"write the field's {what} {change}"
    elif isinstance(value, bytes):
        serve = (
            "write the column as a list of byte values (numbers) in the files"
            if files
            else f"serve it as numbers, dataset = dataset.map(lambda r: {{{column!r}: "
            f"list(r[{column!r}])}})"
        )
    else:
        serve = (
            f"tokenize it (tokenize=[{column!r}]), strip the NULs in the files"
            if files
            else f"tokenize it (tokenize=[{column!r}]), strip the NULs first (dataset.map)"
        )
    return f"{serve[0].upper()}{serve[1:]}, or leave the column out (exclude_keys=[{column!r}])"
