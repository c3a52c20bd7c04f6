"""RoxDocumentSource: a `.rox` corpus as a Grain source of whole documents, for packing.

A document is the tokens up to and including each EOS, found with one vectorised scan per
shard (cached; O(#documents) index memory); the block padding each write ends with is not
served, and text after the last EOS of a write is a document of its own. A document longer
than ``seq_len + 1`` tokens is, by ``long_documents=``, split into pieces of ``seq_len + 1``
that overlap by one token (every next-token pair kept), truncated (the dropped tokens are
counted and logged) or refused; the same choice, with the same words, applies to any source
:func:`~grain_rox.pack_documents` packs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from grain_rox._format._documents import split_documents, token_offsets, warn_unknown_tail
from grain_rox._format._paths import PathSpec
from grain_rox._format._rox_corpus import RoxCorpus, open_unchanged
from grain_rox._format._served import ServedSpan, served_spans
from grain_rox._order._permutation import int_arg, record_index
from grain_rox._sources._grain_setup import make_grain_workers_usable
from grain_rox._sources._output_dtype import (
    check_output_dtype,
    may_wrap,
    refuse_wrapped_in,
)
from grain_rox._sources._segments import maxtext_record

logger = logging.getLogger("grain_rox")

LONG_DOCUMENTS = ("split", "truncate", "error")  # what may become of a document too long for a row
LongDocuments = Literal["split", "truncate", "error"]


def check_long_documents(value: Any, where: str) -> None:
    """Refuse a ``long_documents=`` that is not one of :data:`LONG_DOCUMENTS`, naming them."""
    if value not in LONG_DOCUMENTS:
        raise ValueError(
            f"{where}: long_documents={value!r} is not one of 'split' (default: a long "
            "document becomes several pieces), 'truncate' (keep its first seq_len tokens) or "
            "'error'"
        )


def too_long(where: str, document: str, tokens: int, seq_len: int) -> ValueError:
    """The error for ``document`` (``"document 3"``, with its file where its source can say)
    of ``tokens`` tokens under ``long_documents='error'``."""
    return ValueError(
        f"{where}: {document} has {tokens} tokens, more than the {seq_len + 1} a row of "
        f"seq_len={seq_len} holds, and long_documents='error'; pass long_documents='split' "
        "(every token kept, in pieces) or long_documents='truncate' (the tail dropped and "
        "counted), or a larger seq_len"
    )


class RoxDocumentSource:
    """Record ``i`` = document piece ``i``: ``inputs`` = tokens[:-1], ``targets`` = tokens[1:].

    A document (its tokens and its EOS) longer than ``seq_len + 1`` tokens is, by
    ``long_documents``: ``"split"`` into pieces of ``seq_len + 1`` tokens overlapping by one
    (every next-token pair served once), ``"truncate"``: cut to its first ``seq_len + 1`` tokens
    (``tokens_dropped`` counts the rest, and a warning is logged to ``"grain_rox"``), or an
    ``"error"`` naming the document.

    Each write's block padding is left out where a manifest records it. Shards without one
    (roxxel's) are read whole: text after the last EOS is left out with a warning, but a
    roxxel append leaves the earlier write's padding mid-file, and it is read as the start of
    the next document (nothing tells it from tokens; write with grain_rox for a manifest).

    Args:
        paths: The `.rox` shards (a file, glob, directory, base path, list of them) or an open
            :class:`~grain_rox.RoxCorpus`.
        seq_len: The longest piece served has ``seq_len`` next-token pairs (``seq_len + 1``
            tokens): the row length it will be packed into.
        eos_id: The token that ends every document (default: the manifest's; one of the two
            is needed).
        long_documents: ``"split"`` (default), ``"truncate"`` or ``"error"``, as above.
        dtype: The dtype of ``inputs`` and ``targets`` (default ``int32``).

    >>> import tempfile, os, numpy as np
    >>> from grain_rox import write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "d.rox")
    >>> _ = write_rox([np.array([5, 6, 7], np.uint16), np.array([8], np.uint16)], path,
    ...               separator=0, block_size=16)
    >>> docs = RoxDocumentSource(path, seq_len=8)
    >>> len(docs), docs[0]["inputs"].tolist(), docs[0]["targets"].tolist()
    (2, [5, 6, 7], [6, 7, 0])
    >>> short = RoxDocumentSource(path, seq_len=2, long_documents="truncate")
    >>> short[0]["inputs"].tolist(), short.tokens_dropped
    ([5, 6], 1)
    """

    def __init__(
        self,
        paths: PathSpec | RoxCorpus,
        *,
        seq_len: int,
        eos_id: int | None = None,
        long_documents: LongDocuments = "split",
        dtype: Any = np.int32,
    ) -> None:
        make_grain_workers_usable()  # a user's own mp_prefetch/DataLoader workers start
        seq_len = int_arg(seq_len, "seq_len", where="RoxDocumentSource")
        check_long_documents(long_documents, "RoxDocumentSource")
        if eos_id is not None:
            eos_id = int_arg(eos_id, "eos_id", where="RoxDocumentSource", minimum=0)
        self.corpus = open_unchanged(paths)
        eos = eos_id if eos_id is not None else self.corpus.eos_id
        if eos is None:
            raise ValueError(
                f"{self.corpus.paths[0]}: no EOS id to split documents at "
                f"({self.corpus.why_no_eos()}); pass eos_id="
            )
        self.eos_id = int(eos)
        self.seq_len = int(seq_len)
        self.long_documents = long_documents
        self.dtype = np.dtype(dtype)
        stored = {self.corpus.paths[0]: self.corpus.dtype}
        check_output_dtype(self.dtype, stored, [self.eos_id], where="RoxDocumentSource")
        self._may_wrap = may_wrap(self.dtype, self.corpus.dtype)  # uint32 as int32: checked
        self._spans = served_spans(self.corpus)
        # a Grain DataLoader compares reprs on restore: documents that the padding left out
        # (mid-stream, after appends) or a last document without its EOS change which record i
        # is, so they are named (and other data keeps its old repr)
        self._changes = ""
        left_out = self.corpus.num_tokens - sum(span.stop - span.start for span in self._spans)
        if left_out and len(self._spans) > 1:
            self._changes += f", padding_left_out={left_out}"
        tails = sum(span.known_end and not self._ends_with_eos(span) for span in self._spans)
        if tails:
            self._changes += f", unterminated_documents={tails}"
        self._lock = threading.Lock()
        self._index: tuple[np.ndarray, np.ndarray] | None = None
        self._dropped: tuple[int, int] | None = None

    def _ends_with_eos(self, span: ServedSpan) -> bool:
        return int(self.corpus.tokens(span.stop - 1, span.stop)[0]) == self.eos_id

    @property
    def tokens_dropped(self) -> int:
        """Tokens that ``long_documents="truncate"`` leaves out (0 otherwise)."""
        self._pieces()
        assert self._dropped is not None
        return self._dropped[1]

    @property
    def documents_truncated(self) -> int:
        """Documents that ``long_documents="truncate"`` cut (0 otherwise)."""
        self._pieces()
        assert self._dropped is not None
        return self._dropped[0]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_index"] = None
        state["_dropped"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _pieces(self) -> tuple[np.ndarray, np.ndarray]:
        """(start, length) of every piece, in corpus order; built once per process."""
        if self._index is None:
            with self._lock:
                if self._index is None:
                    self._index = self._build_index()
        return self._index

    def _build_index(self) -> tuple[np.ndarray, np.ndarray]:
        if self.corpus.remote:
            size = sum(sh.num_tokens for sh in self.corpus.shards) * self.corpus.dtype.itemsize
            logger.warning(
                "RoxDocumentSource over %s: finding the documents reads every token once in "
                "this process (%s bytes from the bucket, again in each worker process). For a "
                "large corpus, TokenPipeline(..., packing='best_fit') reads only the chunks it "
                "serves",
                self.corpus.paths[0],
                f"{size:,}",
            )
        starts, lengths = self._documents(token_offsets(self.corpus, self.eos_id))
        keep = lengths > 1  # a lone EOS (padding runs) is no document
        starts, lengths = starts[keep], lengths[keep]
        window = self.seq_len + 1
        long = np.flatnonzero(lengths > window)
        self._dropped = (0, 0)
        if long.size and self.long_documents == "error":
            i = int(long[0])
            where = f"RoxDocumentSource({self.corpus.paths[0]}, ...)"
            raise too_long(where, f"document {i}", int(lengths[i]), self.seq_len)
        if self.long_documents == "truncate":
            dropped = int((lengths[long] - window).sum())
            self._dropped = (int(long.size), dropped)
            if long.size:
                logger.warning(
                    "RoxDocumentSource(%s, seq_len=%d, long_documents='truncate'): %d of %d "
                    "documents are longer than %d tokens; %d tokens are dropped",
                    self.corpus.paths[0],
                    self.seq_len,
                    long.size,
                    lengths.size,
                    window,
                    dropped,
                )
            return starts, np.minimum(lengths, window)
        # Split: pieces of `window` tokens overlapping by one, so no next-token pair is lost.
        counts = np.maximum(1, -(-(lengths - 1) // self.seq_len))
        doc = np.repeat(np.arange(starts.size), counts)
        k = np.arange(doc.size) - np.repeat(np.cumsum(counts) - counts, counts)
        piece_start = starts[doc] + k * self.seq_len
        piece_len = np.minimum(window, starts[doc] + lengths[doc] - piece_start)
        return piece_start, piece_len

    def _documents(self, eos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start, length) of every document (see :func:`~grain_rox._format._documents.
        split_documents`; ``eos``: the corpus offsets of every EOS); text after a stretch's
        last EOS that no manifest says is data is not served, and a warning names it."""
        found = split_documents(self._spans, eos)
        for tail, stop in found.unknown_tails:
            warn_unknown_tail(
                "RoxDocumentSource", "served", self.corpus.paths[0], stop - tail, tail, self.eos_id
            )
        return found.starts, found.stops - found.starts

    def __len__(self) -> int:
        return int(self._pieces()[0].size)

    def __repr__(self) -> str:
        return (
            f"RoxDocumentSource(data={self.corpus.fingerprint}, seq_len={self.seq_len}, "
            f"eos_id={self.eos_id}, long_documents={self.long_documents}, "
            f"dtype={self.dtype.name}{self._changes})"
        )

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        starts, lengths = self._pieces()
        index = record_index(index, int(starts.size), "document piece")
        a = int(starts[index])
        tokens = self.corpus.tokens(a, a + int(lengths[index])).astype(self.dtype)
        if self._may_wrap:
            refuse_wrapped_in(self.corpus, tokens, self.dtype, where="RoxDocumentSource")
        tokens.flags.writeable = False  # inputs and targets share it: read-only, like batches
        return maxtext_record(tokens, {})

    def _getitems(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        return [self[i] for i in indices]

    __getitems__ = _getitems
