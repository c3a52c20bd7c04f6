"""GlobalBatchSource: a :class:`~grain_rox.TokenPipeline`'s Grain source, one record a batch.

Record ``i`` is global batch ``first_step + i`` (or this process's rows ``[lo, hi)`` of it):
the schedule says which source serves each row and which of that source's samples it is; each
source's window reader copies those windows out of the memory maps; the segment features
follow from the windows (``_sources._segments``). Everything opened comes from the pipeline's
resolved plan (``_plan``), so making a source is cheap after the first.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from grain_rox._format._digest import facts_digest
from grain_rox._order._curriculum import Phase, SourceRows
from grain_rox._order._lanes import LaneOrder
from grain_rox._order._permutation import int_arg, record_index
from grain_rox._pipeline._plan import source_label
from grain_rox._sources._grain_setup import make_grain_workers_usable
from grain_rox._sources._output_dtype import may_wrap, refuse_wrapped_ids, wrapped
from grain_rox._sources._segments import (
    INPUTS_POSITION,
    INPUTS_SEGMENTATION,
    TARGETS_POSITION,
    TARGETS_SEGMENTATION,
    FeatureArrays,
    Joins,
    batch_arrays,
    maxtext_record,
    segment_features,
    windows_record,
)
from grain_rox._sources._tokens_layout import TOKENS
from grain_rox._sources._windows import WindowReader, merge_joins

if TYPE_CHECKING:
    from grain_rox._pipeline._pipeline import TokenPipeline

RowSpec = tuple[int, int] | Mapping[int, tuple[int, int]] | None


def _rows_by_batch_size(rows: RowSpec, phases: Sequence[Phase]) -> dict[int, tuple[int, int]]:
    """Each phase batch size -> the rows ``[lo, hi)`` read of its batches (``rows`` gives one
    pair for all, a pair per batch size, or None: every row)."""
    out = {}
    if isinstance(rows, Mapping):
        sizes = sorted({p.batch_size for p in phases})
        missing = [b for b in sizes if b not in rows]
        unknown = [b for b in rows if b not in sizes]
        if missing or unknown:  # a missing size would read every row of its batches
            wrong = (
                f"lacks batch size {missing[0]}" if missing else f"names batch size {unknown[0]!r}"
            )
            raise ValueError(
                f"TokenPipeline: rows={dict(rows)!r:.200} {wrong}; the phases' batch sizes are "
                f"{sizes}: map each to this process's (lo, hi), or pass one (lo, hi) for all"
            )
    for p in phases:
        b = p.batch_size
        r = rows.get(b) if isinstance(rows, Mapping) else rows
        if r is not None and (not isinstance(r, (tuple, list)) or len(r) != 2):
            raise TypeError(f"TokenPipeline: rows={r!r} must be (lo, hi), e.g. rows=(0, {b})")
        lo, hi = r if r is not None else (0, b)
        lo = int_arg(lo, "rows lo", where="TokenPipeline", minimum=None)
        hi = int_arg(hi, "rows hi", where="TokenPipeline", minimum=None)
        if not 0 <= lo < hi <= b:
            raise ValueError(f"rows={r} must satisfy 0 <= lo < hi <= batch size {b}")
        out[b] = (int(lo), int(hi))
    return out


class GlobalBatchSource:
    """A Grain ``RandomAccessDataSource`` of (this process's rows of) global batches.

    Thread-safe, picklable without open handles, with a repr that identifies data and config
    (not the process's rows, so a DataLoader checkpoint restores on another host count).
    Made by :meth:`TokenPipeline.batch_source`.

    Args:
        pipeline: The :class:`~grain_rox.TokenPipeline` whose batches it serves.
        rows: This process's rows ``(lo, hi)`` of every global batch, or ``{batch_size:
            (lo, hi)}`` per phase batch size (None: all rows).
        first_step: The global batch that record 0 is.

    Raises:
        ValueError: rows outside a batch, or a ``first_step`` past the pipeline's end.

    >>> import tempfile, os, numpy as np
    >>> from grain_rox import TokenPipeline, write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "g.rox")
    >>> _ = write_rox([np.arange(9000, dtype=np.uint16)], path)
    >>> source = TokenPipeline(path, seq_len=16, global_batch_size=4).batch_source(rows=(2, 4))
    >>> source[0]["inputs"].shape, repr(source).startswith("GlobalBatchSource(data=")
    ((2, 16), True)
    >>> import sys; len(source) == sys.maxsize  # endless, as Grain's MapDataset.repeat()
    True
    """

    def __init__(self, pipeline: TokenPipeline, *, rows: RowSpec, first_step: int) -> None:
        make_grain_workers_usable()  # a user's own mp_prefetch/DataLoader workers start
        self.pipeline = pipeline
        self.schedule = pipeline.schedule
        self.first_step = int_arg(first_step, "first_step", where="TokenPipeline", minimum=0)
        self._rows = _rows_by_batch_size(rows, self.schedule.phases)
        # Kept here, not looked up through the pipeline: a pickled source (a Grain worker's)
        # then reads at once, without resolving the pipeline again.
        plan = pipeline.plan
        self.corpora = plan.corpora
        self.orders = plan.orders
        self.readers = [
            WindowReader(plan.readable[name], order)
            for name, order in zip(self.corpora, self.orders, strict=True)
        ]
        self.eos_ids = plan.eos_ids
        self.features = plan.has_segments  # whether batches carry segment features
        self.tokens = plan.tokens  # how a layout="tokens" batch packs into one array
        self.dtype = pipeline.dtype
        # sources whose ids the output dtype holds only below 2**31 (uint32 as int32): each
        # batch's rows of theirs are checked, a wrapped id refused (index -> how it is named)
        self._may_wrap = {
            i: (source_label(name, c), c.pad_id)
            for i, (name, c) in enumerate(self.corpora.items())
            if may_wrap(self.dtype, c.dtype)
        }
        self.num_batches: int | None = plan.num_batches
        self.step_limit = plan.step_limit
        plan.check_step(self.first_step, "first_step")
        # Grain's "endless" is len == sys.maxsize (as MapDataset.repeat() reports it)
        total = self.num_batches
        self._len = sys.maxsize if total is None else max(0, total - self.first_step)

    @property
    def rows(self) -> tuple[int, int]:
        """This process's rows of the first phase's batches."""
        return self._rows[self.schedule.phases[0].batch_size]

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        p = self.pipeline
        data = {n: c.fingerprint for n, c in self.corpora.items()}
        digest = facts_digest(
            [
                data,
                self.schedule.describe(),
                int(p.seed),
                p.num_epochs,
                list(self.eos_ids),
                # the lanes order as grain_rox 0.1 named it: its DataLoader states restore
                [
                    (o.chunk_tokens, o.lanes)
                    if isinstance(o, LaneOrder)
                    else (o.name, o.chunk_tokens, o.identity())
                    for o in self.orders
                ],
                p.dtype.name,
                self.first_step,
                # block padding left out changes the order: named where there is any (the
                # repr of data without padding, and of the lanes order, is as before)
                *([p.plan.padding_left_out] if p.plan.padding_left_out else []),
                # holes read as whole windows: named where a schedule reads any
                *(["holes: whole windows"] if p.plan.reads_holes else []),
                # the lanes order keeps room for max_seq_len at each lane's end: named where
                # it is not the longest phase's (the repr of 0.1's lanes order is as before)
                *(
                    [f"max_seq_len {o.max_seq_len}"]
                    if isinstance(o := self.orders[0], LaneOrder)
                    and o.max_seq_len != max(ph.seq_len for ph in self.schedule.phases)
                    else []
                ),
            ]
        )
        shown = ",".join(f"{n}:{f}" if n else f for n, f in data.items())
        return (
            f"GlobalBatchSource(data={shown}, phases={len(self.schedule.phases)}, "
            f"seed={p.seed}, first_step={self.first_step}, config={digest})"
        )

    def _index(self, index: int) -> int:
        """``index`` as a record number in ``[0, len)``: a negative one counts from the end
        (as for a list or ``MapDataset``); an endless pipeline serves records below
        ``step_limit - first_step`` and has no end to count from."""
        if self.num_batches is not None:
            return record_index(index, self._len, "batch", "batches")
        if isinstance(index, (bool, np.bool_)):
            raise TypeError(f"batch index {index!r} is a bool; pass an int")
        index = operator.index(index)
        last = self.step_limit - 1 - self.first_step
        endless = (
            "Its len is sys.maxsize, Grain's 'endless'. Its batches are already shuffled (by "
            "the pipeline's seed); to shuffle them again or index from the end, take a finite "
            "prefix first: ds[:n].shuffle(seed=...), or pass num_epochs= or finite phases"
        )
        if index < 0:
            raise IndexError(
                f"batch {index}: an endless pipeline has no last batch to count from. {endless}"
            )
        if index > last:
            raise IndexError(
                f"batch {index} is past the last batch this endless pipeline serves, {last} "
                f"(step {self.step_limit - 1}: sample numbers stay below 2**61). {endless}"
            )
        return index

    def sources_of(self, step: int) -> np.ndarray:
        """Which source (index into ``pipeline.names``) serves each row of global ``step``."""
        p = self.schedule.phases[self.schedule.phase_of_step(step)]
        return self.schedule.step_samples(step, 0, p.batch_size)[1].copy()  # not the cache

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        step = self.first_step + self._index(index)
        phase = self.schedule.phases[self.schedule.phase_of_step(step)]
        lo, hi = self._rows[phase.batch_size]
        # each row's source, its sample number in that source's own order, each source's rows
        sources, samples, groups = self.schedule.step_rows(step, lo, hi)
        if self.pipeline.layout == TOKENS:
            layout = self.tokens
            assert layout is not None  # TokenPipeline checked it
            batch = layout.empty(hi - lo, phase.seq_len)
            _, joins, content = self._read(samples, groups, batch[:, : phase.seq_len + 1])
            if self._may_wrap:  # the ids as stored, cast on the devices by unpack
                self._refuse_wrapped(batch[:, : phase.seq_len + 1], sources)
            row_eos = np.asarray(self.eos_ids)[sources] if layout.eos_column else None
            return {TOKENS: layout.fill(batch, joins, row_eos, content)}
        stacked = self.pipeline.layout == "windows"
        out, feature_out, segments = batch_arrays(
            hi - lo, phase.seq_len, self.dtype, features=self.features, stacked=stacked
        )
        windows, joins, content = self._read(samples, groups, out)
        if self._may_wrap:
            self._refuse_wrapped(windows, sources)
        features = self._features(windows, joins, groups, content, feature_out)
        windows.flags.writeable = False  # inputs and targets are views of one buffer
        if stacked:
            return windows_record(windows, features, segments)
        return maxtext_record(windows, features)

    def _refuse_wrapped(self, windows: np.ndarray, sources: np.ndarray) -> None:
        """Refuse a batch with an id its sources' dtype holds but the output's does not
        (mixed sources: one pass over the batch, each source's rows looked at only where a
        row holds such an id)."""
        if len(self.readers) == 1:
            label, pad_id = self._may_wrap[0]
            refuse_wrapped_ids(windows, self.dtype, label, where="TokenPipeline", pad_id=pad_id)
            return
        suspect = wrapped(windows.min(axis=1), self.dtype) | wrapped(
            windows.max(axis=1), self.dtype
        )
        if not suspect.any():
            return
        for s, (label, pad_id) in self._may_wrap.items():
            rows = suspect & (sources == s)
            if rows.any():
                refuse_wrapped_ids(
                    windows[rows], self.dtype, label, where="TokenPipeline", pad_id=pad_id
                )

    def _read(
        self, samples: np.ndarray, groups: list[SourceRows], out: np.ndarray
    ) -> tuple[np.ndarray, Joins | None, np.ndarray | None]:
        """The windows of each row's sample of its source, written into ``out``, where they
        cross chunk joins (None when no window crosses one) and, for packed rows, each row's
        tokens before its padding (None: full windows)."""
        if len(self.readers) == 1:  # its samples are consecutive (step_rows): one run
            reader = self.readers[0]
            joins = reader.read_run(groups[0][2], out, None)
            return out, joins, reader.run_content(groups[0][2], samples.size)
        content = None
        parts_joins = []
        for s, rows, first in groups:  # each source's rows, straight into out
            reader = self.readers[s]
            part_joins = reader.read_run(first, out, rows)
            if part_joins is not None:
                parts_joins.append(part_joins)
            part_content = reader.run_content(first, rows.size)
            if part_content is not None:
                if content is None:
                    content = np.empty(samples.size, dtype=np.int64)
                content[rows] = part_content
        return out, merge_joins(parts_joins), content

    def _features(
        self,
        windows: np.ndarray,
        joins: Joins | None,
        groups: list[SourceRows],
        content: np.ndarray | None,
        into: FeatureArrays | None,
    ) -> dict[str, np.ndarray]:
        if not self.features:
            return {}
        eos_ids = [int(e) for e in self.eos_ids if e is not None]
        if len(set(eos_ids)) == 1:  # one EOS id for all sources: one pass over the batch
            return segment_features(windows, eos_ids[0], joins, content, out=into)
        assert into is not None  # batch_arrays carved them (the batch has features)
        seg, pos, tgt = into
        for s, sel, _ in groups:  # each source's rows, with its own EOS
            part_joins = None
            if joins is not None:  # this source's joins, by row of windows[sel]
                at = np.full(windows.shape[0], -1, dtype=np.int64)
                at[sel] = np.arange(sel.size)
                mine = at[joins[0]] >= 0
                part_joins = (at[joins[0][mine]], joins[1][mine])
            part_content = None if content is None else content[sel]
            part = segment_features(windows[sel], eos_ids[s], part_joins, part_content)
            seg[sel] = part[INPUTS_SEGMENTATION]
            pos[sel] = part[INPUTS_POSITION]
            tgt[sel] = part[TARGETS_SEGMENTATION]
        for array in (seg, pos, tgt):
            array.flags.writeable = False
        return {
            INPUTS_SEGMENTATION: seg,
            INPUTS_POSITION: pos,
            TARGETS_SEGMENTATION: tgt,
            TARGETS_POSITION: pos,
        }

    def _getitems(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        return [self[i] for i in indices]

    __getitems__ = _getitems
