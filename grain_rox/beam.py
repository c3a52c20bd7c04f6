"""Convert on Apache Beam (``pip install 'grain_rox[beam]'``): tokenize and write `.rox` shard
sets on the DirectRunner, Dataflow, Flink or Spark.

* :class:`ReadDocuments` -- the inputs ``grain-rox convert`` reads (text, JSONL, Parquet, saved
  HF datasets, ArrayRecord token documents, or an embedded corpus) as
  ``((file number, position), document)``;
* :class:`WriteRox` -- keyed documents (text or token arrays) into a shard set, in key order:
  the bytes :func:`grain_rox.write_rox` writes, committed by one final step;
* :func:`run_convert` -- the two as one pipeline, behind ``grain-rox convert --runner``.

The names are loaded on first use, so ``import grain_rox.beam`` works without Beam installed
and a missing extra is an ``ImportError`` that says what to install. Example (it needs the
extra, so it is shown here and run by ``tests/test_beam.py``)::

    import apache_beam as beam
    from grain_rox.beam import ReadDocuments, WriteRox

    with beam.Pipeline() as p:
        _ = (p | ReadDocuments(builtin="prose", limit=50)
               | WriteRox("out/prose.rox", tokenizer="cl100k_base", max_shard_bytes=1 << 20))

>>> import grain_rox.beam
>>> sorted(grain_rox.beam.__all__)
['CommitResult', 'ConvertSummary', 'ReadDocuments', 'WriteRox', 'run_convert']
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY: dict[str, str] = {
    "ReadDocuments": "grain_rox._beam._read",
    "WriteRox": "grain_rox._beam._write",
    "CommitResult": "grain_rox._beam._write",
    "run_convert": "grain_rox._beam._run",
    "ConvertSummary": "grain_rox._beam._run",
}

__all__ = sorted(_LAZY)

if TYPE_CHECKING:
    from grain_rox._beam._read import ReadDocuments as ReadDocuments
    from grain_rox._beam._run import ConvertSummary as ConvertSummary
    from grain_rox._beam._run import run_convert as run_convert
    from grain_rox._beam._write import CommitResult as CommitResult
    from grain_rox._beam._write import WriteRox as WriteRox


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'grain_rox.beam' has no attribute {name!r}")
    try:
        module = importlib.import_module(_LAZY[name])
    except ModuleNotFoundError as e:
        if e.name != "apache_beam" and not (e.name or "").startswith("apache_beam."):
            raise
        raise ImportError(
            f"grain_rox.beam.{name} needs Apache Beam: pip install 'grain_rox[beam]'"
        ) from None
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
