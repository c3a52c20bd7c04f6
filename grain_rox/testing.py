"""Conformance checks for Grain sources and iterators: each a function that raises
``AssertionError`` saying what is wrong.

grain_rox runs every source and iterator it offers through these (``tests/test_conformance.py``);
a project that wraps our sources, or writes its own, can run them too::

    from grain_rox import testing
    testing.check_random_access_source(source)          # len, indices, errors, batched reads
    testing.check_pickle(source)                        # small, no open handles
    testing.check_read_only_records(source)             # no aliasing between records
    testing.check_stable_repr(make_source, data_dir=d)  # across processes and data copies
    testing.check_checkpoint_every_step(ds)             # Grain's own restore-at-every-step
    testing.check_orbax_roundtrip(make_ds)              # Orbax save here, restore elsewhere
    testing.check_mp_prefetch_equal(ds)                 # 2 Grain workers == in-process
    testing.check_dataloader_restore_in_fresh_process(make_source)  # 2 workers, restored
    testing.check_processes_equal(make_iterator)        # 2 jax.distributed processes == 1

The checks that need another interpreter (repr, Orbax, DataLoader) run their half there
through :class:`FreshProcess`; pass one ``fresh=`` to several checks to start it once.
Factories (``make_source``, ``make_iterable``) travel there with cloudpickle: module-level
functions, ``functools.partial`` of them, or lambdas. The other process gets this
process's ``sys.path`` and environment.

>>> import grain, numpy as np
>>> check_random_access_source(grain.sources.RangeDataSource(0, 3, 1), expected=[0, 1, 2],
...                            negative_indices=False)
>>> class Shared:  # two records that alias one buffer
...     buffer = np.zeros(4)
...     def __len__(self): return 2
...     def __getitem__(self, i): return {"x": Shared.buffer}
>>> check_read_only_records(Shared())
Traceback (most recent call last):
...
AssertionError: record 0 of Shared: editing ['x'] in place changed a new read of record 0 ['x'] (records must be read-only arrays or independent copies)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import io
import itertools
import mmap
import os
import pickle
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import traceback
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


# ---- another interpreter -------------------------------------------------------------------
class FreshProcess:
    """A new Python interpreter that runs functions for the checks: ``call(fn, *args)``
    returns ``fn(*args)`` computed there (sent with cloudpickle, the result with pickle).

    It starts with this process's ``sys.path`` and environment and has built nothing of
    yours, so what it computes shows what a restarted job would see. Starting one costs an
    interpreter (and, once used, Grain's and JAX's imports): share one between checks.

    >>> with FreshProcess() as other:
    ...     other.call(os.getpid) != os.getpid()
    True
    """

    def __init__(self, *, timeout: float = 300.0) -> None:
        self.timeout = timeout
        ours, theirs = socket.socketpair()
        self._log = tempfile.TemporaryFile()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        code = "import sys; from grain_rox.testing import _serve; _serve(int(sys.argv[1]))"
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        theirs.close()
        from multiprocessing.connection import Connection

        self._conn = Connection(ours.detach())

    def _output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, computed in the other interpreter."""
        import cloudpickle

        name = getattr(fn, "__name__", repr(fn))
        self._conn.send_bytes(cloudpickle.dumps((fn, args, kwargs)))
        if not self._conn.poll(self.timeout):
            self.close()
            raise AssertionError(
                f"{name} did not finish within {self.timeout:.0f} s in the fresh process; "
                f"its output:\n{self._output()}"
            )
        try:
            ok, value = pickle.loads(self._conn.recv_bytes())
        except EOFError:
            self.close()
            raise AssertionError(
                f"the fresh process died running {name} (exit {self._proc.returncode}); its "
                f"output:\n{self._output()}"
            ) from None
        if not ok:
            raise AssertionError(f"{name} failed in the fresh process:\n{value}")
        return value

    def close(self) -> None:
        """End the interpreter (idempotent)."""
        with contextlib.suppress(OSError):
            self._conn.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> FreshProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve(fd: int) -> None:
    """The other interpreter's loop: run each received call, send back its result."""
    from multiprocessing.connection import Connection

    conn = Connection(fd)
    while True:
        try:
            fn, args, kwargs = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        try:
            reply = (True, fn(*args, **kwargs))
        except BaseException:
            reply = (False, traceback.format_exc())
        conn.send_bytes(pickle.dumps(reply))


@contextlib.contextmanager
def _processes(fresh: FreshProcess | Sequence[FreshProcess] | None, count: int) -> Iterator[Any]:
    if fresh is not None:
        yield [fresh] if isinstance(fresh, FreshProcess) else list(fresh)
        return
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(FreshProcess()) for _ in range(count)]


# ---- stable repr ---------------------------------------------------------------------------
def _build(make: Callable[..., Any], directory: str | None) -> Any:
    return make() if directory is None else make(directory)


def _reprs(make_source: Callable[..., Any], directories: Sequence[str | None]) -> list[str]:
    return [repr(_build(make_source, d)) for d in directories]


def check_stable_repr(
    make_source: Callable[..., Any],
    *,
    data_dir: str | None = None,
    processes: int = 2,
    fresh: FreshProcess | Sequence[FreshProcess] | None = None,
) -> None:
    """``repr(make_source(...))`` (Grain's ``DataLoader`` compares it on restore) names no
    memory address, and is the same here, in ``processes`` fresh interpreters (concurrently),
    and, with ``data_dir``, for a byte-identical copy of that directory elsewhere (new
    modification times): ``make_source(data_dir)`` and ``make_source(copy)``.

    >>> import functools
    >>> check_stable_repr(functools.partial(range, 3), processes=1)
    >>> check_stable_repr(object)
    Traceback (most recent call last):
    ...
    AssertionError: repr(object) names a memory address: '<object object at 0x...>'; define a __repr__ from the data's content and the config
    """
    here = repr(_build(make_source, data_dir))
    if " at 0x" in here or "object at" in here:
        shown = here.split(" at 0x")[0] + " at 0x...>" if " at 0x" in here else here
        raise AssertionError(
            f"repr({_name(_build(make_source, data_dir))}) names a memory address: {shown!r}; "
            "define a __repr__ from the data's content and the config"
        )
    with contextlib.ExitStack() as stack:
        directories: list[str | None] = [data_dir]
        if data_dir is not None:
            copy = os.path.join(stack.enter_context(tempfile.TemporaryDirectory()), "copy")
            shutil.copytree(data_dir, copy, copy_function=shutil.copyfile)
            directories.append(copy)
            there = repr(make_source(copy))
            if there != here:
                raise AssertionError(
                    f"repr differs for a byte-identical copy of {data_dir}:\n  {here}\n  {there}"
                )
        procs = stack.enter_context(_processes(fresh, processes))
        with concurrent.futures.ThreadPoolExecutor(len(procs)) as pool:
            results = list(pool.map(lambda p: p.call(_reprs, make_source, directories), procs))
        for p, reprs in enumerate(results):
            for d, r in zip(directories, reprs, strict=True):
                if r != here:
                    raise AssertionError(
                        f"repr differs in fresh process {p} (data {d}):\n  here:  {here}\n  "
                        f"there: {r}"
                    )


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


def _orbax_args(handler: str) -> tuple[Any, Any]:
    if handler == "grain":
        import grain

        return grain.checkpoint.CheckpointSave, grain.checkpoint.CheckpointRestore
    if handler == "grain_rox":
        from grain_rox._checkpoint import RoxCheckpointRestore, RoxCheckpointSave

        return RoxCheckpointSave, RoxCheckpointRestore
    raise ValueError(f"handler={handler!r}; use 'grain' or 'grain_rox'")


def _restore_and_read(
    make_iterable: Callable[[], Any], directory: str, step: int, read: int, handler: str
) -> list[Any]:
    import orbax.checkpoint as ocp

    _, restore = _orbax_args(handler)
    it = iter(make_iterable())
    manager = ocp.CheckpointManager(directory)
    try:
        manager.restore(step, args=ocp.args.Composite(data=restore(it)))
    finally:
        manager.close()
    return _take(it, read)


def check_orbax_roundtrip(
    make_iterable: Callable[[], Any],
    *,
    steps: int = 2,
    read: int = 3,
    handler: str = "grain",
    fresh: FreshProcess | None = None,
) -> None:
    """Orbax saves an iterator of ``make_iterable()`` after ``steps`` elements here; a fresh
    interpreter builds ``make_iterable()`` again, restores it from the checkpoint and reads
    ``read`` elements: they equal what this iterator read next. ``handler``: ``"grain"``
    (``grain.checkpoint.CheckpointSave/Restore``) or ``"grain_rox"``
    (:class:`~grain_rox.RoxCheckpointSave`; iterators with JSON ``get_state``).

    >>> import grain
    >>> check_orbax_roundtrip(lambda: grain.MapDataset.range(9).to_iter_dataset())  # doctest: +SKIP
    """
    import orbax.checkpoint as ocp

    save, _ = _orbax_args(handler)
    with tempfile.TemporaryDirectory() as directory:
        it = iter(make_iterable())
        try:
            head = [next(it) for _ in range(steps)]
            if len(head) != steps:
                raise AssertionError(f"{make_iterable} gave fewer than {steps} elements")
            manager = ocp.CheckpointManager(directory)
            manager.save(steps, args=ocp.args.Composite(data=save(it)))
            manager.wait_until_finished()
            manager.close()
            expected = [as_numpy(next(it)) for _ in range(read)]
        finally:
            _close(it)
        with _processes(fresh, 1) as (proc,):
            got = proc.call(_restore_and_read, make_iterable, directory, steps, read, handler)
    for i, (a, e) in enumerate(zip(got, expected, strict=True)):
        assert_tree_equal(a, e, what=f"element {steps + i} after the Orbax restore")


def check_mp_prefetch_equal(ds: Any, *, workers: int = 2, max_elements: int | None = None) -> None:
    """``ds.mp_prefetch(...)`` with ``workers`` Grain worker processes yields what ``ds``
    yields in this process (the first ``max_elements``; required for an endless ``ds``).

    >>> import grain
    >>> check_mp_prefetch_equal(grain.MapDataset.range(6).to_iter_dataset())  # doctest: +SKIP
    """
    import grain

    from grain_rox._grain_setup import make_grain_workers_usable

    make_grain_workers_usable()  # Grain 0.2.18's absl trap, for datasets built without us
    ds = _iter_dataset(ds)
    expected = _take(iter(ds), max_elements)
    options = grain.MultiprocessingOptions(num_workers=workers)
    got = _take(iter(ds.mp_prefetch(options)), max_elements)
    if len(got) != len(expected):
        raise AssertionError(
            f"with {workers} Grain workers: {len(got)} elements, in-process {len(expected)}"
        )
    for i, (a, e) in enumerate(zip(got, expected, strict=True)):
        assert_tree_equal(a, e, what=f"element {i} with {workers} Grain workers")


def data_loader(
    make_source: Callable[[], Any],
    *,
    worker_count: int = 2,
    batch_size: int | None = 2,
    seed: int = 0,
) -> Any:
    """The ``grain.DataLoader`` :func:`check_dataloader_restore_in_fresh_process` uses:
    ``make_source()`` in a seeded shuffled order (in order if endless), one epoch, batched
    by ``batch_size`` (``None``: records as they are).

    >>> next(iter(data_loader(lambda: list(range(8)), worker_count=0))).tolist()
    [0, 4]
    """
    import grain

    from grain_rox._grain_setup import make_grain_workers_usable

    make_grain_workers_usable()  # Grain 0.2.18's absl trap, for sources built without us
    source = make_source()
    finite = len(source) < ENDLESS
    sampler = grain.samplers.IndexSampler(
        num_records=len(source),
        shard_options=grain.sharding.NoSharding(),
        shuffle=finite,
        seed=seed,
        num_epochs=1,
    )
    ops = [grain.transforms.Batch(batch_size)] if batch_size else []
    return grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=ops,
        worker_count=worker_count,
        read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=4),
    )


def check_dataloader_restore_in_fresh_process(
    make_source: Callable[[], Any],
    *,
    worker_count: int = 2,
    batch_size: int | None = 2,
    steps: int = 2,
    read: int = 2,
    fresh: FreshProcess | None = None,
) -> None:
    """``grain.DataLoader(worker_count=2)`` over ``make_source()`` (see :func:`data_loader`),
    checkpointed with Grain's Orbax handler after ``steps`` batches, restores in a fresh
    interpreter (where Grain checks ``repr(source)``) to the same next ``read`` batches.

    >>> check_dataloader_restore_in_fresh_process(lambda: list(range(8)))  # doctest: +SKIP
    """
    make = functools.partial(
        data_loader, make_source, worker_count=worker_count, batch_size=batch_size
    )
    check_orbax_roundtrip(make, steps=steps, read=read, handler="grain", fresh=fresh)


# ---- several JAX processes -------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _distributed_main(port: str, count: str, index: str, job: str, out: str) -> None:
    """One process of :func:`check_processes_equal` (its command-line arguments): JAX's
    distributed runtime first, then the job."""
    import jax

    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=int(count),
        process_id=int(index),
        initialization_timeout=60,
    )
    from jax.experimental import multihost_utils

    with open(job, "rb") as f:
        make_iterable, read = pickle.load(f)
    it = iter(make_iterable())
    try:
        got = [
            as_numpy(multihost_utils.process_allgather(next(it), tiled=True)) for _ in range(read)
        ]
    finally:
        _close(it)
    with open(out, "wb") as f:
        pickle.dump(got, f)
    multihost_utils.sync_global_devices("grain_rox.testing done")


def check_processes_equal(
    make_iterable: Callable[[], Any], *, processes: int = 2, read: int = 3, timeout: float = 300
) -> None:
    """``processes`` real JAX processes (``jax.distributed`` over 127.0.0.1, this process's
    devices split among them) each iterate ``make_iterable()``; the global ``jax.Array``
    elements they build (gathered) equal the first ``read`` elements built here in one
    process. For iterators of global arrays, e.g. :class:`~grain_rox.MultiHostDataLoadIterator`
    (``make_iterable`` may read ``jax.process_index()`` to pick its shard).

    >>> from grain_rox import MultiHostDataLoadIterator, TokenPipeline
    >>> pipe = TokenPipeline("corpus.rox", seq_len=32, global_batch_size=8)  # doctest: +SKIP
    >>> check_processes_equal(lambda: MultiHostDataLoadIterator(pipe))  # doctest: +SKIP
    """
    import cloudpickle
    import jax

    expected = _take(iter(make_iterable()), read)
    per_process = max(1, jax.device_count() // processes)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={per_process}",
        "JAX_PLATFORMS": "cpu",
    }
    env.pop("JAX_NUM_PROCESSES", None)
    port = _free_port()
    with tempfile.TemporaryDirectory() as work:
        job = os.path.join(work, "job.pkl")
        with open(job, "wb") as f:
            cloudpickle.dump((make_iterable, read), f)
        code = "import sys; from grain_rox.testing import _distributed_main; _distributed_main(*sys.argv[1:])"
        logs, procs = [], []
        try:
            for i in range(processes):
                logs.append(open(os.path.join(work, f"log{i}"), "w+b"))
                args = [str(port), str(processes), str(i), job, os.path.join(work, f"out{i}")]
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", code, *args],
                        env=env,
                        stdout=logs[-1],
                        stderr=subprocess.STDOUT,
                    )
                )
            _wait_all(procs, logs, timeout)
            results = []
            for i in range(processes):
                with open(os.path.join(work, f"out{i}"), "rb") as f:
                    results.append(pickle.load(f))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
            for log in logs:
                log.close()
    for i, got in enumerate(results):
        for k, (a, e) in enumerate(zip(got, expected, strict=True)):
            assert_tree_equal(a, e, what=f"element {k} in process {i} of {processes}")


def _wait_all(procs: list[subprocess.Popen], logs: list[Any], timeout: float) -> None:
    """Wait for every process; on a failure or the timeout, an error with their output."""
    import time

    start, failed_at = time.monotonic(), None
    while True:
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return
        now = time.monotonic()
        if any(c not in (None, 0) for c in codes):
            failed_at = failed_at or now
        if (failed_at and (all(c is not None for c in codes) or now - failed_at > 5)) or (
            now - start > timeout
        ):
            for p in procs:
                if p.poll() is None:
                    p.kill()
            outputs = []
            for i, log in enumerate(logs):
                log.seek(0)
                text = log.read().decode(errors="replace")[-3000:]
                outputs.append(f"--- process {i} (exit {procs[i].poll()}) ---\n{text}")
            raise AssertionError(
                f"the {len(procs)}-process run failed (exit codes {codes}):\n" + "\n".join(outputs)
            )
        time.sleep(0.05)


__all__ = [
    "check_processes_equal",
    "FreshProcess",
    "as_numpy",
    "assert_tree_equal",
    "check_checkpoint_every_step",
    "check_dataloader_restore_in_fresh_process",
    "check_mp_prefetch_equal",
    "check_orbax_roundtrip",
    "check_pickle",
    "check_random_access_source",
    "check_read_only_records",
    "check_stable_repr",
    "data_loader",
    "iterators",
]
