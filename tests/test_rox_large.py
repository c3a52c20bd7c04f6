"""A 1 TiB corpus opens in milliseconds and reads with no memory proportional to its size.

The shards are sparse files: ``truncate`` makes the raw region a hole, and only the 64-entry
index, the footer and one 8-byte marker are real bytes on disk.
"""

from __future__ import annotations

import gc
import os
import pickle
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from grain_rox import open_rox

FOOTER = struct.Struct("<qq8s8s")
SIGNATURE = b"ROXXEL02"
GIB = 1 << 30
NUM_SHARDS = 16
SHARD_RAW_BYTES = 64 * GIB
BLOCK_BYTES = GIB  # 64 blocks per shard: a 512-byte index
DTYPE = np.dtype("uint16")
TOKENS_PER_SHARD = SHARD_RAW_BYTES // DTYPE.itemsize
TOTAL_TOKENS = NUM_SHARDS * TOKENS_PER_SHARD
# A non-zero marker, so the test can tell a real read from "everything is zeros".
MARKER_SHARD = 14
MARKER_TOKEN_IN_SHARD = 37 * BLOCK_BYTES // 2 + 12_345
MARKER = np.array([7, 0, 65535, 4242], dtype=DTYPE)


def write_sparse_shard(path: Path, marker: bool = False) -> None:
    """A 64 GiB-raw uint16 shard of 1 GiB blocks whose raw region is a hole."""
    num_blocks = SHARD_RAW_BYTES // BLOCK_BYTES
    ends = np.arange(1, num_blocks + 1, dtype="<i8") * BLOCK_BYTES
    footer = FOOTER.pack(
        num_blocks, SHARD_RAW_BYTES, DTYPE.name.encode().ljust(8, b"\0"), SIGNATURE
    )
    with open(path, "wb") as f:
        f.truncate(SHARD_RAW_BYTES)
        f.seek(SHARD_RAW_BYTES)
        f.write(ends.tobytes() + footer)
        if marker:
            f.seek(MARKER_TOKEN_IN_SHARD * DTYPE.itemsize)
            f.write(MARKER.tobytes())


def rss_anon_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    pytest.skip("/proc/self/status has no RssAnon line")


@pytest.fixture(scope="module")
def terabyte_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("terabyte")
    probe = directory / "probe.bin"
    with open(probe, "wb") as f:
        f.truncate(GIB)
    sparse = os.stat(probe).st_blocks * 512 < GIB // 2
    probe.unlink()
    if not sparse:
        pytest.skip(f"the filesystem under {directory} does not support sparse files")
    for s in range(NUM_SHARDS):
        write_sparse_shard(directory / f"big_{s:04d}.rox", marker=s == MARKER_SHARD)
    yield directory
    for path in directory.glob("*.rox"):
        path.unlink()


def test_terabyte_corpus_opens_fast_with_bounded_memory(terabyte_dir):
    paths = sorted(terabyte_dir.glob("*.rox"))
    assert len(paths) == NUM_SHARDS
    on_disk = sum(os.stat(p).st_blocks * 512 for p in paths)
    assert on_disk < 16 << 20  # still sparse: only index, footers and the marker are allocated

    gc.collect()
    rss_before = rss_anon_kib()
    t0 = time.perf_counter()
    corpus = open_rox(str(terabyte_dir))
    open_seconds = time.perf_counter() - t0
    assert open_seconds < 0.5

    assert corpus.num_tokens == TOTAL_TOKENS
    assert corpus.num_tokens * DTYPE.itemsize >= 1 << 40
    assert len(corpus) == NUM_SHARDS * 64
    assert corpus.block_size == BLOCK_BYTES
    assert corpus.dtype == DTYPE
    assert corpus.paths == tuple(str(p) for p in paths)

    far = 900 * GIB // DTYPE.itemsize
    window = corpus.tokens(far, far + 1024)
    assert window.dtype == DTYPE
    assert np.array_equal(window, np.zeros(1024, DTYPE))

    boundary = 9 * TOKENS_PER_SHARD  # a read across shards 8 and 9 is a 1024-token copy
    assert np.array_equal(corpus.tokens(boundary - 512, boundary + 512), np.zeros(1024, DTYPE))

    marker_at = MARKER_SHARD * TOKENS_PER_SHARD + MARKER_TOKEN_IN_SHARD
    assert corpus.tokens(marker_at - 1, marker_at + 5).tolist() == [0, *MARKER.tolist(), 0]
    block = corpus[MARKER_SHARD * 64 + 37]  # a 1 GiB block, as a zero-copy view
    assert block.shape == (BLOCK_BYTES // DTYPE.itemsize,)
    assert block[12_345 : 12_345 + 4].tolist() == MARKER.tolist()
    assert corpus[-1][-3:].tolist() == [0, 0, 0]

    rss_growth_kib = rss_anon_kib() - rss_before
    assert rss_growth_kib < 50 * 1024

    pickled = pickle.dumps(corpus)
    assert len(pickled) < 10_000
    copy = pickle.loads(pickled)
    assert repr(copy) == repr(corpus)
    assert copy.tokens(marker_at, marker_at + 4).tolist() == MARKER.tolist()
    del window, block
    copy.close()
    corpus.close()


def test_a_pipeline_over_the_terabyte_corpus_serves_batches_with_bounded_memory(terabyte_dir):
    """Zero-RAM past the open: a TokenPipeline over 1 TiB (its plan, fingerprint and order)
    is built and serves batches anywhere in its first epoch, and at step 10**9, without host
    memory growing with the corpus: under 64 MiB of anonymous RSS over the whole of it."""
    from grain_rox import TokenPipeline

    gc.collect()
    rss_before = rss_anon_kib()
    t0 = time.perf_counter()
    pipe = TokenPipeline(str(terabyte_dir), seq_len=1024, global_batch_size=8, seed=0)
    ds = pipe.map_dataset()
    first = ds[0]
    built_seconds = time.perf_counter() - t0
    assert first["inputs"].shape == (8, 1024)
    for k in (1, 12_345, 10**7, 10**9):
        batch = ds[k]
        assert batch["inputs"].shape == (8, 1024)
    rss_growth_kib = rss_anon_kib() - rss_before
    assert rss_growth_kib < 64 * 1024, f"anonymous RSS grew {rss_growth_kib} KiB"
    assert built_seconds < 30, f"{built_seconds:.1f} s to build the pipeline and read a batch"
