"""Benchmark grain_rox's ArrayRecord and NumPy sources against loaderx 0.1.4 and plain Grain.

Run as ``python benchmarks/bench_array_record.py [--quick]``. Every measurement is repeated (at
least 3 times) with the contenders interleaved (A, B, C, A, B, C, ...) so that the noise of a
shared machine hits all alike; the table shows medians, ratios and the issue's targets
(``PASS``/``MISS``; a miss never fails the script). It is printed at the end and written as
JSON to ``bench_out/array_record.json``.

Rows:

1. fixed-shape rows: an ArrayRecord file of N (1024,) int32 rows (``group_size:1,zstd``, one
   row's raw bytes per record, loaderx's layout) and their int32 labels in a ``.npy``; shuffled
   (32, 1024) batches/s of ``ArrayRecordSource.batches`` (with the labels read by the same
   indices, and without) vs loaderx's ``DataLoader(ARDataset, NPDataset)`` and vs Grain's
   plain ``ArrayRecordDataSource -> shuffle -> map(frombuffer) -> batch(32)`` pipeline;
2. the same rows as ``.npy`` files: ``NumpySource({x, y}).batches`` vs loaderx's
   ``DataLoader(NPDataset, NPDataset)``;
3. variable-length uint16 token documents in ArrayRecord (lengths uniform in 50..2000):
   documents/s of ``ArrayRecordSource(dtype=np.uint16)`` through a shuffled Grain
   ``MapDataset`` vs Grain's plain ``ArrayRecordDataSource`` + ``np.frombuffer``, and packed
   (32, 1024) batches/s of ``pack_documents`` over each.

Where ours is slower than its peer (or with ``--profile``), the script runs cProfile over one
pass of our side and prints the top functions under the table. loaderx is optional: without it
(``pip install loaderx==0.1.4``) its rows print ``skip``. All data lives in a temporary
directory that is removed at the end; nothing is downloaded.
"""

from __future__ import annotations

import os

# As in the other benchmarks; before anything (Grain) imports JAX. Nothing here runs on a device.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ["JAX_PLATFORMS"] = "cpu"

import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grain
import numpy as np

from grain_rox import ArrayRecordSource, NumpySource, pack_documents, shuffled_batches

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for _harness, however this is run
from _harness import (
    Row,
    arg_parser,
    finish,
    interleave,
    log,
    machine,
    print_header,
    profile_top,
    ratio_at_least,
    read_through,
    render_profile,
    scratch_dir,
    warm_up,
)

BATCH = 32
ROW_SHAPE = (1024,)
SEQ_LEN = 1024
VOCAB = 50257
DOC_LENGTHS = (50, 2000)  # token documents: lengths uniform in [50, 2000]
LOADERX_VERSION = "0.1.4"
WARM_UP = 10  # batches (documents: x 10) of each contender's untimed warm-up pass
Contender = Callable[[int], dict[str, float]]
Profiler = tuple[str, Callable[[], object]]  # (which of our contenders, one pass of it)


# ---- configuration --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Config:
    quick: bool
    rows: int  # rows 1-2: records of shape (1024,) int32
    batches: int  # rows 1: timed batches per run (after one warm-up batch)
    plain_batches: int  # row 1b: timed batches of Grain's plain (slow) pipeline
    numpy_batches: int  # row 2: timed batches per run
    doc_tokens: int  # row 3: tokens of the document file (about)
    documents: int  # row 3a/3b: timed documents per run
    packed_batches: int  # row 3c: timed packed batches per run
    runs: int


FULL = Config(
    quick=False,
    rows=20_000,
    batches=2000,
    plain_batches=600,
    numpy_batches=5000,
    doc_tokens=20_000_000,
    documents=5000,
    packed_batches=200,
    runs=5,
)
QUICK = dataclasses.replace(
    FULL,
    quick=True,
    rows=4000,
    batches=300,
    plain_batches=120,
    numpy_batches=1000,
    doc_tokens=4_000_000,
    documents=1000,
    packed_batches=40,
    runs=3,
)


def import_loaderx() -> tuple[Any, str | None]:
    """(loaderx, None), or (None, why its rows are skipped)."""
    try:
        import loaderx
    except ImportError:
        return None, f"loaderx is not installed (pip install loaderx=={LOADERX_VERSION})"
    missing = [n for n in ("ARDataset", "NPDataset", "DataLoader") if not hasattr(loaderx, n)]
    if missing:
        version = getattr(loaderx, "__version__", "?")
        return None, f"loaderx {version} has no {missing} (this compares {LOADERX_VERSION}'s API)"
    return loaderx, None


# ---- helpers ----------------------------------------------------------------------------------
def timed(n: int, start: Callable[[], Any], close: Callable[[Any], object]) -> float:
    """Per second of ``n`` elements of the iterator ``start()`` makes, timed from ``start``
    on (prefetching loaders fill their queues in bursts: Grain's 16 read threads deliver
    their first ~50 batches at once, so no warm-up element is skipped); then ``close`` it."""
    t0 = time.perf_counter()
    it = start()
    for _ in range(n):
        next(it)
    rate = n / (time.perf_counter() - t0)
    close(it)
    return rate


def ar_writer(path: str) -> Any:
    from array_record.python.array_record_module import ArrayRecordWriter

    return ArrayRecordWriter(path, "group_size:1,zstd")


def plain_source(path: str) -> Any:
    return grain.sources.ArrayRecordDataSource(path)


class WithLabels:
    """ArrayRecord rows and ``.npy`` labels read by the same indices: ``{"data", "label"}``
    batches through ``shuffled_batches`` (what ``ArrayRecordSource.batches`` calls)."""

    def __init__(self, data: ArrayRecordSource, labels: NumpySource) -> None:
        self.data, self.labels = data, labels

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        return f"WithLabels({self.data!r}, {self.labels!r})"

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        return {"data": self.data.get_batch(indices), "label": self.labels.get_batch(indices)}


def iterate(make: Callable[[], Any]) -> Contender:
    """A contender: n elements of a fresh Grain iterator of ``make()``."""

    def run(n: int) -> dict[str, float]:
        return {"per_s": timed(n, lambda: iter(make()), lambda it: it.close())}

    return run


def loaderx_run(loaderx: Any, data: Callable[[], Any], labels: Callable[[], Any]) -> Contender:
    """A contender: n batches of a fresh (endless) loaderx DataLoader."""

    def start() -> Any:
        return loaderx.DataLoader(data(), labels(), batch_size=BATCH)  # shuffle, seed 42

    def run(n: int) -> dict[str, float]:
        # close() stops and joins its sampler and prefetch threads
        return {"per_s": timed(n, start, lambda loader: loader.close())}

    return run


def with_n(contenders: Mapping[str, tuple[Contender, int]]) -> dict[str, Callable[[], dict]]:
    return {name: functools.partial(fn, n) for name, (fn, n) in contenders.items()}


def skipped_row(key: str, what: str, unit: str, why: str, target: Any = None) -> Row:
    return Row(key, what, unit, [], [], True, "", "", target, skipped=why)


# ---- data ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Files:
    rows_ar: str  # (rows, 1024) int32, one row's bytes per record
    data_npy: str  # the same rows as one .npy
    labels_npy: str  # (rows,) int32


def write_rows(cfg: Config, tmp: str) -> Files:
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, (cfg.rows, *ROW_SHAPE), dtype=np.int32)
    y = rng.integers(0, 10, cfg.rows, dtype=np.int32)
    files = Files(
        os.path.join(tmp, "train_data.array_record"),
        os.path.join(tmp, "train_data.npy"),
        os.path.join(tmp, "train_label.npy"),
    )
    w = ar_writer(files.rows_ar)
    for row in x:
        w.write(row.tobytes())
    w.close()
    np.save(files.data_npy, x)
    np.save(files.labels_npy, y)
    read_through([files.rows_ar, files.data_npy, files.labels_npy])
    return files


def write_documents(cfg: Config, tmp: str) -> tuple[str, int, int]:
    """(path, documents, tokens): uint16 documents of uniform lengths in DOC_LENGTHS."""
    rng = np.random.default_rng(1)
    lo, hi = DOC_LENGTHS
    lengths = rng.integers(lo, hi + 1, cfg.doc_tokens // ((lo + hi) // 2))
    path = os.path.join(tmp, "documents.array_record")
    w = ar_writer(path)
    for n in lengths.tolist():
        w.write(rng.integers(0, VOCAB, n, dtype=np.uint16).tobytes())
    w.close()
    read_through([path])
    return path, len(lengths), int(lengths.sum())


# ---- row 1: fixed-shape rows --------------------------------------------------------------------
def bench_rows(cfg: Config, files: Files, loaderx: Any, why: str | None) -> tuple[list[Row], dict]:
    path = files.rows_ar
    reads = grain.ReadOptions(num_threads=0, prefetch_buffer_size=2)

    def ours_data() -> Any:
        src = ArrayRecordSource(path, dtype=np.int32, shape=ROW_SHAPE)
        return src.batches(BATCH, seed=0, num_epochs=-1).to_iter_dataset(reads)

    def ours_labeled() -> Any:
        src = WithLabels(
            ArrayRecordSource(path, dtype=np.int32, shape=ROW_SHAPE), NumpySource(files.labels_npy)
        )
        return shuffled_batches(src, BATCH, seed=0, num_epochs=-1).to_iter_dataset(reads)

    def plain() -> Any:
        return (
            grain.MapDataset.source(plain_source(path))
            .shuffle(seed=0)
            .map(lambda b: np.frombuffer(b, np.int32))
            .batch(BATCH)
            .to_iter_dataset()  # Grain's defaults: 16 read threads, 500 elements of prefetch
        )

    # Checks: every side makes (32, 1024) int32 batches of the file's rows.
    first = next(iter(ours_labeled()))
    assert first["data"].shape == (BATCH, *ROW_SHAPE) and first["label"].shape == (BATCH,)
    x = np.load(files.data_npy, mmap_mode="r")
    y = np.load(files.labels_npy, mmap_mode="r")
    b = next(iter(plain()))
    assert b.shape == (BATCH, *ROW_SHAPE) and b.dtype == np.int32, (b.shape, b.dtype)
    rows_found = [int(np.flatnonzero((x[:, :4] == r[:4]).all(1))[0]) for r in first["data"][:4]]
    assert np.array_equal(y[rows_found], first["label"][:4]), "labels do not follow their rows"

    n = cfg.batches
    epoch = cfg.rows // BATCH  # Grain's plain pipeline runs one epoch (no repeat)
    assert cfg.plain_batches <= epoch, (cfg.plain_batches, epoch)
    contenders: dict[str, tuple[Contender, int]] = {
        "ours_labeled": (iterate(ours_labeled), n),
        "ours_data": (iterate(ours_data), n),
        "grain_plain": (iterate(plain), cfg.plain_batches),
    }
    if loaderx is not None:
        lx = loaderx_run(
            loaderx,
            lambda: loaderx.ARDataset(path, dtype=np.int32, shape=ROW_SHAPE),
            lambda: loaderx.NPDataset(files.labels_npy),
        )
        loader = loaderx.DataLoader(
            loaderx.ARDataset(path, dtype=np.int32, shape=ROW_SHAPE),
            loaderx.NPDataset(files.labels_npy),
            batch_size=BATCH,
        )
        batch = next(loader)
        loader.close()
        assert batch["data"].shape == (BATCH, *ROW_SHAPE) and batch["label"].shape == (BATCH,)
        contenders["loaderx"] = (lx, n)
    warm_up({k: functools.partial(fn, WARM_UP) for k, (fn, _) in contenders.items()})
    runs = interleave(cfg.runs, with_n(contenders))
    log("row 1 done")

    file = (
        f"{cfg.rows:,} rows of (1024,) int32 in one ArrayRecord file (group_size:1,zstd, "
        f"{os.path.getsize(path) / 1e6:.0f} MB), labels (int32) in a .npy"
    )
    ours_lab = (
        "shuffled_batches(WithLabels(ArrayRecordSource(ar, dtype=int32, shape=(1024,)), "
        f"NumpySource(labels.npy)), {BATCH}, seed=0, num_epochs=-1).to_iter_dataset(ReadOptions("
        "num_threads=0, prefetch_buffer_size=2)): {data, label}; WithLabels.get_batch = both "
        "sources' get_batch(indices) (ArrayRecordSource.batches is shuffled_batches(self, ...))"
    )
    ours_dat = (
        f"ArrayRecordSource(ar, dtype=int32, shape=(1024,)).batches({BATCH}, seed=0, "
        "num_epochs=-1).to_iter_dataset(ReadOptions(num_threads=0, prefetch_buffer_size=2)): "
        "data only"
    )
    lx_is = (
        f"loaderx {LOADERX_VERSION} DataLoader(ARDataset(ar, dtype=int32, shape=(1024,)), "
        f"NPDataset(labels.npy), batch_size={BATCH}) (shuffle=True, seed=42, prefetch_size=8: "
        "a sampler thread and a prefetch thread), next(loader) -> {data, label}"
    )
    rows: list[Row] = []
    per_run = f"each run: {n} batches, timed from building the iterator; {file}"
    if loaderx is None:
        rows.append(
            skipped_row(
                "1a", "ArrayRecord rows+labels vs loaderx", "batch/s", str(why), ratio_at_least(2)
            )
        )
    else:
        rows.append(
            Row("1a", "ArrayRecord rows+labels vs loaderx", "batch/s",
                runs["ours_labeled"]["per_s"], runs["loaderx"]["per_s"], True, ours_lab, lx_is,
                ratio_at_least(2), note=f"same work on both sides (rows from the ArrayRecord "
                f"file, labels from the .npy, same indices); {per_run}")
        )  # fmt: skip
    rows.append(
        Row("1b", "ArrayRecord rows vs plain Grain", "batch/s", runs["ours_data"]["per_s"],
            runs["grain_plain"]["per_s"], True, ours_dat,
            "MapDataset.source(grain.sources.ArrayRecordDataSource(ar)).shuffle(seed=0).map("
            f"lambda b: np.frombuffer(b, np.int32)).batch({BATCH}).to_iter_dataset() (Grain's "
            "defaults: 16 read threads, prefetch 500)",
            note=f"data only on both sides; Grain's plain pipeline: {cfg.plain_batches} "
            f"batches per run (it is slow), of its one epoch of {cfg.rows // BATCH}")
    )  # fmt: skip
    if loaderx is None:
        rows.append(skipped_row("1c", "ArrayRecord rows only vs loaderx", "batch/s", str(why)))
    else:
        rows.append(
            Row("1c", "ArrayRecord rows only vs loaderx", "batch/s", runs["ours_data"]["per_s"],
                runs["loaderx"]["per_s"], True, "as 1b", "as 1a",
                note="loaderx always reads a labelset (here 1a's .npy gather of 32 int32s): "
                "ours does slightly less work")
        )  # fmt: skip
    return rows, {"runs": runs}


# ---- row 2: NumPy -------------------------------------------------------------------------------
def bench_numpy(cfg: Config, files: Files, loaderx: Any, why: str | None) -> tuple[list[Row], dict]:
    reads = grain.ReadOptions(num_threads=0, prefetch_buffer_size=2)

    def ours_ds() -> Any:
        src = NumpySource({"x": files.data_npy, "y": files.labels_npy})
        return src.batches(BATCH, seed=0, num_epochs=-1)

    def direct(n: int) -> dict[str, float]:
        ds = ours_ds()
        return {"per_s": timed(n, lambda: (ds[k] for k in range(n)), lambda it: None)}

    first = ours_ds()[0]
    assert first["x"].shape == (BATCH, *ROW_SHAPE) and first["y"].shape == (BATCH,)
    if loaderx is None:
        return [
            skipped_row("2a", "NumPy rows+labels vs loaderx", "batch/s", str(why),
                        ratio_at_least(2)),
            skipped_row("2b", "NumPy: MapDataset[k] (no iterator) vs loaderx", "batch/s", str(why)),
        ], {}  # fmt: skip
    n = cfg.numpy_batches
    contenders: dict[str, tuple[Contender, int]] = {
        "ours": (iterate(lambda: ours_ds().to_iter_dataset(reads)), n),
        "ours_direct": (direct, n),
        "loaderx": (
            loaderx_run(
                loaderx,
                lambda: loaderx.NPDataset(files.data_npy),
                lambda: loaderx.NPDataset(files.labels_npy),
            ),
            n,
        ),
    }
    warm_up({k: functools.partial(fn, WARM_UP) for k, (fn, _) in contenders.items()})
    runs = interleave(cfg.runs, with_n(contenders))
    log("row 2 done")
    files_are = f"train_data.npy ({cfg.rows:,}, 1024) int32 + train_label.npy ({cfg.rows:,},) int32"
    lx_is = (
        f"loaderx {LOADERX_VERSION} DataLoader(NPDataset(train_data.npy), NPDataset("
        f"train_label.npy), batch_size={BATCH}) (mmap; sampler + prefetch threads), next(loader)"
    )
    return [
        Row("2a", "NumPy rows+labels vs loaderx", "batch/s", runs["ours"]["per_s"],
            runs["loaderx"]["per_s"], True,
            f"NumpySource({{x: train_data.npy, y: train_label.npy}}).batches({BATCH}, seed=0, "
            "num_epochs=-1).to_iter_dataset(ReadOptions(num_threads=0, prefetch_buffer_size=2))",
            lx_is, ratio_at_least(2),
            note=f"{files_are}; each run: {n} batches, timed from building the iterator; "
            "loaderx draws each batch independently "
            "(rng.choice without replacement), ours is a per-epoch permutation"),
        Row("2b", "NumPy: MapDataset[k] (no iterator) vs loaderx", "batch/s",
            runs["ours_direct"]["per_s"], runs["loaderx"]["per_s"], True,
            "the same NumpySource(...).batches(...) MapDataset indexed directly, ds[k], "
            f"k = 0..{n - 1}: the source without Grain's iterator", "as 2a (the same runs)",
            note="diagnostic: how much of 2a is Grain's iterator"),
    ], {"runs": runs}  # fmt: skip


# ---- row 3: token documents -----------------------------------------------------------------------
def bench_documents(cfg: Config, tmp: str) -> tuple[list[Row], dict, dict[str, Profiler]]:
    t0 = time.perf_counter()
    path, n_docs, n_tokens = write_documents(cfg, tmp)
    log(f"row 3: {n_docs:,} documents, {n_tokens:,} uint16 tokens, written in "
        f"{time.perf_counter() - t0:.1f} s")  # fmt: skip
    ours_src = ArrayRecordSource(path, dtype=np.uint16)
    plain_src = plain_source(path)

    def frombuffer(b: bytes) -> np.ndarray:
        return np.frombuffer(b, np.uint16)

    def ours_docs() -> Any:
        return (
            grain.MapDataset.source(ours_src)
            .shuffle(seed=0)
            .to_iter_dataset(grain.ReadOptions(num_threads=0))
        )

    def plain_docs(options: grain.ReadOptions | None) -> Callable[[], Any]:
        def make() -> Any:
            ds = grain.MapDataset.source(plain_src).shuffle(seed=0).map(frombuffer)
            return ds.to_iter_dataset() if options is None else ds.to_iter_dataset(options)

        return make

    def ours_pack() -> Any:
        return pack_documents(ours_src, seq_len=SEQ_LEN, batch_size=BATCH, num_epochs=None)

    def plain_pack() -> Any:
        ds = grain.MapDataset.source(plain_src).map(frombuffer)
        return pack_documents(ds, seq_len=SEQ_LEN, batch_size=BATCH, num_epochs=None)

    # Checks: the same shuffle gives the same documents; the same packer the same batches.
    k = 50
    a, b = iter(ours_docs()), iter(plain_docs(None)())
    same_docs = all(np.array_equal(next(a), next(b)) for _ in range(k))
    a.close()
    b.close()
    a, b = iter(ours_pack()), iter(plain_pack())
    pa, pb = next(a), next(b)
    same_pack = set(pa) == set(pb) and all(np.array_equal(pa[f], pb[f]) for f in pa)
    assert pa["inputs"].shape == (BATCH, SEQ_LEN), pa["inputs"].shape
    a.close()
    b.close()

    nd, nb = cfg.documents, cfg.packed_batches
    assert nd <= n_docs, (nd, n_docs)  # Grain's plain pipeline: one epoch, no repeat
    contenders: dict[str, tuple[Contender, int]] = {
        "ours_docs": (iterate(ours_docs), nd),
        "plain_docs": (iterate(plain_docs(None)), nd),
        "plain_docs_nothreads": (iterate(plain_docs(grain.ReadOptions(num_threads=0))), nd),
        "ours_pack": (iterate(ours_pack), nb),
        "plain_pack": (iterate(plain_pack), nb),
    }
    warm_up(
        {
            k: functools.partial(fn, WARM_UP * (10 if k.endswith("docs") else 1))
            for k, (fn, _) in contenders.items()
        }
    )
    runs = interleave(cfg.runs, with_n(contenders))
    log("row 3 done")
    corpus = (
        f"{n_docs:,} uint16 documents, {n_tokens / 1e6:.1f}M tokens, lengths uniform in "
        f"{DOC_LENGTHS[0]}..{DOC_LENGTHS[1]}, one ArrayRecord file (group_size:1,zstd)"
    )
    plain_is = (
        "MapDataset.source(grain.sources.ArrayRecordDataSource(docs)).shuffle(seed=0).map("
        "lambda b: np.frombuffer(b, np.uint16)).to_iter_dataset({})"
    )
    rows = [
        Row("3a", "documents vs plain Grain (defaults)", "doc/s", runs["ours_docs"]["per_s"],
            runs["plain_docs"]["per_s"], True,
            "MapDataset.source(ArrayRecordSource(docs, dtype=np.uint16)).shuffle(seed=0)"
            ".to_iter_dataset(ReadOptions(num_threads=0))",
            plain_is.format("") + " (Grain's defaults: 16 read threads, prefetch 500)",
            note=f"{corpus}; each run: {nd} documents, timed from building the iterator; the "
            f"first {k} documents of both are equal: {same_docs}"),
        Row("3b", "documents vs plain Grain, 0 threads", "doc/s", runs["ours_docs"]["per_s"],
            runs["plain_docs_nothreads"]["per_s"], True, "as 3a (the same runs)",
            plain_is.format("ReadOptions(num_threads=0)"),
            note="diagnostic: the same ReadOptions on both sides, only the source differs"),
        Row("3c", "packed batches vs plain Grain source", "batch/s", runs["ours_pack"]["per_s"],
            runs["plain_pack"]["per_s"], True,
            f"pack_documents(ArrayRecordSource(docs, dtype=np.uint16), seq_len={SEQ_LEN}, "
            f"batch_size={BATCH}, num_epochs=None) (best-fit; documents cut to {SEQ_LEN + 1} "
            "tokens)",
            "pack_documents(MapDataset.source(grain.sources.ArrayRecordDataSource(docs)).map("
            "lambda b: np.frombuffer(b, np.uint16)), same arguments)",
            note=f"each run: {nb} batches, timed from building the iterator; the first packed "
            f"batch of both is equal: {same_pack}"),
    ]  # fmt: skip
    docs = ("ours_docs", lambda: iterate(ours_docs)(nd))
    profilers = {"3a": docs, "3b": docs, "3c": ("ours_pack", lambda: iterate(ours_pack)(nb))}
    return rows, {"runs": runs, "documents": n_docs, "tokens": n_tokens}, profilers


# ---- profiles of our side -----------------------------------------------------------------------
def profile_rows(cfg: Config, files: Files, kind: str) -> None:
    """One pass of row 1's ours (``kind``: "labeled" or "data") for cProfile."""
    src = ArrayRecordSource(files.rows_ar, dtype=np.int32, shape=ROW_SHAPE)
    source: Any = src if kind == "data" else WithLabels(src, NumpySource(files.labels_npy))
    reads = grain.ReadOptions(num_threads=0, prefetch_buffer_size=2)
    ds = shuffled_batches(source, BATCH, seed=0, num_epochs=-1).to_iter_dataset(reads)
    iterate(lambda: ds)(cfg.batches)


def profile_numpy(cfg: Config, files: Files) -> None:
    """One pass of row 2a's ours for cProfile."""
    src = NumpySource({"x": files.data_npy, "y": files.labels_npy})
    reads = grain.ReadOptions(num_threads=0, prefetch_buffer_size=2)
    iterate(lambda: src.batches(BATCH, seed=0, num_epochs=-1).to_iter_dataset(reads))(
        cfg.numpy_batches
    )


# ---- main ---------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = arg_parser(__doc__, "array_record", groups="123", example="13")
    parser.add_argument(
        "--profile", action="store_true", help="profile our side of every row, not only losses"
    )
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    import jax

    loaderx, why = import_loaderx()
    info = machine(("grain", "array_record", "loaderx"), {"jax": jax.__version__})
    started = time.perf_counter()
    print_header(
        f"grain_rox {info['grain_rox']} | grain {info['grain']} | array_record "
        f"{info['array_record']} | loaderx {info['loaderx'] or 'not installed'} | jax "
        f"{info['jax']} | nproc {info['nproc']} (usable {info['usable_cpus']}) | python "
        f"{info['python']} | numpy {info['numpy']}",
        info,
        cfg.quick,
        (cfg.runs,),
        order="A, B, C, A, B, C",
    )
    rows: list[Row] = []
    extra: dict[str, Any] = {}
    profilers: dict[str, Profiler] = {}
    with scratch_dir(args.tmpdir) as tmp:
        if set(args.only) & set("12"):
            t0 = time.perf_counter()
            files = write_rows(cfg, tmp)
            log(f"rows: {cfg.rows:,} x (1024,) int32 as ArrayRecord and .npy, written in "
                f"{time.perf_counter() - t0:.1f} s; page cache warm")  # fmt: skip
            if "1" in args.only:
                r, extra["rows"] = bench_rows(cfg, files, loaderx, why)
                rows += r
                for key, kind in (("1a", "labeled"), ("1b", "data"), ("1c", "data")):
                    profilers[key] = (
                        f"ours_{kind}",
                        functools.partial(profile_rows, cfg, files, kind),
                    )
            if "2" in args.only:
                r, extra["numpy"] = bench_numpy(cfg, files, loaderx, why)
                rows += r
                profilers["2a"] = ("ours_numpy", functools.partial(profile_numpy, cfg, files))
        if "3" in args.only:
            r, extra["documents"], p = bench_documents(cfg, tmp)
            rows += r
            profilers.update(p)
        # Profile our side where it loses (or everywhere with --profile), once per contender.
        appendix = []
        done: set[str] = set()
        for row in rows:
            loses = row.ratio is not None and row.ratio < 1
            if row.skipped or row.key not in profilers or not (loses or args.profile):
                continue
            name, run = profilers[row.key]
            if name in done:
                continue
            done.add(name)
            log(f"row {row.key}: profiling our side ({name})")
            prof = profile_top(run)
            extra.setdefault("profiles", {})[name] = prof
            appendix.append(render_profile(f"cProfile of {name} (row {row.key})", prof))
    return finish(args.out, "array_record", cfg, info, started, rows, extra, appendix=appendix)


if __name__ == "__main__":
    sys.exit(main())
