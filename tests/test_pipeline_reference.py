"""TokenPipeline against a brute-force reference, over random configs: every feature of every
row, packed or concatenated, mixed and phased, in every layout.

Each corpus's tokens are distinct ids (source ``s`` in ``[s * SPAN, (s + 1) * SPAN)``) but
the EOS, so each served token names its place in the corpus; empty and one-token documents,
long documents, EOS ids equal to the packing's pad token 0 or not (0 then a real token) and
write pad ids equal to the EOS or to a real token are drawn. The reference checks, row by
row: targets are the inputs shifted; a segment is a stretch of one document's text (EOS only
last), numbered 1, 2, ... with positions from 0; packed padding is a suffix of 0 tokens with
segment and position 0, never a target; a trained pair is the corpus's next-token pair (in
packed rows never EOS -> next); no pair twice in an epoch, and one epoch serves every pair
but the documented tail. Mixing counts are round(w n) +- 1 in every phase; a restore at a
phase boundary continues the same batches.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from grain_rox import Phase, TokenPipeline, unpack_windows, write_rox

SPAN = 10_000_000
KEYS = ("inputs", "targets", "inputs_segmentation", "inputs_position", "targets_segmentation",
        "targets_position")  # fmt: skip


class _Corpus:
    def __init__(self, rng: np.random.Generator, s: int, eos: int, path: str, pad: str) -> None:
        kinds = rng.random(int(rng.integers(150, 300)))
        lengths = np.where(
            kinds < 0.06, 0, np.where(kinds < 0.12, 1, rng.integers(2, 90, kinds.size))
        )
        values = np.arange(s * SPAN + 100, s * SPAN + 100 + lengths.sum(), dtype=np.uint32)
        if eos != 0 and s == 0:
            values[rng.integers(values.size)] = 0  # a real token 0, the packed rows' pad token
        docs = np.split(values, np.cumsum(lengths)[:-1])
        pad_id = {"eos": eos, "real": int(values[0]), "default": None}[pad]
        write_rox(docs, path, separator=eos, dtype=np.uint32, block_size=256,
                  **({} if pad_id is None else {"pad_id": pad_id}))  # fmt: skip
        self.eos, self.path = eos, path
        self.stream = np.concatenate([np.append(d, eos) for d in docs]).astype(np.int64)
        self.where = {v: i for i, v in enumerate(self.stream.tolist()) if v != eos}


def _check_row(row, corpora, packed: bool, pairs: dict, where: str) -> int | None:
    """Check one row against the reference (see the module doc); add its trained pairs (by
    source: input positions, None where EOS -> EOS cannot be placed); return its source."""
    inp, tgt, seg, pos, tseg, tpos = row
    assert np.array_equal(tgt[:-1], inp[1:]) and np.array_equal(pos, tpos), where
    live = inp.size
    if packed and (seg == 0).any():
        live = int(np.flatnonzero(seg == 0)[0])
        assert not seg[live:].any() and not pos[live:].any() and not inp[live:].any(), where
        assert not tseg[max(live - 1, 0) :].any(), where
    assert live == inp.size or packed, where
    if live == 0:
        return None
    starts = np.r_[True, np.diff(seg[:live]) == 1]
    assert seg[0] == 1 and np.isin(np.diff(seg[:live]), (0, 1)).all(), where
    assert np.array_equal(pos[:live], np.arange(live) - np.maximum.accumulate(np.where(starts, np.arange(live), 0))), where  # fmt: skip
    eos_ids = {c.eos for c in corpora}
    sources = {v // SPAN for v in inp[:live].tolist() if v not in eos_ids}
    assert len(sources) <= 1, f"{where}: a row of several sources"
    if not sources:
        return None  # EOS tokens alone: nothing to place
    s = sources.pop()
    corpus = corpora[s]
    previous = None
    for i in range(live):
        token, nxt = int(inp[i]), int(tgt[i])
        same = i + 1 < live and not starts[i + 1]
        if token != corpus.eos:
            p = corpus.where[token]
        elif i and not starts[i] and previous is not None:
            p = previous + 1  # an EOS ends the text before it in its segment
        elif same and nxt != corpus.eos:
            p = corpus.where[nxt] - 1
        else:
            p = None
        assert p is None or corpus.stream[p] == token, where
        assert not (same and token == corpus.eos), f"{where}: a segment goes on after EOS"
        if same:
            assert p is not None and corpus.stream[p + 1] == nxt, f"{where}: col {i}"
        if tseg[i]:
            assert tseg[i] == seg[i], where
            assert p is None or corpus.stream[p + 1] == nxt, f"{where}: col {i} trains a false pair"
            assert not (packed and token == corpus.eos), f"{where}: packed EOS -> next trained"
            pairs.setdefault(s, []).append(p)
        previous = p
    return s


@pytest.mark.parametrize("seed", range(10))
def test_rows_match_a_brute_force_reference(tmp_path, seed, caplog):
    caplog.set_level(logging.ERROR, logger="grain_rox")  # (restored after the test)
    rng = np.random.default_rng(seed)
    packing = [None, "best_fit", "first_fit"][seed % 3]
    eos = int(rng.choice([0, 1, 2**20]))
    n_src = int(rng.choice([1, 2, 3]))
    pad = str(rng.choice(["eos", "real", "default"]))
    corpora = [_Corpus(rng, s, eos, str(tmp_path / f"s{s}.rox"), pad) for s in range(n_src)]
    names = [f"s{s}" for s in range(n_src)]
    one_epoch = n_src == 1 and seed % 2 == 0
    phases = []
    for _ in range(1 if one_epoch else int(rng.integers(2, 4))):
        w = rng.random(n_src) * (rng.random(n_src) > 0.25)  # zero weights among them
        w[rng.integers(n_src)] += 0.1  # never all 0
        weights = dict(zip(names, w.tolist(), strict=True)) if n_src > 1 else None
        steps, batch_size, seq_len = (int(rng.integers(*r)) for r in ((3, 15), (1, 7), (2, 60)))
        phases.append(Phase(steps, batch_size, seq_len, weights))
    last = phases[-1]
    phases[-1] = Phase(None, last.batch_size, last.seq_len, last.weights)
    paths = [c.path for c in corpora]
    sources = dict(zip(names, paths, strict=True)) if n_src > 1 else paths[0]
    common = {"seed": seed, "chunk_tokens": 512, "block_tokens": 2048, "packing": packing}
    if one_epoch:
        ph = phases[0]
        pipe = TokenPipeline(sources, seq_len=ph.seq_len, global_batch_size=ph.batch_size, num_epochs=1, **common)  # fmt: skip
    else:
        pipe = TokenPipeline(sources, phases=phases, **common)
    steps = pipe.num_batches if one_epoch else sum(p.steps or 25 for p in phases)
    ds = pipe.map_dataset()
    layouts = {k: pipe.with_layout(k).map_dataset() for k in ("tokens", "windows")}
    source = pipe.batch_source()
    pairs: dict[int, list] = {}
    drawn: dict[int, list] = {}
    for k in range(steps):
        batch = ds[k]
        for name, other in layouts.items():
            got = pipe.unpack(other[k]) if name == "tokens" else unpack_windows(other[k])
            assert all(np.array_equal(got[key], batch[key]) for key in KEYS), (name, k)
        arrays = [np.asarray(batch[key], np.int64) for key in KEYS]
        expected = source.sources_of(k)
        for r in range(arrays[0].shape[0]):
            s = _check_row(
                [a[r] for a in arrays], corpora, packing is not None, pairs, f"step {k} row {r}"
            )
            assert s is None or n_src == 1 or s == expected[r], (k, r)
        drawn.setdefault(pipe.schedule.phase_of_step(k), []).extend(expected.tolist())
    for p, rows in drawn.items():  # mixing: round(w n) +- 1 at every n of every phase
        if n_src > 1:
            w = np.asarray([phases[p].weights[n] for n in names])
            counts = np.cumsum(np.eye(n_src)[rows], axis=0)
            ideal = w / w.sum() * np.arange(1, len(rows) + 1)[:, None]
            assert np.abs(counts - np.round(ideal)).max() <= 1, p
    for s, served in pairs.items():  # no pair twice (these steps stay inside one epoch)
        known = [p for p in served if p is not None]
        assert len(known) == len(set(known)), f"source {s} serves a pair twice"
    if one_epoch:  # every pair inside a chunk, but the documented tails
        corpus, order = corpora[0], pipe.plan.orders[0]
        chunk = order.chunk_tokens
        n = corpus.stream.size // chunk * chunk
        p = np.arange(n)
        want = p[(p % chunk != chunk - 1) & ((corpus.stream[:n] != eos) if packing else True)]
        eos_eos = (corpus.stream[want] == eos) & (corpus.stream[want + 1] == eos)
        missing = np.setdiff1d(want[~eos_eos], [q for q in pairs.get(0, []) if q is not None])
        ph = phases[0]
        tail = (order.windows_per_epoch % ph.batch_size) * ph.seq_len + (0 if packing else ph.seq_len * order.num_blocks)  # fmt: skip
        assert missing.size <= tail, missing[:10]
    for k in {0, *np.cumsum([p.steps for p in phases[:-1]]).tolist()}:  # restores
        it = iter(ds)
        for _ in range(k):
            next(it)
        state, want_next = it.get_state(), [next(it) for _ in range(2)]
        again = iter(pipe.map_dataset())
        again.set_state(state)
        for a, b in zip(want_next, [next(again) for _ in range(2)], strict=True):
            assert all(np.array_equal(a[key], b[key]) for key in KEYS), k
