"""Read documents from text, JSONL or Parquet files and tokenize them on all cores, in order.

Tokenization runs in a thread pool over chunks of about a megabyte of text: tiktoken and HF
``tokenizers`` release the GIL inside their Rust cores, so threads use every core without
pickling documents to worker processes, and chunks come back in input order, so the output
shards are deterministic.
"""

from __future__ import annotations

import collections
import concurrent.futures
import glob
import json
import os
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from grain_rox._tokenizers import Tokenizer

FORMATS = ("auto", "text", "jsonl", "parquet", "hf", "array_record")
_JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
_PARQUET_SUFFIXES = (".parquet", ".pq")
_ARRAY_RECORD_SUFFIXES = (".array_record", ".arrayrecord")


def expand_inputs(inputs: Sequence[str]) -> list[str]:
    """Expand files, directories (recursively, sorted, hidden files skipped) and globs."""
    files: list[str] = []
    for spec in inputs:
        if any(c in spec for c in "*?["):
            matched = sorted(glob.glob(spec, recursive=True))
            if not matched:
                raise FileNotFoundError(f"the input glob {spec!r} matched no files")
            files.extend(p for p in matched if os.path.isfile(p))
        elif is_hf_dataset_dir(spec):
            files.append(spec)  # a HuggingFace dataset saved with save_to_disk: one input
        elif os.path.isdir(spec):
            found: list[str] = []
            for root, dirs, names in os.walk(spec):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found.extend(os.path.join(root, n) for n in sorted(names) if not n.startswith("."))
            if not found:
                raise FileNotFoundError(f"the input directory {spec!r} holds no files")
            files.extend(found)
        elif os.path.isfile(spec):
            files.append(spec)
        else:
            raise FileNotFoundError(f"input {spec!r} does not exist")
    return files


def is_hf_dataset_dir(path: str) -> bool:
    """Whether ``path`` is a dataset written by HF ``save_to_disk`` (a Dataset or DatasetDict)."""
    return os.path.isdir(path) and any(
        os.path.exists(os.path.join(path, name)) for name in ("state.json", "dataset_dict.json")
    )


def _hf_documents(path: str, text_column: str) -> Iterator[str]:
    try:
        import datasets
    except ImportError:
        raise ImportError("reading a HF dataset needs: pip install 'grain_rox[hf]'") from None
    ds = datasets.load_from_disk(path)
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise ValueError(f"{path} holds splits {list(ds)} and no 'train'; pass one split")
        ds = ds["train"]
    if text_column not in ds.column_names:
        raise KeyError(
            f"{path} has no column {text_column!r} (it has {ds.column_names}); pass --text-column"
        )
    for batch in ds.select_columns([text_column]).iter(batch_size=1024):
        for value in batch[text_column]:
            if value is not None:
                yield value


def detect_format(path: str) -> str:
    """Guess a file's format from its name: jsonl, parquet, hf (a saved dataset),
    array_record (token documents) or text."""
    if is_hf_dataset_dir(path):
        return "hf"
    lower = path.lower()
    if lower.endswith(_ARRAY_RECORD_SUFFIXES) or ".array_record-" in lower:
        return "array_record"
    if lower.endswith(_JSONL_SUFFIXES):
        return "jsonl"
    if lower.endswith(_PARQUET_SUFFIXES):
        return "parquet"
    return "text"


def _text_of(record: object, column: str, where: str) -> str:
    if not isinstance(record, dict) or column not in record:
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise KeyError(f"{where} has no column {column!r} (it has {keys}); pass --text-column")
    value = record[column]
    if not isinstance(value, str):
        raise TypeError(f"{where}: column {column!r} holds {type(value).__name__}, not text")
    return value


def read_documents(
    files: Iterable[str], *, fmt: str = "auto", text_column: str = "text"
) -> Iterator[str]:
    """Yield one document per text file, JSONL line, Parquet row or HF dataset row."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {FORMATS}")
    for path in files:
        kind = detect_format(path) if fmt == "auto" else fmt
        if kind == "array_record":
            raise ValueError(
                f"{path} holds token documents, not text: convert ArrayRecord inputs on their "
                "own, with --record-dtype"
            )
        if kind == "hf":
            yield from _hf_documents(path, text_column)
        elif kind == "text":
            with open(path, encoding="utf-8", errors="replace") as f:
                yield f.read()
        elif kind == "jsonl":
            with open(path, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    where = f"{path}:{lineno}"
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{where} is not valid JSON: {e}") from None
                    yield _text_of(record, text_column, where)
        else:
            try:
                import pyarrow.parquet as pq
            except ImportError:
                raise ImportError(
                    "reading Parquet needs pyarrow: pip install 'grain_rox[hf]'"
                ) from None
            pf = pq.ParquetFile(path)
            if text_column not in pf.schema_arrow.names:
                raise KeyError(
                    f"{path} has no column {text_column!r} (it has {pf.schema_arrow.names}); "
                    "pass --text-column"
                )
            for batch in pf.iter_batches(columns=[text_column], batch_size=1024):
                for value in batch.column(0).to_pylist():
                    if value is not None:
                        yield value


def _chunks(docs: Iterable[str], chunk_chars: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    size = 0
    for doc in docs:
        chunk.append(doc)
        size += len(doc)
        if size >= chunk_chars:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def tokenize_in_order(
    docs: Iterable[str],
    tokenizer: Tokenizer,
    *,
    workers: int | None = None,
    chunk_chars: int = 1 << 20,
) -> Iterator[np.ndarray]:
    """Yield ``tokenizer.encode(doc)`` for each doc, in order, tokenizing ahead on threads.

    ``workers`` chunks are tokenized concurrently (default 1: tiktoken and HF tokenizers
    already spread one ``encode_batch`` over all cores; more threads only oversubscribe).

    >>> from grain_rox import ByteTokenizer
    >>> [a.tolist() for a in tokenize_in_order(["ab", "c"], ByteTokenizer(), workers=2)]
    [[97, 98], [99]]
    """
    workers = max(1, workers or 1)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        pending: collections.deque[concurrent.futures.Future[list[np.ndarray]]] = (
            collections.deque()
        )
        for chunk in _chunks(docs, chunk_chars):
            pending.append(pool.submit(tokenizer.encode_batch, chunk))
            if len(pending) > workers:
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()
