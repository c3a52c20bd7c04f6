"""In-process conformance checks (see :mod:`grain_rox.testing`): numpy-aware equality, the
``RandomAccessDataSource`` protocol, pickling without handles, read-only records, and Grain's
restore-at-every-step helper."""

from __future__ import annotations

import concurrent.futures
import io
import itertools
import mmap
import pickle
import random
import socket
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

ENDLESS = sys.maxsize  # Grain's length of an endless dataset


# ---- equality ------------------------------------------------------------------------------
def as_numpy(tree: Any) -> Any:
    """``tree`` with every array leaf (``jax.Array`` included) as a numpy array.

    >>> as_numpy({"x": [np.int32(1)], "y": (2.0,)})
    {'x': [np.int32(1)], 'y': (2.0,)}
    """
    if isinstance(tree, Mapping):
        return {k: as_numpy(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(as_numpy(v) for v in tree)
    if isinstance(tree, np.ndarray | np.generic | str | bytes) or not hasattr(tree, "__array__"):
        return tree
    return np.asarray(tree)


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray | np.generic) or (
        hasattr(x, "__array__") and not isinstance(x, str | bytes | Mapping | list | tuple)
    )


def assert_tree_equal(actual: Any, expected: Any, *, what: str = "record") -> None:
    """Equal nested dicts/lists/tuples with equal leaves; an array leaf must match shape,
    values and (when ``expected`` holds a numpy array there too) dtype.

    >>> assert_tree_equal({"x": np.arange(3)}, {"x": [0, 1, 2]})
    >>> assert_tree_equal({"x": np.arange(3)}, {"x": np.arange(3.0)})
    Traceback (most recent call last):
    ...
    AssertionError: record['x']: dtype int64 != expected float64
    """
    if _is_array(actual):
        a, e = np.asarray(actual), np.asarray(expected)
        if isinstance(expected, np.ndarray | np.generic) and a.dtype != e.dtype:
            raise AssertionError(f"{what}: dtype {a.dtype} != expected {e.dtype}")
        if a.shape != e.shape:
            raise AssertionError(f"{what}: shape {a.shape} != expected {e.shape}")
        equal = a == e if a.dtype.kind not in "fc" else (a == e) | (np.isnan(a) & np.isnan(e))
        if not np.all(equal):
            where = tuple(int(i) for i in np.argwhere(~np.asarray(equal))[0]) if a.ndim else ()
            raise AssertionError(
                f"{what}: values differ first at {list(where)}: {a[where]!r} != expected "
                f"{e[where]!r}"
            )
        return
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping) or set(actual) != set(expected):
            keys = sorted(actual) if isinstance(actual, Mapping) else type(actual).__name__
            raise AssertionError(f"{what}: keys {keys} != expected {sorted(expected)}")
        for key in expected:
            assert_tree_equal(actual[key], expected[key], what=f"{what}[{key!r}]")
    elif isinstance(expected, list | tuple) and not _is_array(expected):
        if not isinstance(actual, list | tuple) or len(actual) != len(expected):
            raise AssertionError(f"{what}: {_short(actual)} != expected {_short(expected)}")
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_tree_equal(a, e, what=f"{what}[{i}]")
    elif _is_array(expected):
        assert_tree_equal(np.asarray(actual), expected, what=what)
    elif actual != expected:
        raise AssertionError(f"{what}: {_short(actual)} != expected {_short(expected)}")


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 200 else text[:200] + "..."


def _name(x: Any) -> str:
    return type(x).__name__


# ---- the RandomAccessDataSource protocol -----------------------------------------------------
def _sample(n: int) -> list[int]:
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
    naming it and a float is refused; ``_getitems`` / ``__getitems__`` (when present)
    equal per-record reads; reads from several threads at once equal reads from one. An
    endless source (``len == sys.maxsize``) is read at a few small indices only.
    ``expected``: all the records, in order.

    >>> import grain
    >>> check_random_access_source(grain.sources.RangeDataSource(0, 5, 1), negative_indices=False)
    >>> check_random_access_source([1, 2], expected=[1, 3])
    Traceback (most recent call last):
    ...
    AssertionError: list[1]: 2 != expected 3
    """
    import grain

    kind = _name(source)
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
    bad = [ENDLESS] if n >= ENDLESS else [n, -n - 1] if negative_indices else [n, -1]
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
                f"{kind}[{index}] (len {n}) raised {_name(e)}: {e}, not IndexError"
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
    for method in ("_getitems", "__getitems__"):
        if hasattr(source, method):
            got = list(getattr(source, method)(asked))
            if len(got) != len(asked):
                raise AssertionError(f"{kind}.{method}({asked}) gave {len(got)} records")
            for i, record in zip(asked, got, strict=True):
                assert_tree_equal(record, records[i], what=f"{kind}.{method}(...)[{i}]")
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
            self.handles.append(_name(obj))
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
    kind = _name(source)
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
            raise AssertionError(f"{kind} ({when}) does not pickle: {_name(error)}: {error}")
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
def _leaves(tree: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(tree, list | tuple):
        for i, v in enumerate(tree):
            yield from _leaves(v, (*path, i))
    else:
        yield path, tree


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
    kind = _name(source)
    indices = list(indices) if indices is not None else _sample(len(source))[:3]
    for i in indices:
        snapshot = {p: np.array(v, copy=True) for p, v in _leaves(source[i]) if _is_array(v)}
        neighbours = {j: as_numpy(source[j]) for j in indices if j != i}
        for path in snapshot:
            record = source[i]  # a new read for each edit
            if not isinstance(_at(record, path), np.ndarray) or not _edit(_at(record, path)):
                continue
            for other, before in snapshot.items():
                if other != path and not np.array_equal(np.asarray(_at(record, other)), before):
                    raise AssertionError(
                        f"record {i} of {kind}: editing {list(path)} in place changed "
                        f"{list(other)} of the same record (they share memory: return "
                        "read-only arrays or independent copies)"
                    )
            again = source[i]
            for other, before in snapshot.items():
                if not np.array_equal(np.asarray(_at(again, other)), before):
                    raise AssertionError(
                        f"record {i} of {kind}: editing {list(path)} in place changed a new "
                        f"read of record {i} {list(other)} (records must be read-only arrays "
                        "or independent copies)"
                    )
            for j, before_j in neighbours.items():
                try:
                    assert_tree_equal(source[j], before_j, what=f"{kind}[{j}]")
                except AssertionError as e:
                    raise AssertionError(
                        f"record {i} of {kind}: editing {list(path)} in place changed another "
                        f"record: {e}"
                    ) from None


def _at(tree: Any, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


# ---- checkpoints ---------------------------------------------------------------------------
def _iter_dataset(ds: Any) -> Any:
    import grain

    if isinstance(ds, grain.MapDataset):
        return ds.to_iter_dataset(grain.ReadOptions(num_threads=0))
    return ds


class _Bounded:
    """An iterable over ``ds``'s first ``limit`` elements as numpy, its state the inner one."""

    def __init__(self, ds: Any, limit: int | None) -> None:
        self.ds, self.limit = ds, limit

    def __iter__(self) -> _BoundedIterator:
        return _BoundedIterator(iter(self.ds), self.limit)


class _BoundedIterator:
    def __init__(self, inner: Any, limit: int | None) -> None:
        self.inner, self.limit, self.count = inner, limit, 0

    def __iter__(self) -> _BoundedIterator:
        return self

    def __next__(self) -> Any:
        if self.limit is not None and self.count >= self.limit:
            _close(self.inner)
            raise StopIteration
        try:
            value = as_numpy(next(self.inner))
        except StopIteration:
            _close(self.inner)
            raise
        self.count += 1
        return value

    def get_state(self) -> dict[str, Any]:
        return {"count": self.count, "inner": self.inner.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        self.inner.set_state(state["inner"])
        self.count = state["count"]


def _close(it: Any) -> None:
    closer = getattr(it, "close", None)
    if callable(closer):
        closer()


def iterators(make_iterator: Callable[[], Any]) -> Iterable[Any]:
    """An iterable whose every ``iter()`` is a new ``make_iterator()``: lets the checks
    below restart an iterator that is its own iterable (``MultiHostDataLoadIterator``).

    >>> [list(itertools.islice(x, 2)) for x in [iterators(lambda: iter("ab"))] * 2]
    [['a', 'b'], ['a', 'b']]
    """

    class _Iterators:
        def __iter__(self) -> Any:
            return make_iterator()

    return _Iterators()


def check_checkpoint_every_step(ds: Any, *, max_elements: int | None = None) -> None:
    """Grain's ``grain.experimental.assert_equal_output_after_checkpoint``: the state's
    structure never changes, and an iterator restored from the state before element ``k``
    (for every ``k``) has that same state and yields the same elements to the end.

    ``ds``: a ``grain.MapDataset`` / ``IterDataset``, or any iterable whose iterators have
    ``get_state`` / ``set_state`` (see :func:`iterators`); ``max_elements`` bounds an
    endless one (the cost grows with its square).

    >>> import grain
    >>> check_checkpoint_every_step(grain.MapDataset.range(4).shuffle(seed=1))
    >>> check_checkpoint_every_step(grain.MapDataset.range(10**9), max_elements=3)
    """
    import grain

    ds = _iter_dataset(ds)
    if isinstance(ds, grain.IterDataset):
        if max_elements is not None:
            ds = grain.experimental.LimitIterDataset(ds, count=max_elements)
    else:
        ds = _Bounded(ds, max_elements)
    grain.experimental.assert_equal_output_after_checkpoint(ds)


def _take(it: Any, count: int | None) -> list[Any]:
    try:
        return [as_numpy(x) for x in itertools.islice(it, count)]
    finally:
        _close(it)
