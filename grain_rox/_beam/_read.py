"""Read the inputs ``grain-rox convert`` reads, on Beam workers, as keyed documents.

The files are listed on the launching machine exactly as the local converter lists them
(:func:`grain_rox._text._convert.expand_inputs`: directories recursively in sorted order,
globs sorted); file number ``f`` is read by one worker with the local readers (text, JSONL,
Parquet, saved HF datasets, or ArrayRecord token documents), and its ``k``-th document is
emitted as ``((f, k), document)``. That key is the order :class:`~grain_rox.beam.WriteRox`
writes in, so the shards equal the local converter's. Skipped files and null texts are counted
in the Beam metrics (and logged by the worker).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
import numpy as np

from grain_rox._beam._metrics import counter
from grain_rox._text._builtin_corpus import BUILTIN_CORPORA, builtin_documents
from grain_rox._text._convert import (
    ENCODING_ERRORS,
    FORMATS,
    ON_BINARY,
    ON_NULL,
    ReadStats,
    detect_format,
    expand_inputs,
    read_files,
    without_output_set,
)


def _choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not one of {tuple(allowed)}")


class _ReadFileFn(beam.DoFn):
    """``(f, path)`` -> ``((f, k), document)`` for every document of that input, in order."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options

    def process(self, element: tuple[int, str]) -> Iterator[tuple[tuple[int, int], Any]]:
        f, path = element
        o = self.options
        if o["builtin"] is not None:
            docs: Iterator[Any] = builtin_documents(o["builtin"], limit=o["limit"])
        elif o["record_dtype"] is not None:
            from grain_rox._sources._array_record import ArrayRecordSource

            docs = ArrayRecordSource([path], dtype=np.dtype(o["record_dtype"])).iter_arrays()
        else:
            stats = ReadStats()
            docs = read_files(
                [path],
                fmt=o["fmt"],
                text_column=o["text_column"],
                on_binary=o["on_binary"],
                encoding_errors=o["encoding_errors"],
                on_null=o["on_null"],
                stats=stats,
            )
        for k, doc in enumerate(docs):
            yield (f, k), doc
        if o["builtin"] is None and o["record_dtype"] is None:
            counter("skipped_inputs").inc(stats.files_skipped)
            counter("null_texts").inc(stats.null_texts)


class ReadDocuments(beam.PTransform):
    """Documents of files, directories and globs (or an embedded corpus), keyed by their order.

    Reads what ``grain-rox convert`` reads, with its options: one document per text file,
    JSONL line, Parquet row or row of a saved HF dataset; ArrayRecord files hold token
    documents (give ``record_dtype``). The files are listed when the transform is made (a
    missing input fails at once); each is read by one worker. Elements are
    ``((file number, position), document)``, the keys :class:`~grain_rox.beam.WriteRox` orders
    by, so the pair gives the shards the local converter writes.

    Args:
      inputs: a path, directory or glob, or a list of them (not with ``builtin``).
      builtin: ``"code"`` or ``"prose"``: the embedded corpus instead of files.
      limit: with ``builtin``, at most this many documents.
      fmt: ``"auto"``, ``"text"``, ``"jsonl"``, ``"parquet"``, ``"hf"`` or ``"array_record"``.
      text_column: the JSONL key, Parquet column or dataset column holding the text.
      on_binary: ``"skip"`` (counted) or ``"error"``.
      encoding_errors: ``"strict"`` or ``"replace"``.
      on_null: ``"error"`` or ``"skip"`` (counted).
      record_dtype: the dtype of ArrayRecord token documents (required for them).
      output: the shard path the documents are written to (``WriteRox``'s): its set's own
        files are left out of the inputs, as ``grain-rox convert`` leaves them.

    Raises:
      FileNotFoundError: an input that does not exist (when the transform is made).
      ValueError: a bad option, ArrayRecord inputs without ``record_dtype``, ``limit`` with
        files.

    >>> import apache_beam as beam
    >>> with beam.Pipeline() as p:
    ...     _ = (p | ReadDocuments(builtin="prose", limit=2)
    ...            | beam.Map(lambda kv: kv[0]) | beam.Map(print))
    (0, 0)
    (0, 1)
    """

    def __init__(
        self,
        inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
        *,
        builtin: str | None = None,
        limit: int | None = None,
        fmt: str = "auto",
        text_column: str = "text",
        on_binary: str = "skip",
        encoding_errors: str = "strict",
        on_null: str = "error",
        record_dtype: Any = None,
        output: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__()
        if (inputs is None or inputs == []) == (builtin is None):
            raise ValueError("give input paths or builtin= (not both)")
        _choice("fmt", fmt, FORMATS)
        _choice("on_binary", on_binary, ON_BINARY)
        _choice("encoding_errors", encoding_errors, ENCODING_ERRORS)
        _choice("on_null", on_null, ON_NULL)
        if builtin is not None:
            _choice("builtin", builtin, BUILTIN_CORPORA)
            self.files = [f"<built-in {builtin}>"]
            self.token_documents = False
        else:
            if limit is not None:
                raise ValueError(
                    "limit= selects the first documents of the embedded corpus only; on Beam "
                    "select the input files instead (the first N documents of files would "
                    "need them read in order)"
                )
            specs = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs or [])
            self.files = expand_inputs([os.fspath(s) for s in specs])
            if output is not None:
                self.files = without_output_set(self.files, os.fspath(output))
            self.token_documents = bool(self.files) and (
                fmt == "array_record" or all(detect_format(f) == "array_record" for f in self.files)
            )
            if self.token_documents and record_dtype is None:
                raise ValueError(
                    "ArrayRecord token documents need their dtype: pass --record-dtype "
                    "(record_dtype=, e.g. uint16)"
                )
        self.options = {
            "builtin": builtin,
            "limit": limit,
            "fmt": fmt,
            "text_column": text_column,
            "on_binary": on_binary,
            "encoding_errors": encoding_errors,
            "on_null": on_null,
            "record_dtype": None if not self.token_documents else np.dtype(record_dtype).str,
        }

    def expand(self, pbegin: Any) -> Any:
        return (
            pbegin
            | "List inputs" >> beam.Create(list(enumerate(self.files)))
            | "Spread inputs" >> beam.Reshuffle()
            | "Read inputs" >> beam.ParDo(_ReadFileFn(self.options))
        )
