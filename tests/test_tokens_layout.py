"""layout="tokens": one array a batch, and the MaxText features unpacked from it, equal to the
host's features for every batch, on the host and inside jax.jit."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from grain_rox import MultiHostDataLoadIterator, Phase, TokenPipeline, write_rox
from grain_rox._sources._segments import MAXTEXT_FEATURES


def _docs(seed: int, count: int, dtype, high: int, eos: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(count):
        doc = rng.integers(1, high, int(rng.integers(1, 90)), dtype=np.int64)
        docs.append(np.where(doc == eos, eos + 1, doc).astype(dtype))
    return docs


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("tokens_layout")
    out = {}
    for name, seed, dtype, high, eos in (
        ("a", 0, np.uint16, 60_000, 0),
        ("b", 1, np.uint16, 60_000, 0),
        ("other_eos", 2, np.uint16, 60_000, 7),
        ("wide", 3, np.uint32, 4_000_000_000, 0),
    ):
        out[name] = str(d / f"{name}.rox")
        write_rox(_docs(seed, 700, dtype, high, eos), out[name], separator=eos)
    return out


CASES = {
    "one source, one join column": dict(sources="a", chunk_tokens=4096),
    "windows across 3 joins": dict(sources="a", chunk_tokens=7),
    "two sources, one EOS": dict(sources=("a", "b"), chunk_tokens=60),
    "two EOS ids (EOS column)": dict(
        sources=("a", "other_eos"), chunk_tokens=100, allow_mixed_tokenizers=True
    ),
    "no segment features": dict(sources="a", segmentation=False),
    "uint32 tokens": dict(sources="wide", chunk_tokens=300),
    "uint16 output": dict(sources="a", dtype=np.uint16, chunk_tokens=50),
}


def _pipeline(corpora, *, sources, **kwargs) -> TokenPipeline:
    if isinstance(sources, tuple):
        spec = {n: corpora[n] for n in sources}
        weights = {n: 1.0 for n in sources}
        phases = [Phase(5, 8, 16, weights), Phase(None, 4, 40, weights)]
        return TokenPipeline(spec, phases=phases, seed=3, **kwargs)
    phases = [Phase(5, 8, 16), Phase(None, 4, 40)]
    return TokenPipeline(corpora[sources], phases=phases, seed=3, **kwargs)


@pytest.mark.parametrize("case", CASES)
def test_unpacked_tokens_equal_the_host_features(corpora, case):
    pipe = _pipeline(corpora, **CASES[case])
    tokens_pipe = pipe.with_layout("tokens")
    host = pipe.map_dataset()
    packed = tokens_pipe.map_dataset()
    unpack = jax.jit(pipe.unpack)
    crossed = 0
    for step in (0, 1, 4, 5, 6, 30):  # both phases (seq_len 16, then 40)
        expected, batch = host[step], packed[step]
        tokens = batch["tokens"]
        assert list(batch) == ["tokens"] and not tokens.flags.writeable
        layout = tokens_pipe.tokens_layout()
        assert tokens.dtype == layout.dtype
        assert tokens.shape == (
            expected["inputs"].shape[0],
            layout.width(expected["inputs"].shape[1]),
        )
        crossed += int((tokens[:, layout.seq_len(tokens.shape[1]) + 1 :] > 0).any())
        for features in (pipe.unpack(batch), unpack(batch)):
            assert sorted(features) == sorted(expected)
            for key in expected:
                np.testing.assert_array_equal(np.asarray(features[key]), expected[key], err_msg=key)
                assert np.asarray(features[key]).dtype == expected[key].dtype, key
    if pipe.segmentation and case != "one source, one join column":
        assert crossed, "the case should exercise join (or EOS) columns"


def test_the_layout_is_as_small_as_the_data_allows(corpora):
    one_phase = TokenPipeline(corpora["a"], seq_len=40, global_batch_size=4, chunk_tokens=4096)
    layout = one_phase.tokens_layout()
    assert (layout.join_columns, layout.eos_id, layout.eos_column, layout.dtype) == (
        1,
        0,
        False,
        np.dtype("uint16"),
    )
    assert TokenPipeline(corpora["a"], seq_len=40, global_batch_size=4,
                         chunk_tokens=7).tokens_layout().join_columns == 6  # fmt: skip
    # seq_len 16 then 40: a 40-token window over the rest of a block's 16-token grid crosses
    # up to 3 joins between holes, and each of its 4 holes may cross one chunk join (or 3)
    assert (
        _pipeline(corpora, **CASES["one source, one join column"]).tokens_layout().join_columns == 7
    )
    assert _pipeline(corpora, **CASES["windows across 3 joins"]).tokens_layout().join_columns == 15
    mixed = _pipeline(corpora, **CASES["two EOS ids (EOS column)"]).tokens_layout()
    assert (mixed.eos_id, mixed.eos_column) == (None, True)
    plain = _pipeline(corpora, **CASES["no segment features"]).tokens_layout()
    assert (plain.join_columns, plain.eos_column, plain.features) == (0, False, False)


def test_unpack_names_the_layout_it_needs(corpora):
    pipe = _pipeline(corpora, sources="a")
    with pytest.raises(KeyError, match="unpack\\(\\) reads a layout='tokens' or 'windows' batch"):
        pipe.unpack(pipe.map_dataset()[0])


def test_float_tokens_have_no_tokens_layout(tmp_path):
    path = str(tmp_path / "f.rox")
    write_rox([np.linspace(0, 1, 5000, dtype=np.float32)], path)
    pipe = TokenPipeline(path, seq_len=8, global_batch_size=4, layout="tokens", dtype=np.float32)
    with pytest.raises(
        ValueError, match=r"packs integer token ids, but these sources store \['float32'\]"
    ):
        pipe.map_dataset()


def test_the_iterator_sends_one_array_and_derives_the_features_on_the_devices(corpora):
    weights = {"a": 1.0, "b": 2.0}
    phases = [Phase(5, 16, 16, weights), Phase(None, 8, 40, weights)]
    spec = {"a": corpora["a"], "b": corpora["b"]}
    pipe = TokenPipeline(spec, phases=phases, seed=5, chunk_tokens=64)
    host = pipe.map_dataset()
    with (
        MultiHostDataLoadIterator(pipe, features_on_device=True) as fast,
        MultiHostDataLoadIterator(pipe, features_on_device=False) as slow,
    ):
        assert fast._feed.derive is not None and slow._feed.derive is None
        for step in range(8):
            a, b = next(fast), next(slow)
            assert sorted(a) == sorted(b) == sorted(MAXTEXT_FEATURES)
            for key in MAXTEXT_FEATURES:
                assert a[key].sharding == b[key].sharding, key
                np.testing.assert_array_equal(np.asarray(a[key]), host[step][key], err_msg=key)
                np.testing.assert_array_equal(np.asarray(b[key]), host[step][key], err_msg=key)
        state = fast.get_state()
        assert state == slow.get_state()
    with MultiHostDataLoadIterator(pipe, features_on_device=True) as resumed:
        resumed.set_state(state)
        np.testing.assert_array_equal(
            np.asarray(next(resumed)["inputs_position"]), host[8]["inputs_position"]
        )


def test_features_are_derived_on_the_devices_only_when_they_are_accelerators(corpora):
    pipe = TokenPipeline(corpora["a"], seq_len=16, global_batch_size=8)
    with MultiHostDataLoadIterator(pipe) as it:
        on_cpu = all(d.platform == "cpu" for d in it.mesh.devices.flat)
        assert (it._feed.derive is None) == on_cpu


def test_deriving_the_features_on_the_devices_needs_no_collectives():
    """Each device derives its own rows: no all-gather across processes (from the prefetch
    thread, it would race the training step's collectives)."""
    from jax.sharding import NamedSharding, PartitionSpec

    from grain_rox._sources._tokens_layout import TokensLayout

    sharding = NamedSharding(jax.make_mesh((jax.device_count(),), ("data",)), PartitionSpec("data"))
    layout = TokensLayout(join_columns=3, eos_id=None, eos_column=True, dtype=np.dtype("uint16"))
    derive = jax.jit(lambda b: layout.unpack(b, out_dtype=np.int32), out_shardings=sharding)
    batch = jax.device_put(np.zeros((2 * jax.device_count(), 21), np.uint16), sharding)
    compiled = derive.lower(batch).compile().as_text()
    for collective in ("all-gather", "all-reduce", "collective-permute", "all-to-all"):
        assert collective not in compiled, collective


def test_a_state_restores_only_onto_the_layout_it_was_saved_with(corpora):
    """The layout is part of the pipeline's identity: a tokens-layout state onto a maxtext
    pipeline is refused, naming the change (the batches would arrive in another shape)."""
    pipe = TokenPipeline(corpora["a"], seq_len=16, global_batch_size=8, seed=2)
    with MultiHostDataLoadIterator(pipe.with_layout("tokens")) as it:
        next(it)
        state = it.get_state()
    with (
        MultiHostDataLoadIterator(pipe) as other,
        pytest.raises(ValueError, match=r"layout: saved 'tokens' -> now 'maxtext'"),
    ):
        other.set_state(state)
