"""``grain-rox inspect --plot hist.png``: a histogram of the documents' lengths, in tokens.

A document is the tokens before each EOS, found with one vectorised scan per chunk of each
shard (as :class:`~grain_rox.RoxDocumentSource` finds them), the EOS itself not counted. Runs
of EOS are no documents; the padding of each write's last block is left out where the
manifest records it (a document that begins with the pad id keeps it); tokens after the last
EOS are a document only where a manifest says the data ends there.
The x axis is logarithmic when the longest document is over 100 times the shortest.
"""

from __future__ import annotations

import numpy as np

from grain_rox._format._documents import split_documents, token_offsets
from grain_rox._format._rox_corpus import RoxCorpus
from grain_rox._format._served import served_spans

_LOG_RANGE = 100  # max / min above which the x axis is logarithmic


def document_lengths(corpus: RoxCorpus, eos_id: int) -> np.ndarray:
    """The tokens of each document of ``corpus`` (EOS not counted), in corpus order, found in
    the stretches its manifests say are data (the padding of each write left out, as
    :class:`~grain_rox.RoxDocumentSource` reads them).

    >>> import tempfile, os
    >>> from grain_rox import open_rox, write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "d.rox")
    >>> _ = write_rox(["abc", "", "hello"], path, tokenizer="bytes", block_size=32)
    >>> document_lengths(open_rox(path), eos_id=256).tolist()  # "" and the padding: no documents
    [3, 5]
    """
    found = split_documents(served_spans(corpus), token_offsets(corpus, eos_id))
    lengths = found.stops - found.starts - found.ended  # the EOS not counted
    return lengths[lengths > 0]


def _median(lengths: np.ndarray) -> str:
    median = float(np.median(lengths))
    return f"{median:,.0f}" if median.is_integer() else f"{median:,.1f}"


def length_summary(lengths: np.ndarray) -> str:
    """The numbers a plot of ``lengths`` shows, in words.

    >>> length_summary(np.array([3, 5, 10, 1000]))
    '4 documents, tokens per document (EOS not counted): min 3, median 7.5, max 1,000'
    """
    mid = _median(lengths)
    n = lengths.size
    return (
        f"{n:,} document{'' if n == 1 else 's'}, tokens per document (EOS not counted): "
        f"min {int(lengths.min()):,}, median {mid}, max {int(lengths.max()):,}"
    )


def plot_lengths(lengths: np.ndarray, path: str, title: str) -> bool:
    """Draw the histogram of ``lengths`` into ``path`` (its suffix picks the format: .png,
    .svg, .pdf); returns whether the x axis is logarithmic. Needs matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(
            "drawing the histogram (--plot) needs matplotlib: pip install matplotlib"
        ) from None
    if lengths.size == 0:
        raise ValueError(f"{title} holds no documents (no tokens before an EOS) to plot")
    lo, hi = int(lengths.min()), int(lengths.max())
    log = hi > _LOG_RANGE * lo
    bins = (
        np.geomspace(lo, hi + 1, 61) if log else np.linspace(lo, hi + 1, min(60, hi - lo + 1) + 1)
    )
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    ax.hist(lengths, bins=bins.tolist(), color="#3b6ea8")
    if log:
        ax.set_xscale("log")
    ax.set_xlabel("tokens per document (EOS not counted)" + (", log scale" if log else ""))
    ax.set_ylabel("documents")
    ax.set_title(f"{title}: {length_summary(lengths).split(', tokens')[0]}")
    median = float(np.median(lengths))
    ax.axvline(median, color="#c0392b", linestyle="--", label=f"median {_median(lengths)}")
    ax.legend()
    fig.savefig(path, dpi=100)
    return log
