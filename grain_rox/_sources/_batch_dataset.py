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
"""

from __future__ import annotations

import operator
from typing import Any

import grain


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
        with self._stats.record_self_time():
            read = self.source[self._first + operator.index(index) % len(self)]
            return self._stats.record_output_spec(read)

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


def dataset_source(node: Any) -> Any:
    """The data source a source dataset reads (a :class:`BatchDataset`'s, or the one Grain's
    ``MapDataset.source`` keeps), or None for any other dataset node.

    >>> dataset_source(BatchDataset([1])), dataset_source(grain.MapDataset.source([2]))
    ([1], [2])
    """
    if isinstance(node, BatchDataset):
        return node.source
    return getattr(node, "_source", None)
