"""Run 6's diagnostic (issue 13's fast path): where the jitted step's time goes, on the device.

Part A, a resident ``layout="tokens"`` batch (no transfer): microseconds per call of jitted
steps that consume it, each as ``dispatch + block`` ("sync") and as dispatch alone, many calls
then one block ("pipelined"):

* ``trivial``: one element out (the sync round trip alone);
* ``inputs``: the window as int32, summed (no segment features);
* ``unpack``: ``reduce_features(pipe.unpack(b))``, as the benchmark's fast path;
* ``unpack_assoc_max``: the same with the running max as ``lax.associative_scan``;
* ``unpack_assoc_both``: the cumulative sum too;
* ``unpack_dict``: ``pipe.unpack(b)`` returned as six arrays (no reduction).

Part B, end to end at (32, 1024), interleaved rounds: the floor, the floor + the step, the fast
path with each step variant, and the fast path with ``sys.setswitchinterval(1e-4)`` (GIL hand-over
between the caller and the producer threads).

Run from the repository root: ``python3 benchmarks/results/2026-11-26-h200/run6_probe.py``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
import bench_device as bd  # noqa: E402

bd.choose_platform([])
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import grain_rox  # noqa: E402
from grain_rox._sources import _tokens_layout as tl  # noqa: E402


class _Assoc:
    """``jax.numpy`` with ``cumsum`` as an associative scan (for unpack's ``xp``)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(jnp, name)

    @staticmethod
    def cumsum(x: Any, axis: int, dtype: Any) -> Any:
        return jax.lax.associative_scan(jnp.add, x.astype(dtype), axis=axis)


def assoc_max(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return np.maximum.accumulate(x, axis=1)
    return jax.lax.associative_scan(jnp.maximum, x, axis=1)


def patch(kind: str) -> tuple[Any, Any]:
    """Put the variant's scans in place (for what is traced next); returns what to restore."""
    saved = tl._cummax, tl._jnp
    if "assoc_max" in kind or "assoc_both" in kind:
        tl._cummax = assoc_max
    if "assoc_both" in kind:
        tl._jnp = lambda: _Assoc()
    return saved


def patched(make: Any, kind: str) -> Any:
    """A contender whose iterator traces its jitted features with the variant in place."""

    def wrapped() -> bd.Feed:
        saved = patch(kind)
        feed = make()

        def close() -> None:
            feed.close()
            tl._cummax, tl._jnp = saved

        return bd.Feed(feed.next, close)

    return wrapped


def check(pipe: Any, batch: Any) -> None:
    """Every variant's features equal the NumPy unpack's (the host's)."""
    host = {
        k: np.asarray(v) for k, v in pipe.unpack({"tokens": np.asarray(batch["tokens"])}).items()
    }
    for kind in ("unpack", "unpack_assoc_max", "unpack_assoc_both"):
        saved = patch(kind)
        try:
            got = jax.jit(lambda b: pipe.unpack(b))(batch)
        finally:
            tl._cummax, tl._jnp = saved
        same = all(np.array_equal(np.asarray(got[k]), host[k]) for k in host)
        print(f"  {kind}: equal to the host's features: {same}")


def compiled(pipe: Any, kind: str, batch: Any) -> Any:
    """A jitted step of ``kind``, traced (and run once) now, with the variant's functions in
    place while it is traced."""
    if kind == "trivial":
        f = jax.jit(lambda b: b["tokens"][0, 0])
    elif kind == "inputs":
        f = jax.jit(lambda b: jnp.sum(b["tokens"][:, :-2].astype(jnp.int32)))
    elif kind.startswith("unpack_dict"):
        f = jax.jit(lambda b: pipe.unpack(b))
    else:
        f = jax.jit(lambda b: bd.reduce_features(pipe.unpack(b)))
    saved = patch(kind)
    try:
        jax.block_until_ready(f(batch))
    finally:
        tl._cummax, tl._jnp = saved
    return f


def time_step(f: Any, batch: Any, n: int) -> tuple[float, float]:
    for _ in range(20):
        jax.block_until_ready(f(batch))
    t0 = time.perf_counter()
    for _ in range(n):
        jax.block_until_ready(f(batch))
    sync = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    outs = [f(batch) for _ in range(n)]
    jax.block_until_ready(outs)
    pipelined = (time.perf_counter() - t0) / n * 1e6
    return sync, pipelined


KINDS = (
    "trivial", "inputs", "unpack", "unpack_assoc_max", "unpack_assoc_both", "unpack_dict",
    "unpack_dict_assoc_both",
)  # fmt: skip


def main() -> None:
    print("jax", jax.__version__, jax.devices(), flush=True)
    sharding = NamedSharding(Mesh(np.asarray(jax.devices()), ("data",)), PartitionSpec("data"))
    with bd.scratch_dir(None) as tmp:
        path = bd.write_corpus(20_000_000, tmp)
        steps = {}
        for batch_size, seq_len in bd.SHAPES:
            pipe = grain_rox.TokenPipeline(
                path,
                seq_len=seq_len,
                global_batch_size=batch_size,
                seed=0,
                eos_id=bd.EOS,
                layout="tokens",
            )
            with grain_rox.MultiHostDataLoadIterator(pipe, data_sharding=sharding) as it:
                batch = jax.block_until_ready(next(it))
            print(
                f"==== ({batch_size}, {seq_len}) resident batch {batch['tokens'].shape} {batch['tokens'].dtype}"
            )
            check(pipe, batch)
            fs = {k: compiled(pipe, k, batch) for k in KINDS}
            if (batch_size, seq_len) == bd.SHAPES[0]:
                steps = {k: fs[k] for k in ("unpack", "unpack_assoc_max", "unpack_assoc_both")}
                first_pipe = pipe
            table: dict[str, list[tuple[float, float]]] = {k: [] for k in KINDS}
            for _ in range(3):
                for k in KINDS:
                    table[k].append(time_step(fs[k], batch, 1000))
            for k in KINDS:
                sync = statistics.median(s for s, _ in table[k])
                pipe_us = statistics.median(p for _, p in table[k])
                print(f"  {k:20s} sync {sync:7.1f} us   pipelined {pipe_us:7.1f} us")
        # ---- part B -----------------------------------------------------------------------
        batch_size, seq_len = bd.SHAPES[0]
        with grain_rox.open_rox(path) as corpus:
            tokens = corpus.tokens(0, corpus.num_tokens)
            gather = bd.Gather(tokens, batch_size, seq_len)
            window = bd.window_step()
            makers = {
                "floor": bd.floor_maker(gather, False, sharding),
                "floor_step": bd.floor_maker(gather, False, sharding, then=window),
            }
            for k, f in steps.items():
                makers[f"fast {k}"] = bd.rox_maker(first_pipe, sharding, then=f)
            plain = bd.rox_maker(first_pipe, sharding, then=steps["unpack"])

            def switched() -> bd.Feed:
                sys.setswitchinterval(1e-4)
                feed = plain()
                close = feed.close

                def restore() -> None:
                    close()
                    sys.setswitchinterval(0.005)

                return bd.Feed(feed.next, restore)

            makers["fast unpack, switchinterval 1e-4"] = switched
            default = grain_rox.TokenPipeline(path, seq_len=seq_len, global_batch_size=batch_size,
                                              seed=0, eos_id=bd.EOS)  # fmt: skip
            makers["default (dict)"] = bd.rox_maker(default, sharding)
            makers["default (dict) assoc_both"] = patched(
                bd.rox_maker(default, sharding), "assoc_both"
            )
            makers["windows1 (no step)"] = bd.rox_maker(
                grain_rox.TokenPipeline(path, seq_len=seq_len, global_batch_size=batch_size,
                                        seed=0, eos_id=bd.EOS, layout="windows",
                                        segmentation=False), sharding)  # fmt: skip
            cfg = bd.dataclasses.replace(bd.FULL, seconds=1.0, rounds=3)
            runs = bd.measure(cfg, makers, "e2e (32, 1024)")
            floor = statistics.median(runs["floor"])
            print(f"==== end to end at ({batch_size}, {seq_len}), medians of 3, batches/s")
            for k, v in runs.items():
                m = statistics.median(v)
                print(f"  {k:40s} {m:8.0f}  {m / floor:5.2f}x floor  "
                      f"spread {100 * (max(v) - min(v)) / m:.0f}%")  # fmt: skip
            del tokens


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
