"""Every source and iterator grain_rox offers, through the same Grain conformance checks
(``grain_rox.testing``). A new source is one line in ``SOURCES``, a new dataset or iterator
one line in ``DATASETS``; it then gets every check. A known defect is an entry in ``KNOWN``
(a strict xfail naming it: the fix turns it into a failure until the entry goes).

Factories are module-level functions of the data directory (``functools.partial`` of them in
the tables), so a fresh interpreter can rebuild the same object. The checks that need other
processes (fresh interpreters, Grain workers) are marked slow; they share one fresh
interpreter (two for the repr) for the whole module.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from collections.abc import Callable
from typing import Any

import grain
import numpy as np
import pytest
from _threads import run_released_together
from array_record.python.array_record_module import ArrayRecordWriter

from grain_rox import (
    ArrayRecordSource,
    HFEagerSource,
    HFStreamingSource,
    MultiHostDataLoadIterator,
    NumpySource,
    RoxBlockSource,
    RoxDocumentSource,
    RoxTokenSource,
    TokenPipeline,
    mix_datasets,
    pack_documents,
    testing,
    write_rox,
)

datasets = pytest.importorskip("datasets")
pq = pytest.importorskip("pyarrow.parquet")
pa = pytest.importorskip("pyarrow")


# ---- the data, one sub-directory per kind (copied whole by the repr check) ------------------
def build_data(root: str, shift: int = 0) -> None:
    """The data; ``shift`` adds to every value (same shapes, lengths and sizes: other data)."""
    rng = np.random.default_rng(12)
    os.makedirs(f"{root}/rox")
    for name, first in (("a", 1), ("b", 3000)):
        docs = [
            first + shift + rng.integers(0, 500, n).astype(np.uint16)
            for n in (90, 130, 40, 210, 75)
        ]
        write_rox(docs, f"{root}/rox/{name}.rox", separator=0, block_size=64)
    os.makedirs(f"{root}/npy")
    np.save(f"{root}/npy/x.npy", np.arange(120, dtype=np.int32).reshape(40, 3) + shift)
    np.save(f"{root}/npy/y.npy", np.arange(40, dtype=np.int64) % 7 + shift)
    os.makedirs(f"{root}/ar")
    writer = ArrayRecordWriter(f"{root}/ar/docs.array_record", "group_size:1")
    for n in (5, 9, 3, 12, 7, 1, 8, 4, 6, 10, 2, 11):
        writer.write((rng.integers(1, 900, n) + shift).astype(np.uint16).tobytes())
    writer.close()
    writer = ArrayRecordWriter(f"{root}/ar/rows.array_record", "group_size:1")
    for i in range(24):
        writer.write((np.arange(3, dtype=np.int32) + 10 * i + shift).tobytes())
    writer.close()
    table = {"ids": [[i + shift, i + 1, i + 2] for i in range(20)], "label": list(range(20))}
    os.makedirs(f"{root}/hf")
    with open(f"{root}/hf/table.json", "w") as f:
        json.dump(table, f)
    datasets.Dataset.from_dict(table).save_to_disk(f"{root}/hf/saved")
    write_tokenized(f"{root}/hf_tok")
    os.makedirs(f"{root}/stream")
    for i in range(2):
        rows = {
            "x": list(range(i * 10 + shift, i * 10 + 10 + shift)),
            "ids": [[j, j] for j in range(10)],
        }
        pq.write_table(pa.table(rows), f"{root}/stream/part{i}.parquet")


def write_tokenized(d: str) -> None:
    """Texts and the tokenizer.json (a word vocabulary, EOS "</s>") that tokenizes them."""
    tokenizers = pytest.importorskip("tokenizers")
    words = ["the", "cat", "sat", "on", "mat", "a", "dog"]
    vocab = {w: i for i, w in enumerate(["[UNK]", "</s>", *words])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    os.makedirs(f"{d}/tok")
    tok.save(f"{d}/tok/tokenizer.json")
    with open(f"{d}/texts.json", "w") as f:
        json.dump({"text": [" ".join(words[i % 5 : i % 5 + 1 + i % 3]) for i in range(20)]}, f)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("conformance"))
    build_data(path)
    return path


# ---- sources: directory -> source ----------------------------------------------------------
def rox_tokens(d: str) -> Any:
    return RoxTokenSource(f"{d}/a.rox", seq_len=16)


def rox_blocks(d: str) -> Any:
    return RoxBlockSource([f"{d}/a.rox", f"{d}/b.rox"])


def rox_documents(d: str) -> Any:
    return RoxDocumentSource(f"{d}/a.rox", seq_len=64)


def pipeline(d: str, **kwargs: Any) -> TokenPipeline:
    sources = {"a": f"{d}/a.rox", "b": f"{d}/b.rox"}
    config = {"seq_len": 16, "global_batch_size": 4, "seed": 1, "weights": {"a": 0.7, "b": 0.3}}
    return TokenPipeline(sources, **(config | kwargs))


def batch_source(d: str, endless: bool = False) -> Any:
    if endless:  # a mixture of two sources
        return pipeline(d).batch_source()
    return TokenPipeline(f"{d}/a.rox", seq_len=16, global_batch_size=4, num_epochs=1).batch_source()


def npy_dict(d: str) -> Any:
    return NumpySource({"x": f"{d}/x.npy", "y": f"{d}/y.npy"})


def npy_array(d: str) -> Any:
    return NumpySource(np.load(f"{d}/x.npy"))


def ar_docs(d: str) -> Any:
    return ArrayRecordSource(f"{d}/docs.array_record", dtype=np.uint16)


def ar_rows(d: str) -> Any:
    return ArrayRecordSource(f"{d}/rows.array_record", dtype=np.int32, shape=(3,))


def hf_saved(d: str) -> Any:
    return HFEagerSource(f"{d}/saved")


def hf_in_memory(d: str) -> Any:
    with open(f"{d}/table.json") as f:
        return HFEagerSource(data=json.load(f))


def hf_tokenized(d: str) -> Any:
    with open(f"{d}/texts.json") as f:
        return HFEagerSource(data=json.load(f), tokenize=["text"], tokenizer=f"{d}/tok")


@dataclasses.dataclass(frozen=True)
class Source:
    make: Callable[[str], Any]
    data: str  # its sub-directory of the data
    batch_size: int | None = 2  # DataLoader batches (None: ragged records, unbatched)
    workers: bool = True  # also through a DataLoader with 2 workers (~20 s: once per kind)


SOURCES = {
    "RoxTokenSource": Source(rox_tokens, "rox"),
    "RoxBlockSource": Source(rox_blocks, "rox"),
    "RoxDocumentSource": Source(rox_documents, "rox", batch_size=None),
    "GlobalBatchSource": Source(batch_source, "rox", batch_size=None),
    "GlobalBatchSource(endless)": Source(
        functools.partial(batch_source, endless=True), "rox", batch_size=None, workers=False
    ),
    "NumpySource(files)": Source(npy_dict, "npy"),
    "NumpySource(array)": Source(npy_array, "npy"),
    "ArrayRecordSource(documents)": Source(ar_docs, "ar", batch_size=None, workers=False),
    "ArrayRecordSource(rows)": Source(ar_rows, "ar"),
    "HFEagerSource(saved)": Source(hf_saved, "hf"),
    "HFEagerSource(in memory)": Source(hf_in_memory, "hf"),
    "HFEagerSource(tokenized)": Source(hf_tokenized, "hf_tok", batch_size=None),
}


# ---- datasets and iterators: data root -> iterable --------------------------------------------
def pipeline_map(r: str) -> Any:
    return pipeline(f"{r}/rox").map_dataset()


def pipeline_iter(r: str) -> Any:
    return pipeline(f"{r}/rox").iter_dataset()


def npy_batches(r: str) -> Any:
    return npy_dict(f"{r}/npy").batches(8, seed=2, num_epochs=2)


def ar_batches(r: str) -> Any:
    return ar_rows(f"{r}/ar").batches(4, seed=3)


def hf_batches(r: str) -> Any:
    return hf_saved(f"{r}/hf").batches(4, seed=4, num_epochs=2)


def mixture(r: str) -> Any:
    parts = {
        "a": grain.MapDataset.source(rox_tokens(f"{r}/rox")),
        "b": grain.MapDataset.source(RoxTokenSource(f"{r}/rox/b.rox", seq_len=16)),
    }
    return mix_datasets(parts, {"a": 0.7, "b": 0.3}, seed=5, length=12)


def packed(r: str) -> Any:
    return pack_documents(rox_documents(f"{r}/rox"), seq_len=32, batch_size=2, num_epochs=1)


def packed_ar(r: str) -> Any:
    return pack_documents(ar_docs(f"{r}/ar"), seq_len=8, batch_size=2, num_epochs=1, seed=6)


def stream(r: str, shuffle_buffer: int = 4) -> Any:
    files = [f"{r}/stream/part{i}.parquet" for i in range(2)]
    return HFStreamingSource(files, shuffle_buffer=shuffle_buffer, seed=7).dataset()


def device_pipeline(r: str) -> Any:
    pipe = pipeline(f"{r}/rox", global_batch_size=8)  # one row per device
    return testing.iterators(lambda: MultiHostDataLoadIterator(pipe))


def device_batches(r: str) -> Any:
    def make() -> Any:
        ds = npy_dict(f"{r}/npy").batches(8, seed=2).to_iter_dataset(grain.ReadOptions())
        return MultiHostDataLoadIterator(ds)

    return testing.iterators(make)


@dataclasses.dataclass(frozen=True)
class Dataset:
    make: Callable[[str], Any]
    max_elements: int | None = None  # a bound for endless (or long) ones
    workers: bool = True  # a Grain dataset that mp_prefetch applies to
    random_access: bool = False  # a MapDataset: its elements are read by index too


DATASETS = {
    "TokenPipeline.map_dataset": Dataset(pipeline_map, max_elements=5, random_access=True),
    "TokenPipeline.iter_dataset": Dataset(pipeline_iter, max_elements=5),
    "NumpySource.batches": Dataset(npy_batches, random_access=True),
    "ArrayRecordSource.batches": Dataset(ar_batches, random_access=True),
    "HFEagerSource.batches": Dataset(hf_batches, random_access=True),
    "mix_datasets": Dataset(mixture, random_access=True),
    "pack_documents(RoxDocumentSource)": Dataset(packed, max_elements=8),
    "pack_documents(ArrayRecordSource)": Dataset(packed_ar),
    "HFStreamingSource.dataset": Dataset(stream),
    "HFStreamingSource.dataset(no shuffle)": Dataset(functools.partial(stream, shuffle_buffer=0)),
    "MultiHostDataLoadIterator(TokenPipeline)": Dataset(
        device_pipeline, max_elements=4, workers=False
    ),
    "MultiHostDataLoadIterator(.batches())": Dataset(device_batches, workers=False),
}

# (row, check) -> the defect that makes it fail today: a strict xfail until fixed.
KNOWN: dict[tuple[str, str], str] = {}


def cases(table: dict[str, Any], check: str, only: Callable[[Any], bool] = bool) -> list[Any]:
    return [
        pytest.param(name, id=name, marks=[pytest.mark.xfail(strict=True, reason=KNOWN[key])])
        if (key := (name, check)) in KNOWN
        else pytest.param(name, id=name)
        for name, row in table.items()
        if only(row)
    ]


def source_of(root: str, name: str) -> tuple[Source, str]:
    row = SOURCES[name]
    return row, f"{root}/{row.data}"


# ---- fast checks -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", cases(SOURCES, "protocol"))
def test_random_access_protocol(root, name):
    row, d = source_of(root, name)
    testing.check_random_access_source(row.make(d))


@pytest.mark.parametrize("name", cases(SOURCES, "pickle"))
def test_pickles_small_without_handles(root, name):
    row, d = source_of(root, name)
    testing.check_pickle(row.make(d), max_bytes=16 * 1024)


@pytest.mark.parametrize("name", cases(SOURCES, "read_only"))
def test_source_records_are_read_only_or_independent(root, name):
    row, d = source_of(root, name)
    testing.check_read_only_records(row.make(d))


@pytest.mark.parametrize("name", cases(DATASETS, "read_only", lambda row: row.random_access))
def test_dataset_elements_are_read_only_or_independent(root, name):
    testing.check_read_only_records(DATASETS[name].make(root))


@pytest.mark.parametrize("name", cases(SOURCES, "checkpoint"))
def test_source_through_grain_restores_at_every_step(root, name):
    row, d = source_of(root, name)
    ds = grain.MapDataset.source(row.make(d)).to_iter_dataset(grain.ReadOptions(num_threads=0))
    testing.check_checkpoint_every_step(ds, max_elements=6)


@pytest.mark.parametrize("name", cases(DATASETS, "checkpoint"))
def test_dataset_restores_at_every_step(root, name):
    row = DATASETS[name]
    testing.check_checkpoint_every_step(row.make(root), max_elements=row.max_elements)


# ---- slow checks: other interpreters and Grain worker processes ----------------------------
@pytest.fixture(scope="module")
def fresh():
    with testing.FreshProcess() as process:
        yield process


@pytest.fixture(scope="module")
def another(fresh):
    with testing.FreshProcess() as process:
        yield process


@pytest.mark.slow
@pytest.mark.parametrize("name", cases(SOURCES, "repr"))
def test_repr_is_stable_across_processes_and_data_copies(root, name, fresh, another):
    row, d = source_of(root, name)
    testing.check_stable_repr(row.make, data_dir=d, fresh=(fresh, another))


@pytest.mark.slow
@pytest.mark.parametrize("name", cases(SOURCES, "data_loader", lambda row: row.workers))
def test_data_loader_with_workers_restores_in_a_fresh_process(root, name, fresh):
    row, d = source_of(root, name)
    testing.check_dataloader_restore_in_fresh_process(
        functools.partial(row.make, d), batch_size=row.batch_size, fresh=fresh
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", cases(DATASETS, "orbax"))
def test_orbax_roundtrip_in_a_fresh_process(root, name, fresh):
    make = functools.partial(DATASETS[name].make, root)
    testing.check_orbax_roundtrip(make, steps=2, read=2, fresh=fresh)


@pytest.mark.slow
@pytest.mark.parametrize("name", cases(DATASETS, "mp_prefetch", lambda row: row.workers))
def test_grain_workers_give_the_in_process_stream(root, name):
    row = DATASETS[name]
    testing.check_mp_prefetch_equal(row.make(root), workers=2, max_elements=row.max_elements)


def device_shards(r: str) -> Any:
    """``.batches()`` sharded by JAX process, as global arrays (built in each process)."""
    import jax

    shard = (jax.process_index(), jax.process_count())
    ds = npy_dict(f"{r}/npy").batches(8, seed=2, shard=shard).to_iter_dataset(grain.ReadOptions())
    return MultiHostDataLoadIterator(ds)


# Iterators of global jax.Arrays whose contract is: N processes build what 1 process does.
DISTRIBUTED = {
    "MultiHostDataLoadIterator(TokenPipeline)": lambda r: MultiHostDataLoadIterator(
        pipeline(f"{r}/rox", global_batch_size=8)
    ),
    "MultiHostDataLoadIterator(.batches(shard=process))": device_shards,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", cases(DISTRIBUTED, "processes"))
def test_two_jax_processes_build_what_one_does(root, name):
    testing.check_processes_equal(functools.partial(DISTRIBUTED[name], root), processes=2)


# ---- the checks catch what they are for ------------------------------------------------------
class Flawed:
    """A list-backed source with one switchable flaw."""

    def __init__(self, flaw: str = "", path: str = "") -> None:
        self.flaw, self.rows = flaw, [np.arange(3) + 10 * i for i in range(6)]
        self.file = open(path, "rb") if flaw == "handle" else None

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        return f"Flawed({self.flaw!r}, pid={os.getpid()})" if self.flaw == "pid" else "Flawed()"

    def __getitem__(self, index: int) -> np.ndarray:
        if self.flaw == "wraps":
            index %= len(self.rows)
        elif not -len(self.rows) <= index < len(self.rows):
            raise IndexError(f"row {index} is out of range")
        row = self.rows[index]
        return row if self.flaw == "shared" else row.copy()

    def _getitems(self, indices: list[int]) -> list[np.ndarray]:
        if self.flaw == "float_rows":  # np.asarray(indices, dtype=np.int64) truncates floats
            indices = np.asarray(indices, dtype=np.int64).tolist()
        got = [self[i] for i in indices]
        return got[::-1] if self.flaw == "getitems" else got


class Shifting:
    """A source whose every other read of a record names its array differently."""

    def __init__(self) -> None:
        self.reads = 0

    def __len__(self) -> int:
        return 3

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        self.reads += 1
        return {"x" if self.reads % 2 else "y": np.full(2, index)}


def test_the_checks_fail_on_flawed_sources(tmp_path):
    testing.check_random_access_source(Flawed())
    testing.check_pickle(Flawed())
    testing.check_read_only_records(Flawed())
    with pytest.raises(AssertionError, match=r"^Flawed\[6\] \(len 6\) returned a record, not"):
        testing.check_random_access_source(Flawed("wraps"))
    with pytest.raises(AssertionError, match=r"^Flawed\._getitems\(\[\.\.5\.\.\]\): values differ"):
        testing.check_random_access_source(Flawed("getitems"))
    with pytest.raises(
        AssertionError, match=r"^Flawed\._getitems\(\[1\.0\]\) returned records: a "
    ):
        testing.check_random_access_source(Flawed("float_rows"))
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(AssertionError, match=r"^Flawed \(unread\) pickles open handles \['Buf"):
        testing.check_pickle(Flawed("handle", str(tmp_path / "f")))
    with pytest.raises(AssertionError, match="editing \\[\\] in place changed a new read"):
        testing.check_read_only_records(Flawed("shared"))
    with pytest.raises(
        AssertionError,
        match=r"^record 0 of Shifting has no leaf at \['x'\] \(its keys: \['y'\]\): a read of the same record",
    ):
        testing.check_read_only_records(Shifting())
    mapped = np.lib.format.open_memmap(str(tmp_path / "m.npy"), "w+", np.int32, (4, 2))
    with pytest.raises(AssertionError, match=r"pickles open handles \['memmap'\]"):
        testing.check_pickle([mapped])


class Forgetful:
    """An iterable whose iterators restore the position but not the running sum."""

    def __iter__(self) -> Any:
        return ForgetfulIterator()


class ForgetfulIterator:
    def __init__(self) -> None:
        self.i, self.total = 0, 0

    def __next__(self) -> int:
        if self.i == 4:
            raise StopIteration
        self.i, self.total = self.i + 1, self.total + self.i
        return self.total

    def get_state(self) -> dict[str, int]:
        return {"i": self.i}

    def set_state(self, state: dict[str, int]) -> None:
        self.i = state["i"]


class ConstantRepr:
    """A source over a directory's ``x.npy`` whose repr names nothing of the data."""

    def __init__(self, directory: str) -> None:
        self.rows = np.load(os.path.join(directory, "x.npy"))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.rows[index].copy()

    def __repr__(self) -> str:
        return "ConstantRepr()"


def test_the_repr_check_fails_when_other_data_gives_the_same_repr(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(4000).reshape(1000, 4))
    with pytest.raises(AssertionError, match=r"repr is the same for copies of .* with one byte "
                       r"changed in any of \['x\.npy'\]: 'ConstantRepr\(\)'; a Grain "
                       r"DataLoader would restore a checkpoint onto other data"):  # fmt: skip
        testing.check_stable_repr(ConstantRepr, data_dir=str(tmp_path), processes=1)


def test_the_checkpoint_check_fails_on_a_lost_state():
    with pytest.raises(AssertionError, match="Restored values mismatch at step 2"):
        testing.check_checkpoint_every_step(Forgetful())
    testing.check_checkpoint_every_step(
        testing.iterators(lambda: iter(grain.MapDataset.range(3).to_iter_dataset()))
    )


@pytest.mark.slow
def test_the_repr_check_fails_on_a_process_dependent_repr():
    with pytest.raises(AssertionError, match=r"^repr differs in fresh process 0 \(data None\)"):
        testing.check_stable_repr(functools.partial(Flawed, "pid"), processes=1)


def pid_seeded() -> Any:
    return grain.MapDataset.range(1000).shuffle(seed=os.getpid()).to_iter_dataset()


@pytest.mark.slow
def test_the_orbax_check_fails_when_a_fresh_process_reads_other_data(fresh):
    with pytest.raises(AssertionError, match=r"^element 2 after the Orbax restore: "):
        testing.check_orbax_roundtrip(pid_seeded, fresh=fresh)


@pytest.mark.slow
def test_the_worker_check_fails_when_workers_batch_their_own_slices():
    batched_first = grain.MapDataset.range(8).to_iter_dataset().batch(2)  # each worker batches
    with pytest.raises(AssertionError, match=r"^element 0 with 2 Grain workers: values differ"):
        testing.check_mp_prefetch_equal(batched_first)


def every_process_reads_everything(r: str) -> Any:
    """Every process reads the whole batch of a plain Grain input (whose elements are each
    process's rows): the 2-process run is not the 1-process one. (A grain_rox .batches()
    dataset read whole on every process keeps each process's rows: it is no such case.)"""
    ds = grain.MapDataset.source(npy_dict(f"{r}/npy")).batch(8)
    return MultiHostDataLoadIterator(ds)


@pytest.mark.slow
def test_the_process_check_fails_when_every_process_reads_everything(root):
    with pytest.raises(
        AssertionError, match=r"^element 0 in process 0 of 2\['x'\]: shape \(16, 3\)"
    ):
        testing.check_processes_equal(
            functools.partial(every_process_reads_everything, root), read=1
        )


# ---- thread safety from the very first read ---------------------------------------------------
def _read_from_threads(source: Any, indices: list[int], threads: int) -> list[list[Any]]:
    """Every record of ``indices`` read by each of ``threads`` threads released together (each
    starting at another index); a thread's exception is raised here."""
    got: list[list[Any]] = [[None] * len(indices) for _ in range(threads)]

    def read(t: int) -> None:
        for k in range(len(indices)):
            j = (k + t) % len(indices)
            got[t][j] = source[indices[j]]

    run_released_together(read, threads)
    return got


@pytest.mark.parametrize("name", cases(SOURCES, "fresh_threads"))
def test_a_fresh_source_read_first_from_8_threads_at_once_gives_the_serial_records(root, name):
    """Grain's read threads share one source, and its first reads open files, maps and caches
    lazily: 8 threads released together onto a just-unpickled copy (as a worker receives it)
    each read every record, and each gets exactly what one thread reads from another copy."""
    import pickle

    row, d = source_of(root, name)
    serial = row.make(d)
    indices = list(range(min(len(serial), 24)))
    expected = [serial[i] for i in indices]
    for attempt in range(3):  # each attempt a new copy, so its first reads race again
        fresh = pickle.loads(pickle.dumps(row.make(d)))
        got = _read_from_threads(fresh, indices, threads=8)
        for t, records in enumerate(got):
            for i, record in zip(indices, records, strict=True):
                testing.assert_tree_equal(
                    record, expected[i], what=f"{name}[{i}] in thread {t}, attempt {attempt}"
                )


# ---- every iterator's restore checks the identity of its data --------------------------------
@pytest.fixture(scope="module")
def other_root(tmp_path_factory) -> str:
    """The data with every value shifted by 1: same files, shapes, lengths and sizes."""
    path = str(tmp_path_factory.mktemp("conformance_other"))
    build_data(path, shift=1)
    return path


@pytest.fixture(scope="module")
def copied_root(root, tmp_path_factory) -> str:
    """A byte-identical copy of the data in another directory."""
    import shutil

    path = str(tmp_path_factory.mktemp("conformance_copy") / "data")
    shutil.copytree(root, path)
    return path


def _next(it: Any, count: int) -> list[Any]:
    return [testing.as_numpy(next(it)) for _ in range(count)]


def _close(it: Any) -> None:
    if callable(getattr(it, "close", None)):
        it.close()


def curriculum_packed(r: str) -> Any:
    from grain_rox import Phase

    phases = [
        Phase(steps=2, batch_size=4, seq_len=16, weights={"a": 1.0}),
        Phase(steps=None, batch_size=2, seq_len=32, weights={"a": 0.5, "b": 0.5}),
    ]
    sources = {"a": f"{r}/rox/a.rox", "b": f"{r}/rox/b.rox"}
    return TokenPipeline(sources, phases=phases, seed=3, packing="best_fit").iter_dataset()


def device_resident(r: str) -> Any:
    def make() -> Any:
        ds = npy_dict(f"{r}/npy").batches(8, seed=2).to_iter_dataset(grain.ReadOptions())
        return MultiHostDataLoadIterator(ds, placement="device")

    return testing.iterators(make)


def roxxel_batches(r: str) -> Any:
    from grain_rox import roxxel_stream

    stream = roxxel_stream(f"{r}/rox/a.rox", seq_len=16, batch_size=8, seed=4)
    return testing.iterators(lambda: MultiHostDataLoadIterator(stream))


# Restores checked only for the identity of their data (the other checks cover their parts).
RESTORES = {
    **{name: row.make for name, row in DATASETS.items()},
    "TokenPipeline.data_loader": lambda r: pipeline(f"{r}/rox").data_loader(),
    "TokenPipeline(phases, packing).iter_dataset": curriculum_packed,
    "MultiHostDataLoadIterator(placement=device)": device_resident,
    "MultiHostDataLoadIterator(roxxel_stream)": roxxel_batches,
}


@pytest.mark.parametrize("name", cases(RESTORES, "restore_identity"))
def test_a_state_restores_onto_a_copy_of_its_data_and_is_refused_on_other_data(
    root, copied_root, other_root, name
):
    """Exact or loud: a state taken after 2 elements restores onto the same dataset over a
    byte-identical copy (the next element is the one the first iterator gave), and over data
    of the same shape with every value shifted by 1 it is a ValueError, never other elements."""
    make = RESTORES[name]
    first = iter(make(root))
    try:
        _next(first, 2)
        state = first.get_state()
        expected = _next(first, 1)
    finally:
        _close(first)
    copy = iter(make(copied_root))
    try:
        copy.set_state(state)
        testing.assert_tree_equal(_next(copy, 1), expected, what=f"{name} on a copy")
    finally:
        _close(copy)
    other = iter(make(other_root))
    try:
        with pytest.raises(ValueError) as info:
            other.set_state(state)
            got = _next(other, 1)
            raise AssertionError(f"{name}: a state of other data restored, serving {got}")
    finally:
        _close(other)
    ours = (
        r"cannot restore this .+ state: (its data or config|the pipeline) changed "
        r"\(.*: saved .+ -> now "
    )
    assert re.match(ours, str(info.value)), f"{name}: {info.value}"
