"""One Grain worker's share of a packed stream: every n-th packed batch, not every n-th document.

Grain's ``mp_prefetch`` gives worker ``i`` of ``n`` the slice ``i::n`` of a dataset's source,
and packing worker ``i``'s documents alone gives other batches than packing all of them (the
stream would depend on the worker count). :class:`WorkerShare` moves the slice to the packed
batches instead, so :func:`~grain_rox.pack_documents` yields the in-process stream under any
number of workers.
"""

from __future__ import annotations

from typing import Any

import grain


class WorkerShare(grain.IterDataset):
    """Batches ``start, start + step, ...`` of the packed stream (all of them in-process).

    Grain's ``mp_prefetch`` gives worker ``i`` of ``n`` the slice ``i::n`` of the dataset's
    source, and packing worker ``i``'s documents alone gives other batches than packing all
    of them (the stream would depend on the worker count). Here the slice stops at the packed
    batches: each worker packs the whole stream and keeps batches ``i, i + n, ...``, which
    Grain interleaves back in order, so the stream equals the in-process one for any number of
    workers. Packing then runs beside the training loop but is not split between workers."""

    def __init__(self, parent: grain.IterDataset) -> None:
        super().__init__(parent)
        self._start, self._step = 0, 1

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Grain's in-worker slicing hook (``SupportsInPlaceSlicing``)."""
        start, step = sl.start or 0, sl.step or 1
        if sequential_slice or sl.stop is not None or start < 0 or step < 1:
            raise ValueError(
                f"pack_documents: cannot take the slice {sl} (sequential_slice="
                f"{sequential_slice}) of a packed stream, whose length is not known before "
                "packing; use mp_prefetch(...) without sequential_slice (each worker then keeps "
                "every n-th packed batch), or pack_documents(..., shard=(index, count))"
            )
        self._start, self._step = self._start + start * self._step, self._step * step

    def __iter__(self) -> grain.DatasetIterator:
        return WorkerShareIterator(self._parent.__iter__(), self._start, self._step)

    def __str__(self) -> str:
        return f"WorkerShare(start={self._start}, step={self._step})"


class WorkerShareIterator(grain.DatasetIterator):
    def __init__(self, parent: grain.DatasetIterator, start: int, step: int) -> None:
        super().__init__(parent)
        self._skip = start  # packed batches to pass over before the next one served
        self._step = step

    def __next__(self) -> Any:
        while self._skip:
            next(self._parent)
            self._skip -= 1
        value = next(self._parent)
        self._skip = self._step - 1
        return value

    def get_state(self) -> dict[str, Any]:
        return {"parent": self._parent.get_state(), "skip": self._skip}

    def set_state(self, state: dict[str, Any]) -> None:
        ok = isinstance(state, dict) and set(state) == {"parent", "skip"}
        skip = state["skip"] if ok else None
        if not isinstance(skip, int) or isinstance(skip, bool) or skip < 0:
            raise ValueError(
                f"not a pack_documents state: {str(state)[:200]}; pass the state get_state() "
                "returned, unchanged"
            )
        self._parent.set_state(state["parent"])
        self._skip = skip

    def close(self) -> None:
        closer = getattr(self._parent, "close", None)
        if callable(closer):
            closer()
