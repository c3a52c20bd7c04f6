"""TokenPipeline.plan: a pipeline is resolved against its data once, and every part of the
library that needs the opened shards or the lane orders reads that one plan; it is not
pickled, and it is no part of the pipeline's equality or repr."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from _corpora import random_documents

from grain_rox import MultiHostDataLoadIterator, TokenPipeline
from grain_rox._format._rox_corpus import RoxCorpus


@pytest.fixture(scope="module")
def paths(make_rox):
    return {
        name: make_rox(name, random_documents(seed, 300, lengths=(5, 60)), separator=0)
        for seed, name in enumerate("ab")
    }


def finite(paths, **changes) -> TokenPipeline:
    config = {"seq_len": 16, "global_batch_size": 8, "seed": 3, "num_epochs": 1}
    return TokenPipeline(paths["a"], **(config | changes))


def mixture(paths) -> TokenPipeline:
    return TokenPipeline(paths, seq_len=16, global_batch_size=8, seed=5, weights={"a": 2, "b": 1})


def first_batches(pipe: TokenPipeline, count: int = 3) -> list[dict[str, np.ndarray]]:
    return [pipe.map_dataset()[k] for k in range(count)]


def assert_same_batches(got, expected) -> None:
    for g, e in zip(got, expected, strict=True):
        assert g.keys() == e.keys()
        for key in e:
            np.testing.assert_array_equal(g[key], e[key])


def test_the_iterator_length_identity_and_sources_open_the_data_once(paths, monkeypatch):
    """Before: the iterator, len(it) and every batch_source() each opened every shard and
    built every lane order again."""
    opened = []
    real_init = RoxCorpus.__init__

    def counting_init(self, *args, **kwargs):
        opened.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(RoxCorpus, "__init__", counting_init)
    pipe = finite(paths)
    with MultiHostDataLoadIterator(pipe) as it:
        assert len(it) == pipe.num_batches == pipe.total_steps
        next(it)
    pipe.describe()
    sources = [pipe.batch_source(), pipe.batch_source(rows=(0, 4), first_step=2)]
    pipe.map_dataset()[1]
    pipe.check_step(3)
    pipe.estimate_steps(seq_len=8, batch_size=4)
    assert pipe.step_limit == pipe.num_batches
    assert len(opened) == 1
    plan = pipe.plan
    assert plan is pipe.plan
    assert all(s.corpora == plan.corpora and s.orders is plan.orders for s in sources)
    assert plan.corpora[""] is opened[0]


def test_the_plan_is_not_pickled_and_a_copy_resolves_an_equal_one(paths):
    pipe = mixture(paths)
    expected = first_batches(pipe)
    assert "plan" in vars(pipe)  # resolved
    blob = pickle.dumps(pipe)
    assert blob == pickle.dumps(mixture(paths))  # the bytes of a pipeline never resolved
    clone = pickle.loads(blob)
    assert "plan" not in vars(clone)
    assert_same_batches(first_batches(clone), expected)
    assert clone.plan is not pipe.plan and clone.describe() == pipe.describe()


def test_equality_and_repr_ignore_the_plan(paths):
    resolved, fresh = finite(paths), finite(paths)
    resolved.plan  # noqa: B018 - resolves it
    assert "plan" in vars(resolved) and "plan" not in vars(fresh)
    assert resolved == fresh and repr(resolved) == repr(fresh)
    assert "PipelinePlan" not in repr(resolved)
    assert resolved != finite(paths, seed=4)
    with pytest.raises(TypeError, match="unhashable"):  # its sources are a dict, plan or not
        hash(resolved)
