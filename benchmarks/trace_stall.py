"""Where the train-step stall goes: a profiler trace of the fed and the resident step loop.

``bench_device.py`` measures the stall (a jitted ~3 ms step fed by the iterator against the
same batch already on the device) but not its cause. This script runs that same step loop
under ``jax.profiler.trace`` for grain_rox's default, the fast path and the resident batch,
and prints per trace: each track's busy time (the device's streams, the Python threads), the
longest events on it, and on the device's busiest track the gaps between its kernels (the
stall itself), with what the host's threads were doing in the longest ones. The traces
(``perfetto_trace.json.gz``) are copied to ``--out`` to read in https://ui.perfetto.dev.

    python benchmarks/trace_stall.py --out trace_out [--steps 60] [--step-ms 3]

On a CPU (``--allow-cpu``) it runs on one CPU device and finds no device track: a smoke run.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_device

if __name__ == "__main__":
    bench_device.choose_platform(sys.argv[1:])

import argparse
import collections
import contextlib
import dataclasses
import gzip
import itertools
import json
import shutil
import tempfile
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import grain_rox

Span = tuple[float, float, str]  # start and end (us), name


def busy_intervals(spans: Iterable[Span]) -> list[tuple[float, float]]:
    """The union of ``spans`` as sorted, disjoint intervals (nested events counted once).

    >>> busy_intervals([(0, 5, "a"), (1, 2, "b"), (7, 9, "c")])
    [(0, 5), (7, 9)]
    """
    merged: list[tuple[float, float]] = []
    for start, end, _ in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def tracks_of(path: Path) -> dict[str, list[Span]]:
    """A perfetto JSON trace's complete events, by ``"process / thread"`` name."""
    with gzip.open(path, "rt") as f:
        loaded = json.load(f)
    events = loaded["traceEvents"] if isinstance(loaded, dict) else loaded
    processes: dict[Any, str] = {}
    threads: dict[tuple[Any, Any], str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[e["pid"], e["tid"]] = e["args"]["name"]
    tracks: dict[str, list[Span]] = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "dur" in e:
            key = (e["pid"], e.get("tid"))
            name = f"{processes.get(e['pid'], e['pid'])} / {threads.get(key, e.get('tid'))}"
            tracks[name].append((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"]))
    return dict(tracks)


def is_device(track: str) -> bool:
    return "/device:" in track or "GPU" in track.split(" / ")[0]


def summary(path: Path, top: int = 6) -> str:
    """Each track's busy time and longest events; the device's gaps and what the host did."""
    tracks = tracks_of(path)
    if not tracks:
        return "  (an empty trace)"
    first = min(s for spans in tracks.values() for s, _, _ in spans)
    last = max(e for spans in tracks.values() for _, e, _ in spans)
    lines = [f"  window {(last - first) / 1e3:.1f} ms"]
    by_busy = sorted(tracks.items(), key=lambda kv: -sum(e - s for s, e in busy_intervals(kv[1])))
    for name, spans in by_busy[:12]:
        busy = sum(e - s for s, e in busy_intervals(spans))
        total: collections.Counter[str] = collections.Counter()
        for s, e, n in spans:
            total[n[:70]] += e - s
        longest = ", ".join(f"{n} {t / 1e3:.2f} ms" for n, t in total.most_common(top))
        lines.append(f"  {name}: {len(spans)} events, busy {busy / 1e3:.1f} ms; {longest}")
    devices = [name for name, _ in by_busy if is_device(name)]
    if not devices:
        lines.append("  no device track (a CPU run)")
        return "\n".join(lines)
    busiest = devices[0]
    merged = busy_intervals(tracks[busiest])
    gaps = [(a_end, b_start) for (_, a_end), (b_start, _) in itertools.pairwise(merged)]
    widths = np.array([b - a for a, b in gaps]) if gaps else np.zeros(1)
    lines.append(
        f"  gaps on {busiest}: {len(gaps)}, total {widths.sum() / 1e3:.2f} ms, median "
        f"{np.median(widths):.0f} us, p90 {np.percentile(widths, 90):.0f} us, max "
        f"{widths.max():.0f} us"
    )
    host = {n: s for n, s in tracks.items() if not is_device(n)}
    for a, b in sorted(gaps, key=lambda g: g[0] - g[1])[:3]:
        doing = []
        for name, spans in host.items():
            inside = [(min(e, b) - max(s, a), n) for s, e, n in spans if s < b and e > a]
            if inside:
                width, what = max(inside)
                doing.append(f"{name.split(' / ')[-1]}: {what[:50]} ({width:.0f} us)")
        lines.append(f"  a {b - a:.0f} us gap: " + "; ".join(doing[:4]))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="trace_out", help="where the traces are copied")
    parser.add_argument("--steps", type=int, default=60, help="traced steps per loop")
    parser.add_argument("--step-ms", type=float, default=3.0, help="the step's target time")
    parser.add_argument("--dim", type=int, default=4096, help="the step's matmul size")
    parser.add_argument("--unroll", action="store_true", help="the step's matmuls unrolled")
    parser.add_argument("--tokens", type=float, default=5e6, help="corpus size in tokens")
    parser.add_argument("--allow-cpu", action="store_true", help="a smoke run on the CPU")
    parser.add_argument("--platform", choices=("auto", "cpu"), default="auto")
    args = parser.parse_args()
    device = jax.default_backend() != "cpu"
    if not device and not args.allow_cpu:
        print("trace_stall: no accelerator found (--allow-cpu for a smoke run)")
        return 0
    cfg = dataclasses.replace(
        bench_device.FULL,
        corpus_tokens=int(args.tokens),
        stall_steps=args.steps,
        stall_dim=args.dim,
        stall_unroll=args.unroll,
    )
    mesh = Mesh(np.asarray(jax.devices()[:1]), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = bench_device.write_corpus(cfg.corpus_tokens, tmp)
        stall = bench_device.Stall(cfg, path, sharding, device)
        iters = stall.sized(args.step_ms)
        for key in stall.pipes:
            step = stall.step(key, iters)  # one jitted step per pipeline, compiled once
            for how in ("resident", "fed", "put"):  # put: device_put, not the placing call
                with contextlib.ExitStack() as stack:
                    if how == "resident":
                        get = lambda key=key: stall.resident[key]  # noqa: E731
                    else:
                        it = stack.enter_context(
                            grain_rox.MultiHostDataLoadIterator(
                                stall.pipes[key], data_sharding=sharding
                            )
                        )
                        if how == "put" and hasattr(it, "_place_by_call"):
                            it._place_by_call = False
                        get = lambda it=it: next(it)  # noqa: E731
                    stall.ms(step, get, 10)  # compiles the step and the placing call
                    where = Path(tmp) / f"trace-{key}-{how}"
                    jax.profiler.start_trace(str(where), create_perfetto_trace=True)
                    try:
                        ms = stall.ms(step, get, args.steps)
                    finally:
                        jax.profiler.stop_trace()
                found = sorted(where.rglob("perfetto_trace.json.gz"))
                print(f"## {key} {how}: {ms:.3f} ms a step ({iters} matmuls of {stall.dim})")
                if not found:
                    print("  no perfetto trace written")
                    continue
                shutil.copy(found[-1], out / f"{key}-{how}.perfetto.json.gz")
                print(summary(found[-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
