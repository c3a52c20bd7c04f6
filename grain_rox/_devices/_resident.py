"""The device-resident input of :class:`~grain_rox.MultiHostDataLoadIterator`.

``MultiHostDataLoadIterator(source.batches(...), placement="device")`` places every row of a
small fixed-shape source (:class:`~grain_rox.NumpySource`, :class:`~grain_rox.HFEagerSource`,
:class:`~grain_rox.ArrayRecordSource` with ``shape=``, or any source given to
:func:`~grain_rox.shuffled_batches`, e.g. a :class:`~grain_rox.RoxTokenSource`) on the devices
once (see ``_resident_data``); each global batch is then gathered there by a compiled
function from its row numbers, computed on the host by the same per-epoch Feistel order as
the host path. So the batches are bit-identical to the host path's (same source, seed, batch
size, epochs), and so is the state: ``{"identity": <the .batches() identity>, "state":
{"next_index": k}}`` under ``"grain"``. A run switches between host and device paths across
a restore, on any number of processes (the identity holds no shard, the position is global).

A batch is made in the caller's thread: the compiled gather is dispatched asynchronously, so
there is no host work to overlap and no prefetch thread.

>>> import numpy as np
>>> from grain_rox import NumpySource
>>> whole = batches_feed(NumpySource(np.arange(12)).batches(4, seed=1))
>>> whole.shard, len(whole), len(whole.rows(0))
((0, 1), 3, 4)
"""

from __future__ import annotations

import collections
import functools
import logging
import sys
from collections.abc import Iterator
from typing import Any

import grain
import jax
import numpy as np
from jax.sharding import NamedSharding

from grain_rox._devices._iterator_state import check_step
from grain_rox._devices._placement import refuse_unsplit_batch
from grain_rox._devices._resident_data import BLOCK, ResidentRows
from grain_rox._sources._batch_dataset import InOrderIterDataset, dataset_source
from grain_rox._sources._batches import BatchSource, batch_identity
from grain_rox._sources._identity import (
    IdentifiedIterDataset,
    IdentifiedMapDataset,
    check_identity,
    split_state,
)

PLACEMENTS = ("host", "device", "auto")
_log = logging.getLogger("grain_rox")

_ACCEPTED = (
    "a .batches() dataset (NumpySource / HFEagerSource / ArrayRecordSource(shape=...) "
    ".batches(...), or grain_rox.shuffled_batches(source, ...)), as it is or after "
    ".to_iter_dataset(...), with no transformation after it (its rows are gathered on the "
    "devices, where a .map cannot run)"
)


def _source_map(ds: Any) -> Any:
    """The ``BatchDataset`` of a ``.batches()`` dataset (or its ``to_iter_dataset``)."""
    if isinstance(ds, IdentifiedMapDataset):
        return ds._parent
    if isinstance(ds, IdentifiedIterDataset):
        inner = ds._parent  # Grain's PrefetchIterDataset over the MapDataset, or ours
        if isinstance(inner, InOrderIterDataset) or type(inner).__name__ == "PrefetchIterDataset":
            return inner._parent
    return None


def batch_source_of(ds: Any) -> BatchSource | None:
    """The :class:`BatchSource` behind a ``.batches()`` dataset ``ds`` (as it is or after
    ``.to_iter_dataset(...)``, nothing after it), or None for any other input."""
    source_map = _source_map(ds)
    batches = dataset_source(source_map)
    if not isinstance(source_map, grain.MapDataset) or not isinstance(batches, BatchSource):
        return None
    return batches


def batch_source_beneath(ds: Any) -> BatchSource | None:
    """The :class:`BatchSource` of the one ``.batches()`` dataset a Grain dataset ``ds`` is
    made from, through any transformations (``.map``, ``mp_prefetch``), or None (none, or
    several: a mixture)."""
    found: list[BatchSource] = []
    nodes, seen = [ds], set()
    while nodes:
        node = nodes.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        batches = dataset_source(node)
        if isinstance(batches, BatchSource):
            found.append(batches)
            continue
        nodes.extend(getattr(node, "parents", ()) or ())
    return found[0] if len(found) == 1 else None


def batches_feed(ds: Any) -> BatchSource:
    """The whole (unsharded) :class:`BatchSource` behind a ``.batches()`` dataset ``ds``, or a
    ValueError saying what placement='device' takes."""
    batches = batch_source_of(ds)
    if batches is None:
        raise ValueError(f"placement='device' takes {_ACCEPTED}; got {type(ds).__name__}")
    mine = (jax.process_index(), jax.process_count())
    if batches.shard not in ((0, 1), mine):  # the host path reads a shard's rows as its own
        raise ValueError(
            f"placement='device': the dataset's shard={batches.shard} is neither this "
            f"process's share {mine} nor the whole batch (0, 1); the devices serve each global "
            "batch whole and split it over the mesh. Make the dataset with one of those "
            "shards, or pass placement='host'"
        )
    return BatchSource(
        batches.source,
        batches.batch_size,
        seed=batches.seed,
        shuffle=batches.shuffle,
        num_epochs=batches.num_epochs,
        shard=(0, 1),  # every row of a global batch: the devices take their own
    )


class _Blocks:
    """Global batches from ``next_index`` on, gathered ``BLOCK`` at a time."""

    def __init__(self, feed: ResidentFeed, start: int) -> None:
        self.feed, self.next_index = feed, start
        self.ready: collections.deque[Any] = collections.deque()

    def __iter__(self) -> _Blocks:
        return self

    def __next__(self) -> Any:
        if self.next_index >= len(self.feed.batches):
            raise StopIteration
        if not self.ready:
            self.ready.extend(self.feed.gather_from(self.next_index))
        self.next_index += 1
        return self.ready.popleft()


class ResidentFeed:
    """A ``.batches()`` dataset served from the devices (see the module doc)."""

    state_key = "grain"
    in_caller = True  # batches come out of host_iterator already on the devices

    def __init__(
        self, batches: BatchSource, sharding: NamedSharding, *, budget: int | None = None
    ) -> None:
        self.batches = batches
        self.identity = batch_identity(batches)  # the host path's: a state moves between them
        self.what = f"{type(batches.source).__name__}.batches()"
        size = batches.batch_size
        refuse_unsplit_batch(f"batch_size={size}", size, sharding, "batch size")
        self.rows = ResidentRows(
            batches.source, sharding, batch_size=batches.batch_size, budget=budget
        )
        self.layout = self.rows.layout

    def gather_from(self, first: int) -> list[Any]:
        """Global batches ``first, first + 1, ...`` (up to ``BLOCK``, not past the end)."""
        count = min(BLOCK, len(self.batches) - first)
        rows = [self.batches.rows(first + k) for k in range(count)]
        rows += [rows[-1]] * (BLOCK - count)  # one compiled shape; the extra ones are dropped
        return list(self.rows.gather(np.stack(rows))[:count])

    @functools.cached_property
    def length(self) -> int | None:
        n = len(self.batches)
        return None if n >= sys.maxsize else n

    def no_length(self) -> TypeError:
        return TypeError("this iterator is endless (num_epochs=None): it has no len()")

    def host_iterator(self, start_step: int, position: Any) -> Iterator[Any]:
        start = start_step if position is None else position["state"]["next_index"]
        return _Blocks(self, start)

    def position(self, host_iterator: Any) -> Any:
        return {"identity": self.identity, "state": {"next_index": host_iterator.next_index}}

    def global_rows(self, local_rows: int) -> int:
        return self.batches.batch_size

    def check_rows(self, arrays: list[np.ndarray]) -> None:
        pass  # the batch size was checked against the mesh when the feed was made

    def on_device(self, batch: Any) -> Any:
        return batch

    def saved(self, position: Any) -> Any:
        return position

    def restore(self, decoded: dict[str, Any]) -> Any:
        """The position in ``decoded`` (the host path's or ours: the same format), after
        checking it holds this data and order and a position within it."""
        if "pipeline" in decoded:
            raise ValueError(
                "cannot restore this data state on an iterator over a .batches() dataset: it "
                f"was saved from an iterator over a TokenPipeline ({str(decoded['pipeline'])[:200]})"
                "; restore it on an iterator over that same TokenPipeline"
            )
        position, step = decoded["grain"], decoded["step"]
        if position is None:
            if step > 0:
                raise ValueError(
                    f"this data state says {step} batches were served but holds no position, "
                    "so it cannot resume there; pass the state get_state() returned, unchanged"
                )
            return None
        if isinstance(position, dict) and set(position) == {"bytes"}:
            raise ValueError(
                f"cannot restore this data state on {self.what} served from the devices: it was "
                "saved from an iterator over a grain.DataLoader; restore it on that DataLoader"
            )
        saved, inner = split_state(position, what=self.what)
        check_identity(saved, self.identity, what=self.what)
        index = inner.get("next_index") if isinstance(inner, dict) else None
        limit = len(self.batches)
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index <= limit:
            raise ValueError(
                f"cannot restore this {self.what} state: its position {inner!r:.200} is not "
                f"{{'next_index': <an int from 0 to {limit}>}}; pass the state get_state() "
                "returned, unchanged"
            )
        check_step(step, self.length, limit=sys.maxsize, what=f"this {self.what} dataset")
        return {"identity": self.identity, "state": {"next_index": index}}


def resident_feed(
    dataset: Any, sharding: NamedSharding, placement: str, budget: int | None
) -> ResidentFeed | None:
    """The device-resident feed for ``placement`` ("device": it or an error; "auto": it
    when the input is a ``.batches()`` dataset whose rows fit, else None with a log line
    saying why; "host": None)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement={placement!r} must be one of {PLACEMENTS}")
    if placement == "host":
        return None
    try:
        return ResidentFeed(batches_feed(dataset), sharding, budget=budget)
    except ValueError as e:
        if placement == "device":
            raise
        _log.info("MultiHostDataLoadIterator(placement='auto') reads on the host: %s", e)
        return None
