"""A ``grain.MapDataset`` over a source whose records are whole batches, read without Grain's
per-read source metrics.

``grain.MapDataset.source(source)`` (Grain 0.2.18's ``SourceMapDataset``) records, for every
element, its size in bytes (a walk over the record's arrays) and its latency into Grain's
monitoring counters. For a source of single examples that is a small share of a read; a
grain_rox record is a whole batch read in tens of microseconds, and those counters cost
15 us of it: a ``(32, 1024)`` ``layout="tokens"`` batch through ``to_iter_dataset()``
took 70-71 us with them, 55-56 us without (the read alone, 45 us). :class:`BatchDataset` reads
the source directly, keeps what a Grain dataset owes its pipeline (the element count,
``index % len`` as ``SourceMapDataset`` takes it, slicing, the contiguous share each worker
reads under ``mp_prefetch(..., sequential_slice=True)``, pickling for worker processes, the
self-time and output-spec statistics Grain's execution summaries show) and drops the
counters.

>>> import numpy as np
>>> ds = BatchDataset([np.arange(3), np.arange(3, 6)])
>>> len(ds), ds[1].tolist(), ds[3].tolist(), str(ds)
(2, [3, 4, 5], [3, 4, 5], 'BatchDataset(source=list)')
>>> [x.tolist() for x in ds.to_iter_dataset()]
[[0, 1, 2], [3, 4, 5]]

:class:`InOrderIterDataset` is ``to_iter_dataset()`` for such a dataset read in the calling
thread, batch after batch: Grain's own iterator (``PrefetchDatasetIterator``, even with
``num_threads=0``) spends ~15-20 us a batch on its bookkeeping (a lock, timers, a latency
histogram, output-spec records), against ~100 us for a ``(32, 1024)`` batch with its six
arrays. Its state is the one Grain's iterator keeps, ``{"next_index": i}``.
"""

from __future__ import annotations

import operator
import sys
from typing import Any

import grain
import numpy as np


class BatchDataset(grain.MapDataset):
    """``grain.MapDataset.source(source)`` for a source of whole batches, without Grain's
    per-read byte and latency counters (see the module doc).

    Attributes:
      source: The random-access source read (any ``len`` + ``__getitem__``).
    """

    def __init__(self, source: Any) -> None:
        super().__init__()
        self.source = source
        # the share of the source read, [first, first + count) (a worker's, once Grain's
        # sequential slicing has set it; None: all of it)
        self._first: int = 0
        self._count: int | None = None

    def __len__(self) -> int:
        return len(self.source) if self._count is None else self._count

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        i = operator.index(index)
        if i < 0 and len(self) == sys.maxsize:  # endless: no last element to count back from
            return self.source[i]  # the source says so (index % len would read far ahead)
        with self._stats.record_self_time():
            read = self.source[self._first + i % len(self)]
            return self._stats.record_output_spec(read)

    def to_iter_dataset(
        self, read_options: grain.ReadOptions | None = None, *, allow_nones: bool = False
    ) -> grain.IterDataset:
        """Grain's ``to_iter_dataset``; with ``ReadOptions(num_threads=0)`` (read in the
        calling thread, as Grain's iterator then reads) an :class:`InOrderIterDataset`."""
        if read_options is not None and read_options.num_threads == 0 and not allow_nones:
            return InOrderIterDataset(self)
        return super().to_iter_dataset(read_options, allow_nones=allow_nones)

    def read(self, index: int) -> Any:
        """Element ``index`` (in ``[0, len)``) without Grain's statistics."""
        return self.source[self._first + index]

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Grain's in-place slicing hook, called in worker ``sl.start`` of ``sl.step`` under
        ``mp_prefetch(..., sequential_slice=True)``: that worker reads a contiguous share of
        the source, split as Grain splits ``SourceMapDataset`` (the first ``len % workers``
        shares one element longer)."""
        if not sequential_slice:  # Grain slices a source dataset in place only sequentially
            raise ValueError(f"BatchDataset slices in place only sequentially, not {sl}")
        worker, workers = sl.start or 0, sl.step or 1
        size, extra = divmod(len(self.source), workers)
        self._first = size * worker + min(worker, extra)
        self._count = size + int(worker < extra)

    def __str__(self) -> str:
        return f"BatchDataset(source={type(self.source).__name__})"


class InOrderIterDataset(grain.IterDataset):
    """Elements 0, 1, 2, ... of a :class:`BatchDataset`, read in the calling thread: what
    ``batches.to_iter_dataset(grain.ReadOptions(num_threads=0))`` yields, without Grain's
    per-element bookkeeping (see the module doc). Any Grain transformation may follow it.

    >>> import numpy as np
    >>> it = iter(InOrderIterDataset(BatchDataset([np.arange(2), np.arange(2, 4)])))
    >>> next(it).tolist(), it.get_state()
    ([0, 1], {'next_index': 1})
    >>> it.set_state({"next_index": 0}); [x.tolist() for x in it]
    [[0, 1], [2, 3]]
    """

    def __init__(self, batches: BatchDataset) -> None:
        super().__init__(batches)

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Grain's hook for worker ``sl.start`` of ``sl.step`` under ``mp_prefetch``, as its
        own iterator dataset takes it: every ``sl.step``-th batch, or (``sequential_slice``)
        a contiguous share."""
        if sequential_slice:  # in place, down to the BatchDataset (below a strided slice too)
            _slice_in_place(self.parents[0], sl)
        else:
            self._parents = (self.parents[0].slice(sl),)

    def __iter__(self) -> grain.DatasetIterator:
        return _InOrderIterator(self.parents[0])

    def __str__(self) -> str:
        return "InOrderIterDataset"


def next_index_of(state: Any) -> int | None:
    """The ``next_index`` of a Grain ``MapDataset`` iterator's state as an int (a Python or
    numpy int: a checkpoint may hand back numpy scalars), or None when it has none or it is
    not an int (a bool is not).

    >>> next_index_of({"next_index": np.int64(3)}), next_index_of({"next_index": True})
    (3, None)
    """
    at: Any = state.get("next_index") if isinstance(state, dict) else None
    if isinstance(at, (bool, np.bool_)):
        return None
    try:
        return operator.index(at)
    except TypeError:
        return None


def _slice_in_place(ds: grain.MapDataset, sl: slice) -> None:
    # as Grain slices its own iterator dataset's parent sequentially: the first dataset on
    # the way down that slices itself in place does it (here the BatchDataset)
    if isinstance(ds, BatchDataset):
        ds.set_slice(sl, sequential_slice=True)
        return
    if not ds.parents:
        raise ValueError(f"cannot slice {ds} in place: it has no BatchDataset under it")
    for parent in ds.parents:
        _slice_in_place(parent, sl)


class NotAStateError(ValueError, KeyError):
    """A state :class:`InOrderIterDataset`'s iterator cannot restore: a ``ValueError`` that
    is also the ``KeyError`` Grain's own iterator raises for a state without ``next_index``."""

    __str__ = ValueError.__str__  # the message as written, not KeyError's quoted key


class _InOrderIterator(grain.DatasetIterator):
    # Grain's own iterator links its statistics to the MapDataset's (a private hook); this one
    # has no parent statistics, so it reports its elements as its own (the class default):
    # a chain of transformations after it asks it, not a parent, for the element spec.

    def __init__(self, batches: grain.MapDataset) -> None:
        super().__init__()
        # a BatchDataset is read without Grain's statistics; a slice of one (a worker's
        # every n-th batch) through Grain's indexing
        self._read = batches.read if isinstance(batches, BatchDataset) else batches.__getitem__
        self._length = len(batches)
        self._next_index = 0

    def __next__(self) -> Any:
        self._assert_not_closed()
        while True:
            i = self._next_index
            if i >= self._length:
                raise StopIteration
            element = self._read(i)
            self._next_index = i + 1
            if element is not None:  # as Grain's iterator skips a sparse dataset's Nones
                return element

    def get_state(self) -> dict[str, Any]:
        return {"next_index": self._next_index}

    def __str__(self) -> str:  # as Grain's execution summaries name the node
        return f"InOrderIterator(next_index={self._next_index})"

    def _get_next_index(self) -> int:  # grain.experimental.get_next_index
        return self._next_index

    def _set_next_index(self, index: int) -> None:  # grain.experimental.set_next_index
        self.set_state({"next_index": index})

    def set_state(self, state: dict[str, Any]) -> None:
        at = next_index_of(state)
        takes = (
            f"it takes {{'next_index': <an int from 0 to {self._length}>}}, as its get_state() "
            "gives (restore a state saved from the same dataset)"
        )
        if at is None:
            raise NotAStateError(f"not a state of this dataset: {state!r}; {takes}")
        if not 0 <= at <= self._length:  # an IndexError, as Grain's own iterator raises
            raise IndexError(f"next_index {at} is out of range for {self._length} batches; {takes}")
        self._next_index = at


def dataset_source(node: Any) -> Any:
    """The data source a source dataset reads (a :class:`BatchDataset`'s, or the one Grain's
    ``MapDataset.source`` keeps), or None for any other dataset node.

    >>> dataset_source(BatchDataset([1])), dataset_source(grain.MapDataset.source([2]))
    ([1], [2])
    """
    if isinstance(node, BatchDataset):
        return node.source
    return getattr(node, "_source", None)
