"""Local files streamed with HF ``IterableDataset`` as a resumable Grain ``IterDataset``."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np

from grain_rox._sources._grain_setup import make_grain_workers_usable
from grain_rox._sources._identity import check_identity, split_state
from grain_rox._text._hf_checks import (
    check_nulls_arg,
    null_problem,
    python_null,
    read_errors,
    unreadable,
)
from grain_rox._text._hf_records import (
    RecordFormat,
    arrow_dtypes,
    file_kind,
    hf_datasets,
    kept_columns,
)

logger = logging.getLogger("grain_rox")
_SAMPLE = 1 << 20  # bytes hashed at each end of a data file for its identity
_WHAT = "HFStreamingSource"


def file_digest(path: str) -> str:
    """16 hex digits of SHA-256 over a file's size and its first and last MiB: content-based
    (a copy or a moved file keeps it) and cheap for files of any size."""
    size = os.path.getsize(path)
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(_SAMPLE))
        if size > _SAMPLE:
            f.seek(max(_SAMPLE, size - _SAMPLE))
            h.update(f.read(_SAMPLE))
    return h.hexdigest()[:16]


class HFStreamingSource:
    """Local files streamed with HF ``IterableDataset`` as a Grain ``IterDataset``, resumable.

    For data larger than the disk cache. Per-host sharding (``shard=(index, count)``, HF's
    ``split_dataset_by_node``), key filtering, the same numpy records as
    :class:`HFEagerSource`, and a seeded shuffle: ``shuffle_buffer=B`` serves each window of
    ``B`` consecutive rows of this host's stream in a permutation of its own, new every epoch
    (like Grain's ``WindowShuffleIterDataset``; a row never leaves its window).
    The iterator's state is a position: the ``IterableDataset``'s ``state_dict`` at the
    window's start (as a JSON string) and the outputs of the window already passed, so it
    resumes mid-epoch exactly by re-reading at most one window; its shape never changes, so
    Grain's ``assert_equal_output_after_checkpoint`` holds. The state also names the data and
    config it belongs to (each file's size and a digest of its first and last MiB, columns,
    tokenizer, shuffle buffer, seed, shard, worker slice): ``set_state`` refuses a state from
    other files or another config, naming what changed. A missing value (None) in a kept
    column is an error naming the column and row (``nulls="skip"``: such rows are left out,
    counted in the state and logged per epoch); a damaged file is an error naming the file.

    Under Grain workers (``.dataset().mp_prefetch(...)``) worker ``i`` of ``W`` serves output
    rows ``i, i + W, ...``, and Grain interleaves the workers in turn, so the stream is the
    same row for row as in one process, shuffled or not, for any ``W``; each worker's state
    is in ``mp_prefetch``'s and restores exactly with the same ``W``. Each worker reads every
    row but converts and tokenizes only its own: workers split the per-row work, not the
    file reading. ``mp_prefetch(sequential_slice=True)`` is refused (a stream's length is
    unknown). Stateful steps after the source (packing, filters) see each worker's rows
    separately, as Grain warns for any source. What it cannot do, unlike the eager source:
    random access, a global order independent of the number of hosts, and restoring on
    another host count (its position is per host). The file digest samples each file's
    ends, so an edit in the middle of a file that keeps its size goes unseen.

    >>> import tempfile, os, pyarrow as pa, pyarrow.parquet as pq
    >>> path = os.path.join(tempfile.mkdtemp(), "s.parquet")
    >>> pq.write_table(pa.table({"x": list(range(5))}), path)
    >>> it = iter(HFStreamingSource(path).dataset(num_epochs=1))
    >>> [int(next(it)["x"]) for _ in range(5)]
    [0, 1, 2, 3, 4]
    """

    def __init__(
        self,
        data_files: str | Sequence[str],
        *,
        shuffle_buffer: int = 0,
        seed: int = 0,
        shard: tuple[int, int] = (0, 1),
        include_keys: Sequence[str] | None = None,
        exclude_keys: Sequence[str] | None = None,
        tokenize: Sequence[str] | None = None,
        tokenizer: Any = None,
        append_eos: bool = True,
        nulls: str = "error",
    ) -> None:
        self.files = [data_files] if isinstance(data_files, str) else list(data_files)
        self.kind = file_kind(self.files)
        self.shuffle_buffer = int(shuffle_buffer)
        if self.shuffle_buffer < 0:
            raise ValueError(
                f"shuffle_buffer={shuffle_buffer!r} must be >= 0 (0: the files' order; B: each "
                "window of B rows shuffled)"
            )
        self.seed = int(seed)
        self.shard = (int(shard[0]), int(shard[1]))
        self.include_keys = list(include_keys) if include_keys is not None else None
        self.exclude_keys = list(exclude_keys or ())
        self.nulls = check_nulls_arg(nulls)
        self.dtypes: dict[str, np.dtype] = {}
        self.kept = self.columns()
        self.format = RecordFormat(
            columns=self.kept, tokenize=tokenize, tokenizer=tokenizer, append_eos=append_eos
        )
        self._identity: dict[str, Any] | None = None
        make_grain_workers_usable()  # a user's own mp_prefetch workers start

    def columns(self) -> list[str]:
        """The kept columns, from the files' schema (an error names unknown keys)."""
        try:
            ds = hf_datasets().load_dataset(
                self.kind, data_files=self.files[:1], split="train", streaming=True
            )
            features = ds.features
        except read_errors() as e:
            raise unreadable(self.files[:1], self.kind, e) from None
        if features is not None:  # numbers keep the files' dtypes, as in HFEagerSource
            self.dtypes = arrow_dtypes(features.arrow_schema)
        return kept_columns(list(ds.column_names or []), self.include_keys, self.exclude_keys)

    def identity(self) -> dict[str, Any]:
        """What an iterator state belongs to: the files' content and the config (JSON)."""
        if self._identity is None:
            self._identity = {
                "files": [[os.path.basename(f), file_digest(f)] for f in self.files],
                "columns": self.kept,
                "records": self.format.describe(),
                "shuffle_buffer": self.shuffle_buffer,
                "seed": self.seed,
                "shard": list(self.shard),
                "nulls": self.nulls,
            }
        return self._identity

    def has_null(self, row: Mapping[str, Any], index: int, epoch: int) -> bool:
        """Whether ``row`` (row ``index`` of this host's stream) holds a missing value (None)
        to skip; with ``nulls="error"`` such a row is an error naming the column and row."""
        for key, value in row.items():
            inside = python_null(value)
            if inside is not None:
                if self.nulls == "skip":
                    return True
                files = self.files[0] if len(self.files) == 1 else self.files
                where = f"of this host's stream, shard={self.shard}, epoch {epoch}"
                raise ValueError(
                    f"{files}: {null_problem(key, index, inside, where)}. Drop or fill such "
                    "rows in the files, pass nulls='skip' to leave them out (counted), or leave "
                    f"the column out (exclude_keys=[{key!r}])"
                )
        return False

    def record(self, row: dict[str, Any]) -> dict[str, Any]:
        """A streamed row as the eager source's record (same keys, dtypes and tokens)."""
        record = self.format.row(row)
        for key, dtype in self.dtypes.items():
            if key in record and key not in self.format.tokenize:
                record[key] = record[key].astype(dtype, copy=False)
        return record

    def build(self) -> Any:
        """The HF ``IterableDataset`` (sharded, shuffled, column-filtered)."""
        datasets = hf_datasets()
        from datasets.distributed import split_dataset_by_node

        ds = datasets.load_dataset(self.kind, data_files=self.files, split="train", streaming=True)
        columns = list(ds.column_names or [])
        if columns:  # known from the files' schema
            keep = kept_columns(columns, self.include_keys, self.exclude_keys)
            if keep != columns:
                ds = ds.select_columns(keep)
        index, count = self.shard
        if count > 1:
            ds = split_dataset_by_node(ds, rank=index, world_size=count)
        return ds  # shuffled by the iterator's own (checkpointed) buffer

    def dataset(self, *, num_epochs: int | None = 1) -> Any:
        """A ``grain.IterDataset`` over the stream (``num_epochs=None``: endless); under
        ``.mp_prefetch(...)`` each Grain worker serves its own rows (see the class doc)."""
        return _Stream(self, num_epochs)


class _Stream(grain.IterDataset):
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
        return _StreamIterator(self.source, self.num_epochs, self.worker_slice)

    def __str__(self) -> str:
        files, (start, step) = len(self.source.files), self.worker_slice
        return f"HFStreamingSource({files} files, shard={self.source.shard}, rows {start}::{step})"


class _StreamIterator(grain.DatasetIterator):
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
                self._offset += 1
                self._pass_others()
                if self._source.nulls == "error":  # "skip" left such rows out when read
                    self._source.has_null(row, index, self._epoch)  # raises on a None
                return self._source.record(row)
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
            "identity": self._identity,
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
