"""What the processes check together when an iterator is made: a few integers from each,
gathered in one small collective over every device.

JAX's ``multihost_utils.process_allgather`` lays the devices out as (processes, devices per
process), so it fails (``cannot reshape array of size 4 into shape (2,3)``) where processes
hold different numbers of devices; :func:`gather_ints` gives each device its process's row
instead, and works on any layout.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def gather_ints(values: Sequence[int]) -> np.ndarray:
    """Every process's ``values`` (int32 each; the same count in every process) as a
    ``(process_count, len(values))`` array, row ``p`` from process ``p``. Every process must
    call it (a collective).

    >>> gather_ints([3, 4]).tolist()  # one process
    [[3, 4]]
    """
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    me = jax.process_index()
    row = np.asarray([me, *values], dtype=np.int32)[None, :]
    mesh = Mesh(np.asarray(devices), ("all",))
    sharding = NamedSharding(mesh, PartitionSpec("all"))
    local = [jax.device_put(row, d) for d in devices if d.process_index == me]
    spread = jax.make_array_from_single_device_arrays((len(devices), row.shape[1]), sharding, local)
    whole = jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, PartitionSpec()))(spread)
    rows = np.asarray(whole.addressable_data(0))
    out = np.zeros((jax.process_count(), len(values)), dtype=np.int32)
    for r in rows:  # (a process's row once per device it holds)
        out[int(r[0])] = r[1:]
    return out


def digest_ints(value: Any) -> list[int]:
    """Two int32s from a sha256 of ``value`` (JSON), to compare across processes.

    >>> digest_ints({"a": 1}) == digest_ints({"a": 1}) != digest_ints({"a": 2})
    True
    """
    digest = hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).digest()
    return [int.from_bytes(digest[i : i + 4], "little") & 0x7FFFFFFF for i in (0, 4)]
