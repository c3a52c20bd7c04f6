"""Benchmark grain_rox's `.rox` writer and reader against roxxel 0.9.14 and plain numpy.

Run by ``nox -s bench`` as ``python benchmarks/bench_format.py [--quick]``. Every measurement
is repeated (at least 3 times) with the contenders interleaved (A, B, A, B, ...) so that the
noise of a shared machine hits both alike; the table shows medians and the ratio ours/theirs.
The table is printed at the end and written as JSON to ``bench_out/format.json``.

Rows (see benchmarks/README.md):

1. conversion throughput (tokens/s) on the embedded stdlib code corpus, vs roxxel's writer;
2. open time and anonymous RSS for a 1 TiB sparse corpus (16 x 64 GiB), vs roxxel's open;
3. ``RoxCorpus.tokens`` random-window throughput vs a plain ``np.memmap`` slice.

All data lives in a temporary directory that is removed at the end; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import glob
import io
import json
import os
import platform
import shutil
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

FOOTER = struct.Struct("<qq8s8s")
SIGNATURE = b"ROXXEL02"
REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench_out" / "format.json"


# ---- configuration --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Config:
    quick: bool
    code_docs: int | None  # row 1: documents of the embedded code corpus (None: all)
    runs_convert: int  # row 1: interleaved runs per contender
    sparse_shards: int  # row 2
    sparse_shard_bytes: int
    sparse_block_bytes: int
    sparse_reads: int
    runs_open: int
    window_corpus_bytes: int  # row 3
    windows: int
    window_tokens: int
    gather_batch: int
    runs_windows: int


FULL = Config(
    quick=False,
    code_docs=None,
    runs_convert=5,
    sparse_shards=16,
    sparse_shard_bytes=64 << 30,
    sparse_block_bytes=1 << 30,
    sparse_reads=1000,
    runs_open=9,
    window_corpus_bytes=400 << 20,
    windows=20_000,
    window_tokens=1025,
    gather_batch=256,
    runs_windows=7,
)
QUICK = dataclasses.replace(
    FULL,
    quick=True,
    code_docs=200,
    runs_convert=3,
    runs_open=3,
    window_corpus_bytes=40 << 20,
    windows=2_000,
    runs_windows=3,
)


# ---- results ----------------------------------------------------------------------------------
@dataclasses.dataclass
class Row:
    """One line of the table: medians of interleaved runs and their ratio."""

    key: str
    what: str
    unit: str
    ours: list[float]
    theirs: list[float]
    higher_is_better: bool
    ours_is: str  # legend: what "ours" ran
    theirs_is: str  # legend: what "theirs" ran
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

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "what": self.what,
            "unit": self.unit,
            "ours": self.ours_median,
            "theirs": self.theirs_median,
            "ratio_ours_over_theirs": self.ratio,
            "better": "higher" if self.higher_is_better else "lower",
            "runs": min(len(self.ours), len(self.theirs)),
            "ours_runs": self.ours,
            "theirs_runs": self.theirs,
            "relative_spread": self.noise,
            "ours_is": self.ours_is,
            "theirs_is": self.theirs_is,
            "skipped": self.skipped,
            "note": self.note,
        }


def interleave(runs: int, contenders: dict[str, Callable[[], dict[str, float]]]) -> dict:
    """Call each contender ``runs`` times, interleaved; collect every metric it returns."""
    out: dict[str, dict[str, list[float]]] = {name: {} for name in contenders}
    for _ in range(runs):
        for name, fn in contenders.items():
            gc.collect()
            for metric, value in fn().items():
                out[name].setdefault(metric, []).append(value)
    return out


def log(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


# ---- helpers ----------------------------------------------------------------------------------
def footer(path: str) -> tuple[int, int, str]:
    """(blocks, raw bytes, dtype name) of one shard."""
    with open(path, "rb") as f:
        f.seek(-FOOTER.size, os.SEEK_END)
        n, raw, dt, sig = FOOTER.unpack(f.read(FOOTER.size))
    assert sig == SIGNATURE, path
    return n, raw, dt.rstrip(b"\0").decode()


def written_tokens(directory: str) -> int:
    """Tokens in every shard under ``directory``, from the footers (padding included)."""
    total = 0
    for p in sorted(glob.glob(os.path.join(directory, "*.rox"))):
        _, raw, dt = footer(p)
        total += raw // np.dtype(dt).itemsize
    return total


def raw_region(path: str) -> bytes:
    _, raw, _ = footer(path)
    with open(path, "rb") as f:
        return f.read(raw)


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


def fsync_all(directory: str) -> None:
    """Flush a finished write's dirty pages so they are not written back during a later run."""
    for p in glob.glob(os.path.join(directory, "*")):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def quiet() -> contextlib.AbstractContextManager[Any]:
    """Swallow roxxel's progress chatter on stdout."""
    return contextlib.redirect_stdout(io.StringIO())


def import_roxxel() -> Any:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # roxxel imports jax; never probe for TPUs
    with quiet():
        import roxxel
    return roxxel


class RoxxelTiktoken:
    """The HF-tokenizer face roxxel's ``write(tokenizer=...)`` needs, over a tiktoken Encoding.

    roxxel reads ``eos_token_id``, ``pad_token_id`` (None: pads with EOS), ``vocab_size`` and
    calls ``encode(text)`` once per document, taking the result as the id list. We encode as
    grain_rox does (``encode_ordinary``: special-token strings are text), so both writers
    must produce byte-identical shards.
    """

    def __init__(self, encoding: Any, eos_id: int, vocab_size: int) -> None:
        self._encoding = encoding
        self.eos_token_id = eos_id
        self.pad_token_id = None
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return self._encoding.encode_ordinary(text)  # type: ignore[no-any-return]


class Scratch:
    """Numbered fresh output directories; the previous one of a kind is removed on request."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.count = 0

    def new(self, kind: str) -> str:
        self.count += 1
        d = os.path.join(self.root, f"{kind}_{self.count:03d}")
        os.makedirs(d)
        return d


# ---- row 1: conversion ------------------------------------------------------------------------
def bench_convert(cfg: Config, tmp: str) -> list[Row]:
    import grain_rox
    from grain_rox._builtin_corpus import builtin_documents
    from grain_rox._convert import tokenize_in_order

    roxxel = import_roxxel()
    docs = list(builtin_documents("code", limit=cfg.code_docs))
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    log(f"row 1: {len(docs)} code documents, {nbytes / 1e6:.1f} MB of UTF-8")
    tok = grain_rox.get_tokenizer("cl100k_base")
    tok.encode_batch(["warm", "up"])  # load and verify the vocabulary outside the timings
    adapter = RoxxelTiktoken(tok.encoding, tok.eos_id, tok.vocab_size)  # type: ignore[attr-defined]
    scratch = Scratch(tmp)
    last: dict[str, str] = {}

    def timed(kind: str, write: Callable[[str], object]) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            d = scratch.new(kind)
            path = os.path.join(d, "code.rox")
            t0 = time.perf_counter()
            write(path)
            dt = time.perf_counter() - t0
            fsync_all(d)  # outside the timing: roxxel does not fsync, grain_rox already did
            n = written_tokens(d)
            if kind in last:
                shutil.rmtree(last[kind])
            last[kind] = d
            return {"tokens_per_s": n / dt, "tokens": n, "seconds": dt}

        return run

    def roxxel_write(path: str, **kw: Any) -> None:
        with quiet():
            r = roxxel.Roxxel(path)
            r.write(iter(docs), **kw)
            r.close()

    bytes_runs = interleave(
        cfg.runs_convert,
        {
            "ours_bytes": timed(
                "ours_bytes", lambda p: grain_rox.write_rox(docs, p, tokenizer="bytes")
            ),
            "ours_raw": timed("ours_raw", lambda p: grain_rox.write_rox(docs, p, separator=b"\0")),
            "theirs_raw": timed("theirs_raw", lambda p: roxxel_write(p, separator=b"\0")),
        },
    )
    log("row 1a done")
    tok_runs = interleave(
        cfg.runs_convert,
        {
            "ours_cl100k": timed(
                "ours_cl100k",
                lambda p: grain_rox.write_rox(tokenize_in_order(docs, tok), p, tokenizer=tok),
            ),
            "theirs_cl100k": timed(
                "theirs_cl100k", lambda p: roxxel_write(p, tokenizer=adapter, dtype="uint32")
            ),
        },
    )
    log("row 1b done")

    def same(a: str, b: str) -> bool:
        return raw_region(os.path.join(last[a], "code.rox")) == raw_region(
            os.path.join(last[b], "code.rox")
        )

    raw_same = same("ours_raw", "theirs_raw")
    tok_same = same("ours_cl100k", "theirs_cl100k")
    ntok = {k: v["tokens"][-1] for k, v in {**bytes_runs, **tok_runs}.items()}
    for d in last.values():
        shutil.rmtree(d)

    corpus = f"code corpus ({len(docs)} docs, {nbytes / 1e6:.1f} MB)"
    return [
        Row(
            "1a",
            "convert code, tokenizer=bytes",
            "Mtok/s",
            bytes_runs["ours_bytes"]["tokens_per_s"],
            bytes_runs["theirs_raw"]["tokens_per_s"],
            True,
            f"write_rox(docs, tokenizer='bytes') on the {corpus}: uint16 ids (EOS 256), "
            "manifest + sha256 + fsync",
            "roxxel.Roxxel(p).write(docs, separator=b'\\0'): raw UTF-8 bytes, uint8, no fsync",
            scale=1e6,
            note=f"tokens ours {ntok['ours_bytes']:,} / theirs {ntok['theirs_raw']:,}",
        ),
        Row(
            "1a'",
            "convert code, raw uint8 (same bytes)",
            "Mtok/s",
            bytes_runs["ours_raw"]["tokens_per_s"],
            bytes_runs["theirs_raw"]["tokens_per_s"],
            True,
            "write_rox(docs, separator=b'\\0'): uint8, the same shard bytes as roxxel",
            "same roxxel runs as 1a",
            scale=1e6,
            note=f"raw regions byte-identical: {raw_same}",
        ),
        Row(
            "1b",
            "convert code, cl100k_base",
            "Mtok/s",
            tok_runs["ours_cl100k"]["tokens_per_s"],
            tok_runs["theirs_cl100k"]["tokens_per_s"],
            True,
            f"write_rox(tokenize_in_order(docs, tok), tokenizer=tok) on the {corpus}: "
            f"threaded tiktoken, uint32, {os.cpu_count()} workers",
            "roxxel write(docs, tokenizer=<tiktoken adapter>, dtype='uint32'): one encode per doc",
            scale=1e6,
            note=f"tokens ours {ntok['ours_cl100k']:,} / theirs {ntok['theirs_cl100k']:,}; "
            f"raw regions byte-identical: {tok_same}",
        ),
    ]


# ---- row 2: opening a 1 TiB sparse corpus -----------------------------------------------------
def build_sparse(cfg: Config, directory: str) -> str | None:
    """Write the sparse shards; return a reason to skip, or None."""
    n_blocks = cfg.sparse_shard_bytes // cfg.sparse_block_bytes
    ends = (np.arange(1, n_blocks + 1, dtype="<i8") * cfg.sparse_block_bytes).tobytes()
    tail = ends + FOOTER.pack(n_blocks, cfg.sparse_shard_bytes, b"uint16", SIGNATURE)
    try:
        for i in range(cfg.sparse_shards):
            path = os.path.join(directory, f"big_{i:04d}.rox")
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            try:
                os.ftruncate(fd, cfg.sparse_shard_bytes)  # the raw region is one hole
                os.pwrite(fd, tail, cfg.sparse_shard_bytes)
                used = os.fstat(fd).st_blocks * 512
            finally:
                os.close(fd)
            if used > 64 << 20:
                return f"the filesystem allocated {used:,} bytes for a sparse file"
    except OSError as e:
        return f"cannot create {cfg.sparse_shard_bytes:,}-byte sparse files here: {e}"
    return None


def bench_open(cfg: Config, tmp: str) -> list[Row]:
    import grain_rox

    roxxel = import_roxxel()
    directory = os.path.join(tmp, "sparse")
    os.makedirs(directory)
    total = cfg.sparse_shards * cfg.sparse_shard_bytes
    size = f"{total / 2**40:g} TiB sparse ({cfg.sparse_shards} x {cfg.sparse_shard_bytes >> 30} GiB"
    size += f", {cfg.sparse_shard_bytes // cfg.sparse_block_bytes} blocks of "
    size += f"{cfg.sparse_block_bytes >> 20} MiB each)"
    keys = ("2a", "2b", "2c", "2d")
    reason = build_sparse(cfg, directory)
    if reason is not None:
        shutil.rmtree(directory)
        log(f"row 2 skipped: {reason}")
        return [Row(k, "1 TiB sparse corpus", "-", [], [], False, "", "", reason) for k in keys]
    log(f"row 2: built {size}")

    # The same random 1024-token ranges for both, none crossing a block (so none a shard).
    block_tokens = cfg.sparse_block_bytes // 2
    n_blocks_total = total // cfg.sparse_block_bytes
    rng = np.random.default_rng(2)
    blocks = rng.integers(0, n_blocks_total, cfg.sparse_reads).tolist()
    offsets = rng.integers(0, block_tokens - 1024 + 1, cfg.sparse_reads).tolist()
    starts = [b * block_tokens + o for b, o in zip(blocks, offsets, strict=True)]
    buf = np.empty(1024, np.uint16)

    def deltas(before: dict[str, int], opened: dict[str, int], read: dict[str, int]) -> dict:
        return {
            "rss_open": opened["RssAnon"] - before["RssAnon"],
            "rss_read": read["RssAnon"] - before["RssAnon"],
            "vm_open_gib": (opened["VmSize"] - before["VmSize"]) / 2**20,
            "vm_read_gib": (read["VmSize"] - before["VmSize"]) / 2**20,
        }

    def ours() -> dict[str, float]:
        before = status_kib()
        t0 = time.perf_counter()
        corpus = grain_rox.open_rox(directory)
        t_open = time.perf_counter() - t0
        opened = status_kib()
        assert corpus.num_tokens == total // 2
        t0 = time.perf_counter()
        for s in starts:
            buf[:] = corpus.tokens(s, s + 1024)
        t_read = time.perf_counter() - t0
        read = status_kib()
        corpus.close()
        return {"open_s": t_open, "reads_per_s": len(starts) / t_read,
                **deltas(before, opened, read)}  # fmt: skip

    def theirs() -> dict[str, float]:
        before = status_kib()
        t0 = time.perf_counter()
        r = roxxel.Roxxel(directory)
        r.open()
        t_open = time.perf_counter() - t0
        opened = status_kib()
        assert len(r) == n_blocks_total
        t0 = time.perf_counter()
        for b, o in zip(blocks, offsets, strict=True):  # roxxel has blocks, not token ranges
            buf[:] = r[b][2 * o : 2 * o + 2048].view(np.uint16)
        t_read = time.perf_counter() - t0
        read = status_kib()
        r.close()
        return {"open_s": t_open, "reads_per_s": len(starts) / t_read,
                **deltas(before, opened, read)}  # fmt: skip

    ours()  # warm-up: first-call costs (imports, allocator arenas) out of the medians
    theirs()
    runs = interleave(cfg.runs_open, {"ours": ours, "theirs": theirs})
    shutil.rmtree(directory)
    o, t = runs["ours"], runs["theirs"]
    reads = f"{cfg.sparse_reads} random 1024-token ranges"
    med = statistics.median
    vm_open = f"mapped (VmSize) after open: ours +{med(o['vm_open_gib']):.0f} GiB, "
    vm_open += f"theirs +{med(t['vm_open_gib']):.0f} GiB"
    vm_read = f"mapped after reads: ours +{med(o['vm_read_gib']):.0f} GiB, "
    vm_read += f"theirs +{med(t['vm_read_gib']):.0f} GiB"
    rss_noise = "RSS counters are per-CPU batched: +-256 KiB is noise"
    return [
        Row("2a", "open 1 TiB sparse corpus", "ms", o["open_s"], t["open_s"], False,
            f"open_rox(dir) on {size}: footers + 64-entry indexes read and checked, no mmap",
            "roxxel.Roxxel(dir).open(): footers read, every shard np.memmap'ed",
            scale=1e-3),
        Row("2b", "RssAnon delta after open", "KiB", o["rss_open"], t["rss_open"], False,
            "RssAnon (/proc/self/status) after open_rox minus before",
            "the same around Roxxel(dir).open()",
            note=f"{vm_open}; {rss_noise}"),
        Row("2c", f"RssAnon delta after {cfg.sparse_reads} reads", "KiB",
            o["rss_read"], t["rss_read"], False,
            f"RssAnon after open + {reads} (corpus.tokens copied to a buffer) minus before open",
            "the same with r[block][byte slice].view(uint16)",
            note=f"{vm_read}; {rss_noise}"),
        Row("2d", "random 1024-token reads, 1 TiB", "kread/s", o["reads_per_s"],
            t["reads_per_s"], True,
            f"{reads} via corpus.tokens(s, s + 1024) into a buffer (first touch of each shard "
            "maps it)",
            "the same ranges via roxxel's r[block][a:b] (memmap slices) .view(uint16)",
            scale=1e3, note="holes read as zero pages"),
    ]  # fmt: skip


# ---- row 3: random windows --------------------------------------------------------------------
def random_chunks(n_tokens: int, chunk: int, seed: int) -> Iterable[np.ndarray]:
    rng = np.random.default_rng(seed)
    for lo in range(0, n_tokens, chunk):
        yield rng.integers(0, 1 << 16, min(chunk, n_tokens - lo), dtype=np.uint16)


def bench_windows(cfg: Config, tmp: str) -> list[Row]:
    import grain_rox

    path = os.path.join(tmp, "windows.rox")
    n_tokens = cfg.window_corpus_bytes // 2
    grain_rox.write_rox(random_chunks(n_tokens, 8 << 20, 3), path, dtype=np.uint16)
    _, raw, _ = footer(path)
    corpus = grain_rox.open_rox(path)
    assert len(corpus.paths) == 1 and corpus.num_tokens == raw // 2
    mm = np.memmap(path, dtype=np.uint16, mode="r", shape=(raw // 2,))
    view = corpus.tokens(0, corpus.num_tokens)  # the whole single shard, zero-copy
    assert isinstance(view, np.ndarray) and not view.flags.owndata
    log(f"row 3: {raw / 2**20:.0f} MiB single-shard uint16 corpus written")

    # Warm the page cache and both mappings' page tables (one token per 4 KiB page).
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass
    assert int(mm[::2048].sum()) == int(view[::2048].sum())

    w, batch = cfg.window_tokens, cfg.gather_batch
    rng = np.random.default_rng(4)
    starts_arr = rng.integers(0, corpus.num_tokens - w + 1, cfg.windows)
    starts = starts_arr.tolist()
    mask = batch - 1
    assert batch & mask == 0
    buf = np.empty((batch, w), np.uint16)
    ar = np.arange(w)
    batches = [starts_arr[i : i + batch] for i in range(0, cfg.windows, batch)]
    batches = [b for b in batches if len(b) == batch]
    n_gathered = batch * len(batches)

    def loop_ours() -> dict[str, float]:
        t0 = time.perf_counter()
        for i, s in enumerate(starts):
            buf[i & mask] = np.asarray(corpus.tokens(s, s + w))
        return {"windows_per_s": len(starts) / (time.perf_counter() - t0)}

    def loop_memmap() -> dict[str, float]:
        t0 = time.perf_counter()
        for i, s in enumerate(starts):
            buf[i & mask] = mm[s : s + w]
        return {"windows_per_s": len(starts) / (time.perf_counter() - t0)}

    def gather(source: np.ndarray) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            t0 = time.perf_counter()
            for b in batches:
                np.take(source, b[:, None] + ar, out=buf)
            return {"windows_per_s": n_gathered / (time.perf_counter() - t0)}

        return run

    def strided(source: np.ndarray) -> Callable[[], dict[str, float]]:
        rows = np.lib.stride_tricks.sliding_window_view(source, w)  # no copy: a strided view

        def run() -> dict[str, float]:
            t0 = time.perf_counter()
            for b in batches:
                buf[...] = rows[b]  # one contiguous row copy per window
            return {"windows_per_s": n_gathered / (time.perf_counter() - t0)}

        return run

    # Check once that all the variants read the same tokens.
    s0 = starts[0]
    np.take(view, batches[0][:, None] + ar, out=buf)
    assert np.array_equal(buf[0], mm[batches[0][0] : batches[0][0] + w])
    assert np.array_equal(np.lib.stride_tricks.sliding_window_view(view, w)[batches[0]], buf)
    assert np.array_equal(np.asarray(corpus.tokens(s0, s0 + w)), mm[s0 : s0 + w])

    loop = interleave(cfg.runs_windows, {"ours": loop_ours, "memmap": loop_memmap})
    gath = interleave(cfg.runs_windows, {"ours": gather(view), "memmap": gather(mm)})
    strd = interleave(cfg.runs_windows, {"ours": strided(view), "memmap": strided(mm)})
    corpus.close()  # views still alive keep the map until they go
    os.unlink(path)
    size = f"{raw / 2**20:.0f} MiB uint16 single shard, page cache warm"
    return [
        Row("3a", f"random {w}-token windows, loop", "kwin/s",
            loop["ours"]["windows_per_s"], loop["memmap"]["windows_per_s"], True,
            f"{cfg.windows:,} x buf[i] = np.asarray(corpus.tokens(s, s + {w})) ({size})",
            f"the same with buf[i] = np.memmap(raw region)[s : s + {w}]",
            scale=1e3),
        Row("3b", f"random {w}-token windows, gather", "kwin/s",
            gath["ours"]["windows_per_s"], gath["memmap"]["windows_per_s"], True,
            f"np.take(view, starts[:, None] + arange({w}), out=buf), batches of {batch}, "
            "view = corpus.tokens(0, num_tokens)",
            "the same fancy-index gather on the np.memmap",
            scale=1e3),
        Row("3c", f"random {w}-token windows, strided", "kwin/s",
            strd["ours"]["windows_per_s"], strd["memmap"]["windows_per_s"], True,
            f"buf[...] = sliding_window_view(view, {w})[starts], batches of {batch} (one row "
            "copy per window instead of one index per token)",
            "the same on the np.memmap",
            scale=1e3),
    ]  # fmt: skip


# ---- table ------------------------------------------------------------------------------------
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


def render(rows: list[Row]) -> str:
    header = ("row", "measurement", "unit", "ours", "theirs", "ours/theirs", "better", "runs",
              "spread")  # fmt: skip
    lines = []
    for r in rows:
        if r.skipped:
            lines.append((r.key, r.what, r.unit, "skip", "skip", "-", "-", "0", "-"))
            continue
        ratio = r.ratio
        noise = r.noise
        if ratio is None and r.ours_median == 0 and r.theirs_median == 0:
            shown = "equal"
        else:
            shown = "-" if ratio is None else f"{ratio:.2f}x"
        lines.append(
            (
                r.key,
                r.what,
                r.unit,
                fmt(r.ours_median, r.scale),
                fmt(r.theirs_median, r.scale),
                shown,
                "higher" if r.higher_is_better else "lower",
                str(min(len(r.ours), len(r.theirs))),
                "-" if noise is None else f"{100 * noise:.0f}%",
            )
        )
    widths = [max(len(x[i]) for x in [header, *lines]) for i in range(len(header))]
    right = {3, 4, 5, 7, 8}

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(wd) if i in right else c.ljust(wd)
            for i, (c, wd) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [line(header), line(tuple("-" * wd for wd in widths))]
    out += [line(x) for x in lines]
    out.append("")
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


def machine() -> dict[str, Any]:
    import grain_rox

    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "grain_rox": grain_rox.__version__,
        "platform": platform.platform(),
        "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("roxxel", "tiktoken"):
        try:
            info[dist] = version(dist)
        except PackageNotFoundError:
            info[dist] = None
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, < 60 s (smoke test)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="where to write the JSON")
    parser.add_argument("--tmpdir", default=None, help="where to put the temporary data")
    parser.add_argument(
        "--only", default="123", help="which row groups to run, e.g. '13' (default: all)"
    )
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    info = machine()
    started = time.perf_counter()
    runs = sorted({cfg.runs_convert, cfg.runs_open, cfg.runs_windows})
    load = f" | load avg {info['loadavg'][0]:.2f}" if info["loadavg"] else ""
    print(
        f"grain_rox {info['grain_rox']} vs roxxel {info['roxxel']} | nproc {info['nproc']} "
        f"(usable {info['usable_cpus']}) | python {info['python']} | numpy {info['numpy']} | "
        f"tiktoken {info['tiktoken']}{load}",
        flush=True,
    )
    print(
        f"mode: {'quick' if cfg.quick else 'full'}. Shown: medians of N interleaved runs "
        f"(A, B, A, B, ...; N = {'/'.join(map(str, runs))} per row, see 'runs'); "
        "ratio = ours / theirs.",
        flush=True,
    )
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="grain_rox_bench_", dir=args.tmpdir) as tmp:
        if "1" in args.only:
            rows += bench_convert(cfg, tmp)
        if "2" in args.only:
            rows += bench_open(cfg, tmp)
        if "3" in args.only:
            rows += bench_windows(cfg, tmp)
    elapsed = time.perf_counter() - started
    print("\n" + render(rows), flush=True)
    print(f"\ntotal {elapsed:.0f} s", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "format",
        "mode": "quick" if cfg.quick else "full",
        "machine": info,
        "config": dataclasses.asdict(cfg),
        "seconds": elapsed,
        "rows": [r.to_json() for r in rows],
    }
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
