"""The manifest one write publishes: an append's settings checked against the set's, and the
new set's record (its kept shards plus this write's, with their checksums and counts)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from grain_rox._format._manifest import Manifest, ShardRecord, new_write_id, pad_run
from grain_rox._format._rox_corpus import tokenizer_words
from grain_rox._format._rox_format import read_header
from grain_rox._format._shard_set import shard_number
from grain_rox._text._item_encoding import TokenLayout
from grain_rox._text._shard_files import FinishedShard, ShardFile


def _pad_run(tail: bytes, layout: TokenLayout, most: int) -> int:
    """Pad ids at the end of ``tail`` (an old shard's last raw bytes), at most ``most``."""
    tokens = np.frombuffer(tail[len(tail) % layout.dtype.itemsize :], dtype=layout.dtype)
    return pad_run(tokens[max(0, tokens.size - most) :], layout.pad)


def _same_token(a: Any, b: Any, dtype: np.dtype) -> bool:
    """Whether two token ids (or None) are stored as the same ``dtype`` token: a float pad
    given as ``0.1`` and as ``np.float16(0.1)`` is one token, and NaN is itself.

    >>> f16 = np.dtype(np.float16)
    >>> _same_token(0.1, float(np.float16(0.1)), f16), _same_token(float("nan"), float("nan"), f16)
    (True, True)
    >>> _same_token(5, 9, np.dtype(np.uint16)), _same_token(None, 0, np.dtype(np.uint16))
    (False, False)
    """
    if a is None or b is None:
        return a is b
    try:
        return bool(np.asarray(a, dtype).tobytes() == np.asarray(b, dtype).tobytes())
    except (OverflowError, ValueError):  # one does not fit: not the same token
        return False


def check_append_compatible(old: Manifest, mpath: str, layout: TokenLayout) -> None:
    """Refuse to add tokens laid out unlike the set ``old`` describes (dtype, EOS, pad id,
    tokenizer)."""
    dtype, sep, tok = layout.dtype, layout.separator, layout.tokenizer
    problems = []
    if old.dtype != str(dtype):
        problems.append(f"dtype {old.dtype} != {dtype}")
    if not _same_token(old.eos_id, sep, dtype):
        problems.append(f"eos/separator {old.eos_id} != {sep}")
    new_tok = tok.identity() if tok is not None else None
    same_tokenizer = old.tokenizer == new_tok
    # the set's padding is found by its one pad id: other padding would be read as text
    if old.pad_id is not None and not _same_token(old.pad_id, layout.pad, dtype):
        fix = f" (pass pad_id={old.pad_id})" if same_tokenizer else ""  # (else: its tokenizer's)
        problems.append(f"pad_id {old.pad_id} != {layout.pad}{fix}")
    if not same_tokenizer:
        was, now = tokenizer_words(old.tokenizer), tokenizer_words(new_tok)
        if was == now:  # the same name and checksum: the fields that differ
            a, b = old.tokenizer or {}, new_tok or {}
            keys = sorted(k for k in {*a, *b} if a.get(k) != b.get(k))
            was += f" ({', '.join(f'{k} {a.get(k)!r}' for k in keys)})"
            now += f" ({', '.join(f'{k} {b.get(k)!r}' for k in keys)})"
        problems.append(f"{was} != {now}")
    if problems:
        raise ValueError(
            f"cannot append to the shard set described by {mpath}: "
            + "; ".join(problems)
            + ". Write to a new path (and mix the two sets) or use the same settings"
        )


def check_block_size(
    folder: str,
    disk: Iterable[str],
    block_size: int,
    *,
    first: str | None = None,
    replaced: str | None = None,
) -> None:
    """Refuse to add blocks of ``block_size`` bytes to the set whose shards ``disk`` names in
    ``folder`` (``first``: the file an append copies; ``replaced``: the one a member write
    replaces) where its blocks are another size: roxxel reads every block of a set as its
    first block's size, so a mix was read short by roxxel (43,008 of 67,584 tokens) while
    grain_rox read it whole."""
    candidates = [first] if first else []
    candidates += [os.path.join(folder, n) for n in sorted(disk) if n != replaced]
    have, size = None, 0
    for have in candidates:  # the first shard with blocks: its first block's size
        size = read_header(have).first_block_bytes
        if size:
            break
    if size and size != block_size:
        raise ValueError(
            f"cannot write block_size={block_size} into the set of {have}, whose blocks are "
            f"{size} bytes: roxxel reads every block of a set as its first block's size, so a "
            f"mix is misread; pass block_size={size} (grain-rox convert --block-size {size}), "
            "or write to a new path"
        )


def build_manifest(
    previous: Manifest,
    kept: Mapping[str, ShardRecord],
    files: Sequence[ShardFile],
    finished: Sequence[FinishedShard],
    docs_per_file: Mapping[int, int],
    num_pad: int,
    layout: TokenLayout,
) -> Manifest:
    """The new set's manifest: ``kept`` shards (an append's old ones) plus this write's.

    ``docs_per_file`` counts the documents starting in each of ``files`` (by position); those
    counted past the last file started in its final padding and belong to it.
    """
    shards = dict(kept)
    itemsize = layout.dtype.itemsize
    last = len(files) - 1
    docs_in = dict(docs_per_file)
    for k in [k for k in docs_in if k > last]:  # documents starting in the final padding
        docs_in[last] = docs_in.get(last, 0) + docs_in.pop(k)
    for k, (f, shard) in enumerate(zip(files, finished, strict=True)):
        name = os.path.basename(f.final_path)
        docs: int | None = docs_in.get(k, 0)
        padding = num_pad if k == last else 0
        spans: list[list[int]] | None = None
        if f.copied_from is not None:  # a copy-on-write append: add the old file's counts
            prev = shards.get(name)
            docs = (
                None
                if prev is None or prev.num_documents is None
                else prev.num_documents + (docs or 0)
            )
            if prev is not None:  # the old file's trailing padding is now mid-stream
                spans = list(prev.padding_spans or [])
                run = _pad_run(f.copied_tail, layout, prev.trailing_padding)
                spans += [[prev.num_tokens - run, run]] if run else []
                # the padding that can be located: a manifest from before spans were recorded
                # may have summed earlier appends' padding, whose places are unknown (read as
                # written, as before)
                padding += sum(n for _, n in spans)
                spans = spans or None
        shards[name] = ShardRecord(
            file_size=shard.file_size,
            num_blocks=f.num_blocks,
            raw_size=shard.raw_size,
            sha256=shard.sha256,
            num_tokens=shard.raw_size // itemsize,
            num_padding_tokens=padding,
            num_documents=docs,
            mtime_ns=shard.mtime_ns,
            padding_spans=spans,
        )
    shards = {n: shards[n] for n in sorted(shards, key=shard_number)}
    total_docs: int | None = None
    if all(r.num_documents is not None for r in shards.values()):
        total_docs = sum(r.num_documents or 0 for r in shards.values())
    appended = bool(kept) and previous.block_size > 0
    tok = layout.tokenizer
    return Manifest(
        dtype=str(layout.dtype),
        block_size=previous.block_size if appended else layout.block_size,
        shards=shards,
        eos_id=layout.separator,  # type: ignore[arg-type]
        pad_id=layout.pad,  # type: ignore[arg-type]
        tokenizer=tok.identity() if tok is not None else None,
        num_documents=total_docs,
        write_id=new_write_id(),
    )
