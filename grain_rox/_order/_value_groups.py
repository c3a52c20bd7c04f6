"""Where each distinct value of an array of keys occurs: the orders' per-block, per-epoch and
per-round loops over a batch's samples."""

from __future__ import annotations

import numpy as np


def value_groups(keys: np.ndarray) -> list[tuple[int, slice | np.ndarray]]:
    """``(key, where it occurs)`` for each distinct key, ascending: one slice for all when the
    keys are one value (a reader's plan of consecutive samples nearly always is: ~20 us less
    than ``np.unique`` and a mask for 1,024 samples).

    >>> value_groups(np.array([4, 4])), value_groups(np.array([5, 3, 5]))
    ([(4, slice(None, None, None))], [(3, array([1])), (5, array([0, 2]))])
    """
    if not keys.size:
        return []
    lo, hi = int(keys.min()), int(keys.max())
    if lo == hi:
        return [(lo, slice(None))]
    return [(k, np.flatnonzero(keys == k)) for k in np.unique(keys).tolist()]
