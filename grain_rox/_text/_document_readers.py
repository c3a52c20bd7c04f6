"""The documents of one input file, by format (JSONL or a JSON list of records, Parquet, a saved
HF dataset), and :class:`ReadStats`, the tally of what was read and skipped that they fill.

Each reader yields the text of every record; a record without the text column, or whose text
is not a string, is an error naming it; a null text is an error, or with ``on_null="skip"``
counted in the stats.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "a.jsonl")
>>> _ = open(path, "wb").write(b'{"text": "x"}\\n{"text": null}\\n')
>>> stats = ReadStats(on_null="skip")
>>> list(jsonl_documents(path, byte_chunks(path), "text", "strict", stats)), stats.null_texts
(['x'], 1)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

from grain_rox._text._text_files import (
    bom_encoding,
    byte_chunks,
    chain,
    decode,
    lines,
    without_bom,
    without_lone_surrogates,
)

logger = logging.getLogger("grain_rox")


@dataclasses.dataclass
class ReadStats:
    """What :func:`~grain_rox._text._convert.read_files` read and skipped, filled in as it reads.

    >>> stats = ReadStats(files_read=3, documents=5)
    >>> stats.skip("a.bin", "binary", "it looks binary")
    >>> stats.summary()
    '3 files read, skipped 1 file (1 binary)'
    """

    files_read: int = 0
    documents: int = 0
    null_texts: int = 0
    skipped: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    on_null: str = "error"

    def null_text(self, where: str) -> None:
        """A record at ``where`` has a null text: an error, or (``on_null="skip"``) counted."""
        if self.on_null != "skip":
            raise ValueError(
                f"{where}: the text is null (missing), and a document cannot be made of it; "
                "pass --on-null skip (on_null='skip') to skip such records (they are counted), "
                "or drop them from the input first"
            )
        self.null_texts += 1

    def skip(self, path: str, reason: str, detail: str) -> None:
        """Count ``path`` as skipped for ``reason`` and log why (logger ``grain_rox``)."""
        self.skipped.setdefault(reason, []).append(path)
        logger.warning("skipped %s: %s", path, detail)

    @property
    def files_skipped(self) -> int:
        """Input files skipped so far, for any reason."""
        return sum(len(v) for v in self.skipped.values())

    def summary(self) -> str:
        """``"N files read"``, then what was skipped and why."""
        text = f"{self.files_read} file{'' if self.files_read == 1 else 's'} read"
        count = self.files_skipped
        skips = []
        if count:
            why = ", ".join(
                f"{len(v)} {k if len(v) == 1 else _PLURAL.get(k, k)}"
                for k, v in sorted(self.skipped.items())
            )
            skips.append(f"{count} file{'' if count == 1 else 's'} ({why})")
        if self.null_texts:
            skips.append(f"{self.null_texts} null text{'' if self.null_texts == 1 else 's'}")
        return text + (f", skipped {' and '.join(skips)}" if skips else "")


# the skips whose reason is a noun: how a count of more than one says it
_PLURAL = {"broken link": "broken links", "not a regular file": "not regular files"}


def hf_documents(path: str, text_column: str, stats: ReadStats) -> Iterator[str]:
    """Texts of a dataset saved with HF ``save_to_disk`` (a DatasetDict's ``train`` split)."""
    try:
        import datasets
    except ImportError:
        raise ImportError("reading a HF dataset needs: pip install 'grain_rox[hf]'") from None
    from grain_rox._text._hf_checks import load_saved

    try:
        ds = None if os.path.isfile(path) else load_saved(path)
    except FileNotFoundError:  # (datasets: "neither a 'Dataset' directory nor ...")
        if not os.path.isdir(path):
            raise
        ds = None
    if ds is None:
        raise ValueError(
            f"{path} is not a saved HF dataset: that is the folder save_to_disk writes (with "
            "state.json and dataset_info.json, or dataset_dict.json); drop --format hf to "
            "read it by its name's format"
        )
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise ValueError(
                f"{path} holds splits {list(ds)} and no 'train'; pass one split's folder "
                f"(e.g. {os.path.join(path, next(iter(ds)))})"
            )
        others = [name for name in ds if name != "train"]
        if others:  # said, not dropped unseen: a test split must not be trained on by default
            logger.warning(
                "%s: converting its 'train' split only (%d rows); splits %s are left out; pass "
                "a split's folder (e.g. %s) to convert it",
                path,
                ds["train"].num_rows,
                others,
                os.path.join(path, others[0]),
            )
        ds = ds["train"]
    if text_column not in ds.column_names:
        raise KeyError(
            f"{path} has no column {text_column!r} (it has {ds.column_names}); pass --text-column"
        )
    kind = ds.features[text_column]
    if getattr(kind, "dtype", None) not in ("string", "large_string"):
        texts = [
            n
            for n, f in ds.features.items()
            if getattr(f, "dtype", None) in ("string", "large_string")
        ]
        raise TypeError(f"{path}: column {text_column!r} holds {kind}, not text; {_other(texts)}")
    row = 0
    # as Arrow whatever format it was saved with (with_format("numpy") on other columns only:
    # state.json keeps it), made strings as Parquet's are: bytes that are not UTF-8 are named
    texts = ds.with_format("arrow").select_columns([text_column])
    for batch in texts.iter(batch_size=1024):
        for value in _texts(batch.column(0), path, text_column, row):
            if value is None:
                stats.null_text(f"{path} row {row}")
            else:
                yield value
            row += 1


class _Repeated(dict):
    """A JSON object that names the text column more than once (JSON keeps only the last)."""


def _may_escape(text: str, column: str) -> bool:
    """Whether ``text`` may spell ``column`` with escapes: ``\\u`` (any character), or a
    backslash where the name holds a character JSON escapes so (``/``, ``"``, ``\\``)."""
    return "\\u" in text or (bool(set(column) & set('/"\\')) and "\\" in text)


def _parse_records(text: str, column: str) -> Any:
    """``json.loads(text)``; an object naming ``column`` twice comes back as :class:`_Repeated`.
    Only text quoting the column's name more than once is parsed key by key (the slow way)."""
    if text.count(f'"{column}"') < 2 and not _may_escape(text, column):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise
        except ValueError:  # an int past Python's digit limit: kept as its digits, below
            pass

    def pairs(items: list[tuple[str, Any]]) -> dict:
        repeated = sum(1 for key, _ in items if key == column) > 1
        return _Repeated(items) if repeated else dict(items)

    return json.loads(text, object_pairs_hook=pairs, parse_int=_int_or_digits)


class _LongInt(str):
    """The digits of a JSON int too long for Python's ``int()`` (4300 digits): another field
    may hold one; as the text field it is refused as a number, not read as text."""


def _int_or_digits(digits: str) -> int | _LongInt:
    try:
        return int(digits)
    except ValueError:
        return _LongInt(digits)


def _text_of(record: object, column: str, where: str) -> str | None:
    if not isinstance(record, dict):
        shown = json.dumps(record)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        kind = "array" if isinstance(record, list) else type(record).__name__
        raise ValueError(
            f"{where} is a JSON {kind} ({shown}), not a record: each record must be an object "
            f"with a {column!r} field holding its text"
        )
    if column not in record:
        raise KeyError(
            f"{where} has no column {column!r} (it has {sorted(record)}); pass --text-column"
        )
    if isinstance(record, _Repeated):
        raise ValueError(
            f"{where} names the field {column!r} more than once; JSON keeps only the last "
            "value, so the others would be lost without a word: write the record with one "
            f"{column!r} field"
        )
    value = record[column]
    if value is not None and (not isinstance(value, str) or isinstance(value, _LongInt)):
        texts = [k for k, v in record.items() if type(v) is str]
        kind = "int" if isinstance(value, _LongInt) else type(value).__name__
        raise TypeError(f"{where}: column {column!r} holds {kind}, not text; {_other(texts)}")
    return value


def _as_text(value: str, where: str, errors: str) -> str:
    """``value`` if it is text UTF-8 can hold; a lone surrogate (a JSON escape such as
    ``\\ud800`` that no character is) is an error, or with ``errors="replace"`` U+FFFD, as for
    a file that is not UTF-8."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        if errors == "replace":
            return without_lone_surrogates(value)
        raise ValueError(
            f"{where}: the text holds a lone surrogate {value[e.start]!r} at character "
            f"{e.start} (a JSON escape that is no character, so no tokenizer can take it); "
            "pass --encoding-errors replace (encoding_errors='replace') to read it as U+FFFD"
        ) from None
    return value


# A file whose first line is no JSON record is read whole, up to this many bytes, to say what
# it holds instead (one pretty-printed JSON object, say); a larger one gets the line's error.
_WHOLE_JSON_BYTES = 64 << 20


def _not_jsonl(path: str, errors: str) -> str | None:
    """What ``path`` holds if it is one JSON document that is not a list, else ``None``; a
    file of more than :data:`_WHOLE_JSON_BYTES` is not read whole to find out (a bad first
    line of a 1 GB JSONL took 2 GB of memory before its error)."""
    parts, size = [], 0
    for chunk in byte_chunks(path):
        size += len(chunk)
        if size > _WHOLE_JSON_BYTES:
            return None
        parts.append(chunk)
    data = b"".join(parts)
    encoding = bom_encoding(data)  # UTF-16/32 text is read as such (see _convert)
    try:
        text = data.decode(encoding, errors) if encoding else decode(data, path, errors)
        value = json.loads(without_bom(text), parse_int=_int_or_digits)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return None
    if isinstance(value, dict):
        return f"one JSON object (keys {sorted(value)[:5]})"
    return None if isinstance(value, list) else f"one JSON {type(value).__name__}"


def jsonl_documents(
    path: str, chunks: Iterator[bytes], column: str, errors: str, stats: ReadStats
) -> Iterator[str]:
    """Records of a JSONL file, or of a JSON file that is one list of records."""
    first = next(chunks)
    if first.removeprefix(b"\xef\xbb\xbf").lstrip()[:1] == b"[":  # one JSON list of records
        text = without_bom(decode(first + b"".join(chunks), path, errors))
        try:
            records = _parse_records(text, column)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
        except (ValueError, RecursionError) as e:  # Python's limits: long ints, deep nesting
            raise ValueError(f"{path} cannot be read as JSON here: {_too_much(e)}") from None
        if not isinstance(records, list):
            raise ValueError(f"{path} is not a JSON list of records")
        for i, record in enumerate(records):
            value = _text_of(record, column, f"{path}[{i}]")
            if value is None:
                stats.null_text(f"{path}[{i}]")
            else:
                yield _as_text(value, f"{path}[{i}]", errors)
        return
    records_seen = 0
    for lineno, (offset, raw) in enumerate(lines(chain(first, chunks)), 1):
        line = decode(raw, path, errors, base=offset, line=lineno)
        if lineno == 1:
            line = without_bom(line)
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = _parse_records(line, column)
        except json.JSONDecodeError as e:
            whole = _not_jsonl(path, errors) if records_seen == 0 else None
            if whole is not None:
                raise ValueError(
                    f"{path} holds {whole}, not JSON Lines: expected one record per line, or "
                    f"a JSON list of records, each with a {column!r} field; leave it out of the "
                    "inputs (e.g. a glob such as DIR/**/*.jsonl) or pass --format text to read "
                    "it as one text document"
                ) from None
            cr = (
                "; its records end in a lone CR (old Mac line endings): convert them to LF "
                "(e.g. tr '\\r' '\\n')"
                if "\r" in line.rstrip("\r")
                else ""
            )
            raise ValueError(f"{where} is not valid JSON: {e}{cr}") from None
        except (ValueError, RecursionError) as e:  # Python's limits: long ints, deep nesting
            raise ValueError(f"{where} cannot be read as JSON here: {_too_much(e)}") from None
        records_seen += 1
        value = _text_of(record, column, where)
        if value is None:
            stats.null_text(where)
        else:
            yield _as_text(value, where, errors)


def parquet_documents(path: str, column: str, stats: ReadStats) -> Iterator[str]:
    """Texts of a Parquet file's string column; a damaged file is an error saying so."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("reading Parquet needs pyarrow: pip install 'grain_rox[hf]'") from None

    def damaged(e: Exception) -> ValueError:
        return ValueError(
            f"{path} is not a readable Parquet file ({type(e).__name__}: {e}); it is damaged "
            "or not Parquet: regenerate it, or leave it out of the inputs"
        )

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise damaged(e) from None
    schema = pf.schema_arrow
    if column not in schema.names:
        raise KeyError(
            f"{path} has no column {column!r} (it has {schema.names}); pass --text-column"
        )
    named = schema.names.count(column)
    if named > 1:  # (pyarrow writes such files; reading one said the column did not exist)
        raise ValueError(
            f"{path} has {named} columns named {column!r}, so which one holds the text is not "
            "known; rewrite the file with one such column, or pass --text-column naming another"
        )
    kind = schema.field(column).type
    if pa.types.is_dictionary(kind):  # dictionary-encoded strings (pandas, Spark): text too
        kind = kind.value_type
    if not _is_arrow_text(pa, kind):
        texts = [f.name for f in schema if _is_arrow_text(pa, _value_type(pa, f.type))]
        raise TypeError(f"{path}: column {column!r} holds {kind}, not text; {_other(texts)}")
    try:
        row = 0
        for batch in pf.iter_batches(columns=[column], batch_size=1024):
            for value in _texts(batch.column(0), path, column, row):
                if value is None:
                    stats.null_text(f"{path} row {row}")
                else:
                    yield value
                row += 1
    except (pa.ArrowException, OSError) as e:
        raise damaged(e) from None


def _is_arrow_text(pa: Any, kind: Any) -> bool:
    """Whether an Arrow type holds strings (``string_view`` where this pyarrow has it)."""
    view = getattr(pa.types, "is_string_view", None)
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or (view is not None and view(kind))
    )


def _texts(values: Any, path: str, column: str, first_row: int) -> list[str | None]:
    """An Arrow string array as Python strings; a value that is not UTF-8 (Arrow strings must
    be) is an error naming its row, not a bare codec error."""
    try:
        return values.to_pylist()
    except UnicodeDecodeError as e:
        for i in range(len(values)):
            try:
                values[i].as_py()
            except UnicodeDecodeError:
                raise ValueError(
                    f"{path} row {first_row + i}: column {column!r} holds bytes that are not "
                    f"UTF-8 ({e.reason} at byte {e.start}), though Arrow strings must be; "
                    "rewrite the file with valid UTF-8 text (e.g. decode the source with "
                    "errors='replace' before writing it)"
                ) from None
        raise


def _other(texts: list[str]) -> str:
    """The fix for a text column that holds no text, naming the columns that do."""
    if texts:
        return f"pass --text-column naming a column of text ({', '.join(map(repr, texts))})"
    return "no column here holds text: convert the values to text first"


def _value_type(pa: Any, kind: Any) -> Any:
    """A dictionary-encoded column's value type; any other type as it is."""
    return kind.value_type if pa.types.is_dictionary(kind) else kind


def _too_much(error: BaseException) -> str:
    """What Python's JSON parser could not take, and the fix."""
    if isinstance(error, RecursionError):
        return "it nests arrays or objects deeper than Python's recursion limit; flatten it"
    return str(error)
