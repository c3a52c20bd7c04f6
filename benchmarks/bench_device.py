"""Device benchmark (issue 13): token batches from disk to the accelerator, side by side.

Run by ``nox -s bench`` as ``python benchmarks/bench_device.py [--quick]``. Every contender
ends each batch as device arrays (``jax.block_until_ready``), on the same corpus, in this one
process; the runs are interleaved (A, B, C, A, B, C, ...) and the table shows medians of at
least 3 runs, as batches/s and as a ratio to the one-transfer floor. Each run times about
``--seconds`` of batches (the count is fixed per contender by a short untimed probe) after 2
untimed batches; making the iterator is not timed. The tables are printed at the end (markdown)
and written as JSON to ``bench_out/device.json``.

Contenders, at ``(32, 1024)`` and ``(256, 2048)`` batches:

1. the one-transfer floor: ``B`` uniformly random ``L + 1``-token windows copied row by row
   (contiguous slices, no fancy indexing) from the corpus' memory map into one int32 array,
   then one ``jax.device_put``, in a background thread with a queue of 2;
2. the six-transfer floor: the same gather, then the six MaxText arrays ``device_put``
   together (segment ids computed, positions a fixed ``arange``: a floor, not the features);
3. grain_rox's default, ``MultiHostDataLoadIterator(TokenPipeline(path, seq_len=L,
   global_batch_size=B, seed=0))``, and with ``features_on_device=False`` where it exists;
4. ``layout="windows"``, with and without ``segmentation``; packed rows
   (``packing="best_fit"``), features derived on the device and on the host;
5. the fast path: ``layout="tokens"`` through the iterator, each batch consumed by a jitted
   step that calls ``pipe.unpack(batch)`` and reduces every feature (where it exists), and the
   floor's batches consumed by the same kind of step (``floor_step``: what the step itself
   costs when the caller blocks on it every batch);
6. ``roxxel.stream`` (one ``(B, L)`` array), epochs chained, when roxxel is installed;
7. the default, the one-array windows and the fast path again with reading and placing in one
   thread (the iterator's default on CPU devices), against its default on accelerators: one
   thread reads the next batch while another places the last.

Then the train-step stall: a jitted step of about 3 ms and 7 ms (a matmul loop sized at start-up
on the device; it consumes the batch) with a batch already on the device vs fed by grain_rox's
default and by the fast path (each also in one thread), as the step time's increase; and worker
scaling: the default with ``worker_count=0`` vs ``4`` (a TokenPipeline is read in process either
way), and heavy host work (32 stdlib sources a batch tokenized with cl100k_base in a Grain
``map``) in process vs 8 Grain workers (``mp_prefetch``; at most one per CPU).

JAX picks the platform: ``JAX_PLATFORMS=cpu`` and the fake-device flag that ``nox -s bench``
sets for the CPU benchmarks are dropped (``--platform cpu`` forces the CPU). Without an
accelerator the script prints one line and exits 0, unless ``--allow-cpu``: then it runs on one
CPU device and shows ratios only. The corpus (random uint16 documents, EOS 0) is written to a
temporary directory that is removed at the end; nothing is downloaded.
"""
# ruff: noqa: E402  (the platform must be chosen before JAX is imported)

from __future__ import annotations

import argparse
import os
import re
import sys


def choose_platform(argv: list[str]) -> None:
    """Let JAX find the accelerator (``--platform auto``) or force the CPU (``cpu``); one
    device either way."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--platform", choices=("auto", "cpu"), default="auto")
    platform = early.parse_known_args(argv)[0].platform
    if platform == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"
    elif os.environ.get("JAX_PLATFORMS") == "cpu":
        del os.environ["JAX_PLATFORMS"]
    xla = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = re.sub(r"--xla_force_host_platform_device_count=\S*", "", xla).strip()


if __name__ == "__main__":  # not in Grain's worker processes, which inherit the parent's choice
    choose_platform(sys.argv[1:])

import dataclasses
import inspect
import json
import queue
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import grain_rox

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for _harness, however this is run
from _harness import (
    Row,
    Target,
    arg_parser,
    import_roxxel,
    interleave,
    log,
    machine,
    quiet,
    ratio_at_least,
    scratch_dir,
    warm_up,
)

VOCAB = 50257  # GPT-2's: stored as uint16
EOS = 0
MEAN_DOC_TOKENS = 1500
SHAPES = ((32, 1024), (256, 2048))
_ONLY_CONTENDERS: set[str] | None = None  # --contenders: the throughput rows to run (None: all)
STEP_MS = (3.0, 7.0)
WORKERS = 4


@dataclasses.dataclass(frozen=True)
class Config:
    quick: bool
    corpus_tokens: int
    rounds: int
    seconds: float  # each timed run lasts about this long
    max_batches: int  # per timed run
    stall_shape: tuple[int, int]
    stall_steps: int  # timed steps per stall run
    stall_ways: tuple[str, ...] = ("fed", "one", "put")  # how the fed runs place a batch
    # ("host" also: the default's features on the host, then device_put)
    stall_ms: tuple[float, ...] = STEP_MS  # the step times the stall is measured at
    # the step's matmul size on an accelerator (128 on a CPU): 4096 keeps a ~3 ms step on the
    # device (8 iterations); 1024 makes it ~180 iterations of ~24 us, each driven by the host,
    # a step as host-bound as the loader beside it (H200 runs 18-19: +-40% resident alone)
    stall_dim: int = 4096
    # the step's matmuls as one straight-line program (no while loop, whose every iteration
    # an accelerator's host thread may drive), as a transformer step without a layer scan
    stall_unroll: bool = False


FULL = Config(False, 50_000_000, 3, 1.5, 5000, (128, 1024), 100)
QUICK = dataclasses.replace(FULL, quick=True, corpus_tokens=3_000_000, seconds=0.3, stall_steps=20)


# ---- the corpus and the floors ------------------------------------------------------------------
def write_corpus(tokens: int, directory: str) -> str:
    """``tokens`` random ids in [1, VOCAB) as documents of geometric lengths, each followed by
    EOS, in one shard (so the floor reads one memory map)."""
    rng = np.random.default_rng(0)

    def documents() -> Any:
        left = tokens
        while left > 0:
            n = min(left, int(rng.geometric(1 / MEAN_DOC_TOKENS)))
            yield rng.integers(1, VOCAB, n, dtype=np.uint16)
            left -= n + 1

    path = os.path.join(directory, "corpus.rox")
    grain_rox.write_rox(documents(), path, separator=EOS)
    return path


class Gather:
    """The floors' host work: random ``(B, L + 1)`` windows, row by row, as int32."""

    def __init__(self, tokens: np.ndarray, batch: int, seq_len: int) -> None:
        self.tokens, self.batch, self.width = tokens, batch, seq_len + 1
        self.rng = np.random.default_rng(0)
        # the six-transfer floor's positions: the right shape, not the features (a floor)
        self.positions = np.tile(np.arange(seq_len, dtype=np.int32), (batch, 1))

    def windows(self) -> np.ndarray:
        out = np.empty((self.batch, self.width), np.int32)
        starts = self.rng.integers(0, len(self.tokens) - self.width, self.batch)
        for row, s in enumerate(starts.tolist()):
            out[row] = self.tokens[s : s + self.width]  # a contiguous copy, uint16 -> int32
        return out

    def six(self) -> list[np.ndarray]:
        w = self.windows()
        seg = np.cumsum(w[:, :-1] == EOS, axis=1, dtype=np.int32) + 1
        pos = self.positions
        return [np.ascontiguousarray(w[:, :-1]), np.ascontiguousarray(w[:, 1:]), seg, pos, seg, pos]


class Prefetcher:
    """``make()`` in a background thread, up to ``depth`` results ahead; an error there is
    raised by ``next``."""

    def __init__(self, make: Callable[[], Any], depth: int = 2) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(make,), daemon=True)
        self._thread.start()

    def _run(self, make: Callable[[], Any]) -> None:
        while not self._stop.is_set():
            try:
                item = make()
            except Exception as e:  # handed to the consumer
                item = e
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.05)
                    break
                except queue.Full:
                    pass

    def next(self) -> Any:
        item = self._queue.get()
        if isinstance(item, Exception):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


# ---- the contenders ----------------------------------------------------------------------------
@dataclasses.dataclass
class Feed:
    """One contender's open iterator: ``next()`` gives a batch (or a step's result) to block on."""

    next: Callable[[], Any]
    close: Callable[[], None]


Maker = Callable[[], Feed]


def floor_maker(
    gather: Gather, six: bool, sharding: NamedSharding, then: Callable[[Any], Any] | None = None
) -> Maker:
    """The floor's batches (one array, or the six MaxText arrays); each through ``then`` if
    given, in the caller's thread."""

    def make() -> Feed:
        host = gather.six if six else gather.windows
        p = Prefetcher(lambda: jax.device_put(host(), sharding))
        return Feed(p.next if then is None else lambda: then(p.next()), p.close)

    return make


def window_step() -> Callable[[Any], Any]:
    """The fast path's jitted step for the floor's int32 windows: the MaxText features from
    EOS alone (a window with no join columns), every one reduced."""
    from grain_rox._sources._tokens_layout import TokensLayout

    layout = TokensLayout(join_columns=0, eos_id=EOS, eos_column=False, dtype=np.dtype("int32"))
    return jax.jit(lambda w: reduce_features(layout.unpack(w, out_dtype=np.int32)))


def rox_maker(
    pipe: grain_rox.TokenPipeline,
    sharding: NamedSharding,
    then: Callable[[Any], Any] | None = None,
    **kwargs: Any,
) -> Maker:
    """``MultiHostDataLoadIterator(pipe, **kwargs)``; each batch through ``then`` if given."""

    split = kwargs.pop("split_producer", None)
    by_call = kwargs.pop("place_by_call", None)

    def make() -> Feed:
        it = grain_rox.MultiHostDataLoadIterator(pipe, data_sharding=sharding, **kwargs)
        if split is not None and hasattr(it, "_split_producer"):
            it._split_producer = split  # reading and placing in one thread or two
        if by_call is not None and hasattr(it, "_place_by_call"):
            it._place_by_call = by_call  # placed by a jitted call or by jax.device_put
        if then is None:
            return Feed(lambda: next(it), it.close)
        return Feed(lambda: then(next(it)), it.close)

    return make


def roxxel_maker(
    roxxel: Any, path: str, batch: int, seq_len: int, sharding: NamedSharding
) -> Maker:
    def make() -> Feed:
        with quiet():
            db = roxxel.Roxxel(path)
            db.open()

        def batches() -> Any:  # a stream is one epoch: chain epochs, a new seed each
            seed = 0
            while True:
                with quiet():
                    stream = db.stream(seq_len, batch, seed, mesh=sharding.mesh,
                                       data_sharding=sharding, prefetch_size=4)  # fmt: skip
                try:
                    yield from stream
                finally:
                    stream.close()
                seed += 1

        it = batches()

        def close() -> None:
            it.close()
            db.close()

        return Feed(lambda: next(it), close)

    return make


def reduce_features(f: Mapping[str, Any]) -> Any:
    """Every feature consumed (so none is optimized away): a jitted trainer's stand-in."""
    total = jnp.sum(f["inputs"] * f.get("inputs_segmentation", 1))
    return total + sum(jnp.sum(v) for k, v in f.items() if k != "inputs")


def optional_pipelines(path: str, batch: int, seq_len: int) -> dict[str, Any]:
    """The contenders that exist only in newer grain_rox: a pipeline/flag, or why not."""
    out: dict[str, Any] = {}
    params = inspect.signature(grain_rox.MultiHostDataLoadIterator).parameters
    out["host_features"] = (
        "features_on_device" in params
        or "MultiHostDataLoadIterator has no features_on_device= in this grain_rox"
    )
    try:
        tokens = grain_rox.TokenPipeline(
            path, seq_len=seq_len, global_batch_size=batch, seed=0, eos_id=EOS, layout="tokens"
        )
        out["tokens"] = tokens if hasattr(tokens, "unpack") else "TokenPipeline has no unpack()"
    except (ValueError, TypeError) as e:
        out["tokens"] = f"TokenPipeline(layout='tokens') is refused: {e}"
    try:
        packed = grain_rox.TokenPipeline(
            path, seq_len=seq_len, global_batch_size=batch, seed=0, eos_id=EOS,
            packing="best_fit", layout="tokens",
        )  # fmt: skip
        out["packed"] = packed.with_layout("maxtext")
    except (ValueError, TypeError) as e:
        out["packed"] = f"packed rows cannot travel as one array in this grain_rox: {e}"
    return out


def timed(make: Maker, n: int, warm: int = 2) -> float:
    """Batches per second of ``n`` batches after ``warm`` untimed ones."""
    feed = make()
    try:
        for _ in range(warm):
            jax.block_until_ready(feed.next())
        t0 = time.perf_counter()
        for _ in range(n):
            jax.block_until_ready(feed.next())
        return n / (time.perf_counter() - t0)
    finally:
        feed.close()


def measure(cfg: Config, makers: Mapping[str, Maker], what: str) -> dict[str, list[float]]:
    """Probe each contender (untimed; compiles, warms the page cache), then ``cfg.rounds``
    interleaved runs of about ``cfg.seconds`` each."""
    counts = {}
    for name, make in makers.items():
        probe = timed(make, 5)
        counts[name] = max(5, min(cfg.max_batches, int(probe * cfg.seconds)))
        log(f"{what}: probe {name}: {probe:.0f} batches/s -> {counts[name]} per run")

    def run(make: Maker, n: int) -> Callable[[], dict[str, float]]:
        return lambda: {"bps": timed(make, n)}

    runs = interleave(cfg.rounds, {name: run(m, counts[name]) for name, m in makers.items()})
    return {name: r["bps"] for name, r in runs.items()}


# ---- throughput ---------------------------------------------------------------------------------
def described(batch: int, seq_len: int) -> dict[str, str]:
    """Each contender's line in the table."""
    return {
        "floor": f"numpy gather + `device_put` of one `({batch}, {seq_len + 1})` int32 array, "
        "background thread (the floor)",
        "floor6": "numpy gather + the six MaxText arrays `device_put` together "
        "(six-transfer floor)",
        "default": "grain_rox default (MaxText: inputs, targets, segmentation, positions)",
        "host_features": "grain_rox default, `features_on_device=False` (host-computed features)",
        "windows": 'grain_rox `layout="windows"` (windows + stacked segments)',
        "windows1": 'grain_rox `layout="windows"`, `segmentation=False` (one array)',
        "fast": 'grain_rox fast path: `layout="tokens"` + `pipe.unpack` in a jitted step',
        "packed": 'grain_rox default, `packing="best_fit"` (one array, features on the device)',
        "packed_host": 'grain_rox `packing="best_fit"`, `features_on_device=False` (six arrays)',
        "roxxel": f"`roxxel.stream` (one `({batch}, {seq_len})` array: inputs only)",
        "floor_step": "the floor, each batch consumed by the fast path's jitted step "
        "(features derived from the window)",
        "default_one": "grain_rox default, reading and placing in one thread",
        "windows1_one": 'grain_rox `layout="windows"`, `segmentation=False`, one thread',
        "fast_one": "grain_rox fast path, reading and placing in one thread",
        "default_put": "grain_rox default, placed by `jax.device_put` (not one jitted call)",
        "windows1_put": 'grain_rox `layout="windows"`, `segmentation=False`, placed by '
        "`jax.device_put`",
        "fast_put": "grain_rox fast path, placed by `jax.device_put`",
    }


def targets(roxxel: list[float], floor6: list[float]) -> dict[str, Target]:
    """Issue 13's targets, judged on the medians. The default's is relative: issue 13's 990
    batches/s were 1.01x the six-transfer floor on its H100, so 1.3x them is 1.3x that floor
    measured beside it (absolute batches/s differ from host to host)."""

    def fast(r: Row) -> bool | None:
        if r.ratio is None or r.ours_median is None:
            return None
        return r.ratio >= 0.9 and (not roxxel or r.ours_median >= statistics.median(roxxel))

    def default(r: Row) -> bool | None:
        if r.ours_median is None or not floor6:
            return None
        return r.ours_median >= 1.3 * statistics.median(floor6)

    judge_default = Target(">= 1.3x six-transfer floor", default)
    judge_fast = Target(">= 0.9x floor, >= roxxel", fast)
    return {
        "windows": ratio_at_least(1.0),
        "windows1": ratio_at_least(1.0),
        "windows1_one": ratio_at_least(1.0),
        "windows1_put": ratio_at_least(1.0),
        "fast": judge_fast,
        "fast_one": judge_fast,
        "fast_put": judge_fast,
        "default": judge_default,
        "default_one": judge_default,
        "default_put": judge_default,
    }


def bench_shape(
    cfg: Config, path: str, tokens: np.ndarray, shape: tuple[int, int], sharding: NamedSharding,
    roxxel: Any,
) -> list[Row]:  # fmt: skip
    batch, seq_len = shape

    def pipe(**kw: Any) -> grain_rox.TokenPipeline:
        return grain_rox.TokenPipeline(
            path, seq_len=seq_len, global_batch_size=batch, seed=0, eos_id=EOS, **kw
        )

    gather = Gather(tokens, batch, seq_len)
    extra = optional_pipelines(path, batch, seq_len)
    skipped: dict[str, str] = {}
    makers: dict[str, Maker] = {
        "floor": floor_maker(gather, False, sharding),
        "floor6": floor_maker(gather, True, sharding),
        "floor_step": floor_maker(gather, False, sharding, then=window_step()),
        "default": rox_maker(pipe(), sharding),
        "default_one": rox_maker(pipe(), sharding, split_producer=False),
        "default_put": rox_maker(pipe(), sharding, place_by_call=False),
    }
    if extra["host_features"] is True:
        makers["host_features"] = rox_maker(pipe(), sharding, features_on_device=False)
    else:
        skipped["host_features"] = extra["host_features"]
    makers["windows"] = rox_maker(pipe(layout="windows"), sharding)
    windows1 = pipe(layout="windows", segmentation=False)
    makers["windows1"] = rox_maker(windows1, sharding)
    makers["windows1_one"] = rox_maker(windows1, sharding, split_producer=False)
    makers["windows1_put"] = rox_maker(windows1, sharding, place_by_call=False)
    fast = extra["tokens"]
    if isinstance(fast, str):
        skipped["fast"] = fast
    else:
        consume = jax.jit(lambda b: reduce_features(fast.unpack(b)))
        makers["fast"] = rox_maker(fast, sharding, then=consume)
        makers["fast_one"] = rox_maker(fast, sharding, then=consume, split_producer=False)
        makers["fast_put"] = rox_maker(fast, sharding, then=consume, place_by_call=False)
    packed = extra["packed"]
    if isinstance(packed, str):
        skipped["packed"] = skipped["packed_host"] = packed
    else:
        makers["packed"] = rox_maker(packed, sharding)
        makers["packed_host"] = rox_maker(packed, sharding, features_on_device=False)
    if roxxel is not None:
        makers["roxxel"] = roxxel_maker(roxxel, path, batch, seq_len, sharding)
    else:
        skipped["roxxel"] = "roxxel is not installed"

    if _ONLY_CONTENDERS is not None:  # the others are left out of the table
        makers = {k: m for k, m in makers.items() if k in _ONLY_CONTENDERS}
        skipped = {k: why for k, why in skipped.items() if k in _ONLY_CONTENDERS}
    runs = measure(cfg, makers, f"({batch}, {seq_len})")
    judged = targets(runs.get("roxxel", []), runs["floor6"])
    return [
        Row(f"{key} {batch}x{seq_len}", what, "batch/s", runs.get(key, []), runs["floor"], True,
            what, "the one-transfer floor", judged.get(key), skipped=skipped.get(key))
        for key, what in described(batch, seq_len).items()
        if key in runs or key in skipped
    ]  # fmt: skip


# ---- the train-step stall -----------------------------------------------------------------------
def matmul_step(
    dim: int, iters: int, unpack: Callable[[Any], Any] | None, unroll: bool = False
) -> Callable[..., Any]:
    """A jitted step: ``iters`` (dim, dim) matmuls, started from the batch's reduced features
    (in a while loop, or ``unroll``ed into one straight-line program)."""

    @jax.jit
    def step(x: Any, w: Any, batch: Any) -> Any:
        features = unpack(batch) if unpack is not None else batch
        x = x + reduce_features(features).astype(jnp.float32) * 1e-12
        return jax.lax.fori_loop(0, iters, lambda _, x: jnp.tanh(x @ w), x, unroll=unroll)

    return step


def step_ms(step: Callable[..., Any], x: Any, w: Any, get: Callable[[], Any], n: int) -> float:
    """Milliseconds per step of ``n`` chained steps (dispatch overlaps, as in a trainer)."""
    for _ in range(3):
        x = step(x, w, get())
    x.block_until_ready()
    t0 = time.perf_counter()
    for _ in range(n):
        x = step(x, w, get())
    x.block_until_ready()
    return (time.perf_counter() - t0) / n * 1e3


class Stall:
    """The train-step stall: a matmul step sized to a target time, with its batch already on the
    device vs fed by an iterator, for grain_rox's default and (where it exists) the fast path."""

    def __init__(self, cfg: Config, path: str, sharding: NamedSharding, device: bool) -> None:
        self.cfg, self.sharding, self.device = cfg, sharding, device
        batch, seq_len = cfg.stall_shape
        self.pipes: dict[str, Any] = {
            "default": grain_rox.TokenPipeline(
                path, seq_len=seq_len, global_batch_size=batch, seed=0, eos_id=EOS
            )
        }
        fast = optional_pipelines(path, batch, seq_len)["tokens"]
        if not isinstance(fast, str):
            self.pipes["fast"] = fast
        self.resident = {key: self.first_batch(p) for key, p in self.pipes.items()}
        self.dim = cfg.stall_dim if device else 128
        everywhere = NamedSharding(sharding.mesh, PartitionSpec())  # on the batch's devices
        self.x = jax.device_put(np.ones((self.dim, self.dim), np.float32), everywhere)
        self.w = jax.device_put(np.eye(self.dim, dtype=np.float32) * 0.5, everywhere)

    def first_batch(self, pipe: grain_rox.TokenPipeline) -> Any:
        with grain_rox.MultiHostDataLoadIterator(pipe, data_sharding=self.sharding) as it:
            return jax.block_until_ready(next(it))

    def step(self, key: str, iters: int) -> Callable[..., Any]:
        unpack = self.pipes[key].unpack if key == "fast" else None
        return matmul_step(self.dim, iters, unpack, self.cfg.stall_unroll)

    def ms(self, step: Callable[..., Any], get: Callable[[], Any], n: int) -> float:
        return step_ms(step, self.x, self.w, get, n)

    def sized(self, target_ms: float) -> int:
        """Matmul iterations for a ``target_ms`` step, from the times of two loop lengths (the
        fastest of 3 tries each: a shared host's slow spells only ever add time)."""
        k = 16
        get = lambda: self.resident["default"]  # noqa: E731
        t1, t2 = (
            min(self.ms(step, get, 20) for _ in range(3))
            for step in (self.step("default", k), self.step("default", 4 * k))
        )
        per_iter = max((t2 - t1) / (3 * k), 1e-6)
        return max(1, round((target_ms - (t1 - per_iter * k)) / per_iter))

    def run(self, key: str, iters: int, how: str) -> Callable[[], dict[str, float]]:
        """``how``: "resident", "fed" (the iterator as configured by default), "one"
        (reading and placing in one thread), "put" (placed by ``jax.device_put``, not one
        jitted call) or "host" (the default's features computed on the host, then
        ``device_put``: no program of the loader's on the device between steps)."""
        step, n = self.step(key, iters), self.cfg.stall_steps

        def go() -> dict[str, float]:
            if how == "resident":
                return {"ms": self.ms(step, lambda: self.resident[key], n)}
            pipe = self.pipes[key]
            options = {"features_on_device": False} if how == "host" else {}
            with grain_rox.MultiHostDataLoadIterator(
                pipe, data_sharding=self.sharding, **options
            ) as it:
                if how == "one" and hasattr(it, "_split_producer"):
                    it._split_producer = False
                if how in ("put", "host") and hasattr(it, "_place_by_call"):
                    it._place_by_call = False
                return {"ms": self.ms(step, lambda: next(it), n)}

        return go

    def measure(self, target_ms: float) -> tuple[str, dict[str, Any]]:
        iters = self.sized(target_ms)
        contenders = {
            f"{key} {how}": self.run(key, iters, how)
            for key in self.pipes
            for how in ("resident", *self.cfg.stall_ways)
            if not (key == "fast" and how == "host")  # (the fast path has no features)
        }
        warm_up(contenders)  # compiles each step
        runs = {k: v["ms"] for k, v in interleave(self.cfg.rounds, contenders).items()}
        med = {k: statistics.median(v) for k, v in runs.items()}

        def paired(fed: str, resident: str) -> float:
            """The median over rounds of each round's fed/resident step time, in percent: the
            two run back to back, so a slow spell of a shared machine (the resident step alone
            swung by 40% between rounds on one H200 host) weighs on both."""
            ratios = [f / r for f, r in zip(runs[fed], runs[resident], strict=True)]
            return 100 * (statistics.median(ratios) - 1)

        parts = []
        for key, label in (("default", "grain_rox default"), ("fast", "fast path")):
            if key not in self.pipes:
                parts.append(f"{label} n/a")
                continue
            for how, named in (
                ("fed", ""), ("one", ", one thread"), ("put", ", device_put"),
                ("host", ", host features + device_put"),
            ):  # fmt: skip
                if how not in self.cfg.stall_ways or f"{key} {how}" not in runs:
                    continue
                stall = paired(f"{key} {how}", f"{key} resident")
                verdict = f" ({'PASS' if stall <= 2 else 'MISS'}: <= 2%)" if target_ms == 3 else ""
                parts.append(f"{label}{named} {stall:+.1f}%{verdict}")
        if "fast" in self.pipes:
            unpack = paired("fast resident", "default resident")
            parts.append(f"`pipe.unpack` inside the resident step {unpack:+.1f}%")
        measured = f", measured {med['default resident']:.2f} ms" if self.device else ""
        loop = ", unrolled" if self.cfg.stall_unroll else ""
        what = f"{iters} matmuls of {self.dim}x{self.dim}{loop}{measured}"
        line = f"- ~{target_ms:g} ms step ({what}): " + ", ".join(parts)
        return line, {"iters": iters, "dim": self.dim, "runs_ms": runs}


def bench_stall(
    cfg: Config, path: str, sharding: NamedSharding, device: bool
) -> tuple[list[str], dict[str, Any]]:
    stall = Stall(cfg, path, sharding, device)
    lines, details = [], {}
    for target_ms in cfg.stall_ms:
        line, details[f"{target_ms:g}ms"] = stall.measure(target_ms)
        lines.append(line)
    return lines, details


# ---- workers ------------------------------------------------------------------------------------
def bench_workers(cfg: Config, path: str, sharding: NamedSharding) -> tuple[list[str], dict]:
    batch, seq_len = SHAPES[0]
    pipe = grain_rox.TokenPipeline(
        path, seq_len=seq_len, global_batch_size=batch, seed=0, eos_id=EOS
    )
    makers = {f"w{n}": rox_maker(pipe, sharding, worker_count=n) for n in (0, WORKERS)}
    runs = measure(cfg, makers, f"workers ({batch}, {seq_len})")
    ratio = statistics.median(runs[f"w{WORKERS}"]) / statistics.median(runs["w0"])
    verdict = "PASS" if ratio >= 0.98 else "MISS"
    line = (
        f"- grain_rox default at ({batch}, {seq_len}): worker_count={WORKERS} / worker_count=0 = "
        f"{ratio:.2f}x (target: never slower, judged as >= 0.98 for noise: {verdict})"
    )
    heavy_line, heavy_runs = bench_heavy_workers(cfg, sharding)
    return [line, heavy_line], {**runs, **heavy_runs}


class TokenizedRow:
    """A Grain map with heavy host work: a text -> its first ``seq_len + 1`` cl100k_base
    tokens, zero-padded, as int32 (the tokenizer is built on first use, in each worker)."""

    def __init__(self, seq_len: int) -> None:
        self.width = seq_len + 1
        self._tokenizer: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"width": self.width, "_tokenizer": None}

    def __call__(self, text: str) -> np.ndarray:
        if self._tokenizer is None:
            self._tokenizer = grain_rox.get_tokenizer("cl100k_base")
        ids = self._tokenizer.encode(text)[: self.width]
        row = np.zeros(self.width, np.int32)
        row[: len(ids)] = ids
        return row


def heavy_maker(texts: list[str], workers: int, sharding: NamedSharding) -> Maker:
    """Texts tokenized on the fly, 32 rows a batch, through Grain's ``mp_prefetch`` with
    ``workers`` processes (0: in process), then ``device_put``."""
    import grain

    batch, seq_len = SHAPES[0]

    def make() -> Feed:
        ds = (
            grain.MapDataset.source(texts).shuffle(seed=0).repeat()
            .map(TokenizedRow(seq_len)).batch(batch)
            .to_iter_dataset(grain.ReadOptions(num_threads=0))
        )  # fmt: skip
        if workers:
            ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
        it = iter(ds)
        close = getattr(it, "close", None) or (lambda: None)
        return Feed(lambda: jax.device_put(next(it), sharding), close)

    return make


def bench_heavy_workers(cfg: Config, sharding: NamedSharding) -> tuple[str, dict]:
    """Worker scaling where a batch is heavy host work (tokenizing 32 texts with cl100k_base):
    Grain's workers must pay (issue 13: >= 4x with 8 workers on a 16-core host)."""
    cpus = os.cpu_count() or 1
    workers = min(8, cpus)
    texts = list(grain_rox.builtin_documents("code", limit=400 if cfg.quick else 3000))
    TokenizedRow(8)("warm")  # the vocabulary is built once here, before any timing
    makers = {f"h{n}": heavy_maker(texts, n, sharding) for n in (0, workers)}
    counts = {}
    for name, make in makers.items():
        probe = timed(make, 4 * workers, warm=2 * workers)
        counts[name] = max(4 * workers, min(cfg.max_batches, int(probe * 2 * cfg.seconds)))
        log(f"heavy workers: probe {name}: {probe:.1f} batches/s -> {counts[name]} per run")

    def run(make: Maker, n: int) -> Callable[[], dict[str, float]]:
        return lambda: {"bps": timed(make, n, warm=2 * workers)}

    runs = interleave(cfg.rounds, {k: run(m, counts[k]) for k, m in makers.items()})
    bps = {k: v["bps"] for k, v in runs.items()}
    ratio = statistics.median(bps[f"h{workers}"]) / statistics.median(bps["h0"])
    verdict = ("PASS" if ratio >= 4 else "MISS") if cpus >= 16 else f"n/a on {cpus} CPUs"
    line = (
        f"- heavy host work (cl100k_base tokenization of 32 stdlib sources a batch, Grain "
        f"`mp_prefetch`): {workers} workers / in process = {ratio:.2f}x "
        f"({statistics.median(bps['h0']):.1f} -> {statistics.median(bps[f'h{workers}']):.1f} "
        f"batches/s; target >= 4x with 8 workers on 16 cores: {verdict})"
    )
    return line, bps


# ---- output -------------------------------------------------------------------------------------
def spread(values: list[float]) -> str:
    """(max - min) / median of one contender's runs."""
    m = statistics.median(values)
    return f"{100 * (max(values) - min(values)) / m:.0f}%" if m > 0 else "-"


def markdown(rows: list[Row], device: bool) -> str:
    """The table of one batch shape (without batches/s on the CPU: ratios only), then the
    contenders that were not run and why."""
    head = ["contender", "batches/s", "vs one-transfer floor", "target", "result", "runs", "spread"]
    if not device:
        head.remove("batches/s")
    out = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    notes = []
    for r in rows:
        target = r.target.text if r.target else "-"
        if r.skipped or r.ours_median is None or r.ratio is None:
            cells = ["n/a", "n/a", target, "-", "0", "-"]
            notes.append(f"- n/a: {r.what}: {r.skipped}")
        else:
            cells = [f"{r.ours_median:,.0f}", f"{r.ratio:.2f}", target, r.verdict,
                     str(len(r.ours)), spread(r.ours)]  # fmt: skip
        out.append("| " + " | ".join([r.what, *(cells if device else cells[1:])]) + " |")
    return "\n".join([*out, "", *notes] if notes else out)


def report(cfg: Config, title: str, rows: list[Row], stall: list[str], workers: list[str],
           device: bool) -> None:  # fmt: skip
    mode = "quick" if cfg.quick else "full"
    print(f"\n## Device benchmark: {title}; JAX {jax.__version__}, grain_rox "
          f"{grain_rox.__version__}; {cfg.corpus_tokens / 1e6:g}M-token corpus, {mode} mode; "
          f"medians of {cfg.rounds} interleaved rounds\n")  # fmt: skip
    for shape in dict.fromkeys(r.key.rsplit(" ", 1)[1] for r in rows):  # the shapes run
        shape_rows = [r for r in rows if r.key.endswith(f" {shape}")]
        batch, seq_len = shape.split("x")
        print(f"### ({batch}, {seq_len}) batches\n\n{markdown(shape_rows, device)}\n")
    if stall:
        b, L = cfg.stall_shape
        print(f"### Train-step stall, ({b}, {L}) batches: step time fed by the iterator vs with "
              "the batch already on the device\n\n" + "\n".join(stall) + "\n")  # fmt: skip
    if workers:
        print("### Workers\n\n" + "\n".join(workers) + "\n")


def main() -> int:
    parser = arg_parser(__doc__ or "", "device", "tsw", "ts (throughput, stall, workers)")
    parser.add_argument("--allow-cpu", action="store_true", help="run on the CPU (ratios only)")
    parser.add_argument(
        "--platform", choices=("auto", "cpu"), default="auto",
        help="auto: JAX's choice (an accelerator first); cpu: force the CPU",
    )  # fmt: skip
    parser.add_argument("--tokens", type=float, default=None, help="corpus size in tokens")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved runs (>= 3)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per timed run")
    parser.add_argument("--stall-steps", type=int, default=None, help="timed steps per stall run")
    parser.add_argument(
        "--stall-dim", type=int, default=None,
        help="the stall step's (dim, dim) matmuls on an accelerator (default 4096: a few, "
        "device-bound; 1024 makes a step of many host-driven ~24 us loop iterations)",
    )  # fmt: skip
    parser.add_argument(
        "--stall-ms", default=None, help="stall step times in ms, comma-separated (default: 3,7)"
    )
    parser.add_argument(
        "--stall-unroll", action="store_true",
        help="the stall step's matmuls unrolled into one program (default: a while loop)",
    )  # fmt: skip
    parser.add_argument(
        "--stall-ways", default=None,
        help="fed stall runs, comma-separated of fed,one,put,host (default: fed,one,put)",
    )  # fmt: skip
    parser.add_argument(
        "--shapes", default=None,
        help="throughput shapes, e.g. 32x1024 (default: all of " + ",".join(
            f"{b}x{s}" for b, s in SHAPES) + ")",
    )  # fmt: skip
    parser.add_argument(
        "--contenders", default=None,
        help="throughput contenders to run, comma-separated keys (default: all; the floor "
        "and the six-transfer floor always run)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.stall_ways and not set(args.stall_ways.split(",")) <= {"fed", "one", "put", "host"}:
        parser.error(
            f"--stall-ways {args.stall_ways!r}: use a comma-separated subset of fed,one,put,host"
        )
    shapes = SHAPES if not args.shapes else tuple(
        tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")
    )  # fmt: skip
    global _ONLY_CONTENDERS
    if args.contenders:
        _ONLY_CONTENDERS = {"floor", "floor6", *args.contenders.split(",")}
    cfg = dataclasses.replace(
        QUICK if args.quick else FULL,
        corpus_tokens=int(args.tokens or (QUICK if args.quick else FULL).corpus_tokens),
        rounds=max(3, args.rounds or FULL.rounds),
        seconds=args.seconds or (QUICK if args.quick else FULL).seconds,
        stall_steps=args.stall_steps or (QUICK if args.quick else FULL).stall_steps,
        stall_ways=tuple(args.stall_ways.split(",")) if args.stall_ways else FULL.stall_ways,
        stall_ms=tuple(float(m) for m in args.stall_ms.split(",")) if args.stall_ms else STEP_MS,
        stall_dim=args.stall_dim or FULL.stall_dim,
        stall_unroll=args.stall_unroll,
    )
    backend = jax.default_backend()
    device = backend != "cpu"
    if not device and not args.allow_cpu:
        print("bench_device: no accelerator found (JAX's backend is 'cpu'): device benchmark "
              "skipped (--allow-cpu runs it on the CPU, ratios only)")  # fmt: skip
        return 0
    os.environ["JAX_PLATFORMS"] = "cpu"  # for Grain's worker processes: never the accelerator
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags
    started = time.perf_counter()
    kind = jax.devices()[0].device_kind
    roxxel = import_roxxel(required=False)
    extra = {"backend": backend, "device": kind, "devices": jax.device_count()}
    info = machine(("jax", "grain", "roxxel"), extra)
    load = f", load avg {info['loadavg'][0]:.2f}" if info["loadavg"] else ""
    title = f"{kind} x{jax.device_count()}" if device else f"CPU (ratios only){load}"
    sharding = NamedSharding(Mesh(np.asarray(jax.devices()), ("data",)), PartitionSpec("data"))
    rows: list[Row] = []
    stall: tuple[list[str], dict[str, Any]] = ([], {})
    workers: tuple[list[str], dict[str, Any]] = ([], {})
    with scratch_dir(args.tmpdir) as tmp:
        path = write_corpus(cfg.corpus_tokens, tmp)
        with grain_rox.open_rox(path) as corpus:
            tokens = corpus.tokens(0, corpus.num_tokens)  # a view of the one shard's memory map
            log(f"corpus: {corpus.num_tokens / 1e6:.0f}M tokens written")
            if "t" in args.only:
                for shape in shapes:
                    shape_rows = bench_shape(cfg, path, tokens, shape, sharding, roxxel)
                    rows += shape_rows
                    log(f"{shape}:\n{markdown(shape_rows, device)}")
            del tokens
        if "s" in args.only:
            stall = bench_stall(cfg, path, sharding, device)
            log("\n".join(stall[0]))
        if "w" in args.only:
            workers = bench_workers(cfg, path, sharding)
    elapsed = time.perf_counter() - started
    report(cfg, title, rows, stall[0], workers[0], device)
    print(f"total {elapsed:.0f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "device",
        "mode": "quick" if cfg.quick else "full",
        "machine": info,
        "config": dataclasses.asdict(cfg),
        "seconds": elapsed,
        "rows": [r.to_json() for r in rows],
        "details": {"stall_ms": stall[1], "workers_batches_per_s": workers[1]},
    }
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
