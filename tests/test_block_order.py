"""The default order (``_order._blocks``): coverage, no replay or skip across seq_len changes,
history that never moves, randomness, versioned states, and the old order kept bit for bit."""

from __future__ import annotations

import hashlib
import json

import jax
import numpy as np
import pytest

from grain_rox import MultiHostDataLoadIterator, Phase, TokenPipeline, write_rox
from grain_rox._order._blocks import BlockOrder
from grain_rox._order._chunks import Run

ENDLESS = 10**18


@pytest.fixture(scope="module")
def positional(make_rox):
    """Token values are their stream positions (uint32, no separator, no EOS)."""
    return make_rox("blockpos", [np.arange(200_000, dtype=np.uint32)], block_size=4000,
                    manifest=False)  # fmt: skip


def window_inputs(rows, n: int) -> list[tuple[int, np.ndarray]]:
    """(epoch, epoch-stream positions of the inputs) of each of ``n`` located windows."""
    row, offset, length, dest = rows.span_arrays()
    out = []
    for k in range(n):
        mine = np.flatnonzero(row == k)
        mine = mine[np.argsort(dest[mine])]
        tokens = np.concatenate([np.arange(offset[i], offset[i] + length[i]) for i in mine])
        assert tokens.size == rows.seq_len[k] + 1
        out.append((int(rows.epoch[k]), tokens[:-1]))
    return out


def window_pairs(rows, n: int) -> list[tuple[int, np.ndarray]]:
    """(epoch, epoch-stream position of each pair's first token) of the next-token pairs each
    of ``n`` located windows trains: those inside one of its spans (a pair across a join
    between spans is not trained)."""
    row, offset, length, _ = rows.span_arrays()
    out = []
    for k in range(n):
        mine = np.flatnonzero(row == k)
        firsts = [np.arange(offset[i], offset[i] + length[i] - 1) for i in mine]
        out.append((int(rows.epoch[k]), np.concatenate(firsts)))
    return out


def random_schedule(rng: np.random.Generator) -> tuple[list[Run], int]:
    lens = rng.integers(2, 40, size=int(rng.integers(1, 5))).tolist()
    runs, x = [], 0
    for s in lens:
        n = int(rng.integers(1, 400))
        runs.append(Run(x, x + n, s))
        x += n
    runs.append(Run(x, ENDLESS, lens[-1]))
    return runs, x


def test_random_schedules_never_replay_lose_at_most_a_window_per_block_and_change():
    """No next-token pair is trained twice in an epoch, and each epoch loses at most a window
    of pairs per block and per seq_len change, plus the pair across each chunk join. A hole
    is a whole unserved window, all its pairs: its last token was left out, and with it a
    pair per hole (a third of the holes' pairs at seq_len 3)."""
    rng = np.random.default_rng(0)
    checked = 0
    for trial in range(120):
        shards = rng.integers(50, 3000, size=int(rng.integers(1, 4))).tolist()
        chunk, block = int(rng.integers(20, 200)), int(rng.integers(45, 3000))
        runs, planned = random_schedule(rng)
        longest = max(r.seq_len for r in runs)
        try:
            order = BlockOrder(shards, seed=trial, chunk_tokens=chunk, runs=runs,
                               block_tokens=block, max_seq_len=longest)  # fmt: skip
        except ValueError as e:
            assert "cannot hold one window" in str(e)
            continue
        n = planned + 500
        rows = order.locate(np.arange(n))
        served: set[tuple[int, int]] = set()
        for epoch, firsts in window_pairs(rows, n):
            keys = {(epoch, t) for t in firsts.tolist()}
            assert len(keys) == firsts.size and not keys & served, (
                f"trial {trial}: a pair trained twice in one epoch"
            )
            served |= keys
            assert firsts.min() >= 0 and firsts.max() < order.stream_tokens - 1
        assert np.all(np.diff(rows.epoch) >= 0)
        changes = len(runs)
        chunks = order.stream_tokens // chunk
        for epoch in range(int(rows.epoch.max())):  # every finished epoch
            lost = order.stream_tokens - 1 - sum(1 for e, _ in served if e == epoch)
            assert lost <= (order.num_blocks + 2 * changes) * (longest + 1) + chunks, trial
        checked += 1
    assert checked > 60


def test_a_schedule_changed_from_any_sample_on_never_moves_the_samples_before_it():
    rng = np.random.default_rng(1)
    for trial in range(80):
        shards = rng.integers(500, 3000, size=2).tolist()
        runs, planned = random_schedule(rng)
        longest = max(r.seq_len for r in runs)
        kw = dict(seed=trial, chunk_tokens=int(rng.integers(20, 200)),
                  block_tokens=int(rng.integers(300, 3000)), max_seq_len=longest)  # fmt: skip
        whole = BlockOrder(shards, runs=runs, **kw)
        cut_at = int(rng.integers(1, planned + 300))
        cut = [Run(r.start, min(r.stop, cut_at), r.seq_len) for r in runs if r.start < cut_at]
        cut.append(Run(cut_at, ENDLESS, int(rng.integers(2, longest + 1))))
        changed = BlockOrder(shards, runs=cut, **kw)
        before = np.arange(cut_at)
        for a, b in zip(whole.locate(before).span_arrays(), changed.locate(before).span_arrays(),
                        strict=True):  # fmt: skip
            np.testing.assert_array_equal(a, b)
        # and the changed schedule goes on without training any pair twice
        n = cut_at + 300
        served: set[tuple[int, int]] = set()
        for epoch, firsts in window_pairs(changed.locate(np.arange(n)), n):
            keys = {(epoch, t) for t in firsts.tolist()}
            assert len(keys) == firsts.size and not keys & served, trial
            served |= keys


def test_every_window_once_per_epoch_in_blocks(positional):
    pipe = TokenPipeline(positional, seq_len=32, global_batch_size=8, seed=3, num_epochs=2,
                         chunk_tokens=1000, block_tokens=50_000)  # fmt: skip
    order = pipe.plan.orders[0]
    assert order.num_blocks == 4
    per_epoch = 4 * ((50_000 - 1) // 32)  # each block's grid, tail under one window dropped
    assert pipe.num_batches == 2 * (per_epoch // 8)
    ds = pipe.map_dataset()
    epochs = [
        np.concatenate([ds[k]["inputs"].reshape(-1) for k in range(e * 781, (e + 1) * 781)])
        for e in range(2)
    ]
    for tokens in epochs:
        assert np.unique(tokens).size == tokens.size == 781 * 8 * 32
    assert not np.array_equal(epochs[0][:256], epochs[1][:256])
    # block 0 of the epoch stream (its first 50 chunks) is served before any of block 1
    chunk_pos = order.chunk_permutation(0).inverse(epochs[0] // 1000)
    block_of = chunk_pos * 1000 // 50_000
    assert np.all(np.diff(block_of[:: 8 * 32]) >= 0)


def test_the_default_pool_is_the_whole_small_corpus_with_far_successors(positional):
    """A corpus under one block is one full permutation per epoch: the window after a
    window in the text comes a third of an epoch later on average, at no fixed period."""
    pipe = TokenPipeline(positional, seq_len=32, global_batch_size=8, seed=0, chunk_tokens=1000)
    order = pipe.plan.orders[0]
    assert order.num_blocks == 1
    per_epoch = order.windows_per_epoch // 8
    ds = pipe.map_dataset()
    step_of = {}
    for k in range(per_epoch):
        for start in ds[k]["inputs"][:, 0].tolist():
            step_of[start] = k
    gaps = np.asarray([abs(step_of[s + 32] - k) for s, k in step_of.items() if s + 32 in step_of])
    assert gaps.size > 5000
    assert 0.25 < gaps.mean() / per_epoch < 0.42  # 1/3 for a uniform permutation
    assert (gaps <= 2).mean() < 0.01  # under the lanes order: every successor within a round
    assert np.unique(gaps).size > 300  # spread out, not one period


def test_a_phase_change_in_mid_block_serves_the_rest_of_the_block_as_joined_holes(positional):
    phases = [Phase(40, 8, 16), Phase(30, 4, 40), Phase(None, 8, 24)]
    pipe = TokenPipeline(positional, phases=phases, seed=2, chunk_tokens=1000, eos_id=0)
    ds = pipe.map_dataset()
    pairs = [
        (a, b)
        for batch in (ds[k] for k in range(200))
        for a, b, keep in zip(batch["inputs"].ravel().tolist(), batch["targets"].ravel().tolist(),
                              batch["targets_segmentation"].ravel().tolist(), strict=True)
        if keep
    ]  # fmt: skip
    assert all(b == a + 1 for a, b in pairs)  # the text's own pairs (tokens are positions)
    assert len(set(pairs)) == len(pairs)  # nothing replayed across both changes
    holes = ds[41]  # phase 2 reads the first block's unserved 17-token windows, strung together
    x = holes["inputs"].astype(np.int64)
    joins = np.diff(x, axis=1) != 1
    assert joins.any(axis=1).all()  # a 40-token window spans 3 or 4 holes
    # every join starts a new segment at position 0, and targets across a join are not trained
    pos, seg, tseg = (holes[k] for k in ("inputs_position", "inputs_segmentation",
                                        "targets_segmentation"))  # fmt: skip
    r, t = np.nonzero(joins)
    assert np.all(pos[r, t + 1] == 0) and np.all(seg[r, t + 1] == seg[r, t] + 1)
    assert np.all(tseg[r, t] == 0)
    # inner pieces are whole grid windows of phase 1's block, all 17 tokens (epoch-stream
    # offsets): each of their 16 pairs is trained (the last was lost when holes were 16)
    inverse = pipe.plan.orders[0].chunk_permutation(0).inverse
    for row in np.c_[x, holes["targets"][:, -1:]]:
        stream = inverse(row // 1000) * 1000 + row % 1000
        for piece in np.split(stream, np.flatnonzero(np.diff(stream) != 1) + 1)[1:-1]:
            assert piece.size == 17 and piece[0] % 16 == 0


def test_cut_short_with_a_new_seq_len_at_restore_keeps_history_and_skips_nothing(positional):
    first = [Phase(None, 8, 16)]
    pipe = TokenPipeline(positional, phases=first, seed=4, chunk_tokens=1000, max_seq_len=48,
                         eos_id=0)  # fmt: skip
    with MultiHostDataLoadIterator(pipe) as it:
        ran = [jax.tree.map(np.asarray, next(it)) for _ in range(7)]
        state = it.get_state()
    later = [Phase(7, 8, 16), Phase(None, 8, 48)]
    moved = TokenPipeline(positional, phases=later, seed=4, chunk_tokens=1000, max_seq_len=48,
                          eos_id=0)  # fmt: skip
    ds = moved.map_dataset()
    for k in range(7):
        np.testing.assert_array_equal(ds[k]["inputs"], ran[k]["inputs"])
    with MultiHostDataLoadIterator(moved) as resumed:
        resumed.set_state(state)
        after = [jax.tree.map(np.asarray, next(resumed)) for _ in range(20)]
    assert after[0]["inputs"].shape == (8, 48)
    pairs = [
        (a, b)
        for batch in ran + after
        for a, b, keep in zip(batch["inputs"].ravel().tolist(), batch["targets"].ravel().tolist(),
                              batch["targets_segmentation"].ravel().tolist(), strict=True)
        if keep
    ]  # fmt: skip
    assert all(b == a + 1 for a, b in pairs) and len(set(pairs)) == len(pairs)


def test_states_name_their_order_and_a_version_2_state_restores_onto_order_lanes(positional):
    lanes = TokenPipeline(positional, seq_len=16, global_batch_size=8, seed=1, order="lanes")
    with MultiHostDataLoadIterator(lanes) as it:
        for _ in range(3):
            next(it)
        state = json.loads(it.get_state())
        expected = [np.asarray(next(it)["inputs"]) for _ in range(2)]
    assert state["version"] == 3 and state["pipeline"]["order"] == "lanes"
    # what grain_rox 0.1 saved: version 2, no order named
    old = {**state, "version": 2, "pipeline": {k: v for k, v in state["pipeline"].items()
                                               if k != "order"}}  # fmt: skip
    with MultiHostDataLoadIterator(lanes) as it:
        it.set_state(json.dumps(old).encode())
        got = [np.asarray(next(it)["inputs"]) for _ in range(2)]
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    blocks = TokenPipeline(positional, seq_len=16, global_batch_size=8, seed=1)
    with MultiHostDataLoadIterator(blocks) as it:
        with pytest.raises(ValueError) as e:
            it.set_state(json.dumps(old).encode())
        assert str(e.value) == (
            "cannot restore this data state: it was saved with order='lanes' (grain_rox 0.1's "
            "only order; its states have version 2), and this TokenPipeline uses "
            "order='blocks', which serves batches in another order. Pass "
            "TokenPipeline(..., order='lanes') to continue this run bit-exactly, or start a "
            "new run"
        )
        with pytest.raises(ValueError, match=r"saved with order='lanes', and this"):
            it.set_state(json.dumps(state).encode())


def test_order_lanes_serves_grain_rox_0_1_batches_bit_for_bit(tmp_path):
    """The digest was computed with grain_rox 0.1 (commit 8965957, the lanes order only)."""
    rng = np.random.default_rng(7)
    paths = {}
    for name in "ab":
        docs = [rng.integers(1, 900, int(rng.integers(3, 400)), dtype=np.uint16) for _ in range(60)]
        paths[name] = str(tmp_path / f"{name}.rox")
        write_rox(docs, paths[name], separator=0)
    phases = [Phase(12, 8, 16, {"a": 1, "b": 1}), Phase(None, 4, 40, {"a": 1, "b": 3})]
    pipe = TokenPipeline(paths, phases=phases, seed=5, chunk_tokens=500, order="lanes")
    digest = hashlib.sha256()
    ds = pipe.map_dataset()
    for k in [*range(30), 777]:
        for key, v in sorted(ds[k].items()):
            digest.update(key.encode() + np.ascontiguousarray(v).tobytes())
    assert digest.hexdigest() == "d24396bb019d74a7a38684d1d7a17eb468afcd87c74bf5cf349c945894e904aa"


def test_order_arguments_are_checked(positional):
    with pytest.raises(ValueError, match=r"order='shuffled'; use 'blocks' \(the default\)"):
        TokenPipeline(positional, seq_len=8, global_batch_size=4, order="shuffled")
    with pytest.raises(ValueError, match="lanes=8 applies to order='lanes'"):
        TokenPipeline(positional, seq_len=8, global_batch_size=4, lanes=8)
    with pytest.raises(ValueError, match="block_tokens=4096 applies to order='blocks'"):
        TokenPipeline(positional, seq_len=8, global_batch_size=4, order="lanes", block_tokens=4096)
    with pytest.raises(ValueError, match=r"block_tokens=16 cannot hold one window of seq_len 32"):
        TokenPipeline(positional, seq_len=32, global_batch_size=4, block_tokens=16).describe()
    described = TokenPipeline(positional, seq_len=8, global_batch_size=4).describe()
    assert (described["order"], described["block_tokens"]) == ("blocks", {"": 1 << 29})


def test_a_max_seq_len_below_a_phase_is_refused_before_any_data_is_read():
    with pytest.raises(ValueError) as e:
        TokenPipeline(
            "/nowhere/*.rox", phases=[Phase(10, 8, 16), Phase(None, 8, 64)], max_seq_len=32
        )
    assert str(e.value) == (
        "TokenPipeline: max_seq_len=32 is below the longest phase's seq_len 64: set "
        "max_seq_len=64 or more, or leave it unset (default: the longest phase's seq_len)"
    )


def test_a_longer_phase_added_at_a_restore_needs_no_max_seq_len_up_front(positional):
    """The block order keeps no room at lane ends, so a run may grow its windows later; the
    lanes order cannot, and says what to set next time."""
    for order in ("blocks", "lanes"):
        first = TokenPipeline(positional, phases=[Phase(None, 8, 16)], seed=0, order=order)
        with MultiHostDataLoadIterator(first) as it:
            ran = [np.asarray(next(it)["inputs"]) for _ in range(3)]
            state = it.get_state()
        longer = [Phase(3, 8, 16), Phase(None, 8, 32)]
        grown = TokenPipeline(positional, phases=longer, seed=0, order=order)
        with MultiHostDataLoadIterator(grown) as it:
            if order == "lanes":
                with pytest.raises(ValueError) as e:
                    it.set_state(state)
                message = str(e.value)  # the lane count follows max_seq_len too
                assert "max_seq_len: saved 16 -> now 32). Restore with the same" in message
                assert message.endswith(
                    "or start a new run. The run started with windows of at most 16 tokens and "
                    "order='lanes' kept room for no longer ones at every lane's end: a lanes run "
                    "that may add a phase with longer windows must be started with "
                    "TokenPipeline(max_seq_len=...) set to the longest seq_len it may use; this "
                    "run can continue with phases of seq_len <= 16 only (the default "
                    "order='blocks' has no such limit)"
                )
                continue
            it.set_state(state)
            assert np.asarray(next(it)["inputs"]).shape == (8, 32)
        ds = grown.map_dataset()
        for k in range(3):
            np.testing.assert_array_equal(ds[k]["inputs"], ran[k])


def test_order_lanes_keeps_grain_rox_0_1_batch_source_repr(tmp_path):
    """A grain.DataLoader checkpoint names its source by repr: 0.1's must still match
    (the value printed by grain_rox 0.1, commit 8965957, for this file and config)."""
    path = str(tmp_path / "r.rox")
    write_rox([np.arange(20000, dtype=np.uint16) % 1000], path, separator=0)
    lanes = TokenPipeline(path, seq_len=16, global_batch_size=8, seed=1, order="lanes")
    expected = (
        "GlobalBatchSource(data=51129bf6c049d452, phases=1, seed=1, first_step=0, "
        "config=9235559c84733346)"
    )
    assert repr(lanes.batch_source()) == expected
    blocks = TokenPipeline(path, seq_len=16, global_batch_size=8, seed=1)
    assert repr(blocks.batch_source()) != expected  # Grain refuses a 0.1 DataLoader state


def test_a_version_2_state_of_a_grain_dataset_over_a_pipeline_names_the_order(positional):
    lanes = TokenPipeline(positional, seq_len=16, global_batch_size=8, seed=1, order="lanes")
    with MultiHostDataLoadIterator(lanes.map_dataset().to_iter_dataset()) as it:
        for _ in range(3):
            next(it)
        state = {**json.loads(it.get_state()), "version": 2}  # as grain_rox 0.1 wrote it:
        state["grain"] = state["grain"]["state"]  # Grain's bare position, with no identity
        expected = [np.asarray(next(it)["inputs"]) for _ in range(2)]
    with MultiHostDataLoadIterator(lanes.map_dataset().to_iter_dataset()) as it:
        it.set_state(json.dumps(state).encode())
        for e in expected:
            np.testing.assert_array_equal(np.asarray(next(it)["inputs"]), e)
    blocks = TokenPipeline(positional, seq_len=16, global_batch_size=8, seed=1)
    with MultiHostDataLoadIterator(blocks.map_dataset().to_iter_dataset()) as it:
        with pytest.raises(ValueError, match=r"saved by grain_rox 0.1 \(state version 2\), whose"):
            it.set_state(json.dumps(state).encode())
        # relabelled as this release's, its Grain position carries no identity: refused
        with pytest.raises(ValueError, match=r"not a TokenPipeline state: \{'next_index': 3\}"):
            it.set_state(json.dumps({**state, "version": 3}).encode())


def test_a_state_saved_while_holes_were_read_short_is_refused_where_it_matters(positional):
    """An earlier grain_rox read each hole one token short: a state it saved after a seq_len
    change (holes read) would resume onto other holes, replaying or skipping windows, so it
    is refused, naming why; one saved before any change resumes exactly, and so does a state
    this grain_rox saved. A Grain dataset state names the holes too."""
    phases = [Phase(5, 8, 16), Phase(None, 8, 24)]
    pipe = TokenPipeline(positional, phases=phases, seed=5, chunk_tokens=1000, eos_id=0)
    assert pipe.describe()["holes"] == "whole windows"
    ds = pipe.map_dataset()

    def state_at(step: int) -> dict:
        with MultiHostDataLoadIterator(pipe) as it:
            for _ in range(step):
                next(it)
            return json.loads(it.get_state())

    for step in (3, 9):
        state = state_at(step)
        with MultiHostDataLoadIterator(pipe) as it:  # this grain_rox's own state
            it.set_state(json.dumps(state))
            np.testing.assert_array_equal(np.asarray(next(it)["inputs"]), ds[step]["inputs"])
        del state["pipeline"]["holes"]  # as an earlier grain_rox saved it
        with MultiHostDataLoadIterator(pipe) as it:
            if step == 3:  # before the change: no hole read yet, exact
                it.set_state(json.dumps(state))
                np.testing.assert_array_equal(np.asarray(next(it)["inputs"]), ds[3]["inputs"])
                continue
            with pytest.raises(ValueError) as info:
                it.set_state(json.dumps(state))
    assert "holes: read one token short a window by an earlier grain_rox" in str(info.value)
    assert str(info.value).endswith(
        "continues exactly only with the grain_rox release that saved the state"
    )
    iterator = iter(ds.to_iter_dataset())
    next(iterator)
    grain_state = iterator.get_state()
    del grain_state["identity"]["holes"]
    with pytest.raises(ValueError, match="holes"):
        iter(ds.to_iter_dataset()).set_state(grain_state)
    plain = TokenPipeline(positional, seq_len=16, global_batch_size=8, seed=5, eos_id=0)
    assert "holes" not in plain.describe()  # no seq_len change: states as before
