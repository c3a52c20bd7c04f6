"""Benchmark grain_rox's TokenPipeline against a numpy floor, roxxel 0.9.14 and plain Grain.

Run by ``nox -s bench`` as ``python benchmarks/bench_pipeline.py [--quick]``. Every measurement
is repeated (at least 3 times) with the contenders interleaved (A, B, C, A, B, C, ...) so that
the noise of a shared machine hits all alike; the table shows medians, ratios and the issue's
targets. It is printed at the end and written as JSON to ``bench_out/pipeline.json``.

Rows (see benchmarks/README.md):

1. steady-state throughput (batches/s) of (32, 1024) batches: grain_rox on JAX devices and on
   the host, vs a numpy/device_put floor, roxxel's ``stream`` and a plain Grain DataLoader;
2. resuming at step 10**9, and the latency of the first batch;
3. anonymous RSS: flat while streaming, and independent of the corpus size (1 TiB sparse);
4. how close two rows of one batch come in the token stream, over 10,000 batches.

All data lives in a temporary directory that is removed at the end; nothing is downloaded.
"""
# ruff: noqa: E402  (the environment must be set before JAX is imported)

from __future__ import annotations

import os
import re

# 8 fake CPU devices, as in the tests and `nox -s bench`; before anything imports JAX.
N_DEVICES = 8
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = (
    re.sub(r"--xla_force_host_platform_device_count=\S*", "", os.environ.get("XLA_FLAGS", ""))
    + f" --xla_force_host_platform_device_count={N_DEVICES}"
).strip()

import bisect
import ctypes
import dataclasses
import gc
import glob
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grain
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import grain_rox
from grain_rox._sources._segments import INPUTS, MAXTEXT_FEATURES, TARGETS

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for _harness, however this is run
from _harness import (
    Row,
    arg_parser,
    build_sparse,
    finish,
    footer,
    import_roxxel,
    interleave,
    log,
    machine,
    ours_at_most,
    ours_below,
    ours_within,
    print_header,
    quiet,
    ratio_at_least,
    read_through,
    scratch_dir,
    settle,
    status_kib,
    warm_up,
)

SEQ_LEN = 1024
BATCH = 32
WIDTH = SEQ_LEN + 1  # a window: seq_len inputs + the shifted last target
VOCAB = 50257
EOS = 50256


# ---- configuration --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Config:
    quick: bool
    corpus_tokens: int  # rows 1-3: random uint16 tokens in [0, VOCAB)
    max_shard_bytes: int
    batches: int  # row 1: timed batches per run (after one warm-up batch)
    plain_batches: int  # row 1: the same for plain Grain (slow)
    runs_throughput: int
    placements: int  # row 1i: placements per run
    runs_latency: int  # row 2
    runs_rss: int  # row 3
    sparse_shards: int
    sparse_shard_bytes: int
    sparse_block_bytes: int
    close_tokens: int  # row 4: positions corpus (uint32)
    close_batches: int
    close_seeds: int


FULL = Config(
    quick=False,
    corpus_tokens=200_000_000,
    max_shard_bytes=64 << 20,
    batches=2000,
    plain_batches=300,
    runs_throughput=5,
    placements=300,
    runs_latency=9,
    runs_rss=5,
    sparse_shards=16,
    sparse_shard_bytes=64 << 30,
    sparse_block_bytes=1 << 30,
    close_tokens=50_000_000,
    close_batches=10_000,
    close_seeds=3,
)
QUICK = dataclasses.replace(
    FULL,
    quick=True,
    corpus_tokens=10_000_000,
    batches=200,
    plain_batches=20,
    runs_throughput=3,
    placements=100,
    runs_latency=3,
    close_tokens=10_000_000,
    close_batches=1000,
)


# ---- helpers ----------------------------------------------------------------------------------
def close_iterator(it: Any) -> None:
    """Close a Grain iterator (DataLoaderIterator has no close(); its dataset iterator has)."""
    for obj in (it, getattr(it, "_iterator", None)):
        closer = getattr(obj, "close", None)
        if callable(closer):
            closer()
            return


def data_sharding() -> NamedSharding:
    """The sharding grain_rox uses by default: a 1-D "data" mesh over all devices, rows sharded."""
    return NamedSharding(Mesh(np.asarray(jax.devices()), ("data",)), PartitionSpec("data"))


@dataclasses.dataclass(frozen=True)
class Corpus:
    directory: str
    paths: list[str]
    shard_tokens: list[int]  # raw tokens per shard (padding included)
    dtype: np.dtype

    @classmethod
    def scan(cls, directory: str) -> Corpus:
        paths = sorted(glob.glob(os.path.join(directory, "*.rox")))
        facts = [footer(p) for p in paths]
        dtypes = {f[2] for f in facts}
        assert len(dtypes) == 1, dtypes
        dt = np.dtype(dtypes.pop())
        return cls(directory, paths, [f[1] // dt.itemsize for f in facts], dt)

    @property
    def num_tokens(self) -> int:
        return sum(self.shard_tokens)

    @property
    def nbytes(self) -> int:
        return self.num_tokens * self.dtype.itemsize


def write_random_corpus(cfg: Config, directory: str) -> Corpus:
    """``cfg.corpus_tokens`` random uint16 ids in [0, VOCAB), EOS-separated every 8M tokens."""
    rng = np.random.default_rng(0)
    piece = 8 << 20

    def items() -> Iterator[np.ndarray]:
        for lo in range(0, cfg.corpus_tokens, piece):
            n = min(piece, cfg.corpus_tokens - lo)
            yield rng.integers(0, VOCAB, n, dtype=np.uint16)

    grain_rox.write_rox(
        items(),
        os.path.join(directory, "tokens.rox"),
        max_shard_bytes=cfg.max_shard_bytes,
        separator=EOS,
    )
    return Corpus.scan(directory)


# ---- the contenders -----------------------------------------------------------------------------
class FloorSampler:
    """The numpy floor: uniformly random windows gathered as rows of strided window views."""

    def __init__(self, corpus: Corpus, seed: int = 0) -> None:
        self.maps = [
            np.memmap(p, dtype=corpus.dtype, mode="r", shape=(n,))
            for p, n in zip(corpus.paths, corpus.shard_tokens, strict=True)
        ]
        self.views = [np.lib.stride_tricks.sliding_window_view(m, WIDTH) for m in self.maps]
        self.cum = np.concatenate([[0], np.cumsum([v.shape[0] for v in self.views])])
        self.rng = np.random.default_rng(seed)

    def starts(self) -> np.ndarray:
        return self.rng.integers(0, int(self.cum[-1]), BATCH)

    def batch(self) -> np.ndarray:
        g = self.starts()
        shard = np.searchsorted(self.cum, g, side="right") - 1
        local = g - self.cum[shard]
        out = np.empty((BATCH, WIDTH), np.int32)
        if len(self.views) == 1:
            out[...] = self.views[0][local]
        else:
            for s in np.unique(shard).tolist():
                sel = shard == s
                out[sel] = self.views[s][local[sel]]
        return out


class MemmapWindows:
    """What users write for plain Grain: record i = the i-th 1025-token window (stride 1024)
    of the shards' raw regions, as int32, read from an ``np.memmap``."""

    def __init__(self, corpus: Corpus) -> None:
        self.maps = [
            np.memmap(p, dtype=corpus.dtype, mode="r", shape=(n,))
            for p, n in zip(corpus.paths, corpus.shard_tokens, strict=True)
        ]
        counts = [(n - 1) // SEQ_LEN for n in corpus.shard_tokens]
        self.cum = np.concatenate([[0], np.cumsum(counts)]).tolist()

    def __len__(self) -> int:
        return int(self.cum[-1])

    def __getitem__(self, index: int) -> np.ndarray:
        s = bisect.bisect_right(self.cum, index) - 1
        a = (index - self.cum[s]) * SEQ_LEN
        return np.asarray(self.maps[s][a : a + WIDTH], dtype=np.int32)

    def __repr__(self) -> str:
        return f"MemmapWindows({len(self)} windows)"


def timed_loop(
    n: int, step: Callable[[], object], halfway: Callable[[], object] | None = None
) -> float:
    """Batches per second of ``n`` calls of ``step``; ``halfway`` runs after n // 2 calls,
    off the clock."""
    h = n // 2
    t0 = time.perf_counter()
    for _ in range(h):
        step()
    t1 = time.perf_counter()
    if halfway is not None:
        halfway()
    t2 = time.perf_counter()
    for _ in range(n - h):
        step()
    return n / (t1 - t0 + time.perf_counter() - t2)


def rss_metrics(rss: list[int]) -> dict[str, float]:
    """RssAnon (KiB) [before the iterator, after half the timed batches, after all of them]."""
    before, half, end = rss
    return {"rss_total": end - before, "rss_second_half": end - half}


def bench_throughput(cfg: Config, corpus: Corpus, roxxel: Any) -> tuple[list[Row], dict]:
    sharding = data_sharding()
    pipe = grain_rox.TokenPipeline(
        corpus.directory, seq_len=SEQ_LEN, global_batch_size=BATCH, seed=0
    )
    pipe_noseg = grain_rox.TokenPipeline(
        corpus.directory, seq_len=SEQ_LEN, global_batch_size=BATCH, seed=0, segmentation=False
    )
    pipe_win = dataclasses.replace(pipe, layout="windows")
    pipe_win_noseg = dataclasses.replace(pipe_noseg, layout="windows")
    n = cfg.batches

    def floor(device: bool) -> Callable[[int], dict[str, float]]:
        def run(n: int) -> dict[str, float]:
            sampler = FloorSampler(corpus, seed=0)
            if device:

                def step() -> None:
                    jax.device_put(sampler.batch(), sharding).block_until_ready()

            else:
                step = sampler.batch  # type: ignore[assignment]
            step()  # warm-up batch
            return {"batches_per_s": timed_loop(n, step)}

        return run

    def rox_jax(p: grain_rox.TokenPipeline) -> Callable[[int], dict[str, float]]:
        def run(n: int) -> dict[str, float]:
            rss = [status_kib()["RssAnon"]]
            it = grain_rox.MultiHostDataLoadIterator(p, prefetch=2)
            jax.block_until_ready(next(it))  # warm-up batch
            halfway = lambda: rss.append(status_kib()["RssAnon"])  # noqa: E731
            rate = timed_loop(n, lambda: jax.block_until_ready(next(it)), halfway)
            rss.append(status_kib()["RssAnon"])
            it.close()
            return {"batches_per_s": rate, **rss_metrics(rss)}

        return run

    def rox_iter(p: grain_rox.TokenPipeline) -> Callable[[int], dict[str, float]]:
        def run(n: int) -> dict[str, float]:
            it = iter(p.iter_dataset())
            next(it)
            rate = timed_loop(n, lambda: next(it))
            close_iterator(it)
            return {"batches_per_s": rate}

        return run

    def rox_source(n: int) -> dict[str, float]:
        src = pipe.batch_source()
        src[0]
        ks = iter(range(1, n + 1))
        rate = timed_loop(n, lambda: src[next(ks)])
        return {"batches_per_s": rate}

    def rox_stream(n: int) -> dict[str, float]:
        with quiet():
            rss = [status_kib()["RssAnon"]]
            r = roxxel.Roxxel(corpus.directory)
            r.open()
            stream = r.stream(seq_len=SEQ_LEN, batch_size=BATCH, seed=0, prefetch_size=4)
            assert len(stream) > n, f"roxxel streams only {len(stream)} batches"
            next(stream).block_until_ready()
            halfway = lambda: rss.append(status_kib()["RssAnon"])  # noqa: E731
            rate = timed_loop(n, lambda: next(stream).block_until_ready(), halfway)
            rss.append(status_kib()["RssAnon"])
            stream.close()
            r.close()
        return {"batches_per_s": rate, **rss_metrics(rss)}

    def plain(n: int) -> dict[str, float]:
        source = MemmapWindows(corpus)
        loader = grain.DataLoader(
            data_source=source,
            sampler=grain.samplers.IndexSampler(
                num_records=len(source), shuffle=True, seed=0, num_epochs=1
            ),
            operations=[grain.transforms.Batch(BATCH)],
            worker_count=0,
        )
        it = iter(loader)
        jax.device_put(next(it), sharding).block_until_ready()
        rate = timed_loop(n, lambda: jax.device_put(next(it), sharding).block_until_ready())
        close_iterator(it)
        return {"batches_per_s": rate}

    contenders: dict[str, tuple[Callable[[int], dict[str, float]], int]] = {
        "floor_device_put": (floor(True), n),
        "floor_numpy": (floor(False), n),
        "grain_rox_jax": (rox_jax(pipe), n),
        "grain_rox_jax_noseg": (rox_jax(pipe_noseg), n),
        "grain_rox_jax_windows": (rox_jax(pipe_win), n),
        "grain_rox_jax_windows_noseg": (rox_jax(pipe_win_noseg), n),
        "grain_rox_numpy": (rox_iter(pipe), n),
        "grain_rox_numpy_noseg": (rox_iter(pipe_noseg), n),
        "grain_rox_source": (rox_source, n),
        "grain_plain": (plain, cfg.plain_batches),
    }
    if roxxel is not None:
        contenders["roxxel_stream"] = (rox_stream, n)

    # Check once that the contenders produce what they claim.
    b = pipe.batch_source()[0]
    assert set(b) == set(MAXTEXT_FEATURES), set(b)
    assert b["inputs"].shape == (BATCH, SEQ_LEN) and b["inputs"].dtype == np.int32
    assert set(pipe_noseg.batch_source()[0]) == {INPUTS, TARGETS}
    assert FloorSampler(corpus).batch().shape == (BATCH, WIDTH)
    with grain_rox.MultiHostDataLoadIterator(pipe) as it:
        assert it.sharding == sharding, (it.sharding, sharding)

    log(f"row 1: warm-up ({', '.join(contenders)})")
    for name, (fn, count) in contenders.items():
        before = set(threading.enumerate())
        fn(max(2, min(count // 10, 50)))
        gc.collect()
        settle(before, name)
    log(f"row 1: {cfg.runs_throughput} interleaved runs of {n} batches "
        f"({cfg.plain_batches} for grain_plain)")  # fmt: skip
    runs = interleave(
        cfg.runs_throughput,
        {name: (lambda fn=fn, count=count: fn(count)) for name, (fn, count) in contenders.items()},
    )
    place = bench_placement(cfg, pipe, corpus, sharding)

    def bps(name: str) -> list[float]:
        return runs[name]["batches_per_s"] if name in runs else []

    def missing(name: str) -> str | None:
        return None if name in runs else "roxxel is not installed"

    shape = f"({BATCH}, {SEQ_LEN})"
    size = f"{corpus.nbytes / 1e6:.0f} MB, {len(corpus.paths)} shards"
    jax_ours = (
        f"MultiHostDataLoadIterator(TokenPipeline(dir, seq_len={SEQ_LEN}, global_batch_size="
        f"{BATCH}, seed=0), prefetch=2), block_until_ready each batch: inputs, targets + 4 EOS "
        "segmentation/position features = 6 arrays"
    )
    floor_dp = (
        f"numpy gather of {BATCH} random {WIDTH}-token windows (rows of a sliding_window_view "
        "of each shard's np.memmap) into int32, then jax.device_put(batch, NamedSharding(1-D "
        f"'data' mesh, P('data'))).block_until_ready(): 1 array of ({BATCH}, {WIDTH})"
    )
    floor_np = "the same gather without device_put (host only)"
    rox_np = "iter(pipeline.iter_dataset()): Grain IterDataset of numpy batches (6 arrays)"
    g_plain = (
        f"grain.DataLoader(MemmapWindows: one {WIDTH}-token int32 window per record, "
        f"IndexSampler(shuffle=True, seed=0, num_epochs=1), [Batch({BATCH})], worker_count=0, "
        "default ReadOptions), then jax.device_put like the floor"
    )
    rox_stream_is = (
        f"roxxel.Roxxel(dir).stream(seq_len={SEQ_LEN}, batch_size={BATCH}, seed=0, "
        f"prefetch_size=4): 1 array of {shape} on its default sharding, block_until_ready each"
    )
    n_note = f"{n} timed batches after 1 warm-up batch, per run; corpus {size}"
    rows = [
        Row("1a", "grain_rox_jax / floor_device_put", "batch/s", bps("grain_rox_jax"),
            bps("floor_device_put"), True, jax_ours, floor_dp, ratio_at_least(1.0),
            note=n_note),
        Row("1b", "grain_rox_jax / roxxel_stream", "batch/s", bps("grain_rox_jax"),
            bps("roxxel_stream"), True, "same runs as 1a", rox_stream_is, ratio_at_least(2),
            skipped=missing("roxxel_stream")),
        Row("1c", "grain_rox_jax / grain_plain", "batch/s", bps("grain_rox_jax"),
            bps("grain_plain"), True, "same runs as 1a", g_plain, ratio_at_least(30),
            note=f"grain_plain: {cfg.plain_batches} timed batches per run"),
        Row("1d", "grain_rox_numpy / floor_numpy", "batch/s", bps("grain_rox_numpy"),
            bps("floor_numpy"), True, rox_np, floor_np, ratio_at_least(0.5)),
        Row("1e", "grain_rox_jax seg=False / floor_device_put", "batch/s",
            bps("grain_rox_jax_noseg"), bps("floor_device_put"), True,
            "as 1a with TokenPipeline(..., segmentation=False): inputs + targets = 2 arrays",
            "same runs as 1a"),
        Row("1f", "grain_rox_jax seg=False / roxxel_stream", "batch/s",
            bps("grain_rox_jax_noseg"), bps("roxxel_stream"), True, "same runs as 1e",
            "same runs as 1b", skipped=missing("roxxel_stream")),
        Row("1g", "grain_rox_numpy seg=False / floor_numpy", "batch/s",
            bps("grain_rox_numpy_noseg"), bps("floor_numpy"), True,
            "as 1d with segmentation=False", "same runs as 1d"),
        Row("1h", "batch_source()[k] / floor_numpy", "batch/s", bps("grain_rox_source"),
            bps("floor_numpy"), True,
            "pipeline.batch_source()[k] for k = 1..N: the host work without Grain (6 arrays)",
            "same runs as 1d"),
        Row("1j", "grain_rox_jax windows / floor_device_put", "batch/s",
            bps("grain_rox_jax_windows"), bps("floor_device_put"), True,
            "as 1a with layout='windows': windows + stacked segments = 2 arrays",
            "same runs as 1a"),
        Row("1k", "grain_rox_jax windows seg=False / floor", "batch/s",
            bps("grain_rox_jax_windows_noseg"), bps("floor_device_put"), True,
            "as 1a with layout='windows', segmentation=False: 1 array, like the floor",
            "same runs as 1a", ratio_at_least(1.0)),
        place,
    ]  # fmt: skip
    return rows, runs


def bench_placement(
    cfg: Config, pipe: grain_rox.TokenPipeline, corpus: Corpus, sharding: NamedSharding
) -> Row:
    """Diagnostic: the device placement of one batch, grain_rox's arrays vs the floor's one."""
    record = pipe.batch_source()[0]
    window = FloorSampler(corpus).batch()

    def place(tree: Any) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            t0 = time.perf_counter()
            for _ in range(cfg.placements):
                jax.block_until_ready(
                    jax.tree_util.tree_map(
                        lambda x: jax.make_array_from_process_local_data(sharding, x, x.shape),
                        tree,
                    )
                )
            return {"ms": (time.perf_counter() - t0) / cfg.placements * 1e3}

        return run

    place(record)()
    place(window)()
    runs = interleave(cfg.runs_throughput, {"ours": place(record), "theirs": place(window)})
    n_arrays = len(record)
    return Row(
        "1i", "placing one batch on the mesh (diagnostic)", "ms", runs["ours"]["ms"],
        runs["theirs"]["ms"], False,
        f"make_array_from_process_local_data on each of a pipeline batch's {n_arrays} arrays "
        f"({', '.join(record)}), as MultiHostDataLoadIterator does",
        f"the same on the floor's single ({BATCH}, {WIDTH}) int32 array",
        note="not a contest: shows how much of 1a's time is device placement",
    )  # fmt: skip


# ---- row 2: resume and first-batch latency ------------------------------------------------------
def bench_latency(cfg: Config, corpus: Corpus, roxxel: Any) -> list[Row]:
    pipe = grain_rox.TokenPipeline(
        corpus.directory, seq_len=SEQ_LEN, global_batch_size=BATCH, seed=0
    )
    far = 10**9

    def resume(step: int) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            t0 = time.perf_counter()
            ds = pipe.map_dataset(first_step=step)
            batch = ds[0]
            dt = time.perf_counter() - t0
            assert batch["inputs"].shape == (BATCH, SEQ_LEN)
            return {"s": dt}

        return run

    same = all(
        np.array_equal(a, b)
        for a, b in zip(
            pipe.map_dataset(first_step=10)[0].values(),
            pipe.map_dataset()[10].values(),
            strict=True,
        )
    )
    resume(far)()  # warm-up
    resume(10)()
    res = interleave(cfg.runs_latency, {"far": resume(far), "near": resume(10)})

    def first_ours() -> dict[str, float]:
        t0 = time.perf_counter()
        it = grain_rox.MultiHostDataLoadIterator(pipe, prefetch=2)
        jax.block_until_ready(next(it))
        dt = time.perf_counter() - t0
        it.close()
        return {"s": dt}

    def first_theirs() -> dict[str, float]:
        with quiet():
            t0 = time.perf_counter()
            r = roxxel.Roxxel(corpus.directory)
            r.open()
            stream = r.stream(seq_len=SEQ_LEN, batch_size=BATCH, seed=0, prefetch_size=4)
            next(stream).block_until_ready()
            dt = time.perf_counter() - t0
            stream.close()
            r.close()
        return {"s": dt}

    contenders = {"ours": first_ours}
    if roxxel is not None:
        contenders["theirs"] = first_theirs
    warm_up(contenders)
    first = interleave(cfg.runs_latency, contenders)
    log("row 2 done")
    return [
        Row("2a", "resume at step 10**9: map_dataset + [0]", "ms", res["far"]["s"],
            res["near"]["s"], False,
            "pipeline.map_dataset(first_step=10**9)[0]: construct (opens the shards) + first "
            "batch",
            "the same with first_step=10", ours_below(10e-3, "10 ms"), scale=1e-3,
            note=f"map_dataset(first_step=10)[0] == map_dataset()[10]: {same}"),
        Row("2b", "first batch latency (warm)", "ms", first["ours"]["s"],
            first.get("theirs", {}).get("s", []), False,
            "MultiHostDataLoadIterator(TokenPipeline(...), prefetch=2) constructed -> first "
            "batch ready on the devices",
            "Roxxel(dir).open(); .stream(...); first batch ready (roxxel shuffles its block "
            "list in stream())", ours_below(50e-3, "50 ms"), scale=1e-3),
    ]  # fmt: skip


# ---- row 3: anonymous RSS ---------------------------------------------------------------------
# What "flat" means here. Noise: the kernel batches RSS counters per CPU, malloc grows and trims
# its heaps lazily (jumps of 2-3 MiB either way), and one batch of 6 int32 arrays is 768 KiB.
# Signal: anything per chunk or per block of a 1 TiB corpus would be tens of MiB.
RSS_FLAT_KIB = 4096
SETTLE_S = 0.2


def limit_malloc_arenas() -> bool:
    """glibc's mallopt(M_ARENA_MAX, 1): threads started from now on reuse existing arenas."""
    try:
        return bool(ctypes.CDLL(None).mallopt(-8, 1))  # M_ARENA_MAX = -8 in <malloc.h>
    except (OSError, AttributeError):
        return False


def bench_rss(cfg: Config, corpus: Corpus, tmp: str, throughput: dict) -> list[Row]:
    rows = []
    ours = throughput.get("grain_rox_jax", {})
    theirs = throughput.get("roxxel_stream", {})
    half = cfg.batches - cfg.batches // 2
    if ours:
        rows += [
            Row("3a", f"RssAnon: before -> after {cfg.batches} batches", "KiB",
                ours["rss_total"], theirs.get("rss_total", []), False,
                f"grain_rox_jax runs of row 1: RssAnon after the last of {cfg.batches} timed "
                "batches (iterator still open) minus before constructing the iterator",
                "the same in roxxel_stream's runs of row 1",
                note="includes the batches held in the prefetch queues (grain_rox: up to 3-4 "
                "batches of 6 arrays; roxxel: up to 5 of 1) and the new prefetch thread's glibc "
                "malloc arena (a few MiB, kept after the thread ends; see 3c)"),
            Row("3b", f"RssAnon growth over the last {half} batches", "KiB",
                ours["rss_second_half"], theirs.get("rss_second_half", []), False,
                "same runs as 3a: RssAnon after the last batch minus after the first half "
                "(queues already full: a leak shows here)",
                "the same in roxxel_stream's runs",
                ours_at_most(RSS_FLAT_KIB, f"{RSS_FLAT_KIB >> 10} MiB")),
        ]  # fmt: skip

    directory = os.path.join(tmp, "sparse")
    os.makedirs(directory)
    total = cfg.sparse_shards * cfg.sparse_shard_bytes
    size = f"{total / 2**40:g} TiB sparse ({cfg.sparse_shards} x {cfg.sparse_shard_bytes >> 30} GiB"
    size += f", blocks of {cfg.sparse_block_bytes >> 20} MiB)"
    reason = build_sparse(
        directory, cfg.sparse_shards, cfg.sparse_shard_bytes, cfg.sparse_block_bytes
    )
    if reason is not None:
        shutil.rmtree(directory)
        log(f"row 3c skipped: {reason}")
        rows.append(Row("3c", "RssAnon: open + first batch, 1 TiB", "KiB", [], [], False, "",
                        "", skipped=reason))  # fmt: skip
        return rows
    log(f"row 3: built {size}")
    # eos_id given so the sparse pipeline (no manifest) makes the same 6 arrays as the other.
    big = grain_rox.TokenPipeline(
        directory, seq_len=SEQ_LEN, global_batch_size=BATCH, seed=0, eos_id=EOS
    )
    small = grain_rox.TokenPipeline(
        corpus.directory, seq_len=SEQ_LEN, global_batch_size=BATCH, seed=0
    )

    def first_batch(p: grain_rox.TokenPipeline) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            before = status_kib()
            it = grain_rox.MultiHostDataLoadIterator(p, prefetch=2)
            batch = next(it)
            jax.block_until_ready(batch)
            time.sleep(SETTLE_S)  # let the producer fill its queue: the same state on both sides
            after = status_kib()
            assert set(batch) == set(MAXTEXT_FEATURES)
            it.close()
            del it, batch
            return {
                "rss": after["RssAnon"] - before["RssAnon"],
                "vm_gib": (after["VmSize"] - before["VmSize"]) / 2**20,
            }

        return run

    # glibc gives new threads new malloc arenas (up to 8 per core), and each keeps a few MiB
    # after its thread ends: every fresh prefetch thread would add that to one side's delta.
    arenas_limited = limit_malloc_arenas()
    contenders = {"big": first_batch(big), "small": first_batch(small)}
    warm_up(contenders)
    runs = interleave(cfg.runs_rss, contenders)
    shutil.rmtree(directory)
    log("row 3 done")
    b, s = runs["big"], runs["small"]
    vm = f"mapped address space (VmSize) added: ours {statistics.median(b['vm_gib']):,.0f} GiB, "
    vm += f"theirs {statistics.median(s['vm_gib']):,.1f} GiB"
    rows.append(
        Row("3c", "RssAnon: open + first batch, 1 TiB", "KiB", b["rss"], s["rss"], False,
            f"RssAnon after MultiHostDataLoadIterator(TokenPipeline(<{size}>, eos_id={EOS})) "
            f"+ first batch (+ {SETTLE_S} s for the prefetch queue to fill) minus before",
            f"the same on the {corpus.nbytes / 1e6:.0f} MB corpus of row 1",
            ours_within(RSS_FLAT_KIB, f"{RSS_FLAT_KIB >> 10} MiB"),
            note=f"{vm}; holes read as zero pages (file-backed, not anon); "
            + ("measured with mallopt(M_ARENA_MAX, 1): new threads reuse malloc arenas"
               if arenas_limited else "mallopt(M_ARENA_MAX) unavailable: +-4 MiB per new "
               "thread's malloc arena")),
    )  # fmt: skip
    return rows


# ---- row 4: row closeness ---------------------------------------------------------------------
def pair_distances(starts: np.ndarray) -> np.ndarray:
    """(n, k) row starts -> (n, k*(k-1)/2) distances between every two rows of a batch."""
    k = starts.shape[1]
    i, j = np.triu_indices(k, 1)
    return np.abs(starts[:, i] - starts[:, j])


def lanes_of(pipe: grain_rox.TokenPipeline) -> int | None:
    """The pipeline's lane count (from ``describe()``), for the notes."""
    try:
        lanes = pipe.describe()["lanes"]
        return int(next(iter(lanes.values())) if isinstance(lanes, dict) else lanes)
    except (KeyError, TypeError, ValueError, StopIteration):
        return None


def row_pieces(windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[start, end) position ranges of the contiguous pieces of a batch's (k, width) windows
    of positions (a row that crosses a chunk join has two)."""
    k, w = windows.shape
    r, c = np.nonzero(np.diff(windows, axis=1) != 1)
    rows = np.arange(k)
    first_r, first_c = np.concatenate([rows, r]), np.concatenate([np.zeros(k, np.int64), c + 1])
    last_r, last_c = np.concatenate([r, rows]), np.concatenate([c, np.full(k, w - 1)])
    f, g = np.lexsort((first_c, first_r)), np.lexsort((last_c, last_r))
    return windows[first_r[f], first_c[f]], windows[last_r[g], last_c[g]] + 1


def max_overlap(starts: np.ndarray, ends: np.ndarray) -> int:
    """The most tokens two of the ranges [starts, ends) share (ranges of one row never do)."""
    o = np.argsort(starts, kind="stable")
    s, e = starts[o], ends[o]
    shared = np.minimum(np.maximum.accumulate(e)[:-1], e[1:]) - s[1:]
    return max(0, int(shared.max(initial=0)))


def closeness(starts: np.ndarray, overlap: np.ndarray) -> dict[str, float]:
    """Statistics of (n, k) row starts and of (n,) most tokens two rows of a batch share."""
    d = pair_distances(starts.astype(np.int64))
    return {
        "min": float(d.min()),
        "p1": float(np.percentile(d, 1)),
        "nearest_median": float(np.median(d.min(axis=1))),
        "sharing_batches": float((overlap > 0).sum()),
        "one_token_batches": float((overlap == 1).sum()),
        "max_overlap": float(overlap.max()),
    }


def bench_closeness(cfg: Config, tmp: str) -> tuple[list[Row], dict]:
    directory = os.path.join(tmp, "positions")
    os.makedirs(directory)
    piece = 8 << 20
    grain_rox.write_rox(
        (
            np.arange(lo, min(lo + piece, cfg.close_tokens), dtype=np.uint32)
            for lo in range(0, cfg.close_tokens, piece)
        ),
        os.path.join(directory, "pos.rox"),
        dtype=np.uint32,
        max_shard_bytes=cfg.max_shard_bytes,
    )
    corpus = Corpus.scan(directory)
    read_through(corpus.paths)
    n = cfg.close_batches
    log(f"row 4: positions corpus of {cfg.close_tokens:,} uint32 tokens, {n:,} batches")
    lanes: list[int | None] = []
    crossing: list[int] = []

    def ours(seed: int) -> dict[str, float]:
        pipe = grain_rox.TokenPipeline(
            directory, seq_len=SEQ_LEN, global_batch_size=BATCH, seed=seed
        )
        src = pipe.batch_source()
        lanes.append(lanes_of(pipe))
        starts = np.empty((n, BATCH), np.int64)
        overlap = np.empty(n, np.int64)
        joined = 0
        for k in range(n):
            batch = src[k]
            windows = np.concatenate([batch["inputs"], batch["targets"][:, -1:]], axis=1)
            windows = windows.astype(np.int64)
            starts[k] = windows[:, 0]
            a, b = row_pieces(windows)
            joined += a.size - BATCH  # rows that cross a chunk join
            overlap[k] = max_overlap(a, b)
        crossing.append(joined)
        return closeness(starts, overlap)

    def theirs(seed: int) -> dict[str, float]:
        rng = np.random.default_rng(seed)
        starts = rng.integers(0, cfg.close_tokens - WIDTH + 1, (n, BATCH))
        overlap = np.array([max_overlap(s, s + WIDTH) for s in starts])
        return closeness(starts, overlap)

    seeds = iter(range(cfg.close_seeds))
    seeds2 = iter(range(cfg.close_seeds))
    runs = interleave(
        cfg.close_seeds, {"ours": lambda: ours(next(seeds)), "theirs": lambda: theirs(next(seeds2))}
    )
    shutil.rmtree(directory)
    log("row 4 done")
    o, t = runs["ours"], runs["theirs"]
    ours_is = (
        f"TokenPipeline(positions corpus, seq_len={SEQ_LEN}, global_batch_size={BATCH}, seed=s)"
        f".batch_source()[k], k < {n:,}; a row's start = its first token (= its position)"
    )
    theirs_is = "uniformly random starts, rng(s).integers per batch (what the floor samples)"
    med = statistics.median
    note = (
        f"runs = seeds 0..{cfg.close_seeds - 1}, {n:,} batches each; lanes {lanes[0]}"
        + (
            f" ({'a' if lanes[0] % BATCH == 0 else 'not a'} multiple of the batch {BATCH})"
            if lanes[0]
            else ""
        )
        + "; rows "
        f"crossing a chunk join: {med(crossing):g} of {n * BATCH:,}"
    )
    rows = [
        Row("4a", "closest two rows of a batch: min", "tokens", o["min"], t["min"], True,
            ours_is, theirs_is, note=note),
        Row("4b", "pairwise row distance: 1st percentile", "Mtok", o["p1"], t["p1"], True,
            "same runs as 4a: 1st percentile of all 496 pairwise start distances per batch",
            "same runs as 4a", scale=1e6),
        Row("4c", "closest two rows of a batch: median", "Mtok", o["nearest_median"],
            t["nearest_median"], True, "same runs as 4a: median over batches of the nearest "
            "pair's distance", "same runs as 4a", scale=1e6),
        Row("4d", "batches in which two rows share tokens", "batches",
            o["sharing_batches"], t["sharing_batches"], False,
            f"same runs as 4a: batches (of {n:,}) in which a token position occurs in two rows "
            "(exact, from the positions)", "same runs as 4a: overlapping random windows",
            note=f"ours: in {med(o['one_token_batches']):g} of them only single tokens (the "
            "last target of one row = the first input of another: consecutive windows of one "
            f"lane); most tokens two rows of a batch share: ours {max(o['max_overlap']):g}, "
            f"theirs {max(t['max_overlap']):g} (max over runs)"),
    ]  # fmt: skip
    return rows, {"lanes": lanes, "join_crossing_rows": crossing, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    args = arg_parser(__doc__, "pipeline", groups="1234", example="14").parse_args(argv)
    cfg = QUICK if args.quick else FULL
    info = machine(
        ("roxxel", "grain"),
        {
            "jax": jax.__version__,
            "jax_devices": jax.device_count(),
            "jax_platform": jax.devices()[0].platform,
        },
    )
    if info["jax_devices"] != N_DEVICES:
        log(f"warning: JAX sees {info['jax_devices']} devices, not {N_DEVICES} (was JAX imported "
            "before this module set XLA_FLAGS?)")  # fmt: skip
    roxxel = import_roxxel(required=False)
    started = time.perf_counter()
    print_header(
        f"grain_rox {info['grain_rox']} | grain {info['grain']} | roxxel {info['roxxel']} | "
        f"jax {info['jax']} ({info['jax_devices']} {info['jax_platform']} devices) | nproc "
        f"{info['nproc']} (usable {info['usable_cpus']}) | python {info['python']} | numpy "
        f"{info['numpy']}",
        info,
        cfg.quick,
        (cfg.runs_throughput, cfg.runs_latency, cfg.runs_rss, cfg.close_seeds),
        order="A, B, C, A, B, C",
        tail=f"; batches are ({BATCH}, {SEQ_LEN})",
    )
    rows: list[Row] = []
    extra: dict[str, Any] = {}
    with scratch_dir(args.tmpdir) as tmp:
        corpus = None
        if set(args.only) & set("123"):
            directory = os.path.join(tmp, "tokens")
            os.makedirs(directory)
            t0 = time.perf_counter()
            corpus = write_random_corpus(cfg, directory)
            read_through(corpus.paths)
            log(f"corpus: {corpus.num_tokens:,} uint16 tokens ({corpus.nbytes / 1e6:.0f} MB) in "
                f"{len(corpus.paths)} shards, written in {time.perf_counter() - t0:.1f} s; "
                "page cache warm")  # fmt: skip
        throughput: dict = {}
        if "1" in args.only and corpus is not None:
            r, throughput = bench_throughput(cfg, corpus, roxxel)
            rows += r
            extra["throughput_runs"] = throughput
        if "2" in args.only and corpus is not None:
            rows += bench_latency(cfg, corpus, roxxel)
        if "3" in args.only and corpus is not None:
            rows += bench_rss(cfg, corpus, tmp, throughput)
        if corpus is not None:
            shutil.rmtree(corpus.directory)
        if "4" in args.only:
            r, extra["closeness"] = bench_closeness(cfg, tmp)
            rows += r
    return finish(args.out, "pipeline", cfg, info, started, rows, extra)


if __name__ == "__main__":
    sys.exit(main())
