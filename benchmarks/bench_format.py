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

import dataclasses
import functools
import glob
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for _harness, however this is run
import _harness
from _harness import (
    Row,
    arg_parser,
    build_sparse,
    finish,
    footer,
    import_roxxel,
    machine,
    print_header,
    quiet,
    read_through,
    scratch_dir,
    status_kib,
)

# This script's runs follow each other without waiting for threads, and its progress lines
# carry no elapsed time.
interleave = functools.partial(_harness.interleave, settle_threads=False)
log = functools.partial(_harness.log, elapsed=False)


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


# ---- helpers ----------------------------------------------------------------------------------
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


def fsync_all(directory: str) -> None:
    """Flush a finished write's dirty pages so they are not written back during a later run."""
    for p in glob.glob(os.path.join(directory, "*")):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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

    roxxel = import_roxxel()
    docs = list(grain_rox.builtin_documents("code", limit=cfg.code_docs))
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
                lambda p: grain_rox.write_rox(docs, p, tokenizer=tok),
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
            f"write_rox(docs, tokenizer=tok) on the {corpus}: tiktoken's encode_batch a chunk "
            f"ahead on a thread (its Rust core on all {os.cpu_count()} cores), uint32",
            "roxxel write(docs, tokenizer=<tiktoken adapter>, dtype='uint32'): one encode per doc",
            scale=1e6,
            note=f"tokens ours {ntok['ours_cl100k']:,} / theirs {ntok['theirs_cl100k']:,}; "
            f"raw regions byte-identical: {tok_same}",
        ),
    ]


# ---- row 2: opening a 1 TiB sparse corpus -----------------------------------------------------
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
    reason = build_sparse(
        directory, cfg.sparse_shards, cfg.sparse_shard_bytes, cfg.sparse_block_bytes
    )
    if reason is not None:
        shutil.rmtree(directory)
        log(f"row 2 skipped: {reason}")
        return [
            Row(k, "1 TiB sparse corpus", "-", [], [], False, "", "", skipped=reason) for k in keys
        ]
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
    read_through([path])
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


def main(argv: list[str] | None = None) -> int:
    args = arg_parser(__doc__, "format", groups="123", example="13").parse_args(argv)
    cfg = QUICK if args.quick else FULL
    info = machine(("roxxel", "tiktoken"))
    started = time.perf_counter()
    print_header(
        f"grain_rox {info['grain_rox']} vs roxxel {info['roxxel']} | nproc {info['nproc']} "
        f"(usable {info['usable_cpus']}) | python {info['python']} | numpy {info['numpy']} | "
        f"tiktoken {info['tiktoken']}",
        info,
        cfg.quick,
        (cfg.runs_convert, cfg.runs_open, cfg.runs_windows),
        order="A, B, A, B",
    )
    rows: list[Row] = []
    with scratch_dir(args.tmpdir) as tmp:
        if "1" in args.only:
            rows += bench_convert(cfg, tmp)
        if "2" in args.only:
            rows += bench_open(cfg, tmp)
        if "3" in args.only:
            rows += bench_windows(cfg, tmp)
    return finish(args.out, "format", cfg, info, started, rows, targets=False)


if __name__ == "__main__":
    sys.exit(main())
