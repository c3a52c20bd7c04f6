"""What ``grain-rox inspect`` reports about a shard set: its facts, with the block padding
told apart from the documents' tokens."""

from __future__ import annotations

from typing import Any

from grain_rox._format._rox_corpus import open_rox


def describe(paths: Any) -> dict[str, Any]:
    """Return what ``grain-rox inspect --json`` prints for ``paths``.

    ``tokens`` counts every token in the shards' raw regions, the block padding included (as
    :attr:`grain_rox.RoxCorpus.num_tokens` does); ``padding_tokens`` is that padding, from the
    manifests (None when a shard has none), and ``document_tokens`` the rest.
    """
    with open_rox(paths) as corpus:
        paddings = [s.num_padding_tokens for s in corpus.shards]  # the manifests' records
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
            # each set's own (eos_id and tokenizer above are None where the sets disagree)
            "sets": [
                {"set": what, "tokenizer": tok, "eos_id": eos}
                for what, tok, eos in corpus.set_facts()
            ],
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
