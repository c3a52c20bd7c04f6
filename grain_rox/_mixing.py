"""Exact weighted mixing: which source serves sample ``n``, in O(#sources) for any ``n``.

The first ``n`` samples of a mixture are split between sources by the Sainte-Laguë
(Webster) apportionment of ``n`` seats with the given weights: seat ``m`` of source ``i`` has
priority ``w_i / (2m + 1)`` and the seats are handed out in order of decreasing priority (ties
to the lower source index). The apportionment is house-monotone, so this is a sequence: sample
``n`` goes to the source whose count grows from ``n`` to ``n + 1`` seats. Properties:

* after ``n`` samples, source ``i`` has served ``round(w_i * n)`` ± 1 samples, at every ``n``
  (two sources: within 0.5); no randomness is involved, so proportions hold on every prefix;
* the counts at any ``n`` are found directly (quota, then a few exact integer corrections),
  so reaching sample 10**12 costs what reaching sample 10 does;
* weights are quantised to integers summing to 2**30 (a relative error below 1e-9).

:func:`mix_datasets` puts the identity of its inputs (:func:`describe_dataset`) and of its
weights, phases, seed and length into its iterators' states, so a state saved over another
mixture is refused, naming what changed.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import re
import sys
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import grain
import numpy as np

from grain_rox._digest import facts_digest
from grain_rox._grain_setup import make_grain_workers_usable
from grain_rox._identity import IdentifiedIterDataset, IdentifiedMapDataset, with_identity
from grain_rox._order import derive_key, int_arg, seed_arg

WEIGHT_SCALE = 1 << 30


def quantize_weights(weights: Sequence[float]) -> tuple[int, ...]:
    """Non-negative weights -> integers summing to 2**30 (largest remainder).

    >>> quantize_weights([0.5, 0.25, 0.25])
    (536870912, 268435456, 268435456)
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0 or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights {list(weights)} must be finite, >= 0, and not all 0")
    exact = w / w.sum() * WEIGHT_SCALE
    q = np.floor(exact).astype(np.int64)
    short = WEIGHT_SCALE - int(q.sum())
    order = np.argsort(-(exact - q), kind="stable")
    q[order[:short]] += 1
    return tuple(int(x) for x in q)


@dataclasses.dataclass(frozen=True)
class Mixture:
    """A weighted mixture of ``len(weights)`` sources (see the module doc).

    >>> m = Mixture.from_weights([0.7, 0.3])
    >>> m.counts(10), m.sources(0, 10).tolist()
    ((7, 3), [0, 1, 0, 0, 0, 1, 0, 0, 1, 0])
    """

    weights: tuple[int, ...]  # quantised, summing to WEIGHT_SCALE

    @classmethod
    def from_weights(cls, weights: Sequence[float]) -> Mixture:
        return cls(quantize_weights(weights))

    def _next_beats(self, i: int, ci: int, j: int, cj: int) -> bool:
        """Whether seat ``ci`` of source ``i`` comes before seat ``cj`` of source ``j``."""
        left = self.weights[i] * (2 * cj + 1)
        right = self.weights[j] * (2 * ci + 1)
        return left > right or (left == right and i < j)

    def _best_next(self, c: list[int]) -> int:
        best = -1
        for i, w in enumerate(self.weights):
            if w and (best < 0 or self._next_beats(i, c[i], best, c[best])):
                best = i
        return best

    def counts(self, n: int) -> tuple[int, ...]:
        """How many of the first ``n`` samples each source serves."""
        if n < 0:
            raise ValueError(f"n={n} must be >= 0")
        w = self.weights
        c = [n * wi // WEIGHT_SCALE for wi in w]  # quota floor: at most n, within k of it
        while sum(c) < n:
            i = self._best_next(c)
            c[i] += 1
        while True:  # swap while an excluded seat outranks an included one
            i = self._best_next(c)
            worst = -1
            for j in range(len(w)):
                if c[j] and (worst < 0 or self._next_beats(worst, c[worst] - 1, j, c[j] - 1)):
                    worst = j
            if worst < 0 or i == worst or not self._next_beats(i, c[i], worst, c[worst] - 1):
                break
            c[i] += 1
            c[worst] -= 1
        return tuple(c)

    def sources(self, start: int, stop: int) -> np.ndarray:
        """The source of each sample in ``[start, stop)`` (int64 array).

        The counts at both ends are exact, so the block holds exactly the right seats; they
        are ordered by float priority, and the rare runs of nearly equal priorities (where
        float64 cannot tell them apart) are re-sorted with exact integer arithmetic.
        """
        return self.sources_from(start, stop, self.counts(start))

    def sources_from(self, start: int, stop: int, before: Sequence[int]) -> np.ndarray:
        """:meth:`sources` when ``before = counts(start)`` is already known."""
        n = max(0, stop - start)
        if n == 0:
            return np.empty(0, dtype=np.int64)
        c0, c1 = tuple(before), self.counts(stop)
        src = np.repeat(np.arange(len(self.weights)), np.subtract(c1, c0))
        seat = np.concatenate(
            [np.arange(a, b, dtype=np.int64) for a, b in zip(c0, c1, strict=True)]
        )
        w = np.asarray(self.weights, dtype=np.float64)[src]
        key = w / (2.0 * seat + 1.0)
        order = np.lexsort((src, -key))
        src, seat, key = src[order], seat[order], key[order]
        close = np.flatnonzero(np.abs(np.diff(key)) <= key[1:] * 1e-12)
        if close.size:
            self._exact_runs(src, seat, close)
        return src

    def _exact_runs(self, src: np.ndarray, seat: np.ndarray, close: np.ndarray) -> None:
        """Re-sort, exactly, each run of neighbours whose float priorities nearly tie."""
        runs: list[list[int]] = []
        for i in close.tolist():
            if runs and runs[-1][-1] == i:
                runs[-1].append(i + 1)
            else:
                runs.append([i, i + 1])
        for run in runs:
            items = [(int(src[i]), int(seat[i])) for i in run]
            ranked = sorted(
                items, key=lambda t: (Fraction(-self.weights[t[0]], 2 * t[1] + 1), t[0])
            )
            for pos, (s_, m_) in zip(run, ranked, strict=True):
                src[pos], seat[pos] = s_, m_


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_SHOWN = 400  # longer descriptions keep their start and a digest of the whole
_DIGEST_ITEMS = 100_000  # Python containers up to this size are identified by their content


def _content_digest(items: Sequence[Any]) -> str:
    """SHA-1 digest (16 hex digits) of a Python container's elements: arrays by dtype, shape
    and bytes, mappings key by key, anything else by repr."""
    h = hashlib.sha1()

    def feed(x: Any) -> None:
        if isinstance(x, np.ndarray):
            h.update(f"{x.dtype.str}{x.shape}".encode())
            h.update(np.ascontiguousarray(x).tobytes())
        elif isinstance(x, Mapping):
            for k in sorted(x, key=repr):
                h.update(repr(k).encode())
                feed(x[k])
        else:
            h.update(repr(x).encode())
        h.update(b"\x00")

    for item in items:
        feed(item)
    return h.hexdigest()[:16]


def _source_description(source: Any) -> str:
    """A source's repr when it identifies the content (grain_rox sources hold a content
    fingerprint); a digest of the elements of a Python list or tuple; else (a repr that is
    an object address, different in every process) the type and length."""
    name = type(source).__qualname__
    if isinstance(source, (list, tuple)):
        if len(source) > _DIGEST_ITEMS:
            return f"{name}(len={len(source)})"
        return f"{name}(len={len(source)}, digest={_content_digest(source)})"
    text = repr(source)
    if _ADDRESS.search(text) or text.startswith("<"):
        try:
            return f"{name}(len={len(source)})"
        except TypeError:
            return name
    return text


def _node_description(node: Any) -> str:
    source = getattr(node, "_source", None)
    if source is not None and not node.parents:
        return _source_description(source)
    if isinstance(node, (IdentifiedMapDataset, IdentifiedIterDataset)):
        return f"{node.what}(identity={facts_digest(node.identity)})"
    text = _ADDRESS.sub("", str(node))
    seed = vars(node).get("_seed")
    if seed is not None:
        text += f"[seed={seed}]"
    parents = [p for p in node.parents]
    if not parents:
        return text
    inner = ", ".join(_node_description(p) for p in parents)
    return f"{text}<-{inner}" if len(parents) == 1 else f"{text}<-[{inner}]"


def describe_dataset(ds: Any) -> str:
    """A description of a Grain dataset (its chain of operations back to its sources) or of a
    data source that is the same in every process and changes when the data or an operation
    does (sources are described by their repr, which is content-based for grain_rox's own).

    >>> import grain
    >>> describe_dataset(grain.MapDataset.range(4).shuffle(seed=3))
    'ShuffleMapDataset[seed=3]<-RangeMapDataset(start=0, stop=4, step=1)'
    """
    if isinstance(ds, (grain.MapDataset, grain.IterDataset)):
        text = _node_description(ds)
    else:
        text = _source_description(ds)
    if len(text) > _SHOWN:
        text = f"{text[: _SHOWN - 40]}...(digest={facts_digest(text)})"
    return text


def resolve_weights(
    names: Sequence[str], weights: Mapping[str, float] | None, where: str
) -> tuple[float, ...]:
    """Weights in ``names`` order; a single source needs none; unknown names are errors."""
    if weights is None:
        if len(names) == 1:
            return (1.0,)
        raise ValueError(
            f"{where} mixes {len(names)} sources {list(names)} but gives no weights; pass "
            "weights={name: weight, ...} (a missing name has weight 0)"
        )
    if not isinstance(weights, Mapping):
        raise TypeError(
            f"{where} weights={weights!r} is a {type(weights).__name__}, not a mapping; pass "
            "weights={name: weight, ...}"
        )
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise ValueError(f"{where} weights name unknown sources {unknown}; sources: {list(names)}")
    for name, w in weights.items():
        if isinstance(w, (bool, np.bool_)) or not isinstance(
            w, (int, float, np.integer, np.floating)
        ):
            raise TypeError(
                f"{where} weight of {name!r} is {w!r} ({type(w).__name__}); pass a number"
            )
    return tuple(float(weights.get(n, 0.0)) for n in names)


class _ExactSelection(grain.transforms.DatasetSelectionMap):
    """Grain selection map: element ``i`` -> (source, the source's own sample index)."""

    def __init__(self, mixture: Mixture, length: int) -> None:
        self.mixture = mixture
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[int, int]:
        before = self.mixture.counts(index)
        after = self.mixture.counts(index + 1)
        source = next(i for i, (a, b) in enumerate(zip(before, after, strict=True)) if b > a)
        return source, before[source]


class _PhasedSelection(grain.transforms.DatasetSelectionMap):
    """Phase ``p`` covers elements ``[starts[p], starts[p + 1])`` with its own mixture; each
    source's sample index continues from where the earlier phases left it."""

    def __init__(self, mixtures: Sequence[Mixture], lengths: Sequence[int]) -> None:
        self.mixtures = list(mixtures)
        self.starts = [0, *np.cumsum(lengths).tolist()]
        self.offsets = [tuple(0 for _ in mixtures[0].weights)]
        for mixture, n in zip(mixtures[:-1], lengths[:-1], strict=True):
            served = mixture.counts(n)
            self.offsets.append(tuple(a + b for a, b in zip(self.offsets[-1], served, strict=True)))

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, index: int) -> tuple[int, int]:
        # past the end (a repeated mixture) the last phase continues
        p = min(bisect.bisect_right(self.starts, index), len(self.mixtures)) - 1
        source, k = _ExactSelection(self.mixtures[p], 1 << 62)[index - self.starts[p]]
        return source, self.offsets[p][source] + k


def mix_datasets(
    datasets: Mapping[str, grain.MapDataset],
    weights: Mapping[str, float] | None = None,
    *,
    phases: Sequence[tuple[int | None, Mapping[str, float]]] | None = None,
    seed: int = 0,
    length: int | None = None,
) -> grain.MapDataset:
    """Mix Grain ``MapDataset``s with exact proportions, as a random-access ``MapDataset``.

    Element ``i`` comes from the source that the Sainte-Laguë sequence (see the module doc)
    assigns to sample ``i``; each source is shuffled with a new permutation every epoch and
    repeats, so the mixture never ends early (``length`` defaults to the largest source's
    length divided by its weight share). An endless source (``len == sys.maxsize``, Grain's
    convention, e.g. ``ds.repeat()`` or an endless :class:`~grain_rox.TokenPipeline`'s
    ``map_dataset()``) is read in its own order, and makes the default length endless too.

    A curriculum: ``phases=[(num_samples, weights), ..., (None, weights)]`` instead of
    ``weights`` changes the proportions after each phase's samples (the last phase may run to
    ``length``); every source continues where the previous phase left it, so nothing is
    replayed or skipped at a phase change. Any element is still found in O(#sources), so a
    Grain iterator over the mixture restores at once.

    >>> import grain
    >>> ds = mix_datasets({"a": grain.MapDataset.range(100), "b": grain.MapDataset.range(1000, 1010)},
    ...                   {"a": 0.75, "b": 0.25}, seed=0, length=8)
    >>> [int(x >= 1000) for x in ds]
    [0, 0, 1, 0, 0, 0, 1, 0]
    >>> phased = mix_datasets({"a": grain.MapDataset.range(100), "b": grain.MapDataset.range(1000, 1010)},
    ...                       phases=[(4, {"a": 1.0}), (None, {"b": 1.0})], length=6)
    >>> [int(x >= 1000) for x in phased]
    [0, 0, 0, 0, 1, 1]
    """
    if not isinstance(datasets, Mapping) or not datasets:
        raise TypeError(
            f"mix_datasets: datasets={datasets!r} must be a non-empty mapping "
            "{name: grain.MapDataset}"
        )
    make_grain_workers_usable()
    names = list(datasets)
    for name, ds in datasets.items():
        if not isinstance(ds, grain.MapDataset):
            raise TypeError(
                f"mix_datasets: dataset {name!r} is a {type(ds).__name__}, not a "
                "grain.MapDataset; wrap a data source as grain.MapDataset.source(source)"
            )
    seed = seed_arg(seed, where="mix_datasets")
    if length is not None:
        length = int_arg(length, "length", where="mix_datasets")
    if (weights is None) == (phases is None) and len(names) > 1:
        raise ValueError("mix_datasets: give weights= or phases=[(num_samples, weights), ...]")
    if phases is None:
        phases = [(None, weights)]  # type: ignore[list-item]
    if not phases:
        raise ValueError("phases= is empty; give at least one (num_samples, weights)")
    shares = [
        resolve_weights(names, w, f"mix_datasets phase {p}") for p, (_, w) in enumerate(phases)
    ]
    counts = [
        None if n is None else int_arg(n, f"phases[{p}] num_samples", where="mix_datasets")
        for p, (n, _) in enumerate(phases)
    ]
    if any(n is None for n in counts[:-1]):
        raise ValueError(
            f"phase lengths {counts} must be >= 1; only the last phase may be None (until length)"
        )
    fixed = sum(n for n in counts[:-1] if n is not None)
    if counts[-1] is None:
        if length is None:
            last, total = shares[-1], sum(shares[-1])
            tail = max(
                int(len(datasets[n]) * total / w) for n, w in zip(names, last, strict=True) if w
            )
            length = min(sys.maxsize, fixed + tail)  # an endless input: an endless mixture
        if length <= fixed:
            raise ValueError(f"length={length} ends before the last phase starts (sample {fixed})")
        counts[-1] = length - fixed
    elif length is not None and length != fixed + counts[-1]:
        raise ValueError(f"length={length} differs from the phases' {fixed + counts[-1]} samples")
    mixtures = [Mixture.from_weights(w) for w in shares]
    parts = [
        datasets[n]  # endless (Grain's len == sys.maxsize): taken in its own order
        if len(datasets[n]) >= sys.maxsize
        else datasets[n].shuffle(seed=derive_key(seed, i) % (1 << 31)).repeat()
        for i, n in enumerate(names)
    ]
    if len(mixtures) == 1:
        selection: grain.transforms.DatasetSelectionMap = _ExactSelection(
            mixtures[0], int(counts[0] or 0)
        )
    else:
        selection = _PhasedSelection(mixtures, [int(n) for n in counts if n is not None])
    mixed = grain.MapDataset.select_from_datasets(parts, selection)
    identity: dict[str, Any] = {f"dataset {n!r}": describe_dataset(datasets[n]) for n in names}
    identity["phases"] = [
        [n, dict(zip(names, w, strict=True))] for n, w in zip(counts, shares, strict=True)
    ]
    identity["seed"] = seed
    identity["length"] = int(sum(n for n in counts if n is not None))
    return with_identity(mixed, identity, what="mix_datasets")
