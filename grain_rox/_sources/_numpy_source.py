"""``.npy`` arrays (memory-mapped) as a Grain source with a one-gather batch path.

The layout loaderx's ``NPDataset`` serves: one ``.npy`` file per feature (``train_data.npy``,
``train_label.npy``, ...), row ``i`` of every file is record ``i``, any fixed record shape.
:class:`NumpySource` opens each file with ``np.load(mmap_mode="r")`` lazily in every process
(pickling carries only the paths), reads a batch with one fancy-index gather per file, and
gets grain_rox's order, sharding and checkpointing through :meth:`NumpySource.batches`.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

import numpy as np

from grain_rox._format._digest import facts_digest
from grain_rox._order._permutation import record_index, record_indices
from grain_rox._sources._batches import BatchesMixin
from grain_rox._sources._grain_setup import make_grain_workers_usable
from grain_rox._sources._process_local import ProcessLocal, process_local
from grain_rox._sources._watched_files import WatchedFiles

ArraySpec = str | os.PathLike[str] | np.ndarray


class NpyHeader:
    """A ``.npy`` file's array layout, read and checked without reading the data."""

    def __init__(self, shape: tuple[int, ...], fortran: bool, dtype: np.dtype, offset: int):
        self.shape, self.fortran, self.dtype, self.offset = shape, fortran, dtype, offset


def _read_header(f: IO[bytes], path: str) -> NpyHeader:
    """The header of the open ``.npy`` file ``f``; anything unusable is a ValueError naming
    ``path`` (truncation, negative sizes, Python objects, not a ``.npy`` file)."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, fortran, dtype = read(f)
        offset = f.tell()
        available = os.fstat(f.fileno()).st_size - offset
    except (ValueError, OSError) as e:
        raise ValueError(f"{path}: not a readable .npy file ({e}); write it with np.save") from None
    if any(n < 0 for n in shape):
        raise ValueError(
            f"{path}: the .npy header gives the invalid shape {shape} (a negative size): the "
            "file is damaged or was not written by np.save; rewrite it"
        )
    if dtype.hasobject:
        raise ValueError(
            f"{path}: dtype {dtype} holds Python objects, which cannot be memory-mapped; "
            "save a numeric array"
        )
    expected = math.prod(shape) * dtype.itemsize
    if available < expected:
        raise ValueError(
            f"{path}: truncated: the header promises {shape} {dtype} ({expected} bytes) but "
            f"only {available} bytes follow it; rewrite the file"
        )
    return NpyHeader(tuple(int(n) for n in shape), bool(fortran), dtype, offset)


def _npy_header(path: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype from a ``.npy`` header (the data is not read); see :func:`_read_header`."""
    try:
        with open(path, "rb") as f:
            header = _read_header(f, path)
    except OSError as e:
        raise ValueError(f"{path}: not a readable .npy file ({e})") from None
    return header.shape, header.dtype


def _as_path(spec: Any) -> Any:
    """A whole ``.npy`` file opened with ``np.load(mmap_mode=...)`` is served by its path (so it
    pickles as a path, not as its data); other arrays are served as they are: a view of such a
    map (``a[::-1]``, ``a.T``: the same shape, other rows) and a copy-on-write map
    (``mmap_mode="c"``, whose edits stay in memory) do not hold the file's rows as stored."""
    filename = getattr(spec, "filename", None)
    if not (isinstance(spec, np.memmap) and filename and os.path.isfile(filename)):
        return spec
    if spec.mode == "c" or not isinstance(spec.base, mmap.mmap):  # a view, or edits in memory
        return spec
    try:
        with open(filename, "rb") as f:
            header = _read_header(f, filename)
    except (ValueError, OSError):
        return spec
    contiguous = spec.flags.f_contiguous if header.fortran else spec.flags.c_contiguous
    same = (header.shape, header.dtype, header.offset) == (spec.shape, spec.dtype, spec.offset)
    return filename if same and contiguous else spec


def _rows_at(rows: Any) -> Any:
    """The index that reads ``rows`` of an array as arrays in its own dtype: one row (an int)
    as a view, 0-d for a 1-D array (``a[3]`` would be a NumPy scalar, in the native byte
    order for a ``>i4`` file and as short as its text for a ``<U3`` one), a batch as is.

    >>> a = np.array([7, 8], dtype=">i4")
    >>> a[_rows_at(1)].dtype, a[_rows_at(np.array([1]))].dtype, a[1].dtype
    (dtype('>i4'), dtype('>i4'), dtype('int32'))
    """
    return (rows, ...) if isinstance(rows, int) else rows


def _read_only(rows: Any) -> np.ndarray:
    """``rows`` as a read-only array: a row of an in-memory array is a view of the user's
    array, and an in-place edit of a record must not change it or later reads."""
    view = np.asarray(rows).view()
    view.flags.writeable = False
    return view


class NumpySource(ProcessLocal, BatchesMixin):
    """Rows of ``.npy`` files (or arrays) as a Grain ``RandomAccessDataSource``.

    Args:
      arrays: one path or array (records are arrays) or a mapping of names to paths or
        arrays (records are dicts), all with the same number of rows. A whole ``.npy`` file
        opened with ``np.load(mmap_mode=...)`` is served by its path.

    The repr's fingerprint (which Grain's ``DataLoader`` and ``.batches()`` states compare on
    restore) is a digest of the content, shapes and dtypes: whole files up to 256 MiB in all,
    64 MiB of evenly spaced samples of larger ones (see ``grain_rox._format._digest``); not names or
    times, so a byte-identical copy of the data elsewhere restores. A file whose content
    changes after the source was made is refused, naming it: when a worker (re)opens it, on
    every batch read (one ``stat`` per file) and within 0.1 s on the per-row path. Replace
    data files by writing a new file and renaming it over the old one: a file truncated in
    place while it is memory-mapped can crash the reading process (``SIGBUS``). An array in
    memory is served as it is at each read, uncopied, and its fingerprint taken when the
    source is made: do not edit it afterwards (pass a copy, or save it and pass the path), or
    the source serves rows its fingerprint, and any state saved from it, do not name.

    >>> import numpy as np, tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> np.save(os.path.join(d, "x.npy"), np.arange(12, dtype=np.int32).reshape(6, 2))
    >>> np.save(os.path.join(d, "y.npy"), np.arange(6) % 2)
    >>> src = NumpySource({"x": os.path.join(d, "x.npy"), "y": os.path.join(d, "y.npy")})
    >>> len(src), src[2]["x"].tolist(), src.get_batch([5, 0])["y"].tolist()
    (6, [4, 5], [1, 0])
    """

    # memory maps of the files (opened lazily in each process), and when each was last checked
    PROCESS_LOCAL = process_local(_lock=threading.Lock, _maps=dict, _checked=dict)
    _lock: threading.Lock
    _maps: dict[str, np.ndarray]
    _checked: dict[str, float]

    def __init__(self, arrays: ArraySpec | Mapping[str, ArraySpec]) -> None:
        make_grain_workers_usable()  # a user's own mp_prefetch / DataLoader workers start
        self.start_process_local()
        self._single = not isinstance(arrays, Mapping)
        specs: dict[str, ArraySpec] = dict(arrays) if isinstance(arrays, Mapping) else {"": arrays}
        if not specs:
            raise ValueError("NumpySource needs at least one array or .npy path")
        specs = {k: _as_path(v) for k, v in specs.items()}
        paths = {k: os.fspath(v) for k, v in specs.items() if not isinstance(v, np.ndarray)}
        missing = [p for p in paths.values() if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(f"these .npy files do not exist: {missing}")
        self.paths = paths
        self._watched = WatchedFiles(paths, what="NumpySource")  # each file's stat and digest
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}
        self._arrays: dict[str, np.ndarray] = {}  # the arrays given in memory (pickled)
        self._digests: dict[str, str] = dict(self._watched.digests)  # each array's content digest
        for key, spec in specs.items():
            if isinstance(spec, np.ndarray):
                shape, dtype = spec.shape, spec.dtype
                self._arrays[key] = spec
                self._digests[key] = hashlib.sha1(np.ascontiguousarray(spec).data).hexdigest()
            else:
                shape, dtype = _npy_header(paths[key])
            if len(shape) == 0:
                raise ValueError(f"{self._name(key)} is a 0-d array: it has no rows to serve")
            self.shapes[key], self.dtypes[key] = tuple(shape), str(dtype)
        lengths = {self._name(k): s[0] for k, s in self.shapes.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"the arrays disagree on their number of rows: {lengths}")
        self._num_rows = next(iter(lengths.values()))
        if self._num_rows == 0:
            raise ValueError(f"{lengths}: no rows: a Grain source needs at least one")
        self._identity = self._fingerprint()

    def _name(self, key: str) -> str:
        return self.paths.get(key) or (f"array {key!r}" if key else "the array")

    def _fingerprint(self) -> str:
        """The content identity: each array's digest, shape and dtype (not file names, sizes
        or times: a byte-identical copy of the data elsewhere is the same data)."""
        facts = [
            [key, self._digests[key], list(self.shapes[key]), self.dtypes[key]]
            for key in sorted(self.shapes)
        ]
        return facts_digest(facts)

    def _array(self, key: str, *, recheck_after: float = 0.0) -> np.ndarray:
        """Array ``key``; a mapped file is checked again (one ``stat``) if ``recheck_after``
        seconds passed since its last check: a file rewritten in place shows its new bytes
        through the existing map, and those are refused too."""
        array = self._arrays.get(key)
        if array is not None:
            return array
        array = self._maps.get(key)
        if array is None:
            with self._lock:
                array = self._maps.get(key)
                if array is None:
                    array = self._maps[key] = self._map_file(key)
                    self._checked[key] = time.monotonic()
        else:
            now = time.monotonic()
            if now - self._checked.get(key, 0.0) >= recheck_after:
                self._watched.recheck(key)
                self._checked[key] = now
        return array

    def _map_file(self, key: str) -> np.ndarray:
        """Memory-map file ``key`` (lazily, in every process), refusing a file whose content
        changed since this source was made: its rows are not the ones it promised."""
        path = self.paths[key]
        with self._watched.reopen(key) as f:
            header = _read_header(f, path)
            mapped = np.memmap(
                f,
                dtype=header.dtype,
                mode="r",
                offset=header.offset,
                shape=header.shape,
                order="F" if header.fortran else "C",
            )
        return mapped.view(np.ndarray)  # same pages; skips np.memmap's overhead

    def __len__(self) -> int:
        return self._num_rows

    def __repr__(self) -> str:
        parts = {k or "array": f"{self.dtypes[k]}{list(self.shapes[k])}" for k in self.shapes}
        return f"NumpySource({parts}, fingerprint={self._identity})"

    def _pick(self, rows: Any) -> Any:
        # a batch checks its files each time (one stat each); a row at most every 0.1 s
        wait = 0.1 if isinstance(rows, int) else 0.0
        at = _rows_at(rows)
        if self._single:
            return _read_only(self._array("", recheck_after=wait)[at])
        return {k: _read_only(self._array(k, recheck_after=wait)[at]) for k in self.shapes}

    def __getitem__(self, index: int) -> Any:
        return self._pick(record_index(index, self._num_rows, "row"))

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> Any:
        """Rows ``indices`` stacked: one gather per array."""
        return self._pick(record_indices(indices, self._num_rows, "row"))

    def get_valid_batch(self, rows: np.ndarray) -> Any:
        """:meth:`get_batch` of rows already known to be in range (an int64 array), as
        ``.batches()`` draws them: no bounds check (4-5 us of a ~40 us batch). A subclass
        that overrides :meth:`get_batch` is read through its override."""
        if type(self).get_batch is not NumpySource.get_batch:
            return self.get_batch(rows)
        return self._pick(rows)

    def _getitems(self, indices: Sequence[int]) -> list[Any]:
        batch = self.get_batch(indices)
        if self._single:
            return [_row(batch, j) for j in range(len(indices))]  # as ``self[i]``: a 0-d row too
        return [{k: _row(v, j) for k, v in batch.items()} for j in range(len(indices))]

    __getitems__ = _getitems


def _row(values: Any, j: int) -> Any:
    """Row ``j`` of a batch's feature: an array's as a 0-d view in its dtype (a numpy scalar
    would be the native one), anything else (a subclass's list) indexed as it is."""
    return values[_rows_at(j)] if isinstance(values, np.ndarray) else values[j]
