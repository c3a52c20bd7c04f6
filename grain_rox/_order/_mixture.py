"""Exact weighted mixing: which source serves sample ``n``, in O(#sources) for any ``n``.

The first ``n`` samples of a mixture are split between sources by the Sainte-Laguë
(Webster) apportionment of ``n`` seats with the given weights: seat ``m`` of source ``i`` has
priority ``w_i / (2m + 1)`` and the seats are handed out in order of decreasing priority (ties
to the lower source index). The apportionment is house-monotone, so this is a sequence: sample
``n`` goes to the source whose count grows from ``n`` to ``n + 1`` seats. Properties:

* after ``n`` samples, source ``i`` has served ``w_i * n`` within ``1/2 + w_i (k - 2) / 2``
  samples, at every ``n``, ``k`` the sources of non-zero weight (two: within 0.5; three: 1).
  Webster's rounding puts each count within 1/2 of ``w_i * s`` for some ``s``, and ``n - s`` is
  the sum of the others' roundings, whence the bound; it is reached, e.g. weight 0.9 among
  21 sources: 9; no randomness is involved, so proportions hold on every prefix;
* the counts at any ``n`` are found directly (quota, then a few exact integer corrections),
  so reaching sample 10**12 costs what reaching sample 10 does;
* weights are quantised to integers summing to 2**30 (a relative error below 1e-9).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np

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
