"""``grain-rox``: convert corpora into `.rox` shards, inspect them, verify them.

    grain-rox convert docs/ notes.jsonl -o data/train.rox --tokenizer cl100k_base
    grain-rox convert --builtin code -o data/code.rox --max-shard-bytes 64MiB
    grain-rox convert docs.array_record -o data/train.rox --record-dtype uint16 --tokenizer bytes
    grain-rox convert docs/ -o data/train.rox --max-shard-bytes 64MiB --runner DirectRunner \
        --direct_num_workers=2 --direct_running_mode=multi_processing
    grain-rox export data/train.rox -o docs.array_record
    grain-rox inspect data/ [--json] [--plot lengths.png]
    grain-rox verify data/ [--log-level info]

Exit status: 0 on success, 1 when ``verify`` finds damage, 2 for bad arguments or inputs, 141
when stdout is closed early (``| head``); ``convert`` and ``export`` exit 0 once their output is
committed, whether or not their summary could be printed (said on stderr).
``--log-level {warning,info,debug}`` (before or after the command) shows the ``grain_rox``
logger's records on stderr: skipped inputs and damage (the default), milestones (info: a
conversion's start and end, a verify's), per-file and per-shard detail (debug).
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from grain_rox._cli._describe import describe
from grain_rox._cli._logging import LOG_LEVELS, cli_logging
from grain_rox._cli._neighbour_sets import warn_of_other_tokenizers
from grain_rox._cli._progress import byte_bar, count_bar
from grain_rox._cli._stdout import Summary, silence_stdout
from grain_rox._cli._verify_report import verify_lines
from grain_rox._cli._wording import cli_wording, tokenizer_line
from grain_rox._format._rox_corpus import tokenizer_words
from grain_rox._format._rox_format import RoxFormatError
from grain_rox._format._verify import shard_sizes, verify_rox
from grain_rox._text._builtin_corpus import BUILTIN_CORPORA, builtin_documents
from grain_rox._text._convert import (
    ENCODING_ERRORS,
    FORMATS,
    ON_BINARY,
    ON_NULL,
    ReadStats,
    detect_format,
    expand_inputs,
    input_bytes,
    read_files,
    require_documents,
    without_output_set,
)
from grain_rox._text._rox_writer import write_rox
from grain_rox._text._tokenize_ahead import tokenize_in_order
from grain_rox._text._tokenizers import get_tokenizer

_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _count(n: int, noun: str) -> str:
    """``1 document``, ``2 documents``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


logger = logging.getLogger("grain_rox")


def positive_int(text: str) -> int:
    """A count argument: an integer of at least 1.

    >>> positive_int("3")
    3
    >>> positive_int("0")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: '0' is not a count of at least 1
    """
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count of at least 1")
    return n


def parse_size(text: str) -> int:
    """Parse a byte size such as ``4096``, ``64MiB`` or ``1G``.

    >>> parse_size("64MiB"), parse_size("4096"), parse_size("1g")
    (67108864, 4096, 1073741824)
    """
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 4096, 64MiB or 1G")
    unit = (m.group(2) or "").upper()[:1]
    return int(m.group(1)) * _UNITS[unit]


def _log_flag(parser: argparse.ArgumentParser, default: str | None) -> None:
    parser.add_argument(
        "--log-level",
        choices=tuple(LOG_LEVELS),
        # on the commands: absent unless given, so a level given before the command stays
        default=argparse.SUPPRESS if default is None else default,
        help="log lines on stderr: warning (skipped inputs, damage; the default), info "
        "(milestones, with time and level) or debug (each file and shard)",
    )


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grain-rox", description="Convert, inspect and verify .rox token shards."
    )
    _log_flag(parser, "warning")
    common = argparse.ArgumentParser(add_help=False)
    _log_flag(common, None)
    sub = parser.add_subparsers(dest="command", required=True)

    conv = sub.add_parser(
        "convert",
        parents=[common],
        help="tokenize text/JSONL/Parquet files or a saved HF dataset into .rox shards",
    )
    conv.add_argument("inputs", nargs="*", help="files, directories or globs")
    conv.add_argument("--builtin", choices=BUILTIN_CORPORA, help="use an embedded corpus")
    conv.add_argument("-o", "--output", required=True, help="shard path, e.g. data/train.rox")
    conv.add_argument(
        "--tokenizer",
        default=None,
        help="bytes (the default) | cl100k_base | o200k_base | path to tokenizer.json",
    )
    conv.add_argument("--format", choices=FORMATS, default="auto", dest="fmt")
    conv.add_argument("--text-column", default="text", help="JSONL/Parquet text field")
    conv.add_argument(
        "--on-binary",
        choices=ON_BINARY,
        default="skip",
        help="binary input files: skip them (counted and logged, the default) or stop",
    )
    conv.add_argument(
        "--on-null",
        choices=ON_NULL,
        default="error",
        help="records whose text is null: an error naming the record (the default) or skip "
        "them (counted in the summary)",
    )
    conv.add_argument(
        "--encoding-errors",
        choices=ENCODING_ERRORS,
        default="strict",
        help="text that is not UTF-8: an error naming the file (strict, the default) or "
        "read with U+FFFD replacement characters (replace)",
    )
    conv.add_argument(
        "--record-dtype",
        default=None,
        help="ArrayRecord inputs: the dtype of the token documents' raw records, e.g. uint16",
    )
    conv.add_argument(
        "--eos-token",
        default=None,
        help="a tokenizer.json's token that ends each document (default: its "
        "tokenizer_config.json's eos_token, else the first of the usual ones it holds)",
    )
    conv.add_argument("--block-size", type=parse_size, default=4096, help="bytes per block")
    conv.add_argument(
        "--max-shard-bytes",
        type=parse_size,
        default=None,
        help="split into shards of at most this size, e.g. 64MiB",
    )
    conv.add_argument("--if-exists", choices=("error", "append", "overwrite"), default="error")
    conv.add_argument(
        "--limit", type=positive_int, default=None, help="convert at most N documents"
    )
    conv.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="chunks tokenized at once (default 1: the tokenizer itself uses all cores)",
    )
    conv.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    conv.add_argument("--no-verify", action="store_true", help="skip re-reading the checksums")
    conv.add_argument(
        "--runner",
        choices=("DirectRunner", "DataflowRunner", "FlinkRunner", "SparkRunner"),
        default=None,
        help="convert on Apache Beam with this runner (pip install 'grain_rox[beam]'); Beam's "
        "own options follow as --name=value (e.g. --direct_num_workers=2, --project=p)",
    )

    exp = sub.add_parser(
        "export", parents=[common], help="write .rox documents (split at EOS) to ArrayRecord"
    )
    exp.add_argument("path", nargs="+", help="shard file, directory, glob or base path")
    exp.add_argument("-o", "--output", required=True, help="the .array_record file to write")
    exp.add_argument("--eos-id", type=int, default=None, help="default: the manifest's EOS id")
    exp.add_argument(
        "--group-size", type=positive_int, default=1, help="records per ArrayRecord chunk"
    )
    exp.add_argument("--compression", choices=("zstd", "uncompressed"), default="zstd")
    exp.add_argument("--overwrite", action="store_true", help="replace an existing output")
    exp.add_argument("--no-progress", action="store_true", help="never show a progress bar")

    insp = sub.add_parser(
        "inspect", parents=[common], help="describe shards: dtype, blocks, tokens, manifest"
    )
    insp.add_argument("path", nargs="+", help="shard file, directory, glob or base path")
    insp.add_argument("--json", action="store_true", help="print JSON")
    insp.add_argument(
        "--plot",
        metavar="FILE",
        default=None,
        help="draw a histogram of the documents' lengths in tokens into FILE (.png, .svg, "
        ".pdf); needs matplotlib",
    )
    insp.add_argument(
        "--eos-id",
        type=int,
        default=None,
        help="with --plot: the token that ends each document (default: the manifest's)",
    )

    ver = sub.add_parser(
        "verify", parents=[common], help="check structure and checksums of every shard"
    )
    ver.add_argument("path", nargs="+", help="shard file, directory, glob or base path")
    ver.add_argument("--no-checksums", action="store_true", help="skip sha256 checks")
    ver.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _path_spec(paths: list[str]) -> str | list[str]:
    return paths[0] if len(paths) == 1 else paths


def _limited(docs: Iterator[str], limit: int | None) -> Iterator[str]:
    """The first ``limit`` documents (all without one), reading none past them (the next
    record was read, and a malformed one there failed a conversion that did not need it)."""
    return docs if limit is None else itertools.islice(docs, limit)


def _inputs_in_words(args: argparse.Namespace, files: list[str], token_docs: bool) -> str:
    """What a conversion reads, for the log: ``3 files (docs/, notes.jsonl; format auto)``."""
    if args.builtin:
        return f"the built-in corpus {args.builtin!r}"
    n = f"{len(files)} {'ArrayRecord ' if token_docs else ''}file{'' if len(files) == 1 else 's'}"
    kind = f"{args.record_dtype} token documents" if token_docs else f"format {args.fmt}"
    return f"{n} ({', '.join(args.inputs)}; {kind})"


def _convert(args: argparse.Namespace) -> int:
    if bool(args.inputs) == bool(args.builtin):
        print("grain-rox convert: error: give input paths or --builtin (not both)", file=sys.stderr)
        return 2
    if args.max_shard_bytes is not None and args.max_shard_bytes < args.block_size:
        raise ValueError(
            f"--max-shard-bytes {args.max_shard_bytes} is below one block (--block-size "
            f"{args.block_size}): a shard holds whole blocks, at least one; pass at least "
            f"{args.block_size}, e.g. 64MiB"
        )
    # the inputs: for a Beam run listed here only to check --record-dtype (its workers list
    # them; a large tree is not walked twice)
    listed = not args.builtin and (args.runner is None or args.record_dtype is not None)
    files = expand_inputs(args.inputs) if listed else []
    files = without_output_set(files, args.output)
    token_docs = bool(files) and (
        args.fmt == "array_record" or all(detect_format(f) == "array_record" for f in files)
    )
    if args.record_dtype is not None and not token_docs:  # (on Beam too: it was ignored there)
        read = f"the built-in corpus {args.builtin!r} is text" if args.builtin else (
            f"{', '.join(args.inputs)} {'is' if len(args.inputs) == 1 else 'are'} read as text "
            f"(format {args.fmt})"
        )  # fmt: skip
        raise ValueError(
            f"--record-dtype {args.record_dtype} applies to ArrayRecord token documents only, "
            f"and {read}; drop --record-dtype, or pass ArrayRecord files"
        )
    if args.runner is not None:
        return _convert_on_beam(args)
    tok = get_tokenizer(args.tokenizer or "bytes", eos_token=args.eos_token)
    warn_of_other_tokenizers(args.output, tok.identity())
    stats = ReadStats()
    label = f"built-in '{args.builtin}'" if args.builtin else ", ".join(args.inputs)[:60]
    desc = f"converting {label} ({tok.name})"
    show = not args.no_progress
    # The bar's total: the input files' bytes when all of them are read, else the documents
    # (the --limit, or an ArrayRecord file's records), else none (the built-in corpora).
    total_bytes = None if token_docs or args.builtin or args.limit else input_bytes(files)
    total_docs = args.limit
    with byte_bar(total_bytes, desc, enabled=show) as bar:
        if args.builtin:
            docs: Iterator[Any] = builtin_documents(args.builtin)
        elif token_docs:
            if args.record_dtype is None:
                raise ValueError(
                    "ArrayRecord token documents need their dtype: pass --record-dtype (e.g. uint16)"
                )
            from grain_rox._sources._array_record import ArrayRecordSource, DescribedItems

            source = ArrayRecordSource(files, dtype=args.record_dtype)
            docs = source.iter_arrays()
            total_docs = min(len(source), args.limit or len(source))
        else:
            docs = read_files(
                files,
                fmt=args.fmt,
                text_column=args.text_column,
                on_binary=args.on_binary,
                encoding_errors=args.encoding_errors,
                on_null=args.on_null,
                stats=stats,
                on_bytes=bar.update,
            )
            docs = require_documents(docs, stats, ", ".join(args.inputs))
        docs = _limited(docs, args.limit)
        if total_bytes is None:
            docs = count_bar(docs, total_docs, desc, "doc", enabled=show)
        logger.info(
            "converting %s into %s with the %s tokenizer%s",
            _inputs_in_words(args, files, token_docs),
            args.output,
            tok.name,
            " (the default)" if args.tokenizer is None else "",
        )
        start = time.perf_counter()
        items = docs if args.workers is None else tokenize_in_order(docs, tok, workers=args.workers)
        if token_docs:  # write_rox's errors name a record's file and index
            items = DescribedItems(items, source.describe_item)
        result = write_rox(  # it encodes text a chunk ahead itself; --workers: more chunks
            items,
            args.output,
            tokenizer=tok,
            block_size=args.block_size,
            max_shard_bytes=args.max_shard_bytes,
            if_exists=args.if_exists,
        )
        seconds = time.perf_counter() - start
    rate = result.num_tokens / seconds if seconds > 0 else float("inf")
    summary = f"read {label}" if args.builtin or token_docs else stats.summary()
    logger.info(
        "converted into %s: %d document%s, %d tokens (%s, no padding), %d shard(s), %.1fs; "
        "%s; manifest %s",
        args.output,
        result.num_documents,
        "" if result.num_documents == 1 else "s",
        result.num_tokens,
        result.dtype,
        len(result.paths),
        seconds,
        summary,
        result.manifest_path,
    )
    said = Summary("convert")  # the set is committed: a closed stdout no longer fails the run
    said.print(
        f"wrote {_count(result.num_documents, 'document')}, {result.num_tokens} {tok.name} tokens "
        f"({result.dtype}) into {len(result.paths)} shard(s) in {seconds:.1f}s "
        f"({rate:,.0f} tokens/s); {summary}; manifest {result.manifest_path}"
    )
    said.print(tokenizer_line(tok, args.tokenizer))
    if not args.no_verify:
        _verify_written(list(result.paths), args.output, show, said)
    return said.finish(args.output)


def _convert_on_beam(args: argparse.Namespace) -> int:
    """``convert --runner``: the same conversion as a Beam pipeline (grain_rox.beam)."""
    if args.workers is not None:
        raise ValueError(
            "--workers sets the local converter's threads; on Beam the runner picks the "
            "workers: pass its option instead (--direct_num_workers=N, --num_workers=N)"
        )
    if args.eos_token is not None:
        raise ValueError(
            "--eos-token is not sent to Beam workers; put a tokenizer_config.json naming "
            "eos_token beside the tokenizer.json (both converters read it), or convert "
            "without --runner"
        )
    from grain_rox.beam import run_convert

    tok = get_tokenizer(args.tokenizer or "bytes")
    warn_of_other_tokenizers(args.output, tok.identity())
    result = run_convert(
        args.inputs or None,
        args.output,
        runner=args.runner,
        beam_args=args.beam_args,
        tokenizer=args.tokenizer or "bytes",
        builtin=args.builtin,
        limit=args.limit,
        fmt=args.fmt,
        text_column=args.text_column,
        on_binary=args.on_binary,
        encoding_errors=args.encoding_errors,
        on_null=args.on_null,
        record_dtype=args.record_dtype,
        block_size=args.block_size,
        max_shard_bytes=args.max_shard_bytes,
        if_exists=args.if_exists,
    )
    c = result.counters
    rate = result.num_tokens / result.seconds if result.seconds > 0 else float("inf")
    said = Summary("convert")
    said.print(
        f"wrote {_count(result.num_documents, 'document')}, {result.num_tokens} {tok.name} tokens "
        f"({result.manifest.dtype}) into {len(result.paths)} shard(s) on {result.runner} in "
        f"{result.seconds:.1f}s ({rate:,.0f} tokens/s); {result.skipped()}; manifest "
        f"{result.manifest_path}"
    )
    said.print(
        f"beam counters: {c['documents']} documents, {c['tokens']} tokens, "
        f"{c['skipped_inputs']} skipped inputs, {c['null_texts']} null texts, "
        f"{c['shards']} shards written"
    )
    said.print(tokenizer_line(tok, args.tokenizer))
    if not args.no_verify:
        _verify_written(list(result.paths), args.output, not args.no_progress, said)
    return said.finish(args.output)


def _verify_written(paths: list[str], output: str, show: bool, said: Summary) -> None:
    """Read back the shards a conversion wrote and check their checksums (an error names the
    first bad shard)."""
    with byte_bar(shard_sizes(paths), f"verifying {output}", enabled=show) as bar:
        bad = [r for r in verify_rox(paths, on_bytes=bar.update) if not r.ok]
    if bad:
        raise ValueError(f"read back after writing, {bad[0].path}: {bad[0].problem}")
    said.print(f"verified {len(paths)} shard(s): checksums match")


def _beam_args(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> None:
    """Keep Beam's own options (``--name=value`` or a bare ``--flag``) for ``convert --runner``;
    anything else not understood is an error, as before."""
    if extra and (args.command != "convert" or args.runner is None):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    bad = [a for a in extra if not a.startswith("--")]
    if bad:
        parser.error(
            f"unrecognized arguments: {' '.join(bad)} (give Beam options as --name=value, "
            "e.g. --direct_num_workers=2)"
        )
    misspelt = _misspelt_options(parser, extra) if extra else []  # (Beam imported only then)
    if misspelt:  # Beam drops what it does not know with a log line: the run would go on
        parser.error(
            "unrecognized arguments: "
            + ", ".join(f"{arg} (did you mean {ours}?)" for arg, ours in misspelt)
            + "; grain-rox convert's options are spelled with dashes, Beam's with underscores"
        )
    args.beam_args = extra


def _misspelt_options(parser: argparse.ArgumentParser, extra: list[str]) -> list[tuple[str, str]]:
    """The arguments for Beam that Beam does not know and that look like a convert option
    (``--max_shard_bytes``, ``--tokeniser``), each with the option it looks like."""
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    ours = [
        o
        for a in subparsers.choices["convert"]._actions
        for o in a.option_strings
        if o.startswith("--")
    ]
    unknown = _unknown_to_beam(extra)
    found = []
    for arg in unknown:
        name = arg.split("=", 1)[0].replace("_", "-")
        close = [name] if name in ours else difflib.get_close_matches(name, ours, n=1, cutoff=0.8)
        if close:
            found.append((arg, close[0]))
    return found


def _unknown_to_beam(extra: list[str]) -> list[str]:
    """The arguments Beam's pipeline options do not parse (all of them if Beam cannot say):
    Beam itself logs "Discarding unparseable args" and runs on without them."""
    try:
        from apache_beam.options import pipeline_options as beam_options

        beam_parser = beam_options._BeamArgumentParser(allow_abbrev=False)
        kinds = {str(c): c for c in beam_options.PipelineOptions.__subclasses__()}
        for kind in kinds.values():
            kind._add_argparse_args(beam_parser)
        return list(beam_parser.parse_known_args(extra)[1])
    except Exception:  # no Beam, or another version's internals: judge every argument
        return list(extra)


def _export(args: argparse.Namespace) -> int:
    from grain_rox._sources._array_record_export import export_array_record

    result = export_array_record(
        _path_spec(args.path),
        args.output,
        eos_id=args.eos_id,
        group_size=args.group_size,
        compression=args.compression,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    said = Summary("export")
    said.print(
        f"wrote {_count(result.num_documents, 'document')}, {result.num_tokens} tokens ({result.dtype} "
        f"records) to {result.path}; read back and verified, sha256 {result.sha256[:16]}"
    )
    return said.finish(result.path)


def _plot(args: argparse.Namespace) -> dict[str, Any]:
    """Draw the document-length histogram ``--plot`` asks for; what it shows, for the output."""
    from grain_rox._cli._plot import document_lengths, length_summary, plot_lengths
    from grain_rox._format._rox_corpus import open_rox

    with open_rox(_path_spec(args.path)) as corpus:
        eos = corpus.eos_id if args.eos_id is None else args.eos_id
        if eos is None:
            raise ValueError(
                f"{corpus.paths[0]}: no EOS id to find the documents at (the shards have no "
                "manifest, or their manifests disagree); pass --eos-id"
            )
        lengths = document_lengths(corpus, int(eos))
        recorded = corpus.num_documents
    title = " ".join(args.path)
    log = plot_lengths(lengths, args.plot, title)
    summary = length_summary(lengths)
    if recorded is not None and recorded != lengths.size:
        summary += (
            f" (the manifests record {recorded:,} documents: empty ones, or an EOS id inside "
            "documents, make the difference)"
        )
    return {
        "path": args.plot,
        "documents": int(lengths.size),
        "min": int(lengths.min()),
        "median": float(np.median(lengths)),
        "max": int(lengths.max()),
        "log_x": log,
        "summary": summary,
    }


def _inspect(args: argparse.Namespace) -> int:
    info = describe(_path_spec(args.path))
    plotted = _plot(args) if args.plot else None
    if args.json:
        if plotted is not None:
            info["plot"] = plotted
        print(json.dumps(info, indent=1))
        return 0
    tok = info["tokenizer"]
    print(f"shards      {info['shards']}")
    print(f"dtype       {info['dtype']}")
    uneven = (
        " (the first block's: blocks differ in size)" if info["uniform_blocks"] is False else ""
    )
    print(f"block size  {info['block_size']} bytes{uneven}")
    print(f"blocks      {info['blocks']:,}")
    if info["padding_tokens"] is None:
        print(f"tokens      {info['tokens']:,} (block padding included: no manifest says how much)")
        print("padding     unknown")
    else:
        print(f"tokens      {info['document_tokens']:,} (documents and their EOS, no padding)")
        print(
            f"padding     {info['padding_tokens']:,} (filling each write's last block; "
            f"{info['tokens']:,} tokens in all)"
        )
    print(
        f"documents   {'unknown' if info['documents'] is None else format(info['documents'], ',')}"
    )
    sets = info["sets"]
    if len({json.dumps([s["tokenizer"], s["eos_id"]], sort_keys=True) for s in sets}) > 1:
        print("eos id      differs by set (below)")  # (a corpus of these sets has none)
        print("tokenizer   differs by set:")
        for s in sets:
            print(f"  {s['set']}: {tokenizer_words(s['tokenizer'])}, EOS id {s['eos_id']}")
    else:
        print(f"eos id      {info['eos_id']}")
        untokenized = (
            "none (written as token ids)" if info["manifests"] else "unknown (no manifest)"
        )
        print(f"tokenizer   {tok['name'] if tok else untokenized}")
    print(f"manifest    {', '.join(info['manifests']) or 'none'}")
    print(f"fingerprint {info['fingerprint']}")
    for tmp in info["leftover_temporaries"]:
        print(
            f"leftover    {tmp}: a hidden temporary file of a killed write, not part of the "
            "data; delete it or write to the set again (the next write removes it)"
        )
    width = max(len(os.path.basename(f["path"])) for f in info["files"])
    head = f"{'file':<{width}}  {'bytes':>14}  {'blocks':>10}  {'tokens':>14}  {'padding':>10}"
    print(f"\n{head}  sha256")
    for f in info["files"]:
        digest = (f["sha256"] or "-")[:16]
        pad = "?" if f["padding_tokens"] is None else format(f["padding_tokens"], ",")
        print(
            f"{os.path.basename(f['path']):<{width}}  {f['bytes']:>14,}  {f['blocks']:>10,}  "
            f"{f['tokens']:>14,}  {pad:>10}  {digest}"
        )
    if plotted is not None:
        scale = ", log-scaled x" if plotted["log_x"] else ""
        print(f"\nplotted {plotted['summary']}{scale}; wrote {plotted['path']}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    spec = _path_spec(args.path)
    checksums = not args.no_checksums
    desc = f"verifying {' '.join(args.path)[:60]}"
    with byte_bar(shard_sizes(spec), desc, enabled=checksums) as bar:
        reports = verify_rox(spec, checksums=checksums, on_bytes=bar.update)
    if args.json:
        print(json.dumps([r.__dict__ for r in reports], indent=1))
    else:
        print("\n".join(verify_lines(reports)))
    return 1 if any(not r.ok for r in reports) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``grain-rox`` command line; returns the exit status.

    >>> main(["inspect", "/nonexistent/nothing.rox"])
    2
    """
    parser = _build_parser()
    args, extra = parser.parse_known_args(argv)
    _beam_args(parser, args, extra)
    try:
        with cli_logging(args.log_level, args.command):
            if args.command == "convert":
                return _convert(args)
            if args.command == "inspect":
                return _inspect(args)
            if args.command == "export":
                return _export(args)
            return _verify(args)
    except BrokenPipeError:  # `grain-rox inspect ... | head`: the reader has what it wanted
        silence_stdout()
        return 141  # as a command killed by SIGPIPE; convert and export have said theirs above
    except (
        FileNotFoundError,
        FileExistsError,
        RoxFormatError,
        KeyError,
        TypeError,
        ValueError,
        ImportError,
        OSError,
    ) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        text = cli_wording(str(message), args.command)
        print(f"grain-rox {args.command}: error: {text}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: a write has cleaned up its temporary files by now
        whole = " (a set is published whole or not at all)" if args.command == "convert" else ""
        print(f"grain-rox {args.command}: interrupted{whole}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
