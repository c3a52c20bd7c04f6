"""The global order: coverage, host-count independence, O(1) resume, unrelated rows, Grain."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from grain_rox import Phase, TokenPipeline
from grain_rox._order._lanes import LaneOrder, Run
from grain_rox._order._permutation import FeistelPermutation, derive_key
from grain_rox._sources._segments import MAXTEXT_FEATURES


@pytest.fixture(scope="module")
def positional(make_rox):
    """A corpus whose token values are their stream positions (uint32, no separator)."""
    tokens = np.arange(200_000, dtype=np.uint32)
    return make_rox("pos", [tokens], block_size=4000, manifest=False)


def owned_tokens(batch: dict[str, np.ndarray]) -> np.ndarray:
    return batch["inputs"].reshape(-1)


def test_feistel_is_a_permutation_for_many_sizes_and_keys():
    for n in [1, 2, 3, 7, 64, 65, 1000, 4099]:
        for key in range(3):
            p = FeistelPermutation(n, derive_key(key, n))
            out = p(np.arange(n))
            assert np.array_equal(np.sort(out), np.arange(n))
            assert np.array_equal(p.inverse(out), np.arange(n))
    big = FeistelPermutation(10**15, 7)
    x = np.array([0, 1, 10**15 - 1])
    assert np.array_equal(big.inverse(big(x)), x)


def _feistel_by_definition(n: int, key: int, i: int) -> int:
    """The permutation as its doc defines it, in Python ints: 4 Feistel rounds on Z_a x Z_b
    (a = isqrt(n - 1) + 1, b = ceil(n / a)), each adding a keyed 64-bit mix modulo a or b,
    cycle-walking until the image falls below n."""
    mask = (1 << 64) - 1
    a = max(2, math.isqrt(n - 1) + 1)
    b = max(2, -(-n // a))
    keys = [derive_key(key, r) for r in range(4)]

    def mix(x: int, k: int) -> int:
        z = ((x ^ k) * 0xBF58476D1CE4E5B9) & mask
        z ^= z >> 29
        z = (z * 0x94D049BB133111EB) & mask
        return z ^ (z >> 32)

    x = i
    while True:
        u, v = divmod(x, b)
        for r, k in enumerate(keys):
            if r % 2 == 0:
                u = (u + mix(v, k) % a) % a
            else:
                v = (v + mix(u, k) % b) % b
        x = u * b + v
        if x < n:
            return x


def test_feistel_is_the_network_its_doc_defines():
    """Every order (windows in a block, chunks in an epoch, lanes) is this arithmetic: a
    checkpoint resumes onto it, so no rewrite may change one image."""
    rng = np.random.default_rng(0)
    for n in [1, 2, 3, 5, 1000, 4099, 262_143, 10**9 + 7, 2**61 - 1]:
        key = derive_key(int(rng.integers(0, 2**63)), n)
        p = FeistelPermutation(n, key)
        x = np.unique(np.concatenate([np.arange(min(n, 64)), rng.integers(0, n, 300)]))
        want = [_feistel_by_definition(n, key, int(i)) for i in x]
        assert p(x).tolist() == want, n
        assert p.inverse(np.asarray(want)).tolist() == x.tolist(), n
        assert p(x.reshape(1, -1)).tolist() == [want], n  # any shape
        image = p(int(x[-1]))  # one index: a scalar
        assert isinstance(image, np.int64) and image == want[-1], n


def test_every_window_served_exactly_once_per_epoch(positional):
    pipe = TokenPipeline(
        positional,
        seq_len=32,
        global_batch_size=8,
        seed=3,
        num_epochs=2,
        chunk_tokens=1000,
        lanes=16,
        order="lanes",
    )
    ds = pipe.map_dataset()
    n = pipe.num_batches
    per_epoch = n // 2
    epoch0 = np.concatenate([owned_tokens(ds[k]) for k in range(per_epoch)])
    epoch1 = np.concatenate([owned_tokens(ds[k]) for k in range(per_epoch, n)])
    for tokens in (epoch0, epoch1):
        assert np.unique(tokens).size == tokens.size  # nothing twice within an epoch
    # Each of the 16 lanes (12,500 tokens) serves floor(12499 / 32) = 390 windows.
    assert epoch0.size == 16 * 390 * 32 == per_epoch * 8 * 32
    # The two epochs use different permutations but cover the same amount.
    assert not np.array_equal(epoch0[:256], epoch1[:256])
    # Targets are inputs shifted by one inside every window (positional data: +1).
    batch = ds[5]
    joins = np.diff(batch["inputs"], axis=1) != 1
    assert np.array_equal(
        batch["targets"][~np.c_[joins, np.zeros(8, bool)]],
        batch["inputs"][~np.c_[joins, np.zeros(8, bool)]] + 1,
    )


def test_batches_do_not_depend_on_how_rows_are_split(positional):
    pipe = TokenPipeline(positional, seq_len=16, global_batch_size=12, seed=9)
    whole = pipe.batch_source()
    halves = [pipe.batch_source(rows=(0, 6)), pipe.batch_source(rows=(6, 12))]
    quarters = [pipe.batch_source(rows=(3 * i, 3 * i + 3)) for i in range(4)]
    for k in [0, 1, 57, 10**6]:
        expected = whole[k]["inputs"]
        assert np.array_equal(np.concatenate([h[k]["inputs"] for h in halves]), expected)
        assert np.array_equal(np.concatenate([q[k]["inputs"] for q in quarters]), expected)


def test_resume_at_any_step_is_o1_and_exact(positional):
    pipe = TokenPipeline(positional, seq_len=16, global_batch_size=8, seed=1)
    ds = pipe.map_dataset()
    for k in [0, 7, 1000]:
        assert np.array_equal(pipe.map_dataset(first_step=k)[0]["inputs"], ds[k]["inputs"])
    timings = {}
    for k in (10, 10**9):
        src = pipe.batch_source(first_step=k)
        start = time.perf_counter()
        src[0]
        timings[k] = time.perf_counter() - start
    assert timings[10**9] < 0.2  # generous: this is an O(1) check, not a benchmark
    assert np.array_equal(pipe.batch_source(first_step=10**9)[0]["inputs"], ds[10**9]["inputs"])


def test_rows_of_a_batch_come_from_unrelated_places(positional):
    pipe = TokenPipeline(
        positional,
        seq_len=32,
        global_batch_size=8,
        seed=5,
        chunk_tokens=1000,
        lanes=64,
        order="lanes",
    )
    ds = pipe.map_dataset()
    closest = np.inf
    for k in range(0, 2000, 7):
        starts = np.sort(ds[k]["inputs"][:, 0].astype(np.int64))
        closest = min(closest, np.diff(starts).min())
    # Rows of one batch come from different lanes (3,125 tokens apart in the epoch stream) and
    # chunks are shuffled, so no two rows are ever within one window of each other.
    assert closest > 32


def test_data_loader_with_and_without_workers_matches_map_dataset(positional):
    pipe = TokenPipeline(positional, seq_len=16, global_batch_size=4, seed=2, num_epochs=1)
    expected = [pipe.map_dataset()[k]["inputs"] for k in range(6)]
    loader = pipe.data_loader(worker_count=0)
    got = [b["inputs"] for _, b in zip(range(6), loader, strict=False)]
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    it = iter(pipe.iter_dataset())
    assert np.array_equal(next(it)["inputs"], expected[0])


def test_data_loader_checkpoint_restores_in_place(positional):
    pipe = TokenPipeline(positional, seq_len=16, global_batch_size=4, seed=2)
    it = iter(pipe.data_loader())
    for _ in range(3):
        next(it)
    state = it.get_state()
    expected = [next(it)["inputs"] for _ in range(3)]
    again = iter(pipe.data_loader())
    again.set_state(state)
    assert all(np.array_equal(next(again)["inputs"], e) for e in expected)


def test_a_lanes_data_loader_state_is_refused_under_another_max_seq_len(positional):
    """The lanes order keeps max_seq_len of room at each lane's end, so another one moves the
    epochs' ends; its DataLoader repr left it out, and a state restored onto other batches."""

    def lanes(max_seq_len):
        return TokenPipeline(positional, seq_len=16, global_batch_size=4, seed=2, lanes=8,
                             order="lanes", max_seq_len=max_seq_len)  # fmt: skip

    it = iter(lanes(None).data_loader())
    next(it)
    state = it.get_state()
    with pytest.raises(
        ValueError,
        match=r"its data or config changed \(config: saved \w+ -> now \w+\)\. .*'max_seq_len': 200",
    ):
        iter(lanes(200).data_loader()).set_state(state)
    # the longest phase's own seq_len, given or not, is the same order: restored
    assert "max_seq_len" not in repr(lanes(16).batch_source())
    expected = next(it)["inputs"]
    again = iter(lanes(16).data_loader())
    again.set_state(state)
    assert np.array_equal(next(again)["inputs"], expected)


def test_segmentation_from_eos_and_chunk_joins(make_rox):
    docs = [np.full(n, 7 + i, np.uint16) for i, n in enumerate([5, 9, 3, 40, 2, 11] * 30)]
    path = make_rox("d", docs, separator=0, block_size=64)
    pipe = TokenPipeline(path, seq_len=24, global_batch_size=4, seed=0, chunk_tokens=50)
    batch = pipe.map_dataset()[3]
    assert set(batch) == set(MAXTEXT_FEATURES)
    for r in range(4):
        x, seg, pos = (
            batch["inputs"][r],
            batch["inputs_segmentation"][r],
            batch["inputs_position"][r],
        )
        assert seg[0] == 1 and pos[0] == 0
        for t in range(1, 24):
            new_segment = x[t - 1] == 0 or seg[t] != seg[t - 1]
            assert (pos[t] == 0) == new_segment
            if x[t - 1] == 0:  # after an EOS always a new segment
                assert seg[t] == seg[t - 1] + 1
    # Same-segment tokens within a document carry the same id (all docs are constant runs).
    same = batch["inputs_segmentation"][:, 1:] == batch["inputs_segmentation"][:, :-1]
    nonzero = (batch["inputs"][:, 1:] != 0) & (batch["inputs"][:, :-1] != 0)
    assert np.all(batch["inputs"][:, 1:][same & nonzero] == batch["inputs"][:, :-1][same & nonzero])


def test_lane_order_geometry_is_exact():
    order = LaneOrder([1000, 450], seed=0, chunk_tokens=100, lanes=4, runs=[Run(0, 10**12, 9)])
    assert (order.num_chunks, order.stream_tokens, order.lane_tokens) == (14, 1400, 350)
    rows = order.locate(np.arange(0, 8))
    assert rows.epoch.tolist() == [0] * 8
    assert sorted((rows.offset[:4] // 350).tolist()) == [0, 1, 2, 3]
    assert sorted(rows.offset[4:] % 350) == [9, 9, 9, 9]
    # 38 rounds per epoch: (350 - 1) // 9
    assert order.locate(np.array([38 * 4 - 1, 38 * 4])).epoch.tolist() == [0, 1]


def test_bad_configs_are_explained(positional):
    with pytest.raises(ValueError, match="seq_len=0 must be a positive int"):
        TokenPipeline(positional, seq_len=0, global_batch_size=4)
    with pytest.raises(ValueError, match="cannot hold one window of seq_len 4096"):
        TokenPipeline(positional, seq_len=4096, global_batch_size=4, lanes=64,
                      order="lanes").batch_source()  # fmt: skip
    with pytest.raises(ValueError, match="rows="):
        TokenPipeline(positional, seq_len=8, global_batch_size=4).batch_source(rows=(2, 9))
    with pytest.raises(FileNotFoundError):
        TokenPipeline("/nonexistent/*.rox", seq_len=8, global_batch_size=4).batch_source()


@pytest.mark.parametrize("layout", ["maxtext", "windows"])
def test_every_array_of_a_batch_is_read_only(make_rox, layout):
    # sources with different EOS ids take the per-source features path
    a = make_rox("ro_a", [np.arange(1, 500, dtype=np.uint16)] * 40, separator=0)
    b = make_rox("ro_b", [np.arange(1, 300, dtype=np.uint16)] * 40, separator=7)
    single = {"seq_len": 64, "global_batch_size": 8}
    mixed = {"phases": [Phase(None, 8, 64, weights={"a": 0.5, "b": 0.5})]}
    for paths, config in ((a, single), ({"a": a, "b": b}, mixed)):
        pipe = TokenPipeline(paths, seed=0, layout=layout, **config)
        batch = pipe.batch_source()[3]
        for key, array in batch.items():
            assert not array.flags.writeable, (paths, layout, key)


def two_phase_mixture(make_rox, packing: str | None) -> TokenPipeline:
    """Two sources whose batch size, seq_len and weights change at step 3."""
    rng = np.random.default_rng(3)
    sources = {}
    for name, base, lens in [("p", 1, (90, 300, 40, 500)), ("q", 2000, (70, 260, 800))]:
        docs = [rng.integers(base, base + 900, n).astype(np.uint16) for n in lens]
        sources[name] = make_rox(name, docs, separator=0, block_size=64)
    phases = [
        Phase(steps=3, batch_size=8, seq_len=16, weights={"p": 0.75, "q": 0.25}),
        Phase(steps=None, batch_size=16, seq_len=8, weights={"p": 0.25, "q": 0.75}),
    ]
    return TokenPipeline(sources, phases=phases, seed=11, packing=packing)


def assert_same_batches(got: list, reference: list, what: str, first: int = 0) -> None:
    """``got`` are ``reference[first:]``, key for key and bit for bit."""
    assert len(got) == len(reference) - first, what
    for k, batch in enumerate(got, start=first):
        assert sorted(batch) == sorted(reference[k]), f"{what}: keys of batch {k}"
        for key in reference[k]:
            assert np.array_equal(np.asarray(batch[key]), reference[k][key]), (
                f"{what}: batch {k}[{key!r}] differs from map_dataset()[{k}]"
            )


@pytest.mark.parametrize("packing", [None, "best_fit"], ids=["windows", "packed"])
def test_the_stream_does_not_depend_on_read_threads_prefetch_or_the_iterator(make_rox, packing):
    """Determinism: the global batches of a two-phase mixture (the batch size, seq_len and
    weights change at step 3) are the same through map_dataset()[k], Grain iterators with
    1, 3 or 16 read threads and small or large prefetch buffers, data_loader(), iter_dataset()
    and MultiHostDataLoadIterator with prefetch 1 or 5, and after a restore on each."""
    import grain
    import jax

    from grain_rox import MultiHostDataLoadIterator

    pipe = two_phase_mixture(make_rox, packing)
    steps = 7
    reference = [pipe.map_dataset()[k] for k in range(steps)]
    assert [b["inputs"].shape for b in reference] == [(8, 16)] * 3 + [(16, 8)] * 4

    def same(got: list, what: str, first: int = 0) -> None:
        assert_same_batches(got, reference, what, first)

    def take(it, count):
        return [next(it) for _ in range(count)]

    for threads, buffer in [(1, 1), (3, 2), (16, 50)]:
        options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=buffer)
        what = f"ReadOptions(num_threads={threads}, prefetch_buffer_size={buffer})"
        it = iter(pipe.map_dataset().to_iter_dataset(options))
        head = take(it, 2)
        state = it.get_state()
        same(head + take(it, steps - 2), what)
        again = iter(pipe.map_dataset().to_iter_dataset(options))
        again.set_state(state)
        same(take(again, steps - 2), f"{what} restored at step 2", first=2)
    same(take(iter(pipe.data_loader()), steps), "data_loader()")
    same(take(iter(pipe.iter_dataset()), steps), "iter_dataset()")
    for prefetch in (1, 5):
        with MultiHostDataLoadIterator(pipe, prefetch=prefetch) as it:
            head = take(it, 4)
            state = it.get_state()
            same(jax.device_get(head + take(it, steps - 4)), f"prefetch={prefetch}")
        with MultiHostDataLoadIterator(pipe, prefetch=prefetch) as it:
            it.set_state(state)
            same(jax.device_get(take(it, steps - 4)), f"prefetch={prefetch} restored", first=4)


@pytest.mark.slow
def test_the_stream_does_not_depend_on_the_number_of_grain_worker_processes(make_rox):
    """Determinism: 1 and 3 Grain worker processes (data_loader and iter_dataset) serve
    map_dataset()'s batches of the two-phase mixture, and a state saved with 3 restores with
    3 onto the same next batches."""
    pipe = two_phase_mixture(make_rox, None)
    steps = 7
    reference = [pipe.map_dataset()[k] for k in range(steps)]
    for workers in (1, 3):
        loader = iter(pipe.data_loader(worker_count=workers))
        got = [next(loader) for _ in range(steps)]
        assert_same_batches(got, reference, f"data_loader(worker_count={workers})")
    it = iter(pipe.iter_dataset(worker_count=3))
    head = [next(it) for _ in range(3)]
    state = it.get_state()
    assert_same_batches(head + [next(it) for _ in range(4)], reference, "iter_dataset(3)")
    again = iter(pipe.iter_dataset(worker_count=3))
    again.set_state(state)
    got = [next(again) for _ in range(4)]
    assert_same_batches(got, reference, "iter_dataset(3) restored at step 3", first=3)


def _resident_pages(path: str) -> np.ndarray:
    """Which pages of ``path`` are in the page cache (``mincore`` over a fresh map)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        pages = -(-len(m) // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        view = np.frombuffer(m, np.uint8)
        assert libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(len(m)), vec) == 0
        del view
    return np.flatnonzero(np.frombuffer(vec, np.uint8) & 1)


@pytest.mark.skipif(not hasattr(__import__("os"), "posix_fadvise"), reason="needs posix_fadvise")
def test_a_process_reads_only_the_pages_of_its_own_rows(tmp_path):
    """DESIGN's multi-host clause: each process reads only its rows. A corpus whose tokens are
    their positions + 1 is dropped from the page cache; a batch source of rows [8, 16) of 32
    reads 10 batches; then the file's pages in the cache must all hold a token one of those
    rows served (or the index and footer after the tokens), and none of the pages only the
    other rows' tokens lie in."""
    import mmap
    import os

    from grain_rox import write_rox

    path = str(tmp_path / "positions.rox")
    n = 1 << 22  # 16 MiB of uint32 tokens: 4,096 pages
    write_rox([np.arange(1, n + 1, dtype=np.uint32)], path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if _resident_pages(path).size:
        pytest.skip("this file system keeps the pages cached (e.g. tmpfs): cannot observe reads")

    def pages_of(batches: list[dict[str, np.ndarray]]) -> set[int]:
        tokens = np.concatenate([np.ravel(b[k]) for b in batches for k in ("inputs", "targets")])
        return set(((tokens.astype(np.int64) - 1) * 4 // mmap.PAGESIZE).tolist())

    pipe = TokenPipeline(path, seq_len=1024, global_batch_size=32, seed=3)
    mine = [pipe.batch_source(rows=(8, 16))[k] for k in range(10)]
    resident = set(_resident_pages(path).tolist())
    tail = set(range(n * 4 // mmap.PAGESIZE, -(-os.path.getsize(path) // mmap.PAGESIZE)))
    own = pages_of(mine)
    assert len(own) >= 80 * 1025 * 4 // mmap.PAGESIZE  # 80 windows of 1,025 tokens
    assert resident <= own | tail, sorted(resident - own - tail)[:10]
    everyone = [pipe.batch_source()[k] for k in range(10)]  # (read after the check)
    others_only = pages_of(everyone) - own
    assert len(others_only) > 2 * len(own)  # the rows of the other processes: not read
