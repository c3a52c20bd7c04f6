# ruff: noqa: B007, B023  (kept as it ran: each closure is called within its own iteration)
"""Run 15's probe: the GPU cost of deriving the MaxText features from a ``layout="tokens"``
batch (``pipe.unpack`` under ``jax.jit``), per variant of its two row scans (``jnp.cumsum``
for the segment ids, ``lax.cummax`` for the positions): per call on resident batches, and a
~3 ms matmul step with the derive inside it or as a separate call, against the features
already on the device. Run from the checkout's root: ``python3 <this file>``."""

import statistics
import sys
import tempfile
import time
import types

sys.path.insert(0, "benchmarks")
import bench_device as bd
import jax
import jax.numpy as jnp
import numpy as np

import grain_rox
from grain_rox._sources import _tokens_layout as TL

orig_cummax, orig_jnp = TL._cummax, TL._jnp


def cummax_assoc(x):
    return jax.lax.associative_scan(jnp.maximum, x, axis=1)


def cummax_cmp(x):  # O(L^2) fused compare-max
    L = x.shape[1]
    t = jnp.arange(L)
    tri = t[None, :] <= t[:, None]  # [t, t'] t' <= t
    return jnp.max(jnp.where(tri[None], x[:, None, :], 0), axis=2)


def cummax_blocked(x, B=32):
    R, L = x.shape
    if L % B:
        return cummax_assoc(x)
    y = x.reshape(R, L // B, B)
    inner = jax.lax.associative_scan(jnp.maximum, y, axis=2)
    tops = inner[:, :, -1]
    carry = jax.lax.associative_scan(jnp.maximum, tops, axis=1)
    carry = jnp.concatenate([jnp.zeros_like(carry[:, :1]), carry[:, :-1]], axis=1)
    return jnp.maximum(inner, carry[:, :, None]).reshape(R, L)


def cumsum_assoc(x, axis, dtype):
    return jax.lax.associative_scan(jnp.add, x.astype(dtype), axis=axis)


def cumsum_matmul(x, axis, dtype):
    L = x.shape[1]
    tri = (jnp.arange(L)[:, None] <= jnp.arange(L)[None, :]).astype(jnp.int8)
    return jax.lax.dot(x.astype(jnp.int8), tri, preferred_element_type=jnp.int32).astype(dtype)


def cumsum_f32(x, axis, dtype):
    L = x.shape[1]
    tri = (jnp.arange(L)[:, None] <= jnp.arange(L)[None, :]).astype(jnp.float32)
    return jnp.matmul(x.astype(jnp.float32), tri, precision="highest").astype(dtype)


def with_cumsum(fn):
    ns = types.SimpleNamespace(**{k: getattr(jnp, k) for k in dir(jnp) if not k.startswith("__")})
    ns.cumsum = fn
    return lambda: ns


SHAPES = (
    ((128, 1024), (32, 1024), (256, 2048)) if jax.default_backend() != "cpu" else ((128, 1024),)
)
VARIANTS = {
    "base": (orig_cummax, orig_jnp),
    "cummax_assoc": (cummax_assoc, orig_jnp),
    "cummax_blocked": (cummax_blocked, orig_jnp),
    "cummax_cmp": (cummax_cmp, orig_jnp),
    "assoc_both": (cummax_assoc, with_cumsum(cumsum_assoc)),
    "cumsum_i8mm+assoc": (cummax_assoc, with_cumsum(cumsum_matmul)),
    "cumsum_f32mm+assoc": (cummax_assoc, with_cumsum(cumsum_f32)),
}


def main():
    d = tempfile.mkdtemp()
    path = bd.write_corpus(4_000_000, d)
    print(jax.devices(), flush=True)
    for B, L in SHAPES:
        pipe = grain_rox.TokenPipeline(
            path, seq_len=L, global_batch_size=B, seed=0, eos_id=bd.EOS, layout="tokens"
        )
        [next(iter(pipe.iter_dataset()))]
        it = iter(pipe.iter_dataset())
        hosts = [next(it) for _ in range(8)]
        devs = [jax.device_put(h) for h in hosts]
        ref = None
        fns = {}
        for name, (cm, jn) in VARIANTS.items():
            TL._cummax, TL._jnp = cm, jn
            try:
                f = jax.jit(pipe.unpack)
                out = jax.block_until_ready(f(devs[0]))
            except Exception as e:
                print(f"{B}x{L} {name}: failed {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            finally:
                TL._cummax, TL._jnp = orig_cummax, orig_jnp
            if ref is None:
                ref = {k: np.asarray(v) for k, v in out.items()}
                pipe.unpack({"tokens": hosts[0]["tokens"]}) if False else None
            ok = all(np.array_equal(ref[k], np.asarray(out[k])) for k in ref)
            fns[name] = (f, ok)
        # interleaved rounds: per call time over 400 calls
        times = {k: [] for k in fns}
        for _r in range(5):
            for name, (f, ok) in fns.items():
                for dv in devs[:2]:
                    jax.block_until_ready(f(dv))
                n = 400 if jax.default_backend() != "cpu" else 20
                t0 = time.perf_counter()
                for i in range(n):
                    o = f(devs[i % 8])
                jax.block_until_ready(o)
                times[name].append((time.perf_counter() - t0) / n * 1e6)
        for name, (f, ok) in fns.items():
            print(
                f"{B}x{L} {name:22s} {statistics.median(times[name]):8.1f} us/call  same={ok}  spread {min(times[name]):.0f}-{max(times[name]):.0f}",
                flush=True,
            )
        # the step cost: a 3 ms matmul step with the derive inside vs features resident
        if (B, L) == (128, 1024):
            dim, iters = (1024, 120) if jax.default_backend() != "cpu" else (64, 2)
            x = jnp.ones((dim, dim), jnp.float32)
            w = jnp.eye(dim, dtype=jnp.float32) * 0.5
            res = jax.block_until_ready(fns["base"][0](devs[0]))

            def mk(unpack):
                @jax.jit
                def step(x, w, b):
                    feats = unpack(b) if unpack else b
                    x = x + bd.reduce_features(feats).astype(jnp.float32) * 1e-12
                    return jax.lax.fori_loop(0, iters, lambda _, x: jnp.tanh(x @ w), x)

                return step

            steps = {"resident": (mk(None), lambda i: res)}
            for name in ("base", "cummax_assoc", "cummax_blocked", "assoc_both"):
                if name not in fns:
                    continue
                cm, jn = VARIANTS[name]
                TL._cummax, TL._jnp = cm, jn
                s = mk(pipe.unpack)
                jax.block_until_ready(s(x, w, devs[0]))
                TL._cummax, TL._jnp = orig_cummax, orig_jnp
                steps["in-step " + name] = (s, lambda i: devs[i % 8])
                f = fns[name][0]
                steps["separate " + name] = (mk(None), lambda i, f=f: f(devs[i % 8]))
            st = {k: [] for k in steps}
            for s, g in steps.values():
                jax.block_until_ready(s(x, w, g(0)))
            for _r in range(5):
                for k, (s, g) in steps.items():
                    y = x
                    t0 = time.perf_counter()
                    for i in range(100):
                        y = s(y, w, g(i))
                    y.block_until_ready()
                    st[k].append((time.perf_counter() - t0) / 100 * 1e3)
            base = statistics.median(st["resident"])
            for k, v in st.items():
                m = statistics.median(v)
                print(f"step {k:28s} {m:.3f} ms  {100 * (m / base - 1):+.1f}%", flush=True)


main()
