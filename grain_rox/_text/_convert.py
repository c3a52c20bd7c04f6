"""Read documents from text, JSONL, Parquet or saved HF dataset files, exactly or loudly.

Inputs are read exactly or refused loudly: compressed files (``.gz``, ``.bz2``, ``.xz``,
``.zst``) are decompressed on the fly; binary files (a NUL byte or mostly control bytes in
their first 8 KiB), empty files and special files (FIFOs, sockets) are skipped and counted
in :class:`ReadStats` (or, with ``on_binary="error"``, binary files stop the run); text that
is not UTF-8 (or a JSON text escaping a lone surrogate) is an error naming the file and the
byte offset (the record) unless ``encoding_errors="replace"``; a record whose text is null is an error naming it unless
``on_null="skip"`` (then skipped and counted).

The per-format readers and :class:`ReadStats` live in :mod:`grain_rox._text._document_readers`;
this module finds the inputs and picks each one's reader; :func:`read_documents` is the public
door (inputs as the CLI takes them). Each file
read is logged at DEBUG to the ``"grain_rox"`` logger (its path, format and documents), each
file skipped at WARNING (its path and why).
"""

from __future__ import annotations

import errno
import glob
import json
import logging
import os
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from grain_rox._format._manifest import MANIFEST_SUFFIX, member_pattern
from grain_rox._format._rox_format import FOOTER, SIGNATURE
from grain_rox._text._document_readers import (
    ReadStats,
    hf_documents,
    jsonl_documents,
    parquet_documents,
)
from grain_rox._text._text_files import (
    SNIFF,
    as_utf8,
    binary_reason,
    bom_encoding,
    byte_chunks,
    chain,
    compression_of,
    decode,
    without_bom,
)

FORMATS = ("auto", "text", "jsonl", "parquet", "hf", "array_record")
ON_BINARY = ("skip", "error")
ON_NULL = ("error", "skip")
ENCODING_ERRORS = ("strict", "replace")
_JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
_PARQUET_SUFFIXES = (".parquet", ".pq")
_ARRAY_RECORD_SUFFIXES = (".array_record", ".arrayrecord")

logger = logging.getLogger("grain_rox")


def require_documents(docs: Iterator[str], stats: ReadStats, what: str) -> Iterator[str]:
    """``docs``, or an error saying why there are none (every input skipped or empty)."""
    first = next(docs, None)
    if first is None:
        why = (
            "the lines logged above say why each file was skipped"
            if stats.files_skipped
            else "the files read hold no records (no lines, rows or documents); "
            "check that these are the files meant"
        )
        raise ValueError(f"no documents to convert in {what}: {stats.summary()}; {why}")
    return chain(first, docs)


def expand_inputs(inputs: Sequence[str]) -> list[str]:
    """Expand files, directories (recursively, sorted, hidden entries skipped, links to
    directories followed) and globs (a matched directory read as if named); a path that exists
    is taken as it is, even where its name holds glob characters (``a[1].txt``).

    Everything that is not a directory is listed, special files too: :func:`read_files`
    counts those it skips instead of dropping them unseen. A dataset saved with HF
    ``save_to_disk`` is one input, wherever it is found. A file that a directory or a glob
    lists again (``d/**`` matches ``d/sub`` and ``d/sub/f.txt``; links lead to one directory
    twice), or that is also named by hand, is read once whichever comes first; a link back
    to a directory that holds it (a loop) is not followed; a file named twice by hand is read
    twice, as asked.
    """
    files: list[str] = []
    seen = _Seen()
    for spec in inputs:
        if os.path.lexists(spec) or not any(c in spec for c in "*?["):
            files.extend(_expand_path(spec, seen, named=True))
            continue
        matched = sorted(glob.glob(spec, recursive=True))
        if not matched:
            raise FileNotFoundError(f"the input glob {spec!r} matched no files")
        for path in matched:
            files.extend(_expand_path(path, seen, named=False))
    if not files:  # (a named empty folder is refused above; globs matched only such folders)
        raise FileNotFoundError(
            f"the inputs {list(inputs)} hold no files: what they match are folders with "
            "nothing in them; name the files or folders to convert"
        )
    return files


def without_output_set(files: Sequence[str], output: str) -> list[str]:
    """``files`` without the output set's own (``x.rox``, ``x_0000.rox``, ...,
    ``x.manifest.json`` beside the output ``x.rox``): an output inside an input directory was
    read back as input on the next run (its manifest as a document). Those left out are
    logged; inputs that hold nothing else are an error.

    >>> without_output_set(["d/a.txt", "d/t.rox", "d/t_0001.rox", "d/t.manifest.json"], "d/t.rox")
    ['d/a.txt']
    """
    where = os.path.realpath(os.path.dirname(os.path.abspath(output)))
    base = os.path.basename(output)
    manifest = (base[:-4] if base.endswith(".rox") else base) + MANIFEST_SUFFIX
    members = member_pattern(manifest)
    kept: list[str] = []
    left: list[str] = []
    for f in files:
        name = os.path.basename(f)  # by name first: a folder's realpath only for a set's name
        ours = (name in (manifest, base) or members.fullmatch(name) is not None) and (
            os.path.realpath(os.path.dirname(os.path.abspath(f))) == where
        )
        (left if ours else kept).append(f)
    if left:  # an output inside an input directory: never read back as input
        shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
        if not kept:
            raise ValueError(
                f"the inputs hold only the output set's own files ({shown}); name the inputs "
                "to convert"
            )
        logger.warning(
            "convert: leaving out the output set's own files %s: a convert never reads what "
            "it writes",
            shown,
        )
    return kept


class _Seen:
    """What an expansion has listed: directories and found files, by real path."""

    def __init__(self) -> None:
        self.directories: set[str] = set()
        self.files: set[str] = set()
        self.named: set[str] = set()  # files named by hand
        self.present = 0  # files a walk met, listed before or not

    def first(self, path: str) -> bool:
        """Whether a found file is listed for the first time (and mark it listed)."""
        real = os.path.realpath(path)
        if real in self.files:
            return False
        self.files.add(real)
        return True

    def take_named(self, path: str) -> bool:
        """Whether a file named by hand is listed: unless a directory or glob listed it
        already (then it is read once, whichever comes first); named twice, it is read twice,
        as asked."""
        real = os.path.realpath(path)
        if real in self.files and real not in self.named:
            return False
        self.files.add(real)
        self.named.add(real)
        return True


def _expand_path(path: str, seen: _Seen, *, named: bool) -> list[str]:
    """The inputs ``path`` stands for (``named``: given by the user, not matched by a glob:
    a directory with no files is then an error, and a file is taken even if listed)."""
    if not named and _loops(path):  # a glob follows links round a loop until the OS stops it
        return []
    if is_hf_dataset_dir(path):
        taken = seen.take_named(path) if named else seen.first(path)
        return [path] if taken else []  # save_to_disk: one input
    if os.path.isdir(path):
        before = os.path.realpath(path) in seen.directories
        present = seen.present
        found = _walk(path, seen)
        if not found and named and not before and seen.present == present:
            raise FileNotFoundError(f"the input directory {path!r} holds no files")
        return found
    if os.path.lexists(path):
        return [path] if (seen.take_named(path) if named else seen.first(path)) else []
    raise FileNotFoundError(f"input {path!r} does not exist")


def _loops(path: str) -> bool:
    """Whether ``path`` is a link that resolves round a loop (too many levels of links)."""
    try:
        os.stat(path)
    except OSError as e:
        return e.errno == errno.ELOOP
    return False


def _walk(directory: str, seen: _Seen) -> list[str]:
    """Files under ``directory`` not listed yet: its own (sorted), then each subdirectory's
    (sorted), hidden entries skipped, a saved HF dataset kept as one input; a directory
    already listed, or a link back to one that holds it, is not read again."""
    real = os.path.realpath(directory)
    if real in seen.directories:
        return []
    seen.directories.add(real)
    with os.scandir(directory) as entries:
        visible = sorted((e for e in entries if not e.name.startswith(".")), key=lambda e: e.name)
    kinds = [(e, e.is_dir(follow_symlinks=True)) for e in visible]  # (a stat per link, once)
    files = [e.path for e, folder in kinds if not folder]
    seen.present += len(files)
    found = [f for f in files if seen.first(f)]
    for entry in (e for e, folder in kinds if folder):
        if entry.is_symlink():  # a loop back up: to a directory that holds this one, where
            # it really is or along the path it was reached by
            target = os.path.realpath(entry.path)
            if any(
                os.path.commonpath([target, where]) == target
                for where in (real, os.path.abspath(entry.path))
            ):
                continue
        if is_hf_dataset_dir(entry.path):
            seen.present += 1
            found.extend([entry.path] if seen.first(entry.path) else [])
        else:
            found.extend(_walk(entry.path, seen))
    return found


def is_hf_dataset_dir(path: str) -> bool:
    """Whether ``path`` is a dataset written by HF ``save_to_disk``: a Dataset (a
    ``state.json`` listing its ``_data_files``, beside a ``dataset_info.json``) or a
    DatasetDict (a ``dataset_dict.json`` listing its ``splits``). Any folder may hold a
    ``state.json`` of its own (a run's, an app's): its files are text to convert.

    >>> import tempfile, json
    >>> d = tempfile.mkdtemp()
    >>> _ = open(os.path.join(d, "state.json"), "w").write(json.dumps({"step": 3}))
    >>> is_hf_dataset_dir(d)
    False
    """
    if not os.path.isdir(path):
        return False
    state = _small_json(os.path.join(path, "state.json"))
    if isinstance(state, dict) and "_data_files" in state:
        return os.path.isfile(os.path.join(path, "dataset_info.json"))
    splits = _small_json(os.path.join(path, "dataset_dict.json"))
    names = splits.get("splits") if isinstance(splits, dict) else None
    return isinstance(names, list) and all(isinstance(name, str) for name in names)


def _small_json(path: str, limit: int = 1 << 20) -> Any:
    """The JSON value of file ``path`` if it is a file of at most ``limit`` bytes, else None."""
    try:
        if os.path.getsize(path) > limit:
            return None
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def detect_format(path: str) -> str:
    """Guess a file's format from its name (a compression suffix looked through): jsonl,
    parquet, hf (a saved dataset), array_record (token documents) or text.

    >>> detect_format("a/b.jsonl.gz"), detect_format("c.parquet"), detect_format("notes.gz")
    ('jsonl', 'parquet', 'text')
    """
    if is_hf_dataset_dir(path):
        return "hf"
    lower = path.lower()
    if compression_of(lower):
        lower = os.path.splitext(lower)[0]
    if lower.endswith(_ARRAY_RECORD_SUFFIXES) or ".array_record-" in lower:
        return "array_record"
    if lower.endswith(_JSONL_SUFFIXES):
        return "jsonl"
    if lower.endswith(_PARQUET_SUFFIXES):
        return "parquet"
    return "text"


def input_bytes(files: Iterable[str]) -> int:
    """The bytes of ``files`` on disk (a saved HF dataset: all its files), the total that
    :func:`read_files`'s ``on_bytes`` calls add up to.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> for name, data in {"a.txt": b"hi", "b.txt": b"yo!"}.items():
    ...     _ = open(os.path.join(d, name), "wb").write(data)
    >>> input_bytes(expand_inputs([d]))
    5
    """
    return sum(_size_on_disk(path) for path in files)


def _size_on_disk(path: str) -> int:
    if os.path.isdir(path):
        return sum(
            os.path.getsize(os.path.join(root, n))
            for root, _, names in os.walk(path)
            for n in names
        )
    if not os.path.exists(path):  # a broken link: read_files skips it
        return 0
    st = os.stat(path)
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def read_files(
    files: Iterable[str],
    *,
    fmt: str = "auto",
    text_column: str = "text",
    on_binary: str = "skip",
    encoding_errors: str = "strict",
    on_null: str = "error",
    stats: ReadStats | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> Iterator[str]:
    """Yield one document per text file, JSONL line (or record of a JSON list), Parquet row or
    HF dataset row.

    Compressed files are read through; binary files are skipped (``on_binary="error"``: an
    error), as are empty and special files, each logged and counted in ``stats``; text that
    is not UTF-8 (or a JSON text escaping a lone surrogate) is an error unless
    ``encoding_errors="replace"``; a null text is an error
    naming its record unless ``on_null="skip"`` (then counted in ``stats``). ``on_bytes`` is
    told the bytes of the files on disk as they are read (text and JSONL files chunk by chunk,
    the others when done): the calls add up to :func:`input_bytes` of ``files``. Each file is
    logged to the ``"grain_rox"`` logger when done: read at DEBUG (``read a.txt (text): 1
    document``), skipped at WARNING (``skipped b.bin: it looks binary ...``).

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> files = {"a.txt": b"hi", "b.bin": b"\\x00\\x01", "c.jsonl": b'{"text": "x"}'}
    >>> for name, data in files.items():
    ...     _ = open(os.path.join(d, name), "wb").write(data)
    >>> stats, read = ReadStats(), []
    >>> list(read_files(expand_inputs([d]), stats=stats, on_bytes=read.append))
    ['hi', 'x']
    >>> stats.summary(), read
    ('2 files read, skipped 1 file (1 binary)', [2, 2, 13])
    """
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {FORMATS}")
    if on_binary not in ON_BINARY:
        raise ValueError(f"on_binary={on_binary!r} is not one of {ON_BINARY}")
    if encoding_errors not in ENCODING_ERRORS:
        raise ValueError(f"encoding_errors={encoding_errors!r} is not one of {ENCODING_ERRORS}")
    if on_null not in ON_NULL:
        raise ValueError(f"on_null={on_null!r} is not one of {ON_NULL}")
    stats = ReadStats() if stats is None else stats
    stats.on_null = on_null
    for path in files:
        sent = 0

        def count(n: int) -> None:
            nonlocal sent
            sent += n
            if on_bytes is not None:
                on_bytes(n)

        kind = detect_format(path) if fmt == "auto" else fmt
        docs_before, skipped_before = stats.documents, stats.files_skipped
        for doc in _file_documents(
            path, kind, text_column, on_binary, encoding_errors, stats, count
        ):
            stats.documents += 1
            yield doc
        if stats.files_skipped == skipped_before:  # a skipped file was logged when skipped
            n = stats.documents - docs_before
            logger.debug("read %s (%s): %d document%s", path, kind, n, "" if n == 1 else "s")
        rest = _size_on_disk(path) - sent  # skipped files, and what a reader took at its end
        if rest > 0:
            count(rest)


def _file_documents(
    path: str,
    kind: str,
    text_column: str,
    on_binary: str,
    encoding_errors: str,
    stats: ReadStats,
    on_bytes: Callable[[int], None],
) -> Iterator[str]:
    """The documents of one input file of format ``kind``, or none when it is skipped."""
    if kind == "array_record":
        raise ValueError(
            f"{path} holds token documents, not text: convert ArrayRecord inputs on their "
            "own, with --record-dtype"
        )
    if kind == "hf":
        stats.files_read += 1
        yield from hf_documents(path, text_column, stats)
        return
    if not os.path.exists(path) and os.path.islink(path):  # a link to nothing: no text
        target = os.readlink(path)
        stats.skip(path, "broken link", f"a link to {target!r}, which does not exist")
        return
    mode = os.stat(path).st_mode
    if stat.S_ISDIR(mode) and is_hf_dataset_dir(path):  # (--format text names one)
        stats.skip(path, "saved HF dataset", "a saved HF dataset, not text (pass --format hf)")
        return
    if not stat.S_ISREG(mode):
        stats.skip(path, "not a regular file", "not a regular file (a FIFO, socket or device)")
        return
    if kind == "parquet":
        if compression_of(path):
            raise ValueError(
                f"{path}: compressed Parquet files are not read; decompress it first "
                "(Parquet compresses its own pages)"
            )
        stats.files_read += 1
        yield from parquet_documents(path, text_column, stats)
        return
    if _ends_in_rox_footer(path):  # its index and footer are often valid UTF-8 text
        shard = "a .rox shard: token ids ending in a ROXXEL02 footer"
        if on_binary == "error":
            raise ValueError(
                f"{path} is {shard}, not text; leave it out of the inputs (name the text "
                "files, or a glob of them)"
            )
        stats.skip(path, "rox shard", f"it is {shard}, not text; pass --on-binary error to stop")
        return
    chunks = byte_chunks(path, on_bytes=on_bytes)
    head = next(chunks, b"")
    encoding = bom_encoding(head)
    if encoding is not None:  # UTF-16/32 text (Windows tools write it): read as UTF-8
        chunks = as_utf8(chain(head, chunks), encoding, path, encoding_errors)
        head = next(chunks, b"")
    if not head:
        stats.skip(path, "empty", "it is empty")
        return
    why = binary_reason(head[:SNIFF])
    if why is not None and path.endswith(".arrow"):  # a HF dataset's cache or saved file
        why += (
            "; a HF dataset's Arrow file: pass the folder save_to_disk wrote (its "
            "state.json beside it), or save the dataset with save_to_disk"
        )
    if why is not None:
        if on_binary == "error":
            raise ValueError(
                f"{path} looks binary ({why}), not text; leave it out of the inputs, "
                "or pass --on-binary skip (on_binary='skip') to skip such files"
            )
        stats.skip(
            path, "binary", f"it looks binary ({why}); pass --on-binary error to stop instead"
        )
        return
    stats.files_read += 1
    if kind == "jsonl":
        yield from jsonl_documents(path, chain(head, chunks), text_column, encoding_errors, stats)
    else:
        data = head + b"".join(chunks)
        yield without_bom(decode(data, path, encoding_errors))


def _ends_in_rox_footer(path: str) -> bool:
    """Whether the (uncompressed) file ``path`` ends as a ``.rox`` shard: a 32-byte footer
    whose last 8 bytes are the ROXXEL02 signature."""
    if compression_of(path.lower()):
        return False
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) < FOOTER.size:
            return False
        f.seek(-len(SIGNATURE), os.SEEK_END)
        return f.read() == SIGNATURE


def read_documents(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    text_column: str = "text",
    fmt: str = "auto",
    on_binary: str = "skip",
    encoding_errors: str = "strict",
    on_null: str = "error",
    stats: ReadStats | None = None,
) -> Iterator[str]:
    """Yield the documents of files, directories and globs, as ``grain-rox convert`` reads them.

    One document per text file, JSONL line (or record of a JSON list), Parquet row or row of a
    HuggingFace dataset saved with ``save_to_disk``; directories are read recursively in sorted
    order (hidden files skipped), compressed files (``.gz``, ``.bz2``, ``.xz``, ``.zst``) through.
    Give the result to :func:`~grain_rox.write_rox` with a ``tokenizer=`` to make a shard set.

    Args:
      inputs: a path, directory or glob, or a list of them.
      text_column: the JSONL key, Parquet column or dataset column holding the text.
      fmt: ``"auto"`` (by suffix and content), ``"text"``, ``"jsonl"``, ``"parquet"`` or ``"hf"``.
      on_binary: ``"skip"`` binary files (logged at WARNING to the ``"grain_rox"`` logger) or
        ``"error"``.
      encoding_errors: ``"strict"`` (text that is not UTF-8 is an error naming the file and the
        byte offset) or ``"replace"``.
      on_null: ``"error"`` (a null text is an error naming its record) or ``"skip"``.
      stats: a :class:`~grain_rox.ReadStats` that counts, as the documents are read, the
        files read, the documents, and what was skipped and why (binary files, null texts),
        as ``grain-rox convert`` reports it: a skip is a counted choice, never silent.

    Returns:
      An iterator of ``str``, lazily read: files are opened as it is consumed.

    Raises:
      FileNotFoundError: an input that does not exist, a glob that matches nothing or an empty
        directory (raised at once, before any document).
      ValueError: a bad option; while iterating, text that is not UTF-8, a null text or a
        binary file (with the ``"error"`` choices).

    >>> import os, tempfile
    >>> from grain_rox import ReadStats, read_documents
    >>> d = tempfile.mkdtemp()
    >>> _ = open(os.path.join(d, "a.txt"), "w").write("first")
    >>> _ = open(os.path.join(d, "b.jsonl"), "w").write('{"text": "second"}\\n{"text": "third"}\\n')
    >>> list(read_documents(d))
    ['first', 'second', 'third']
    >>> _ = open(os.path.join(d, "c.bin"), "wb").write(bytes(range(256)))
    >>> stats = ReadStats()
    >>> len(list(read_documents(d, stats=stats))), stats.summary()
    (3, '2 files read, skipped 1 file (1 binary)')
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    files = expand_inputs([os.fspath(i) for i in inputs])
    return read_files(
        files,
        fmt=fmt,
        text_column=text_column,
        on_binary=on_binary,
        encoding_errors=encoding_errors,
        on_null=on_null,
        stats=stats,
    )
