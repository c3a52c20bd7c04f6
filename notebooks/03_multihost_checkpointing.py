# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Global batches on a mesh, and checkpoints that restore anywhere
#
# `MultiHostDataLoadIterator` turns the pipeline's batches into global `jax.Array`s sharded
# over a mesh; each process reads only its devices' rows. Its state is the global step, so
# an Orbax checkpoint restores on any number of processes. (Real multi-process runs are in
# `tests/test_multiprocess.py`; here one process with 8 CPU devices.)

# %%
import os
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import grain_rox

workdir = tempfile.mkdtemp(prefix="grain_rox_mh_")
path = os.path.join(workdir, "data.rox")
rng = np.random.default_rng(0)
grain_rox.write_rox(
    [rng.integers(1, 5000, rng.integers(10, 300), dtype=np.uint16) for _ in range(2000)],
    path,
    separator=0,
)
pipeline = grain_rox.TokenPipeline(path, seq_len=64, global_batch_size=16, seed=0)
print(jax.device_count(), "devices")

# %% [markdown]
# ## The layout
# A 2-D mesh: the batch is split over the `data` axis and replicated over `model`.

# %%
mesh = Mesh(np.asarray(jax.devices()).reshape(4, 2), ("data", "model"))
sharding = NamedSharding(mesh, PartitionSpec("data"))
batches = grain_rox.MultiHostDataLoadIterator(pipeline, data_sharding=sharding)
batch = next(batches)
x = batch["inputs"]
print(x.shape, x.sharding.spec, sorted({s.data.shape for s in x.addressable_shards}))
print("this process reads rows", batches.local_rows)
assert x.sharding == sharding and batches.local_rows == {16: (0, 16)}

# %% [markdown]
# ## Save with the model, restore in a new iterator
# The data state goes in the same Orbax checkpoint as the model.

# %%
for _ in range(4):
    next(batches)
manager = ocp.CheckpointManager(os.path.join(workdir, "ckpt"))
params = {"w": jax.numpy.ones((4, 4))}
manager.save(
    5,
    args=ocp.args.Composite(
        model=ocp.args.StandardSave(params), data=grain_rox.RoxCheckpointSave(batches)
    ),
)
manager.wait_until_finished()
expected = [np.asarray(next(batches)["inputs"]) for _ in range(3)]

resumed = grain_rox.MultiHostDataLoadIterator(pipeline)  # another mesh: the default 1-D one
manager.restore(5, args=ocp.args.Composite(data=grain_rox.RoxCheckpointRestore(resumed)))
got = [np.asarray(next(resumed)["inputs"]) for _ in range(3)]
print("resumed at step", resumed.step - 3, "identical:", all(map(np.array_equal, got, expected)))
assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
batches.close()
resumed.close()
manager.close()
