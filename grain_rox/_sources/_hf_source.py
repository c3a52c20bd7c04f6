"""HuggingFace ``datasets`` data held eagerly (Arrow, memory-mapped) as a Grain source.

:class:`HFEagerSource` wraps a ``datasets.Dataset`` (or builds one from a ``save_to_disk``
directory, local Parquet / JSON / Arrow files or a dict; never the Hub) as a plain
``RandomAccessDataSource`` of numpy dicts. Numbers and lists of numbers are read as numpy
views of the memory-mapped Arrow chunks (one gather per chunk for a batch, dtypes kept); text,
images and structs go through ``datasets``' numpy formatter. Pickling carries the dataset's
Arrow file paths and the transforms applied to them (HF's own mechanism: ``select``,
``shuffle``, renames survive), which every Grain worker maps again: no rows are copied. Data
that lives (partly) in memory is first written to an Arrow copy (under ``cache_dir``, default
the system's temporary directory) so that workers can share it. Sources of datasets with
the same HF fingerprint and the same rows in one process share one copy (the fingerprint
alone is no digest of the rows: two ``ds.map(f)`` with a random ``f`` share one, and their
tables are compared); it is deleted when the last source using it is garbage-collected (or at
exit) by the process that made it, never by a worker that unpickled one. A process killed
with SIGKILL leaves its copies behind (``grain_rox_hf_<host>_<pid>_*``).

:meth:`HFEagerSource.batches` is the fast path: a Grain ``MapDataset`` whose element ``i`` is
global batch ``i``, in a seeded order that is a new permutation every epoch and does not
depend on how many processes share it.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from grain_rox._format._digest import facts_digest
from grain_rox._order._permutation import record_index, record_indices
from grain_rox._sources._batches import BatchesMixin
from grain_rox._sources._grain_setup import make_grain_workers_usable
from grain_rox._sources._process_local import ProcessLocal, process_local
from grain_rox._sources._watched_files import WatchedFiles
from grain_rox._text._hf_checks import (
    check_nulls_arg,
    find_nulls,
    load_saved,
    null_problem,
    rows_with_nulls,
)
from grain_rox._text._hf_records import (
    ArrowColumn,
    RecordFormat,
    arrow_dtypes,
    arrow_numeric,
    hf_datasets,
    kept_columns,
    load_files,
    refuse_nanosecond_times,
    refuse_untyped_lists,
    stack_column,
)
from grain_rox._text._lost_nuls import (
    NulEndedRows,
    lost_nul,
    lost_nul_fix,
    lost_nul_problem,
    may_lose_nuls,
)


def _memory_mapped(dataset: Any) -> bool:
    """Whether every table behind ``dataset`` (data and row indices) is a memory-mapped Arrow
    file, so that pickling it carries paths and transforms, not rows."""
    from datasets.table import ConcatenationTable, MemoryMappedTable

    def mapped(table: Any) -> bool:
        if isinstance(table, ConcatenationTable):
            return all(mapped(block) for row in table.blocks for block in row)
        return isinstance(table, MemoryMappedTable)

    return mapped(dataset.data) and (dataset._indices is None or mapped(dataset._indices))


def _chunk_layout(table: Any) -> list[list[int]] | None:
    """(offset, length) of each Arrow chunk of ``table``'s first column: how a contiguous
    ``select`` slices the mapped files (their content is digested separately)."""
    if table is None or not table.num_columns:
        return None
    return [[chunk.offset, len(chunk)] for chunk in table.table.column(0).chunks]


def _row_slices(table: Any) -> list[Any]:
    """The row slices ``(offset, length)`` datasets applied to the memory-mapped tables behind
    ``table`` (recorded as its "replays", which its pickles carry), in order: a contiguous
    ``shard``/``select``/``train_test_split`` of equal length at another offset has the same
    chunk layout, and the same files, but other rows."""
    if table is None:
        return []
    from datasets.table import ConcatenationTable

    if isinstance(table, ConcatenationTable):
        return [_row_slices(block) for row in table.blocks for block in row]
    replays = getattr(table, "replays", None) or []
    return [[int(a) for a in args[:2]] for name, args, _ in replays if name == "slice"]


_WATCHED_PER_CHECK = 8  # data files stat-ed by a read's check after the first


def _refuse_transform(dataset: Any) -> None:
    """A dataset with a format transform (``set_transform``/``with_transform``) serves its rows
    through it; this source reads the Arrow columns themselves (in Grain workers too), so it
    would serve the rows untransformed: refused, with the two ways that keep the transform."""
    transform = (dataset.format.get("format_kwargs") or {}).get("transform")
    if transform is not None or dataset.format.get("type") == "custom":
        name = getattr(transform, "__name__", repr(transform))
        raise ValueError(
            f"HFEagerSource: the dataset has a format transform ({name}, from set_transform or "
            "with_transform), which HFEagerSource does not apply: it reads the Arrow columns "
            "themselves, in Grain workers too, and would serve the rows untransformed. Apply "
            "it once with dataset.map(f, batched=True) before making the source, or per record "
            "after it: grain.MapDataset.source(HFEagerSource(dataset)).map(f)"
        )


def _dataset_from(spec: Any) -> Any:
    """A ``save_to_disk`` directory or a local data file; anything else would need the Hub."""
    hf_datasets()  # an ImportError naming the extra to install
    path = os.fspath(spec)
    if os.path.isdir(path):
        return load_saved(path)
    if os.path.isfile(path):
        return load_files([path])
    raise ValueError(
        f"{path!r} is not a local dataset directory or file; grain_rox never downloads from the "
        "Hugging Face Hub at run time. Download it once where there is network, "
        f"datasets.load_dataset({path!r}, split='train').save_to_disk(DIR), then pass "
        "HFEagerSource(DIR)"
    )


def _remap(dataset: Any) -> Any:
    indices = dataset._indices  # rows remapped by select/shuffle/filter
    return None if indices is None else indices.column(0).to_numpy()


def _format_columns(dataset: Any) -> list[str] | None:
    """The columns ``dataset.with_format(..., columns=...)`` shows (None: every column): its
    rows hold those alone, so this source serves those alone unless ``include_keys`` says
    otherwise (it served every column, the hidden ones too)."""
    shown = dataset.format.get("columns")
    if shown is None or dataset.format.get("output_all_columns"):
        return None
    shown = list(shown)
    return None if sorted(shown) == sorted(dataset.column_names) else shown


def _refuse_nulls(dataset: Any, columns: Sequence[str]) -> None:
    """An error naming the first kept column and row with a missing value, and the fix."""
    found = find_nulls(dataset.data.table, columns, _remap(dataset))
    if found is not None:
        column, row, inside, count, keep = found
        rows = f"{count} row{'' if count == 1 else 's'} in all"
        raise ValueError(
            f"{null_problem(column, row, inside, rows)}. Drop such rows first, dataset = "
            f"dataset.filter(lambda r: {keep}), pass nulls='skip' to leave them out (counted), "
            f"fill them (dataset.map), or leave the column out (exclude_keys=[{column!r}])"
        )


def _without_null_rows(dataset: Any, columns: Sequence[str]) -> tuple[Any, int]:
    """``dataset`` without its rows that have a missing value in ``columns``, and how many."""
    rows = rows_with_nulls(dataset.data.table, columns, _remap(dataset))
    if not rows.size:
        return dataset, 0
    if rows.size == len(dataset):
        raise ValueError(
            f"every row ({rows.size}) has a missing value (None) in {list(columns)}; nothing is "
            "left with nulls='skip'"
        )
    logger.warning(
        "HFEagerSource(nulls='skip') leaves out %d of %d rows, which have a missing value "
        "(None) in %s; the first is row %d",
        rows.size,
        len(dataset),
        list(columns),
        int(rows[0]),
    )
    return dataset.select(np.setdiff1d(np.arange(len(dataset)), rows)), int(rows.size)


logger = logging.getLogger("grain_rox")
_COPIES: dict[str, int] = {}  # Arrow copy directory -> sources using it (this process)
# (HF fingerprint, cache directory) -> the Arrow copies made of datasets with it (this process)
_BY_FINGERPRINT: dict[tuple[str, str], list[str]] = {}
_COPIES_LOCK = threading.RLock()  # a finalizer may run inside a locked block


def _arrow_copy(dataset: Any, cache_dir: str | None) -> str:
    """A ``save_to_disk`` copy of ``dataset``, shared within this process by the sources of
    datasets with its HF fingerprint and its rows. The fingerprint alone is no digest of the
    rows (two ``ds.map(f)`` with a random ``f`` share one): a second source served the first's
    copy; a copy is now shared only where its table equals the dataset's."""
    base = cache_dir or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    key = (dataset._fingerprint, base)
    with _COPIES_LOCK:
        candidates = [known for known in _BY_FINGERPRINT.get(key, []) if _COPIES.get(known)]
    # compared outside the lock: loading a copy runs threads, in which a finalizer of another
    # source (a garbage collection there) waits for the lock: a deadlock
    for known in candidates:
        if os.path.isdir(known) and _same_rows(dataset, known):
            with _COPIES_LOCK:
                if _COPIES.get(known):  # (not released meanwhile)
                    _COPIES[known] += 1
                    return known
    name = (
        f"grain_rox_hf_{socket.gethostname()}_{os.getpid()}_{dataset._fingerprint}_"
        f"{uuid.uuid4().hex[:12]}"
    )
    target = os.path.join(base, name)
    partial = tempfile.mkdtemp(prefix=f".{name}.", dir=base)
    try:  # (its own name: written outside the lock, for the same reason)
        dataset.save_to_disk(partial)
        os.rename(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    with _COPIES_LOCK:
        _COPIES[target] = 1
        _BY_FINGERPRINT.setdefault(key, []).append(target)
    return target


def _same_rows(dataset: Any, copy: str) -> bool:
    """Whether the Arrow copy at ``copy`` holds ``dataset``'s rows (its table, compared value
    for value; a dataset with an indices mapping is not compared: it gets a copy of its own)."""
    import datasets

    if dataset._indices is not None:
        return False
    try:
        saved = datasets.load_from_disk(copy)
    except (OSError, ValueError):  # (released and deleted meanwhile)
        return False
    return saved._indices is None and bool(saved.data.table.equals(dataset.data.table))


def _release_copy(target: str, owner: int) -> None:
    """Drop one use of an Arrow copy; the last use in the process that made it deletes it."""
    if os.getpid() != owner:  # a forked child holding the parent's objects
        return
    with _COPIES_LOCK:
        left = _COPIES.get(target, 1) - 1
        if left > 0:
            _COPIES[target] = left
            return
        _COPIES.pop(target, None)
        for key, copies in list(_BY_FINGERPRINT.items()):
            if target in copies:
                copies.remove(target)
                if not copies:
                    del _BY_FINGERPRINT[key]
        shutil.rmtree(target, ignore_errors=True)


class HFEagerSource(ProcessLocal, BatchesMixin):
    """A HuggingFace dataset as a Grain ``RandomAccessDataSource`` of numpy dicts.

    Give exactly one of ``dataset``, ``data_files`` or ``data``.

    Args:
      dataset: a ``datasets.Dataset`` (one split), or the path of a ``save_to_disk``
        directory or of a local data file (never a Hub name: nothing is downloaded).
      data_files: local Parquet / JSON / Arrow files (a path or a list of them).
      data: a dict of columns (``datasets.Dataset.from_dict``).
      include_keys: the columns to keep (default: all).
      exclude_keys: columns to leave out.
      tokenize: text columns to serve as ``int32`` token ids; other text columns stay
        strings.
      tokenizer: for ``tokenize``: ``"bytes"``, ``"cl100k_base"``, a ``tokenizer.json``
        path or a :class:`~grain_rox.Tokenizer`.
      append_eos: append EOS to each tokenized text (default True).
      cache_dir: where data held (partly) in memory is written as an Arrow copy that
        workers map (default: the system's temporary directory).
      nulls: ``"error"`` (default): a missing value (None) in a kept column, or inside its
        lists, is an error naming the column and row; ``"skip"``: such rows are left out
        (counted in ``skipped_rows`` and logged).

    Images become ``uint8`` arrays and nested features nested dicts. The repr's fingerprint
    is a digest of the Arrow files' content and the rows served, and with ``tokenize`` of the
    tokenizer, which the repr names by its vocabulary's sha256 and EOS id: a state restores
    onto the same tokenizer only (not another tokenizer.json in a folder of the same name, nor
    another EOS token). A data file whose content changes after the source was made is
    refused, naming it (checked at each process's first read, then every 0.1 s, a few files
    at a time). A format transform (``with_transform``) is refused: the Arrow columns are
    read as they are.

    >>> import datasets
    >>> ds = datasets.Dataset.from_dict({"ids": [[1, 2], [3, 4]], "label": [0, 1], "t": ["a", "b"]})
    >>> source = HFEagerSource(ds, exclude_keys=["t"])
    >>> len(source), source[1]["ids"].tolist(), source.get_batch([0, 1])["label"].tolist()
    (2, [3, 4], [0, 1])
    >>> HFEagerSource(ds, tokenize=["t"], tokenizer="bytes")[1]["t"].tolist()
    [98, 256]
    >>> holes = datasets.Dataset.from_dict({"y": [1, None, 3]})
    >>> skipping = HFEagerSource(holes, nulls="skip")
    >>> skipping.get_batch([0, 1])["y"].tolist(), skipping.skipped_rows
    ([1, 3], 1)
    """

    PROCESS_LOCAL = process_local(
        _lock=threading.Lock,
        _columns=lambda: None,  # numpy views of the maps: rebuilt in each process
        _formatted_view=lambda: None,
        _text_rows=lambda: None,  # (NulEndedRows by column, index mapping): the NUL check
        _cleanup=lambda: None,  # only the process that made a copy deletes it
        _watch_at=lambda: 0.0,  # when the data files are checked next (at the first read)
        _watch_next=lambda: -1,  # which file the next check starts at (-1: all, first)
    )
    _lock: threading.Lock
    _columns: dict[str, ArrowColumn] | None
    _formatted_view: Any
    _text_rows: Any
    _cleanup: Any
    _watch_at: float
    _watch_next: int

    def __init__(
        self,
        dataset: Any = None,
        *,
        data_files: str | Sequence[str] | None = None,
        data: Mapping[str, Sequence[Any]] | None = None,
        include_keys: Sequence[str] | None = None,
        exclude_keys: Sequence[str] | None = None,
        tokenize: Sequence[str] | None = None,
        tokenizer: Any = None,
        append_eos: bool = True,
        cache_dir: str | None = None,
        nulls: str = "error",
    ) -> None:
        make_grain_workers_usable()  # a user's own mp_prefetch/DataLoader workers start
        self.start_process_local()
        given = [x is not None for x in (dataset, data_files, data)]
        if sum(given) != 1:
            raise ValueError("give exactly one of dataset=, data_files= or data=")
        datasets = hf_datasets()
        if data_files is not None:
            dataset = load_files([data_files] if isinstance(data_files, str) else data_files)
        elif data is not None:
            dataset = datasets.Dataset.from_dict(dict(data))
        elif isinstance(dataset, str | os.PathLike):
            dataset = _dataset_from(dataset)
        if isinstance(dataset, datasets.DatasetDict):
            raise ValueError(
                f"got a DatasetDict with splits {list(dataset)}; pass one split, e.g. ds['train']"
            )
        if not isinstance(dataset, datasets.Dataset):
            raise TypeError(f"dataset must be a datasets.Dataset, got {type(dataset).__name__}")
        if len(dataset) == 0:
            raise ValueError("the dataset is empty: a Grain source needs at least one row")
        _refuse_transform(dataset)
        shown = _format_columns(dataset) if include_keys is None else None
        if shown is not None:  # the columns a with_format(columns=...) shows, and to tokenize
            include_keys = shown + [c for c in tokenize or () if c not in shown]
        try:
            keep = kept_columns(list(dataset.column_names), include_keys, exclude_keys)
        except ValueError as e:
            if shown is None:
                raise
            raise ValueError(
                f"{e} (the dataset's format shows only {shown}: pass include_keys= to read others)"
            ) from None
        schema = dataset.features.arrow_schema  # (rows left out below keep it)
        refuse_untyped_lists(schema, keep, "HFEagerSource")
        refuse_nanosecond_times(schema, keep, "HFEagerSource")
        self.nulls = check_nulls_arg(nulls)
        self.skipped_rows = 0  # rows left out for a missing value (nulls="skip")
        if self.nulls == "skip":
            dataset, self.skipped_rows = _without_null_rows(dataset, keep)
        else:
            _refuse_nulls(dataset, keep)
        self.format = RecordFormat(
            columns=keep,
            tokenize=tokenize,
            tokenizer=tokenizer,
            append_eos=append_eos,
            dtypes=arrow_dtypes(schema),  # of the formatted columns
        )
        copied = not _memory_mapped(dataset)
        if copied:  # (partly) in memory: an Arrow copy that workers can map
            target = _arrow_copy(dataset, cache_dir)
            self._cleanup = weakref.finalize(self, _release_copy, target, os.getpid())
            dataset = datasets.load_from_disk(target)
        self.columns = keep
        self.files = [f["filename"] for f in dataset.cache_files]
        # each file's stat and content digest: a file rewritten later is refused at a read
        self._watched = WatchedFiles(dict(enumerate(self.files)), what="HFEagerSource")
        self.features = {c: str(dataset.features[c]) for c in keep}
        self._num_rows = len(dataset)
        # Which rows of the Arrow files are served (select/shuffle write an indices file,
        # a contiguous select slices the table): content and layout, never paths, so a copy
        # of the data in another directory is the same source and other data is not.
        self._layout: list[Any] = [_chunk_layout(dataset.data), _chunk_layout(dataset._indices)]
        slices = [_row_slices(dataset.data), _row_slices(dataset._indices)]
        if any(slices):  # (named where there are any: other sources' identities unchanged)
            self._layout.append({"row_slices": slices})
        self._records = self.format.describe()  # the tokenizer by content, named in the repr
        self._identity = self._fingerprint()
        # dtype=None: arrays keep their dtypes (datasets' default makes ints int64 and floats
        # float32: an Array2D of float64 lost precision, of uint64 wrapped)
        self._dataset: Any = dataset.select_columns(keep).with_format("numpy", dtype=None)
        schema = dataset.data.table.schema
        # Numbers and (nested) lists of numbers are read straight from Arrow, dtype kept;
        # the rest (text, images, structs, tokenized text) through datasets' numpy formatter.
        self._arrow_columns = [
            c for c in keep if c not in self.format.tokenize and arrow_numeric(schema.field(c).type)
        ]
        self._formatted_columns = [c for c in keep if c not in self._arrow_columns]
        # text and bytes that numpy serves fixed-width (trailing NULs dropped), not those
        # under lists (objects) or in a decoded image or sound (served as samples)
        self._text_columns = [
            c
            for c in self._formatted_columns
            if c not in self.format.tokenize
            and may_lose_nuls(schema.field(c).type)
            and not getattr(dataset.features[c], "decode", False)
        ]

    def _fingerprint(self) -> str:
        facts = [self._watched.digests[i] for i in range(len(self.files))] + [
            self._num_rows,
            self.columns,
            self.features,
            self._records,
            self._layout,
        ]
        if self.nulls == "skip":  # (facts of sources that refuse nulls are unchanged)
            facts.append({"nulls": "skip", "skipped": self.skipped_rows})
        return facts_digest(facts)

    @property
    def dataset(self) -> Any:
        """The (column-filtered, numpy-formatted) dataset. It is memory-mapped, so it pickles
        as its Arrow file paths and the transforms applied to them (HF's own mechanism)."""
        return self._dataset

    def get_dataset_info(self) -> Any:
        """The dataset's ``datasets.DatasetInfo`` (features, description, ...), as in Datarax."""
        return self.dataset.info

    def __len__(self) -> int:
        return self._num_rows

    def __repr__(self) -> str:
        """Content-identifying, as Grain compares sources on restore; a tokenizing source
        names its tokenizer (by content and EOS id), so a refusal says when that changed."""
        tokenizer = self._records.get("tokenizer")
        named = f"tokenizer={tokenizer!r}, " if tokenizer else ""
        return (
            f"HFEagerSource(rows={self._num_rows}, columns={self.columns}, {named}"
            f"fingerprint={self._identity})"
        )

    def _check(self, indices: Sequence[int]) -> list[int]:
        rows = record_indices(indices, self._num_rows, "row").tolist()
        now = time.monotonic()
        if now >= self._watch_at:
            self._watch(now)
        return rows

    def _watch(self, now: float) -> None:
        """Refuse reads once a data file changed (it would serve other rows than the
        fingerprint names): a process's first read checks every file (one ``stat`` each: a
        worker maps the files by path), later reads a few files in turn, every 0.1 s."""
        keys = list(self._watched.paths)
        first = self._watch_next < 0
        start = max(self._watch_next, 0)
        for i in range(len(keys) if first else min(len(keys), _WATCHED_PER_CHECK)):
            self._watched.recheck(keys[(start + i) % len(keys)])
        self._watch_next = start if first else (start + _WATCHED_PER_CHECK) % len(keys)
        self._watch_at = now + 0.1  # (only once checked: a refused read is refused again)

    def _arrow(self) -> dict[str, ArrowColumn]:
        """Numpy readers of the Arrow columns, built once per process (nothing copied)."""
        columns = self._columns
        if columns is None:
            table = self.dataset.data.table
            with self._lock:
                columns = self._columns
                if columns is None:
                    remap = _remap(self.dataset)
                    columns = {
                        c: ArrowColumn(table.column(c), c, remap) for c in self._arrow_columns
                    }
                    self._columns = columns
        return columns

    def _formatted(self, rows: list[int]) -> dict[str, Any]:
        """The non-Arrow columns of ``rows`` through datasets' numpy formatter, and text to
        tokenize as Python strings (numpy's text drops trailing NULs: "ab\x00" was
        tokenized as "ab", where the streaming source kept the NUL)."""
        if not self._formatted_columns:
            return {}
        views = self._formatted_view
        if views is None:  # built once per process: select_columns costs ~0.6 ms a call
            text = [c for c in self._formatted_columns if c in self.format.tokenize]
            other = [c for c in self._formatted_columns if c not in self.format.tokenize]
            views = [self.dataset.select_columns(other)] if other else []
            if text:
                views.append(self.dataset.select_columns(text).with_format(None))
            self._formatted_view = views
        out: dict[str, Any] = {}
        for view in views:
            out.update(view[rows])
        return out

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self._getitems([record_index(index, self._num_rows, "row")])[0]

    def _getitems(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Many rows with one Arrow ``take``."""
        rows = self._check(indices)
        formatted = self._formatted(rows)
        records = self.format.rows(formatted, len(rows)) if formatted else [{} for _ in rows]
        for key, column in self._arrow().items():
            for record, value in zip(records, column.rows(rows), strict=True):
                record[key] = value
        self._refuse_lost_nuls(rows, records)
        return [{k: r[k] for k in self.columns} for r in records]

    def _refuse_lost_nuls(self, rows: list[int], records: list[dict[str, Any]]) -> None:
        """Refuse a served text or bytes value that numpy holds without its trailing NULs
        (``"ab\\x00"`` as ``"ab"``): a look at each value's last byte in the Arrow maps, and
        a walk of the rows' Python values only where one ends in a NUL."""
        if not self._text_columns:
            return
        if self._text_rows is None:  # the columns' maps, read in this process
            table = self.dataset.data.table
            with self._lock:
                if self._text_rows is None:
                    self._text_rows = (
                        {c: NulEndedRows(table.column(c)) for c in self._text_columns},
                        _remap(self.dataset),
                    )
        columns, remap = self._text_rows
        at = remap[rows] if remap is not None else rows
        suspects = [c for c in self._text_columns if columns[c].any(at)]
        if not suspects:
            return
        plain = self.dataset.select_columns(suspects).with_format(None)[rows]
        for j, row in enumerate(rows):
            for column in suspects:
                found = lost_nul(plain[column][j], records[j][column])
                if found is not None:
                    fields, value = found
                    raise ValueError(
                        f"HFEagerSource: {lost_nul_problem(column, fields, f'row {row}', value)}. "
                        f"{lost_nul_fix(column, fields, value, files=False)}"
                    )

    __getitems__ = _getitems

    def get_batch(self, indices: Sequence[int] | Any) -> dict[str, Any]:
        """Rows ``indices`` stacked per column (one Arrow call); ragged or text columns are
        errors naming the column (and the rows whose shapes differ)."""
        rows = self._check(indices)
        if not rows:
            raise ValueError("get_batch needs at least one index: no rows give no shapes")
        formatted = self._formatted(rows)
        arrow = self._arrow()
        out = {}
        for key in self.columns:
            if key in arrow:
                out[key] = arrow[key].stack(rows)
                continue
            value = formatted[key]
            if key in self.format.tokenize:
                value = self.format.encode(key, list(value))
            out[key] = stack_column(key, self.format.numbers(key, value), rows)
        return out
