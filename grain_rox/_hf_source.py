"""HuggingFace ``datasets`` data held eagerly (Arrow, memory-mapped) as a Grain source.

:class:`HFEagerSource` wraps a ``datasets.Dataset`` (or builds one from local Parquet / JSON /
Arrow files or a dict; never the Hub) as a plain ``RandomAccessDataSource``: records are dicts
of numpy arrays, reads of many rows are one Arrow ``take`` (:meth:`HFEagerSource._getitems`,
:meth:`HFEagerSource.get_batch`), and pickling carries only the Arrow cache file paths, which
every Grain worker reopens memory-mapped: no data is copied. A dataset that lives only in
memory (``Dataset.from_dict``) is first written to an Arrow cache (``cache_dir``, default a
temporary directory) so that workers can share it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".json": "json", ".jsonl": "json",
            ".arrow": "arrow"}  # fmt: skip


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise ImportError(
            "HFEagerSource needs HuggingFace datasets: pip install 'grain_rox[hf]'"
        ) from None
    return datasets


def _file_kind(files: Sequence[str]) -> str:
    """The one format of ``files`` (parquet, json or arrow); errors name the bad files."""
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        raise FileNotFoundError(f"data files not found: {missing}")
    kinds = {_FORMATS.get(os.path.splitext(f)[1].lower()) for f in files}
    if len(kinds) != 1 or None in kinds:
        raise ValueError(
            f"data files {list(files)} must all be .parquet, .json/.jsonl or .arrow (one kind)"
        )
    return str(kinds.pop())


def _kept_columns(
    columns: Sequence[str], include: Sequence[str] | None, exclude: Sequence[str] | None
) -> list[str]:
    """``columns`` filtered by include/exclude keys; unknown keys are errors."""
    for name, keys in (("include_keys", include), ("exclude_keys", exclude)):
        unknown = sorted(set(keys or ()) - set(columns))
        if unknown:
            raise ValueError(f"{name} names missing columns {unknown}; columns: {list(columns)}")
    keep = [c for c in columns if (include is None or c in include) and c not in set(exclude or ())]
    if not keep:
        raise ValueError(f"no column left after include/exclude keys; columns: {list(columns)}")
    return keep


def _load_files(files: Sequence[str]) -> Any:
    datasets = _datasets()
    kind = _file_kind(files)
    if kind == "arrow":
        parts = [datasets.Dataset.from_file(f) for f in files]
        return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    return datasets.load_dataset(kind, data_files=list(files), split="train")


class HFEagerSource:
    """A HuggingFace dataset as a Grain ``RandomAccessDataSource`` of numpy dicts.

    >>> import datasets
    >>> ds = datasets.Dataset.from_dict({"ids": [[1, 2], [3, 4]], "label": [0, 1], "t": ["a", "b"]})
    >>> source = HFEagerSource(ds, exclude_keys=["t"])
    >>> len(source), source[1]["ids"].tolist(), source.get_batch([0, 1])["label"].tolist()
    (2, [3, 4], [0, 1])
    """

    def __init__(
        self,
        dataset: Any = None,
        *,
        data_files: str | Sequence[str] | None = None,
        data: Mapping[str, Sequence[Any]] | None = None,
        include_keys: Sequence[str] | None = None,
        exclude_keys: Sequence[str] | None = None,
        cache_dir: str | None = None,
    ) -> None:
        given = [x is not None for x in (dataset, data_files, data)]
        if sum(given) != 1:
            raise ValueError("give exactly one of dataset=, data_files= or data=")
        datasets = _datasets()
        if data_files is not None:
            dataset = _load_files([data_files] if isinstance(data_files, str) else data_files)
        elif data is not None:
            dataset = datasets.Dataset.from_dict(dict(data))
        if isinstance(dataset, datasets.DatasetDict):
            raise ValueError(
                f"got a DatasetDict with splits {list(dataset)}; pass one split, e.g. ds['train']"
            )
        if not isinstance(dataset, datasets.Dataset):
            raise TypeError(f"dataset must be a datasets.Dataset, got {type(dataset).__name__}")
        if len(dataset) == 0:
            raise ValueError("the dataset is empty: a Grain source needs at least one row")
        keep = _kept_columns(list(dataset.column_names), include_keys, exclude_keys)
        if not dataset.cache_files:  # in memory only: write an Arrow cache workers can map
            target = cache_dir or tempfile.mkdtemp(prefix="grain_rox_hf_")
            dataset.save_to_disk(target)
            dataset = datasets.load_from_disk(target)
        self.columns = keep
        self.files = [f["filename"] for f in dataset.cache_files]
        self.features = {c: str(dataset.features[c]) for c in keep}
        self._num_rows = len(dataset)
        self._identity = self._fingerprint()
        self._lock = threading.Lock()
        self._dataset: Any = dataset.select_columns(keep).with_format("numpy")

    def _fingerprint(self) -> str:
        facts = [[os.path.basename(f), os.path.getsize(f)] for f in self.files] + [
            self._num_rows,
            self.columns,
            self.features,
        ]
        return hashlib.sha1(json.dumps(facts).encode()).hexdigest()[:16]

    @property
    def dataset(self) -> Any:
        """The (column-filtered, numpy-formatted) dataset, reopened lazily after pickling."""
        if self._dataset is None:
            with self._lock:
                if self._dataset is None:
                    datasets = _datasets()
                    parts = [datasets.Dataset.from_file(f) for f in self.files]
                    ds = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
                    self._dataset = ds.select_columns(self.columns).with_format("numpy")
        return self._dataset

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_dataset"] = None  # workers reopen the Arrow files memory-mapped
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._num_rows

    def __repr__(self) -> str:
        return (
            f"HFEagerSource(rows={self._num_rows}, columns={self.columns}, "
            f"fingerprint={self._identity})"
        )

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        index = int(index)
        if not 0 <= index < self._num_rows:
            raise IndexError(f"row {index} is out of range for {self._num_rows} rows")
        row = self.dataset[index]
        return {k: np.asarray(v) for k, v in row.items()}

    def _getitems(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        """Many rows with one Arrow ``take``."""
        batch = self.dataset[[int(i) for i in indices]]
        return [{k: np.asarray(batch[k][j]) for k in self.columns} for j in range(len(indices))]

    __getitems__ = _getitems

    def get_batch(self, indices: Sequence[int]) -> dict[str, np.ndarray]:
        """Rows ``indices`` stacked per column (one Arrow call); ragged columns are an error
        naming the column and the rows whose shapes differ."""
        batch = self.dataset[[int(i) for i in indices]]
        out = {}
        for key in self.columns:
            value = batch[key]
            if value.dtype == object:
                shapes = [np.shape(v) for v in value]
                if len(set(shapes)) > 1:
                    first = shapes[0]
                    rows = [int(indices[j]) for j, s in enumerate(shapes) if s != first][:5]
                    raise ValueError(
                        f"column {key!r} is ragged: row {int(indices[0])} has shape {first} but "
                        f"rows {rows} differ; pack or pad it (grain_rox.pack_documents) or "
                        "exclude it"
                    )
                value = np.stack(list(value))
            out[key] = value
        return out


class HFStreamingSource:
    """Local files streamed with HF ``IterableDataset`` as a Grain ``IterDataset``, resumable.

    For data larger than the disk cache. Per-host sharding (``shard=(index, count)``, HF's
    ``split_dataset_by_node``), a seeded shuffle buffer reshuffled every epoch, key filtering,
    and the same numpy records as :class:`HFEagerSource`. The iterator's ``get_state`` /
    ``set_state`` carry the ``IterableDataset``'s own ``state_dict``, so it resumes mid-epoch
    exactly (the shuffle buffer is grain_rox's own and is saved with it: HF's would lose the
    buffered examples). What it cannot do, unlike the eager source: random access, a global
    order independent of the number of hosts, and restoring on another host count (its
    position is per host); and its state grows with ``shuffle_buffer``.

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
    ) -> None:
        self.files = [data_files] if isinstance(data_files, str) else list(data_files)
        self.kind = _file_kind(self.files)
        self.shuffle_buffer = int(shuffle_buffer)
        self.seed = int(seed)
        self.shard = (int(shard[0]), int(shard[1]))
        self.include_keys = list(include_keys) if include_keys is not None else None
        self.exclude_keys = list(exclude_keys or ())

    def build(self) -> Any:
        """The HF ``IterableDataset`` (sharded, shuffled, column-filtered)."""
        datasets = _datasets()
        from datasets.distributed import split_dataset_by_node

        ds = datasets.load_dataset(self.kind, data_files=self.files, split="train", streaming=True)
        columns = list(ds.column_names or [])
        if columns:  # known from the files' schema
            keep = _kept_columns(columns, self.include_keys, self.exclude_keys)
            if keep != columns:
                ds = ds.select_columns(keep)
        index, count = self.shard
        if count > 1:
            ds = split_dataset_by_node(ds, rank=index, world_size=count)
        return ds  # shuffled by the iterator's own (checkpointed) buffer

    def dataset(self, *, num_epochs: int | None = 1) -> Any:
        """A ``grain.IterDataset`` over the stream (``num_epochs=None``: endless)."""
        import grain

        source = self

        class _Stream(grain.IterDataset):
            def __iter__(self) -> Any:
                return _StreamIterator(source, num_epochs)

            def __str__(self) -> str:
                return f"HFStreamingSource({len(source.files)} files, shard={source.shard})"

        return _Stream()


def _stream_iterator_base() -> Any:
    import grain

    return grain.DatasetIterator


def _to_json(record: dict[str, np.ndarray]) -> dict[str, Any]:
    return {k: [v.dtype.str, list(v.shape), v.tolist()] for k, v in record.items()}


def _from_json(record: dict[str, Any]) -> dict[str, np.ndarray]:
    return {
        k: np.asarray(v, dtype=np.dtype(d)).reshape(shape) for k, (d, shape, v) in record.items()
    }


class _StreamIterator(_stream_iterator_base()):  # type: ignore[misc]
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
        self._start_epoch()

    def _start_epoch(self) -> None:
        self._ds = self._source.build()
        self._it: Any = None
        self._buffer: list[dict[str, np.ndarray]] = []
        self._rng = np.random.default_rng([self._source.seed, self._epoch])
        self._drained = False

    def _fill(self) -> None:
        if self._it is None:
            self._it = iter(self._ds)
        size = max(1, self._source.shuffle_buffer)
        while not self._drained and len(self._buffer) < size:
            try:
                row = next(self._it)
            except StopIteration:
                self._drained = True
                break
            self._buffer.append({k: np.asarray(v) for k, v in row.items()})

    def __next__(self) -> dict[str, np.ndarray]:
        while True:
            if self._num_epochs is not None and self._epoch >= self._num_epochs:
                raise StopIteration
            self._fill()
            if self._buffer:
                pick = int(self._rng.integers(len(self._buffer))) if len(self._buffer) > 1 else 0
                self._buffer[pick], self._buffer[-1] = self._buffer[-1], self._buffer[pick]
                return self._buffer.pop()
            self._epoch += 1
            self._start_epoch()

    def get_state(self) -> dict[str, Any]:
        return {
            "epoch": self._epoch,
            "hf": self._ds.state_dict(),
            "buffer": [_to_json(r) for r in self._buffer],
            "rng": self._rng.bit_generator.state,
            "drained": self._drained,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self._epoch = int(state["epoch"])
        self._start_epoch()
        self._ds.load_state_dict(state["hf"])
        self._buffer = [_from_json(r) for r in state["buffer"]]
        self._rng.bit_generator.state = state["rng"]
        self._drained = bool(state["drained"])
