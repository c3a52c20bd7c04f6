"""ArrayRecord files of numpy arrays as a Grain source: token documents or fixed-shape rows.

A record is one array, stored either as its raw bytes (``encoding="raw"``: C order, no header,
the ``dtype`` and, for fixed-shape rows, the ``shape`` are given here; the layout loaderx's
``ARDataset`` reads) or as a ``.npy`` file image (``encoding="npy"``: ``np.save`` into the
record, self-describing). A raw record that is a whole ``.npy`` image (numpy's magic, then a
header ``np.load`` reads) is refused, naming the file, the record and ``encoding="npy"``: its
header would be served as values (a prefix compare per record; the image is parsed only when
the magic matches). A 1-D record of integers is a token document: it packs with
:func:`~grain_rox.pack_documents` and mixes with :func:`~grain_rox.mix_datasets` beside `.rox`
and HF documents. Fixed-shape rows stack, so :meth:`ArrayRecordSource.batches` serves whole
batches.

Reads use one reader per file per thread with ``readahead_buffer_size:0`` and
``seek``/``read`` per record (measured here: ~10 us per 4 KiB record against ~45 us for
``read([indices])`` and ~500 us for one ``read([i])`` call per record on a 100k-record file).
Readers are opened lazily in each process; pickling carries the paths only.
"""

from __future__ import annotations

import bisect
import contextlib
import glob
import io
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal

import numpy as np

from grain_rox._format._digest import facts_digest
from grain_rox._order._permutation import record_index, record_indices
from grain_rox._sources._batches import BatchesMixin
from grain_rox._sources._grain_setup import make_grain_workers_usable
from grain_rox._sources._process_local import ProcessLocal, process_local
from grain_rox._sources._watched_files import WatchedFiles

READ_OPTIONS = "readahead_buffer_size:0,max_parallelism:0"
NPY_MAGIC = b"\x93NUMPY"  # how every .npy file image begins (np.save's bytes)
PathsSpec = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def _reader_class() -> Any:
    try:
        from array_record.python.array_record_module import ArrayRecordReader
    except ImportError:
        raise ImportError("ArrayRecord files need: pip install array-record") from None
    return ArrayRecordReader


def expand_paths(paths: PathsSpec) -> list[str]:
    """Files from paths and glob patterns, in the given order (each pattern's matches sorted);
    every missing path or empty pattern is named in one ``FileNotFoundError``."""
    specs = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not specs:
        raise FileNotFoundError("no ArrayRecord paths given")
    files: list[str] = []
    missing: list[str] = []
    for spec in (os.fspath(s) for s in specs):
        if any(c in spec for c in "*?["):
            matched = sorted(p for p in glob.glob(spec) if os.path.isfile(p))
            if not matched:
                missing.append(f"{spec} (matches nothing)")
            files.extend(matched)
        elif os.path.isfile(spec):
            files.append(spec)
        else:
            missing.append(spec)
    if missing:
        raise FileNotFoundError(f"these ArrayRecord paths do not exist: {missing}")
    return files


def count_records(path: str) -> int:
    """Records in one ArrayRecord file; a damaged or foreign file is a ValueError naming it."""
    reader = _reader_class()(path, READ_OPTIONS)
    try:
        if not reader.ok():
            raise ValueError(
                f"{path}: not a readable ArrayRecord file (truncated, damaged or another format); "
                "re-write it or leave it out"
            )
        return int(reader.num_records())
    finally:
        close_quietly(reader)


def read_in_order(path: str, count: int, chunk: int = 1024) -> Iterator[tuple[int, bytes]]:
    """(index, bytes) of records ``0 .. count - 1`` of one file, read sequentially ``chunk`` at
    a time; a damaged file is a ValueError naming the records."""
    reader = _reader_class()(path, "readahead_buffer_size:16M")
    try:
        for start in range(0, count, chunk):
            stop = min(start + chunk, count)
            try:
                records = reader.read(start, stop)
            except RuntimeError as e:
                raise ValueError(
                    f"{path}: records {start}..{stop - 1} cannot be read ({e}); the file "
                    "is damaged: re-write it or leave it out"
                ) from None
            yield from enumerate(records, start)
    finally:
        close_quietly(reader)


def is_npy_image(record: bytes) -> bool:
    """Whether ``record`` is a whole ``.npy`` file image (what ``np.save`` writes): numpy's
    magic, then a header and data that ``np.load`` reads. A prefix compare for any other
    record; raw values that merely begin with the magic's bytes are no image.

    >>> import io
    >>> image = io.BytesIO()
    >>> np.save(image, np.arange(3, dtype=np.uint16))
    >>> is_npy_image(image.getvalue()), is_npy_image(np.arange(3, dtype=np.uint16).tobytes())
    (True, False)
    >>> is_npy_image(NPY_MAGIC + bytes(10))  # the magic's bytes, then no header
    False
    """
    if not record.startswith(NPY_MAGIC):
        return False
    try:
        np.load(io.BytesIO(record), allow_pickle=False)
    except Exception:  # any way numpy refuses it: raw values that begin like an image
        return False
    return True


def close_quietly(reader: Any) -> None:
    """Close a reader; a damaged file's reader raises on close too, after its real error."""
    with contextlib.suppress(RuntimeError):
        reader.close()


class DescribedItems:
    """An iterator of items that says where item ``i`` (0-based, in iteration order) came
    from: :func:`~grain_rox.write_rox` and :func:`~grain_rox.pack_documents` name it in
    their errors (``describe_item(1)`` -> ``"docs.array_record: record 1"``)."""

    def __init__(self, items: Iterable[Any], describe: Callable[[int], str]) -> None:
        self._items = iter(items)
        self.describe_item = describe

    def __iter__(self) -> DescribedItems:
        return self

    def __next__(self) -> Any:
        return next(self._items)


def _stack(arrays: list[np.ndarray], rows: np.ndarray) -> np.ndarray:
    """``arrays`` (records ``rows``) as one array; ``.npy`` records of different dtypes
    (``encoding="npy"`` without ``dtype=``) are an error naming them: ``np.stack`` would
    cast them to a common one (``int64`` and ``uint64`` to ``float64``, changing values); so
    are records of one size and other shapes (numpy's error named no record)."""
    for what, fix, facts in (
        ("dtype", "stacking would cast them to one: pass dtype=", [a.dtype for a in arrays]),
        ("shape", "pass shape=", [a.shape for a in arrays]),
    ):
        if len(set(facts)) > 1:
            bad = [int(r) for r, f in zip(rows, facts, strict=True) if f != facts[0]][:5]
            unlike = next(f for f in facts if f != facts[0])
            raise ValueError(
                f"records have different {what}s: record {int(rows[0])} has {what} {facts[0]} "
                f"but records {bad} have {unlike}; {fix} to require one {what}, or read such "
                "records one at a time (source[i])"
            )
    return np.stack(arrays)


class ArrayRecordSource(ProcessLocal, BatchesMixin):
    """Arrays stored one per ArrayRecord record, as a Grain ``RandomAccessDataSource``.

    Args:
      paths: a file, a glob pattern, or a list of them (files are read in that order).
      dtype: the arrays' dtype (required for ``encoding="raw"``).
      shape: each record's shape for fixed-shape rows (loaderx); ``None``: 1-D documents of
        any length.
      encoding: ``"raw"`` (the array's bytes; a record that is a ``.npy`` image is an error
        naming it) or ``"npy"`` (an ``np.save`` image per record).

    The repr's fingerprint (compared by Grain's ``DataLoader`` and ``.batches()`` states on
    restore) is a digest of the files' content and record counts (whole files up to 256 MiB
    in all, 64 MiB of samples beyond), not their names or times: a byte-identical copy
    restores. A file whose content changed since the source was made is refused, naming it,
    when a reader opens it and on every batch read (within 0.1 s on the per-record path).

    >>> import tempfile, os, numpy as np
    >>> from array_record.python.array_record_module import ArrayRecordWriter
    >>> path = os.path.join(tempfile.mkdtemp(), "docs.array_record")
    >>> w = ArrayRecordWriter(path, "group_size:1")
    >>> for doc in ([5, 6, 7], [8, 9]):
    ...     w.write(np.asarray(doc, np.uint16).tobytes())
    >>> w.close()
    >>> src = ArrayRecordSource(path, dtype=np.uint16)
    >>> len(src), src[0].tolist(), [d.tolist() for d in src._getitems([1, 0])]
    (2, [5, 6, 7], [[8, 9], [5, 6, 7]])
    """

    PROCESS_LOCAL = process_local(_local=threading.local)  # readers are per process and per thread
    _local: threading.local

    def __init__(
        self,
        paths: PathsSpec,
        *,
        dtype: Any = None,
        shape: Sequence[int] | None = None,
        encoding: Literal["raw", "npy"] = "raw",
    ) -> None:
        make_grain_workers_usable()  # a user's own mp_prefetch / DataLoader workers start
        if encoding not in ("raw", "npy"):
            raise ValueError(f"encoding={encoding!r}; use 'raw' (array bytes) or 'npy'")
        if encoding == "raw" and dtype is None:
            raise ValueError("raw records need their dtype: pass dtype= (e.g. np.uint16)")
        self.files = expand_paths(paths)
        self.dtype = None if dtype is None else np.dtype(dtype)
        self.shape = None if shape is None else tuple(int(n) for n in shape)
        self.encoding = encoding
        counts = [count_records(f) for f in self.files]
        empty = [f for f, n in zip(self.files, counts, strict=True) if n == 0]
        if sum(counts) == 0:
            raise ValueError(f"the ArrayRecord files {empty} hold no records")
        self.counts = counts
        self._starts = [0, *np.cumsum(counts).tolist()]  # record numbering over all files
        # each file's stat and content digest, checked as readers open it
        self._watched = WatchedFiles(dict(enumerate(self.files)), what="ArrayRecordSource")
        self._identity = self._fingerprint()
        self.start_process_local()

    def _fingerprint(self) -> str:
        """The content identity: each file's content digest and record count (whole files up
        to 256 MiB in all, 64 MiB of samples beyond: see ``grain_rox._format._digest``), not names or
        times: a byte-identical copy of the files elsewhere is the same data."""
        facts = [
            [[self._watched.digests[f], n] for f, n in enumerate(self.counts)],
            str(self.dtype),
            self.shape,
            self.encoding,
        ]
        return facts_digest(facts)

    def __len__(self) -> int:
        return self._starts[-1]

    def __repr__(self) -> str:
        kind = f"shape={list(self.shape)}" if self.shape is not None else "documents"
        return (
            f"ArrayRecordSource({len(self.files)} files, {len(self)} records, {self.dtype}, "
            f"{kind}, {self.encoding}, fingerprint={self._identity})"
        )

    def _reader(self, f: int) -> Any:
        readers = getattr(self._local, "readers", None)
        if readers is None:
            readers = self._local.readers = {}
        reader = readers.get(f)
        if reader is None:
            self._watched.reopen(f).close()  # refuse a file whose content changed
            reader = readers[f] = _reader_class()(self.files[f], READ_OPTIONS)
        return reader

    def _recheck(self, files: set[int], after: float) -> None:
        """Check again (one ``stat`` each) the files of a read that were last checked
        ``after`` seconds ago or more: an open reader sees a file rewritten in place."""
        checked = getattr(self._local, "checked", None)
        if checked is None:
            checked = self._local.checked = {}
        now = time.monotonic()
        for f in files:
            last = checked.get(f)
            if last is not None and now - last < after:
                continue
            checked[f] = now
            if last is not None:  # (a first read opens a reader, which checks the file)
                self._watched.recheck(f)

    def _locate(self, indices: Sequence[int] | np.ndarray) -> list[tuple[int, int]]:
        """(file, record in that file) of each global record index."""
        rows = record_indices(indices, self._starts[-1], "record").tolist()
        if len(self.files) == 1:
            return [(0, i) for i in rows]
        starts = self._starts
        located = []
        for i in rows:
            f = bisect.bisect_right(starts, i) - 1
            located.append((f, i - starts[f]))
        return located

    def read_bytes(self, indices: Sequence[int] | np.ndarray) -> list[bytes]:
        """The raw records ``indices`` (global numbering over all files)."""
        return [record for record, _ in self._read(indices)]

    def _read(
        self, indices: Sequence[int] | np.ndarray, recheck_after: float = 0.0
    ) -> list[tuple[bytes, tuple[int, int]]]:
        """Records ``indices``; their files are checked again (one ``stat`` each) if
        ``recheck_after`` seconds passed (0 for batches, 0.1 s for single records)."""
        located = self._locate(indices)
        self._recheck({f for f, _ in located}, recheck_after)
        out = []
        for f, p in located:
            reader = self._reader(f)
            try:
                reader.seek(p)
                out.append((reader.read(), (f, p)))
            except RuntimeError as e:
                raise ValueError(
                    f"{self.files[f]}: record {p} cannot be read ({e}); the file is damaged: "
                    "re-write it or leave it out"
                ) from None
        return out

    def _decode(self, record: bytes, where: tuple[int, int]) -> np.ndarray:
        if self.encoding == "npy":
            array = self._decode_npy(record, where)
        else:
            assert self.dtype is not None
            if is_npy_image(record):
                raise self._npy_in_raw(where)
            if len(record) % self.dtype.itemsize:
                raise ValueError(
                    f"{self._name(where)} holds {len(record)} bytes, not a whole number of "
                    f"{self.dtype} values ({self.dtype.itemsize} bytes each); check dtype="
                )
            array = np.frombuffer(record, self.dtype)
        if self.shape is not None:
            if array.size != int(np.prod(self.shape)) or (
                self.encoding == "npy" and array.shape != self.shape
            ):
                raise ValueError(
                    f"{self._name(where)} holds {array.size} values of shape {array.shape}, "
                    f"which does not match shape={self.shape}; check shape= and dtype="
                )
            array = array.reshape(self.shape)
        return array

    def _npy_in_raw(self, where: tuple[int, int]) -> ValueError:
        """The error for a ``.npy`` image read as raw values (its header served as tokens)."""
        return ValueError(
            f"{self._name(where)} is a .npy file image (np.save's bytes, beginning "
            f"{NPY_MAGIC!r}), not the raw bytes of {self.dtype} values: read it with "
            "ArrayRecordSource(..., encoding='npy'). grain-rox convert reads raw records only; "
            "convert .npy records from Python: write_rox(ArrayRecordSource(paths, "
            "encoding='npy').iter_arrays(), output)"
        )

    def _decode_npy(self, record: bytes, where: tuple[int, int]) -> np.ndarray:
        try:
            array = np.load(io.BytesIO(record), allow_pickle=False)
        except ValueError as e:
            raise ValueError(f"{self._name(where)} is not a .npy image ({e})") from None
        if self.dtype is not None and array.dtype != self.dtype:
            raise ValueError(
                f"{self._name(where)} holds {array.dtype}, not dtype={self.dtype}; check dtype="
            )
        return np.asarray(array)

    def _name(self, where: tuple[int, int]) -> str:
        return f"{self.files[where[0]]}: record {where[1]}"

    def describe_item(self, index: int) -> str:
        """Where record ``index`` (global numbering) is: ``"<file>: record <k>"``, for errors
        about its values that a reader of the records raises (write_rox, pack_documents)."""
        ((f, k),) = self._locate([index])
        return self._name((f, k))

    def __getitem__(self, index: int) -> np.ndarray:
        ((record, where),) = self._read(
            [record_index(index, len(self), "record")], recheck_after=0.1
        )
        return self._decode(record, where)

    def _getitems(self, indices: Sequence[int]) -> list[np.ndarray]:
        return [self._decode(record, where) for record, where in self._read(indices)]

    __getitems__ = _getitems

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """Fixed-shape records ``indices`` stacked into one array (one copy of the bytes)."""
        rows = record_indices(indices, len(self), "record")
        if self.shape is None:
            if not rows.size:
                raise ValueError("get_batch needs at least one index: no documents give no shape")
            arrays = self._getitems(rows.tolist())
            lengths = [a.size for a in arrays]
            if len(set(lengths)) > 1:
                bad = [int(r) for r, n in zip(rows, lengths, strict=True) if n != lengths[0]][:5]
                raise ValueError(
                    f"documents have different lengths: record {int(rows[0])} has {lengths[0]} "
                    f"tokens but records {bad} differ; give shape= for fixed-shape records, or "
                    "pack documents (grain_rox.pack_documents)"
                )
            return _stack(arrays, rows)
        read = self._read(rows)
        if self.encoding == "raw":
            assert self.dtype is not None
            size = int(np.prod(self.shape)) * self.dtype.itemsize
            # (a record that begins like a .npy image is decoded one by one: refused if it is)
            if all(len(r) == size and not r.startswith(NPY_MAGIC) for r, _ in read):
                flat = np.frombuffer(b"".join(r for r, _ in read), self.dtype)
                return flat.reshape(len(read), *self.shape)
        return _stack([self._decode(record, where) for record, where in read], rows)

    def batches(self, batch_size: int, **kwargs: Any) -> Any:
        """Fixed-shape records only: see :meth:`BatchesMixin.batches` (a seeded shuffle of all
        records of all files, new every epoch; ``num_epochs=-1`` or ``None`` is endless)."""
        if self.shape is None:
            raise ValueError(
                "batches() stacks fixed-shape records; these are documents (shape=None): pack "
                "them with grain_rox.pack_documents, or give shape="
            )
        return super().batches(batch_size, **kwargs)

    def iter_arrays(self, chunk: int = 1024) -> DescribedItems:
        """Every record in file order (sequential reads, ``chunk`` records per call); the
        iterator's ``describe_item(i)`` names record ``i``'s file, for write_rox's errors."""
        return DescribedItems(self._iter_arrays(chunk), self.describe_item)

    def _iter_arrays(self, chunk: int) -> Iterator[np.ndarray]:
        for f, path in enumerate(self.files):
            for k, record in read_in_order(path, self.counts[f], chunk):
                yield self._decode(record, (f, k))
