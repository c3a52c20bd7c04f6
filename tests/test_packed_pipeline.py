"""TokenPipeline(packing=...): rows of whole documents in the global order, with its contracts.

Most corpora here hold token values that name their position (token = position + 1, EOS 0),
so a served pair (input, target) says exactly which next-token pair of the corpus it is.
"""

from __future__ import annotations

import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _corpora import random_documents

from grain_rox import MultiHostDataLoadIterator, Phase, TokenPipeline, open_rox, unpack_windows
from grain_rox._order._bin_packing import (
    min_rows,
    pack_chunk,
    pack_open,
    rows_used,
    with_rows,
)
from grain_rox._order._chunks import Run
from grain_rox._order._packed import PackedOrder

CHUNK = 1024


def positional_documents(seed: int, tokens: int, lengths: tuple[int, int]) -> list[np.ndarray]:
    """Documents whose tokens are their stream positions + 1 (each followed by EOS 0), filling
    exactly ``tokens`` tokens (a multiple of the 1024-token block: no padding)."""
    rng = np.random.default_rng(seed)
    docs, at = [], 0
    while at < tokens:
        n = min(int(rng.integers(*lengths)), tokens - at - 1)
        docs.append(np.arange(at + 1, at + n + 1, dtype=np.uint32))
        at += n + 1
    return docs


def expected_pairs(path: str, chunk: int) -> np.ndarray:
    """Input tokens of every next-token pair inside a document and inside a whole chunk."""
    from grain_rox import open_rox

    with open_rox(path) as corpus:
        tokens = np.asarray(corpus.tokens(0, corpus.num_tokens))
    usable = tokens.size // chunk * chunk
    p = np.arange(usable)
    keep = (p % chunk != chunk - 1) & (tokens[:usable] != 0)
    return np.sort(tokens[:usable][keep])


def served_pairs(batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(input, target) of every pair a batch trains on (target segmentation not 0)."""
    live = batch["targets_segmentation"] != 0
    return batch["inputs"][live], batch["targets"][live]


@pytest.fixture(scope="module")
def positional(make_rox) -> str:
    docs = positional_documents(0, 40 * CHUNK, lengths=(1, 300))
    return make_rox("positional", docs, separator=0, dtype=np.uint32)


@pytest.fixture(scope="module")
def random_corpus(make_rox) -> str:
    docs = random_documents(7, lengths=(1, 500), high=50_000, until_tokens=120_000)
    return make_rox("random", docs, separator=0)


PACKED = {"packing": "best_fit", "chunk_tokens": CHUNK, "block_tokens": 8 * CHUNK}


# ---- every pair of every document once per epoch ---------------------------------------------
@pytest.mark.parametrize("packing", ["best_fit", "first_fit"])
def test_one_epoch_serves_every_pair_of_every_document_once(positional, packing):
    pipe = TokenPipeline(
        positional, seq_len=64, global_batch_size=1, num_epochs=1, **{**PACKED, "packing": packing}
    )
    ds = pipe.map_dataset()
    inputs, targets = zip(*(served_pairs(ds[k]) for k in range(len(ds))), strict=True)
    inputs, targets = np.concatenate(inputs), np.concatenate(targets)
    assert np.array_equal(np.sort(inputs), expected_pairs(positional, CHUNK))
    assert np.array_equal(targets, np.where(targets == 0, 0, inputs + 1))  # the true next token
    order = pipe.plan.orders[0]
    assert len(ds) == order.windows_per_epoch == 40 * order.rows_per_group(64)


def test_phases_that_change_seq_len_and_batch_size_neither_replay_nor_skip(positional):
    """Across seq_len 64 -> 128 -> 24 (mid-block, mid-row), pairs come once each until the
    whole first epoch is served, and only then does any pair come again."""
    phases = [Phase(37, 4, 64), Phase(23, 2, 128), Phase(None, 3, 24)]
    pipe = TokenPipeline(positional, phases=phases, **PACKED)
    ds = pipe.map_dataset()
    want = expected_pairs(positional, CHUNK)
    seen = np.zeros(int(want.max()) + 1, dtype=np.int64)
    served, k = 0, 0
    while served < want.size:
        batch = ds[k]
        inputs, targets = served_pairs(batch)
        assert np.array_equal(targets, np.where(targets == 0, 0, inputs + 1)), k
        assert batch["inputs"].shape[1] == (64 if k < 37 else 128 if k < 60 else 24)
        np.add.at(seen, inputs, 1)
        assert seen.max() == 1, f"a pair served twice by step {k}"
        served += inputs.size
        k += 1
    assert np.array_equal(np.flatnonzero(seen), want)


def test_a_longer_seq_len_in_mid_block_warns_of_the_padding_it_serves(make_rox, caplog):
    """Rows packed at 16 read on at 128 hold one old row each, 87% padding or more, until the
    block ends (up to 128 Mi tokens by default): that was said nowhere but the docs."""
    docs = positional_documents(3, 40 * CHUNK, lengths=(1, 60))
    path = make_rox("rising", docs, separator=0, dtype=np.uint32)
    with caplog.at_level(logging.WARNING, logger="grain_rox"):
        TokenPipeline(path, phases=[Phase(3, 8, 16), Phase(None, 8, 128)], **PACKED).map_dataset()
    said = [r.getMessage() for r in caplog.records if "rises" in r.getMessage()]
    assert len(said) == 1
    assert "seq_len rises from 16 to 128 in the middle of a packed block" in said[0]
    assert "at least 87% padding" in said[0] and "pass a smaller block_tokens" in said[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="grain_rox"):  # shorter rows: no padding
        TokenPipeline(path, phases=[Phase(3, 8, 128), Phase(None, 8, 16)], **PACKED).map_dataset()
    assert not [r for r in caplog.records if "rises" in r.getMessage()]


@pytest.mark.parametrize("seed", range(24))
def test_order_serves_each_pair_once_per_epoch_under_random_schedules(seed):
    """The order alone, on random corpora, chunk and block sizes and seq_len schedules: epoch 0
    holds every in-chunk, in-document pair exactly once; a schedule changed at a random
    sample moves nothing served before it and still serves epoch 0 exactly."""
    r = np.random.default_rng(seed)
    c = int(r.choice([64, 100, 256]))
    chunks = int(r.integers(3, 30))
    tokens = r.integers(1, 50, c * chunks + int(r.integers(0, c)))
    tokens[r.random(tokens.size) < r.choice([0.01, 0.05, 0.2])] = 0

    def ends(shard: int, at: int) -> np.ndarray:
        return np.flatnonzero(tokens[at : at + c] == 0) + 1

    runs, x = [], 0
    for _ in range(int(r.integers(1, 5))):
        n = int(r.integers(1, 3 * chunks * c // 16 + 2))
        runs.append(Run(x, x + n, int(r.choice([3, 5, 8, 16, 31, 64]))))
        x += n
    blocks = int(r.choice([c, 3 * c, 10**9]))
    packing = str(r.choice(["best_fit", "first_fit"]))

    def order(schedule: list[Run]) -> PackedOrder:
        return PackedOrder([tokens.size], seed=seed, chunk_tokens=c, runs=schedule,
                           documents=ends, block_tokens=blocks, packing=packing)  # fmt: skip

    def epoch0_pairs(o: PackedOrder, n: int) -> np.ndarray:
        rows = o.locate(np.arange(n))
        row, stream, length, dest = rows.span_arrays()
        assert (dest >= 0).all() and (dest + length <= rows.seq_len[row] + 1).all()
        assert np.array_equal(np.bincount(row, weights=length, minlength=n), rows.content)
        epoch = rows.epoch[row]
        phys = np.empty_like(stream)
        for e in np.unique(epoch).tolist():
            phys[epoch == e] = o.physical_chunks(e, stream[epoch == e] // c)
        pos = (phys * c + stream % c)[epoch == 0]
        return np.sort(np.concatenate([np.arange(p, p + n - 1) for p, n in
                                       zip(pos, length[epoch == 0], strict=True)]))  # fmt: skip

    usable = chunks * c
    p = np.arange(usable)
    want = p[(p % c != c - 1) & (tokens[:usable] != 0)]
    first = order([*runs, Run(x, 10**15, int(r.choice([3, 8, 16])))])
    assert np.array_equal(epoch0_pairs(first, x + 2 * usable), want)
    cut = int(r.integers(0, x + 1))
    changed = order([*(Run(a.start, min(a.stop, cut), a.seq_len) for a in runs if a.start < cut),
                     Run(cut, 10**15, int(r.choice([4, 8, 16])))])  # fmt: skip
    if cut:
        before, after = first.locate(np.arange(cut)), changed.locate(np.arange(cut))
        for a, b in zip(before.span_arrays(), after.span_arrays(), strict=True):
            assert np.array_equal(a, b)
    assert np.array_equal(epoch0_pairs(changed, cut + 2 * usable), want)


# ---- rows: whole documents, padding, segment features ------------------------------------------
def test_rows_hold_whole_documents_with_segment_ids_positions_and_padding(positional):
    pipe = TokenPipeline(positional, seq_len=128, global_batch_size=8, **PACKED)
    for k in range(6):
        b = pipe.map_dataset()[k]
        for r in range(8):
            tokens = np.r_[b["inputs"][r], b["targets"][r, -1]]
            seg, pos = b["inputs_segmentation"][r], b["inputs_position"][r]
            content = int(np.count_nonzero(seg))
            assert (seg[content:] == 0).all() and (tokens[content + 1 :] == 0).all()
            assert (pos[content:] == 0).all()
            for s in range(1, int(seg.max()) + 1):
                at = np.flatnonzero(seg == s)
                assert at.size and np.array_equal(pos[at], np.arange(at.size))
                piece = tokens[at[0] : at[-1] + 2]  # the segment's tokens and the next one
                body = piece[:-1]
                # one stretch of consecutive positions: a whole document (or a piece of a long
                # one), ending at its EOS unless it is a cut piece
                nonzero = body[body != 0]
                assert np.array_equal(nonzero, np.arange(nonzero[0], nonzero[0] + nonzero.size))
                assert (body[:-1] != 0).all()
                live = b["targets_segmentation"][r][at]
                assert (live[:-1] == s).all()
                if s < seg.max() or content < 128:  # its last target is another's, or padding
                    assert live[-1] == 0


def test_a_document_longer_than_a_row_comes_in_pieces_sharing_one_token(make_rox):
    doc = np.arange(1, 300, dtype=np.uint16)  # 299 tokens + EOS: pieces of 65 at seq_len 64
    path = make_rox("long", [doc] * 20, separator=0)  # chunks of 3000: 10 whole documents
    pipe = TokenPipeline(path, seq_len=64, global_batch_size=4, num_epochs=1, chunk_tokens=3000,
                         packing="best_fit")  # fmt: skip
    rows = np.concatenate(
        [np.r_["1", b["inputs"], b["targets"][:, -1:]] for b in pipe.map_dataset()]
    )
    full = [r for r in rows if r[0] == 1 and r[-1] == 65]
    assert len(full) > 0  # a document's first piece fills a row: tokens 1..65
    follow = [r for r in rows if r[0] == 65]  # the next piece starts with the last one's end
    assert len(follow) > 0 and all(np.array_equal(r[:65], np.arange(65, 130)) for r in follow)


def test_windows_layout_unpacks_to_the_same_features(random_corpus):
    pipe = TokenPipeline(random_corpus, seq_len=96, global_batch_size=4, **PACKED)
    want = pipe.map_dataset()[3]
    got = unpack_windows(pipe.with_layout("windows").map_dataset()[3])
    assert set(got) == set(want)
    for key in want:
        assert np.array_equal(np.asarray(got[key]), want[key]), key


def test_best_fit_places_each_document_longest_first_where_least_room_is_left():
    ends = np.cumsum([30, 40, 20, 10, 60, 5, 5, 64])  # documents at 0, 30, 70, 90, 100, ...
    packed = pack_chunk(ends, 234, seq_len=64, rows=4)
    assert packed.split == 0
    assert [packed.row(r) for r in range(packed.rows)] == [
        [(170, 64)],
        [(100, 60), (160, 5)],
        [(30, 40), (70, 20), (165, 5)],
        [(0, 30), (90, 10)],
    ]
    assert packed.content.tolist() == [64, 65, 65, 40]
    assert rows_used(ends, 234, seq_len=64, packing="best_fit") == 4 == min_rows(234, 64)


def test_a_piece_no_row_holds_whole_is_split_over_the_roomiest_rows():
    ends = np.array([40, 80, 120])  # three documents of 40 into two rows of 65
    packed = pack_chunk(ends, 120, seq_len=64, rows=2)
    assert packed.split == 1
    assert [packed.row(r) for r in range(2)] == [[(0, 40), (104, 16)], [(40, 40), (80, 25)]]


@pytest.mark.parametrize("packing", ["best_fit", "first_fit"])
def test_a_chunk_packed_to_measure_it_fits_any_row_count_it_does_not_outgrow(packing):
    # rows_per_group's sampled chunks are served as with_rows(pack_open(...)): they must be
    # what pack_chunk makes of the chunk at the order's row count, piece for piece
    rng = np.random.default_rng(7)
    for _ in range(40):
        chunk, seq_len = int(rng.integers(50, 3000)), int(rng.choice([4, 16, 64, 300]))
        ends = np.unique(rng.integers(1, chunk + 40, int(rng.integers(0, 60))))
        opened = pack_open(ends, chunk, seq_len=seq_len, packing=packing)
        used = int(np.count_nonzero(opened.content))
        for rows in {max(used, min_rows(chunk, seq_len)), used, used + 3, opened.rows + 2}:
            fitted = with_rows(opened, rows)
            want = pack_chunk(ends, chunk, seq_len=seq_len, rows=rows, packing=packing)
            assert fitted.rows == want.rows and fitted.split == want.split == 0
            for a, b in [(fitted.first, want.first), (fitted.spans, want.spans),
                         (fitted.content, want.content)]:  # fmt: skip
                assert np.array_equal(a, b) and a.dtype == b.dtype, (chunk, seq_len, rows)
        with pytest.raises(ValueError, match="cannot take"):
            with_rows(opened, used - 1)


# ---- the contracts: pure function of the step, host count, restore ---------------------------
def test_rows_of_a_process_are_rows_of_the_global_batch(random_corpus):
    pipe = TokenPipeline(random_corpus, seq_len=64, global_batch_size=8, **PACKED)
    whole = pipe.map_dataset()
    for lo, hi in [(0, 4), (4, 8), (2, 3)]:
        part = pipe.map_dataset(rows=(lo, hi))
        for k in (0, 5, 17):
            for key, value in part[k].items():
                assert np.array_equal(value, whole[k][key][lo:hi]), (lo, hi, k, key)


def test_a_batch_is_a_pure_function_of_the_step_even_at_step_a_billion(random_corpus):
    def pipe() -> TokenPipeline:
        return TokenPipeline(random_corpus, seq_len=64, global_batch_size=8, seed=5, **PACKED)

    a = pipe().map_dataset()[10**9]
    second = pipe().map_dataset()
    second[3]  # another history in this process changes nothing
    b = second[10**9]
    for key in a:
        assert np.array_equal(a[key], b[key])
    assert a["inputs_segmentation"].max() >= 1


def test_a_pack_store_too_small_for_its_chunks_serves_the_same_batches(random_corpus, monkeypatch):
    """Packed chunks are kept in flat buffers of about PACK_CACHE_BYTES; when they would
    outgrow it they are rebuilt with only the chunks in use. Rebuilt every few batches (a
    store of 5 KB), keeping chunks each time, the batches are those of a store that never
    fills."""
    from grain_rox._order import _pack_store, _packed

    def batches() -> list[dict[str, np.ndarray]]:
        pipe = TokenPipeline(random_corpus, seq_len=64, global_batch_size=8, seed=2, **PACKED)
        ds = pipe.map_dataset()
        return [ds[k] for k in [*range(40), 10**6, 5, 10**9]]

    roomy = batches()
    kept: list[int] = []
    rebuild = _pack_store.PackStore._rebuild

    def counted(self, keep):
        kept.append(len(keep))
        return rebuild(self, keep)

    monkeypatch.setattr(_pack_store.PackStore, "_rebuild", counted)
    monkeypatch.setattr(_packed, "PACK_CACHE_BYTES", 5_000)
    for a, b in zip(roomy, batches(), strict=True):
        for key in a:
            assert np.array_equal(a[key], b[key]), key
    assert len(kept) >= 3 and sum(kept) > 0, kept


def test_pack_store_packs_each_chunk_once_and_rebuilds_with_the_chunks_in_use():
    from grain_rox._order._pack_store import PackStore

    ends = {k: np.array([3 + k, 10, 12]) for k in range(6)}
    packed = {k: pack_chunk(ends[k], 16, seq_len=7, rows=3) for k in ends}
    calls: list[int] = []

    def pack(key: int):
        calls.append(key)
        return packed[key]

    def pieces(store: PackStore, keys: list[int]) -> list[list[list[int]]]:
        base, firsts, spans = store.rows(keys, pack)
        return [
            spans[:, firsts[b + r] : firsts[b + r + 1]].tolist()
            for b in base.tolist()
            for r in range(3)
        ]

    def want(keys: list[int]) -> list[list[list[int]]]:
        return [
            packed[k].spans[:, packed[k].first[r] : packed[k].first[r + 1]].tolist()
            for k in keys
            for r in range(3)
        ]

    store = PackStore(max_bytes=8 * 60)  # each chunk here holds 128 bytes: room for three
    assert pieces(store, [0, 1, 0, 1]) == want([0, 1, 0, 1])
    assert calls == [0, 1] and store.nbytes == 256  # packed once each, however often read
    assert pieces(store, [1, 2, 3]) == want([1, 2, 3])  # rebuilt: 1 kept, 0 dropped, 2, 3 added
    assert calls == [0, 1, 2, 3] and sorted(store._extent) == [1, 2, 3]
    assert pieces(store, [4, 0]) == want([4, 0])  # rebuilt again: 0 packed anew
    assert calls == [0, 1, 2, 3, 4, 0] and sorted(store._extent) == [0, 4]


def test_a_chunk_another_thread_drops_while_this_one_packs_is_packed_again():
    """Two readers of one store: while one packs the chunks it lacks (outside the lock),
    another's rebuild drops a chunk the first found held. The first must not serve another
    chunk's rows for it (a neighbour's in the index: wrong tokens, silently) nor fail: it
    packs that chunk again. (Here the other reader runs inside the first one's pack.)"""
    from grain_rox._order._pack_store import PackStore

    ends = {k: np.array([3 + k, 10, 12]) for k in range(6)}
    packed = {k: pack_chunk(ends[k], 16, seq_len=7, rows=3) for k in ends}
    store = PackStore(max_bytes=8 * 60)  # each chunk here holds 128 bytes: room for three
    calls: list[int] = []

    def pack(key: int):
        calls.append(key)
        return packed[key]

    def pack_while_another_reads(key: int):
        if key == 1:  # the other reader: its rebuild keeps 2, 3, 4 and drops 0
            store.rows([2, 3, 4], pack)
            assert 0 not in store._extent
        return pack(key)

    store.rows([0], pack)
    base, firsts, spans = store.rows([0, 1], pack_while_another_reads)
    got = [
        spans[:, firsts[b + r] : firsts[b + r + 1]].tolist()
        for b in base.tolist()
        for r in range(3)
    ]
    want = [
        packed[k].spans[:, packed[k].first[r] : packed[k].first[r + 1]].tolist()
        for k in (0, 1)
        for r in range(3)
    ]
    assert got == want
    assert calls == [0, 2, 3, 4, 1, 0]  # 0 packed again, once


def test_state_restores_the_next_batches_exactly_even_at_a_billion(random_corpus):
    pipe = TokenPipeline(random_corpus, seq_len=64, global_batch_size=8, **PACKED)
    with MultiHostDataLoadIterator(pipe) as it:
        for _ in range(3):
            next(it)
        state = it.get_state()
        want = [{k: np.asarray(v) for k, v in next(it).items()} for _ in range(3)]
    with MultiHostDataLoadIterator(pipe) as it:
        it.set_state(state)
        for w in want:
            got = next(it)
            for key in w:
                assert np.array_equal(np.asarray(got[key]), w[key])
        far = json.loads(state)
        far["step"] = 10**9
        it.set_state(json.dumps(far).encode())
        got = next(it)
        assert np.array_equal(np.asarray(got["inputs"]), pipe.map_dataset()[10**9]["inputs"])


def test_a_packed_state_is_refused_by_an_unpacked_pipeline_and_back(random_corpus):
    packed = TokenPipeline(random_corpus, seq_len=64, global_batch_size=8, **PACKED)
    plain = TokenPipeline(random_corpus, seq_len=64, global_batch_size=8, chunk_tokens=CHUNK)
    first_fit = TokenPipeline(random_corpus, seq_len=64, global_batch_size=8,
                              **{**PACKED, "packing": "first_fit"})  # fmt: skip
    for saved, restored in [(packed, plain), (plain, packed), (packed, first_fit)]:
        with MultiHostDataLoadIterator(saved) as it:
            next(it)
            state = it.get_state()
        with MultiHostDataLoadIterator(restored) as it, pytest.raises(ValueError, match="packing"):
            it.set_state(state)


def test_mixture_rows_follow_the_weights_exactly_at_every_prefix(make_rox):
    a = make_rox("mix_a", random_documents(1, lengths=(1, 200), high=1000, until_tokens=60_000),
                 separator=0)  # fmt: skip
    b = make_rox("mix_b", random_documents(2, lengths=(1, 200), low=1000, high=2000,
                                           until_tokens=60_000), separator=0)  # fmt: skip
    pipe = TokenPipeline({"a": a, "b": b}, seq_len=64, global_batch_size=8,
                         weights={"a": 0.75, "b": 0.25}, **PACKED)  # fmt: skip
    source = pipe.batch_source()
    counts = np.zeros(2)
    for k in range(60):
        batch = source[k]
        sources = source.sources_of(k)
        counts += np.bincount(sources, minlength=2)
        rows = 8 * (k + 1)
        assert abs(counts[0] - 0.75 * rows) <= 1 and abs(counts[1] - 0.25 * rows) <= 1, k
        live = batch["inputs_segmentation"] != 0
        for r, s in enumerate(sources.tolist()):
            tokens = batch["inputs"][r][live[r]]
            tokens = tokens[tokens != 0]
            assert ((tokens >= 1000) == (s == 1)).all(), (k, r)


def test_segment_ids_keep_attention_inside_each_document(random_corpus):
    """A causal attention masked by the segment ids: changing one document of a row leaves the
    outputs at every other document's positions unchanged (and without the mask they move)."""
    pipe = TokenPipeline(random_corpus, seq_len=128, global_batch_size=8, **PACKED)
    batch = pipe.map_dataset()[0]
    r = int(np.argmax(batch["inputs_segmentation"].max(axis=1)))
    seg = jnp.asarray(batch["inputs_segmentation"][r])
    assert int(seg.max()) >= 2
    table = jax.random.normal(jax.random.key(0), (65536, 16))

    def attend(tokens: jax.Array, masked: bool) -> jax.Array:
        x = table[tokens]
        logits = x @ x.T
        n = tokens.size
        allowed = jnp.tril(jnp.ones((n, n), bool))
        if masked:
            allowed &= (seg[:, None] == seg[None, :]) & (seg[:, None] > 0)
        weights = jax.nn.softmax(jnp.where(allowed, logits, -1e9), axis=-1)
        return weights @ x

    tokens = jnp.asarray(batch["inputs"][r].astype(np.int32))
    changed = jnp.where(seg == 1, (tokens + 7) % 65536, tokens)  # rewrite document 1
    others = np.asarray(seg) > 1
    for masked, same in [(True, True), (False, False)]:
        before, after = attend(tokens, masked), attend(changed, masked)
        assert bool(jnp.allclose(before[others], after[others])) is same


# ---- refusals ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"packing": "greedy"}, "packing='greedy'; use 'best_fit', 'first_fit' or None"),
        ({"packing": "best_fit", "order": "lanes"}, "order='lanes' applies to unpacked rows"),
        ({"packing": "best_fit", "segmentation": False}, "needs segmentation=True"),
    ],
)
def test_packing_with_a_config_that_cannot_carry_it_is_refused(random_corpus, extra, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TokenPipeline(random_corpus, seq_len=64, global_batch_size=8, **extra)


def test_packing_without_an_eos_id_names_the_fix(make_rox):
    path = make_rox("no_eos", [np.arange(1, 9000, dtype=np.uint16)])
    pipe = TokenPipeline(path, seq_len=64, global_batch_size=8, packing="best_fit")
    with pytest.raises(ValueError, match=r"finds documents by their EOS token.*pass eos_id="):
        pipe.map_dataset()


def test_packed_rows_travel_as_one_array_and_their_features_are_derived_on_the_devices(
    random_corpus,
):
    """One transfer a packed batch too: the tokens, a join mask and each row's content
    length, with the six features derived on the devices, equal to the host's."""
    pipe = TokenPipeline(random_corpus, seq_len=64, global_batch_size=8, **PACKED)
    want = pipe.map_dataset()
    with MultiHostDataLoadIterator(pipe, features_on_device=True) as it:
        assert it._feed.derive is not None
        assert it._feed.read_as.layout == "tokens"
        for step in range(6):
            got = next(it)
            assert sorted(got) == sorted(want[step])
            for key in want[step]:
                np.testing.assert_array_equal(np.asarray(got[key]), want[step][key], err_msg=key)
        state = it.get_state()
    with MultiHostDataLoadIterator(pipe, features_on_device=True) as resumed:
        resumed.set_state(state)
        got = next(resumed)
        for key in want[6]:
            np.testing.assert_array_equal(np.asarray(got[key]), want[6][key], err_msg=key)


# ---- real processes: jax.distributed over loopback, and Grain worker processes -------------
@pytest.fixture(scope="module")
def packed_waves(tmp_path_factory, random_corpus):
    """One-process checkpoint at step 10 saved here; then a 2-process wave (fresh, saving at
    10; and restoring the 1-process checkpoint) and a 4-process wave (fresh; and restoring
    the 2-process checkpoint): the elastic path 1 -> 2 -> 4, and 2 -> 1 below."""
    from test_multiprocess import BATCH, SEQ_LEN, checkpoint_after, load_outputs, run_workers

    config = {"seq_len": SEQ_LEN, "global_batch_size": BATCH, "seed": 3, **PACKED}
    pipe = TokenPipeline(random_corpus, **config)
    root = tmp_path_factory.mktemp("packed_mp")
    ckpt1, ckpt2, out = root / "ckpt1", root / "ckpt2", root / "out"
    out.mkdir()
    checkpoint_after(pipe, 10, ckpt1)
    base = {"corpus": random_corpus, "out_dir": str(out), "pipeline": config}
    two = [
        {"tag": "fresh2", "read": 20, "save": {"dir": str(ckpt2), "after": 10}},
        {"tag": "from1", "read": 10, "restore": {"dir": str(ckpt1), "step": 10}},
    ]
    four = [
        {"tag": "fresh4", "read": 20},
        {"tag": "from2", "read": 10, "restore": {"dir": str(ckpt2), "step": 10}},
    ]
    run_workers(2, {**base, "runs": two}, root / "work2")
    run_workers(4, {**base, "runs": four}, root / "work4")
    outputs = {run["tag"]: load_outputs(out, run["tag"], n) for n, runs in ((2, two), (4, four))
               for run in runs}  # fmt: skip
    return pipe, ckpt2, outputs


@pytest.mark.slow
def test_packed_batches_are_the_same_on_1_2_and_4_processes_and_restore_elastically(packed_waves):
    import orbax.checkpoint as ocp
    from test_multiprocess import assert_batches_equal

    from grain_rox import RoxCheckpointRestore

    pipe, ckpt2, outputs = packed_waves
    ds = pipe.map_dataset()

    def expected(k: int) -> dict[str, np.ndarray]:
        return {key: np.asarray(v) for key, v in ds[k].items()}

    assert_batches_equal(outputs["fresh2"], expected, first_step=0, count=20)
    assert_batches_equal(outputs["fresh4"], expected, first_step=0, count=20)
    assert_batches_equal(outputs["from1"], expected, first_step=10, count=10)  # 1 -> 2
    assert_batches_equal(outputs["from2"], expected, first_step=10, count=10)  # 2 -> 4
    with MultiHostDataLoadIterator(pipe) as it:  # 2 -> 1
        manager = ocp.CheckpointManager(ckpt2)
        manager.restore(10, args=ocp.args.Composite(data=RoxCheckpointRestore(it)))
        manager.close()
        for k in range(10, 14):
            got = next(it)
            for key, want in expected(k).items():
                assert np.array_equal(np.asarray(got[key]), want), (k, key)


@pytest.mark.slow
def test_grain_worker_processes_serve_the_same_packed_batches(random_corpus):
    pipe = TokenPipeline(random_corpus, seq_len=64, global_batch_size=8, num_epochs=1, **PACKED)
    want = pipe.map_dataset()
    for k, got in enumerate(pipe.data_loader(worker_count=2)):
        for key in got:
            assert np.array_equal(got[key], want[k][key]), (k, key)
        if k == 12:
            break
    else:
        pytest.fail("the loader ended early")


def test_shards_shorter_than_two_rows_are_refused_saying_why_and_how(make_rox):
    """Packing chooses no chunk under two rows: shards all shorter than that were refused as
    "no shard holds a whole chunk of 65536 tokens ... pass a smaller chunk_tokens", a chunk
    nobody had passed. A chunk_tokens given by hand packs them."""
    docs = [np.arange(1, 1 + n, dtype=np.uint16) for n in (30, 50, 70)]
    paths = [make_rox(f"small{k}", docs[k:] + docs[:k], separator=0) for k in range(3)]
    with pytest.raises(ValueError) as info:
        _ = TokenPipeline(paths, seq_len=512, global_batch_size=2, packing="best_fit").plan
    assert str(info.value) == (
        f"{paths[0]}: its shards ([153, 153, 153] tokens, the largest first) are all shorter "
        "than 1026 tokens, the least chunk packing chooses by itself (two rows of seq_len + 1, "
        "at least 64; a chunk is packed on its own, in one shard); write fewer, larger shards, "
        "or pass chunk_tokens= (at most the largest shard) to pack anyway, with about one row "
        "of padding a chunk"
    )
    tiny = [make_rox(f"tiny{k}", docs[:1], separator=0) for k in range(3)]  # 31 tokens each
    with pytest.raises(ValueError, match=r"are all shorter than 64 tokens, the least chunk"):
        _ = TokenPipeline(tiny, seq_len=8, global_batch_size=2, packing="best_fit").plan
    pipe = TokenPipeline(paths, seq_len=512, global_batch_size=2, packing="best_fit",
                         chunk_tokens=153, num_epochs=1)  # fmt: skip
    batches = [pipe.batch_source()[k] for k in range(pipe.num_batches)]
    trained = sum(int((b["targets_segmentation"] != 0).sum()) for b in batches)
    assert trained == 3 * (30 + 50 + 70)  # every pair inside every document of every shard


def test_a_longer_phase_added_at_a_restore_says_how_to_keep_the_packed_chunk(make_rox):
    """The packed chunk follows the longest seq_len, so a longer phase added at a restore
    changed it and the refusal gave no reason; passing the saved chunk_tokens continues."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 60000, rng.integers(1, 400), dtype=np.uint16) for _ in range(1500)]
    path = make_rox("longer", docs, separator=0)
    first = TokenPipeline(path, phases=[Phase(None, 8, 64)], seed=0, packing="best_fit")
    chunk = first.plan.orders[0].chunk_tokens
    phases = [Phase(10, 8, 64), Phase(None, 8, 2048)]
    with MultiHostDataLoadIterator(first) as it:
        for _ in range(5):
            next(it)
        state = it.get_state()
        expected = [np.asarray(next(it)["inputs"]) for _ in range(5)]
    later = TokenPipeline(path, phases=phases, seed=0, packing="best_fit")
    assert later.plan.orders[0].chunk_tokens != chunk
    with MultiHostDataLoadIterator(later) as it, pytest.raises(ValueError) as info:
        it.set_state(state)
    assert str(info.value).endswith(
        ". Packed rows take a chunk chosen from the longest seq_len of the phases (and the "
        f"shards); to keep this run's chunk with the phases now given, pass chunk_tokens={chunk}"
    )
    other = TokenPipeline(make_rox("longer2", docs[::-1], separator=0), phases=phases, seed=0,
                          packing="best_fit")  # fmt: skip
    with MultiHostDataLoadIterator(other) as it, pytest.raises(ValueError) as info:
        it.set_state(state)
    assert "data: saved" in str(info.value) and "pass chunk_tokens" not in str(info.value)
    kept = TokenPipeline(path, phases=phases, seed=0, packing="best_fit", chunk_tokens=chunk)
    with MultiHostDataLoadIterator(kept) as it:
        it.set_state(state)
        got = [np.asarray(next(it)["inputs"]) for _ in range(5)]
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))


def test_a_reader_given_samples_out_of_order_reads_each_samples_own_row(random_corpus):
    """``read`` and ``row_content`` took samples whose first and last are a consecutive run
    ([10, 5, 12]) for one, and served sample 11's row in place of sample 5's."""
    reader = TokenPipeline(random_corpus, seq_len=64, global_batch_size=8, **PACKED)
    reader = reader.batch_source().readers[0]
    samples = np.array([10, 5, 12])
    alone = [reader.read(np.array([s]), dtype=np.dtype(np.int64))[0][0] for s in samples]
    together, _ = reader.read(samples, dtype=np.dtype(np.int64))
    for row, want in zip(together, alone, strict=True):
        assert np.array_equal(row, want)
    assert reader.row_content(samples).tolist() == [
        int(reader.row_content(np.array([s]))[0]) for s in samples
    ]
    assert len(set(reader.row_content(np.arange(64)).tolist())) > 1  # rows differ: a real check


def test_a_packed_run_read_into_any_rows_gives_each_row_its_window_joins_and_content(
    random_corpus,
):
    """``read_run`` into rows of a batch in any order (a mixed batch's rows of one source)
    writes each sample's row where it is asked and maps the plan's joins to those rows,
    sorted; ``run_content`` is ``row_content`` of the run."""
    reader = TokenPipeline(random_corpus, seq_len=256, global_batch_size=8, **PACKED)
    reader = reader.batch_source().readers[0]
    size = reader.order.group
    for first, n in ((3, 20), (size - 5, 10)):  # in one group; across two
        alone, alone_joins = reader.read(np.arange(first, first + n), dtype=np.dtype(np.int64))
        assert alone_joins is not None and alone_joins[0].size  # rows across joins: a check
        rows = np.arange(2 * n)[::-2].copy()  # every other row of a batch, backwards
        out = np.full((2 * n, 257), -1, dtype=np.int64)
        joins = reader.read_run(first, out, rows)
        assert np.array_equal(out[rows], alone) and (out[rows - 1] == -1).all()
        assert joins is not None
        pairs = list(zip(joins[0].tolist(), joins[1].tolist(), strict=True))
        assert pairs == sorted(pairs)
        want = sorted(zip(rows[alone_joins[0]].tolist(), alone_joins[1].tolist(), strict=True))
        assert pairs == want
        content = reader.row_content(np.arange(first, first + n))
        assert np.array_equal(reader.run_content(first, n), content)


def test_reading_on_in_order_plans_only_groups_the_order_schedules(random_corpus):
    """Reading in order plans groups ahead, but never past the order's scheduled samples (an
    order of finite runs), and a cold read across two groups plans just those two."""
    pipe = TokenPipeline(random_corpus, seq_len=64, global_batch_size=8, **PACKED)
    reader = pipe.batch_source().readers[0]
    size = reader.order.group
    reader.read(np.arange(5 * size - 4, 5 * size + 4), dtype=np.dtype(np.int64))  # cold, across
    assert sorted(reader._plans) == [4, 5]
    full = reader.order
    with open_rox(random_corpus) as corpus:
        shard_tokens = [s.num_tokens for s in corpus.shards]
    finite = PackedOrder(
        shard_tokens, seed=full.seed, chunk_tokens=full.chunk_tokens,
        runs=[Run(0, 3 * size, 64)], documents=full.documents, packing="best_fit",
        block_tokens=full.block_tokens,
    )  # fmt: skip
    on = type(reader)(reader.corpus, finite)
    served = [
        on.read(np.arange(a, a + 8), dtype=np.dtype(np.int64))[0] for a in range(0, 3 * size, 8)
    ]
    again = type(reader)(reader.corpus, finite)  # each group read cold, alone
    for g in (2, 1, 0):
        rows = np.concatenate(served[g * size // 8 : (g + 1) * size // 8])
        assert np.array_equal(again.read(np.arange(g * size, (g + 1) * size),
                                         dtype=np.dtype(np.int64))[0], rows)  # fmt: skip
