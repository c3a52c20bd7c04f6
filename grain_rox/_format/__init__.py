"""ROXXEL02 bytes, no Grain and no JAX: layout, index, corpus, manifest, shard sets, verify, atomic files, paths."""
