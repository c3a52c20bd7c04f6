"""In-process conformance checks of a source (see :mod:`grain_rox.testing`): Grain's
``RandomAccessDataSource`` protocol, pickling without handles, and read-only records."""

from __future__ import annotations

import concurrent.futures
import io
import mmap
import pickle
import random
import socket
from collections.abc import Sequence
from typing import Any

import numpy as np

from grain_rox._testing._iterating import ENDLESS
from grain_rox._testing._trees import (
    as_numpy,
    assert_tree_equal,
    at,
    is_array,
    leaves,
    type_name,
)


# ---- the RandomAccessDataSource protocol -----------------------------------------------------
def _sample(n: int) -> list[int]:
    """The indices the checks read of a source of ``n`` records: both ends and the middle."""
    if n >= ENDLESS:
        return [0, 1, 2, 5]
    return sorted({i for i in (0, 1, 2, n // 2, n - 2, n - 1) if 0 <= i < n})


def check_random_access_source(
    source: Any, *, expected: Sequence[Any] | None = None, negative_indices: bool = True
) -> None:
    """Grain's ``RandomAccessDataSource`` protocol, as grain_rox's sources keep it.

    ``len`` is an int; a record reads the same through ``int``, numpy integer and (with
    ``negative_indices``) negative indices counted from the end, like a list or a
    ``grain.MapDataset`` (``negative_indices=False``: a negative index is an ``IndexError``,
    as for ``grain.sources.RangeDataSource``); an index past either end is an ``IndexError``
    naming it (a uint64 past int64 included) and a float is refused; ``_getitems`` /
    ``__getitems__`` (when present) equal per-record reads, and they and ``get_batch`` refuse
    the same bad indices; reads from several threads at once equal reads from one. An
    endless source (``len == sys.maxsize``) is read at a few small indices only.

    Args:
      source: the source to check.
      expected: all the records, in order (default: only the protocol is checked, on a
        few indices).
      negative_indices: whether ``source[-1]`` is the last record (True, default) or an
        ``IndexError``.

    >>> import grain
    >>> check_random_access_source(grain.sources.RangeDataSource(0, 5, 1), negative_indices=False)
    >>> check_random_access_source([1, 2], expected=[1, 3])
    Traceback (most recent call last):
    ...
    AssertionError: list[1]: 2 != expected 3
    """
    import grain

    kind = type_name(source)
    if not isinstance(source, grain.sources.RandomAccessDataSource):
        raise AssertionError(f"{kind} is not a grain.sources.RandomAccessDataSource")
    n = len(source)
    if expected is not None and n != len(expected):
        raise AssertionError(f"len({kind}) is {n}, expected {len(expected)}")
    indices = _sample(n) if expected is None else list(range(n))
    records = {}
    for i in indices:
        record = source[i]
        records[i] = record
        if expected is not None:
            assert_tree_equal(record, expected[i], what=f"{kind}[{i}]")
        ways: list[Any] = [np.int64(i), np.uint64(i)] + ([np.int32(i)] if i < 2**31 else [])
        if negative_indices and n < ENDLESS:
            ways += [i - n, np.int64(i - n)]
        for way in ways:
            assert_tree_equal(source[way], record, what=f"{kind}[{way!r}] (of {kind}[{i}])")
    bad: list[Any] = [ENDLESS] if n >= ENDLESS else [n, -n - 1] if negative_indices else [n, -1]
    bad.append(np.uint64(2**64 - 1))  # wraps to -1 where cast to int64 unchecked
    for index in bad:
        try:
            source[index]
        except IndexError as e:
            if str(index) not in str(e):
                raise AssertionError(
                    f"{kind}[{index}] raised IndexError({str(e)!r}), which does not name the index"
                ) from None
        except Exception as e:
            raise AssertionError(
                f"{kind}[{index}] (len {n}) raised {type_name(e)}: {e}, not IndexError"
            ) from None
        else:
            raise AssertionError(f"{kind}[{index}] (len {n}) returned a record, not IndexError")
    try:
        source[1.0]
    except Exception:
        pass
    else:
        raise AssertionError(f"{kind}[1.0] returned a record: a float is not an index")
    asked = indices[::-1] + indices[:1]
    # as source[i] reads them: numpy ints, and (with negative_indices) counted from the end
    spelled: list[Any] = [np.int64(i) if k % 2 else i for k, i in enumerate(asked)]
    if negative_indices and n < ENDLESS:
        spelled = [i - n if k % 3 == 1 else i for k, i in enumerate(spelled)]
    for method in ("_getitems", "__getitems__", "get_batch"):
        if not hasattr(source, method):
            continue
        if method != "get_batch":  # records as source[i] reads them (get_batch stacks them)
            got = list(getattr(source, method)(spelled))
            if len(got) != len(asked):
                raise AssertionError(f"{kind}.{method}({spelled}) gave {len(got)} records")
            for i, way, record in zip(asked, spelled, got, strict=True):
                assert_tree_equal(record, records[i], what=f"{kind}.{method}([..{way!r}..])")
        try:
            getattr(source, method)([1.0])
        except Exception:
            pass
        else:
            raise AssertionError(
                f"{kind}.{method}([1.0]) returned records: a float is not an index"
            )
        try:
            getattr(source, method)(np.array([2**64 - 1], np.uint64))
        except IndexError:
            pass
        except Exception as e:
            raise AssertionError(
                f"{kind}.{method}([2**64 - 1] as uint64) raised {type_name(e)}: {e}, not IndexError"
            ) from None
        else:
            raise AssertionError(
                f"{kind}.{method}([2**64 - 1] as uint64) returned records, not IndexError"
            )
    many = indices * 4
    random.Random(0).shuffle(many)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for i, record in zip(many, pool.map(source.__getitem__, many), strict=True):
            assert_tree_equal(record, records[i], what=f"{kind}[{i}] read from 4 threads")


# ---- pickling without handles --------------------------------------------------------------
def _is_handle(x: Any) -> bool:
    if isinstance(x, io.IOBase | mmap.mmap | socket.socket | np.memmap):
        return True
    base = x.base if isinstance(x, np.ndarray) else None
    while base is not None:
        if isinstance(base, mmap.mmap | np.memmap):
            return True
        base = getattr(base, "base", None)
    return False


class _HandleFinder(pickle.Pickler):
    def __init__(self, file: Any) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.handles: list[str] = []

    def reducer_override(self, obj: Any) -> Any:
        if _is_handle(obj):
            self.handles.append(type_name(obj))
        return NotImplemented


def _pickled(source: Any) -> tuple[bytes, list[str], Exception | None]:
    out = io.BytesIO()
    finder = _HandleFinder(out)
    try:
        finder.dump(source)
    except Exception as e:
        return b"", finder.handles, e
    return out.getvalue(), finder.handles, None


def check_pickle(source: Any, *, max_bytes: int = 64 * 1024) -> None:
    """``source`` pickles (before and after it is read: Grain copies it into every worker)
    in at most ``max_bytes``, with no open file, mmap, socket or memory-mapped array in it,
    and the copy has the same repr and reads equal records.

    >>> check_pickle(list(range(5)))
    >>> check_pickle(list(range(100_000)), max_bytes=1000)
    Traceback (most recent call last):
    ...
    AssertionError: list pickles in 368931 bytes (> max_bytes=1000): drop data and handles in __getstate__ and reopen them lazily
    """
    kind = type_name(source)
    indices = _sample(len(source))
    for when in ("unread", "after reads"):
        if when == "after reads":
            for i in indices:
                source[i]
        data, handles, error = _pickled(source)
        if handles:
            raise AssertionError(
                f"{kind} ({when}) pickles open handles {sorted(set(handles))}: drop them in "
                "__getstate__ and reopen lazily in each process"
            )
        if error is not None:
            raise AssertionError(f"{kind} ({when}) does not pickle: {type_name(error)}: {error}")
        if len(data) > max_bytes:
            raise AssertionError(
                f"{kind} pickles in {len(data)} bytes (> max_bytes={max_bytes}): drop data and "
                "handles in __getstate__ and reopen them lazily"
            )
        copy = pickle.loads(data)
        if repr(copy) != repr(source):
            raise AssertionError(f"unpickled repr {repr(copy)!r} != {repr(source)!r}")
        for i in indices:
            assert_tree_equal(copy[i], source[i], what=f"unpickled {kind}[{i}]")


# ---- read-only or independent records ------------------------------------------------------
def _edit(array: np.ndarray) -> bool:
    """Change every element of a writable numeric array in place; False if it cannot."""
    if not array.flags.writeable or array.size == 0 or array.dtype.kind not in "biufc":
        return False
    if array.dtype.kind == "b":
        np.logical_not(array, out=array)
    else:
        array += 1
    return True


def check_read_only_records(source: Any, *, indices: Sequence[int] | None = None) -> None:
    """Editing a record's array in place (a user's map may) changes nothing else: not the
    record's other arrays, not another record, not a new read. Read-only arrays pass at once.

    >>> import grain
    >>> check_read_only_records(grain.MapDataset.range(3).map(lambda i: {"x": np.full(2, i)}))
    """
    kind = type_name(source)
    indices = list(indices) if indices is not None else _sample(len(source))[:3]
    for i in indices:
        this = f"record {i} of {kind}"
        snapshot = {p: np.array(v, copy=True) for p, v in leaves(source[i]) if is_array(v)}
        neighbours = {j: as_numpy(source[j]) for j in indices if j != i}
        for path in snapshot:
            record = source[i]  # a new read for each edit
            leaf = at(record, path, what=this)
            if not isinstance(leaf, np.ndarray) or not _edit(leaf):
                continue
            for other, before in snapshot.items():
                if other == path:
                    continue
                if not np.array_equal(np.asarray(at(record, other, what=this)), before):
                    raise AssertionError(
                        f"{this}: editing {list(path)} in place changed "
                        f"{list(other)} of the same record (they share memory: return "
                        "read-only arrays or independent copies)"
                    )
            again = source[i]
            for other, before in snapshot.items():
                if not np.array_equal(np.asarray(at(again, other, what=this)), before):
                    raise AssertionError(
                        f"{this}: editing {list(path)} in place changed a new "
                        f"read of record {i} {list(other)} (records must be read-only arrays "
                        "or independent copies)"
                    )
            for j, before_j in neighbours.items():
                try:
                    assert_tree_equal(source[j], before_j, what=f"{kind}[{j}]")
                except AssertionError as e:
                    raise AssertionError(
                        f"{this}: editing {list(path)} in place changed another record: {e}"
                    ) from None
