"""What ``grain-rox inspect`` reports about a shard set: its facts, with the block padding
told apart from the documents' tokens."""

from __future__ import annotations

import os
from typing import Any

from grain_rox._format._manifest import load_manifest, manifest_path_for
from grain_rox._format._rox_corpus import ShardInfo, open_rox


def _padding_of(shard: ShardInfo) -> int | None:
    """The padding tokens (after the last document, filling the last block) that the manifest
    records for ``shard``, or None when no manifest record matches the shard."""
    manifest = load_manifest(manifest_path_for(shard.path))
    name = os.path.basename(shard.path)
    while manifest is not None:  # the settled set, then a write still publishing (pending)
        record = manifest.shards.get(name)
        if record is not None and (record.file_size, record.num_blocks, record.sha256) == (
            shard.file_size,
            shard.num_blocks,
            shard.sha256,
        ):
            return record.num_padding_tokens
        manifest = manifest.pending
    return None


def describe(paths: Any) -> dict[str, Any]:
    """Return what ``grain-rox inspect --json`` prints for ``paths``.

    ``tokens`` counts every token in the shards' raw regions, the block padding included (as
    :attr:`grain_rox.RoxCorpus.num_tokens` does); ``padding_tokens`` is that padding, from the
    manifests (None when a shard has none), and ``document_tokens`` the rest.
    """
    with open_rox(paths) as corpus:
        paddings = [_padding_of(s) for s in corpus.shards]
        padding = None if None in paddings else sum(p or 0 for p in paddings)
        return {
            "shards": len(corpus.paths),
            "dtype": str(corpus.dtype),
            "block_size": corpus.block_size,
            "blocks": len(corpus),
            "tokens": corpus.num_tokens,
            "padding_tokens": padding,
            "document_tokens": None if padding is None else corpus.num_tokens - padding,
            "documents": corpus.num_documents,
            "eos_id": corpus.eos_id,
            "pad_id": corpus.pad_id,
            "tokenizer": corpus.tokenizer,
            "uniform_blocks": corpus.uniform_blocks,
            "manifests": list(corpus.manifest_paths),
            "fingerprint": corpus.fingerprint,
            "leftover_temporaries": list(corpus.leftover_temps),
            "files": [
                {
                    "path": s.path,
                    "bytes": s.file_size,
                    "blocks": s.num_blocks,
                    "tokens": s.num_tokens,
                    "padding_tokens": pad,
                    "block_size": s.block_size,
                    "documents": s.num_documents,
                    "sha256": s.sha256,
                }
                for s, pad in zip(corpus.shards, paddings, strict=True)
            ],
        }
