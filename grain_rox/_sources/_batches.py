"""Whole batches as Grain records: batch ``i`` = one vectorised read of its rows.

Grain reads one record per ``__getitem__``; for cheap memory-mapped rows, per-row Python is
what limits speed (a plain ``MapDataset.source(...).batch(32)`` pipeline is 20-100x below the
gather floor). Here a record is a whole batch: :func:`shuffled_batches` turns any source with
``get_batch(indices)`` (HF, ArrayRecord, NumPy sources) into a ``grain.MapDataset`` whose
element ``i`` is global batch ``i``, in an order that is a new seeded permutation every epoch
(a Feistel bijection: O(1) memory) and does not depend on the number of processes.

The iterator state of such a dataset names the source's content (its repr, which holds a
content fingerprint) and the order's config (batch size, seed, shuffle, epochs), so a state
restores only onto the same data in the same order; it does not name the shard, so a state
restores on any number of processes (it is a global batch index).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any, Protocol

import grain
import numpy as np

from grain_rox._format._log_once import log_once
from grain_rox._order._permutation import FeistelPermutation, derive_key, int_arg, seed_arg
from grain_rox._sources._batch_dataset import BatchDataset
from grain_rox._sources._grain_setup import make_grain_workers_usable
from grain_rox._sources._identity import with_identity


class BatchReadable(Protocol):
    """A source that reads many rows at once."""

    def __len__(self) -> int: ...

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> Any: ...


class BatchSource:
    """Batch ``i`` of ``source`` in a seeded per-epoch order (see :func:`shuffled_batches`).

    >>> import numpy as np
    >>> class Rows:
    ...     def __len__(self): return 10
    ...     def get_batch(self, idx): return np.asarray(idx)
    >>> b = BatchSource(Rows(), 4, seed=0, shuffle=False, num_epochs=1, shard=(1, 2))
    >>> len(b), b[1].tolist()
    (2, [6, 7])
    """

    def __init__(
        self,
        source: BatchReadable,
        batch_size: int,
        *,
        seed: int,
        shuffle: bool,
        num_epochs: int | None,
        shard: tuple[int, int],
    ) -> None:
        make_grain_workers_usable()  # a user's own mp_prefetch / DataLoader workers start
        batch_size = int_arg(batch_size, "batch_size", where="batches()")
        index, count = (int_arg(x, "shard", where="batches()", minimum=0) for x in shard)
        if batch_size > len(source):
            raise ValueError(
                f"batch_size={batch_size} must be between 1 and the {len(source)} rows of {source!r}"
            )
        if count < 1 or not 0 <= index < count or batch_size % count:
            raise ValueError(
                f"shard={shard} must be (index, count) with 0 <= index < count and count "
                f"dividing batch_size={batch_size}"
            )
        if num_epochs is not None:
            num_epochs = int_arg(num_epochs, "num_epochs", where="batches()", minimum=None)
        if num_epochs == -1:
            num_epochs = None  # Datarax's spelling of "endless"
        if num_epochs is not None and num_epochs < 1:
            raise ValueError(f"num_epochs={num_epochs} must be >= 1, or None / -1 for endless")
        self.source = source
        self.batch_size = int(batch_size)
        self.seed = seed_arg(seed, where="batches()")
        self.shuffle = bool(shuffle)
        self.num_epochs = num_epochs
        self.shard = (index, count)
        self.per_epoch = len(source) // self.batch_size
        _say_leftover(source, self.batch_size, self.shuffle)
        self._block = max(1, 4096 // self.batch_size)  # batches whose rows are computed at once
        self._cache: tuple[tuple[int, int], np.ndarray] | None = None
        # rows drawn here are in range: a source may read them without checking again
        self._read = getattr(source, "get_valid_batch", source.get_batch)

    def __len__(self) -> int:
        return sys.maxsize if self.num_epochs is None else self.per_epoch * self.num_epochs

    def __repr__(self) -> str:
        return (
            f"BatchSource({self.source!r}, batch_size={self.batch_size}, seed={self.seed}, "
            f"shuffle={self.shuffle}, num_epochs={self.num_epochs}, shard={self.shard})"
        )

    def rows(self, index: int) -> np.ndarray:
        """The source rows of batch ``index`` that this shard reads."""
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} is out of range for {len(self)} batches")
        epoch, within = divmod(int(index), self.per_epoch)
        block, offset = divmod(within, self._block)
        cached = self._cache  # one read: Grain may call from several threads
        if cached is None or cached[0] != (epoch, block):
            cached = ((epoch, block), self._block_rows(epoch, block))
            self._cache = cached
        part = self.batch_size // self.shard[1]
        return cached[1][offset, self.shard[0] * part : (self.shard[0] + 1) * part]

    def _block_rows(self, epoch: int, block: int) -> np.ndarray:
        """All rows of the ``_block`` batches from ``block``: the permutation is evaluated for
        many batches at once (its cost is mostly per call), sequential reads hit the cache."""
        first = block * self._block
        count = min(self._block, self.per_epoch - first)
        positions = np.arange(
            first * self.batch_size, (first + count) * self.batch_size, dtype=np.int64
        )
        if self.shuffle:
            positions = FeistelPermutation(len(self.source), key=derive_key(self.seed, epoch))(
                positions
            )
        return positions.reshape(count, self.batch_size)

    def __getitem__(self, index: int) -> Any:
        return self._read(self.rows(index))

    def _getitems(self, indices: Sequence[int]) -> list[Any]:
        return [self[i] for i in indices]

    __getitems__ = _getitems


def _say_leftover(source: Any, batch_size: int, shuffle: bool) -> None:
    """Log the rows an epoch leaves out (fewer than a batch, so every batch is whole): each
    epoch is a permutation of its own, so they are not served in that epoch; in order
    (``shuffle=False``) they are the same rows every epoch, never served, a warning."""
    left = len(source) % batch_size
    if not left:
        return
    rows = len(source)
    which = (
        f"the last {left} rows (of {rows}) are never served: with shuffle=False every epoch "
        "leaves out the same ones"
        if not shuffle
        else f"{left} of its {rows} rows, other ones each epoch, are not served in that epoch"
    )
    message = (
        f"batches(batch_size={batch_size}) of {source!r}: {which}, so that every batch is "
        f"whole ({100 * left / rows:.1f}% of an epoch); pass a batch_size that divides {rows} "
        "to serve every row"
    )
    warn = not shuffle or left > rows / 100
    log_once(logging.WARNING if warn else logging.INFO, message)


def shuffled_batches(
    source: BatchReadable,
    batch_size: int,
    *,
    seed: int = 0,
    shuffle: bool = True,
    num_epochs: int | None = 1,
    shard: tuple[int, int] = (0, 1),
) -> grain.MapDataset:
    """A ``grain.MapDataset`` whose element ``i`` is batch ``i`` of ``source``, one read each.

    Every epoch is a new seeded permutation of the rows cut into ``len(source) // batch_size``
    batches: the last ``len(source) % batch_size`` rows of an epoch's order are not served in
    that epoch (each epoch's permutation is its own; in order, ``shuffle=False``, they are the
    same rows every epoch, never served). That is logged: a warning in order, or over 1% of
    the rows. ``num_epochs=None`` (or ``-1``) repeats forever. ``shard=(index, count)`` keeps
    process ``index``'s ``batch_size // count`` rows of every batch, so the global order is
    the same on any number of processes. Iterate with
    ``.to_iter_dataset(grain.ReadOptions(num_threads=0))``: its ``get_state`` / ``set_state``
    (or Orbax through ``grain.checkpoint``) resume at the exact batch.

    The state of such an iterator is ``{"identity": {...}, "state": {"next_index": k}}``:
    ``identity`` holds ``repr(source)`` (a content fingerprint for grain_rox's sources; a
    source without its own ``__repr__`` is named by its class and length only) and
    ``batch_size``, ``seed``, ``shuffle``, ``num_epochs``; ``set_state`` refuses a state from
    other data or another order, naming what changed. The shard is not part of it: a state
    restores on any number of processes. Grain's transformations of the dataset keep it:
    ``.map``, ``.map_with_index`` and ``.filter`` (the identity does not cover your
    functions), and slicing, ``.shuffle``, ``.batch``, ``.repeat``, ``.seed`` and
    ``.random_map``, and ``.apply([...])`` (a ``FlatMapTransform`` by its class), whose
    arguments join it (``"ops"``), so a state restores only onto the same slice, seeds and
    batching; iterator datasets (after ``.to_iter_dataset(...)``) pass the state through.
    Grain's functions that join datasets (``grain.MapDataset.mix``, ``concatenate``,
    ``grain.experimental.ZipMapDataset``, ``WindowShuffleMapDataset``) make plain Grain
    datasets, whose states name no data: mix with :func:`~grain_rox.mix_datasets`, whose state
    names every input. ``grain.experimental.ElasticIterator`` keeps a state of its own
    (``{"global_next_index": ...}``), which names no data either.

    Args:
        source: A source with ``len`` and a vectorised ``get_batch(rows)`` (grain_rox's
            NumPy, HF eager, ArrayRecord and ``.rox`` token sources).
        batch_size: Rows per global batch (at most ``len(source)``).
        seed: Seeds each epoch's permutation.
        shuffle: Permute the rows (default True); False serves them in order.
        num_epochs: Passes over the rows (default 1; None or -1: forever).
        shard: ``(index, count)``: this process keeps rows ``[index * b, (index + 1) * b)``
            of every batch, ``b = batch_size // count``.

    Returns:
        A ``grain.MapDataset`` of batches (dicts or arrays, as ``get_batch`` returns them)
        whose iterator states carry the identity above.

    Raises:
        ValueError: A bad ``batch_size``, ``num_epochs`` or ``shard`` (named in the
            message); at ``set_state``, a state of other data or another order.

    >>> import numpy as np
    >>> from grain_rox import NumpySource
    >>> ds = shuffled_batches(NumpySource(np.arange(10)), 4, seed=3, num_epochs=2)
    >>> len(ds), sorted(ds[0].tolist() + ds[1].tolist()) == sorted(set(ds[0]) | set(ds[1]))
    (4, True)
    >>> it = ds.to_iter_dataset(grain.ReadOptions(num_threads=0)).__iter__()
    >>> _ = next(it)
    >>> state = it.get_state()
    >>> state["state"], state["identity"]["seed"], state["identity"]["batch_size"]
    ({'next_index': 1}, 3, 4)
    >>> other = shuffled_batches(NumpySource(np.arange(10)), 4, seed=4, num_epochs=2)
    >>> iter(other.to_iter_dataset()).set_state(state)
    Traceback (most recent call last):
    ...
    ValueError: cannot restore this NumpySource.batches() state: its data or config changed (seed: saved 3 -> now 4). Restore with the same data and config, or start a new run
    """
    batches = BatchSource(
        source, batch_size, seed=seed, shuffle=shuffle, num_epochs=num_epochs, shard=shard
    )
    return with_identity(
        BatchDataset(batches),
        batch_identity(batches),
        what=f"{type(source).__name__}.batches()",
    )


def source_identity(source: Any) -> str:
    """``repr(source)`` if its class defines one (grain_rox's sources hold a content
    fingerprint there), else its class name and length (an ``object`` repr names a memory
    address, which differs in every process)."""
    if type(source).__repr__ is object.__repr__:
        return f"{type(source).__name__}(len={len(source)})"
    return repr(source)


def batch_identity(batches: BatchSource) -> dict[str, Any]:
    """What a ``.batches()`` iterator state must match to restore: the data and the order
    (not the shard: a state is a global batch index, valid on any number of processes)."""
    return {
        "data": source_identity(batches.source),
        "batch_size": batches.batch_size,
        "seed": batches.seed,
        "shuffle": batches.shuffle,
        "num_epochs": batches.num_epochs,
    }


class BatchesMixin:
    """Gives a source with ``get_batch`` the ``batches()`` method (HF, ArrayRecord, NumPy)."""

    def batches(
        self,
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        num_epochs: int | None = 1,
        shard: tuple[int, int] = (0, 1),
    ) -> grain.MapDataset:
        """Batch ``i`` as Grain element ``i``, read in one call: see :func:`shuffled_batches`
        (a new seeded permutation every epoch, ``num_epochs=None`` or ``-1`` endless, the same
        global order on any number of processes with ``shard=(index, count)``; its iterator
        state names this source's content and the order, not the shard).

        >>> from grain_rox import NumpySource
        >>> NumpySource(np.arange(8)).batches(4, shuffle=False)[1].tolist()
        [4, 5, 6, 7]
        """
        return shuffled_batches(
            self,  # type: ignore[arg-type]
            batch_size,
            seed=seed,
            shuffle=shuffle,
            num_epochs=num_epochs,
            shard=shard,
        )
