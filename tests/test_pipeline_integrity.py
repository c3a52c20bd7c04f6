"""Exact or loud, for the pipeline side: pack_documents serves every token of long documents
(or counts what the user chose to drop), mix_datasets/pack_documents states refuse other data
or config naming the change, TokenPipeline steps past the end are errors (not an early end of
the training loop), bad argument types are refused, and mixing tokenizers is an error."""

from __future__ import annotations

import collections
import itertools
import json
import logging
import os
import pickle
import subprocess
import sys

import grain
import numpy as np
import pytest
from _corpora import unsealed

from grain_rox import (
    MultiHostDataLoadIterator,
    NumpySource,
    Phase,
    RoxDocumentSource,
    RoxTokenSource,
    TokenPipeline,
    mix_datasets,
    pack_documents,
    write_rox,
)

LENGTHS = (3, 12, 5, 9, 30, 2, 17, 8)  # documents of n tokens; several longer than seq_len + 1


def token_docs() -> list[np.ndarray]:
    """Document ``i`` holds ``1000 * (i + 1) + arange(n)``: every token names its document
    and position, so a served token can be traced back exactly."""
    return [1000 * (i + 1) + np.arange(n, dtype=np.int32) for i, n in enumerate(LENGTHS)]


def served_segments(batches) -> list[tuple[list[int], list[int]]]:
    """(inputs, targets) of every packed segment, checking positions count from 0."""
    out = []
    for b in batches:
        for row in range(b["inputs"].shape[0]):
            seg = b["inputs_segmentation"][row]
            for s in np.unique(seg[seg > 0]):
                sel = seg == s
                np.testing.assert_array_equal(b["inputs_position"][row][sel], np.arange(sel.sum()))
                np.testing.assert_array_equal(b["targets_segmentation"][row][sel], seg[sel])
                out.append((b["inputs"][row][sel].tolist(), b["targets"][row][sel].tolist()))
    return out


# ---- item 4: nothing dropped silently --------------------------------------------------------
@pytest.mark.parametrize("method", ["best_fit", "first_fit"])
def test_split_serves_every_token_of_every_document_exactly_once(method):
    docs = token_docs()
    ds = pack_documents(
        grain.MapDataset.source(docs),
        seq_len=8,
        batch_size=1,
        num_epochs=1,
        method=method,
        num_packing_bins=3,
        seed=4,
    )
    segments = served_segments(ds)
    inputs = collections.Counter(t for i, _ in segments for t in i)
    targets = collections.Counter(t for _, t in segments for t in t)
    assert inputs == collections.Counter(t for d in docs for t in d[:-1].tolist())
    assert targets == collections.Counter(t for d in docs for t in d[1:].tolist())
    for i, t in segments:  # each piece is a run of next-token pairs of one document
        assert len(i) <= 8 and t == [x + 1 for x in i] and len({x // 1000 for x in i}) == 1
    # the 30-token document became pieces of 8, 8, 8 and 5 pairs
    pieces = sorted(len(i) for i, _ in segments if i[0] // 1000 == 5)
    assert pieces == [5, 8, 8, 8]
    assert ds.packing_stats.documents_split == 3  # 12, 30 and 17 tokens
    assert ds.packing_stats.tokens_dropped == 0


def test_truncate_drops_exactly_the_tail_and_counts_it(caplog):
    docs = token_docs()
    with caplog.at_level(logging.WARNING, logger="grain_rox"):
        ds = pack_documents(
            docs, seq_len=8, batch_size=1, num_epochs=1, shuffle=False, long_documents="truncate"
        )
        segments = served_segments(ds)
    assert sorted(i for i, _ in segments) == sorted(d[:-1][:8].tolist() for d in docs)
    assert sorted(t for _, t in segments) == sorted(d[1:][:8].tolist() for d in docs)
    stats = ds.packing_stats
    assert (stats.documents_truncated, stats.tokens_dropped) == (3, (12 - 9) + (30 - 9) + (17 - 9))
    assert "document 1 has 12 tokens; its last 3 are dropped" in caplog.text


def test_error_names_the_document_its_length_and_the_fix():
    ds = pack_documents(
        token_docs(), seq_len=8, batch_size=1, num_epochs=1, shuffle=False, long_documents="error"
    )
    with pytest.raises(
        ValueError,
        match=r"pack_documents: document 1 has 12 tokens, more than the 9 a row of seq_len=8 "
        r"holds, and long_documents='error'; pass long_documents='split'",
    ):
        list(ds)


def test_records_of_inputs_and_targets_are_split_too():
    """HF-style {"inputs", "targets"} records longer than seq_len (Grain's packer would
    raise on them) are split at the same places as token documents."""
    records = [{"inputs": d[:-1], "targets": d[1:]} for d in token_docs()]
    from_records = served_segments(
        pack_documents(records, seq_len=8, batch_size=1, num_epochs=1, shuffle=False)
    )
    from_tokens = served_segments(
        pack_documents(token_docs(), seq_len=8, batch_size=1, num_epochs=1, shuffle=False)
    )
    assert from_records == from_tokens


def test_rox_documents_split_truncate_or_error_like_pack_documents(make_rox, caplog):
    docs = [d.astype(np.uint16) for d in token_docs()]
    path = make_rox("d", docs, separator=0, block_size=64)
    with_eos = [np.concatenate([d, [0]]).astype(np.int32) for d in docs]
    split = RoxDocumentSource(path, seq_len=8)
    pieces = [
        (split[i]["inputs"].tolist(), split[i]["targets"].tolist()) for i in range(len(split))
    ]
    packed = served_segments(
        pack_documents(with_eos, seq_len=8, batch_size=1, num_epochs=1, shuffle=False)
    )
    assert sorted(pieces) == sorted(packed)  # the same pieces, whichever splits them
    with caplog.at_level(logging.WARNING, logger="grain_rox"):
        cut = RoxDocumentSource(path, seq_len=8, long_documents="truncate")
        assert len(cut) == len(docs)
    # with EOS: 13, 10, 31 and 18 tokens, 9 kept of each
    assert (cut.documents_truncated, cut.tokens_dropped) == (4, 4 + 1 + 22 + 9)
    assert "4 of 8 documents are longer than 9 tokens; 36 tokens are dropped" in caplog.text
    kept = sorted(cut[i]["inputs"].tolist() + cut[i]["targets"][-1:].tolist() for i in range(8))
    assert kept == sorted(d[:9].tolist() for d in with_eos)
    with pytest.raises(ValueError, match=r"document 1 has 13 tokens, more than the 9 a row"):
        len(RoxDocumentSource(path, seq_len=8, long_documents="error"))


# ---- item 2: restores check the data and config ---------------------------------------------
def mixture(**changes):
    config = {
        "datasets": {"a": grain.MapDataset.range(50), "b": grain.MapDataset.range(100, 130)},
        "weights": {"a": 0.7, "b": 0.3},
        "seed": 3,
        "length": 40,
    }
    config.update(changes)
    return mix_datasets(config.pop("datasets"), **config)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"datasets": {"a": grain.MapDataset.range(51), "b": grain.MapDataset.range(100, 130)}},
         r"dataset 'a': saved 'RangeMapDataset\(start=0, stop=50, step=1\)' -> now "
         r"'RangeMapDataset\(start=0, stop=51, step=1\)'"),
        ({"weights": {"a": 0.5, "b": 0.5}}, r"phases: saved \[\[40, \{'a': 0.7, 'b': 0.3\}\]\]"),
        ({"seed": 4}, r"seed: saved 3 -> now 4"),
        ({"length": 41}, r"length: saved 40 -> now 41"),
        ({"weights": None, "phases": [(10, {"a": 1}), (None, {"b": 1})]}, r"phases: saved"),
    ],
)  # fmt: skip
def test_mix_datasets_state_refuses_another_mixture(changes, named):
    it = iter(mixture())
    for _ in range(5):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(5)]
    again = iter(mixture())
    again.set_state(json.loads(json.dumps(state)))  # as Grain's checkpoint handler does
    assert [next(again) for _ in range(5)] == expected
    with pytest.raises(ValueError, match="cannot restore this mix_datasets state: .*" + named):
        iter(mixture(**changes)).set_state(state)


@pytest.fixture(scope="module")
def doc_files(make_rox):
    """Two files of token_docs(), the second's tokens one higher."""
    return [
        make_rox(f"d{k}", [(d + k).astype(np.uint16) for d in token_docs()], separator=0)
        for k in range(2)
    ]


def packing(path, **changes):
    config = {"seq_len": 8, "batch_size": 2, "seed": 1, "num_packing_bins": 3}
    config.update(changes)
    return pack_documents(RoxDocumentSource(path, seq_len=16), **config)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"seq_len": 9}, "seq_len: saved 8 -> now 9"),
        ({"batch_size": 3}, "batch_size: saved 2 -> now 3"),
        ({"seed": 2}, "seed: saved 1 -> now 2"),
        ({"method": "first_fit"}, "method: saved 'best_fit' -> now 'first_fit'"),
        ({"long_documents": "truncate"}, "long_documents: saved 'split' -> now 'truncate'"),
        ({"num_packing_bins": 4}, "num_packing_bins: saved 3 -> now 4"),
        ({"shard": (0, 2)}, r"shard: saved \[0, 1\] -> now \[0, 2\]"),
        ({"num_epochs": 2}, "num_epochs: saved None -> now 2"),
    ],
)
def test_pack_documents_state_refuses_another_config(doc_files, changes, named):
    it = iter(packing(doc_files[0]))
    for _ in range(3):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(3)]
    again = iter(packing(doc_files[0]))
    again.set_state(json.loads(json.dumps(state)))  # as Grain's checkpoint handler does
    for e in expected:
        got = next(again)
        assert all(np.array_equal(got[k], e[k]) for k in e)
    with pytest.raises(ValueError, match="cannot restore this pack_documents state: .*" + named):
        iter(packing(doc_files[0], **changes)).set_state(state)


def test_pack_documents_state_refuses_other_data(doc_files):
    it = iter(packing(doc_files[0]))
    next(it)
    with pytest.raises(
        ValueError, match=r"pack_documents state: its data or config changed \(inputs: saved "
        r"'RoxDocumentSource\(data=[0-9a-f]{16}, seq_len=16"
    ):  # fmt: skip
        iter(packing(doc_files[1])).set_state(it.get_state())


def test_identities_are_the_same_in_another_process(doc_files):
    """No object address or process-local value in an identity: a state saved by one
    process restores in another."""
    code = (
        "import json, sys, grain, numpy as np\n"
        "from grain_rox import RoxDocumentSource, mix_datasets, pack_documents\n"
        "src = grain.MapDataset.source(RoxDocumentSource(sys.argv[1], seq_len=16))\n"
        "mixed = mix_datasets({'r': src, 'n': grain.MapDataset.range(9).map(lambda x: x)},"
        " {'r': 1, 'n': 1}, length=20)\n"
        "packed = pack_documents(src, seq_len=8, batch_size=2)\n"
        "print(json.dumps([mixed.identity, packed.identity]))\n"
    )
    run = [sys.executable, "-c", code, doc_files[0]]
    here = json.loads(subprocess.run(run, capture_output=True, text=True, check=True).stdout)
    there = json.loads(subprocess.run(run, capture_output=True, text=True, check=True).stdout)
    assert here == there
    assert "0x" not in json.dumps(here)


def test_grain_checkpoint_helper_holds_with_split_documents_and_mixtures():
    docs = token_docs()
    grain.experimental.assert_equal_output_after_checkpoint(
        pack_documents(docs, seq_len=8, batch_size=1, num_epochs=1, num_packing_bins=2)
    )
    grain.experimental.assert_equal_output_after_checkpoint(mixture().to_iter_dataset())


# ---- item 8: steps past the end --------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus(make_rox):
    return make_rox("t", [np.arange(1, 6000, dtype=np.uint16)], separator=0)


def test_endless_pipeline_refuses_a_step_past_its_largest(corpus):
    pipe = TokenPipeline(corpus, seq_len=16, global_batch_size=4, seed=1)
    last = 2**61 // 4 - 1
    assert pipe.step_limit == last + 1
    batch = pipe.map_dataset(first_step=last)[0]  # the largest step still reads real windows
    assert batch["inputs"].shape == (4, 16) and (batch["inputs"] > 0).any()
    for step in (last + 1, 10**30):
        with pytest.raises(
            ValueError,
            match=rf"first_step={step} is past the largest step this endless pipeline "
            rf"supports, {last} .* pass a step <= {last}",
        ):
            pipe.map_dataset(first_step=step)


def test_finite_pipeline_step_at_the_end_is_done_past_it_is_an_error(corpus):
    pipe = TokenPipeline(corpus, seq_len=16, global_batch_size=4, num_epochs=1)
    n = pipe.num_batches
    assert list(pipe.iter_dataset(first_step=n)) == []  # "done"
    with pytest.raises(ValueError, match=rf"first_step={n + 1} is past the end .*{n} batches"):
        pipe.iter_dataset(first_step=n + 1)


def test_a_restored_step_past_the_end_stops_the_loop_loudly(corpus):
    pipe = TokenPipeline(corpus, seq_len=16, global_batch_size=8)
    with MultiHostDataLoadIterator(pipe) as it:
        next(it)
        state = json.loads(it.get_state())
    for step in (10**30, pipe.step_limit):  # a hand-edited step; the first unsupported one
        state["step"] = step
        with (
            MultiHostDataLoadIterator(pipe) as restored,
            pytest.raises(ValueError, match=rf"step.{{0,3}}{step} is (past|beyond)"),
        ):  # before: StopIteration, so `for batch in it:` just ended
            restored.set_state(json.dumps(state))
            next(restored)


def test_numpy_integers_are_accepted_wherever_ints_are(corpus):
    i64 = np.int64
    plain = TokenPipeline(corpus, phases=[Phase(10, 4, 16), Phase(None, 8, 16)])
    numpy = TokenPipeline(corpus, phases=[Phase(i64(10), i64(4), i64(16)), Phase(None, 8, 16)])
    assert numpy.phases == plain.phases and numpy.describe() == plain.describe()
    short = TokenPipeline(corpus, seq_len=i64(16), global_batch_size=i64(4), seed=i64(1))
    assert np.array_equal(
        short.map_dataset(first_step=i64(3))[0]["inputs"],
        TokenPipeline(corpus, seq_len=16, global_batch_size=4, seed=1).map_dataset()[3]["inputs"],
    )
    packed = pack_documents(token_docs(), seq_len=i64(8), batch_size=i64(1), num_epochs=i64(1))
    assert next(iter(packed))["inputs"].shape == (1, 8)


# ---- item 10: one tokenizer per pipeline -----------------------------------------------------
def test_sources_of_different_tokenizers_are_refused_unless_allowed(make_rox):
    texts = [f"document {i}: " + "the quick brown fox " * 20 for i in range(60)]
    paths = {name: make_rox(name, texts, tokenizer=name) for name in ("bytes", "cl100k_base")}
    # no manifest, no tokenizer: not checked
    paths["raw"] = make_rox("raw", [np.arange(1, 20000, dtype=np.uint16)], manifest=False)
    mixed = {"b": paths["bytes"], "c": paths["cl100k_base"]}
    weights = {"b": 1, "c": 1}
    with pytest.raises(
        ValueError,
        match=r"TokenPipeline: the sources were tokenized differently \('b' \(.*bytes.rox\): "
        r"tokenizer 'bytes', EOS id 256; 'c' \(.*cl100k_base.rox\): tokenizer 'cl100k_base' "
        r"sha256 223921b76ee9, EOS id 100257\).*pass allow_mixed_tokenizers=True",
    ):
        TokenPipeline(mixed, seq_len=16, global_batch_size=4, weights=weights).batch_source()
    allowed = TokenPipeline(
        mixed, seq_len=16, global_batch_size=4, weights=weights, allow_mixed_tokenizers=True
    )
    assert allowed.map_dataset()[0]["inputs"].shape == (4, 16)
    with_raw = TokenPipeline(
        {"b": paths["bytes"], "r": paths["raw"]}, seq_len=16, global_batch_size=4,
        weights={"b": 1, "r": 1},
    )  # fmt: skip
    assert with_raw.map_dataset()[0]["inputs"].shape == (4, 16)


# ---- every new error names the argument, the value and the fix --------------------------------
NOT_INT = "is a {t}, not an int; pass a whole number (a Python or numpy int)"


def _pipe(path, **kw):
    return TokenPipeline(path, **{"seq_len": 16, "global_batch_size": 4, **kw})


BAD_INPUTS = [
    ("Phase steps str", lambda p: Phase(steps="5", batch_size=4, seq_len=8), TypeError,
     "Phase: steps='5' " + NOT_INT.format(t="str")),
    ("Phase steps float", lambda p: Phase(steps=2.7, batch_size=4, seq_len=8), TypeError,
     "Phase: steps=2.7 " + NOT_INT.format(t="float")),
    ("Phase batch bool", lambda p: Phase(steps=3, batch_size=True, seq_len=8), TypeError,
     "Phase: batch_size=True " + NOT_INT.format(t="bool")),
    ("Phase seq_len 0", lambda p: Phase(steps=3, batch_size=4, seq_len=0), ValueError,
     "Phase: seq_len=0 must be a positive int"),
    ("seq_len str", lambda p: _pipe(p, seq_len="16"), TypeError,
     "TokenPipeline: seq_len='16' " + NOT_INT.format(t="str")),
    ("batch float", lambda p: _pipe(p, global_batch_size=4.0), TypeError,
     "TokenPipeline: global_batch_size=4.0 " + NOT_INT.format(t="float")),
    ("seed None", lambda p: _pipe(p, seed=None), ValueError,
     "TokenPipeline: seed=None; the order is a function of the seed, so pass one: seed=0 "
     "(or any int from 0 to 2**63 - 1), and the same seed again to reproduce or restore the "
     "run"),
    ("pack seed None", lambda p: pack_documents([], seq_len=8, batch_size=1, seed=None),
     ValueError, "pack_documents: seed=None; the order is a function of the seed, so pass one: "
     "seed=0 (or any int from 0 to 2**32 - 1)"),
    ("pack seed 2**32", lambda p: pack_documents([], seq_len=8, batch_size=1, seed=2**32),
     ValueError, "pack_documents: seed=4294967296 is too large; pass an int from 0 to "
     "2**32 - 1"),
    ("mix seed None", lambda p: mix_datasets({"a": grain.MapDataset.range(3)}, seed=None),
     ValueError, "mix_datasets: seed=None; the order is a function of the seed, so pass one"),
    ("pipe seed 2**63", lambda p: _pipe(p, seed=2**63), ValueError,
     "TokenPipeline: seed=9223372036854775808 is too large; pass an int from 0 to 2**63 - 1"),
    ("seed float", lambda p: _pipe(p, seed=1.5), TypeError,
     "TokenPipeline: seed=1.5 " + NOT_INT.format(t="float")),
    ("lanes bool", lambda p: _pipe(p, lanes=True), TypeError,
     "TokenPipeline: lanes=True " + NOT_INT.format(t="bool")),
    ("first_step str", lambda p: _pipe(p).map_dataset(first_step="5"), TypeError,
     "TokenPipeline: first_step='5' " + NOT_INT.format(t="str")),
    ("first_step float", lambda p: _pipe(p).map_dataset(first_step=2.7), TypeError,
     "TokenPipeline: first_step=2.7 " + NOT_INT.format(t="float")),
    ("first_step bool", lambda p: _pipe(p).map_dataset(first_step=True), TypeError,
     "TokenPipeline: first_step=True " + NOT_INT.format(t="bool")),
    ("first_step negative", lambda p: _pipe(p).map_dataset(first_step=-1), ValueError,
     "TokenPipeline: first_step=-1 must be >= 0"),
    ("segmentation str", lambda p: _pipe(p, segmentation="no"), TypeError,
     "TokenPipeline: segmentation='no' is a str; pass True or False"),
    ("phases empty", lambda p: TokenPipeline(p, phases=[]), ValueError,
     "TokenPipeline: phases=[] holds no phase; pass at least one"),
    ("phases one Phase", lambda p: TokenPipeline(p, phases=Phase(None, 4, 8)), TypeError,
     "TokenPipeline: phases=Phase(steps=None, batch_size=4, seq_len=8, weights=None) is a "
     "Phase, not a list of Phase; pass phases=[Phase(steps, batch_size, seq_len, weights), ...]"),
    ("phases of tuples", lambda p: TokenPipeline(p, phases=[Phase(3, 4, 8), (None, 4, 8)]),
     TypeError, "TokenPipeline: phases[1]=(None, 4, 8) is a tuple, not a Phase; pass "
     "Phase(steps, batch_size, seq_len, weights)"),
    ("dtype None", lambda p: _pipe(p, dtype=None), TypeError,
     "TokenPipeline: dtype=None; pass an integer dtype such as np.int32 (the default) or "
     "np.int64"),
    ("dtype unknown", lambda p: _pipe(p, dtype="int23"), TypeError,
     "TokenPipeline: dtype='int23' is not a NumPy dtype; pass an integer dtype"),
    ("dtype object", lambda p: _pipe(p, dtype=object), ValueError,
     "TokenPipeline: dtype=object cannot hold token ids; pass an integer dtype"),
    ("rows lack a batch size",  # every row of the second phase's batches was read
     lambda p: TokenPipeline(p, phases=[Phase(3, 4, 16), Phase(None, 8, 16)]).map_dataset(
         rows={4: (0, 2)}), ValueError,
     "TokenPipeline: rows={4: (0, 2)} lacks batch size 8; the phases' batch sizes are [4, 8]: "
     "map each to this process's (lo, hi)"),
    ("rows name another batch size", lambda p: _pipe(p).map_dataset(rows={4: (0, 2), 6: (0, 3)}),
     ValueError, "TokenPipeline: rows={4: (0, 2), 6: (0, 3)} names batch size 6; the phases' "
     "batch sizes are [4]"),
    ("num_epochs past the samples",  # len() failed with an OverflowError, a batch with an
     lambda p: _pipe(p, num_epochs=2**62).num_batches, ValueError,  # IndexError
     "TokenPipeline: num_epochs=4611686018427387904 of "),
    ("huge batch size", lambda p: _pipe(p, global_batch_size=2**62), ValueError,
     "phase 0: no batch of batch_size=4611686018427387904 fits below 2**61 = "
     "2305843009213693952 samples, the most supported; give a batch size of at most "
     "2305843009213693952"),
    ("weight negative", lambda p: _pipe({"a": p, "b": p}, weights={"a": -1, "b": 2}),
     ValueError, "phase 0 weight of 'a' is -1; pass a finite weight >= 0 (0 leaves the source "
     "out)"),
    ("weight nan", lambda p: TokenPipeline(p, phases=[Phase(None, 4, 8, {"": float("nan")})]),
     ValueError, "phase 0 weight of '' is nan; pass a finite weight >= 0"),
    ("weights all 0", lambda p: _pipe({"a": p, "b": p}, weights={"a": 0.0}), ValueError,
     "phase 0 weights {'a': 0.0} are all 0 (a missing name has weight 0); give at least one of "
     "['a', 'b'] a weight above 0"),
    ("data_loader at the end",  # Grain's "Invalid number of records in Sampler. Got 0"
     lambda p: (pipe := _pipe(p, num_epochs=1)).data_loader(first_step=pipe.num_batches),
     ValueError, "is the end of this pipeline"),
    ("huge finite phase", lambda p: TokenPipeline(p, phases=[Phase(2**60, 4, 8)]), ValueError,
     "phase 0: steps=1152921504606846976 of batch_size=4 take the schedule past "
     "2305843009213693952 samples"),
    ("pack seq_len float", lambda p: pack_documents([], seq_len=8.0, batch_size=1), TypeError,
     "pack_documents: seq_len=8.0 " + NOT_INT.format(t="float")),
    ("pack long_documents", lambda p: pack_documents([], seq_len=8, batch_size=1,
                                                      long_documents="cut"), ValueError,
     "pack_documents: long_documents='cut' is not one of 'split' (default: a long document "
     "becomes several pieces), 'truncate' (keep its first seq_len tokens) or 'error'"),
    ("pack shard", lambda p: pack_documents([], seq_len=8, batch_size=1, shard=(2, 2)),
     ValueError, "pack_documents: shard=(2, 2) needs 0 <= index < count"),
    ("rox docs seq_len", lambda p: RoxDocumentSource(p, seq_len="8"), TypeError,
     "RoxDocumentSource: seq_len='8' " + NOT_INT.format(t="str")),
    ("rox tokens seq_len", lambda p: RoxTokenSource(p, seq_len=2.7), TypeError,
     "RoxTokenSource: seq_len=2.7 " + NOT_INT.format(t="float")),
    ("rox docs eos", lambda p: RoxDocumentSource(p, seq_len=8, eos_id="0"), TypeError,
     "RoxDocumentSource: eos_id='0' " + NOT_INT.format(t="str")),
    ("mix source", lambda p: mix_datasets({"a": [1, 2]}, {"a": 1}), TypeError,
     "mix_datasets: dataset 'a' is a list, not a grain.MapDataset; wrap a data source as "
     "grain.MapDataset.source(source)"),
    ("mix phase steps", lambda p: mix_datasets({"a": grain.MapDataset.range(3)},
                                               phases=[("5", {"a": 1}), (None, {"a": 1})]),
     TypeError, "mix_datasets: phases[0] num_samples='5' " + NOT_INT.format(t="str")),
    ("mix weight str", lambda p: mix_datasets({"a": grain.MapDataset.range(3)}, {"a": "1"}),
     TypeError, "mix_datasets phase 0 weight of 'a' is '1' (str); pass a number"),
    ("mix length", lambda p: mix_datasets({"a": grain.MapDataset.range(3)}, length=2.5),
     TypeError, "mix_datasets: length=2.5 " + NOT_INT.format(t="float")),
    ("batches bool", lambda p: NumpySource(np.arange(8)).batches(True), TypeError,
     "batches(): batch_size=True " + NOT_INT.format(t="bool")),
    ("batches float", lambda p: NumpySource(np.arange(8)).batches(4.0), TypeError,
     "batches(): batch_size=4.0 " + NOT_INT.format(t="float")),
    ("batches shard float", lambda p: NumpySource(np.arange(8)).batches(4, shard=(0.5, 2)),
     TypeError, "batches(): shard=0.5 " + NOT_INT.format(t="float")),
    ("batches epochs float", lambda p: NumpySource(np.arange(8)).batches(4, num_epochs=1.5),
     TypeError, "batches(): num_epochs=1.5 " + NOT_INT.format(t="float")),
    ("batches epochs 0", lambda p: NumpySource(np.arange(8)).batches(4, num_epochs=0),
     ValueError, "num_epochs=0 must be >= 1, or None / -1 for endless"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "error", "message"), [row[1:] for row in BAD_INPUTS], ids=[r[0] for r in BAD_INPUTS]
)
def test_bad_inputs_are_refused_with_the_argument_value_and_fix(corpus, make, error, message):
    with pytest.raises(error) as info:
        make(corpus)
    assert message in str(info.value)


def test_an_output_dtype_that_would_change_token_ids_is_refused(make_rox):
    path = make_rox("gpt2ish", [np.array([5, 40000, 50256, 7], np.uint16)] * 300, separator=50256)
    for dtype in (np.int16, np.uint8, np.float16):
        pipe = TokenPipeline(path, seq_len=8, global_batch_size=2, dtype=dtype)
        with pytest.raises(
            ValueError,
            match=rf"dtype={np.dtype(dtype).name} would change token ids of .*gpt2ish\.rox, stored as uint16",
        ):
            pipe.map_dataset()
    wide = TokenPipeline(path, seq_len=8, global_batch_size=2, dtype=np.int64, eos_id=70000)
    never = r"eos_id=70000 can never occur in .*gpt2ish\.rox, stored as uint16 \(ids 0 to 65535\)"
    with pytest.raises(ValueError, match=never):  # it was accepted: no document ever ended
        _ = wide.num_batches
    for source in (RoxTokenSource, RoxDocumentSource):
        with pytest.raises(ValueError, match=never):
            source(path, seq_len=8, eos_id=70000)
    other = make_rox("u32", [np.array([5, 7], np.uint32)] * 300, separator=2**31)
    narrow = TokenPipeline(other, seq_len=8, global_batch_size=2)  # int32: no room for 2**31
    with pytest.raises(
        ValueError, match=r"dtype=int32 cannot hold the EOS id 2147483648; pass dtype=np\.int64"
    ):
        _ = narrow.num_batches
    for source in (RoxTokenSource, RoxDocumentSource):  # the same rule for the plain sources
        with pytest.raises(
            ValueError,
            match=rf"{source.__name__}: dtype=int16 would change token ids of .*gpt2ish\.rox, "
            "stored as uint16",
        ):
            source(path, seq_len=8, dtype=np.int16)
    ok = TokenPipeline(path, seq_len=8, global_batch_size=2, dtype=np.uint16).map_dataset()[0]
    assert ok["inputs"].dtype == np.uint16 and ok["inputs"].max() == 50256


def test_uint32_ids_that_int32_cannot_hold_are_refused_not_wrapped(make_rox):
    """uint32 shards are served as the default int32 (no vocabulary reaches 2**31), so an id
    from 2**31 on is damage or not a token id: every read path refuses it, naming the file,
    the id and the fix, where it was served as a negative id (2**31 + 5 as -2147483643)."""
    big = 2**31 + 5
    docs = [np.array([7, 9, big, 11], np.uint32)] * 200
    path = make_rox("u32big", docs, separator=1, dtype=np.uint32)
    clean = make_rox("u16clean", [np.array([3, 4, 5], np.uint16)] * 400, separator=1)
    wrapped = rf"holds the token id {big}, which dtype=int32 cannot hold \(it would become {big - 2**32}\)"
    fix = (
        r"check it with `grain-rox verify`, or serve the ids as stored with dtype=np\.int64 "
        r"\(and jax_enable_x64 on, or JAX narrows them to 32 bits again on the devices\)"
    )
    for layout in ("maxtext", "windows", "tokens"):
        pipe = TokenPipeline(path, seq_len=8, global_batch_size=2, layout=layout)
        with pytest.raises(ValueError, match=rf"TokenPipeline: .*u32big\.rox {wrapped}: .*{fix}"):
            pipe.map_dataset()[0]
    mixed = TokenPipeline(
        {"clean": clean, "big": path}, weights={"clean": 0.5, "big": 0.5}, seq_len=8,
        global_batch_size=4,
    )  # fmt: skip
    with pytest.raises(ValueError, match=rf"source 'big' \(.*u32big\.rox\.\.\.\) {wrapped}"):
        mixed.map_dataset()[0]
    with pytest.raises(ValueError, match=rf"RoxTokenSource: .*u32big\.rox {wrapped}"):
        RoxTokenSource(path, seq_len=8)[0]
    with pytest.raises(ValueError, match=rf"RoxTokenSource: .*u32big\.rox {wrapped}"):
        RoxTokenSource(path, seq_len=8).get_batch([1, 0])
    with pytest.raises(ValueError, match=rf"RoxDocumentSource: .*u32big\.rox {wrapped}"):
        RoxDocumentSource(path, seq_len=8)[0]
    wide = TokenPipeline(path, seq_len=8, global_batch_size=2, dtype=np.int64).map_dataset()[0]
    assert big in wide["inputs"].tolist()[0] + wide["inputs"].tolist()[1]
    assert RoxTokenSource(path, seq_len=8, dtype=np.int64)[0]["inputs"].tolist() == [
        7, 9, big, 11, 1, 7, 9, big
    ]  # fmt: skip
    small = make_rox("u32small", [np.array([7, 9, 2**31 - 1], np.uint32)] * 200, separator=1)
    served = TokenPipeline(small, seq_len=8, global_batch_size=2).map_dataset()[0]["inputs"]
    assert served.dtype == np.int32 and served.max() == 2**31 - 1  # the largest id that fits


def test_a_wrapping_id_is_refused_among_mixed_sources_and_the_pad_id_passes(make_rox):
    """Mixed with a signed source, a uint32 source's batch travels as int64 (layout="tokens",
    and the default on accelerators) and wrapped on the devices: refused too. The manifest's
    pad id passes where padding is served (the lanes order), as -1, as before."""
    docs = [np.full(100, 7, np.uint32) for _ in range(50)]
    for doc in docs:
        doc[5] = 3_000_000_000
    a = make_rox("ua", docs, dtype=np.uint32, separator=0)
    b = make_rox("sb", [np.full(100, 9, np.int32) for _ in range(50)], dtype=np.int32, separator=0)
    phases = [Phase(steps=20, batch_size=8, seq_len=64, weights={"a": 1, "b": 1})]
    refused = r"TokenPipeline: source 'a' \(.*ua\.rox\.\.\.\) holds the token id 3000000000"
    for layout in ("maxtext", "tokens"):
        data = TokenPipeline({"a": a, "b": b}, phases=phases, layout=layout).map_dataset()
        with pytest.raises(ValueError, match=refused):
            [data[i] for i in range(20)]
    pipe = TokenPipeline({"a": a, "b": b}, phases=phases)
    with (
        MultiHostDataLoadIterator(pipe, features_on_device=True) as it,
        pytest.raises(ValueError, match=refused),
    ):
        list(it)
    rng = np.random.default_rng(0)
    texts = [rng.integers(1, 50000, rng.integers(20, 200)).astype(np.uint32) for _ in range(200)]
    padded = make_rox("upad", texts, dtype=np.uint32, separator=0, pad_id=2**32 - 1,
                      block_size=4096 * 4, max_shard_bytes=1 << 15)  # fmt: skip
    lanes = TokenPipeline(padded, seq_len=64, global_batch_size=8, num_epochs=1, order="lanes")
    served = np.concatenate([b["inputs"].ravel() for b in lanes.map_dataset()])
    assert (served == -1).sum() > 0 and served.min() == -1  # the padding, as lanes served it
    blocks = TokenPipeline(padded, seq_len=64, global_batch_size=8, num_epochs=1)
    assert min(int(b["inputs"].min()) for b in blocks.map_dataset()) >= 0  # padding left out


# ---- block padding is not served ---------------------------------------------------------------


def served_tokens(corpus) -> list[int]:
    """Each shard's tokens its readers serve (the lengths of its served stretches)."""
    from grain_rox._format._served import served_stretches

    return [sum(b - a for a, b in shard) for shard in served_stretches(corpus)]


def test_the_padding_of_a_writes_last_block_is_not_served(tmp_path):
    """A write pads its last block with the pad id (here the EOS, 256): one epoch of a
    TokenPipeline serves the documents' tokens only (it served 67% padding, each pad token a
    one-token segment, on this corpus), under every order but 0.1's lanes (kept as written,
    to continue its runs exactly); a state saved while the padding was read is refused."""
    from grain_rox import open_rox, write_rox

    path = str(tmp_path / "notes.rox")
    written = write_rox([f"note {i}: some text." for i in range(40)], path, tokenizer="bytes")
    corpus = open_rox(path)
    shard = corpus.shards[0]
    assert shard.num_padding_tokens == written.num_padding_tokens > corpus.num_tokens // 2
    real = corpus.num_tokens - shard.num_padding_tokens
    assert served_tokens(corpus) == [real] == [written.num_tokens]
    for packing in (None, "best_fit"):
        pipe = TokenPipeline(path, seq_len=16, global_batch_size=4, seed=0, num_epochs=1,
                             packing=packing, chunk_tokens=64)  # fmt: skip
        assert pipe.describe()["padding_left_out"] == {"": shard.num_padding_tokens}
        rows = [np.c_[b["inputs"], b["targets"][:, -1:]] for b in pipe.map_dataset()]
        windows = np.concatenate(rows)
        # every row is the documents' text (no two EOS in a row: no document is empty)
        eos_pairs = (windows[:, :-1] == 256) & (windows[:, 1:] == 256)
        assert not eos_pairs.any(), packing
        served = int((windows[:, :-1] != 0).sum()) if packing else windows[:, :-1].size
        assert 0 < served <= real
    lanes = TokenPipeline(path, seq_len=16, global_batch_size=4, seed=0, order="lanes")
    assert "padding_left_out" not in lanes.describe()
    # a grain.DataLoader compares the source's repr: the padding left out is part of it
    pipe = TokenPipeline(path, seq_len=16, global_batch_size=4, seed=0, chunk_tokens=64)
    before = TokenPipeline(path, seq_len=16, global_batch_size=4, seed=0, chunk_tokens=64)
    before.plan.padding_left_out.clear()  # as the repr was while the padding was read
    assert repr(pipe.batch_source()) != repr(before.batch_source())
    pipe = TokenPipeline(path, seq_len=16, global_batch_size=8, seed=0, chunk_tokens=64)
    with MultiHostDataLoadIterator(pipe) as it:
        next(it)
        state = json.loads(it.get_state())
    del state["pipeline"]["padding_left_out"]  # as saved when the padding was read
    with MultiHostDataLoadIterator(pipe) as it, pytest.raises(ValueError, match="padding_left"):
        it.set_state(json.dumps(state))


def test_an_append_records_the_padding_it_leaves_mid_stream(tmp_path):
    """An append to a single file leaves the first write's padding mid-stream: the manifest
    records where (padding_spans), so exactly each write's padding is left out, the
    documents' EOS kept, and real tokens equal to the pad id too."""
    from grain_rox import open_rox, write_rox
    from grain_rox._format._served import served_stretches

    path = str(tmp_path / "a.rox")
    kw = {"separator": 7, "block_size": 16}  # 8 uint16 tokens a block; pad = separator = 7
    write_rox([np.array([1, 2, 3], np.uint16)], path, **kw)  # 1 2 3 7 + 4 pads
    write_rox([np.array([4, 5, 6, 8, 9], np.uint16)], path, **kw, if_exists="append")
    corpus = open_rox(path)
    written = [1, 2, 3, 7, 7, 7, 7, 7, 4, 5, 6, 8, 9, 7, 7, 7]
    assert corpus.tokens(0, corpus.num_tokens).tolist() == written
    data = json.loads((tmp_path / "a.manifest.json").read_text())
    manifest = data["shards"]["a.rox"]
    assert (manifest["num_padding_tokens"], manifest["padding_spans"]) == (6, [[4, 4]])
    assert data["version"] == 3  # an older grain_rox says "upgrade", not "invalid"
    assert corpus.trailing_padding() == [(2, 7)] and corpus.padding_spans() == [([(4, 4)], 7)]
    assert served_stretches(corpus) == [[(0, 4), (8, 14)]]  # through 9 and its EOS
    assert served_tokens(corpus) == [10]
    raw = str(tmp_path / "z.rox")  # no separator: the pad is 0, and so are real tokens
    write_rox([np.array([1, 2, 3], np.uint16)], raw, block_size=16)
    tail = np.array([4, 5, 6, 7, 8, 0, 0, 0], np.uint16)  # fills its block: no padding
    write_rox([tail], raw, block_size=16, if_exists="append")
    assert served_stretches(open_rox(raw)) == [[(0, 3), (8, 16)]]  # the real zeros served
    plain = json.loads((tmp_path / "z.manifest.json").read_text())
    assert plain["version"] == 3 and plain["shards"]["z.rox"]["padding_spans"] == [[3, 5]]
    one = str(tmp_path / "one.rox")
    write_rox([np.array([1, 2, 3], np.uint16)], one, **kw)
    assert json.loads((tmp_path / "one.manifest.json").read_text())["version"] == 2
    # a manifest from before spans, where an earlier append summed both writes' padding:
    # the next append records the padding it can locate (the run of pad ids), no more, and
    # the padding no manifest locates is read as written
    data["version"], manifest["num_padding_tokens"] = 2, 6
    del manifest["padding_spans"]
    (tmp_path / "a.manifest.json").write_text(json.dumps(unsealed(data)))
    write_rox([np.array([10], np.uint16)], path, **kw, if_exists="append")
    again = json.loads((tmp_path / "a.manifest.json").read_text())["shards"]["a.rox"]
    assert again["padding_spans"] == [[13, 3]]  # 9's EOS and 2 pads: all pad ids (7)
    assert served_stretches(open_rox(path)) == [[(0, 13), (16, 18)]]  # through 10 and its EOS


def test_padding_an_append_left_mid_stream_is_not_served(tmp_path):
    """The CLI's defaults (pad = EOS, 4096-byte blocks): a second convert appended to one file
    left 2,037 EOS pad tokens mid-stream, and every reader served them (2,056 tokens of a
    23-token corpus; a document glued to pad ids). Each reader now serves the documents' tokens
    only, and a state or DataLoader saved while the padding was read is refused."""
    from grain_rox import RoxDocumentSource, open_rox, write_rox
    from grain_rox.cli import main

    (tmp_path / "a.txt").write_text("hello world")
    (tmp_path / "b.txt").write_text("second doc")
    out = str(tmp_path / "t.rox")
    assert main(["convert", str(tmp_path / "a.txt"), "-o", out, "--no-progress"]) == 0
    assert main(["convert", str(tmp_path / "b.txt"), "-o", out, "--no-progress",
                 "--if-exists", "append"]) == 0  # fmt: skip
    corpus = open_rox(out)
    text = [*b"hello world", 256, *b"second doc", 256]
    assert corpus.num_tokens == 4096 and corpus.num_documents == 2
    docs = RoxDocumentSource(out, seq_len=64)
    assert [docs[i]["inputs"].tolist() for i in range(len(docs))] == [text[:11], text[12:-1]]
    assert "padding_left_out=4073" in repr(docs)
    tokens = RoxTokenSource(out, seq_len=2)
    served = [tokens[i]["inputs"].tolist() + tokens[i]["targets"][-1:].tolist()
              for i in range(len(tokens))]  # fmt: skip
    assert [t for w in served for t in w[:-1]] + served[-1][-1:] == text[: 2 * len(tokens) + 1]
    glued = str(tmp_path / "glued.rox")  # a pad id that is not the EOS: no empty documents
    kw = {"separator": 0, "pad_id": 7, "block_size": 16}
    write_rox([np.array([1, 2, 3], np.uint16)], glued, **kw)
    write_rox([np.array([4, 5, 6], np.uint16)], glued, **kw, if_exists="append")
    docs = RoxDocumentSource(glued, seq_len=20)  # it served [1 2 3] then [7 7 7 7 4 5 6]
    assert [docs[i]["inputs"].tolist() for i in range(len(docs))] == [[1, 2, 3], [4, 5, 6]]
    pairs = set(itertools.pairwise(text))  # every next-token pair of the text
    for packing in (None, "best_fit"):
        pipe = TokenPipeline(out, seq_len=4, global_batch_size=1, seed=0, num_epochs=1,
                             chunk_tokens=8, packing=packing)  # fmt: skip
        assert pipe.describe()["padding_left_out"] == {"": 4073}
        trained = [
            (a, b)
            for batch in pipe.map_dataset()
            for a, b, keep in zip(
                batch["inputs"][0].tolist(),
                batch["targets"][0].tolist(),
                batch["targets_segmentation"][0].tolist(),
                strict=True,
            )
            if keep
        ]
        assert trained and set(trained) <= pairs, (packing, set(trained) - pairs)
        assert len(trained) == len(set(trained))  # each once
    pipe = TokenPipeline(out, seq_len=4, global_batch_size=8, seed=0, chunk_tokens=8)
    source = pipe.batch_source()  # its readers read the served stretches, pickled too
    again = pickle.loads(pickle.dumps(source))
    for k in (0, 5):
        assert all(np.array_equal(again[k][f], source[k][f]) for f in source[k])
    with MultiHostDataLoadIterator(pipe) as it:
        next(it)
        state = json.loads(it.get_state())
    state["pipeline"]["padding_left_out"] = {"": 4}  # as saved when the mid-stream padding was read
    with MultiHostDataLoadIterator(pipe) as it, pytest.raises(ValueError, match="padding_left"):
        it.set_state(json.dumps(state))


def test_padding_is_found_per_set_and_for_a_nan_pad(tmp_path):
    """One source of two sets with other pad ids leaves out each set's padding (the shared
    pad id was None: all of it was served); a float set padded with NaN too (NaN != NaN)."""
    from grain_rox import open_rox, write_rox

    doc = np.arange(1, 5000, dtype=np.uint16)
    write_rox([doc], str(tmp_path / "a.rox"), separator=0)
    write_rox([doc], str(tmp_path / "b.rox"), separator=999)
    both = open_rox([str(tmp_path / "a.rox"), str(tmp_path / "b.rox")])
    assert both.pad_id is None and [p for _, p in both.trailing_padding()] == [0, 999]
    assert served_tokens(both) == [5000, 5000]
    floats = str(tmp_path / "f.rox")
    write_rox([np.linspace(0.5, 9.5, 4000, dtype=np.float32)], floats, separator=float("nan"))
    assert served_tokens(open_rox(floats)) == [4001]


def test_pack_documents_serves_the_last_rows_in_a_batch_filled_with_padding():
    """A finite stream's packed rows rarely fill the last batch: its rows are served, the
    batch filled with rows of padding (segment 0), the same shape as the others (a dropped
    remainder lost its documents, counted nowhere: 128 of 20,485 pairs in a review's case)."""
    docs = [1000 * (i + 1) + np.arange(3 + i % 11, dtype=np.int32) for i in range(41)]
    want = collections.Counter(
        (int(a), int(b)) for d in docs for a, b in itertools.pairwise(d.tolist())
    )
    batches = list(pack_documents(docs, seq_len=16, batch_size=4, num_epochs=1, seed=0))
    got = collections.Counter()
    for b in batches:
        live = b["inputs_segmentation"] > 0
        got.update(zip(b["inputs"][live].tolist(), b["targets"][live].tolist(), strict=True))
    assert got == want
    assert {b["inputs"].shape for b in batches} == {(4, 16)}
    last = batches[-1]["inputs_segmentation"]
    assert (last.max(axis=1) == 0).any()  # the filling: rows of padding only
    assert (batches[-1]["inputs"][last == 0] == 0).all()


def test_small_shards_are_served_not_lost_in_chunk_tails(tmp_path, caplog):
    """Shard tails shorter than a chunk are never served: with the 64K chunk a source of 4M+
    tokens got, ten 60K-token files beside a large one (11% of the tokens) were never served
    at all, and 98K-token shards lost a third. The chunk is now chosen to fit the shards:
    every file's tokens are served, and whatever a chunk_tokens passed by hand leaves in the
    tails is logged, naming the share and the fix."""
    from grain_rox import write_rox

    write_rox([np.full(5_000_000, 1, np.uint16)], str(tmp_path / "big.rox"))
    for i in range(10):
        write_rox([np.full(60_000, 100 + i, np.uint16)], str(tmp_path / f"small{i}.rox"))
    pipe = TokenPipeline(str(tmp_path / "*.rox"), seq_len=1024, global_batch_size=64,
                         num_epochs=1)  # fmt: skip
    counts = collections.Counter()
    for batch in pipe.map_dataset():
        counts.update(batch["inputs"].ravel().tolist())
    assert set(counts) == {1, *range(100, 110)}
    for i in range(100, 110):  # each small file, all but under two windows of it
        assert 60_000 - 2 * 1024 <= counts[i] <= 60_000, (i, counts[i])
    assert counts[1] >= 5_000_000 - 64 * 1025
    with caplog.at_level(logging.WARNING, logger="grain_rox"):
        _ = TokenPipeline(str(tmp_path / "*.rox"), seq_len=1024, global_batch_size=64,
                          chunk_tokens=65536).num_batches  # fmt: skip
    assert (
        f"{tmp_path}/big.rox (11 shard(s)): 11.1% of its tokens lie in shard tails " in caplog.text
    )
    assert "pass a smaller chunk_tokens" in caplog.text
    sharded = str(tmp_path / "sharded" / "s.rox")
    os.makedirs(os.path.dirname(sharded))
    write_rox([np.arange(5_000_000, dtype=np.uint32) % 60_000], sharded, max_shard_bytes=392_000)
    pipe = TokenPipeline(sharded, seq_len=1024, global_batch_size=64, num_epochs=1)
    shards = [sh.num_tokens for sh in pipe.plan.corpora[""].shards]
    assert len(shards) > 50 and pipe.plan.orders[0].chunk_tokens == shards[0] // 2
    served = pipe.num_batches * 64 * 1024
    assert served >= 0.98 * sum(shards)  # was 67%


def test_the_lanes_order_says_what_it_leaves_in_tails_and_serves_of_padding(tmp_path, caplog):
    """order='lanes' (grain_rox 0.1's, kept bit for bit) chose a chunk from the whole source
    and left most of a corpus of small shards in their tails (6% served), and served block
    padding as text, without a word: both are logged now (the order is unchanged)."""
    from grain_rox import write_rox

    paths = []
    for i, n in enumerate([300] * 100 + [2000]):  # (lanes' chunk for 32,000 tokens: 500)
        paths.append(str(tmp_path / f"s{i:03d}.rox"))
        write_rox([np.arange(1, n, dtype=np.uint16)], paths[-1], separator=0, block_size=64)
    with caplog.at_level(logging.WARNING, logger="grain_rox"):
        pipe = TokenPipeline(paths, seq_len=16, global_batch_size=4, order="lanes")
        first = pipe.map_dataset()[0]["inputs"]
    said = caplog.text
    chunk = pipe.plan.orders[0].chunk_tokens
    assert chunk > 300 and f"lie in shard tails shorter than a chunk of {chunk} tokens" in said
    padding = sum(sh.num_padding_tokens for sh in pipe.plan.corpora[""].shards)
    assert padding > 0 and (
        f"order='lanes' serves the {padding} tokens of block padding its writes left as text "
        "(grain_rox 0.1's order, kept to continue its runs exactly)" in said
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="grain_rox"):
        blocks = TokenPipeline(paths, seq_len=16, global_batch_size=4)
        _ = blocks.map_dataset()[0]
    assert "block padding" not in caplog.text and "shard tails" not in caplog.text
    assert first.shape == (4, 16)


def test_a_source_of_weight_0_too_small_for_a_chunk_is_told_to_be_left_out(make_rox):
    """A source no phase draws from must still hold a chunk; the error's fix ("a smaller
    chunk_tokens") would shrink every source's chunks, so it says to leave the source out."""
    big = make_rox("bigw", [np.arange(1, 60_000, dtype=np.uint16)], separator=0)
    tiny = make_rox("tinyw", [np.arange(1, 50, dtype=np.uint16)], separator=0)
    pipe = TokenPipeline({"a": big, "t": tiny}, seq_len=16, global_batch_size=4,
                         weights={"a": 1, "t": 0})  # fmt: skip
    with pytest.raises(ValueError) as info:
        _ = pipe.num_batches
    assert str(info.value).startswith("source 't' (")
    assert str(info.value).endswith(
        "pass a smaller chunk_tokens (it has weight 0 in every phase: leave it out of the "
        "sources instead)"
    )


def test_a_source_with_no_tokens_says_so(tmp_path):
    """A shard of no blocks (a valid footer alone) was told "pass a smaller chunk_tokens"."""
    from shard_bytes import make_shard

    path = tmp_path / "empty.rox"
    path.write_bytes(make_shard([], "uint16"))
    with pytest.raises(ValueError) as info:
        _ = TokenPipeline(str(path), seq_len=8, global_batch_size=2).num_batches
    assert str(info.value) == (
        f"{path}: it holds no tokens (1 shard(s), 0 tokens written); write documents to it, or "
        "leave it out of the sources"
    )


def test_a_later_longer_phase_keeps_the_chunk_fitted_to_small_shards(tmp_path):
    """The chunk fitted to small shards must not depend on seq_len: a phase with longer
    windows added at a restore changed it (600 -> 1125 tokens), moved the batches served
    before and refused the state; and estimate_steps used another chunk than the run."""
    from grain_rox import write_rox

    path = str(tmp_path / "s.rox")
    write_rox([np.arange(72_000, dtype=np.uint32) % 5000 + 1], path, separator=0,
              max_shard_bytes=4800, block_size=4800)  # fmt: skip
    first = TokenPipeline(path, phases=[Phase(None, 8, 16)], seed=0)
    later = TokenPipeline(path, phases=[Phase(5, 8, 16), Phase(None, 8, 700)], seed=0)
    assert first.plan.orders[0].chunk_tokens == later.plan.orders[0].chunk_tokens
    for k in range(5):
        np.testing.assert_array_equal(
            first.map_dataset()[k]["inputs"], later.map_dataset()[k]["inputs"]
        )
    with MultiHostDataLoadIterator(first) as it:
        for _ in range(5):
            next(it)
        state = it.get_state()
    with MultiHostDataLoadIterator(later) as it:
        it.set_state(state)
        assert np.asarray(next(it)["inputs"]).shape == (8, 700)
    once = TokenPipeline(path, seq_len=16, global_batch_size=8, seed=0, num_epochs=1)
    assert first.estimate_steps(seq_len=16, batch_size=8) == once.num_batches


def test_the_rows_num_epochs_leaves_out_of_its_last_batch_are_logged(tmp_path, caplog):
    """Batches are whole, so the rows after the last whole batch are not served: said at INFO
    level where that is under 1% of the rows, as a warning above (a small corpus, packed rows
    shuffled: whole documents that were silently never trained)."""
    import logging

    from grain_rox import write_rox

    path = str(tmp_path / "c.rox")
    write_rox([np.arange(1, 4000, dtype=np.uint16)], path, separator=0)
    with caplog.at_level(logging.INFO, logger="grain_rox"):
        pipe = TokenPipeline(path, seq_len=16, global_batch_size=48, num_epochs=1)
        assert pipe.num_batches == 5
    rows = pipe.plan.orders[0].windows_per_epoch
    assert rows == 5 * 48 + 7
    [record] = [r for r in caplog.records if "num_epochs" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"{path}: num_epochs=1: the last 7 of its {rows} rows (fewer than a batch of 48) are "
        "not served, "
        f"so that every batch is whole (2.8%); pass a global_batch_size that divides {rows}, or "
        "more epochs"
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="grain_rox"):
        assert TokenPipeline(path, seq_len=16, global_batch_size=19, num_epochs=1).num_batches == 13
    assert "num_epochs" not in caplog.text  # 247 rows: 13 whole batches, nothing left


def test_a_small_chunk_tokens_passed_by_hand_says_what_its_joins_cost(tmp_path, caplog):
    """The pair across each chunk join is not trained: chunk_tokens=2 trained half the pairs,
    and 1 none, without a word (the tail warning counts shard tails only)."""
    import logging

    from grain_rox import write_rox

    path = str(tmp_path / "c.rox")
    write_rox([np.arange(1, 1200, dtype=np.uint16)], path, separator=0)
    with caplog.at_level(logging.WARNING, logger="grain_rox"):
        _ = TokenPipeline(path, seq_len=8, global_batch_size=2, chunk_tokens=4).plan
    assert caplog.messages == [
        f"{path}: chunk_tokens=4 leaves the pair across each chunk join untrained, 25.0% of its "
        "pairs; pass a chunk_tokens of at least 100, or none (chosen from the data)"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="grain_rox"):
        _ = TokenPipeline(path, seq_len=8, global_batch_size=2, chunk_tokens=100).plan
    assert caplog.messages == []
    with caplog.at_level(logging.WARNING, logger="grain_rox"):  # packed: the padding it costs
        _ = TokenPipeline(path, seq_len=63, global_batch_size=2, chunk_tokens=150,
                          packing="best_fit").plan  # fmt: skip
    assert caplog.messages == [
        f"{path}: chunk_tokens=150 holds about 2.3 rows of 64 tokens, and packing each chunk on "
        "its own leaves about one row of padding a chunk: some 30% of the rows' tokens; pass a "
        "chunk_tokens of at least 1024, or none (chosen from the data)"
    ]


def _word_tokenizer(folder, words):
    """A tokenizer.json of ``words`` and filler (a vocabulary of 300 to 2**16: uint16, like
    the bytes tokenizer's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    os.makedirs(folder, exist_ok=True)
    filler = [f"w{i}" for i in range(300)]
    vocab = {w: i for i, w in enumerate(["[UNK]", "</s>", *words, *filler])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(folder, "tokenizer.json"))
    return os.path.join(folder, "tokenizer.json")


def test_one_source_joining_sets_of_other_tokenizers_or_eos_ids_is_refused(tmp_path):
    """A folder holding two sets: its facts disagreed, so the corpus recorded none, and the
    tokenizer check (which skips sources recording none) let it through; a set without a
    manifest beside one with got that one's EOS id assumed for its tokens."""
    texts = [f"the cat sat on mat {i % 7}" for i in range(300)]
    folder = tmp_path / "data"
    words = ["the", "cat", "sat", "on", "mat", *"0123456"]
    write_rox(texts, str(folder / "a.rox"), tokenizer="bytes")
    write_rox(texts, str(folder / "b.rox"), tokenizer=_word_tokenizer(tmp_path / "t", words))
    # the tokenizers are named first (their EOS ids differ too, and the advice for those,
    # eos_id=, only led to this refusal)
    for eos_id in (None, 1):
        with pytest.raises(ValueError) as info:
            TokenPipeline(str(folder), seq_len=8, global_batch_size=4, eos_id=eos_id).map_dataset()
        assert str(info.value).startswith(
            f"TokenPipeline: the source ({folder / 'a.rox'}, ...) joins shard sets that were "
            f"tokenized differently ({folder / 'a.manifest.json'}: tokenizer 'bytes', EOS id 256; "
        )
    # mixing allowed: the EOS ids still differ
    with pytest.raises(ValueError) as info:
        TokenPipeline(str(folder), seq_len=8, global_batch_size=4,
                      allow_mixed_tokenizers=True).map_dataset()  # fmt: skip
    said = str(info.value)
    assert said.startswith(
        f"TokenPipeline: the source ({folder / 'a.rox'}, ...): its shard sets end their "
        "documents with different EOS ids, or not every set records one ("
        f"{folder / 'a.manifest.json'}: tokenizer 'bytes', EOS id 256; "
        f"{folder / 'b.manifest.json'}: tokenizer "
    )
    assert said.endswith(
        "EOS id 1): the segment features would cut one set's documents at another's EOS id. "
        "Name each set as a source of its own (with weights), or pass eos_id= if every set "
        "ends its documents with that id"
    )
    allowed = TokenPipeline(
        str(folder), seq_len=8, global_batch_size=4, eos_id=1, allow_mixed_tokenizers=True
    )
    assert allowed.map_dataset()[0]["inputs_segmentation"].shape == (4, 8)
    # each set a source of its own: the check across sources says the same, as before
    named = {"a": str(folder / "a.rox"), "b": str(folder / "b.rox")}
    with pytest.raises(ValueError, match=r"the sources were tokenized differently"):
        TokenPipeline(named, seq_len=8, global_batch_size=4, weights={"a": 1, "b": 1}).map_dataset()


def test_a_set_without_a_manifest_beside_one_gets_no_eos_id_assumed(tmp_path):
    folder = tmp_path / "data"
    write_rox([f"doc {i} " * 20 for i in range(40)], str(folder / "a.rox"), tokenizer="bytes")
    raw = [np.arange(1, 3000, dtype=np.uint16)]
    write_rox(raw, str(folder / "raw.rox"), separator=0, manifest=False)  # as roxxel writes it
    with pytest.raises(ValueError) as info:
        TokenPipeline(str(folder), seq_len=8, global_batch_size=4).map_dataset()
    assert (
        f"; 1 shard(s) without a manifest (first: {folder / 'raw.rox'}): no tokenizer recorded, "
        "EOS id None): the segment features would cut"
    ) in str(info.value)
    for given in ({"eos_id": 256}, {"segmentation": False}):  # the user's word for all of it
        pipe = TokenPipeline(str(folder), seq_len=8, global_batch_size=4, **given)
        assert pipe.map_dataset()[0]["inputs"].shape == (4, 8)
    # the corpus knows no EOS for all of it: documents are split only with the user's word
    from grain_rox import open_rox

    with open_rox(str(folder)) as corpus:
        assert (corpus.eos_id, corpus.tokenizer, corpus.pad_id) == (None, None, None)
    with pytest.raises(ValueError) as info:
        RoxDocumentSource(str(folder), seq_len=64)
    assert str(info.value).startswith(
        f"{folder / 'a.rox'}: no EOS id to split documents at (its shard sets end their "
        "documents with different EOS ids, or not every set records one ("
    )
    assert len(RoxDocumentSource(str(folder), seq_len=64, eos_id=256)) >= 40
    # RoxTokenSource served the folder without its segment features, without a word
    with pytest.raises(ValueError, match=r"RoxTokenSource: .*the segment features need one EOS"):
        RoxTokenSource(str(folder), seq_len=16)
    features = RoxTokenSource(str(folder), seq_len=16, eos_id=256)[0]
    assert "inputs_segmentation" in features
    # a source with such shards, beside a source of another tokenizer, is still compared
    other = tmp_path / "other"
    words = ["doc", *map(str, range(40))]
    tok = _word_tokenizer(tmp_path / "t", words)
    write_rox([f"doc {i} " * 20 for i in range(40)], str(other / "b.rox"), tokenizer=tok)
    for given in ({"eos_id": 256}, {"segmentation": False}):
        with pytest.raises(ValueError, match=r"the sources were tokenized differently \('a' \("):
            TokenPipeline({"a": str(folder), "b": str(other)}, weights={"a": 1, "b": 1},
                          seq_len=8, global_batch_size=4, **given).map_dataset()  # fmt: skip


def test_one_tokenizer_copied_to_another_folder_is_the_same_tokenizer(tmp_path):
    """A tokenizer.json is named by its folder (hf:llama, hf:copy): the same file in two
    folders was taken for two tokenizers."""
    import shutil

    words = ["the", "cat", "sat"]
    first = _word_tokenizer(tmp_path / "llama", words)
    (tmp_path / "copy").mkdir()
    shutil.copy(first, tmp_path / "copy" / "tokenizer.json")
    texts = [f"the cat sat {i}" for i in range(200)]
    write_rox(texts, str(tmp_path / "data" / "part1.rox"), tokenizer=first)
    write_rox(texts, str(tmp_path / "data" / "part2.rox"),
              tokenizer=str(tmp_path / "copy" / "tokenizer.json"))  # fmt: skip
    pipe = TokenPipeline(str(tmp_path / "data"), seq_len=8, global_batch_size=4)
    assert pipe.map_dataset()[0]["inputs_segmentation"].shape == (4, 8)
    write_rox(texts, str(tmp_path / "alone" / "p.rox"), tokenizer=first)
    both = {"a": str(tmp_path / "data"), "b": str(tmp_path / "alone")}
    pipe = TokenPipeline(both, weights={"a": 1, "b": 1}, seq_len=8, global_batch_size=4)
    assert pipe.map_dataset()[0]["inputs"].shape == (4, 8)


def test_one_sources_sets_of_other_separators_take_the_users_eos_id(tmp_path):
    """Two sets of one tokenizer written with other separators: refused without a word on the
    EOS, and taken with eos_id= (or without segments), as the refusal advises; the check
    across sources compared their EOS ids again and refused them as other tokenizers."""
    folder = tmp_path / "data"
    write_rox(["hello world " * 50] * 20, str(folder / "a.rox"), tokenizer="bytes")
    write_rox(["hello world " * 50] * 20, str(folder / "b.rox"), tokenizer="bytes", separator=10)
    with pytest.raises(ValueError, match=r"its shard sets end their documents with different EOS"):
        TokenPipeline(str(folder), seq_len=16, global_batch_size=8).map_dataset()
    for given in ({"eos_id": 256}, {"segmentation": False}):
        pipe = TokenPipeline(str(folder), seq_len=16, global_batch_size=8, **given)
        assert pipe.map_dataset()[0]["inputs"].shape == (8, 16)
    write_rox(["more " * 50] * 20, str(tmp_path / "c" / "c.rox"), tokenizer="bytes")
    both = {"ab": str(folder), "c": str(tmp_path / "c")}
    pipe = TokenPipeline(both, weights={"ab": 1, "c": 1}, seq_len=16, global_batch_size=8,
                         eos_id=256)  # fmt: skip
    assert pipe.map_dataset()[0]["inputs"].shape == (8, 16)
