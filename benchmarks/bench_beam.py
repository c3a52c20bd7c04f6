"""Benchmark converting on Apache Beam against the local converter, and 1 vs 2 Beam workers.

Run as ``python benchmarks/bench_beam.py [--quick] [--docs N] [--repeats R]``. The same data
(the embedded ``prose`` corpus, its first N documents, tokenized with ``cl100k_base`` when
tiktoken is installed, else ``bytes``; 4 KiB blocks, 1 MiB shards) is converted by:

* the local converter (``write_rox`` over ``tokenize_in_order``, as ``grain-rox convert``);
* ``grain_rox.beam.run_convert`` on the DirectRunner with 1 and 2 worker processes
  (``--direct_running_mode=multi_processing``), start-up of the workers included.

Runs are interleaved (local, beam x1, beam x2, local, ...) so a shared machine's noise hits all
alike; every Beam output is checked equal to the local one byte for byte. The table shows the
median tokens/s of each and the ratios beam/local and 2 workers/1 worker; it is written as JSON
to ``bench_out/beam.json``. Nothing is downloaded; the data lives in a temporary directory.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from grain_rox import builtin_documents, get_tokenizer, write_rox
from grain_rox.beam import run_convert

OUT = Path(__file__).resolve().parent.parent / "bench_out" / "beam.json"
SHARDING = {"block_size": 4096, "max_shard_bytes": 1 << 20}


def local(docs: list[str], path: str, tokenizer: str) -> int:
    from grain_rox._text._tokenize_ahead import tokenize_in_order  # what the CLI runs

    tok = get_tokenizer(tokenizer)
    result = write_rox(tokenize_in_order(docs, tok), path, tokenizer=tok, **SHARDING)
    return result.num_tokens


def on_beam(n_docs: int, path: str, tokenizer: str, workers: int) -> int:
    args = [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    summary = run_convert(
        None, path, builtin="prose", limit=n_docs, tokenizer=tokenizer, beam_args=args, **SHARDING
    )
    return summary.num_tokens


def same_shards(a: str, b: str) -> bool:
    names = sorted(n for n in os.listdir(a) if n.endswith(".rox"))
    other = sorted(n for n in os.listdir(b) if n.endswith(".rox"))
    return names == other and all(Path(a, n).read_bytes() == Path(b, n).read_bytes() for n in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer documents and repeats")
    parser.add_argument("--docs", type=int, default=None, help="documents (default 3000)")
    parser.add_argument("--repeats", type=int, default=None, help="runs of each (default 3)")
    args, _ = parser.parse_known_args()
    n_docs = args.docs or (600 if args.quick else 3000)
    repeats = args.repeats or 3
    tokenizer = "cl100k_base" if importlib.util.find_spec("tiktoken") else "bytes"
    logging.getLogger().setLevel(logging.ERROR)  # Beam's INFO lines
    docs = list(builtin_documents("prose", limit=n_docs))
    rates: dict[str, list[float]] = {"local": [], "beam x1": [], "beam x2": []}
    scratch = tempfile.mkdtemp(prefix="bench_beam_")
    try:
        for r in range(repeats):
            for name in rates:
                out = os.path.join(scratch, f"{name.replace(' ', '_')}_{r}")
                path = os.path.join(out, "p.rox")
                start = time.perf_counter()
                if name == "local":
                    tokens = local(docs, path, tokenizer)
                else:
                    tokens = on_beam(n_docs, path, tokenizer, int(name[-1]))
                seconds = time.perf_counter() - start
                rates[name].append(tokens / seconds)
                if name != "local":
                    assert same_shards(out, os.path.join(scratch, f"local_{r}")), name
                print(f"run {r + 1}/{repeats} {name:8s} {tokens:,} tokens in {seconds:.2f}s")
    finally:
        shutil.rmtree(scratch)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"\n{n_docs} prose documents, {tokenizer}, medians of {repeats} interleaved runs")
    print(f"{'converter':<10} {'tokens/s':>12} {'vs local':>9} {'vs beam x1':>11}")
    for name, rate in med.items():
        vs1 = f"{rate / med['beam x1']:.2f}" if name != "local" else "-"
        print(f"{name:<10} {rate:>12,.0f} {rate / med['local']:>9.2f} {vs1:>11}")
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(
        json.dumps(
            {"documents": n_docs, "tokenizer": tokenizer, "tokens_per_s": rates, "medians": med},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
