"""Local files streamed with HF ``IterableDataset`` as a resumable Grain ``IterDataset``."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np

from grain_rox._hf_checks import (
    check_nulls_arg,
    null_problem,
    python_null,
    read_errors,
    unreadable,
)
from grain_rox._hf_records import (
    RecordFormat,
    arrow_dtypes,
    file_kind,
    hf_datasets,
    kept_columns,
)
from grain_rox._identity import check_identity, split_state

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
    ``split_dataset_by_node``), a seeded shuffle buffer reshuffled every epoch, key filtering,
    and the same numpy records as :class:`HFEagerSource`. The iterator's ``get_state`` /
    ``set_state`` carry the ``IterableDataset``'s own ``state_dict``, so it resumes mid-epoch
    exactly (the shuffle buffer is grain_rox's own and is saved with it: HF's would lose the
    buffered examples). The state also names the data and config it belongs to (each file's
    size and a digest of its first and last MiB, columns, tokenizer, shuffle buffer, seed,
    shard): ``set_state`` refuses a state from other files or another config, naming what
    changed. A missing value (None) in a kept column is an error naming the column and row
    (``nulls="skip"``: such rows are left out, counted in the state and logged per epoch); a
    damaged file is an error naming the file. What it cannot do, unlike the eager source:
    random access, a global order independent of the number of hosts, and restoring on
    another host count (its position is per host); and its state grows with
    ``shuffle_buffer``. The file digest samples each file's ends, so an edit in the middle
    of a file that keeps its size goes unseen.

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
        """A ``grain.IterDataset`` over the stream (``num_epochs=None``: endless)."""
        source = self

        class _Stream(grain.IterDataset):
            def __iter__(self) -> Any:
                return _StreamIterator(source, num_epochs)

            def __str__(self) -> str:
                return f"HFStreamingSource({len(source.files)} files, shard={source.shard})"

        return _Stream()


def _to_json(value: Any) -> Any:
    """A record (nested dicts of arrays) as JSON: each array as [dtype, shape, values]."""
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    return [value.dtype.str, list(value.shape), value.tolist()]


def _from_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _from_json(v) for k, v in value.items()}
    dtype, shape, values = value
    return np.asarray(values, dtype=np.dtype(dtype)).reshape(shape)


class _StreamIterator(grain.DatasetIterator):
    """Grain iterator over an HF stream, with its own seeded shuffle buffer.

    HF's own shuffle buffer is not part of its ``state_dict``: the buffered examples would be
    lost on a restore. Here the stream is read in order (HF's state is then exact) and the
    buffer, with its RNG state, is part of the iterator state, so a restore continues exactly.
    """

    def __init__(self, source: HFStreamingSource, num_epochs: int | None) -> None:
        super().__init__()
        self._source = source
        self._num_epochs = num_epochs
        self._epoch = 0
        self._restored_mid_epoch = False
        self._start_epoch()

    def _start_epoch(self) -> None:
        self._ds = self._source.build()
        self._it: Any = None
        self._buffer: list[dict[str, np.ndarray]] = []
        self._rng = np.random.default_rng([self._source.seed, self._epoch])
        self._drained = False
        self._served = 0  # rows this epoch: an epoch of none would loop forever
        self._pulled = 0  # rows read from the files this epoch (named by null errors)
        self._skipped = 0  # of which left out for a missing value (nulls="skip")
        self._loaded: Any = None  # HF state restored but not yet iterated from

    def _next_row(self) -> dict[str, Any]:
        try:
            return next(self._it)
        except StopIteration:
            raise
        except read_errors() as e:
            raise unreadable(self._source.files, self._source.kind, e) from None

    def _fill(self) -> None:
        if self._it is None:
            self._it = iter(self._ds)
            self._loaded = None
        size = max(1, self._source.shuffle_buffer)
        while not self._drained and len(self._buffer) < size:
            try:
                row = self._next_row()
            except StopIteration:
                self._drained = True
                break
            null = self._source.has_null(row, self._pulled, self._epoch)
            self._pulled += 1
            if null:
                self._skipped += 1
                continue
            self._buffer.append(self._source.record(row))

    def __next__(self) -> dict[str, np.ndarray]:
        while True:
            if self._num_epochs is not None and self._epoch >= self._num_epochs:
                raise StopIteration
            self._fill()
            if self._buffer:
                pick = int(self._rng.integers(len(self._buffer))) if len(self._buffer) > 1 else 0
                self._buffer[pick], self._buffer[-1] = self._buffer[-1], self._buffer[pick]
                self._served += 1
                return self._buffer.pop()
            if self._served == 0 and not self._restored_mid_epoch:
                raise ValueError(
                    f"{self._source.files} give this host no rows (shard={self._source.shard}): "
                    "an epoch would be empty; use fewer hosts than files' rows, or more data"
                )
            if self._skipped:
                logger.warning(
                    "HFStreamingSource(nulls='skip') left out %d of %d rows of epoch %d "
                    "(shard=%s): they have a missing value (None)",
                    self._skipped,
                    self._pulled,
                    self._epoch,
                    self._source.shard,
                )
            self._epoch += 1
            self._restored_mid_epoch = False
            self._start_epoch()

    def get_state(self) -> dict[str, Any]:
        return {
            "identity": self._source.identity(),
            "state": {
                "epoch": self._epoch,
                # right after set_state HF reports its epoch start until it is iterated again
                "hf": self._loaded if self._loaded is not None else self._ds.state_dict(),
                "buffer": [_to_json(r) for r in self._buffer],
                "rng": self._rng.bit_generator.state,
                "drained": self._drained,
                "rows": self._pulled,
                "skipped": self._skipped,
            },
        }

    def set_state(self, state: dict[str, Any]) -> None:
        saved, inner = split_state(state, what=_WHAT)
        check_identity(saved, self._source.identity(), what=_WHAT)
        _check_inner(inner)
        self._epoch = inner["epoch"]
        self._start_epoch()
        try:
            buffer = [_from_json(r) for r in inner["buffer"]]
            self._rng.bit_generator.state = inner["rng"]
            self._ds.load_state_dict(inner["hf"])
        except (TypeError, ValueError, KeyError) as e:
            raise ValueError(
                _edited(f"its buffer, rng or hf position does not load ({e})")
            ) from None
        self._loaded = inner["hf"]
        self._restored_mid_epoch = True  # rows of this epoch may all have been served already
        self._buffer = buffer
        self._drained = inner["drained"]
        self._pulled = inner["rows"]
        self._skipped = inner["skipped"]


def _edited(problem: str) -> str:
    return (
        f"not a {_WHAT} state: {problem}; pass the state get_state() returned, unchanged "
        "(a JSON round trip is fine)"
    )


_STATE_TYPES: dict[str, tuple[type, ...]] = {
    "epoch": (int,),
    "hf": (dict,),
    "buffer": (list,),
    "rng": (dict,),
    "drained": (bool,),
    "rows": (int,),
    "skipped": (int,),
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
