"""Curriculum phases: (steps, batch_size, seq_len, weights) and the step -> phase map.

A schedule is a list of :class:`Phase`; the last may be endless (``steps=None``). Global step
``k`` falls in the phase whose step range holds it (O(#phases)); its samples are numbered
continuously across phases, and inside a phase they are split between sources by that phase's
:class:`~grain_rox._order._mixture.Mixture`, counted from the phase's first sample.

Each source therefore knows, in closed form, how many samples every phase drew from it, so its
own sample counter — and with it its lane cursors (see ``_lanes``) — continues across phase
boundaries: when ``seq_len``, ``batch_size`` or the weights change, no token is replayed and
none is skipped.

Roxxel's ``stream(..., start_step, completed_phases=[(steps, batch_size, seq_len), ...])``
maps to ``[Phase(steps, batch_size, seq_len) for each completed phase] + [Phase(None,
batch_size, seq_len)]`` for the current one (with grain_rox's own order, not roxxel's: use
:func:`grain_rox.roxxel_stream` to reproduce roxxel's batches bit for bit).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from grain_rox._order._lanes import Run
from grain_rox._order._mixture import Mixture, legacy_weights, own_samples, resolve_weights
from grain_rox._order._permutation import int_arg, json_plain

ENDLESS = 1 << 62
SAMPLE_LIMIT = 1 << 61  # sample numbers stay below this (int64 arithmetic with room to spare)
# How a phase's description names its apportionment by the exact weights (an earlier
# grain_rox quantised them to 2**30ths: its states are checked by legacy_counts_differ).
EXACT_MIXING = "exact weights"
MIX_SPAN = 4096  # a phase's samples whose mixture is worked out at once
# Up to this many sources a cached span also keeps each source's running count (MIX_SPAN + 1
# rows of one int32 per source: 48 KiB for 3), so a batch finds each source's rows by two
# lookups (3 sources, 32 rows: 3.0 us against 4.7 for a stable sort of the batch's sources).
_COUNTED_SOURCES = 16
# One source's rows of a batch: (source, its rows in [0, hi - lo), ascending, the sample
# number in the source's own order of the first of them; the others follow it one by one).
SourceRows = tuple[int, np.ndarray, int]


@dataclasses.dataclass(frozen=True)
class _Span:
    """A phase's samples ``[span * MIX_SPAN, ...)``: the mixture worked out once."""

    sources: np.ndarray  # (MIX_SPAN,) the source of each sample
    own: np.ndarray  # (MIX_SPAN,) its sample number in that source's own order
    first_own: list[int]  # each source's own sample number at the span's start
    # (MIX_SPAN + 1, S) int32: samples of each source before each position (None: many sources)
    counts: np.ndarray | None
    positions: list[np.ndarray]  # each source's positions in the span, ascending (with counts)


@dataclasses.dataclass(frozen=True)
class Phase:
    """One curriculum phase: ``steps`` global batches (None: forever) of ``batch_size`` rows
    of ``seq_len`` tokens, drawn from the sources with ``weights`` (name -> weight).

    Args:
        steps: Global batches in the phase (None: forever; only the last phase may be
            endless).
        batch_size: Rows per global batch, over all processes.
        seq_len: Tokens per row of ``inputs``.
        weights: ``{name: weight}`` over the pipeline's sources (a missing name has weight 0;
            None: a single source).

    Raises:
        TypeError: a non-int ``steps``, ``batch_size`` or ``seq_len`` (bools and floats too),
            or ``weights`` that is not a mapping.
        ValueError: a count below 1.

    >>> Phase(steps=100, batch_size=32, seq_len=256, weights={"code": 0.7, "prose": 0.3})
    Phase(steps=100, batch_size=32, seq_len=256, weights={'code': 0.7, 'prose': 0.3})
    """

    steps: int | None
    batch_size: int
    seq_len: int
    weights: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        # Python or numpy ints (stored as int); "5", 2.7 and True are refused
        if self.steps is not None:
            object.__setattr__(self, "steps", int_arg(self.steps, "steps", where="Phase"))
        for name in ("batch_size", "seq_len"):
            object.__setattr__(self, name, int_arg(getattr(self, name), name, where="Phase"))
        if self.weights is not None:
            if not isinstance(self.weights, Mapping):
                raise TypeError(
                    f"Phase: weights={self.weights!r} is a {type(self.weights).__name__}, not "
                    "a mapping; pass weights={name: weight, ...}"
                )
            # NumPy names or weights become Python ones (a checkpoint's state is JSON)
            object.__setattr__(self, "weights", json_plain(dict(self.weights)))

    def describe(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "batch_size": int(self.batch_size),
            "seq_len": int(self.seq_len),
            "weights": None if self.weights is None else dict(sorted(self.weights.items())),
        }


class Schedule:
    """Phases over named sources: step -> (phase, samples), and each source's runs."""

    def __init__(self, phases: Sequence[Phase], names: Sequence[str]) -> None:
        if not phases:
            raise ValueError("a schedule needs at least one Phase")
        for i, p in enumerate(phases[:-1]):
            if p.steps is None:
                raise ValueError(f"only the last phase may be endless; phase {i} has steps=None")
        self.phases = tuple(phases)
        self.names = tuple(names)
        self.mixtures = tuple(
            Mixture.from_weights(resolve_weights(self.names, p.weights, f"phase {i}"))
            for i, p in enumerate(self.phases)
        )
        self.step_starts = [0]
        self.sample_starts = [0]
        for i, p in enumerate(self.phases):
            if (
                p.steps is not None
                and self.sample_starts[-1] + p.steps * p.batch_size > SAMPLE_LIMIT
            ):
                raise ValueError(
                    f"phase {i}: steps={p.steps} of batch_size={p.batch_size} take the schedule "
                    f"past {SAMPLE_LIMIT} samples (2**61), the most supported; give fewer steps "
                    "(the last phase may be endless: steps=None)"
                )
            steps = ENDLESS if p.steps is None else p.steps
            self.step_starts.append(min(ENDLESS, self.step_starts[-1] + steps))
            self.sample_starts.append(min(ENDLESS, self.sample_starts[-1] + steps * p.batch_size))
        # Samples each source drew in each finished phase, and where each source's phase
        # segment starts in its own sample numbering.
        self.source_starts: list[list[int]] = []
        base = [0] * len(self.names)
        for i, p in enumerate(self.phases):
            self.source_starts.append(list(base))
            if p.steps is not None:
                drawn = self.mixtures[i].counts(p.steps * p.batch_size)
                base = [b + d for b, d in zip(base, drawn, strict=True)]
        self._spans: dict[tuple[int, int], _Span] = {}
        self.total_steps = None if self.phases[-1].steps is None else self.step_starts[-1]
        if self.total_steps is None:  # the endless phase runs until its samples reach the limit
            last = self.phases[-1]
            left = max(0, SAMPLE_LIMIT - self.sample_starts[-2])
            room = left // last.batch_size
            if not room:  # not one batch of it below the limit: it could serve nothing
                fix = (
                    f"give a batch size of at most {left}"
                    if left
                    else "give the phases before it fewer steps"
                )
                raise ValueError(
                    f"phase {len(self.phases) - 1}: no batch of batch_size={last.batch_size} "
                    f"fits below 2**61 = {SAMPLE_LIMIT} samples, the most supported; {fix}"
                )
            self.step_limit = self.step_starts[-2] + room
        else:
            self.step_limit = self.total_steps

    def phase_of_step(self, step: int) -> int:
        if step < 0 or step >= self.step_limit:
            what = "total" if self.total_steps is not None else "endless: supported steps below"
            raise IndexError(f"step {step} is outside the schedule ({what} {self.step_limit})")
        return bisect.bisect_right(self.step_starts, step) - 1

    def source_runs(self, source: int) -> list[Run]:
        """The source's own sample ranges per phase, with that phase's seq_len."""
        runs: list[Run] = []
        for i, p in enumerate(self.phases):
            start = self.source_starts[i][source]
            if p.steps is None:
                stop = ENDLESS
            else:
                stop = start + self.mixtures[i].counts(p.steps * p.batch_size)[source]
            if stop > start:
                if runs and runs[-1].seq_len == p.seq_len and runs[-1].stop == start:
                    runs[-1] = Run(runs[-1].start, stop, p.seq_len)
                else:
                    runs.append(Run(start, stop, p.seq_len))
        if not runs or runs[-1].stop != ENDLESS:
            last = self.phases[-1].seq_len
            start = runs[-1].stop if runs else 0
            runs.append(Run(start, ENDLESS, last))  # never read; keeps the map total
        return runs

    def step_samples(self, step: int, lo: int, hi: int) -> tuple[int, np.ndarray, np.ndarray]:
        """For rows ``[lo, hi)`` of global batch ``step``: (phase, source of each row, the row's
        sample index in its source's own numbering)."""
        i = self.phase_of_step(step)
        p = self.phases[i]
        first = (step - self.step_starts[i]) * p.batch_size
        if len(self.names) == 1:  # no mixing: the source's own samples, in order
            own = self.source_starts[i][0] + first + np.arange(lo, hi, dtype=np.int64)
            return i, np.zeros(hi - lo, dtype=np.int64), own
        a, b = first + lo, first + hi
        span = a // MIX_SPAN
        if (b - 1) // MIX_SPAN == span:  # nearly always: the rows lie in one cached span
            hit = self._mix_span(i, span)
            x = a % MIX_SPAN
            return i, hit.sources[x : x + hi - lo], hit.own[x : x + hi - lo]
        mixture = self.mixtures[i]
        before = mixture.counts(a)
        sources = mixture.sources_from(a, b, before)
        return i, sources, self._own_samples(i, sources, before)[0]

    def step_rows(
        self, step: int, lo: int, hi: int
    ) -> tuple[np.ndarray, np.ndarray, list[SourceRows]]:
        """:meth:`step_samples`' sources and samples of rows ``[lo, hi)`` of global batch
        ``step``, and each serving source's rows (:data:`SourceRows`, sources ascending): a
        source's rows in a batch take consecutive samples of its own order."""
        i = self.phase_of_step(step)
        p = self.phases[i]
        a = (step - self.step_starts[i]) * p.batch_size + lo
        x, n = a % MIX_SPAN, hi - lo
        if len(self.names) > 1 and x + n <= MIX_SPAN:
            hit = self._mix_span(i, a // MIX_SPAN)
            if hit.counts is not None:
                before, after = hit.counts[x].tolist(), hit.counts[x + n].tolist()
                groups = [
                    (s, hit.positions[s][k0:k1] - x, hit.first_own[s] + k0)
                    for s, (k0, k1) in enumerate(zip(before, after, strict=True))
                    if k1 > k0
                ]
                return hit.sources[x : x + n], hit.own[x : x + n], groups
        _, sources, samples = self.step_samples(step, lo, hi)
        if len(self.names) == 1:
            return sources, samples, [(0, np.arange(n), int(samples[0]))]
        order = np.argsort(sources, kind="stable")
        ends = np.cumsum(np.bincount(sources, minlength=len(self.names))).tolist()
        groups = []
        for s, (k0, k1) in enumerate(zip([0, *ends[:-1]], ends, strict=True)):
            if k1 > k0:
                rows = order[k0:k1]
                groups.append((s, rows, int(samples[rows[0]])))
        return sources, samples, groups

    def _own_samples(
        self, phase: int, sources: np.ndarray, before: Sequence[int]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """:func:`own_samples` of rows of ``phase`` whose sources are ``sources``, the first
        coming after ``before`` samples per source (in the phase)."""
        starts = self.source_starts[phase]
        first = [starts[s] + before[s] for s in range(len(self.names))]
        return own_samples(sources, first, len(self.names))

    def _mix_span(self, phase: int, span: int) -> _Span:
        """The phase's samples ``[span * MIX_SPAN, ...)``: the mixture worked out once for
        many batches (a few cached; the cache is not pickled)."""
        key = (phase, span)
        hit = self._spans.get(key)
        if hit is None:
            mixture = self.mixtures[phase]
            a = span * MIX_SPAN
            before = mixture.counts(a)
            sources = mixture.sources_from(a, a + MIX_SPAN, before)
            own, positions = self._own_samples(phase, sources, before)
            sources.flags.writeable = own.flags.writeable = False  # shared by many batches
            count = len(self.names)
            counts = None
            if count <= _COUNTED_SOURCES:
                counts = np.zeros((MIX_SPAN + 1, count), dtype=np.int32)
                counts[np.arange(1, MIX_SPAN + 1), sources] = 1
                np.cumsum(counts, axis=0, out=counts)
            hit = _Span(
                sources=sources,
                own=own,
                first_own=[self.source_starts[phase][s] + before[s] for s in range(count)],
                counts=counts,
                positions=[] if counts is None else positions,
            )
            if len(self._spans) >= 8:
                self._spans.clear()
            self._spans[key] = hit
        return hit

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_spans": {}}

    def describe(self) -> list[dict[str, Any]]:
        """Each phase's config; and its groups of sources (:meth:`Mixture.groups`) where its
        order is not the flat apportionment (named only there: a state saved before mixing
        grouped sources is refused where, and only where, the order changed); and, for a phase
        that mixes, that it apportions by the exact weights (``apportioned``: a state saved
        while they were quantised is refused, or, by ``MultiHostDataLoadIterator``, accepted
        where its counts so far are the same, :func:`legacy_counts_differ`)."""
        described = []
        for p, mixture in zip(self.phases, self.mixtures, strict=True):
            groups = mixture.groups(self.names)
            described.append(
                {
                    **p.describe(),
                    **({"mixing": groups} if groups else {}),
                    # a phase that mixes apportions by the exact weights (EXACT_MIXING)
                    **({"apportioned": EXACT_MIXING} if mixture.mixes else {}),
                }
            )
        return described


def history_problems(saved: list[dict[str, Any]], now: list[dict[str, Any]], step: int) -> str:
    """Why the phases ``now`` cannot continue a run saved at ``step`` under ``saved`` ("" if
    they can: phases that already ran, fully or partly, must be the same; later ones may
    change, and a running phase, or one that ended at ``step``, may be cut short there or run
    longer).

    ``saved`` and ``now`` are :meth:`Schedule.describe` lists.

    >>> ph = lambda *steps: [dict(steps=n, batch_size=8, seq_len=16, weights=None) for n in steps]
    >>> history_problems(ph(30, 30), ph(30, 10, 10), step=40)  # the running phase cut short
    ''
    >>> history_problems(ph(30, 30), ph(20, 40), step=40)
    'phase 0 ran its 30 steps but now has 20'
    """
    start = 0
    for i, old in enumerate(saved):
        if start >= step:
            return ""  # this phase had not started: the new schedule may differ from here on
        if i >= len(now):
            return f"phase {i} (started at step {start}) is missing from the new schedule"
        new = now[i]
        diff = [
            f"{k} {old[k]!r} -> {new[k]!r}"
            for k in ("batch_size", "seq_len", "weights")
            if old[k] != new[k]
        ]
        if old.get("mixing") != new.get("mixing"):
            diff.append(
                f"mixing {_mixing_text(old.get('mixing'))} -> {_mixing_text(new.get('mixing'))}"
            )
        if diff:
            return f"phase {i}, which ran from step {start}, changed ({', '.join(diff)})"
        old_steps, new_steps = old["steps"], new["steps"]
        # this phase ran in full, and the next one began (a phase that ended at ``step`` has
        # the steps it ran, and may go on, as a running one may: nothing after it was served)
        if old_steps is not None and step > start + old_steps:
            if new_steps != old_steps:
                return f"phase {i} ran its {old_steps} steps but now has {new_steps}"
            start += old_steps
            continue
        done = step - start  # the phase that was running when the state was saved
        if new_steps is not None and new_steps < done:
            return f"phase {i} already ran {done} steps but now has only {new_steps}"
        return ""  # it continues, or is cut short here: later phases may differ
    return ""


def legacy_counts_differ(schedule: Schedule, step: int) -> list[int]:
    """The phases (indices) that began before ``step`` and whose sources' counts of the
    samples they served before it differ between the exact weights and the 2**30ths an
    earlier grain_rox quantised them to: a state it saved there would resume onto other
    samples. (The sequences agree far beyond 10**6 samples a phase, and the counts until the
    quantised ones strayed, from about 10**8 to 10**10.)

    >>> sched = Schedule([Phase(None, 4, 8, {"a": 0.5, "b": 0.3, "c": 0.2})], ["a", "b", "c"])
    >>> legacy_counts_differ(sched, 10**6), legacy_counts_differ(sched, 10**10)
    ([], [0])
    """
    differ = []
    for i, (phase, mixture) in enumerate(zip(schedule.phases, schedule.mixtures, strict=True)):
        begun = schedule.step_starts[i]
        if begun >= step:
            break
        if not mixture.mixes:
            continue
        n = (min(step, schedule.step_starts[i + 1]) - begun) * phase.batch_size
        weights = resolve_weights(schedule.names, phase.weights, f"phase {i}")
        if Mixture(legacy_weights(weights)).counts(n) != mixture.counts(n):
            differ.append(i)
    return differ


def _mixing_text(groups: Any) -> str:
    if groups is None:
        return "by one apportionment of all sources"
    return (
        f"by groups {groups!r} (grain_rox groups the sources where one apportionment would "
        "let a count stray more than 1 from round(w * n))"
    )
