"""Where a batch's rows live on the mesh: the default mesh, and this process's share of rows.

A batch's leading axis is split over the mesh axes of the data sharding's first entry; each
process reads and places only the rows its own devices hold, which must be one contiguous
range (``process_rows``).
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding


def default_mesh(axis: str = "data") -> Mesh:
    """A 1-D mesh over every device of every process, named ``axis``."""
    return Mesh(np.asarray(jax.devices()), (axis,))


def data_shards(sharding: NamedSharding) -> tuple[int, str]:
    """How many pieces ``sharding`` cuts a batch's rows into, and the mesh axes that do it.

    >>> from jax.sharding import PartitionSpec
    >>> mesh = Mesh(np.asarray(jax.devices()[:1]), ("data",))
    >>> data_shards(NamedSharding(mesh, PartitionSpec("data")))
    (1, "'data'")
    """
    spec = sharding.spec
    first = spec[0] if len(spec) else None
    if first is None:
        return 1, "(none: rows are not split)"
    axes = first if isinstance(first, tuple) else (first,)
    return _pieces(sharding, first), "/".join(map(repr, axes))


def refuse_unsplit_batch(named: str, size: int, sharding: NamedSharding, what: str) -> None:
    """Refuse a batch of ``size`` rows (``named`` as the user wrote it, e.g.
    ``batch_size=6``; ``what``: the argument in words) that the data sharding's pieces do
    not divide, with the nearest size that they do.

    >>> from jax.sharding import PartitionSpec
    >>> mesh = Mesh(np.asarray(jax.devices()[:1]), ("data",))
    >>> refuse_unsplit_batch("batch_size=6", 6, NamedSharding(mesh, PartitionSpec("data")), "")
    """
    shards, axes = data_shards(sharding)
    if size % shards:
        raise ValueError(
            f"{named} cannot be split evenly over the {shards} devices of the mesh's {axes} "
            f"axis: use a {what} that is a multiple of {shards} (e.g. "
            f"{-(-size // shards) * shards}), or a mesh with fewer devices on that axis"
        )


def _pieces(sharding: NamedSharding, entry: str | tuple[str, ...] | None) -> int:
    """How many pieces one entry of ``sharding``'s spec cuts its dimension into."""
    axes = () if entry is None else entry if isinstance(entry, tuple) else (entry,)
    return math.prod(sharding.mesh.shape[a] for a in axes)


def _device_rows(sharding: NamedSharding, global_batch: int) -> dict[int, list[tuple[int, int]]]:
    """Each process's devices' rows ``[start, stop)`` of a global batch under ``sharding``
    (whatever it does along the other dimensions, e.g. splits the sequence), computed alike
    in every process."""
    # each later dimension as long as the spec splits it: its pieces hold no row of their own
    shape = (global_batch, *(_pieces(sharding, entry) for entry in tuple(sharding.spec)[1:]))
    rows: dict[int, list[tuple[int, int]]] = {}
    for device, index in sharding.devices_indices_map(shape).items():
        start, stop, _ = index[0].indices(global_batch)
        process: int = device.process_index  # type: ignore[attr-defined]
        rows.setdefault(process, []).append((start, stop))
    return dict(sorted(rows.items()))


def process_rows(sharding: NamedSharding, global_batch: int) -> tuple[int, int]:
    """The contiguous rows ``[lo, hi)`` of a global batch that this process's devices hold
    (whatever ``sharding`` does along the other dimensions, e.g. splits the sequence)."""
    spans = _device_rows(sharding, global_batch)
    if jax.process_index() not in spans:
        raise ValueError(
            f"process {jax.process_index()} holds none of the mesh's devices (the mesh's "
            f"{sharding.mesh.devices.size} devices are on processes {sorted(spans)}): make the "
            "iterator only on those processes, or use a mesh over every process's devices"
        )
    mine = spans[jax.process_index()]
    lo, hi = min(a for a, _ in mine), max(b for _, b in mine)
    covered = np.zeros(global_batch, dtype=bool)
    for a, b in mine:
        covered[a:b] = True
    if not covered[lo:hi].all():
        raise ValueError(
            f"this process's devices hold non-contiguous rows of the batch under {sharding}; "
            "use a mesh whose data axis keeps each process's devices together "
            "(e.g. jax.make_mesh or mesh_utils.create_device_mesh)"
        )
    return lo, hi


def row_shares(sharding: NamedSharding, global_batch: int) -> dict[int, tuple[int, int]]:
    """Each process's rows ``[lo, hi)`` of a global batch under ``sharding`` (the span of its
    devices' rows), computed alike in every process.

    >>> from jax.sharding import PartitionSpec
    >>> mesh = Mesh(np.asarray(jax.devices()[:1]), ("data",))
    >>> row_shares(NamedSharding(mesh, PartitionSpec("data")), 8)
    {0: (0, 8)}
    """
    return {
        process: (min(a for a, _ in spans), max(b for _, b in spans))
        for process, spans in _device_rows(sharding, global_batch).items()
    }
