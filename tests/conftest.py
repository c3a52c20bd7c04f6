"""Test environment: 8 fake CPU devices for JAX, HuggingFace strictly offline."""

from __future__ import annotations

import os
import tempfile

# Before anything imports JAX or datasets.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="grain_rox_hf_home_"))
# Hashes of copied shards are remembered per host (grain_rox._format._hash_cache): keep the tests' own.
os.environ.setdefault("GRAIN_ROX_CACHE_DIR", tempfile.mkdtemp(prefix="grain_rox_cache_"))
