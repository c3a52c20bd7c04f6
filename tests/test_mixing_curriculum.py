"""Exact mixtures and curriculum phases: proportions, no replay or skip, O(1) resume."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import re
import sqlite3
import time
from fractions import Fraction

import grain
import numpy as np
import pytest

from grain_rox import MultiHostDataLoadIterator, Phase, TokenPipeline, mix_datasets, pack_documents
from grain_rox._order._mixture import Mixture, legacy_weights

OFFSETS = {"a": 0, "b": 10_000_000, "c": 20_000_000}
SIZES = {"a": 60_000, "b": 40_000, "c": 30_000}


@pytest.fixture(scope="module")
def sources(make_rox):
    """Three corpora whose token values encode (source, stream position)."""
    return {
        name: make_rox(
            name,
            [np.arange(offset, offset + SIZES[name], dtype=np.uint32)],
            block_size=4000,
            manifest=False,
        )
        for name, offset in OFFSETS.items()
    }


def source_of(tokens: np.ndarray) -> np.ndarray:
    return tokens // 10_000_000


def assert_round_w_n_plus_minus_one(m: Mixture, weights, n: int) -> None:
    """At every prefix of the first ``n`` samples, each count is round(w n) +- 1, and within
    the mixture's proven ``max_error`` of w n."""
    seq = m.sources(0, n)
    w = np.asarray(weights, float) / sum(weights)
    onehot = np.zeros((seq.size, len(w)), np.int64)
    onehot[np.arange(seq.size), seq] = 1
    counts = np.cumsum(onehot, axis=0)
    ideal = w * np.arange(1, seq.size + 1)[:, None]
    assert np.abs(counts - np.round(ideal)).max() <= 1
    assert np.abs(counts - ideal).max() <= float(m.max_error) + 1e-6
    assert m.max_error < 1.5


@pytest.mark.parametrize(
    "weights",
    [
        [0.7, 0.3], [0.5, 0.3, 0.2], [1, 1, 1], [0.9, 0.05, 0.03, 0.02], [0.01, 0.99],
        [0.4, 0.3, 0.1, 0.1, 0.05, 0.05], [1] * 7, [0, 1, 0, 2],
        [0.9] + [0.005] * 20, [0.6] + [0.04] * 10, [0.7] + [0.05] * 6, [0.45, 0.45] + [0.01] * 10,
    ],
)  # fmt: skip
def test_mixture_counts_are_round_w_n_plus_minus_one_at_every_prefix(weights):
    m = Mixture.from_weights(weights)
    assert_round_w_n_plus_minus_one(m, weights, 20_000)
    for start in [0, 1, 777, 10**12]:
        block = m.sources(start, start + 64)
        delta = np.subtract(m.counts(start + 64), m.counts(start))
        assert np.array_equal(np.bincount(block, minlength=len(weights)), delta)


def test_a_heavy_source_among_many_keeps_round_w_n_plus_minus_one():
    """One apportionment of all 21 sources let weight 0.9 fall 8.5 below w n (275 of 315, as a
    review measured); grouping the light sources keeps it at round(w n) +- 1."""
    m = Mixture.from_weights([0.9] + [0.005] * 20)
    assert m.counts(315)[0] == 284 == round(0.9 * 315)
    assert m.groups([f"s{i}" for i in range(21)]) is not None and m.max_error < 1
    assert Mixture.from_weights([0.9] + [0.005] * 20).groups(list("abcdefghijklmnopqrstu")) == (
        m.groups(list("abcdefghijklmnopqrstu"))
    )  # the same groups in every process (part of the pipeline's identity)


def test_random_weightings_keep_the_contract():
    """Weightings of 5 to 60 sources, flat, skewed and heavy-tailed: the bound each mixture
    proves is below 3/2, and the counts keep round(w n) +- 1 at every prefix."""
    rng = np.random.default_rng(7)
    for trial in range(60):
        k = int(rng.integers(5, 61))
        w = [rng.dirichlet([0.3] * k), rng.pareto(1.0, k) + 1e-3, rng.dirichlet([3.0] * k)][
            trial % 3
        ].tolist()
        m = Mixture.from_weights(w)
        assert m.max_error < 1.5, w
        if trial % 6 == 0:
            assert_round_w_n_plus_minus_one(m, w, 4000)
        far = 10**12 + trial
        block = m.sources(far, far + 300)
        assert np.array_equal(
            np.bincount(block, minlength=k), np.subtract(m.counts(far + 300), m.counts(far))
        )


def test_numpy_integer_sample_numbers_are_exact():
    """n * weight overflowed int64 for a NumPy n >= 2**33 (a hang: the fill loop then ran
    about n times); NumPy integers are taken as Python ints."""
    m = Mixture.from_weights([0.5, 0.3, 0.2])
    n = 2**40 + 3
    assert m.counts(np.int64(n)) == m.counts(n)
    before = m.counts(np.int64(n))
    np.testing.assert_array_equal(
        m.sources_from(np.int64(n), np.int64(n + 64), tuple(np.int64(b) for b in before)),
        m.sources(n, n + 64),
    )
    with pytest.raises(TypeError):
        m.counts(3.0)


def test_a_mixture_whose_bound_misses_the_contract_says_so(monkeypatch, caplog):
    """No weighting met misses 3/2, so the warning is shown against a stricter contract."""
    import grain_rox._order._mixture as mixture_module

    monkeypatch.setattr(mixture_module, "CONTRACT", Fraction(1, 2))
    with caplog.at_level(logging.WARNING, logger="grain_rox._order._mixture"):
        m = Mixture.from_weights([0.7] + [0.05] * 6)
        assert m.counts(7)[0] == 5
    bound = f"{float(m.max_error):.3f}"
    assert f"counts stay within {bound} of w*n, wider than the 0.5 that keeps" in caplog.text


def test_mixtures_one_apportionment_keeps_stay_bit_for_bit():
    """Where one Sainte-Laguë apportionment of all sources already keeps every count round(w n)
    +- 1 (two to four sources always), the order is that sequence, as grain_rox served it
    before sources were grouped (pinned), so those runs' states restore. Far out the weights
    are now exact: 8:6:2:2:1:1 repeats every 20 samples at 10**12 too, where the 2**30ths
    they were quantised to had strayed into another sequence (its counts off the contract)."""
    weights = [0.4, 0.3, 0.1, 0.1, 0.05, 0.05]
    six = Mixture.from_weights(weights)
    assert six.groups("abcdef") is None
    period = [0, 1, 0, 2, 1, 3, 0, 1, 0, 4, 5, 0, 1, 0, 2, 1, 3, 0, 1, 0]
    assert six.sources(0, 40).tolist() == period * 2
    assert six.sources(10**12, 10**12 + 20).tolist() == period
    assert Mixture(legacy_weights(weights)).sources(10**12, 10**12 + 20).tolist() == [
        0, 3, 0, 1, 0, 1, 2, 0, 1, 0, 3, 0, 1, 0, 4, 5, 1, 2, 0, 1,
    ]  # fmt: skip
    four = Mixture.from_weights([0.9, 0.05, 0.03, 0.02])
    assert four.groups("abcd") is None
    assert (
        four.sources(0, 40).tolist()
        == [0] * 9 + [1] + [0] * 6 + [2] + [0] * 8 + [3] + [0] * 4 + [1] + [0] * 9
    )


def test_pipeline_rows_follow_the_mixture_exactly(sources):
    pipe = TokenPipeline(
        sources,
        seq_len=16,
        global_batch_size=10,
        seed=1,
        weights={"a": 0.5, "b": 0.3, "c": 0.2},
        chunk_tokens=500,
    )
    ds = pipe.map_dataset()
    src = pipe.batch_source()
    served = np.zeros(3, np.int64)
    for k in range(200):
        batch = ds[k]
        rows = source_of(batch["inputs"][:, 0])
        np.testing.assert_array_equal(rows, src.sources_of(k))
        served += np.bincount(rows, minlength=3)
        n = (k + 1) * 10
        assert np.abs(served - np.round(np.array([0.5, 0.3, 0.2]) * n)).max() <= 1
    # Every row comes from one source only, and its targets continue its inputs.
    batch = ds[3]
    assert np.all(source_of(batch["inputs"]) == source_of(batch["inputs"][:, :1]))
    np.testing.assert_array_equal(batch["targets"][:, :-1], batch["inputs"][:, 1:])


FIVE = {"a": 0.7, "b": 0.075, "c": 0.075, "d": 0.075, "e": 0.075}  # one apportionment: 1.55


@pytest.fixture(scope="module")
def five_sources(make_rox):
    """Five corpora whose tokens encode (source, position), mixed with :data:`FIVE`, where
    one apportionment of all sources would let a count stray 1.55 from w n."""
    return {
        name: make_rox(
            f"five_{name}",
            [np.arange(k * 10_000_000, k * 10_000_000 + 20_000, dtype=np.uint32)],
            block_size=4000,
            manifest=False,
        )
        for k, name in enumerate(FIVE)
    }


def test_pipeline_with_grouped_sources_keeps_round_w_n_and_restores(five_sources):
    pipe = TokenPipeline(five_sources, seq_len=16, global_batch_size=16, seed=1,
                         weights=FIVE, chunk_tokens=500)  # fmt: skip
    assert pipe.describe()["phases"][0]["mixing"] == ["a", [["b", "d"], ["c", "e"]]]
    ds, src = pipe.map_dataset(), pipe.batch_source()
    served = np.zeros(5, np.int64)
    for k in range(150):
        rows = source_of(ds[k]["inputs"][:, 0])
        np.testing.assert_array_equal(rows, src.sources_of(k))
        served += np.bincount(rows, minlength=5)
        ideal = np.array(list(FIVE.values())) * (k + 1) * 16
        assert np.abs(served - np.round(ideal)).max() <= 1, k
    with MultiHostDataLoadIterator(pipe) as it:
        for _ in range(3):
            next(it)
        state = json.loads(it.get_state())
        expected = [np.asarray(next(it)["inputs"]) for _ in range(3)]
    with MultiHostDataLoadIterator(pipe) as again:
        again.set_state(state)
        for want in expected:
            np.testing.assert_array_equal(np.asarray(next(again)["inputs"]), want)
    # A state saved when one apportionment ordered this mixture (no "mixing") is refused.
    del state["pipeline"]["phases"][0]["mixing"]
    with (
        MultiHostDataLoadIterator(pipe) as old,
        pytest.raises(
            ValueError,
            match=r"phase 0, which ran from step 0, changed \(mixing by one apportionment of all "
            r"sources -> by groups \['a', \[\['b', 'd'\], \['c', 'e'\]\]\]",
        ),
    ):
        old.set_state(state)


def test_mix_datasets_with_grouped_sources_names_the_groups():
    import grain

    from grain_rox import mix_datasets

    data = {n: grain.MapDataset.range(k * 1000, k * 1000 + 100) for k, n in enumerate(FIVE)}
    ds = mix_datasets(data, FIVE, seed=0, length=400)
    counts = np.cumsum(np.eye(5, dtype=np.int64)[[int(v) // 1000 for v in ds]], axis=0)
    ideal = np.array(list(FIVE.values())) * np.arange(1, 401)[:, None]
    assert np.abs(counts - np.round(ideal)).max() <= 1
    it = iter(ds.to_iter_dataset())
    next(it)
    state = it.get_state()
    assert state["identity"]["mixing"] == [["a", [["b", "d"], ["c", "e"]]]]
    del state["identity"]["mixing"]  # as saved before sources were grouped
    with pytest.raises(ValueError, match=r"mixing: saved None -> now \[\['a'"):
        iter(ds.to_iter_dataset()).set_state(state)
    state = it.get_state()
    assert state["identity"]["apportioned"] == "exact weights"
    del state["identity"]["apportioned"]  # as saved while weights were quantised
    with pytest.raises(ValueError, match="apportioned: saved None -> now 'exact weights'"):
        iter(ds.to_iter_dataset()).set_state(state)


def served_positions(pipe: TokenPipeline, steps: range, name: str) -> list[np.ndarray]:
    ds = pipe.map_dataset()
    out = []
    for k in steps:
        x = ds[k]["inputs"]
        rows = x[source_of(x[:, 0]) == list(OFFSETS).index(name)]
        out.extend(rows)
    return out


def test_phases_change_shapes_without_replaying_or_skipping(sources):
    phases = [
        Phase(steps=30, batch_size=8, seq_len=16, weights={"a": 0.5, "b": 0.5}),
        Phase(steps=25, batch_size=4, seq_len=32, weights={"a": 0.2, "b": 0.4, "c": 0.4}),
        Phase(steps=None, batch_size=6, seq_len=24, weights={"a": 1.0}),
    ]
    pipe = TokenPipeline(sources, phases=phases, seed=3, chunk_tokens=1000, lanes=8, order="lanes")
    ds = pipe.map_dataset()
    assert [ds[k]["inputs"].shape for k in (0, 29, 30, 54, 55, 500)] == [
        (8, 16),
        (8, 16),
        (4, 32),
        (4, 32),
        (6, 24),
        (6, 24),
    ]
    src = pipe.batch_source()
    order = src.orders[0]  # source "a"
    # Everything "a" served over the three phases: 1,920 + 640 + 345 * 144 = 52,240 tokens,
    # inside its first epoch (8 lanes of 7,500 tokens, each keeping 33 tokens of room).
    windows = served_positions(pipe, range(0, 400), "a")
    owned = np.concatenate(windows)
    assert owned.size == 1920 + 640 + 345 * 144
    assert np.unique(owned).size == owned.size, "a token was served twice"
    # No skip: map each served token back to (lane, cursor); per lane the cursors used form
    # one contiguous range from 0 (the tail of the lane is the only unused part).
    c = order.chunk_tokens
    perm = order.chunk_permutation(0)
    epoch_pos = perm.inverse(owned // c) * c + owned % c
    assert epoch_pos.max() < order.stream_tokens  # still epoch 0
    lane = epoch_pos // order.lane_tokens
    cursor = epoch_pos % order.lane_tokens
    for lane_id in range(order.lanes):
        used = np.sort(cursor[lane == lane_id])
        assert used.size and np.array_equal(used, np.arange(used.size)), f"lane {lane_id} gap"
    # One more step of phase 3 per lane and "a" would start its second epoch: the next epoch
    # serves tokens again, in a new order.
    later = np.concatenate(served_positions(pipe, range(400, 460), "a"))
    assert np.intersect1d(later, owned).size > 0


def test_resume_deep_in_a_five_phase_three_source_schedule_is_o1(sources):
    phases = [
        Phase(steps=10**8, batch_size=8, seq_len=16, weights={"a": 1, "b": 1}),
        Phase(steps=3 * 10**8, batch_size=4, seq_len=32, weights={"a": 1, "b": 1, "c": 2}),
        Phase(steps=10**8, batch_size=8, seq_len=8, weights={"c": 1}),
        Phase(steps=2 * 10**8, batch_size=2, seq_len=16, weights={"a": 3, "c": 1}),
        Phase(steps=None, batch_size=8, seq_len=32, weights={"a": 1, "b": 1, "c": 1}),
    ]
    pipe = TokenPipeline(sources, phases=phases, seed=0, chunk_tokens=1000)
    fresh = pipe.batch_source()
    start = time.perf_counter()
    late = pipe.batch_source(first_step=10**9)[0]
    assert time.perf_counter() - start < 2.0  # construction included; the lookup itself is O(1)
    start = time.perf_counter()
    again = fresh[10**9]
    assert time.perf_counter() - start < 0.2
    for key in late:
        np.testing.assert_array_equal(late[key], again[key])
    assert late["inputs"].shape == (8, 32)


def test_iterator_changes_shape_at_the_phase_boundary_with_prefetch(sources):
    phases = [
        Phase(steps=3, batch_size=16, seq_len=8, weights={"a": 1}),
        Phase(steps=3, batch_size=8, seq_len=16, weights={"b": 1}),
    ]
    pipe = TokenPipeline(sources, phases=phases, seed=0, chunk_tokens=1000)
    with MultiHostDataLoadIterator(pipe, prefetch=4) as it:
        shapes = [next(it)["inputs"].shape for _ in range(6)]
        with pytest.raises(StopIteration):
            next(it)
    assert shapes == [(16, 8)] * 3 + [(8, 16)] * 3
    assert len(MultiHostDataLoadIterator(pipe)) == 6


def test_appending_a_phase_restores_but_rewriting_history_is_refused(sources):
    first = [Phase(steps=None, batch_size=8, seq_len=16, weights={"a": 0.5, "b": 0.5})]
    pipe = TokenPipeline(sources, phases=first, seed=0, chunk_tokens=1000, max_seq_len=32)
    it = MultiHostDataLoadIterator(pipe)
    for _ in range(5):
        next(it)
    state = it.get_state()
    it.close()
    # Change the mixture from step 5 on: phase 0 is cut short where it was saved.
    later = [
        Phase(steps=5, batch_size=8, seq_len=16, weights={"a": 0.5, "b": 0.5}),
        Phase(steps=None, batch_size=8, seq_len=32, weights={"c": 1.0}),
    ]
    moved = TokenPipeline(sources, phases=later, seed=0, chunk_tokens=1000, max_seq_len=32)
    resumed = MultiHostDataLoadIterator(moved)
    resumed.set_state(state)
    batch = next(resumed)
    assert batch["inputs"].shape == (8, 32)
    assert set(source_of(np.asarray(batch["inputs"][:, 0])).tolist()) == {2}
    resumed.close()
    # The first five steps must stay as they ran.
    wrong = [
        Phase(steps=3, batch_size=8, seq_len=16, weights={"a": 0.5, "b": 0.5}),
        Phase(steps=None, batch_size=8, seq_len=16, weights={"c": 1.0}),
    ]
    bad = MultiHostDataLoadIterator(
        TokenPipeline(sources, phases=wrong, seed=0, chunk_tokens=1000, max_seq_len=32)
    )
    with pytest.raises(ValueError, match="phase 0 already ran 5 steps but now has only 3"):
        bad.set_state(state)


@pytest.mark.parametrize("longer", [Phase(9, 8, 16), Phase(None, 8, 16)])
def test_a_phase_that_ended_at_the_saved_step_may_go_on_as_a_running_one_may(sources, longer):
    """Saved where phase 0 ends (nothing of phase 1 served), phase 0 may run longer (or
    endless), as it may when saved one step earlier: the batches served are the same, and the
    next is the new schedule's own, exactly."""
    ran = Phase(4, 8, 16, {"a": 0.5, "b": 0.5})
    pipe = TokenPipeline(sources, phases=[ran, Phase(None, 8, 32, {"c": 1})], seed=0)
    longer = dataclasses.replace(longer, weights=ran.weights)
    then = [Phase(None, 8, 32, {"c": 1})] if longer.steps is not None else []
    grown = TokenPipeline(sources, phases=[longer, *then], seed=0)
    for step in (3, 4):
        with MultiHostDataLoadIterator(pipe) as it:
            for _ in range(step):
                next(it)
            state = it.get_state()
        with MultiHostDataLoadIterator(grown) as it:
            it.set_state(state)
            batch = {k: np.asarray(v) for k, v in next(it).items()}
        expected = grown.map_dataset()[step]
        assert all(np.array_equal(batch[k], expected[k]) for k in expected), step
        assert batch["inputs"].shape == (8, 16)
    shorter = TokenPipeline(sources, phases=[Phase(3, 8, 16, ran.weights)], seed=0)
    with pytest.raises(ValueError, match="phase 0 already ran 4 steps but now has only 3"):
        MultiHostDataLoadIterator(shorter).set_state(state)


def test_estimate_steps_and_bad_schedules(sources):
    pipe = TokenPipeline(
        sources["a"], seq_len=16, global_batch_size=8, chunk_tokens=1000, num_epochs=1
    )
    assert pipe.estimate_steps(seq_len=16, batch_size=8) == pipe.num_batches
    with pytest.raises(ValueError, match="gives no weights"):
        TokenPipeline(sources, seq_len=16, global_batch_size=8)
    with pytest.raises(ValueError, match=r"unknown sources \['d'\]"):
        TokenPipeline(sources, seq_len=16, global_batch_size=8, weights={"d": 1})
    with pytest.raises(ValueError, match="only the last phase may be endless"):
        TokenPipeline(sources["a"], phases=[Phase(None, 4, 8), Phase(3, 4, 8)])
    with pytest.raises(ValueError, match="not both"):
        TokenPipeline(sources["a"], seq_len=8, phases=[Phase(None, 4, 8)])
    with pytest.raises(ValueError, match="num_epochs applies to one source"):
        TokenPipeline(sources, seq_len=8, global_batch_size=4, weights={"a": 1}, num_epochs=1)


def test_schedule_history_rules():
    from grain_rox._order._curriculum import history_problems as _history_problems

    def ph(*steps, seq=16):
        return [Phase(s, 8, seq, {"a": 1}).describe() for s in steps]

    assert _history_problems(ph(30, 30), ph(30, 30), 40) == ""
    assert _history_problems(ph(30, 30), ph(30, 50, 10), 40) == ""  # the running phase grows
    assert _history_problems(ph(30, 30), ph(30, 10, 10), 40) == ""  # cut short where it stands
    assert _history_problems(ph(30, 30), ph(20, 40), 40) == (
        "phase 0 ran its 30 steps but now has 20"
    )
    assert _history_problems(ph(30, 30), ph(30, 5), 40) == (
        "phase 1 already ran 10 steps but now has only 5"
    )
    assert _history_problems(ph(None), ph(5, None), 5) == ""
    assert "changed (seq_len 16 -> 32)" in _history_problems(ph(30, 30), ph(30, seq=32), 40)
    assert _history_problems(ph(30, 30), ph(30, 30), 30) == ""
    assert _history_problems(ph(30, 30), ph(40, 30), 30) == ""  # it ended here: it may go on
    assert _history_problems(ph(30, 30), ph(None), 30) == ""
    assert _history_problems(ph(30, 30), ph(40, 30), 31) == (
        "phase 0 ran its 30 steps but now has 40"
    )


def test_mix_datasets_for_users_own_grain_pipelines():
    import grain

    from grain_rox import mix_datasets

    a, b = grain.MapDataset.range(0, 50), grain.MapDataset.range(1000, 1010)
    ds = mix_datasets({"a": a, "b": b}, {"a": 0.6, "b": 0.4}, seed=5, length=200)
    values = [int(v) for v in ds]
    assert len(values) == 200
    is_b = np.array([v >= 1000 for v in values])
    counts = np.cumsum(is_b)
    assert np.abs(counts - np.round(0.4 * np.arange(1, 201))).max() <= 1
    # "b" has 10 elements: every epoch of it serves each exactly once, in a new order.
    b_values = [v for v in values if v >= 1000]
    epochs = [b_values[i : i + 10] for i in range(0, 80, 10)]
    assert all(sorted(e) == list(range(1000, 1010)) for e in epochs)
    assert len({tuple(e) for e in epochs}) > 1
    # Random access agrees with iteration, and the iterator restores exactly.
    assert [int(ds[i]) for i in (0, 77, 199)] == [values[0], values[77], values[199]]
    it = iter(ds.to_iter_dataset())
    for _ in range(30):
        next(it)
    state = it.get_state()
    again = iter(ds.to_iter_dataset())
    again.set_state(state)
    assert [int(next(again)) for _ in range(5)] == values[30:35]


@pytest.mark.parametrize("weights", [[0.5, 0.3, 0.2], [0.9] + [0.005] * 20])
def test_mix_datasets_selection_in_order_and_out_of_order_agree(weights):
    """Read in order, the selection works out 1,024 elements at a time; out of order, one by
    one: both give every element's (source, own index) as the counts do, across spans and a
    phase change, and a pickled selection starts without its cache."""
    import pickle

    from grain_rox._pipeline._mixing import _PhasedSelection

    mixtures = [Mixture.from_weights(weights), Mixture.from_weights(weights[::-1])]
    selection = _PhasedSelection(mixtures, [2500, 3000])
    in_order = [selection[i] for i in range(5500)]
    shuffled = np.random.default_rng(0).permutation(5500).tolist()
    fresh = pickle.loads(pickle.dumps(selection))
    assert all(not p._spans for p in fresh.phases)
    out_of_order = {i: fresh[i] for i in shuffled}
    assert in_order == [out_of_order[i] for i in range(5500)]
    served = np.zeros(len(weights), np.int64)
    for n, (source, own) in enumerate(in_order):
        assert own == served[source], n  # each source's samples in its own order, none skipped
        served[source] += 1
    assert served.tolist() == np.add(mixtures[0].counts(2500), mixtures[1].counts(3000)).tolist()


def test_mix_datasets_phases_change_weights_and_continue_every_source():
    import grain

    from grain_rox import mix_datasets

    a, b, c = (grain.MapDataset.range(k * 1000, k * 1000 + 60) for k in range(3))
    phases = [(40, {"a": 0.75, "b": 0.25}), (30, {"b": 0.5, "c": 0.5}), (None, {"a": 1.0})]
    ds = mix_datasets({"a": a, "b": b, "c": c}, phases=phases, seed=2, length=100)
    values = [int(v) for v in ds]
    src = np.array([v // 1000 for v in values])
    first, second, third = src[:40], src[40:70], src[70:]
    for seg, w in ((first, [0.75, 0.25, 0]), (second, [0, 0.5, 0.5]), (third, [1, 0, 0])):
        for s in range(3):
            served = np.cumsum(seg == s)
            assert np.abs(served - np.round(w[s] * np.arange(1, seg.size + 1))).max() <= 1
    # Each source continues where it stopped: within its first epoch, nothing repeats.
    for k in range(3):
        mine = [v for v in values if v // 1000 == k]
        assert len(set(mine[:60])) == len(mine[:60])
    a_values = [v for v in values if v < 1000]
    assert len(a_values) == 30 + 30 and len(set(a_values)) == 60
    # Random access agrees with iteration and a restored iterator continues exactly.
    assert [int(ds[i]) for i in (39, 40, 69, 70, 99)] == [values[i] for i in (39, 40, 69, 70, 99)]
    it = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0)))
    for _ in range(65):
        next(it)
    state = it.get_state()
    again = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0)))
    again.set_state(state)
    assert [int(x) for x in again] == values[65:]
    with pytest.raises(ValueError, match="give weights= or phases="):
        mix_datasets({"a": a, "b": b})
    with pytest.raises(ValueError, match=r"only the last phase may be None"):
        mix_datasets({"a": a, "b": b}, phases=[(None, {"a": 1}), (5, {"b": 1})])
    with pytest.raises(ValueError, match="length=50 differs from the phases' 20 samples"):
        mix_datasets({"a": a, "b": b}, phases=[(10, {"a": 1}), (10, {"b": 1})], length=50)


@pytest.mark.parametrize("count", [3, 20])  # 20: more sources than a span keeps counts for
def test_each_sources_rows_of_a_batch_are_consecutive_samples_of_its_order(count):
    """A mixed batch reads each source's rows as one run of its own samples: the rows and the
    first sample that ``step_rows`` gives are those of ``step_samples``, for batches inside
    one cached span, across spans (48 does not divide 4096), across a phase boundary, for a
    process's part of a batch, and with a source that has weight 0 in a phase."""
    from grain_rox._order._curriculum import Schedule

    names = [f"s{i}" for i in range(count)]
    first = {n: float(i + 1) for i, n in enumerate(names)}
    later = {**first, names[1]: 0.0}
    schedule = Schedule([Phase(90, 48, 16, first), Phase(None, 32, 16, later)], names)
    for step in [*range(0, 3), *range(84, 96), 211, 10**6]:
        size = schedule.phases[schedule.phase_of_step(step)].batch_size
        for lo, hi in [(0, size), (8, 24)]:
            _, sources, samples = schedule.step_samples(step, lo, hi)
            got_sources, got_samples, groups = schedule.step_rows(step, lo, hi)
            assert np.array_equal(got_sources, sources)
            assert np.array_equal(got_samples, samples)
            expected = []
            for s in np.unique(sources).tolist():
                rows = np.flatnonzero(sources == s)
                assert np.array_equal(samples[rows], samples[rows[0]] + np.arange(rows.size))
                expected.append((s, rows.tolist(), int(samples[rows[0]])))
            assert [(s, rows.tolist(), f) for s, rows, f in groups] == expected


def test_mixing_keeps_its_bound_at_every_n_with_exact_weights():
    """Weights were quantised to 2**30ths: the counts strayed linearly, past 1 from about
    2**31 samples (1M steps at a global batch of 4096). Exact weights keep the bound at any
    n; the sequences served before stay where those counts still kept it."""
    for weights, n in [
        ([1, 1, 1], 4 * 10**9),  # 1333333336 of 4e9/3 before: 2.67 off
        ([1, 1, 1], 4 * 10**10),
        ([1e-6, 1], 10**12),  # 241 off before
        ([0.9] + [0.005] * 20, 3 * 10**12),
        ([0.5, 0.3, 0.2], 2**61 - 7),
    ]:
        mixture = Mixture.from_weights(weights)
        exact = [Fraction(repr(float(w))) for w in weights]
        total = sum(exact)
        counts = mixture.counts(n)
        assert sum(counts) == n
        worst = max(abs(c - w / total * n) for c, w in zip(counts, exact, strict=True))
        assert worst <= mixture.max_error < Fraction(3, 2), (weights, n, float(worst))
    legacy = Mixture(legacy_weights([1, 1, 1]))
    assert legacy.counts(4 * 10**9) == (1333333336, 1333333332, 1333333332)  # the old drift
    for weights in ([0.5, 0.3, 0.2], [0.7] + [0.05] * 6, [2, 3, 5, 7, 11]):
        old, new = Mixture(legacy_weights(weights)), Mixture.from_weights(weights)
        assert old.groups("abcdefg") == new.groups("abcdefg")
        for start in (0, 12345, 10**6):
            assert (
                old.sources(start, start + 4000).tolist()
                == new.sources(start, start + 4000).tolist()
            )


def test_a_state_saved_with_quantised_weights_resumes_where_its_counts_agree(sources):
    """A MultiHostDataLoadIterator state saved while weights were quantised (its phases do
    not name ``apportioned``) continues exactly where the counts so far are the same under
    both (every realistic step), and is refused, naming the phase, where they differ; a Grain
    dataset state saved so is refused."""
    from grain_rox._order._curriculum import legacy_counts_differ

    weights = {"a": 0.5, "b": 0.3, "c": 0.2}
    pipe = TokenPipeline(sources, seq_len=16, global_batch_size=8, seed=1, weights=weights,
                         chunk_tokens=500)  # fmt: skip
    assert pipe.describe()["phases"][0]["apportioned"] == "exact weights"
    with MultiHostDataLoadIterator(pipe) as it:
        for _ in range(3):
            next(it)
        state = json.loads(it.get_state())
    del state["pipeline"]["phases"][0]["apportioned"]  # as an earlier grain_rox saved it
    ds = pipe.map_dataset()
    with MultiHostDataLoadIterator(pipe) as it:
        it.set_state(json.dumps(state))
        np.testing.assert_array_equal(np.asarray(next(it)["inputs"]), ds[3]["inputs"])
    far = 10**10 // 8  # a step where the quantised counts had strayed
    assert legacy_counts_differ(pipe.schedule, far) == [0]
    state["step"] = far
    with MultiHostDataLoadIterator(pipe) as it, pytest.raises(ValueError) as info:
        it.set_state(json.dumps(state))
    assert "phases [0] mixed by weights quantised to 2**30ths by an earlier grain_rox" in str(
        info.value
    )
    assert str(info.value).endswith("only with the grain_rox release that saved the state")
    iterator = iter(ds.to_iter_dataset())
    next(iterator)
    grain_state = iterator.get_state()
    del grain_state["identity"]["phases"][0]["apportioned"]
    with pytest.raises(ValueError, match="phases"):
        iter(ds.to_iter_dataset()).set_state(grain_state)


def test_exact_ties_are_ordered_the_same_fast_or_seat_by_seat(monkeypatch):
    """Exact weights tie often (5:3:2 every few seats): the order is checked in one
    vectorised pass where int64 holds the products, and must equal the seat-by-seat exact
    re-sort it skips."""
    import grain_rox._order._mixture as mixture_module

    rng = np.random.default_rng(3)
    cases = [[0.5, 0.3, 0.2], [1, 1, 1], [0.4, 0.3, 0.1, 0.1, 0.05, 0.05], [1 / 3, 2 / 3]]
    cases += [np.round(rng.random(int(rng.integers(2, 7))), 2).tolist() for _ in range(40)]
    for weights in cases:
        if not sum(weights):
            continue
        for start in (0, 10**6, 10**12):
            fast = Mixture.from_weights(weights).sources(start, start + 2000)
            with monkeypatch.context() as patched:
                patched.setattr(mixture_module, "_in_order", lambda *_: False)
                slow = Mixture.from_weights(weights).sources(start, start + 2000)
            np.testing.assert_array_equal(fast, slow, err_msg=f"{weights} at {start}")


def test_a_mixture_state_restores_only_onto_its_sources_in_their_order():
    """A source's place in the mapping seeds its shuffle and its selection, so the same
    sources listed in another order make another stream: a state saved on one order is
    refused on the other (it continued with other elements); a state from an earlier
    release, which did not record the order, restores as before."""
    a, b = grain.MapDataset.range(7), grain.MapDataset.range(100, 103)
    weights = {"a": 2, "b": 1}
    ab = mix_datasets({"a": a, "b": b}, weights, length=40)
    ba = mix_datasets({"b": b, "a": a}, weights, length=40)
    assert list(ab) != list(ba)
    it = iter(ab.to_iter_dataset())
    for _ in range(5):
        next(it)
    state = it.get_state()
    expected = [int(next(it)) for _ in range(6)]
    again = iter(ab.to_iter_dataset())
    again.set_state(state)
    assert [int(next(again)) for _ in range(6)] == expected
    with pytest.raises(
        ValueError,
        match=r"cannot restore this mix_datasets state: its data or config changed \(sources: "
        r"saved \['a', 'b'\] -> now \['b', 'a'\]\)",
    ):
        iter(ba.to_iter_dataset()).set_state(state)
    legacy = copy.deepcopy(state)
    identity = next(v for v in legacy.values() if isinstance(v, dict) and "sources" in v)
    del identity["sources"]  # as an earlier release saved it
    older = iter(ab.to_iter_dataset())
    older.set_state(legacy)
    assert [int(next(older)) for _ in range(6)] == expected


@pytest.mark.parametrize(
    "make",
    [
        lambda k: np.arange(5000) + k * (np.arange(5000) % 7 == 3),  # numpy shortens its repr
        lambda k: [(np.arange(3) + i + k * (i == 2500),) for i in range(5000)],  # tuples too
        lambda k: list(range(300_000 + k)),  # past the 100,000 items digested whole
        lambda k: [i + k * (i == 299_999) for i in range(300_000)],  # the last item, sampled
        lambda k: np.array([np.arange(5000) + k * (np.arange(5000) == 2500), None], object),
        # past 256 MiB, sampled: two rows of 192 MiB, the second one rewritten
        lambda k: np.broadcast_to(np.array([[0], [k]], np.int32), (2, 48 << 20)),
    ],
)
def test_a_mixture_state_is_refused_on_other_arrays_and_long_lists(make):
    """A source over a NumPy array was named by numpy's shortened repr, one over a list of
    tuples of arrays by the tuples' shortened reprs, and a list of more than 100,000 items by
    its length alone: a state restored onto other content of the same size."""

    def mix(data):
        sources = {"a": grain.MapDataset.source(data), "b": grain.MapDataset.range(100, 200)}
        return mix_datasets(sources, {"a": 1, "b": 1}).to_iter_dataset(
            grain.ReadOptions(num_threads=0)
        )

    it = iter(mix(make(0)))
    for _ in range(3):
        next(it)
    state = it.get_state()
    again = iter(mix(make(0)))  # equal content, another object: restored
    again.set_state(state)
    with pytest.raises(ValueError, match=r"dataset 'a': saved '\w+\(.*digest=\w+\)' -> now"):
        iter(mix(make(1))).set_state(state)


def test_a_mixture_counts_from_the_end_and_names_bad_weights_and_empty_sources():
    """``ds[-1]`` is the last element, and a negative index counts modulo the length, as for
    Grain's own datasets (it was "n=-1024 must be >= 0"); all-zero weights and an empty source of weight > 0 are refused naming them (they
    were "max() arg is an empty sequence" and a ZeroDivisionError at the first element)."""
    a, b = grain.MapDataset.range(5), grain.MapDataset.range(100, 103)
    mixed = mix_datasets({"a": a, "b": b}, {"a": 1, "b": 1}, length=10)
    assert [mixed[-1], mixed[-10]] == [mixed[9], mixed[0]]
    ten = grain.MapDataset.range(10)  # beyond -len, modulo the length, as Grain's own
    assert [mixed[i] for i in (-11, -25)] == [mixed[ten[i]] for i in (-11, -25)]
    assert [mixed[i] for i in (-11, -25)] == [mixed[9], mixed[5]]
    with pytest.raises(
        ValueError,
        match=r"phase 0 weights \{'a': 0, 'b': 0\} are all 0 \(a missing name has weight 0\); "
        r"give at least one of \['a', 'b'\] a weight above 0",
    ):
        mix_datasets({"a": a, "b": b}, {"a": 0, "b": 0})
    with pytest.raises(
        ValueError,
        match=r"mix_datasets: dataset 'e' has no elements but weight 1\.0 in phase 0; give it "
        r"elements, or weight 0",
    ):
        mix_datasets({"a": a, "e": grain.MapDataset.range(0, 0)}, {"a": 1, "e": 1}, length=4)
    kept = mix_datasets({"a": a, "e": grain.MapDataset.range(0, 0)}, {"a": 1, "e": 0}, length=4)
    assert len(list(kept)) == 4


def test_a_state_over_an_hf_dataset_is_refused_on_other_rows_of_its_shape():
    """An HF ``datasets.Dataset`` was named by its repr (its columns and row count): a
    mixture's or a packing's state restored onto other rows of the same shape. A digest of
    its rows names it now (the same rows in another object restore; HF's own fingerprint is
    random where a map's function cannot be hashed)."""
    datasets = pytest.importorskip("datasets")

    def hf(k: int):
        return datasets.Dataset.from_dict({"ids": [[1 + k, 2, 3, 4]] * 6}).with_format("numpy")

    def mix(data):
        sources = {"a": grain.MapDataset.source(data), "b": grain.MapDataset.range(100, 200)}
        return mix_datasets(sources, {"a": 1, "b": 1}).to_iter_dataset()

    def pack(data):
        return pack_documents(data, seq_len=4, batch_size=2, num_epochs=1, tokens_key="ids")

    def mapped():  # a map HF cannot hash: each call gets a random fingerprint
        connection = sqlite3.connect(":memory:")
        return hf(0).map(lambda row, c=connection: row)

    for make in (mix, pack):
        it = iter(make(hf(0)))
        next(it)
        state = it.get_state()
        iter(make(hf(0))).set_state(state)
        with pytest.raises(ValueError, match=r"saved 'Dataset\(num_rows=6, digest=\w+\)'"):
            iter(make(hf(1))).set_state(state)
        assert mapped()._fingerprint != mapped()._fingerprint
        it = iter(make(mapped()))
        next(it)
        iter(make(mapped())).set_state(it.get_state())  # the same rows: restored


def test_each_source_continues_its_epoch_across_phases_of_other_shapes_and_weights(make_rox):
    """Coverage in the default order: three sources through phases that change seq_len,
    batch size and weights, one source at weight 0 in the middle phase. Within each source's
    first epoch (its own order's epoch-0 samples, taken in the order the batches serve them)
    no token is an input twice (nothing replayed), and the next-token pairs served miss at
    most the documented tail: a window per block and per seq_len change, plus one pair per
    chunk join (nothing skipped: a source that sat out a phase goes on where it stopped).
    Each then starts its second epoch in a fresh order, and the mixture goes on."""
    sizes = {"a": 6000, "b": 4000, "c": 3000}
    sources = {
        name: make_rox(f"cov_{name}", [np.arange(OFFSETS[name], OFFSETS[name] + size,
                                                 dtype=np.uint32)], block_size=400, manifest=False)
        for name, size in sizes.items()
    }  # fmt: skip
    phases = [
        Phase(steps=10, batch_size=8, seq_len=16, weights={"a": 0.5, "b": 0.5}),
        Phase(steps=8, batch_size=4, seq_len=32, weights={"b": 0.3, "c": 0.7}),
        Phase(steps=None, batch_size=6, seq_len=24, weights={"a": 0.5, "b": 0.25, "c": 0.25}),
    ]
    pipe = TokenPipeline(sources, phases=phases, seed=4, chunk_tokens=100)
    ds = pipe.map_dataset()
    rows: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {0: [], 1: [], 2: []}
    for k in range(170):
        batch = ds[k]
        for x, y in zip(batch["inputs"], batch["targets"], strict=True):
            rows[int(source_of(x[0]))].append((x, y))
    assert [len(rows[s]) for s in range(3)] == [40 + 0 + 456, 40 + 10 + 228, 0 + 22 + 228], (
        "rows per source: round(w * n) of each phase"
    )
    for s, name in enumerate(sizes):
        order = pipe.plan.orders[s]
        epochs = order.locate(np.arange(len(rows[s]))).epoch
        first = int(np.count_nonzero(epochs == 0))
        assert 0 < first < len(rows[s]), f"{name}: its first epoch must end inside the test"
        served = [  # the text's own pairs (tokens are positions); a join of holes is none
            a - OFFSETS[name]
            for x, y in rows[s][:first]
            for a, b in zip(x.tolist(), y.tolist(), strict=True)
            if b == a + 1
        ]
        pairs = set(served)
        assert len(pairs) == len(served), f"{name}: a pair served twice in epoch 0"
        longest = max(run.seq_len for run in order.runs)
        bound = (order.num_blocks + 2 * len(order.runs)) * (longest + 1)
        bound += order.stream_tokens // order.chunk_tokens
        lost = order.stream_tokens - 1 - len(pairs)
        assert 0 <= lost <= bound, f"{name}: {lost} pairs of epoch 0 never served (bound {bound})"
        # The mixture goes on: the source's next epoch serves its pairs again, in a fresh
        # order (not epoch 0's order again, where they would come in epoch 0's row order).
        row_of = {
            a - OFFSETS[name]: r
            for r, (x, y) in enumerate(rows[s][:first])
            for a, b in zip(x.tolist(), y.tolist(), strict=True)
            if b == a + 1
        }
        again = [row_of[int(x[0]) - OFFSETS[name]] for x, _ in rows[s][first : first + 30]
                 if int(x[0]) - OFFSETS[name] in row_of]  # fmt: skip
        assert len(again) >= 20, f"{name}: its second epoch does not serve its pairs again"
        assert again != sorted(again), f"{name}: its second epoch repeats the first's order"


def test_mixing_arguments_of_the_wrong_shape_are_named(make_rox):
    """A weight too large for a float was a bare OverflowError; a phase that is no pair was
    "too many values to unpack"; one dataset's weights= beside phases= were dropped."""
    a, b = grain.MapDataset.range(10), grain.MapDataset.range(100, 110)
    huge = {"a": 10**400, "b": 1}
    with pytest.raises(ValueError, match=r"^mix_datasets phase 0 weight of 'a' is an integer of "
                       r"401 digits, too large for a float; pass weights on a smaller scale"):  # fmt: skip
        mix_datasets({"a": a, "b": b}, huge, seed=0, length=4)
    for phase in ((5, {"a": 1}, 3), 5):
        with pytest.raises(ValueError, match=re.escape(
            f"mix_datasets: phases[0] is {phase!r}, not a pair (num_samples, weights)"
        )):  # fmt: skip
            mix_datasets({"a": a, "b": b}, phases=[phase, (None, {"b": 1})], seed=0, length=4)
    with pytest.raises(ValueError, match=r"give weights= or phases=.*, not both"):
        mix_datasets({"a": a}, {"a": 1}, phases=[(None, {"a": 1})], seed=0, length=4)
    path = make_rox("huge_weights", [np.arange(1, 200, dtype=np.uint16)], separator=0)
    with pytest.raises(ValueError, match=r"^phase 0 weight of 'a' is an integer of 401 digits"):
        TokenPipeline({"a": path, "b": path}, seq_len=8, global_batch_size=2, weights=huge)
