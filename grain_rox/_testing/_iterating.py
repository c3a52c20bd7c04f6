"""Iterating what the checks are given: the first elements as numpy, closing an iterator,
an iterable that restarts an iterator, and Grain's restore-at-every-step check (see
:mod:`grain_rox.testing`)."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterable
from typing import Any

from grain_rox._testing._trees import as_numpy

ENDLESS = sys.maxsize  # Grain's length of an endless dataset


def take(it: Any, count: int | None) -> list[Any]:
    """The first ``count`` elements of ``it`` (all if None) as numpy; ``it`` is closed after."""
    try:
        return [as_numpy(x) for x in itertools.islice(it, count)]
    finally:
        close(it)


def close(it: Any) -> None:
    """Call ``it.close()`` if ``it`` has one."""
    closer = getattr(it, "close", None)
    if callable(closer):
        closer()


def iter_dataset(ds: Any) -> Any:
    """``ds`` as an ``IterDataset`` if it is a ``MapDataset`` (read in this thread), else as is."""
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
            close(self.inner)
            raise StopIteration
        try:
            value = as_numpy(next(self.inner))
        except StopIteration:
            close(self.inner)
            raise
        self.count += 1
        return value

    def get_state(self) -> dict[str, Any]:
        return {"count": self.count, "inner": self.inner.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        self.inner.set_state(state["inner"])
        self.count = state["count"]


def iterators(make_iterator: Callable[[], Any]) -> Iterable[Any]:
    """An iterable whose every ``iter()`` is a new ``make_iterator()``: lets the checks
    restart an iterator that is its own iterable (``MultiHostDataLoadIterator``).

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

    ds = iter_dataset(ds)
    if isinstance(ds, grain.IterDataset):
        if max_elements is not None:
            ds = grain.experimental.LimitIterDataset(ds, count=max_elements)
    else:
        ds = _Bounded(ds, max_elements)
    grain.experimental.assert_equal_output_after_checkpoint(ds)
