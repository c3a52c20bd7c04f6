"""Every Python example in README.md runs as written, in order, on small real data, and so does
every ``grain-rox`` command line of its shell blocks (through the installed console script)."""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).parent.parent / "README.md"
TEXT = README.read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, flags=re.DOTALL)
# Every fenced python or bash block, in document order: (language, body).
FENCED = re.findall(r"```(python|bash)\n(.*?)```", TEXT, flags=re.DOTALL)
# grain-rox lines the README shows but a test cannot run as written, by prefix, and why.
NOT_RUN = {
    "grain-rox convert corpus/ notes.jsonl": "the general form: it names the user's own files",
}
GRAIN_ROX = os.path.join(os.path.dirname(sys.executable), "grain-rox")


def grain_rox_lines(body: str) -> list[str]:
    """The lines of a bash block that call the grain-rox command line."""
    return [line.strip() for line in body.splitlines() if line.strip().startswith("grain-rox ")]


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 4


def test_readme_has_command_lines_and_each_skip_names_one():
    lines = [line for lang, body in FENCED if lang == "bash" for line in grain_rox_lines(body)]
    assert len(lines) >= 6
    for prefix in NOT_RUN:  # a stale entry would silently skip nothing
        assert sum(line.startswith(prefix) for line in lines) == 1, prefix


def test_readme_examples_run_in_order(tmp_path, monkeypatch):
    """Top to bottom in a fresh directory: the python blocks in one namespace, the grain-rox
    lines as subprocesses in the same directory, each exiting 0."""
    pytest.importorskip("tiktoken")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    ran = 0
    for index, (lang, block) in enumerate(FENCED):
        if lang == "python":
            exec(compile(block, f"README.md[block {index}]", "exec"), namespace)
            continue
        for line in grain_rox_lines(block):
            if any(line.startswith(prefix) for prefix in NOT_RUN):
                continue
            argv = shlex.split(line, comments=True)
            proc = subprocess.run(
                [GRAIN_ROX, *argv[1:]], cwd=tmp_path, capture_output=True, text=True, check=False
            )
            assert proc.returncode == 0, f"README.md: {line}\n{proc.stdout}\n{proc.stderr}"
            ran += 1
    assert ran >= 7


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
    ckpt = "ckpt"  # relative, as a user may pass it (Orbax refuses one at its first save)
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
