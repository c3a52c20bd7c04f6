"""What the benchmark scripts share: rows, targets, interleaved runs, the table, the JSON.

Imported by ``bench_format.py``, ``bench_pipeline.py`` and ``bench_mixing.py``, each of which
puts this directory on ``sys.path`` first (so ``python benchmarks/bench_x.py`` and
``runpy.run_path`` both work). It imports neither JAX nor grain_rox at module level: the
scripts set JAX's environment before anything imports it.

Conventions (see benchmarks/README.md): every measurement is repeated with the contenders
interleaved (A, B, A, B, ...); a :class:`Row` holds every run of "ours" and "theirs", the table
shows their medians and the ratio ours/theirs, and, where the issue sets one, a
:class:`Target` judged on the medians (``PASS``/``MISS``).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import gc
import io
import json
import os
import platform
import pstats
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

FOOTER = struct.Struct("<qq8s8s")  # a shard's footer: blocks, raw bytes, dtype, signature
SIGNATURE = b"ROXXEL02"
REPO = Path(__file__).resolve().parent.parent


# ---- results ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Target:
    """A target from the issue: its text, and how to judge a row against it."""

    text: str
    passes: Callable[[Row], bool | None]


def ratio_at_least(x: float) -> Target:
    return Target(f"ratio >= {x:g}", lambda r: None if r.ratio is None else r.ratio >= x)


def ours_below(limit: float, shown: str) -> Target:
    return Target(
        f"ours < {shown}", lambda r: None if r.ours_median is None else r.ours_median < limit
    )


def ours_within(tolerance: float, shown: str) -> Target:
    """|ours - theirs| <= tolerance: "flat", "independent of"."""

    def passes(r: Row) -> bool | None:
        a, b = r.ours_median, r.theirs_median
        return None if a is None or b is None else abs(a - b) <= tolerance

    return Target(f"|ours-theirs| <= {shown}", passes)


def ours_at_most(limit: float, shown: str) -> Target:
    return Target(
        f"ours <= {shown}", lambda r: None if r.ours_median is None else r.ours_median <= limit
    )


@dataclasses.dataclass
class Row:
    """One line of the table: medians of interleaved runs, their ratio and the target."""

    key: str
    what: str
    unit: str
    ours: list[float]
    theirs: list[float]
    higher_is_better: bool
    ours_is: str  # legend: what "ours" ran
    theirs_is: str  # legend: what "theirs" ran
    target: Target | None = None
    skipped: str | None = None
    scale: float = 1.0  # displayed value = raw value / scale
    note: str = ""

    @property
    def ours_median(self) -> float | None:
        return statistics.median(self.ours) if self.ours else None

    @property
    def theirs_median(self) -> float | None:
        return statistics.median(self.theirs) if self.theirs else None

    @property
    def ratio(self) -> float | None:
        a, b = self.ours_median, self.theirs_median
        if a is None or b is None or b <= 0 or a < 0:
            return None
        return a / b

    @property
    def noise(self) -> float | None:
        """Largest relative spread, (max - min) / median, of the two sides."""
        spreads = []
        for values in (self.ours, self.theirs):
            if len(values) > 1:
                m = statistics.median(values)
                if m > 0:
                    spreads.append((max(values) - min(values)) / m)
        return max(spreads) if spreads else None

    @property
    def verdict(self) -> str:
        if self.skipped or self.target is None:
            return "-"
        ok = self.target.passes(self)
        return "-" if ok is None else ("PASS" if ok else "MISS")

    def to_json(self, targets: bool = True) -> dict[str, Any]:
        """The row with every run; ``targets=False``: without scale, target and verdict."""
        out = {
            "key": self.key,
            "what": self.what,
            "unit": self.unit,
            "scale": self.scale,
            "ours": self.ours_median,
            "theirs": self.theirs_median,
            "ratio_ours_over_theirs": self.ratio,
            "better": "higher" if self.higher_is_better else "lower",
            "target": self.target.text if self.target else None,
            "verdict": self.verdict,
            "runs": min(len(self.ours), len(self.theirs)),
            "ours_runs": self.ours,
            "theirs_runs": self.theirs,
            "relative_spread": self.noise,
            "ours_is": self.ours_is,
            "theirs_is": self.theirs_is,
            "skipped": self.skipped,
            "note": self.note,
        }
        if not targets:
            for key in ("scale", "target", "verdict"):
                del out[key]
        return out


# ---- interleaved runs -------------------------------------------------------------------------
_T0 = time.perf_counter()


def log(msg: str, *, elapsed: bool = True) -> None:
    """Progress on stderr, with the seconds since this module was imported (``elapsed``)."""
    stamp = f"[{time.perf_counter() - _T0:5.1f} s] " if elapsed else ""
    print(f"  .. {stamp}{msg}", file=sys.stderr, flush=True)


_LINGERING: set[threading.Thread] = set()  # threads that outlived a grace period: not waited on


def settle(before: set[threading.Thread], what: str, timeout: float = 5.0) -> None:
    """Wait until the threads started since ``before`` have ended (prefetchers and Grain's read
    threads of one contender must not run into the next contender's timing)."""
    deadline = time.perf_counter() + timeout
    while True:
        extra = [
            t
            for t in threading.enumerate()
            if t not in before and t not in _LINGERING and t.is_alive()
        ]
        if not extra:
            return
        if time.perf_counter() > deadline:
            log(f"warning: {what} left threads running: {[t.name for t in extra]}")
            _LINGERING.update(extra)
            return
        time.sleep(0.005)


def interleave(
    runs: int,
    contenders: Mapping[str, Callable[[], dict[str, float]]],
    *,
    settle_threads: bool = True,
) -> dict:
    """Call each contender ``runs`` times, interleaved; collect every metric it returns.

    Before each call garbage is collected; after it (``settle_threads``) the threads the call
    started are waited for."""
    out: dict[str, dict[str, list[float]]] = {name: {} for name in contenders}
    for _ in range(runs):
        for name, fn in contenders.items():
            gc.collect()
            before = set(threading.enumerate()) if settle_threads else None
            for metric, value in fn().items():
                out[name].setdefault(metric, []).append(value)
            if before is not None:
                settle(before, name)
    return out


def warm_up(contenders: Mapping[str, Callable[[], object]]) -> None:
    """One untimed pass of every contender: first-call costs out of the medians."""
    for name, fn in contenders.items():
        before = set(threading.enumerate())
        fn()
        settle(before, name)


# ---- shards, memory, roxxel -------------------------------------------------------------------
def footer(path: str) -> tuple[int, int, str]:
    """(blocks, raw bytes, dtype name) of one shard."""
    with open(path, "rb") as f:
        f.seek(-FOOTER.size, os.SEEK_END)
        n, raw, dt, sig = FOOTER.unpack(f.read(FOOTER.size))
    assert sig == SIGNATURE, path
    return n, raw, dt.rstrip(b"\0").decode()


def read_through(paths: Iterable[str]) -> None:
    """Warm the page cache: read every file once."""
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass


def build_sparse(directory: str, shards: int, shard_bytes: int, block_bytes: int) -> str | None:
    """Write ``shards`` sparse uint16 shards of ``shard_bytes`` raw bytes each (a hole, then
    the int64 end offsets of its ``block_bytes`` blocks and the footer); return a reason to
    skip, or None."""
    n_blocks = shard_bytes // block_bytes
    ends = (np.arange(1, n_blocks + 1, dtype="<i8") * block_bytes).tobytes()
    tail = ends + FOOTER.pack(n_blocks, shard_bytes, b"uint16", SIGNATURE)
    try:
        for i in range(shards):
            path = os.path.join(directory, f"big_{i:04d}.rox")
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            try:
                os.ftruncate(fd, shard_bytes)  # the raw region is one hole
                os.pwrite(fd, tail, shard_bytes)
                used = os.fstat(fd).st_blocks * 512
            finally:
                os.close(fd)
            if used > 64 << 20:
                return f"the filesystem allocated {used:,} bytes for a sparse file"
    except OSError as e:
        return f"cannot create {shard_bytes:,}-byte sparse files here: {e}"
    return None


def status_kib() -> dict[str, int]:
    """This process's RssAnon and VmSize (kB) from /proc/self/status."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "VmSize"):
                out[key] = int(value.split()[0])
    if len(out) != 2:
        raise RuntimeError("no RssAnon/VmSize in /proc/self/status (not Linux?)")
    return out


def quiet() -> contextlib.AbstractContextManager[Any]:
    """Swallow roxxel's progress chatter on stdout."""
    return contextlib.redirect_stdout(io.StringIO())


def import_roxxel(required: bool = True) -> Any:
    """roxxel; when it is not installed, ImportError, or None if not ``required`` (its rows
    are then skipped)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # roxxel imports jax; never probe for TPUs
    try:
        with quiet():
            import roxxel
    except ImportError:
        if required:
            raise
        return None
    return roxxel


# ---- the table --------------------------------------------------------------------------------
def fmt(value: float | None, scale: float = 1.0) -> str:
    if value is None:
        return "-"
    v = value / scale
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def render(rows: list[Row], targets: bool = True) -> str:
    """The table and its legend; ``targets=False``: without the target and result columns.
    Rows in unit ``fraction`` show 4 decimals and a 3-decimal ratio."""
    header = ("row", "measurement", "unit", "ours", "theirs", "ours/theirs", "better", "target",
              "result", "runs", "spread")  # fmt: skip
    lines = []
    for r in rows:
        if r.skipped:
            lines.append((r.key, r.what, r.unit, "skip", "skip", "-", "-",
                          r.target.text if r.target else "-", "-", "0", "-"))  # fmt: skip
            continue
        ratio = r.ratio
        noise = r.noise
        fraction = r.unit == "fraction"
        if ratio is None and r.ours_median == 0 and r.theirs_median == 0:
            shown = "equal"
        else:
            shown = "-" if ratio is None else f"{ratio:.3f}x" if fraction else f"{ratio:.2f}x"
        lines.append(
            (
                r.key,
                r.what,
                r.unit,
                f"{r.ours_median:.4f}" if fraction else fmt(r.ours_median, r.scale),
                f"{r.theirs_median:.4f}" if fraction else fmt(r.theirs_median, r.scale),
                shown,
                "higher" if r.higher_is_better else "lower",
                r.target.text if r.target else "-",
                r.verdict,
                str(min(len(r.ours), len(r.theirs)) if r.theirs else len(r.ours)),
                "-" if noise is None else f"{100 * noise:.0f}%",
            )
        )
    columns = [i for i in range(len(header)) if targets or header[i] not in ("target", "result")]
    right = [header[i] in ("ours", "theirs", "ours/theirs", "runs", "spread") for i in columns]
    cells = [tuple(x[i] for i in columns) for x in [header, *lines]]
    widths = [max(len(x[j]) for x in cells) for j in range(len(columns))]

    def line(row: tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(wd) if r else c.ljust(wd) for c, wd, r in zip(row, widths, right, strict=True)
        ).rstrip()

    out = [line(cells[0]), line(tuple("-" * wd for wd in widths))]
    out += [line(x) for x in cells[1:]]
    out.append("")
    if targets:
        out.append(
            "spread = (max - min) / median of the noisier side; target = the issue's, judged on "
            "the medians. Legend (ours | theirs):"
        )
    else:
        out.append("spread = (max - min) / median of the noisier side. Legend (ours | theirs):")
    for r in rows:
        if r.skipped:
            out.append(f"  {r.key}: skipped: {r.skipped}")
            continue
        if r.ours_is:
            out.append(f"  {r.key}: ours   = {r.ours_is}")
            out.append(f"  {' ' * len(r.key)}  theirs = {r.theirs_is}")
        if r.note:
            out.append(f"  {' ' * len(r.key)}  note: {r.note}")
    return "\n".join(out)


# ---- command line, machine, output ------------------------------------------------------------
def arg_parser(doc: str, benchmark: str, groups: str, example: str) -> argparse.ArgumentParser:
    """--quick, --out (default ``bench_out/<benchmark>.json``), --tmpdir, --only ``groups``."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, < 60 s (smoke test)")
    default_out = REPO / "bench_out" / f"{benchmark}.json"
    parser.add_argument("--out", default=str(default_out), help="where to write the JSON")
    parser.add_argument("--tmpdir", default=None, help="where to put the temporary data")
    parser.add_argument(
        "--only", default=groups, help=f"which row groups to run, e.g. '{example}' (default: all)"
    )
    return parser


def machine(dists: Iterable[str], extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Facts about this machine and the versions; ``extra`` goes after numpy's, the
    installed versions of ``dists`` (None: not installed) last."""
    import grain_rox

    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        "numpy": np.__version__,
        **(extra or {}),
        "grain_rox": grain_rox.__version__,
        "platform": platform.platform(),
        "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    from importlib.metadata import PackageNotFoundError, version

    for dist in dists:
        try:
            info[dist] = version(dist)
        except PackageNotFoundError:
            info[dist] = None
    return info


def print_header(
    versions: str, info: Mapping[str, Any], quick: bool, runs: Iterable[int], order: str,
    tail: str = "",
) -> None:  # fmt: skip
    """The machine line (``versions`` + the load average) and the mode line: ``order`` shows
    how the contenders alternate, ``runs`` the row groups' run counts."""
    load = f" | load avg {info['loadavg'][0]:.2f}" if info["loadavg"] else ""
    print(versions + load, flush=True)
    print(
        f"mode: {'quick' if quick else 'full'}. Shown: medians of N interleaved runs "
        f"({order}, ...; N = {'/'.join(map(str, sorted(set(runs))))} per row, see 'runs'); "
        f"ratio = ours / theirs{tail}.",
        flush=True,
    )


def scratch_dir(tmpdir: str | None) -> tempfile.TemporaryDirectory[str]:
    """The temporary directory of a run (removed at the end), under ``tmpdir`` if given."""
    return tempfile.TemporaryDirectory(prefix="grain_rox_bench_", dir=tmpdir)


def finish(
    out: str,
    benchmark: str,
    cfg: Any,
    info: Mapping[str, Any],
    started: float,
    rows: list[Row],
    details: Mapping[str, Any] | None = None,
    *,
    targets: bool = True,
    appendix: Sequence[str] = (),
) -> int:
    """Print the table (then each text of ``appendix``) and the total time; write the JSON
    (``details`` under "details" unless None). Returns the exit status, 0."""
    elapsed = time.perf_counter() - started
    print("\n" + render(rows, targets), flush=True)
    for text in appendix:
        print("\n" + text, flush=True)
    print(f"\ntotal {elapsed:.0f} s", flush=True)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": benchmark,
        "mode": "quick" if cfg.quick else "full",
        "machine": info,
        "config": dataclasses.asdict(cfg),
        "seconds": elapsed,
        "rows": [r.to_json(targets) for r in rows],
    }
    if details is not None:
        payload["details"] = details
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


# ---- profiles ----------------------------------------------------------------------------------
def short(filename: str) -> str:
    for marker in ("site-packages/", f"{REPO}/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def profile_top(run: Callable[[], object], top: int = 10) -> dict[str, Any]:
    """cProfile ``run``: the top functions by own time, and grain_rox's by cumulative time, each
    with its share of the profiled total (cProfile inflates many small Python calls)."""
    prof = cProfile.Profile()
    prof.enable()
    run()
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values()) or 1e-12

    def label(k: tuple[str, int, str]) -> str:
        filename, line, func = k
        return func if filename == "~" else f"{short(filename)}:{line}({func})"

    entries = [
        {"function": label(k), "ncalls": v[1], "own_share": v[2] / total,
         "cum_share": v[3] / total}
        for k, v in stats.items()
    ]  # fmt: skip
    own = sorted(entries, key=lambda e: -e["own_share"])[:top]
    ours = [e for e in entries if e["function"].startswith("grain_rox/")]
    cum = sorted(ours, key=lambda e: -e["cum_share"])[:top]
    return {"profiled_seconds": total, "by_own_time": own, "grain_rox_by_cumulative": cum}


def render_profile(title: str, prof: Mapping[str, Any]) -> str:
    out = [f"{title} ({prof['profiled_seconds']:.2f} s under cProfile):"]
    for heading, key, share in (
        ("top functions by own time", "by_own_time", "own_share"),
        ("grain_rox functions by cumulative time", "grain_rox_by_cumulative", "cum_share"),
    ):
        out.append(f"  {heading}:")
        out += [f"    {100 * e[share]:5.1f}%  {e['ncalls']:>7}  {e['function']}" for e in prof[key]]
    return "\n".join(out)
