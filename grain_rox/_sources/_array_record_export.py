"""`.rox` shards to ArrayRecord token documents (split at EOS), written atomically, verified.

The inverse of ``grain-rox convert --format array_record``: every document (the tokens
between two EOS tokens, EOS left out) becomes one raw record of the corpus dtype, so
:class:`~grain_rox.ArrayRecordSource` (``dtype=``) and loaderx-style readers serve it. The
documents are those written, token for token: each write's block padding is left out where
the manifest records it (:mod:`grain_rox._format._served`), never guessed from the tokens, so a
document that starts or ends with the pad id keeps it, and an empty document (an empty item)
is an empty record. Shards without a manifest (as roxxel writes them) record no padding: see
:func:`rox_documents` for what is exported of them. The file is written under a temporary
name, read back in full and compared (record count and the sha256 of the records, each
length-prefixed, so that their boundaries count) before it is renamed into place: a writer
killed half-way leaves no file that looks valid.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from grain_rox._format._atomic import publish, temp_path_for
from grain_rox._format._documents import warn_unknown_tail
from grain_rox._format._paths import PathSpec
from grain_rox._format._rox_corpus import RoxCorpus, open_rox
from grain_rox._format._served import ServedSpan, served_spans
from grain_rox._sources._array_record import close_quietly, count_records, read_in_order


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What :func:`export_array_record` wrote."""

    path: str  # the ArrayRecord file
    num_documents: int  # records written (one per document; see rox_documents)
    num_tokens: int  # tokens in them (EOS left out)
    dtype: str  # the records' dtype (the corpus's): pass it to ArrayRecordSource(dtype=)
    sha256: str  # of the records in order, each after its length (8 bytes, little-endian)


def rox_documents(
    corpus: RoxCorpus, eos_id: float, chunk_tokens: int = 1 << 24
) -> Iterator[np.ndarray]:
    """The corpus's documents in order, split at ``eos_id`` (EOS dropped), as written.

    A document may span shards. Where every shard has a manifest, the documents are exactly
    the items written: the padding each write ends with is left out where the manifest says
    it is (:func:`~grain_rox._format._served.served_spans`), a document keeps every token,
    the pad id included, an empty item is an empty document, and text after the last EOS of a
    write is a document of its own. Shards without a manifest, as roxxel writes them, record
    no padding; there, as in :class:`~grain_rox.RoxDocumentSource`, two EOS in a row give no
    document (roxxel pads with the separator), the tokens after the last EOS (roxxel's padding
    with a pad id other than the EOS, or a last document without its EOS) are not exported and
    a warning names them, and a pad id other than the EOS that an append left mid-stream
    cannot be told from text: it is exported as the start of the next document.

    >>> import tempfile, os
    >>> from grain_rox import open_rox, write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "p.rox")
    >>> docs = [np.array([0, 5], np.uint16), np.array([], np.uint16), np.array([6, 0], np.uint16)]
    >>> _ = write_rox(docs, path, separator=7, pad_id=0, block_size=16)
    >>> [d.tolist() for d in rox_documents(open_rox(path), 7)]
    [[0, 5], [], [6, 0]]
    """
    exact = all(pad is not None for _, pad in corpus.trailing_padding())
    for span in served_spans(corpus):
        yield from _span_documents(corpus, span, eos_id, exact, chunk_tokens)


def _span_documents(
    corpus: RoxCorpus, span: ServedSpan, eos_id: float, exact: bool, chunk_tokens: int
) -> Iterator[np.ndarray]:
    """The documents of one stretch of served tokens, read ``chunk_tokens`` at a time (a
    document may span chunks); ``exact``: the corpus's padding is known, so an empty document
    is one."""
    carry: list[np.ndarray] = []  # the start of the document that the last chunk ended in
    for lo in range(span.start, span.stop, chunk_tokens):
        tokens = corpus.tokens(lo, min(span.stop, lo + chunk_tokens))
        start = 0
        for end in np.flatnonzero(tokens == eos_id).tolist():
            doc = np.concatenate([*carry, tokens[start:end]]) if carry else tokens[start:end]
            carry = []
            if doc.size or exact:
                yield doc
            start = end + 1
        if start < tokens.size:
            carry.append(tokens[start:])
    tail = sum(piece.size for piece in carry)
    if tail and span.known_end:
        yield np.concatenate(carry)
    elif tail:
        warn_unknown_tail(
            "export_array_record", "exported", corpus.paths[0], tail, span.stop - tail, eos_id
        )


def export_array_record(
    paths: PathSpec | RoxCorpus,
    output: str | os.PathLike[str],
    *,
    eos_id: float | None = None,
    group_size: int = 1,
    compression: str = "zstd",
    overwrite: bool = False,
    progress: bool = False,
) -> ExportResult:
    """Write the documents of `.rox` shards to one ArrayRecord file (one raw record each).

    The documents are exactly those written where the shards have a manifest (an empty one is
    an empty record; a pad id inside a document is kept); without a manifest, see
    :func:`rox_documents`.

    Args:
      paths: the `.rox` shards (a path, a glob, a list of them) or an open corpus.
      output: the ArrayRecord file to write.
      eos_id: the token that ends a document (default: the shards' manifest's EOS id).
      group_size: records per ArrayRecord chunk (1: the fastest random access).
      compression: ``"zstd"`` (default) or ``"uncompressed"``.
      overwrite: replace an existing ``output`` (else a ``FileExistsError``).
      progress: show a progress bar (``tqdm``).

    Returns:
      An :class:`ExportResult`: the path written, its document and token counts, the
      records' dtype and the sha256 of the records (each after its length).

    >>> import tempfile, os, numpy as np
    >>> from grain_rox import write_rox, ArrayRecordSource
    >>> d = tempfile.mkdtemp()
    >>> _ = write_rox([np.array([5, 6], np.uint16), np.array([7], np.uint16)],
    ...               os.path.join(d, "c.rox"), separator=0, block_size=16)
    >>> r = export_array_record(os.path.join(d, "c.rox"), os.path.join(d, "c.array_record"),
    ...                         eos_id=0)
    >>> r.num_documents, [a.tolist() for a in ArrayRecordSource(r.path, dtype=r.dtype)._getitems([0, 1])]
    (2, [[5, 6], [7]])
    """
    from array_record.python.array_record_module import ArrayRecordWriter

    output = os.fspath(output)
    if os.path.exists(output) and not overwrite:
        raise FileExistsError(f"{output} exists; pass overwrite=True (--overwrite) to replace it")
    if group_size < 1:
        raise ValueError(f"group_size={group_size} must be >= 1")
    if compression not in ("zstd", "uncompressed"):
        raise ValueError(f"compression={compression!r}; use 'zstd' or 'uncompressed'")
    corpus = open_rox(paths)
    eos = eos_id if eos_id is not None else corpus.eos_id
    if eos is None:
        raise ValueError(
            f"{corpus.paths[0]}: no EOS id to split documents at ({corpus.why_no_eos()}); "
            "pass eos_id= (--eos-id)"
        )
    held = np.iinfo(corpus.dtype) if corpus.dtype.kind in "iu" else None
    if held is not None and not float(eos).is_integer():  # int() made 3.7 the id 3
        raise ValueError(
            f"{corpus.paths[0]}: eos_id={eos!r} is not a whole number, and its tokens are "
            f"{corpus.dtype}; pass the EOS id the set was written with (an int)"
        )
    if held is not None and not held.min <= eos <= held.max:  # no token is: all were one
        raise ValueError(
            f"{corpus.paths[0]}: eos_id={eos} is outside the range of its {corpus.dtype} tokens "
            f"({held.min}..{held.max}), so no token ends a document; pass the EOS id the set was "
            "written with (eos_id=, --eos-id; by default the manifest's)"
        )
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    temp = temp_path_for(output)  # hidden; renamed into place only once verified
    digest = hashlib.sha256()
    count = tokens = 0
    writer = ArrayRecordWriter(temp, f"group_size:{group_size},{compression}")
    try:
        if not writer.ok():
            raise OSError(f"cannot write {temp}: is the directory writable?")
        docs: Any = rox_documents(corpus, int(eos) if held is not None else eos)
        if progress:
            from tqdm.auto import tqdm

            docs = tqdm(
                docs, desc=f"exporting {os.path.basename(output)}", unit="doc", disable=None
            )
        for doc in docs:
            # the bytes of the dtype the result names (a document joined from pieces is native)
            record = np.ascontiguousarray(doc, dtype=corpus.dtype).tobytes()
            writer.write(record)
            add_record(digest, record)
            count += 1
            tokens += int(doc.size)
        writer.close()
        if count == 0:
            raise ValueError(f"{corpus.paths[0]}: no documents to export (is eos_id={eos} right?)")
        _check_written(temp, count, digest.hexdigest())
        with open(temp, "rb") as f:
            os.fsync(f.fileno())  # the bytes are on disk before the name says they are
        publish(temp, output)
    except BaseException:
        close_quietly(writer)
        if os.path.exists(temp):
            os.remove(temp)
        raise
    return ExportResult(output, count, tokens, str(corpus.dtype), digest.hexdigest())


def add_record(digest: Any, record: bytes) -> None:
    """Hash ``record`` after its length: records [ab][c] and [a][bc] hash apart.

    >>> a, b = hashlib.sha256(), hashlib.sha256()
    >>> add_record(a, b"ab"); add_record(a, b"c"); add_record(b, b"a"); add_record(b, b"bc")
    >>> a.hexdigest() == b.hexdigest()
    False
    """
    digest.update(len(record).to_bytes(8, "little"))
    digest.update(record)


def _check_written(path: str, count: int, sha256: str) -> None:
    """Read ``path`` back in full; its records must hash to what was written."""
    found = count_records(path)
    if found != count:
        raise OSError(f"{path}: wrote {count} records but {found} read back")
    digest = hashlib.sha256()
    for _, record in read_in_order(path, count, 4096):
        add_record(digest, record)
    if digest.hexdigest() != sha256:
        raise OSError(f"{path}: the records read back differ from those written")
