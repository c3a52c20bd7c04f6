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
# # Pipelines: mixing, curriculum phases, packing
#
# Two sources from the embedded corpus (the standard library's code and prose), mixed with
# weights that change between two phases, then packed documents. Everything here is exact and
# resumable at any step in O(1).

# %%
import os
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import grain_rox

workdir = tempfile.mkdtemp(prefix="grain_rox_pipelines_")
paths = {}
for name, limit in [("code", 60), ("prose", 300)]:
    paths[name] = os.path.join(workdir, f"{name}.rox")
    grain_rox.write_rox(
        grain_rox.builtin_documents(name, limit=limit), paths[name], tokenizer="bytes"
    )

# %% [markdown]
# ## A two-phase curriculum
# Phase 1: 40 steps of (16, 64) windows, 70% code. Phase 2: (8, 128) windows, 30% code.

# %%
phases = [
    grain_rox.Phase(steps=40, batch_size=16, seq_len=64, weights={"code": 0.7, "prose": 0.3}),
    grain_rox.Phase(steps=40, batch_size=8, seq_len=128, weights={"code": 0.3, "prose": 0.7}),
]
pipeline = grain_rox.TokenPipeline(paths, phases=phases, seed=0)
source = pipeline.batch_source()
shapes = [source[k]["inputs"].shape for k in (0, 39, 40, 79)]
print(shapes)
assert shapes == [(16, 64), (16, 64), (8, 128), (8, 128)]

# %% [markdown]
# The share of code rows per step follows the weights exactly (`round(w * n) ± 1` at every
# prefix of each phase).

# %%
code_share = [float(np.mean(source.sources_of(k) == 0)) for k in range(80)]
rows = np.concatenate([source.sources_of(k) for k in range(40)])
served = np.cumsum(rows == 0)
ideal = np.round(0.7 * np.arange(1, rows.size + 1))
assert np.abs(served - ideal).max() <= 1
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(code_share, drawstyle="steps-mid", label="code rows per step")
ax.axhline(0.7, ls=":", c="gray")
ax.axhline(0.3, ls=":", c="gray")
ax.set_xlabel("global step")
ax.set_ylabel("share of rows")
ax.legend()
fig.savefig(os.path.join(workdir, "mixture.png"))

# %% [markdown]
# ## Packing documents
# Best-fit packing of whole documents (split at EOS) keeps every document intact; the
# segment ids mark documents and padding (0).

# %%
docs = grain_rox.RoxDocumentSource(paths["prose"], seq_len=256)
efficiency = {}
for method in ("best_fit", "first_fit"):
    packed = grain_rox.pack_documents(docs, seq_len=256, batch_size=8, num_epochs=1, method=method)
    efficiency[method] = grain_rox.padding_efficiency(list(packed))
print(efficiency)
assert efficiency["best_fit"] >= efficiency["first_fit"] > 0.5
fig, ax = plt.subplots(figsize=(4, 3))
ax.bar(list(efficiency), list(efficiency.values()))
ax.set_ylim(0, 1)
ax.set_ylabel("non-padding share")
fig.savefig(os.path.join(workdir, "packing.png"))
