"""Local files streamed with HF ``IterableDataset`` as a resumable Grain ``IterDataset``: the
source's config, the files' identity, and how a streamed row becomes a record (the dataset and
its window-shuffled iterator are in ``_hf_stream_windows``)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from grain_rox._format._digest import facts_digest
from grain_rox._order._permutation import int_arg
from grain_rox._sources._grain_setup import make_grain_workers_usable
from grain_rox._sources._hf_stream_windows import StreamDataset
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
    literal_files,
    refuse_nanosecond_times,
    refuse_untyped_lists,
)
from grain_rox._text._lost_nuls import lost_nul, lost_nul_fix, lost_nul_problem, may_lose_nuls

_SAMPLE = 1 << 20  # bytes hashed at each end of a data file for its identity


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


def _shard_arg(shard: Any) -> tuple[int, int]:
    """``shard`` as ``(index, count)`` with ``0 <= index < count``, or a ValueError (HF's
    ``split_dataset_by_node`` wraps an index past the count: another host's rows, twice).

    >>> _shard_arg((2, 2))
    Traceback (most recent call last):
    ...
    ValueError: HFStreamingSource: shard=(2, 2) must be (index, count) with 0 <= index < count, e.g. (jax.process_index(), jax.process_count())
    """
    index, count = (int_arg(x, "shard", where="HFStreamingSource", minimum=None) for x in shard)
    if not 0 <= index < count:
        raise ValueError(
            f"HFStreamingSource: shard={tuple(shard)!r} must be (index, count) with 0 <= index "
            "< count, e.g. (jax.process_index(), jax.process_count())"
        )
    return index, count


class HFStreamingSource:
    """Local files streamed with HF ``IterableDataset`` as a Grain ``IterDataset``, resumable.

    Args:
      data_files: local ``.parquet``, ``.json``/``.jsonl`` or ``.arrow`` files, all of one
        kind (a path or a list of them), read in that order.
      shuffle_buffer: ``0`` (default): the files' order; ``B``: each window of ``B`` rows of
        this host's stream served in a seeded permutation of its own, new every epoch.
      seed: the shuffle's seed.
      shard: ``(index, count)``: the part of the files' rows this host streams.
      include_keys: the columns to keep (default: all).
      exclude_keys: columns to leave out.
      tokenize: text columns to serve as ``int32`` token ids (as :class:`HFEagerSource`).
      tokenizer: for ``tokenize``: ``"bytes"``, ``"cl100k_base"``, a ``tokenizer.json``
        path or a :class:`~grain_rox.Tokenizer`.
      append_eos: append EOS to each tokenized text (default True).
      nulls: ``"error"`` (default) or ``"skip"``: what a missing value (None) in a kept
        column does (see below).

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
    tokenizer by its vocabulary's sha256 and EOS id, shuffle buffer, seed, shard, worker
    slice): ``set_state`` refuses a state from
    other files or another config, naming what changed. Files of any size are identified
    without reading them whole, so an edit in place that keeps a file's size and its first and
    last MiB is not seen (convert to ``.rox``, or use :class:`HFEagerSource`, for digests of
    the whole content). ``num_epochs`` may differ at the restore (each epoch is read afresh),
    but a state past the new end is refused. A missing value (None) in a kept
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
        self.shard = _shard_arg(shard)
        self.include_keys = list(include_keys) if include_keys is not None else None
        self.exclude_keys = list(exclude_keys or ())
        self.nulls = check_nulls_arg(nulls)
        self.dtypes: dict[str, Any] = {}
        self.nul_checked: list[str] | None = None  # columns numpy may shorten (None: all)
        self.kept = self.columns()
        self.format = RecordFormat(
            columns=self.kept,
            tokenize=tokenize,
            tokenizer=tokenizer,
            append_eos=append_eos,
            dtypes=self.dtypes,
        )
        self._identity: dict[str, Any] | None = None
        make_grain_workers_usable()  # a user's own mp_prefetch workers start

    def columns(self) -> list[str]:
        """The kept columns, from the files' schema (an error names unknown keys)."""
        try:
            ds = hf_datasets().load_dataset(
                self.kind, data_files=literal_files(self.files[:1]), split="train", streaming=True
            )
            features = ds.features
        except read_errors() as e:
            raise unreadable(self.files[:1], self.kind, e) from None
        kept = kept_columns(list(ds.column_names or []), self.include_keys, self.exclude_keys)
        if features is not None:  # numbers keep the files' dtypes, as in HFEagerSource
            self.dtypes = arrow_dtypes(features.arrow_schema)
            where = f"HFStreamingSource({self.files[0]})"
            typing = (  # a stream's schema is its first file's: a dataset cast does not apply
                f"which a stream reads from its first file ({self.files[0]}): list a file "
                "whose lists hold values first, or write the files as Parquet with the "
                "list typed (e.g. list<int32>, in the column or its struct field)"
            )
            refuse_untyped_lists(features.arrow_schema, kept, where, typing=typing)
            refuse_nanosecond_times(features.arrow_schema, kept, where)
            schema = features.arrow_schema
            self.nul_checked = [c for c in kept if may_lose_nuls(schema.field(c).type)]
        return kept

    def __repr__(self) -> str:
        """Content-identifying, as Grain compares sources: its files' digests and config."""
        return f"HFStreamingSource(identity={facts_digest(self.identity())})"

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

    @property
    def named_files(self) -> str | list[str]:
        """The stream's file (or files), as its errors name them."""
        return self.files[0] if len(self.files) == 1 else self.files

    def has_null(self, row: Mapping[str, Any], index: int, epoch: int) -> bool:
        """Whether ``row`` (row ``index`` of this host's stream) holds a missing value (None)
        to skip; with ``nulls="error"`` such a row is an error naming the column and row."""
        for key, value in row.items():
            inside = python_null(value)
            if inside is not None:
                if self.nulls == "skip":
                    return True
                where = f"of this host's stream, shard={self.shard}, epoch {epoch}"
                raise ValueError(
                    f"{self.named_files}: {null_problem(key, index, inside, where)}. Drop or fill such "
                    "rows in the files, pass nulls='skip' to leave them out (counted), or leave "
                    f"the column out (exclude_keys=[{key!r}])"
                )
        return False

    def record(self, row: dict[str, Any], index: int, epoch: int) -> dict[str, Any]:
        """A streamed row (row ``index`` of this host's stream) as the eager source's record
        (same keys, dtypes and tokens); a text or bytes value that numpy would hold without
        its trailing NULs is an error naming the column and row."""
        record = self.format.row(row)
        for key in list(record) if self.nul_checked is None else self.nul_checked:
            if key in self.format.tokenize:
                continue
            found = lost_nul(row[key], record[key])
            if found is not None:
                fields, text = found
                where = f"row {index} of this host's stream, shard={self.shard}, epoch {epoch}"
                raise ValueError(
                    f"{self.named_files}: {lost_nul_problem(key, fields, where, text)}. "
                    f"{lost_nul_fix(key, fields, text, files=True)}"
                )
        return record

    def build(self) -> Any:
        """The HF ``IterableDataset`` (sharded, shuffled, column-filtered)."""
        datasets = hf_datasets()
        from datasets.distributed import split_dataset_by_node

        ds = datasets.load_dataset(
            self.kind, data_files=literal_files(self.files), split="train", streaming=True
        )
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
        return StreamDataset(self, num_epochs)
