"""The ready pipeline behind ``grain-rox convert --runner``: read, tokenize, write, commit.

:func:`run_convert` builds ``ReadDocuments | WriteRox`` with the local converter's options,
runs it on the runner named (with the Beam pipeline options given), then reads the published
manifest and the Beam counters back for the summary.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from grain_rox._beam._commit import manifest_path
from grain_rox._beam._metrics import read_counters
from grain_rox._beam._read import ReadDocuments
from grain_rox._beam._write import WriteRox
from grain_rox._format._manifest import Manifest
from grain_rox._format._object_store import is_url
from grain_rox._format._shard_set import current_manifest
from grain_rox._text._shard_files import IfExists

RUNNERS = ("DirectRunner", "DataflowRunner", "FlinkRunner", "SparkRunner")


@dataclasses.dataclass(frozen=True)
class ConvertSummary:
    """What a Beam conversion wrote and read.

    Attributes:
      manifest: the published set's manifest.
      manifest_path: where it is.
      paths: the shard files, in order.
      num_documents: documents written.
      num_tokens: tokens written, EOS included, padding excluded.
      counters: the ``grain_rox`` Beam counters (documents, tokens, skipped_inputs,
        null_texts, shards).
      seconds: the pipeline's wall time.
      runner: the runner's name.
    """

    manifest: Manifest
    manifest_path: str
    paths: tuple[str, ...]
    num_documents: int
    num_tokens: int
    counters: dict[str, int]
    seconds: float
    runner: str

    def skipped(self) -> str:
        """``"skipped 1 input file and 2 null texts"``, or ``"nothing skipped"``."""
        parts = []
        for name, what in (("skipped_inputs", "input file"), ("null_texts", "null text")):
            n = self.counters.get(name, 0)
            if n:
                parts.append(f"{n} {what}{'' if n == 1 else 's'}")
        return "skipped " + " and ".join(parts) if parts else "nothing skipped"


def run_convert(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None,
    output: str | os.PathLike[str],
    *,
    runner: str = "DirectRunner",
    beam_args: Sequence[str] = (),
    tokenizer: str | os.PathLike[str] = "bytes",
    builtin: str | None = None,
    limit: int | None = None,
    fmt: str = "auto",
    text_column: str = "text",
    on_binary: str = "skip",
    encoding_errors: str = "strict",
    on_null: str = "error",
    record_dtype: Any = None,
    block_size: int = 4096,
    max_shard_bytes: int | None = None,
    if_exists: IfExists = "error",
) -> ConvertSummary:
    """Convert inputs into a `.rox` shard set on Apache Beam; see ``grain-rox convert``.

    ``runner`` is one of :data:`RUNNERS`; ``beam_args`` are Beam pipeline options as on a
    command line (``["--direct_num_workers=2", "--direct_running_mode=multi_processing"]``,
    ``["--project=p", "--region=r", "--temp_location=gs://b/tmp"]``). Documents are ordered by
    input file and position, so the shards equal the local converter's.

    Raises:
      ValueError: no documents at all (every input skipped or empty), a bad option, or the
        pipeline failed (its first error, naming the input or shard).
      FileNotFoundError, FileExistsError: as ``grain-rox convert``.
    """
    if runner not in RUNNERS:
        raise ValueError(f"runner {runner!r} is not one of {RUNNERS}")
    output = os.fspath(output)
    if is_url(output):
        raise ValueError(
            f"the Beam conversion writes its shard set to a filesystem path, not to {output}: "
            "its commit renames files. Fix: write to a local or mounted path (e.g. a GCS FUSE "
            "mount), or convert without --runner, which uploads to a bucket with "
            "grain-rox convert -o gs://..."
        )
    read = ReadDocuments(
        inputs,
        builtin=builtin,
        limit=limit,
        fmt=fmt,
        text_column=text_column,
        on_binary=on_binary,
        encoding_errors=encoding_errors,
        on_null=on_null,
        record_dtype=record_dtype,
        output=output,
    )
    write = WriteRox(
        output,
        tokenizer=tokenizer,
        block_size=block_size,
        max_shard_bytes=max_shard_bytes,
        if_exists=if_exists,
    )
    options = PipelineOptions([f"--runner={runner}", *beam_args])
    start = time.perf_counter()
    pipeline = beam.Pipeline(options=options)
    _ = pipeline | "Read" >> read | "Write" >> write
    try:
        result = pipeline.run()
        result.wait_until_finish()
    except Exception as e:
        raise ValueError(f"the Beam pipeline failed: {_first_line(e)}") from e
    seconds = time.perf_counter() - start
    counters = read_counters(result)
    mpath = manifest_path(output, max_shard_bytes)
    manifest = current_manifest(mpath)
    if manifest is None or manifest.write_id != write.run_id:
        what = ", ".join(map(str, inputs)) if isinstance(inputs, list) else str(inputs or builtin)
        raise ValueError(
            f"no documents to convert in {what}: {counters['documents']} documents read, "
            f"{counters['skipped_inputs']} input file(s) skipped and {counters['null_texts']} "
            "null text(s); the workers' log lines say why each file was skipped"
        )
    directory = os.path.dirname(mpath)
    return ConvertSummary(
        manifest=manifest,
        manifest_path=mpath,
        paths=tuple(os.path.join(directory, n) for n in manifest.shards),
        num_documents=manifest.num_documents or 0,
        num_tokens=sum(r.num_tokens - r.num_padding_tokens for r in manifest.shards.values()),
        counters=counters,
        seconds=seconds,
        runner=runner,
    )


def _first_line(e: BaseException) -> str:
    """The worker's own error out of a runner's wrapped one (the last ``Error: ...`` line)."""
    text = str(e)
    found = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and ("Error: " in line or "Exception: " in line)
    ]
    return found[-1] if found else (text.splitlines() or [type(e).__name__])[0]
