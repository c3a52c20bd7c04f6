"""Benchmark grain_rox's source mixing, deep curriculum resume and document packing.

Run as ``python benchmarks/bench_mixing.py [--quick]``. Every measurement is repeated (at
least 3 times) with the contenders interleaved (A, B, C, A, B, C, ...) so that the noise of a
shared machine hits all alike; the table shows medians, ratios and the issue's targets
(``PASS``/``MISS``; a miss never fails the script). It is printed at the end and written as
JSON to ``bench_out/mixing.json``.

Rows (see benchmarks/README.md):

1. the cost of mixing: host batches/s of ``batch_source()[k]`` for a 3-source, 2-phase
   mixture vs one unmixed source (and, on a miss, a cProfile of the mixed reads);
2. resuming deep in a 5-phase x 3-source schedule: ``batch_source(first_step=10**9)[0]`` and
   ``src[10**9]`` on a built source;
3. document packing on the embedded prose corpus: packed batches/s and padding efficiency of
   packing in the global order (``TokenPipeline(packing="best_fit")``) and of the per-host
   ``pack_documents`` (best-fit, first-fit) vs Grain's first-fit packer used directly and vs
   concat-then-split windows (``TokenPipeline``); and a packed pipeline's cold lookup at step
   10**9.

All data lives in a temporary directory that is removed at the end; nothing is downloaded.
"""

from __future__ import annotations

import os

# 8 fake CPU devices, as in the tests and `nox -s bench`; before anything imports JAX.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ["JAX_PLATFORMS"] = "cpu"

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grain
import numpy as np

import grain_rox
from grain_rox import Phase, TokenPipeline

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for _harness, however this is run
from _harness import (
    Row,
    arg_parser,
    finish,
    interleave,
    log,
    machine,
    ours_below,
    print_header,
    profile_top,
    ratio_at_least,
    read_through,
    render_profile,
    scratch_dir,
    warm_up,
)

SEQ_LEN = 1024
BATCH = 32
VOCAB = 50257
EOS = 0  # the separator of the random corpora
NAMES = ("a", "b", "c")
FAR = 10**9


# ---- configuration --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Config:
    quick: bool
    source_tokens: tuple[int, int, int]  # rows 1-2: random uint16 tokens of sources a, b, c
    batches: int  # row 1: timed batches per run (after one warm-up batch)
    runs_mixing: int
    lookups: int  # row 2b: lookups per run (each at a fresh step)
    runs_resume: int
    prose_docs: int | None  # row 3: documents of the embedded prose corpus (None: all)
    pack_seq_lens: tuple[int, ...]
    runs_packing: int


FULL = Config(
    quick=False,
    source_tokens=(30_000_000, 20_000_000, 10_000_000),
    batches=2000,
    runs_mixing=5,
    lookups=20,
    runs_resume=9,
    prose_docs=None,
    pack_seq_lens=(512, 1024),
    runs_packing=5,
)
QUICK = dataclasses.replace(
    FULL,
    quick=True,
    source_tokens=(3_000_000, 2_000_000, 1_000_000),
    batches=300,
    runs_mixing=3,
    lookups=10,
    runs_resume=5,
    prose_docs=400,
    runs_packing=3,
)


def mixed_phases(batches: int) -> list[Phase]:
    """Row 1: two phases of (BATCH, SEQ_LEN) batches; the timed batches cross the boundary."""
    return [
        Phase(batches // 2, BATCH, SEQ_LEN, weights={"a": 0.5, "b": 0.3, "c": 0.2}),
        Phase(None, BATCH, SEQ_LEN, weights={"a": 0.2, "b": 0.3, "c": 0.5}),
    ]


def deep_phases() -> list[Phase]:
    """Row 2: 5 phases x 3 sources with huge step counts; step 10**9 lies in the last."""
    return [
        Phase(10**8, 32, 1024, weights={"a": 0.5, "b": 0.3, "c": 0.2}),
        Phase(3 * 10**8, 64, 512, weights={"a": 0.2, "b": 0.3, "c": 0.5}),
        Phase(10**8, 16, 2048, weights={"a": 0.6, "b": 0.2, "c": 0.2}),
        Phase(2 * 10**8, 32, 1024, weights={"a": 0.1, "b": 0.1, "c": 0.8}),
        Phase(None, 48, 256, weights={"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}),
    ]


# ---- helpers ----------------------------------------------------------------------------------
def write_sources(cfg: Config, directory: str) -> dict[str, str]:
    """One `.rox` file per source: random uint16 ids in [0, VOCAB), EOS-separated every 1M."""
    paths = {}
    piece = 1 << 20
    for i, (name, n) in enumerate(zip(NAMES, cfg.source_tokens, strict=True)):
        rng = np.random.default_rng(i)

        def items(n: int = n, rng: np.random.Generator = rng) -> Iterator[np.ndarray]:
            for lo in range(0, n, piece):
                yield rng.integers(0, VOCAB, min(piece, n - lo), dtype=np.uint16)

        path = os.path.join(directory, f"{name}.rox")
        grain_rox.write_rox(items(), path, separator=EOS)
        paths[name] = path
    read_through(list(paths.values()))
    return paths


# ---- row 1: mixing overhead -------------------------------------------------------------------
def bench_mixing(cfg: Config, paths: dict[str, str], force_profile: bool) -> tuple[list[Row], dict]:
    n = cfg.batches
    phases = mixed_phases(n)

    def unmixed(seg: bool) -> TokenPipeline:
        return TokenPipeline(
            paths["a"], seq_len=SEQ_LEN, global_batch_size=BATCH, seed=0, segmentation=seg
        )

    def mixed(seg: bool) -> TokenPipeline:
        return TokenPipeline(paths, phases=phases, seed=0, segmentation=seg)

    def reads(pipe: TokenPipeline) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            src = pipe.batch_source()  # fresh: no round plans cached from an earlier run
            src[0]
            t0 = time.perf_counter()
            for k in range(1, n + 1):
                src[k]
            return {"batches_per_s": n / (time.perf_counter() - t0)}

        return run

    def bookkeeping(pipe: TokenPipeline) -> Callable[[], dict[str, float]]:
        schedule = pipe.schedule

        def run() -> dict[str, float]:
            t0 = time.perf_counter()
            for k in range(1, n + 1):
                schedule.step_rows(k, 0, BATCH)
            return {"us_per_batch": 1e6 * (time.perf_counter() - t0) / n}

        return run

    # Checks: the mixed batches are what they say (shapes, features, proportions).
    src = mixed(True).batch_source()
    b = src[0]
    assert b["inputs"].shape == (BATCH, SEQ_LEN) and "inputs_segmentation" in b, sorted(b)
    drawn = np.bincount(np.concatenate([src.sources_of(k) for k in range(n)]), minlength=3)
    units = [o.num_blocks if o.name == "blocks" else o.lanes for o in src.orders]

    contenders = {
        "unmixed": reads(unmixed(True)),
        "mixed": reads(mixed(True)),
        "unmixed_noseg": reads(unmixed(False)),
        "mixed_noseg": reads(mixed(False)),
    }
    warm_up(contenders)
    runs = interleave(cfg.runs_mixing, contenders)
    book = {"unmixed": bookkeeping(unmixed(True)), "mixed": bookkeeping(mixed(True))}
    warm_up(book)
    book_runs = interleave(cfg.runs_mixing, book)
    log("row 1 done")
    sizes = "/".join(f"{t / 1e6:g}M" for t in cfg.source_tokens)
    row = Row(
        "1a", f"mixed vs unmixed, ({BATCH}, {SEQ_LEN}) batches", "batch/s",
        runs["mixed"]["batches_per_s"], runs["unmixed"]["batches_per_s"], True,
        f"TokenPipeline({{a, b, c}}: {sizes} tokens, phases=[Phase({n // 2}, {BATCH}, {SEQ_LEN}, "
        f".5/.3/.2), Phase(None, ..., .2/.3/.5)]).batch_source()[k], k = 1..{n} (crosses the "
        f"boundary at k = {n // 2})",
        f"TokenPipeline(a, seq_len={SEQ_LEN}, global_batch_size={BATCH}).batch_source()[k], "
        f"k = 1..{n}",
        ratio_at_least(0.8),
        note=f"rows drawn per source over k < {n}: a/b/c = {'/'.join(map(str, drawn))}; {src.orders[0].name} "
        f"a/b/c = {'/'.join(map(str, units))}; each run builds a fresh source and reads [0] first",
    )  # fmt: skip
    rows = [
        row,
        Row("1b", "the same, segmentation=False", "batch/s",
            runs["mixed_noseg"]["batches_per_s"], runs["unmixed_noseg"]["batches_per_s"], True,
            "as 1a with segmentation=False (inputs/targets only: no segment_features)",
            "as 1a with segmentation=False"),
        Row("1c", "mixing bookkeeping: step_rows", "us/batch",
            book_runs["mixed"]["us_per_batch"], book_runs["unmixed"]["us_per_batch"], False,
            f"Schedule.step_rows(k, 0, {BATCH}) of 1a's mixed schedule (each row's source and "
            f"sample number, and each source's rows), k = 1..{n}",
            "the same for the unmixed single-source schedule"),
    ]  # fmt: skip
    details: dict[str, Any] = {"runs": runs, "bookkeeping_runs": book_runs, "units": units}
    if force_profile or row.verdict == "MISS":
        log("row 1a: profiling the mixed reads")

        def one_pass(pipe: TokenPipeline) -> Callable[[], None]:
            def run() -> None:
                s = pipe.batch_source()
                for k in range(n + 1):
                    s[k]

            return run

        details["profile_mixed"] = profile_top(one_pass(mixed(True)))
        details["profile_unmixed"] = profile_top(one_pass(unmixed(True)))
    return rows, details


# ---- row 2: resume deep in a schedule -----------------------------------------------------------
def bench_resume(cfg: Config, paths: dict[str, str]) -> list[Row]:
    pipe = TokenPipeline(paths, phases=deep_phases(), seed=0)

    def resume(step: int) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            t0 = time.perf_counter()
            src = pipe.batch_source(first_step=step)
            src[0]
            return {"s": time.perf_counter() - t0}

        return run

    built = pipe.batch_source()
    counter = {"far": 0, "near": 0}

    def lookup(kind: str, base: int, spacing: int) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            # Fresh steps every run, far apart: every lookup plans a new round (no cache hit).
            first = counter[kind]
            counter[kind] += cfg.lookups
            steps = [base + (first + i) * spacing for i in range(cfg.lookups)]
            t0 = time.perf_counter()
            for s in steps:
                built[s]
            return {"s": (time.perf_counter() - t0) / cfg.lookups}

        return run

    far_batch = pipe.batch_source(first_step=FAR)[0]
    same = all(
        np.array_equal(far_batch[k], v) for k, v in pipe.batch_source()[FAR].items()
    ) and set(far_batch) == set(built[FAR])
    phase = built.schedule.phase_of_step(FAR)
    shape = far_batch["inputs"].shape
    contenders = {"far": resume(FAR), "near": resume(10)}
    warm_up(contenders)
    res = interleave(cfg.runs_resume, contenders)
    lookups = {"far": lookup("far", FAR, 1_000_003), "near": lookup("near", 10, 1009)}
    warm_up(lookups)
    look = interleave(cfg.runs_resume, lookups)
    log("row 2 done")
    sched = (
        "5 phases x 3 sources (steps 1e8, 3e8, 1e8, 2e8, None; batch 32/64/16/32/48, "
        "seq_len 1024/512/2048/1024/256)"
    )
    return [
        Row("2a", "resume at step 10**9: build + [0]", "ms", res["far"]["s"], res["near"]["s"],
            False,
            f"TokenPipeline({sched}).batch_source(first_step=10**9)[0]: opens the 3 sources, "
            "builds the schedule and lane orders, reads batch 0",
            "the same with first_step=10", ours_below(10e-3, "10 ms"), scale=1e-3,
            note=f"step 10**9 is in phase {phase} (0-based), batch {shape}; "
            f"batch_source(first_step=10**9)[0] == batch_source()[10**9]: {same}"),
        Row("2b", "lookup src[10**9] on a built source", "ms", look["far"]["s"],
            look["near"]["s"], False,
            f"src = batch_source() built once; src[10**9 + i * 1000003], {cfg.lookups} fresh "
            "steps per run (each plans new lane rounds)",
            "src[10 + i * 1009] (phase 0: (32, 1024) batches, vs (48, 256) at 10**9)",
            ours_below(10e-3, "10 ms"), scale=1e-3),
    ]  # fmt: skip


# ---- row 3: packing -----------------------------------------------------------------------------
GRAIN_SEG = "inputs_segment_ids"  # Grain's packers' name for what grain_rox calls *_segmentation


def packed(
    make: Callable[[], Any], length: int, seg_key: str = "inputs_segmentation"
) -> Callable[[], dict[str, float]]:
    """A contender: iterate ``make()`` (one epoch of batches), timed from construction on."""

    def run() -> dict[str, float]:
        t0 = time.perf_counter()
        segs = [batch[seg_key] for batch in make()]
        dt = time.perf_counter() - t0
        assert segs and segs[0].shape == (BATCH, length), segs[0].shape if segs else None
        eff = grain_rox.padding_efficiency([{"inputs_segmentation": s} for s in segs])
        return {"batches_per_s": len(segs) / dt, "efficiency": eff, "batches": len(segs)}

    return run


def ours_packer(source: Any, length: int, method: str) -> Callable[[], Any]:
    return lambda: grain_rox.pack_documents(
        source, seq_len=length, batch_size=BATCH, seed=0, num_epochs=1, method=method
    )


def grain_first_fit(
    source: Any, length: int, options: grain.ReadOptions | None
) -> Callable[[], Any]:
    """Grain's first-fit packer used directly, as its docs show (``options=None``: defaults)."""

    def make() -> Any:
        ds = grain.MapDataset.source(source).shuffle(seed=0)
        it = ds.to_iter_dataset() if options is None else ds.to_iter_dataset(options)
        return grain.experimental.FirstFitPackIterDataset(
            it, length_struct={"inputs": length, "targets": length}, num_packing_bins=BATCH
        ).batch(BATCH, drop_remainder=True)

    return make


def concat_split(path: str, length: int) -> Callable[[], Any]:
    """Concat-then-split: one epoch of TokenPipeline windows (no padding by construction)."""

    def make() -> Any:
        pipe = TokenPipeline(path, seq_len=length, global_batch_size=BATCH, seed=0, num_epochs=1)
        src = pipe.batch_source()
        return (src[k] for k in range(len(src)))

    return make


def global_packing(path: str, length: int) -> Callable[[], Any]:
    """Packing in the global order: one epoch of ``TokenPipeline(packing="best_fit")``."""

    def make() -> Any:
        pipe = TokenPipeline(path, seq_len=length, global_batch_size=BATCH, seed=0, num_epochs=1,
                             packing="best_fit")  # fmt: skip
        src = pipe.batch_source()
        return (src[k] for k in range(len(src)))

    return make


def packed_resume(path: str, length: int, runs: int) -> tuple[list[float], list[float], int]:
    """Seconds of ``src[step]`` at fresh steps near 10**9 and near 10 on a built packed source
    (each lookup packs the chunks it reads: nothing cached), and the pack cache's bytes."""
    pipe = TokenPipeline(path, seq_len=length, global_batch_size=BATCH, seed=0,
                         packing="best_fit")  # fmt: skip
    src = pipe.batch_source()
    src[0]
    far, near = [], []
    for i in range(runs):
        for base, out in ((FAR, far), (10, near)):
            order = pipe.plan.orders[0]
            order._start_process_local()  # a cold pack cache: every chunk read is packed
            t0 = time.perf_counter()
            src[base + 7919 * (i + 1)]
            out.append(time.perf_counter() - t0)
    return far, near, pipe.plan.orders[0]._packed_bytes


def bench_packing(cfg: Config, tmp: str) -> tuple[list[Row], dict]:
    t0 = time.perf_counter()
    docs = list(grain_rox.builtin_documents("prose", limit=cfg.prose_docs))
    path = os.path.join(tmp, "prose.rox")
    written = grain_rox.write_rox(docs, path, tokenizer="bytes")
    read_through(list(written.paths))
    log(f"row 3: prose corpus, {len(docs):,} documents, {written.num_tokens:,} tokens, made in "
        f"{time.perf_counter() - t0:.1f} s")  # fmt: skip
    rows: list[Row] = []
    details: dict[str, Any] = {"documents": len(docs), "tokens": written.num_tokens}
    for length in cfg.pack_seq_lens:
        source = grain_rox.RoxDocumentSource(path, seq_len=length)
        pieces = len(source)  # builds the document index outside the timings

        no_threads = grain.ReadOptions(num_threads=0, prefetch_buffer_size=64)
        contenders = {
            "best_fit": packed(ours_packer(source, length, "best_fit"), length),
            "first_fit": packed(ours_packer(source, length, "first_fit"), length),
            "grain_ff": packed(grain_first_fit(source, length, None), length, GRAIN_SEG),
            "grain_ff_nothreads": packed(
                grain_first_fit(source, length, no_threads), length, GRAIN_SEG
            ),
            "concat": packed(concat_split(path, length), length),
            "global": packed(global_packing(path, length), length),
        }
        if length == cfg.pack_seq_lens[0]:
            warm_up(contenders)
        runs = interleave(cfg.runs_packing, contenders)
        details[f"seq_len_{length}"] = {"pieces": pieces, "runs": runs}
        log(f"row 3, seq_len {length} done")
        med = {name: {m: statistics.median(v) for m, v in r.items()} for name, r in runs.items()}
        nb = {name: int(m["batches"]) for name, m in med.items()}
        first = length == cfg.pack_seq_lens[0]
        for key, what, metric, o, t in PACK_ROWS:
            note = f"batches per epoch: {o} {nb[o]}, {t} {nb[t]}"
            if key == "3a":
                note += f"; {pieces:,} document pieces of <= {length + 1} tokens"
            if metric == "efficiency" and t == "grain_ff":
                same = runs[o]["efficiency"] == runs[t]["efficiency"]
                note = f"{o} == {t} in every run: {same}"
            if key == "3e":
                same = runs["best_fit"]["efficiency"] == runs["first_fit"]["efficiency"]
                note += f"; best_fit == first_fit: {same}"
            if first:
                ours_is, theirs_is = (
                    pack_legend(o, length, len(docs), written.num_tokens),
                    (pack_legend(t, length, len(docs), written.num_tokens)),
                )
                if metric == "efficiency":
                    ours_is = theirs_is = "the same runs as the batches/s rows"
            else:
                ours_is = f"as {key}/{cfg.pack_seq_lens[0]} with seq_len={length}"
                theirs_is = "likewise"
            rows.append(
                Row(f"{key}/{length}", what, "fraction" if metric == "efficiency" else "batch/s",
                    runs[o][metric], runs[t][metric], True, ours_is, theirs_is, note=note,
                    target=PACK_TARGETS.get(key))
            )  # fmt: skip
        far, near, cache = packed_resume(path, length, cfg.runs_packing)
        rows.append(
            Row(f"3k/{length}", "packed resume: src[~10**9], cold", "ms", far, near, False,
                f"TokenPipeline(prose, seq_len={length}, packing='best_fit').batch_source()"
                "[10**9 + 7919 i], pack cache emptied first", "the same at step 10 + 7919 i",
                ours_below(10e-3, "10 ms"), scale=1e-3,
                note=f"no document index: each chunk read is scanned for EOS and packed; pack "
                f"cache after one lookup {cache / 1e3:.0f} kB (LRU, 64 MB cap)")
        )  # fmt: skip
    order = [k for k, *_ in PACK_ROWS] + ["3k"]
    rows.sort(key=lambda r: (order.index(r.key.split("/")[0]), int(r.key.split("/")[1])))
    return rows, details


PACK_ROWS = [  # key, measurement, metric, ours, theirs
    ("3a", "packed batch/s: best_fit vs grain first-fit", "batches_per_s", "best_fit", "grain_ff"),
    ("3b", "packed batch/s: first_fit vs grain first-fit", "batches_per_s", "first_fit",
     "grain_ff"),
    ("3c", "packed batch/s: first_fit vs grain FF 0 thr", "batches_per_s", "first_fit",
     "grain_ff_nothreads"),
    ("3d", "batch/s: best_fit vs concat-then-split", "batches_per_s", "best_fit", "concat"),
    ("3e", "padding efficiency: best_fit vs grain FF", "efficiency", "best_fit", "grain_ff"),
    ("3f", "padding efficiency: first_fit vs grain FF", "efficiency", "first_fit", "grain_ff"),
    ("3g", "padding efficiency: best_fit vs concat-split", "efficiency", "best_fit", "concat"),
    ("3h", "batch/s: global packing vs concat-split", "batches_per_s", "global", "concat"),
    ("3i", "batch/s: global packing vs pack_documents", "batches_per_s", "global", "best_fit"),
    ("3j", "padding efficiency: global vs grain FF", "efficiency", "global", "grain_ff"),
]  # fmt: skip
PACK_TARGETS = {"3h": ratio_at_least(0.8), "3i": ratio_at_least(3), "3j": ratio_at_least(1)}


def pack_legend(contender: str, length: int, docs: int, tokens: int) -> str:
    epoch = f"one epoch of the prose corpus ({docs:,} docs, {tokens / 1e6:.2f}M byte tokens)"
    if contender in ("best_fit", "first_fit"):
        return (
            f"pack_documents(RoxDocumentSource(prose, seq_len={length}), seq_len={length}, "
            f"batch_size={BATCH}, num_epochs=1, method='{contender}'): {epoch}"
        )
    if contender == "global":
        return (
            f"packing in the global order: TokenPipeline(prose, seq_len={length}, "
            f"global_batch_size={BATCH}, num_epochs=1, packing='best_fit').batch_source()[k], "
            "all k"
        )
    if contender == "concat":
        return (
            f"concat-then-split: TokenPipeline(prose, seq_len={length}, global_batch_size="
            f"{BATCH}, num_epochs=1).batch_source()[k], all k (documents cut at window edges)"
        )
    options = "" if contender == "grain_ff" else "ReadOptions(num_threads=0)"
    shown = "default ReadOptions: 16 read threads" if not options else "no read threads, as ours"
    return (
        "grain.experimental.FirstFitPackIterDataset(MapDataset.source(RoxDocumentSource)"
        f".shuffle(0).to_iter_dataset({options}), length_struct={{inputs, targets: {length}}}, "
        f"num_packing_bins={BATCH}).batch({BATCH}, drop_remainder=True) ({shown})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = arg_parser(__doc__, "mixing", groups="123", example="13")
    parser.add_argument(
        "--profile", action="store_true", help="profile row 1's reads even when 1a passes"
    )
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    import jax

    info = machine(("grain",), {"jax": jax.__version__, "jax_devices": jax.device_count()})
    started = time.perf_counter()
    print_header(
        f"grain_rox {info['grain_rox']} | grain {info['grain']} | jax {info['jax']} "
        f"({info['jax_devices']} devices) | nproc {info['nproc']} (usable {info['usable_cpus']})"
        f" | python {info['python']} | numpy {info['numpy']}",
        info,
        cfg.quick,
        (cfg.runs_mixing, cfg.runs_resume, cfg.runs_packing),
        order="A, B, C, A, B, C",
    )
    rows: list[Row] = []
    extra: dict[str, Any] = {}
    with scratch_dir(args.tmpdir) as tmp:
        if set(args.only) & set("12"):
            t0 = time.perf_counter()
            paths = write_sources(cfg, tmp)
            log(f"sources a/b/c: {'/'.join(f'{t:,}' for t in cfg.source_tokens)} uint16 tokens, "
                f"written in {time.perf_counter() - t0:.1f} s; page cache warm")  # fmt: skip
            if "1" in args.only:
                r, extra["mixing"] = bench_mixing(cfg, paths, args.profile)
                rows += r
            if "2" in args.only:
                rows += bench_resume(cfg, paths)
        if "3" in args.only:
            r, extra["packing"] = bench_packing(cfg, tmp)
            rows += r
    profiles = [
        render_profile(f"cProfile of 1a's {kind} reads", prof)
        for kind in ("mixed", "unmixed")
        if (prof := extra.get("mixing", {}).get(f"profile_{kind}"))
    ]
    return finish(args.out, "mixing", cfg, info, started, rows, extra, appendix=profiles)


if __name__ == "__main__":
    sys.exit(main())
