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
    as Python holds it): the struct field path and the whole value, or ``None``."""
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
            found = lost_nul(inner_original, inner)
            if found is not None:
                return found
    return None


def may_hold_nul_ended(values: Any) -> bool:
    """Whether any text or bytes value inside ``values`` (an Arrow array or chunked array of
    any type: through lists and struct fields) ends in a NUL: one vectorised look at the
    values' last bytes, so that the rows are walked in Python only when one may be lost."""
    import pyarrow as pa
    import pyarrow.compute as pc

    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    for chunk in chunks:
        kind = chunk.type
        if isinstance(kind, pa.ExtensionType):
            chunk = chunk.storage
            kind = chunk.type
        if pa.types.is_struct(kind):
            if any(may_hold_nul_ended(chunk.field(i)) for i in range(kind.num_fields)):
                return True
        elif (
            pa.types.is_list(kind)
            or pa.types.is_large_list(kind)
            or pa.types.is_fixed_size_list(kind)
        ):
            if may_hold_nul_ended(chunk.flatten()):
                return True
        elif (
            pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind)
            or pa.types.is_fixed_size_binary(kind)
            or getattr(pa.types, "is_string_view", lambda _: False)(kind)
            or getattr(pa.types, "is_binary_view", lambda _: False)(kind)
        ):
            ends = pc.ends_with(chunk.cast(pa.large_binary()), pattern=b"\x00")
            if pc.any(ends).as_py():
                return True
    return False


def _flat_text(kind: Any) -> bool:
    import pyarrow as pa

    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    )


class NulEndedRows:
    """Which rows of one Arrow column may hold a value ending in a NUL, read from its maps:
    a text or bytes column by each row's end offset and last byte (a few Python reads a row,
    nothing copied: HF's chunks of 1,000 rows made a numpy pass per chunk cost more than the
    rows), any other column (structs, lists) by an Arrow ``take`` of the rows and
    :func:`may_hold_nul_ended`.

    >>> import pyarrow as pa
    >>> rows = NulEndedRows(pa.chunked_array([["a", "b\\x00"], ["", "c"]]))
    >>> rows.any([0, 2, 3]), rows.any([3, 1])
    (False, True)
    """

    def __init__(self, column: Any) -> None:
        import pyarrow as pa

        self.column = column
        self.starts = np.cumsum([0, *(len(c) for c in column.chunks)]).tolist()
        # per chunk: (its offsets, its bytes, its first offset's index), or None (not flat)
        self.flat: list[tuple[memoryview, memoryview, int] | None] = []
        for chunk in column.chunks:
            if not _flat_text(chunk.type):
                self.flat.append(None)
                continue
            _, offsets, data = chunk.buffers()
            large = pa.types.is_large_string(chunk.type) or pa.types.is_large_binary(chunk.type)
            ends = memoryview(offsets).cast("q" if large else "i")
            last = memoryview(data).cast("B") if data is not None else memoryview(b"")
            self.flat.append((ends, last, chunk.offset))

    def any(self, rows: Any) -> bool:
        """Whether a value of table rows ``rows`` may end in a NUL."""
        others: dict[int, list[int]] = {}
        for row in np.asarray(rows, dtype=np.int64).tolist():
            c = bisect.bisect_right(self.starts, row) - 1
            flat = self.flat[c]
            if flat is None:
                others.setdefault(c, []).append(row - self.starts[c])
                continue
            ends, last, first = flat
            at = row - self.starts[c] + first
            stop = ends[at + 1]
            if stop > ends[at] and last[stop - 1] == 0:
                return True
        return any(may_hold_nul_ended(self.column.chunks[c].take(i)) for c, i in others.items())


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
