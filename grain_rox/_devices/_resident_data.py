"""A source's rows placed on the devices once, and the compiled gather of batches from them.

:class:`ResidentRows` reads every row of a fixed-shape source (``get_batch`` in chunks, in
JAX's dtypes), checks the size against a per-device budget and places it:

* ``"replicated"`` when all rows fit on one device: every device holds every row, and a
  device gathers its own rows of a batch locally (the compiled function has no collective);
* ``"sharded"`` when only a ``1/D`` share fits (``D`` = devices on the mesh's data axis):
  rows are split over the data axis, each device gathers the batch rows it holds and one
  ``psum_scatter`` (over the rows' bits: exact for every dtype) hands each device its rows;
* neither: a ``ValueError`` naming the sizes, the budget and the fixes.

Indices arrive from the host ``block`` batches at a time (``block x batch_size`` int32s) and
one compiled call returns ``block`` batches: on CPU a call's fixed cost, not the gather,
limits the rate (measured 1.2k batches/s a call vs 3.4k with 16 a call on 8 CPU devices).

>>> import jax, numpy as np
>>> from jax.sharding import Mesh, NamedSharding, PartitionSpec
>>> from grain_rox import NumpySource
>>> mesh = Mesh(np.asarray(jax.devices()[:1]), ("data",))
>>> rows = ResidentRows(NumpySource(np.arange(20).reshape(10, 2)),
...                     NamedSharding(mesh, PartitionSpec("data")), batch_size=2)
>>> rows.layout, [b.tolist() for b in rows.gather(np.array([[9, 0], [1, 2]]))]
('replicated', [[[18, 19], [0, 1]], [[2, 3], [4, 5]]])
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from grain_rox._devices._narrowing import refuse_narrowing
from grain_rox._devices._placement import data_shards, process_rows

CHUNK_BYTES = 64 << 20  # rows read from the source per get_batch call when loading
BUDGET_SHARE = 0.25  # default budget: this share of a device's free memory
BLOCK = 16  # batches gathered per compiled call
_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def mib(n: float) -> str:
    """A size in MiB, or in bytes below 0.1 MiB (where one decimal of MiB shows 0.0).

    >>> mib(3 * 2**20), mib(1080)
    ('3.0 MiB', '1,080 bytes')
    """
    return f"{n / 2**20:,.1f} MiB" if n >= 0.1 * 2**20 else f"{int(n):,} bytes"


def default_budget(devices: list[Any]) -> int:
    """Bytes of rows a device may hold by default: a quarter of the smallest free memory an
    accelerator reports; CPU devices (no memory stats) share the host's RAM, a quarter of
    which is split among this process's devices."""
    free = []
    for device in devices:
        try:
            stats = device.memory_stats()
        except Exception:  # a backend without memory stats
            stats = None
        if not stats or not stats.get("bytes_limit"):
            break
        free.append(int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)))
    else:
        if free:
            return int(min(free) * BUDGET_SHARE)
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(ram * BUDGET_SHARE / max(1, len(jax.local_devices())))


def choose_layout(rows: int, row_bytes: int, shards: int, axes: str, budget: int) -> str:
    """``"replicated"`` if all rows fit the per-device ``budget``, ``"sharded"`` if their
    ``1/shards`` share does, else a ValueError naming the sizes and the fixes.

    >>> choose_layout(60_000, 788, 8, "'data'", 10 << 20)
    'sharded'
    >>> choose_layout(60_000, 788, 8, "'data'", 1 << 20)
    Traceback (most recent call last):
    ...
    ValueError: placement='device': the rows do not fit on the devices: 60,000 rows x 788 bytes = 45.1 MiB, i.e. 45.1 MiB per device replicated, or 5.6 MiB per device sharded over the 8 devices of the mesh's 'data' axis, but the budget is 1.0 MiB per device (device_memory_budget=1048576). Use placement='host' (or 'auto', which falls back to it), pass a larger device_memory_budget=, or put more devices on the data axis
    """
    total = rows * row_bytes
    if total <= budget:
        return "replicated"
    share = math.ceil(rows / shards) * row_bytes
    if shards > 1 and share <= budget:
        return "sharded"
    raise ValueError(
        f"placement='device': the rows do not fit on the devices: {rows:,} rows x {row_bytes:,} "
        f"bytes = {mib(total)}, i.e. {mib(total)} per device replicated, or {mib(share)} per "
        f"device sharded over the {shards} devices of the mesh's {axes} axis, but the budget "
        f"is {mib(budget)} per device (device_memory_budget={budget}). Use placement='host' "
        "(or 'auto', which falls back to it), pass a larger device_memory_budget=, or put "
        "more devices on the data axis"
    )


def _leaves(tree: Any, where: str) -> tuple[list[np.ndarray], Any, list[str]]:
    """The arrays of a batch, its structure and each leaf's name; anything that is not a
    numeric array (text, objects) is refused, naming it."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    names = [jax.tree_util.keystr(path) or "the rows" for path, _ in flat]
    arrays = []
    for name, (_, leaf) in zip(names, flat, strict=True):
        array = np.asarray(leaf)
        # ml_dtypes' floats (bfloat16, float8_*) are numpy kind "V": held as their bits too
        numeric = array.dtype.kind in "biuf" or jnp.issubdtype(array.dtype, jnp.floating)
        if not numeric or array.ndim == 0:
            raise ValueError(
                f"placement='device' holds fixed-shape numeric rows, but {where}'s {name} is "
                f"{array.dtype} {array.shape}: tokenize text (HFEagerSource(tokenize=[...])), "
                "leave the column out (include_keys=/exclude_keys=), or use placement='host'"
            )
        arrays.append(array)
    return arrays, treedef, names


class ResidentRows:
    """Every row of ``source`` on the devices of ``sharding``'s mesh (see the module doc).

    Args:
      source: a source with ``len`` and ``get_batch(indices)`` returning fixed-shape arrays
        (an array, or a dict of them).
      sharding: how a batch lies on the mesh (its first entry names the data axis).
      batch_size: rows of a global batch (a multiple of the data axis's devices).
      budget: bytes a device may hold (None: :func:`default_budget`).
    """

    def __init__(
        self, source: Any, sharding: NamedSharding, *, batch_size: int, budget: int | None = None
    ) -> None:
        self.sharding = sharding
        self.batch_size = int(batch_size)
        self.rows = len(source)
        mesh = sharding.mesh
        shards, axes = data_shards(sharding)
        spec = tuple(sharding.spec)
        self.axes: Any = spec[0] if spec else None
        first, self.treedef, self.names = _leaves(source.get_batch(np.arange(1)), repr(source))
        self.dtypes = [jax.dtypes.canonicalize_dtype(a.dtype) for a in first]
        self.shapes = [a.shape[1:] for a in first]
        self.row_bytes = sum(
            math.prod(s) * d.itemsize for s, d in zip(self.shapes, self.dtypes, strict=True)
        )
        devices = list(mesh.local_devices)
        self.budget = default_budget(devices) if budget is None else int(budget)
        self.layout = choose_layout(self.rows, self.row_bytes, shards, axes, self.budget)
        self.on_cpu = any(d.platform == "cpu" for d in devices)
        if self.layout == "replicated":
            held, lo, hi = NamedSharding(mesh, PartitionSpec()), 0, self.rows
            self.index_sharding = NamedSharding(mesh, PartitionSpec(None, self.axes))
            padded = self.rows
        else:
            padded = math.ceil(self.rows / shards) * shards
            held = NamedSharding(mesh, PartitionSpec(self.axes))
            lo, hi = process_rows(held, padded)
            self.index_sharding = NamedSharding(mesh, PartitionSpec())
        self.index_rows = process_rows(sharding, self.batch_size)  # this process's batch rows
        local = self._load(source, lo, min(hi, self.rows), hi - lo)
        self.data = [
            jax.make_array_from_process_local_data(held, a, (padded, *a.shape[1:])) for a in local
        ]
        del local
        self._gather = self._compile(shards, padded)
        self._last: Any = None  # the previous block (CPU collectives: one call in flight)

    def _load(self, source: Any, lo: int, hi: int, count: int) -> list[np.ndarray]:
        """Rows ``[lo, hi)`` of ``source`` in JAX's dtypes, zero-padded to ``count`` rows,
        read ``CHUNK_BYTES`` at a time."""
        out = [np.zeros((count, *s), d) for s, d in zip(self.shapes, self.dtypes, strict=True)]
        step = max(1, CHUNK_BYTES // max(1, self.row_bytes))
        for a in range(lo, hi, step):
            b = min(hi, a + step)
            arrays, treedef, _ = _leaves(source.get_batch(np.arange(a, b)), repr(source))
            if treedef != self.treedef:
                raise ValueError(
                    f"rows {a}..{b - 1} of {source!r} are {treedef}, not {self.treedef}"
                )
            # where: worded only for an error, as on the host path
            where = functools.partial(_rows_of, a, b, source)
            refuse_narrowing(arrays, where=where, names=self.names)
            for name, dest, got in zip(self.names, out, arrays, strict=True):
                if got.shape[1:] != dest.shape[1:]:
                    raise ValueError(
                        f"placement='device' holds fixed-shape rows, but {name} of rows "
                        f"{a}..{b - 1} of {source!r} has shape {got.shape[1:]}, not "
                        f"{dest.shape[1:]} (row 0's); use placement='host'"
                    )
                if jax.dtypes.canonicalize_dtype(got.dtype) != dest.dtype:  # a cast would
                    raise ValueError(  # drop fractions or wrap values without a word
                        f"placement='device' holds rows of one dtype, but {name} of rows "
                        f"{a}..{b - 1} of {source!r} is {got.dtype}, not {dest.dtype} (row "
                        "0's, as JAX places it); make get_batch return one dtype for every "
                        "row, or use placement='host'"
                    )
                dest[a - lo : b - lo] = got  # (the cast JAX makes on device_put)
        return out

    def _compile(self, shards: int, padded: int) -> Any:
        treedef, sharding = self.treedef, self.sharding

        def split(arrays: Any, k: int) -> Any:
            return jax.tree_util.tree_unflatten(treedef, [a[k] for a in arrays])

        if self.layout == "replicated":

            def gather(data: list[jax.Array], idx: jax.Array) -> tuple[Any, ...]:
                taken = [a.at[idx].get(mode="promise_in_bounds") for a in data]
                return tuple(split(taken, k) for k in range(idx.shape[0]))

            return jax.jit(gather, out_shardings=sharding)

        axes, per_shard = self.axes, padded // shards

        def local(data: list[jax.Array], idx: jax.Array) -> list[jax.Array]:
            at = idx - jax.lax.axis_index(axes) * per_shard
            held = (at >= 0) & (at < per_shard)
            at = jnp.where(held, at, 0)
            out = []
            for a in data:
                rows = a.at[at].get(mode="promise_in_bounds")  # (block, batch, ...)
                bits = rows.astype(jnp.uint8) if a.dtype == jnp.bool_ else rows
                if bits.dtype.kind != "u":
                    bits = jax.lax.bitcast_convert_type(bits, _UNSIGNED[a.dtype.itemsize])
                mask = held.reshape(held.shape + (1,) * (bits.ndim - 2))
                bits = jax.lax.psum_scatter(
                    jnp.where(mask, bits, 0), axes, scatter_dimension=1, tiled=True
                )
                if a.dtype == jnp.bool_:
                    out.append(bits != 0)
                elif a.dtype.kind != "u":
                    out.append(jax.lax.bitcast_convert_type(bits, a.dtype))
                else:
                    out.append(bits)
            return out

        mapped = jax.shard_map(
            local,
            mesh=sharding.mesh,
            in_specs=(PartitionSpec(axes), PartitionSpec()),
            out_specs=PartitionSpec(None, axes),
        )

        def gather_sharded(data: list[jax.Array], idx: jax.Array) -> tuple[Any, ...]:
            taken = mapped(data, idx)
            return tuple(split(taken, k) for k in range(idx.shape[0]))

        return jax.jit(gather_sharded, out_shardings=sharding)

    def gather(self, indices: np.ndarray) -> tuple[Any, ...]:
        """The batches of rows ``indices`` (``(block, batch_size)`` global row numbers, the
        same in every process), as global arrays laid out like ``sharding``."""
        idx = np.asarray(indices, dtype=np.int32)
        if jax.process_count() == 1:
            placed = jax.device_put(idx, self.index_sharding)
        else:
            local = idx if self.layout == "sharded" else idx[:, slice(*self.index_rows)]
            placed = jax.make_array_from_process_local_data(self.index_sharding, local, idx.shape)
        if self.layout == "sharded" and self.on_cpu and self._last is not None:
            # XLA's CPU collectives deadlock when several calls with one are in flight at once
            # (each device's part waits in a shared thread pool): one at a time there.
            jax.block_until_ready(self._last)
        out = self._gather(self.data, placed)
        if self.layout == "sharded":
            self._last = out
        return out

    def device_bytes(self) -> int:
        """Bytes of rows one device holds."""
        held = (
            self.rows
            if self.layout == "replicated"
            else self.data[0].addressable_shards[0].data.shape[0]
        )
        return int(held * self.row_bytes)


def _rows_of(a: int, b: int, source: Any) -> str:
    """Rows ``a`` to ``b - 1`` of ``source``, as an error names them."""
    return f"rows {a}..{b - 1} of {source!r}"
