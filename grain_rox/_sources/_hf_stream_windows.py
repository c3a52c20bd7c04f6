"""The Grain dataset and iterator of :class:`~grain_rox.HFStreamingSource`: worker slices,
the seeded shuffle in windows of ``shuffle_buffer`` rows, and a resumable state.

The stream is read in order, in windows; each window's rows are served in a permutation
seeded by (seed, epoch, window), so output position ``g`` of the stream is a pure function of
the data and config, on any number of Grain workers. The state is HF's position at the
window's start and the outputs of the window already passed: a restore re-reads at most one
window, and the state's shape never changes.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import grain
import numpy as np

from grain_rox._sources._identity import check_identity, split_state
from grain_rox._text._hf_checks import read_errors, unreadable

if TYPE_CHECKING:
    from grain_rox._sources._hf_stream import HFStreamingSource

logger = logging.getLogger("grain_rox")
_WHAT = "HFStreamingSource"


class StreamDataset(grain.IterDataset):
    """The stream as a Grain ``IterDataset``; Grain's worker slicing hook (``set_slice``, the
    ``SupportsInPlaceSlicing`` protocol ``mp_prefetch`` uses) picks the rows one worker serves:
    rows ``start, start + step, ...`` of this host's output stream."""

    def __init__(self, source: HFStreamingSource, num_epochs: int | None) -> None:
        super().__init__()
        self.source = source
        self.num_epochs = num_epochs
        self.worker_slice = (0, 1)  # (start, step) over the output positions

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Serve only the output positions ``sl`` selects (Grain calls this in each worker
        with ``slice(i, None, num_workers)``); slices of slices compose."""
        if sequential_slice:
            raise ValueError(
                f"{_WHAT} cannot take mp_prefetch(sequential_slice=True): a worker's contiguous "
                "part needs the stream's length, which a stream only knows once read; use "
                "mp_prefetch(sequential_slice=False) (the default: worker i serves rows i, "
                "i + num_workers, ..., in the same order as one process)"
            )
        first = 0 if sl.start is None else sl.start
        every = 1 if sl.step is None else sl.step
        if sl.stop is not None or first < 0 or every < 1:
            raise ValueError(
                f"{_WHAT} streams can be sliced as slice(start, None, step) with start >= 0 and "
                f"step >= 1 (Grain's worker slices), not {sl!r}"
            )
        start, step = self.worker_slice
        self.worker_slice = (start + first * step, step * every)

    def __iter__(self) -> Any:
        return StreamIterator(self.source, self.num_epochs, self.worker_slice)

    def __str__(self) -> str:
        files, (start, step) = len(self.source.files), self.worker_slice
        return f"HFStreamingSource({files} files, shard={self.source.shard}, rows {start}::{step})"


class StreamIterator(grain.DatasetIterator):
    """Grain iterator over an HF stream, shuffled in windows of ``shuffle_buffer`` rows.

    The stream is read in order (HF's ``state_dict`` is then exact) in windows; each window's
    rows are served in a permutation seeded by (seed, epoch, window), so output position ``g``
    of the stream is a pure function of the data and config. A worker serving the positions of
    its slice reads every row but converts (tokenizes) only its own. The state is the HF
    position at the window's start and the number of its outputs passed: a restore re-reads
    at most one window, and the state's shape never changes.
    """

    def __init__(
        self, source: HFStreamingSource, num_epochs: int | None, worker_slice: tuple[int, int]
    ) -> None:
        super().__init__()
        self._source = source
        self._num_epochs = num_epochs
        self._start, self._step = worker_slice
        self._identity = {**source.identity(), "worker_slice": [self._start, self._step]}
        self._size = max(1, source.shuffle_buffer)
        self._epoch = 0
        self._kept_at = 0  # output positions (kept rows, all epochs) before the window
        self._start_epoch()

    def _start_epoch(self) -> None:
        self._ds = self._source.build()
        self._it: Any = None
        self._pulled = 0  # rows read from the files this epoch (named by null errors)
        self._skipped = 0  # of which left out for a missing value (nulls="skip")
        self._begin_window(0)

    def _begin_window(self, index: int) -> None:
        self._window_index = index
        self._window: list[tuple[int, dict[str, Any]]] | None = None  # read on demand
        self._order: Any = None
        self._offset = 0  # outputs of this window passed (served, or another worker's)
        self._rows_at, self._skipped_at = self._pulled, self._skipped
        self._window_hf = self._ds.state_dict()

    def _mine(self, position: int) -> bool:
        return position >= self._start and (position - self._start) % self._step == 0

    def _next_row(self) -> dict[str, Any]:
        try:
            return next(self._it)
        except StopIteration:
            raise
        except read_errors() as e:
            raise unreadable(self._source.files, self._source.kind, e) from None
        except OverflowError as e:  # Arrow's date or time made a Python one out of its range
            raise ValueError(
                f"{self._source.named_files}: row {self._pulled} of this host's "
                f"stream (shard={self._source.shard}, epoch {self._epoch}) holds a date or "
                f"time outside Python's range (years 1-9999; {e}), and a stream's rows arrive "
                "as Python values; read the files with HFEagerSource (numpy's datetimes hold "
                "it), or cast the column to int64 in the files"
            ) from None

    def _read_window(self) -> None:
        if self._it is None:
            self._it = iter(self._ds)
        skip = self._source.nulls == "skip"  # a left-out row moves every later row's position
        rows: list[tuple[int, dict[str, Any]]] = []
        while len(rows) < self._size:
            try:
                row = self._next_row()
            except StopIteration:
                break
            index = self._pulled
            self._pulled += 1
            if skip and self._source.has_null(row, index, self._epoch):
                self._skipped += 1
                continue
            rows.append((index, row))
        self._window = rows
        if len(rows) > 1:
            seed = [self._source.seed, self._epoch, self._window_index]
            self._order = np.random.default_rng(seed).permutation(len(rows))
        else:
            self._order = range(len(rows))
        if self._offset > len(rows):
            raise ValueError(
                _edited(f"'offset' is {self._offset}, past its window's {len(rows)} rows")
            )

    def _pass_others(self) -> None:
        """Step over the window's outputs that other workers serve; at its end, start the next
        window (so a state taken here restores without re-reading this one)."""
        assert self._window is not None
        while self._offset < len(self._window) and not self._mine(self._kept_at + self._offset):
            self._offset += 1
        if self._offset == len(self._window) and self._window:
            self._kept_at += len(self._window)
            self._begin_window(self._window_index + 1)

    def __next__(self) -> dict[str, np.ndarray]:
        while True:
            if self._num_epochs is not None and self._epoch >= self._num_epochs:
                raise StopIteration
            if self._window is None:
                self._read_window()
                self._pass_others()
            if self._window:
                index, row = self._window[self._order[self._offset]]
                # checked before the position moves on: a refused row stays the next one
                # (refused again), never passed by a retry or a state taken after the error
                if self._source.nulls == "error":  # "skip" left such rows out when read
                    self._source.has_null(row, index, self._epoch)  # raises on a None
                record = self._source.record(row, index, self._epoch)
                self._offset += 1
                self._pass_others()
                return record
            if self._window is not None:  # an empty window: the epoch is over
                self._end_epoch()

    def _end_epoch(self) -> None:
        if self._pulled == self._skipped:
            left_out = f" (all {self._pulled} left out: nulls='skip')" if self._skipped else ""
            raise ValueError(
                f"{self._source.files} give this host no rows{left_out} "
                f"(shard={self._source.shard}): an epoch would be empty; use fewer hosts than "
                "files' rows, or more data"
            )
        if self._skipped and self._start == 0:  # every worker counts them: one logs
            logger.warning(
                "HFStreamingSource(nulls='skip') left out %d of %d rows of epoch %d "
                "(shard=%s): they have a missing value (None)",
                self._skipped,
                self._pulled,
                self._epoch,
                self._source.shard,
            )
        self._epoch += 1
        self._start_epoch()

    def get_state(self) -> dict[str, Any]:
        return {
            # a copy: its lists are the source's own, which every later iterator checks against
            "identity": copy.deepcopy(self._identity),
            "state": {
                "epoch": self._epoch,
                "window": self._window_index,
                "offset": self._offset,
                "hf": json.dumps(self._window_hf),  # a string: HF's dict changes shape
                "rows": self._rows_at,
                "skipped": self._skipped_at,
                "kept": self._kept_at,
            },
        }

    def set_state(self, state: dict[str, Any]) -> None:
        saved, inner = split_state(state, what=_WHAT)
        check_identity(saved, self._identity, what=_WHAT)
        _check_inner(inner)
        if inner["offset"] >= self._size or inner["skipped"] > inner["rows"]:
            raise ValueError(
                _edited(
                    f"'offset' {inner['offset']} must be below the window size {self._size} "
                    f"and 'skipped' {inner['skipped']} at most 'rows' {inner['rows']}"
                )
            )
        _check_within_epochs(inner, self._num_epochs)
        self._epoch = inner["epoch"]
        self._start_epoch()
        try:
            hf = json.loads(inner["hf"])
            self._ds.load_state_dict(hf)
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise ValueError(_edited(f"its hf position does not load ({e!r})")) from None
        self._pulled, self._skipped = inner["rows"], inner["skipped"]
        self._kept_at = inner["kept"]
        self._begin_window(inner["window"])
        self._window_hf = hf
        self._offset = inner["offset"]


def _check_within_epochs(inner: Mapping[str, Any], num_epochs: int | None) -> None:
    """Refuse a state past the end of a stream of ``num_epochs`` epochs. The epochs may be
    more or fewer than at the save (each epoch is read afresh, so the rows already served are
    the same), but a state in an epoch the stream no longer has would end it at once; the
    start of epoch ``num_epochs`` is the end itself (the state of an exhausted iterator)."""
    epoch = inner["epoch"]
    at_start = inner["window"] == inner["offset"] == inner["rows"] == 0
    needed = epoch if at_start else epoch + 1
    if num_epochs is not None and needed > num_epochs:
        raise ValueError(
            f"cannot restore this {_WHAT} state: it is in epoch {epoch} (counting from 0), "
            f"past the end of a stream of num_epochs={num_epochs}; restore with num_epochs >= "
            f"{needed} (or None: endless), as at the save, or start a new run"
        )


def _edited(problem: str) -> str:
    return (
        f"not a {_WHAT} state: {problem}; pass the state get_state() returned, unchanged "
        "(a JSON round trip is fine)"
    )


_STATE_TYPES: dict[str, tuple[type, ...]] = {
    "epoch": (int,),
    "window": (int,),
    "offset": (int,),
    "hf": (str,),
    "rows": (int,),
    "skipped": (int,),
    "kept": (int,),
}


def _check_inner(inner: Any) -> None:
    """Type-check a (possibly hand-edited) inner state: keys, types, non-negative counts."""
    if not isinstance(inner, Mapping) or set(inner) != set(_STATE_TYPES):
        shown = sorted(inner) if isinstance(inner, Mapping) else type(inner).__name__
        raise ValueError(_edited(f"its 'state' has keys {shown}, expected {sorted(_STATE_TYPES)}"))
    for key, types in _STATE_TYPES.items():
        value = inner[key]
        wrong_bool = isinstance(value, bool) and bool not in types
        negative = isinstance(value, int) and value < 0
        if wrong_bool or negative or not isinstance(value, types):
            expected = "an int >= 0" if types == (int,) else types[0].__name__
            raise ValueError(_edited(f"{key!r} is {value!r}, expected {expected}"))
