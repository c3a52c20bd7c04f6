"""Per-record Grain sources over `.rox` shards: next-token windows and raw blocks.

These are plain ``RandomAccessDataSource``s in stream order, for use with Grain's own
samplers, shuffles and ``Batch`` (``grain.DataLoader``, ``grain.MapDataset.source``). For the
fast, shuffled, host-count-independent global order use :class:`grain_rox.TokenPipeline`,
whose records are whole batches.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np

from grain_rox._format._paths import PathSpec
from grain_rox._format._rox_corpus import RoxCorpus, open_unchanged
from grain_rox._format._served import served_spans
from grain_rox._order._permutation import int_arg, record_index, record_indices
from grain_rox._sources._grain_setup import make_grain_workers_usable
from grain_rox._sources._output_dtype import (
    check_output_dtype,
    may_wrap,
    refuse_wrapped_in,
)
from grain_rox._sources._segments import maxtext_record, segment_features


class RoxTokenSource:
    """Record ``i`` = tokens ``[i*seq_len, i*seq_len + seq_len + 1)`` as ``inputs``/``targets``.

    The tokens are the corpus's without the block padding each write ends with (where a
    manifest records it, as :class:`~grain_rox.TokenPipeline` reads them; ``padding_left_out``
    counts it).

    With an EOS id (argument, else the manifest's) records also carry ``inputs_segmentation``,
    ``inputs_position``, ``targets_segmentation`` and ``targets_position`` from the EOS tokens
    inside the window. ``inputs`` and ``targets`` are read-only views of one window (like
    :class:`~grain_rox.TokenPipeline` batches): a map that edits them copies first. Thread-safe;
    pickles without open handles; stable repr.

    Args:
        paths: The `.rox` shards: a file, glob, directory, base path, list of them, or an
            open :class:`~grain_rox.RoxCorpus`.
        seq_len: Tokens per record in ``inputs`` (and in ``targets``); a window reads
            ``seq_len + 1`` tokens, and consecutive records overlap by one.
        eos_id: The EOS token that ends a document, for the segment features (default: the
            manifest's; None in both: no features).
        dtype: The dtype of ``inputs`` and ``targets`` (default ``int32``).

    >>> import tempfile, os, numpy as np, grain
    >>> from grain_rox import write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "w.rox")
    >>> _ = write_rox([np.arange(1, 10, dtype=np.uint16)], path, block_size=20, separator=0)
    >>> source = RoxTokenSource(path, seq_len=4)
    >>> len(source), source[1]["inputs"].tolist(), source[1]["targets"].tolist()
    (2, [5, 6, 7, 8], [6, 7, 8, 9])
    >>> source[1]["inputs_segmentation"].tolist(), source[1]["inputs"].flags.writeable
    ([1, 1, 1, 1], False)
    >>> ds = grain.MapDataset.source(source).batch(2)
    >>> ds[0]["inputs"].shape
    (2, 4)
    """

    def __init__(
        self,
        paths: PathSpec | RoxCorpus,
        *,
        seq_len: int,
        eos_id: int | None = None,
        dtype: Any = np.int32,
    ) -> None:
        make_grain_workers_usable()  # a user's own mp_prefetch/DataLoader workers start
        seq_len = int_arg(seq_len, "seq_len", where="RoxTokenSource")
        if eos_id is not None:
            eos_id = int_arg(eos_id, "eos_id", where="RoxTokenSource", minimum=0)
        self.corpus = open_unchanged(paths)
        self.seq_len = seq_len
        disagreement = None if eos_id is not None else self.corpus.eos_disagreement()
        if disagreement is not None:  # else the segment features would vanish without a word
            raise ValueError(
                f"RoxTokenSource: {self.corpus.paths[0]}: {disagreement}; the segment features "
                "need one EOS id: pass eos_id= if every set ends its documents with it, or "
                "read each set with a source of its own"
            )
        self.eos_id = eos_id if eos_id is not None else self.corpus.eos_id
        self.dtype = np.dtype(dtype)
        stored = {self.corpus.paths[0]: self.corpus.dtype}
        check_output_dtype(self.dtype, stored, [self.eos_id], where="RoxTokenSource")
        self._may_wrap = may_wrap(self.dtype, self.corpus.dtype)  # uint32 as int32: checked
        # the served stream: each write's block padding left out (as TokenPipeline does)
        spans = served_spans(self.corpus)
        lengths = [span.stop - span.start for span in spans]
        self._stream_starts = np.cumsum([0, *lengths]).tolist()
        self._corpus_starts = [span.start for span in spans]
        total = self._stream_starts[-1]
        self.padding_left_out = self.corpus.num_tokens - total
        self._len = max(0, (total - 1) // self.seq_len)

    @property
    def paths(self) -> tuple[str, ...]:
        return self.corpus.paths

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        # a Grain DataLoader compares reprs on restore: the padding left out changes what
        # record i holds, so it is named (and data without padding keeps its old repr)
        left_out = f", padding_left_out={self.padding_left_out}" if self.padding_left_out else ""
        return (
            f"RoxTokenSource(data={self.corpus.fingerprint}, seq_len={self.seq_len}, "
            f"eos_id={self.eos_id}, dtype={self.dtype.name}{left_out})"
        )

    def _tokens(self, a: int, b: int) -> np.ndarray:
        """Tokens ``[a, b)`` of the served stream (across the padding left out)."""
        if self.padding_left_out == 0:
            return self.corpus.tokens(a, b)
        starts = self._stream_starts
        i = bisect.bisect_right(starts, a) - 1
        parts = []
        while a < b:
            take = min(b, starts[i + 1])
            at = self._corpus_starts[i] - starts[i]
            parts.append(self.corpus.tokens(at + a, at + take))
            a, i = take, i + 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        start = record_index(index, self._len, "window") * self.seq_len
        window = self._tokens(start, start + self.seq_len + 1).astype(self.dtype)
        if self._may_wrap:
            refuse_wrapped_in(self.corpus, window, self.dtype, where="RoxTokenSource")
        window.flags.writeable = False  # inputs and targets share it: read-only, like batches
        features: dict[str, np.ndarray] = {}
        if self.eos_id is not None:
            features = segment_features(window[None, :], int(self.eos_id), None)
        return maxtext_record(window, {k: v[0] for k, v in features.items()})

    def _getitems(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        return [self[i] for i in indices]

    __getitems__ = _getitems

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """Records ``indices`` stacked per feature: what :func:`~grain_rox.shuffled_batches`
        reads (and a device-resident iterator places).

        >>> import tempfile, os
        >>> from grain_rox import write_rox
        >>> path = os.path.join(tempfile.mkdtemp(), "g.rox")
        >>> _ = write_rox([np.arange(1, 10, dtype=np.uint16)], path, block_size=20)
        >>> RoxTokenSource(path, seq_len=4).get_batch([1, 0])["inputs"].tolist()
        [[5, 6, 7, 8], [1, 2, 3, 4]]
        """
        records = self._getitems(record_indices(indices, self._len, "window").tolist())
        if not records:
            raise ValueError("get_batch needs at least one index")
        return {k: np.stack([r[k] for r in records]) for k in records[0]}


class RoxBlockSource:
    """Record ``i`` = block ``i`` (roxxel's record) as a numpy array of the shard dtype.

    Blocks are served as stored, padding included. Thread-safe; pickles without open
    handles; stable repr.

    Args:
        paths: The `.rox` shards: a file, glob, directory, base path, list of them, or an
            open :class:`~grain_rox.RoxCorpus`.

    >>> import tempfile, os
    >>> from grain_rox import write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "b.rox")
    >>> _ = write_rox(["abcdef"], path, block_size=4)
    >>> source = RoxBlockSource(path)
    >>> len(source), bytes(source[1])
    (2, b'ef\\x00\\x00')
    """

    def __init__(self, paths: PathSpec | RoxCorpus) -> None:
        make_grain_workers_usable()
        self.corpus = open_unchanged(paths)

    @property
    def paths(self) -> tuple[str, ...]:
        return self.corpus.paths

    def __len__(self) -> int:
        return len(self.corpus)

    def __repr__(self) -> str:
        return f"RoxBlockSource(data={self.corpus.fingerprint}, blocks={len(self.corpus)})"

    def __getitem__(self, index: int) -> np.ndarray:
        return np.array(self.corpus[record_index(index, len(self.corpus), "block")])

    def _getitems(self, indices: Sequence[int]) -> list[np.ndarray]:
        return [self[i] for i in indices]

    __getitems__ = _getitems
