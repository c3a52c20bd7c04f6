"""Test environment: 8 fake CPU devices for JAX, HuggingFace strictly offline; shared corpora."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import pytest

# Before anything imports JAX or datasets.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="grain_rox_hf_home_"))
# Hashes of copied shards are remembered per host (grain_rox._format._hash_cache): keep the tests' own.
os.environ.setdefault("GRAIN_ROX_CACHE_DIR", tempfile.mkdtemp(prefix="grain_rox_cache_"))
# Before anything imports gcsfs: its bucket-type probe over gRPC waits ~60 s against the local
# GCS emulator (tests/object_servers.py); this selects its plain JSON-API filesystem.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

# The GCS and S3 servers (started only by the tests that ask for them).
from object_servers import gcs_bucket, gcs_server, s3_bucket, s3_server  # noqa: F401


@pytest.fixture(scope="session")
def make_rox(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    """``make_rox(name, docs, **write_kwargs)``: ``write_rox(docs, path, **write_kwargs)`` to
    ``<a new temporary directory>/<name>.rox``; returns that path (a new directory per call,
    so names never collide). Random documents: ``_corpora.random_documents``."""
    from grain_rox import write_rox

    def make(name: str, docs: Any, **write_kwargs: Any) -> str:
        path = str(tmp_path_factory.mktemp(name) / f"{name}.rox")
        write_rox(docs, path, **write_kwargs)
        return path

    return make
