"""Benchmark grain_rox's HuggingFace source (``HFEagerSource``) against the usual ways to read it.

Run as ``python benchmarks/bench_hf.py [--quick]``. Every measurement is repeated (at least 3
times) with the contenders interleaved (A, B, C, A, B, C, ...) so that the noise of a shared
machine hits all alike; the table shows medians, ratios and the issue's targets
(``PASS``/``MISS``; a miss never fails the script). It is printed at the end and written as
JSON to ``bench_out/hf.json``.

The workload: one Parquet file with an ``input_ids`` column of fixed-length int32 lists
(1024 tokens a row; 8,192 rows = 8M tokens, ``--quick``: 1,024 rows), written once with
pyarrow and loaded through ``datasets.load_dataset("parquet", ...)`` (an Arrow cache file,
memory-mapped); batches of 32 rows in a shuffled order.

Rows (see benchmarks/README.md):

1. host throughput (batches/s): ``HFEagerSource.batches(32).to_iter_dataset(num_threads=0)``
   vs a ``with_format("numpy")`` loop over a permutation, vs plain Grain over the
   numpy-formatted dataset (default ``ReadOptions``), vs Datarax 0.1.4's ``HFEagerSource
   .get_batch(32)`` and vs a floor (numpy gathers straight from the memory-mapped Arrow
   chunks); and ours + ``jax.device_put`` on one
   device vs Datarax (whose batches are already ``jax.Array``s);
2. construction + first batch: wall time and anonymous memory (``RssAnon``) added, ours vs
   Datarax (which converts every row to a ``jax.Array`` at construction);
3. worker memory: ``VmRSS``, ``RssAnon`` and the resident part of the memory-mapped Arrow file
   of every Grain worker process, for ``grain.DataLoader(worker_count=2)`` over the record
   source and for ``batches(...).to_iter_dataset().mp_prefetch(num_workers=2)``, next to a
   probe process with the same imports (extra lines under the table; no ratios).

Datarax is optional: it is imported only if installed (``pip install flax jaxtyping tomli-w``
then ``pip install --no-deps datarax==0.1.4``: no TensorFlow); otherwise its rows are skipped.
Nothing is downloaded (``HF_HUB_OFFLINE=1``, ``HF_DATASETS_OFFLINE=1``, ``HF_HOME`` in the
temporary directory, which is removed at the end).
"""

from __future__ import annotations

import os

# 8 fake CPU devices, as in the tests and `nox -s bench`; before anything imports JAX. HF_HOME is
# set in main(), inside the run's temporary directory, before `datasets` is imported (worker
# processes re-import this module and inherit the environment).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import dataclasses
import gc
import glob
import multiprocessing
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grain
import numpy as np

import grain_rox

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for _harness, however this is run
from _harness import (
    Row,
    arg_parser,
    finish,
    interleave,
    log,
    machine,
    print_header,
    ratio_at_least,
    scratch_dir,
    settle,
    status_kib,
)

SEQ_LEN = 1024
BATCH = 32
VOCAB = 50257
KEY = "input_ids"
DATARAX_PIP = "pip install flax jaxtyping tomli-w && pip install --no-deps datarax==0.1.4"
DATARAX_BUDGET_S = 4.0  # at most this long per timed Datarax run (batches capped to fit)


# ---- configuration --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Config:
    quick: bool
    rows: int  # rows of the Parquet file, SEQ_LEN int32 tokens each
    batches: int  # timed batches per run: ours, the HF loop, the Arrow floor, ours + device_put
    plain_batches: int  # plain Grain (default ReadOptions): slow
    datarax_batches: int  # Datarax get_batch (capped to DATARAX_BUDGET_S per run)
    datarax_rows: int  # Datarax is built over the first rows only: its construction is superlinear
    runs: int
    runs_first: int  # row 2: ours' construction runs (Datarax's slow construction runs once)
    loader_batches: int  # row 3: batches through grain.DataLoader(worker_count=2) (record-level)
    prefetch_batches: int  # row 3: batches through mp_prefetch(num_workers=2)


FULL = Config(
    quick=False,
    rows=8192,
    batches=1000,
    plain_batches=200,
    datarax_batches=400,
    datarax_rows=4096,
    runs=5,
    runs_first=5,
    loader_batches=300,
    prefetch_batches=600,
)
QUICK = dataclasses.replace(
    FULL,
    quick=True,
    rows=1024,
    batches=200,
    plain_batches=60,
    datarax_batches=100,
    datarax_rows=1024,
    runs=3,
    runs_first=3,
    loader_batches=100,
    prefetch_batches=200,
)


# ---- helpers ----------------------------------------------------------------------------------
def write_parquet(path: str, rows: int) -> None:
    """``rows`` rows of SEQ_LEN random int32 ids in [0, VOCAB), column ``input_ids``
    (``list<int32>``, as ``datasets`` writes token ids)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    values = np.random.default_rng(0).integers(0, VOCAB, rows * SEQ_LEN, dtype=np.int32)
    offsets = np.arange(0, rows * SEQ_LEN + 1, SEQ_LEN, dtype=np.int32)
    column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    pq.write_table(pa.table({KEY: column}), path, row_group_size=1024)


def close_iterator(it: Any) -> None:
    """Close a Grain iterator (DataLoaderIterator has no close(); its dataset iterator has)."""
    for obj in (it, getattr(it, "_iterator", None)):
        closer = getattr(obj, "close", None)
        if callable(closer):
            closer()
            return


def rate(n: int, step: Callable[[], object]) -> float:
    """Batches per second of ``n`` calls of ``step``."""
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return n / (time.perf_counter() - t0)


class EpochOrder:
    """Batch k's rows for the hand-written loops: a new permutation every epoch."""

    def __init__(self, rows: int, seed: int = 0) -> None:
        self.rows, self.seed = rows, seed
        self.per_epoch = rows // BATCH
        self._perm: tuple[int, np.ndarray] = (-1, np.empty(0, np.int64))

    def __call__(self, k: int) -> np.ndarray:
        epoch, j = divmod(k, self.per_epoch)
        if self._perm[0] != epoch:
            self._perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.rows))
        return self._perm[1][j * BATCH : (j + 1) * BATCH]


class MmapRows:
    """The floor: numpy views of the memory-mapped Arrow chunks of a fixed-length list column
    (no copy), one fancy index per chunk a batch touches; int32 as stored."""

    def __init__(self, column: Any) -> None:
        self.views = []
        for chunk in column.chunks:
            offsets = chunk.offsets.to_numpy()
            assert (np.diff(offsets) == SEQ_LEN).all(), "rows of different lengths"
            flat = chunk.flatten().to_numpy(zero_copy_only=True)
            self.views.append(flat.reshape(-1, SEQ_LEN))
        self.starts = np.cumsum([0] + [len(v) for v in self.views[:-1]])

    def gather(self, rows: np.ndarray) -> np.ndarray:
        chunk = np.searchsorted(self.starts, rows, side="right") - 1
        out = np.empty((len(rows), SEQ_LEN), self.views[0].dtype)
        for c in np.unique(chunk):
            hit = chunk == c
            out[hit] = self.views[c][rows[hit] - self.starts[c]]
        return out


def import_datarax() -> tuple[Any, str | None]:
    """(datarax's HFEagerSource and HFEagerConfig, flax.nnx), or None and the reason."""
    try:
        from datarax.sources import HFEagerConfig, HFEagerSource
        from flax import nnx
    except ImportError as e:
        return None, f"datarax not installed ({DATARAX_PIP}): {e}"
    return (HFEagerSource, HFEagerConfig, nnx), None


# ---- process memory (/proc) -------------------------------------------------------------------
_MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


def proc_memory(pid: int, files: Sequence[str]) -> dict[str, float]:
    """VmRSS, RssAnon, RssFile, RssShmem (MiB) of ``pid`` and the resident part of its
    mappings of ``files`` (``arrow_map``, MiB, from /proc/<pid>/smaps)."""
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(value.split()[0]) / 1024
    wanted = {os.path.realpath(p) for p in files}
    mapped_kib = 0
    inside = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if _MAPPING.match(line):
                parts = line.split(maxsplit=5)
                inside = len(parts) == 6 and os.path.realpath(parts[5].strip()) in wanted
            elif inside and line.startswith("Rss:"):
                mapped_kib += int(line.split()[1])
    out["arrow_map"] = mapped_kib / 1024
    return out


def worker_pids(parent: int) -> list[int]:
    """The children of ``parent`` started by multiprocessing's spawn (not its resource
    tracker), found by scanning /proc/*/stat for their parent pid."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            pid = int(stat.split("/")[2])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if "spawn_main" in cmdline:
            found.append(pid)
    return sorted(found)


def _probe(source: Any, conn: Any) -> None:
    """A spawned process like a Grain worker (this module re-imported, the source unpickled):
    its memory after reading one row, then after reading every row once in batches of 32."""
    source.get_batch([0])
    first = proc_memory(os.getpid(), source.files)
    order = EpochOrder(len(source))
    for k in range(order.per_epoch):
        source.get_batch(order(k).tolist())
    conn.send({"opened": first, "read_all": proc_memory(os.getpid(), source.files)})
    conn.close()


# ---- rows 1 and 2: throughput, construction -----------------------------------------------------
@dataclasses.dataclass
class Fixture:
    path: str  # the Parquet file
    hf: Any  # datasets.Dataset over its Arrow cache (memory-mapped)
    source: Any  # grain_rox.HFEagerSource
    datarax: Any = None  # datarax's HFEagerSource, when installed
    datarax_first: dict[str, float] | None = None  # its construction: seconds, RssAnon KiB
    datarax_skip: str | None = None


def ours_first(fx: Fixture) -> Callable[[], dict[str, float]]:
    """Construction of ``HFEagerSource`` (Arrow cache warm) plus its first batch."""

    def run() -> dict[str, float]:
        before = status_kib()["RssAnon"]
        t0 = time.perf_counter()
        src = grain_rox.HFEagerSource(data_files=fx.path, include_keys=[KEY])
        it = iter(
            src.batches(BATCH, seed=0, num_epochs=None).to_iter_dataset(
                grain.ReadOptions(num_threads=0, prefetch_buffer_size=2)
            )
        )
        batch = next(it)
        dt = time.perf_counter() - t0
        rss = status_kib()["RssAnon"] - before
        assert batch[KEY].shape == (BATCH, SEQ_LEN), batch[KEY].shape
        close_iterator(it)
        return {"s": dt, "rss_kib": rss}

    return run


def datarax_rows(cfg: Config) -> int:
    return min(cfg.rows, cfg.datarax_rows)


def build_datarax(cfg: Config, fx: Fixture) -> None:
    """Datarax's HFEagerSource on the same Parquet file (offline), timed once. It converts every
    row to a jax.Array and then ``jnp.stack``s them: XLA compiles one concatenation with an
    operand per row, superlinear in the rows (8,192 rows took over 3 minutes on a 2-core
    machine), so it gets the first ``cfg.datarax_rows`` rows (``split="train[:N]"``)."""
    imported, fx.datarax_skip = import_datarax()
    if imported is None:
        log(fx.datarax_skip or "")
        return
    import jax

    source_cls, config_cls, nnx = imported
    n = datarax_rows(cfg)
    log(f"Datarax: building HFEagerSource over {n:,} rows (converts every row)")
    config = config_cls(
        name="parquet",
        split="train" if n == cfg.rows else f"train[:{n}]",
        download_kwargs={"data_files": fx.path},
        local_files_only=True,
        shuffle=True,
        seed=0,
        include_keys={KEY},
    )
    before = status_kib()["RssAnon"]
    t0 = time.perf_counter()
    src = source_cls(config, rngs=nnx.Rngs(0, shuffle=0))
    batch = jax.block_until_ready(src.get_batch(BATCH))
    dt = time.perf_counter() - t0
    fx.datarax_first = {"s": dt, "rss_kib": status_kib()["RssAnon"] - before}
    assert batch[KEY].shape == (BATCH, SEQ_LEN) and len(src) == n, (batch[KEY].shape, len(src))
    fx.datarax = src
    log(f"Datarax: built in {dt:.1f} s")


def bench_first(cfg: Config, fx: Fixture) -> tuple[list[Row], dict]:
    run = ours_first(fx)
    run()  # untimed: first-call costs
    ours: dict[str, list[float]] = {}
    for _ in range(cfg.runs_first):
        before = set(threading.enumerate())
        for metric, value in run().items():
            ours.setdefault(metric, []).append(value)
        settle(before, "ours_first")
    build_datarax(cfg, fx)
    theirs = fx.datarax_first or {}
    log("row 2 done")
    ours_is = (
        f"HFEagerSource(data_files=<parquet>, include_keys=['{KEY}']) (load_dataset, Arrow "
        "cache warm) + next(iter(.batches(32, seed=0).to_iter_dataset(num_threads=0)))"
    )
    n = datarax_rows(cfg)
    split = "train" if n == cfg.rows else f"train[:{n}]"
    theirs_is = (
        f"datarax HFEagerSource(HFEagerConfig(name='parquet', split='{split}', download_kwargs="
        "{'data_files': <parquet>}, local_files_only=True, shuffle=True, include_keys={'"
        f"{KEY}'}}), rngs=nnx.Rngs(0, shuffle=0)) + get_batch(32), once (slow)"
    )
    over = f"Datarax over {n:,} of the {cfg.rows:,} rows (its construction is superlinear); "
    rows = [
        Row("2a", "construction + first batch", "ms", ours.get("s", []),
            [theirs["s"]] if theirs else [], False, ours_is, theirs_is, scale=1e-3,
            skipped=fx.datarax_skip,
            note=over + "it loads the dataset twice (info, then data), converts every row with "
            "jnp.array(list) and jnp.stacks one operand per row (XLA compiles that concatenate)"),
        Row("2b", "RssAnon added by 2a", "MiB", ours.get("rss_kib", []),
            [theirs["rss_kib"]] if theirs else [], False, "same runs as 2a",
            "same run as 2a (the dataset becomes a jax.Array: a copy in anonymous memory)",
            scale=1024, skipped=fx.datarax_skip,
            note=f"the Arrow cache file is {arrow_bytes(fx) / 2**20:.1f} MiB; Datarax's {n:,} "
            f"rows are {n * SEQ_LEN * 4 / 2**20:.1f} MiB as int32"),
    ]  # fmt: skip
    return rows, {"ours": ours, "datarax": theirs}


def arrow_bytes(fx: Fixture) -> int:
    return sum(os.path.getsize(f) for f in fx.source.files)


def bench_throughput(cfg: Config, fx: Fixture) -> tuple[list[Row], dict]:
    import jax

    source, hf = fx.source, fx.hf
    hf_np = hf.with_format("numpy")
    column = hf.data.table.column(KEY)  # the memory-mapped Arrow column
    floor = MmapRows(column)
    device = jax.devices()[0]
    read = grain.ReadOptions(num_threads=0, prefetch_buffer_size=2)

    def ours(place: bool) -> Callable[[int], dict[str, float]]:
        def run(n: int) -> dict[str, float]:
            it = iter(source.batches(BATCH, seed=0, num_epochs=None).to_iter_dataset(read))
            if place:

                def step() -> None:
                    jax.block_until_ready(jax.device_put(next(it), device))

            else:
                step = it.__next__  # type: ignore[assignment]
            step()  # warm-up batch
            out = rate(n, step)
            close_iterator(it)
            return {"batches_per_s": out}

        return run

    def hf_loop(n: int) -> dict[str, float]:
        order = EpochOrder(len(hf_np))
        ks = iter(range(n + 1))
        step = lambda: hf_np[order(next(ks)).tolist()][KEY]  # noqa: E731
        step()
        return {"batches_per_s": rate(n, step)}

    def arrow_floor(n: int) -> dict[str, float]:
        order = EpochOrder(len(hf))
        ks = iter(range(n + 1))
        step = lambda: floor.gather(order(next(ks)))  # noqa: E731
        step()
        return {"batches_per_s": rate(n, step)}

    def plain(n: int) -> dict[str, float]:
        ds = grain.MapDataset.source(hf_np).shuffle(seed=0).repeat().batch(BATCH)
        it = iter(ds.to_iter_dataset())
        next(it)
        out = rate(n, lambda: next(it))
        close_iterator(it)
        return {"batches_per_s": out}

    def datarax(n: int) -> dict[str, float]:
        src = fx.datarax
        step = lambda: jax.block_until_ready(src.get_batch(BATCH))  # noqa: E731
        step()
        return {"batches_per_s": rate(n, step)}

    # Check once that the contenders produce what they claim.
    b = source.batches(BATCH, seed=0)[0]
    assert set(b) == {KEY} and b[KEY].shape == (BATCH, SEQ_LEN), {k: v.shape for k, v in b.items()}
    ours_dtype = b[KEY].dtype
    # Which rows batch 0 holds, found by content (random tokens: 8 identify a row).
    where = {
        row[:8].tobytes(): int(start) + i
        for view, start in zip(floor.views, floor.starts, strict=True)
        for i, row in enumerate(view)
    }
    rows_0 = np.array([where[row[:8].astype(np.int32).tobytes()] for row in b[KEY]])
    del where
    assert len(set(rows_0.tolist())) == BATCH, rows_0
    assert np.array_equal(b[KEY], floor.gather(rows_0))
    assert np.array_equal(b[KEY], hf_np[rows_0.tolist()][KEY])

    counts = {"ours_numpy": cfg.batches, "ours_device_put": cfg.batches, "hf_loop": cfg.batches,
              "arrow_floor": cfg.batches, "grain_plain": cfg.plain_batches}  # fmt: skip
    contenders: dict[str, Callable[[int], dict[str, float]]] = {
        "ours_numpy": ours(False),
        "ours_device_put": ours(True),
        "hf_loop": hf_loop,
        "arrow_floor": arrow_floor,
        "grain_plain": plain,
    }
    if fx.datarax is not None:
        contenders["datarax"] = datarax
        counts["datarax"] = cfg.datarax_batches
    log(f"row 1: warm-up ({', '.join(contenders)})")
    for name, fn in contenders.items():
        before = set(threading.enumerate())
        warm = fn(max(2, min(counts[name] // 10, 50)))
        settle(before, name)
        if name == "datarax":  # cap its batches to the time budget
            fit = int(DATARAX_BUDGET_S * warm["batches_per_s"])
            counts[name] = max(10, min(counts[name], fit))
    log(f"row 1: {cfg.runs} interleaved runs; batches per run: {counts}")
    runs = interleave(
        cfg.runs, {name: (lambda fn=fn, n=counts[name]: fn(n)) for name, fn in contenders.items()}
    )
    log("row 1 done")

    def bps(name: str) -> list[float]:
        return runs[name]["batches_per_s"] if name in runs else []

    ours_is = (
        f"iter(HFEagerSource(data_files=<parquet>, include_keys=['{KEY}']).batches({BATCH}, "
        "seed=0, num_epochs=None).to_iter_dataset(ReadOptions(num_threads=0, "
        f"prefetch_buffer_size=2))): one Arrow take per batch, ({BATCH}, {SEQ_LEN}) {ours_dtype}"
    )
    hf_is = (
        "ds = load_dataset('parquet', data_files=<parquet>, split='train').with_format('numpy'); "
        f"ds[perm[k*{BATCH}:(k+1)*{BATCH}].tolist()]['{KEY}'] (a new permutation every epoch)"
    )
    plain_is = (
        f"iter(grain.MapDataset.source(ds).shuffle(seed=0).repeat().batch({BATCH})"
        ".to_iter_dataset()): one row per record, default ReadOptions (16 threads, 500 records "
        "of prefetch); repeat() only so that a run may span epochs"
    )
    datarax_is = (
        f"datarax HFEagerSource(shuffle=True, seed=0).get_batch({BATCH}) (stateful) + "
        "jax.block_until_ready: int32 jax.Arrays gathered on device 0 (built in row 2a over "
        f"the first {datarax_rows(cfg):,} rows)"
    )
    floor_is = (
        f"numpy views of the memory-mapped Arrow chunks of ds.data.table.column('{KEY}') (no "
        "copy), one fancy index per chunk the batch's rows fall in: int32 as stored, no "
        "datasets formatting"
    )
    size = f"{cfg.rows:,} rows x {SEQ_LEN} int32 ({arrow_bytes(fx) / 2**20:.1f} MiB Arrow cache)"
    dx_note = ""
    if "datarax" in counts:
        dx_note = f"datarax: {counts['datarax']} timed batches per run"
        if counts["datarax"] < cfg.datarax_batches:
            dx_note += f" (capped from {cfg.datarax_batches} to fit {DATARAX_BUDGET_S:g} s)"
    rows = [
        Row("1a", "ours / HF with_format('numpy') loop", "batch/s", bps("ours_numpy"),
            bps("hf_loop"), True, ours_is, hf_is, ratio_at_least(1.0),
            note=f"{cfg.batches} timed batches per run after 1 warm-up batch; {size}; "
            f"both return {ours_dtype} (datasets' numpy formatter casts integers to int64)"),
        Row("1b", "ours / plain Grain (defaults)", "batch/s", bps("ours_numpy"),
            bps("grain_plain"), True, "same runs as 1a", plain_is,
            note=f"grain_plain: {cfg.plain_batches} timed batches per run (up to ~16 of them "
            "may come from the prefetch buffer filled before the clock starts)"),
        Row("1c", "ours / Datarax get_batch", "batch/s", bps("ours_numpy"), bps("datarax"),
            True, "same runs as 1a (host numpy batches)", datarax_is, ratio_at_least(5),
            skipped=fx.datarax_skip, note=dx_note),
        Row("1d", "ours / Arrow-mmap numpy gather floor", "batch/s", bps("ours_numpy"), bps("arrow_floor"),
            True, "same runs as 1a", floor_is,
            note=f"diagnostic: the same rows straight from the mapped file; {len(floor.views)} "
            "Arrow chunks"),
        Row("1e", "ours + device_put / Datarax get_batch", "batch/s", bps("ours_device_put"),
            bps("datarax"), True,
            "as 1a, then jax.block_until_ready(jax.device_put(batch, jax.devices()[0])) "
            "(int64 -> int32 jax.Array)", "same runs as 1c (batches already jax.Arrays)",
            skipped=fx.datarax_skip),
    ]  # fmt: skip
    return rows, runs


# ---- row 3: worker memory -----------------------------------------------------------------------
def workers_memory(
    label: str, make_iter: Callable[[], Any], n: int, files: Sequence[str]
) -> dict[str, Any]:
    """Start ``make_iter()``, read its first batch and ``n`` more, then the memory of every
    spawned child process; close it."""
    t0 = time.perf_counter()
    it = make_iter()
    first = next(it)
    startup = time.perf_counter() - t0
    assert first[KEY].shape == (BATCH, SEQ_LEN), first[KEY].shape
    speed = rate(n, it.__next__)
    pids = worker_pids(os.getpid())
    memory = [{"pid": pid, **proc_memory(pid, files)} for pid in pids]
    close_iterator(it)
    del it, first
    gc.collect()
    log(f"row 3: {label}: {len(pids)} workers, first batch after {startup:.1f} s, "
        f"{speed:.1f} batches/s")  # fmt: skip
    return {"batches": n, "startup_s": startup, "batches_per_s": speed, "workers": memory}


def bench_workers(cfg: Config, fx: Fixture) -> tuple[str, dict]:
    from grain_rox._sources._grain_setup import ensure_absl_flags_parsed

    ensure_absl_flags_parsed()  # Grain's worker processes read absl flags
    source = fx.source
    files = source.files
    out: dict[str, Any] = {"arrow_bytes": arrow_bytes(fx), "files": files}

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    t0 = time.perf_counter()
    probe = ctx.Process(target=_probe, args=(source, child))
    probe.start()
    out["probe"] = parent.recv()
    probe.join()
    log(f"row 3: probe done in {time.perf_counter() - t0:.1f} s")

    def loader() -> Any:
        return iter(
            grain.DataLoader(
                data_source=source,
                sampler=grain.samplers.IndexSampler(
                    num_records=len(source), shuffle=True, seed=0, num_epochs=None
                ),
                operations=[grain.transforms.Batch(BATCH)],
                worker_count=2,
            )
        )

    def prefetch() -> Any:
        ds = source.batches(BATCH, seed=0, num_epochs=None).to_iter_dataset(
            grain.ReadOptions(num_threads=0, prefetch_buffer_size=2)
        )
        return iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))

    before = set(threading.enumerate())
    out["dataloader"] = workers_memory("DataLoader", loader, cfg.loader_batches, files)
    settle(before | shared_memory_pool(), "DataLoader", timeout=10)
    before = set(threading.enumerate())
    out["mp_prefetch"] = workers_memory("mp_prefetch", prefetch, cfg.prefetch_batches, files)
    settle(before, "mp_prefetch", timeout=10)
    return render_workers(cfg, out), out


def shared_memory_pool() -> set[threading.Thread]:
    """The threads of the pool Grain starts once per process to delete shared-memory batches
    (``SharedMemoryArray.enable_async_del``, used by ``DataLoader``): they live until exit."""
    try:
        from grain._src.python.ipc.shared_memory_array import SharedMemoryArray
    except ImportError:
        return set()
    pool = getattr(SharedMemoryArray, "_del_thread_pool", None)
    names = ("_worker_handler", "_task_handler", "_result_handler")
    threads = [*getattr(pool, "_pool", ()), *(getattr(pool, n, None) for n in names)]
    return {t for t in threads if isinstance(t, threading.Thread)}


def render_workers(cfg: Config, out: dict[str, Any]) -> str:
    header = ("process", "VmRSS", "RssAnon", "RssFile", "Arrow map", "batch/s", "startup s")
    lines: list[tuple[str, ...]] = []
    for key, label in (
        ("dataloader", f"DataLoader(record source, Batch(32), worker_count=2), "
                       f"{cfg.loader_batches} batches"),
        ("mp_prefetch", f"batches(32).to_iter_dataset().mp_prefetch(num_workers=2), "
                        f"{cfg.prefetch_batches} batches"),
    ):  # fmt: skip
        r = out[key]
        for i, w in enumerate(r["workers"]):
            lines.append((f"{label}: worker {i} (pid {w['pid']})", f"{w['VmRSS']:.0f}",
                          f"{w['RssAnon']:.0f}", f"{w['RssFile']:.0f}", f"{w['arrow_map']:.1f}",
                          f"{r['batches_per_s']:.1f}", f"{r['startup_s']:.1f}"))  # fmt: skip
        if not r["workers"]:
            lines.append((f"{label}: no worker process found", "-", "-", "-", "-", "-", "-"))
    for key, label in (
        ("opened", "probe: same imports, source unpickled, 1 row read"),
        ("read_all", "probe: then every row read once (get_batch of 32)"),
    ):
        m = out["probe"][key]
        lines.append((label, f"{m['VmRSS']:.0f}", f"{m['RssAnon']:.0f}", f"{m['RssFile']:.0f}",
                      f"{m['arrow_map']:.1f}", "-", "-"))  # fmt: skip
    cells = [header, *lines]
    widths = [max(len(c[j]) for c in cells) for j in range(len(header))]
    text = [
        "Worker memory (MiB, from /proc/<pid>/status and /proc/<pid>/smaps; 'Arrow map' = the "
        "resident part of the worker's memory mapping of the Arrow cache file, "
        f"{out['arrow_bytes'] / 2**20:.1f} MiB, shared page cache):"
    ]
    text += [
        "  " + "  ".join(x.ljust(w) if j == 0 else x.rjust(w)
                         for j, (x, w) in enumerate(zip(c, widths, strict=True)))
        for c in cells
    ]  # fmt: skip
    text.append(
        "  RssAnon is anonymous memory (Python, NumPy/JAX/Grain/datasets, Grain's buffers); the "
        "rows read come from the file mapping (file-backed, counted in RssFile), not copies."
    )
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    parser = arg_parser(__doc__, "hf", groups="123", example="12")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    started = time.perf_counter()
    rows: list[Row] = []
    extra: dict[str, Any] = {}
    appendix: list[str] = []
    with scratch_dir(args.tmpdir) as tmp:
        os.environ["HF_HOME"] = os.path.join(tmp, "hf_home")  # before `datasets` is imported
        import datasets
        import jax

        datasets.disable_progress_bars()
        info = machine(
            ("grain", "datasets", "pyarrow", "datarax"),
            {"jax": jax.__version__, "jax_devices": jax.device_count()},
        )
        print_header(
            f"grain_rox {info['grain_rox']} | grain {info['grain']} | datasets "
            f"{info['datasets']} | pyarrow {info['pyarrow']} | datarax {info['datarax']} | jax "
            f"{info['jax']} ({info['jax_devices']} devices) | nproc {info['nproc']} (usable "
            f"{info['usable_cpus']}) | python {info['python']} | numpy {info['numpy']}",
            info,
            cfg.quick,
            (cfg.runs, cfg.runs_first),
            order="A, B, C, A, B, C",
        )
        t0 = time.perf_counter()
        path = os.path.join(tmp, "train.parquet")
        write_parquet(path, cfg.rows)
        hf = datasets.load_dataset("parquet", data_files=path, split="train")
        source = grain_rox.HFEagerSource(data_files=path, include_keys=[KEY])
        fx = Fixture(path=path, hf=hf, source=source)
        log(f"Parquet file of {cfg.rows:,} x {SEQ_LEN} int32 tokens written and loaded in "
            f"{time.perf_counter() - t0:.1f} s; Arrow cache {arrow_bytes(fx) / 2**20:.1f} MiB")  # fmt: skip
        if set(args.only) & set("12"):
            if "2" in args.only:
                r, extra["first_batch"] = bench_first(cfg, fx)
                rows += r
            else:
                build_datarax(cfg, fx)
            if "1" in args.only:
                r, extra["throughput"] = bench_throughput(cfg, fx)
                rows = r + rows
        if "3" in args.only:
            text, extra["workers"] = bench_workers(cfg, fx)
            appendix.append(text)
        extra["datarax_install"] = DATARAX_PIP
        fx.datarax = None
        del fx, hf, source
    return finish(args.out, "hf", cfg, info, started, rows, extra, appendix=appendix)


if __name__ == "__main__":
    sys.exit(main())
