"""Smoke test of an installed grain_rox wheel, run outside the checkout by ``nox -s build``.

``python -I tests/smoke/wheel_smoke.py`` with the wheel's virtualenv's Python, from a scratch
directory: checks that ``grain_rox`` comes from that virtualenv (not the source tree), then
the CLI (``--help``, ``convert --builtin prose``, ``inspect``, ``verify``) and a short
``TokenPipeline`` -> ``MultiHostDataLoadIterator`` run with a ``get_state``/``set_state`` resume.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path


def cli(*args: str) -> str:
    """Run the installed ``grain-rox`` console script; its stdout (stops on failure)."""
    exe = Path(sys.executable).parent / "grain-rox"
    print("$ grain-rox", " ".join(args), flush=True)
    out = subprocess.run([str(exe), *args], check=True, capture_output=True, text=True).stdout
    print(out[:600])
    return out


def main() -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["GRAIN_ROX_CACHE_DIR"] = tempfile.mkdtemp(prefix="grain_rox_cache_")
    import grain_rox

    where = Path(grain_rox.__file__).resolve()
    assert where.is_relative_to(Path(sys.prefix).resolve()), f"{where} not under {sys.prefix}"
    print(f"grain_rox from {where}")

    assert "convert" in cli("--help")
    shard = str(Path.cwd() / "prose.rox")
    cli("convert", "--builtin", "prose", "-o", shard, "--tokenizer", "bytes", "--limit", "300")
    cli("inspect", shard)
    cli("verify", shard)

    import jax
    import numpy as np

    size = 2 * jax.device_count()  # whatever XLA_FLAGS says: a batch that splits evenly

    def batches() -> grain_rox.MultiHostDataLoadIterator:
        pipeline = grain_rox.TokenPipeline(shard, seq_len=64, global_batch_size=size, seed=0)
        return grain_rox.MultiHostDataLoadIterator(pipeline)

    it = batches()
    for _ in range(3):
        batch = next(it)
        assert batch["inputs"].shape == batch["targets"].shape == (size, 64), batch["inputs"].shape
    state = it.get_state()
    expected = {k: np.asarray(v) for k, v in next(it).items()}
    resumed = batches()
    resumed.set_state(state)
    got = {k: np.asarray(v) for k, v in next(resumed).items()}
    assert got.keys() == expected.keys(), (got.keys(), expected.keys())
    assert all(np.array_equal(got[k], expected[k]) for k in got), "resumed batch differs"
    print(
        f"pipeline OK on {jax.device_count()} device(s): features {sorted(got)}, resume after {it.step - 1} batches bit-exact"
    )


if __name__ == "__main__":
    main()
