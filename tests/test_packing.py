"""Document packing: documents kept whole, exactly once per epoch, checkpointable, and
segment ids that work as an attention mask (no token attends across documents)."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from grain_rox import (
    RoxDocumentSource,
    TokenPipeline,
    pack_documents,
    padding_efficiency,
)


@pytest.fixture(scope="module")
def docs_corpus(make_rox):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, 300)
    docs = [
        np.full(n, 1 + (i % 60000), np.uint16) + np.arange(n, dtype=np.uint16) % 3
        for i, n in enumerate(lengths)
    ]
    docs.append(np.arange(1, 100, dtype=np.uint16))  # one long document (99 tokens)
    return make_rox("d", docs, separator=0, block_size=256, max_shard_bytes=2000), docs


def test_documents_are_found_at_eos_across_shards(docs_corpus):
    path, docs = docs_corpus
    source = RoxDocumentSource(path, seq_len=128)
    assert len(source.corpus.paths) > 3
    assert len(source) == len(docs)
    for i in [0, 1, 150, len(docs) - 1]:
        expected = np.concatenate([docs[i], [0]])
        np.testing.assert_array_equal(source[i]["inputs"], expected[:-1])
        np.testing.assert_array_equal(source[i]["targets"], expected[1:])


def test_long_documents_split_with_one_token_overlap_or_truncate(docs_corpus):
    path, docs = docs_corpus
    split = RoxDocumentSource(path, seq_len=32)
    truncated = RoxDocumentSource(path, seq_len=32, long_documents="truncate")
    long_doc = np.concatenate([docs[-1], [0]])  # 100 tokens -> pieces of 33 overlapping by 1
    pieces = [split[i] for i in range(len(split) - 4, len(split))]
    assert [p["inputs"].size for p in pieces] == [32, 32, 32, 3]
    rebuilt = np.concatenate([p["inputs"] for p in pieces] + [pieces[-1]["targets"][-1:]])
    np.testing.assert_array_equal(rebuilt, long_doc)
    assert len(truncated) == len(docs)
    np.testing.assert_array_equal(truncated[len(docs) - 1]["inputs"], long_doc[:32])
    with pytest.raises(ValueError, match="long_documents='cut'"):
        RoxDocumentSource(path, seq_len=8, long_documents="cut")  # type: ignore[arg-type]


def segments(batch: dict[str, np.ndarray]) -> list[tuple[int, ...]]:
    out = []
    for row, seg, pos in zip(
        batch["inputs"], batch["inputs_segmentation"], batch["inputs_position"], strict=True
    ):
        for s in np.unique(seg[seg > 0]):
            sel = seg == s
            np.testing.assert_array_equal(pos[sel], np.arange(sel.sum()))
            out.append(tuple(row[sel].tolist()))
    return out


@pytest.mark.parametrize("method", ["best_fit", "first_fit"])
def test_every_document_packed_exactly_once_per_epoch(docs_corpus, method):
    path, _ = docs_corpus
    source = RoxDocumentSource(path, seq_len=48)
    ds = pack_documents(
        source, seq_len=48, batch_size=4, seed=7, num_epochs=1, method=method, num_packing_bins=8
    )
    batches = list(ds)
    packed = collections.Counter(s for b in batches for s in segments(b))
    expected = collections.Counter(tuple(source[i]["inputs"].tolist()) for i in range(len(source)))
    # drop_remainder may drop the last partial batch: everything else exactly once.
    assert sum((packed - expected).values()) == 0
    assert sum((expected - packed).values()) < 4 * 8
    for b in batches:
        pad = b["inputs_segmentation"] == 0
        assert np.all(b["inputs"][pad] == 0) and np.all(b["targets_segmentation"][pad] == 0)
        np.testing.assert_array_equal(b["targets_segmentation"], b["inputs_segmentation"])


def test_packing_iterator_restores_exactly(docs_corpus):
    path, _ = docs_corpus
    ds = pack_documents(RoxDocumentSource(path, seq_len=32), seq_len=32, batch_size=2, seed=1)
    it = iter(ds)
    for _ in range(5):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(5)]
    again = iter(ds)
    again.set_state(state)
    for e in expected:
        got = next(again)
        for key in e:
            np.testing.assert_array_equal(got[key], e[key])


def test_best_fit_pads_less_than_first_fit_on_real_text(make_rox):
    from grain_rox._text._builtin_corpus import builtin_documents

    path = make_rox("prose", builtin_documents("prose", limit=400), tokenizer="bytes")
    source = RoxDocumentSource(path, seq_len=512)
    eff = {}
    for method in ("best_fit", "first_fit"):
        ds = pack_documents(
            source, seq_len=512, batch_size=8, num_epochs=1, method=method, num_packing_bins=32
        )
        eff[method] = padding_efficiency(list(ds))
    assert eff["best_fit"] >= eff["first_fit"] > 0.5, eff


def test_segment_ids_mask_attention_in_a_flax_layer(make_rox):
    """Change every token of one document: the outputs at other documents' positions stay
    bit-identical, so no position attends across a document boundary."""
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    nnx = pytest.importorskip("flax.nnx")
    rng = np.random.default_rng(3)
    docs = [rng.integers(1, 200, n, dtype=np.uint16) for n in (9, 14, 5, 20, 7, 11, 6, 13)]
    path = make_rox("a", docs, separator=0, block_size=64)
    batch = next(
        iter(TokenPipeline(path, seq_len=24, global_batch_size=2, chunk_tokens=64).map_dataset())
    )
    seg = batch["inputs_segmentation"]
    assert (seg.max(axis=1) > 1).all(), "each row should hold several documents"

    embed = nnx.Embed(256, 16, rngs=nnx.Rngs(0))
    attention = nnx.MultiHeadAttention(num_heads=2, in_features=16, decode=False, rngs=nnx.Rngs(1))

    def forward(tokens, segmentation):
        same = segmentation[:, :, None] == segmentation[:, None, :]
        causal = jnp.tril(jnp.ones((tokens.shape[1],) * 2, bool))
        mask = (same & causal)[:, None]
        return attention(embed(tokens), mask=mask)

    tokens = jnp.asarray(batch["inputs"])
    base = forward(tokens, jnp.asarray(seg))
    victim = seg == 2  # the second document of each row
    changed = jnp.where(jnp.asarray(victim), (tokens + 17) % 256, tokens)
    out = forward(changed, jnp.asarray(seg))
    others = ~victim
    np.testing.assert_array_equal(np.asarray(out)[others], np.asarray(base)[others])
    assert not np.allclose(np.asarray(out)[victim], np.asarray(base)[victim])
    del jax


def test_ids_that_int32_cannot_hold_are_refused_naming_the_document():
    """The packed batches are int32: an id from 2**31 on wrapped (3,000,000,000 was served as
    -1,294,967,296); ids that fit pass unchanged, whatever their dtype."""
    fits = [np.array([2**31 - 1, 5, 0, 7], np.int64), np.array([4, 2, 0], np.uint32)]
    batch = next(iter(pack_documents(fits, seq_len=8, batch_size=1, num_epochs=1, shuffle=False)))
    assert batch["inputs"].dtype == np.int32
    assert batch["inputs"][0, :5].tolist() == [2**31 - 1, 5, 0, 4, 2]
    wide = [np.array([1, 2, 0]), np.array([3_000_000_000, 5, 0], np.int64)]
    with pytest.raises(ValueError, match=r"document 1 holds the id 3000000000 in its tokens"):
        list(pack_documents(wide, seq_len=8, batch_size=1, num_epochs=1, shuffle=False))
    floats = [{"inputs": np.array([1.5, 2.0]), "targets": np.array([2.0, 3.0])}]
    with pytest.raises(ValueError, match=r"document 0's inputs are float64, not integer token"):
        list(pack_documents(floats, seq_len=8, batch_size=1, num_epochs=1, shuffle=False))


def test_pairs_of_other_lengths_are_refused_naming_the_record():
    """A piece was cut by inputs' length alone: 3 inputs with 9 targets reached Grain's packer
    whole ("Inputs to packer must be truncated"), 9 inputs with 2 targets gave pieces with
    empty targets."""
    for n, m in ((3, 9), (9, 2)):
        pairs = [{"inputs": np.arange(1, n + 1), "targets": np.arange(2, m + 2)}]
        with pytest.raises(ValueError, match=rf"record 0 has inputs of shape \({n},\) but "
                           rf"targets of shape \({m},\); it packs next-token pairs"):  # fmt: skip
            list(pack_documents(pairs, seq_len=4, batch_size=1, num_epochs=1, shuffle=False))
