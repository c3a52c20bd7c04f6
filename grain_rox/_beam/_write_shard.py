"""One shard of a Beam conversion, written by a worker under a hidden temporary name.

The pieces of the documents that fall into the shard arrive in any order; sorted by their
start they must tile the shard exactly (a gap or an overlap is an error naming the shard,
never a silent hole). The shard is written with the local writer's own
:class:`~grain_rox._text._shard_files.ShardFile` (blocks, arithmetic index, footer, sha256,
fsync) under a fresh temporary name per attempt, so a retried bundle never meets the file of
the attempt before it; the last shard's final block is padded as ``write_rox`` pads it.

>>> import os, tempfile
>>> import numpy as np
>>> from grain_rox._beam._commit import conversion_layout
>>> plan = ShardPlan.from_parts([(0, 3, 1)], tokens_per_block=4, blocks_per_shard=None)
>>> layout = conversion_layout("bytes", block_size=8)
>>> tokens = np.array([104, 105, 256], layout.dtype).tobytes()
>>> shard = write_shard(os.path.join(tempfile.mkdtemp(), "t.rox"), None, 0,
...                     [(2, tokens[4:], 0), (0, tokens[:4], 1)], plan, layout)
>>> shard.num_blocks, shard.file_size, shard.num_documents, os.path.exists(shard.final_path)
(1, 48, 1, False)
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np

from grain_rox._beam._commit import WrittenShard, final_path
from grain_rox._beam._plan import ShardPlan
from grain_rox._format._rox_format import RoxFormatError
from grain_rox._text._item_encoding import TokenLayout
from grain_rox._text._shard_files import ShardFile


def _joined(
    path: str, shard: int, pieces: Iterable[tuple[int, bytes, int]], length: int, itemsize: int
) -> tuple[bytes, int]:
    """The shard's tokens (bytes) from its pieces, and the documents that start in it."""
    ordered = sorted(pieces, key=lambda p: p[0])
    at = documents = 0
    for start, data, docs in ordered:
        if start != at:
            what = "a gap" if start > at else "an overlap"
            raise RoxFormatError(
                path,
                f"shard {shard} has {what} at token {min(at, start)}: its pieces do not tile it "
                "(two documents with one key, or the inputs changed during the run)",
                "run the conversion again; nothing was published",
            )
        at += len(data) // itemsize
        documents += docs
    if at != length:
        raise RoxFormatError(
            path,
            f"shard {shard} holds {at} tokens but the plan gives it {length}: its pieces do not "
            "tile it (the inputs changed during the run)",
            "run the conversion again; nothing was published",
        )
    return b"".join(data for _, data, _ in ordered), documents


def write_shard(
    path: str,
    max_shard_bytes: int | None,
    shard: int,
    pieces: Iterable[tuple[int, bytes, int]],
    plan: ShardPlan,
    layout: TokenLayout,
) -> WrittenShard:
    """Write shard ``shard`` of the set at ``path`` from ``(start token, bytes, documents
    starting here)`` pieces; return what was written (the file keeps its temporary name)."""
    dtype = layout.dtype
    target = final_path(path, max_shard_bytes, shard)
    data, documents = _joined(target, shard, pieces, plan.shard_length(shard), dtype.itemsize)
    tokens = np.frombuffer(data, dtype)
    if shard == plan.num_shards - 1 and plan.num_padding_tokens:
        padding = np.full(plan.num_padding_tokens, layout.pad, dtype=dtype)
        tokens = np.concatenate([tokens, padding])
    f = ShardFile(target, dtype)
    try:
        f.write_blocks(tokens, layout.block_size)
        size, raw, digest = f.finish()
        mtime = os.stat(f.tmp_path).st_mtime_ns
    except BaseException:
        f.discard()
        raise
    return WrittenShard(
        shard, target, f.tmp_path, f.num_blocks, size, raw, digest, mtime, documents
    )
