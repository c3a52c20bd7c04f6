"""Every Python example in README.md runs as written, in order, on small real data."""

from __future__ import annotations

import pathlib
import re

import pytest

README = pathlib.Path(__file__).parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 4


def test_readme_examples_run_in_order(tmp_path, monkeypatch):
    pytest.importorskip("tiktoken")
    from grain_rox import write_rox
    from grain_rox._text._builtin_corpus import builtin_documents

    monkeypatch.chdir(tmp_path)
    # The data the examples name: small slices of the embedded corpus.
    write_rox(builtin_documents("code", limit=40), "data/code.rox", tokenizer="bytes")
    write_rox(builtin_documents("prose", limit=120), "data/prose.rox", tokenizer="bytes")
    namespace: dict[str, object] = {}
    for index, block in enumerate(BLOCKS):
        exec(compile(block, f"README.md[python block {index}]", "exec"), namespace)


def test_readme_swap_example_trains_checkpoints_and_resumes(tmp_path, monkeypatch):
    """The "swap your input pipeline" function, run for real: 4 steps saving every 2, then a
    second call that restores step 4 and continues with the batches an uninterrupted run gets."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from grain_rox import MultiHostDataLoadIterator, TokenPipeline, write_rox
    from grain_rox._devices._multihost import default_mesh

    block = next(b for b in BLOCKS if "def train(" in b)
    namespace: dict[str, object] = {}
    exec(compile(block, "README.md[train]", "exec"), namespace)
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    write_rox([rng.integers(1, 60000, 700_000, dtype=np.uint16)], "data/tokens.rox", separator=0)

    def train_step(state, batch):  # traced inside the README's jax.jit
        # Each step's batch checksum goes into the state, so the checkpoint carries it too.
        checksum = batch["inputs"][:, :4].astype(jnp.int32).sum()
        loss = jnp.mean(batch["inputs"].astype(jnp.float32))
        sums = state["sums"].at[state["k"]].set(checksum)
        return {"w": state["w"] + loss, "sums": sums, "k": state["k"] + 1}, loss

    mesh = default_mesh()
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    zeros = {"w": jnp.zeros(()), "sums": jnp.zeros(8, jnp.int32), "k": jnp.zeros((), jnp.int32)}
    state = jax.device_put(zeros, replicated)
    ckpt = str(tmp_path / "ckpt")
    first = namespace["train"](state, train_step, mesh, ckpt, 4, save_every=2)
    second = namespace["train"](state, train_step, mesh, ckpt, 6, save_every=2)
    pipe = TokenPipeline("data/*.rox", seq_len=1024, global_batch_size=256)
    with MultiHostDataLoadIterator(pipe) as it:
        want = [int(np.asarray(next(it)["inputs"][:, :4]).astype(np.int64).sum()) for _ in range(6)]
    assert int(first["k"]) == 4 and np.asarray(first["sums"])[:4].tolist() == want[:4]
    # restored at step 4 (model and data together), then steps 4 and 5
    assert int(second["k"]) == 6 and np.asarray(second["sums"])[:6].tolist() == want
    assert float(second["w"]) > float(first["w"]) > 0
    assert jax.tree_util.tree_structure(second) == jax.tree_util.tree_structure(state)
