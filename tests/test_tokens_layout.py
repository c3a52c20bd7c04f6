"""layout="tokens": one array a batch, and the MaxText features unpacked from it, equal to the
host's features for every batch, on the host and inside jax.jit."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

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
        ("wide", 3, np.uint32, 2**31 - 1, 0),  # ids beyond uint16, all an int32 holds
        ("signed", 4, np.int32, 60_000, 0),
        ("unsigned", 5, np.uint32, 60_000, 0),
    ):
        out[name] = str(d / f"{name}.rox")
        write_rox(_docs(seed, 700, dtype, high, eos), out[name], separator=eos)
    return out


CASES = {
    # short windows (16, then 40 tokens): the joins travel as a join mask, narrower than columns
    "one source, chunk joins": dict(sources="a", chunk_tokens=4096),
    "windows across 3 joins": dict(sources="a", chunk_tokens=7),
    "two sources, one EOS": dict(sources=("a", "b"), chunk_tokens=60),
    "two EOS ids (EOS column)": dict(
        sources=("a", "other_eos"), chunk_tokens=100, allow_mixed_tokenizers=True
    ),
    "no segment features": dict(sources="a", segmentation=False),
    "uint32 tokens": dict(sources="wide", chunk_tokens=300),
    "uint16 output": dict(sources="a", dtype=np.uint16, chunk_tokens=50),
    # longer windows (200, then 500 tokens): join columns, narrower than a mask
    "join columns": dict(sources="a", chunk_tokens=4096, seq_lens=(200, 500)),
    "join columns, two EOS ids": dict(
        sources=("a", "other_eos"),
        chunk_tokens=700,
        seq_lens=(200, 500),
        allow_mixed_tokenizers=True,
    ),
    # packed rows: a join at every document boundary (a join mask) and a content column
    "packed rows": dict(sources="a", packing="best_fit", chunk_tokens=200),
    # the rest of a block's 40-token rows, cut into 16-token rows (joins where they were cut)
    "packed rows, seq_len 40 then 16": dict(
        sources="a", packing="best_fit", chunk_tokens=200, seq_lens=(40, 16)
    ),
    "packed rows, first fit, uint32": dict(sources="wide", packing="first_fit", chunk_tokens=300),
    # an int32 source mixed with a uint32 one: int64 tokens, whose mask columns hold 32 bits
    # (a column is unpacked as uint32; with 63 per column the joins came out wrong)
    "int64 tokens": dict(
        sources=("signed", "unsigned"),
        chunk_tokens=40,
        seq_lens=(62, 130),
        allow_mixed_tokenizers=True,
    ),
    "int64 tokens, packed": dict(
        sources=("signed", "unsigned"),
        packing="best_fit",
        chunk_tokens=300,
        seq_lens=(63, 31),
        allow_mixed_tokenizers=True,
    ),
    "packed rows, two EOS ids": dict(
        sources=("a", "other_eos"),
        packing="best_fit",
        chunk_tokens=150,
        allow_mixed_tokenizers=True,
    ),
}


def _pipeline(corpora, *, sources, seq_lens=(16, 40), **kwargs) -> TokenPipeline:
    short, long = seq_lens
    if isinstance(sources, tuple):
        spec = {n: corpora[n] for n in sources}
        weights = {n: 1.0 for n in sources}
        phases = [Phase(5, 8, short, weights), Phase(None, 4, long, weights)]
        return TokenPipeline(spec, phases=phases, seed=3, **kwargs)
    phases = [Phase(5, 8, short), Phase(None, 4, long)]
    return TokenPipeline(corpora[sources], phases=phases, seed=3, **kwargs)


@pytest.mark.parametrize("case", CASES)
def test_unpacked_tokens_equal_the_host_features(corpora, case):
    pipe = _pipeline(corpora, **CASES[case])
    tokens_pipe = pipe.with_layout("tokens")
    host = pipe.map_dataset()
    packed = tokens_pipe.map_dataset()
    unpack = jax.jit(pipe.unpack)
    crossed = 0
    padded = False
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
        padded |= bool((expected.get("inputs_segmentation", np.ones(1)) == 0).any())
        for features in (pipe.unpack(batch), unpack(batch)):
            assert sorted(features) == sorted(expected)
            for key in expected:
                np.testing.assert_array_equal(np.asarray(features[key]), expected[key], err_msg=key)
                assert np.asarray(features[key]).dtype == expected[key].dtype, key
    if pipe.segmentation and case not in ("one source, chunk joins", "join columns"):
        assert crossed, "the case should exercise join (or EOS) columns"
    if pipe.packing:
        assert padded, "the case should exercise padding"


def test_a_packed_row_says_its_padding_and_its_joins(corpora):
    """The content column and the join mask of a packed batch, read directly: each row's
    tokens before its padding, and a bit at each position where a piece of another document
    starts without an EOS before it (as the host features cut the targets there)."""
    pipe = _pipeline(corpora, **CASES["packed rows"])
    layout = pipe.tokens_layout()
    assert (layout.join_mask, layout.content_column, layout.join_columns) == (True, True, 0)
    host, tokens = pipe.map_dataset(), pipe.with_layout("tokens").map_dataset()
    seq_len = layout.seq_len(tokens[0]["tokens"].shape[1])
    padded = [
        k for k in range(min(64, len(tokens))) if (tokens[k]["tokens"][:, -1] < seq_len + 1).any()
    ]
    assert len(padded) >= 2, "the case should exercise padded rows"
    for step in padded[:2]:
        batch = tokens[step]["tokens"]
        assert batch.shape[1] == seq_len + 1 + -(-(seq_len + 1) // 16) + 1
        content = batch[:, -1].astype(int)
        t = np.arange(seq_len)
        # a row's tokens are a prefix of it (segment > 0), the padding after them (segment 0)
        np.testing.assert_array_equal(host[step]["inputs_segmentation"] > 0, t < content[:, None])
        assert ((content >= 0) & (content <= seq_len + 1)).all()
        assert (content < seq_len + 1).any(), "the batch should hold padded rows"
        words = batch[:, seq_len + 1 : -1].astype(np.uint32)
        bits = (words[:, :, None] >> np.arange(16, dtype=np.uint32)) & 1
        joins = bits.reshape(batch.shape[0], -1)[:, : seq_len + 1].astype(bool)
        assert not joins[:, 0].any()
        cut = host[step]["targets_segmentation"] == 0  # a join at c + 1 cuts target c
        padding = np.arange(seq_len)[None, :] + 1 >= content[:, None]
        np.testing.assert_array_equal(joins[:, 1:] & ~padding, cut & ~padding)


def test_the_layout_is_as_small_as_the_data_allows(corpora):
    one_phase = TokenPipeline(corpora["a"], seq_len=40, global_batch_size=4, chunk_tokens=4096)
    layout = one_phase.tokens_layout()
    assert (layout.join_columns, layout.eos_id, layout.eos_column, layout.dtype) == (
        1,
        0,
        False,
        np.dtype("uint16"),
    )
    # 7-token chunks: a 41-token window crosses 6 joins; 6 join columns, or a 3-column mask
    tiny = TokenPipeline(corpora["a"], seq_len=40, global_batch_size=4, chunk_tokens=7)
    assert (tiny.tokens_layout().join_mask, tiny.tokens_layout().width(40)) == (True, 41 + 3)
    assert TokenPipeline(corpora["a"], seq_len=40, global_batch_size=4,
                         chunk_tokens=20).tokens_layout().join_columns == 2  # fmt: skip
    # seq_len 16 then 40: a 40-token window over the rest of a block's 16-token grid crosses
    # up to 3 joins between holes, and each of its 4 holes may cross one chunk join: 7 join
    # columns, or a 3-column mask; at 200 then 500 tokens, 7 columns against a 32-column mask
    phased = _pipeline(corpora, **CASES["one source, chunk joins"]).tokens_layout()
    assert (phased.join_mask, phased.mask_columns(40)) == (True, 3)
    assert _pipeline(corpora, **CASES["join columns"]).tokens_layout().join_columns == 7
    mixed_columns = _pipeline(corpora, **CASES["join columns, two EOS ids"]).tokens_layout()
    assert (mixed_columns.join_mask, mixed_columns.eos_column) == (False, True)
    # up to 15 joins a 40-token window: a 3-column join mask (16 positions a column) is narrower
    across = _pipeline(corpora, **CASES["windows across 3 joins"]).tokens_layout()
    assert (across.join_mask, across.join_columns, across.mask_columns(40)) == (True, 0, 3)
    assert across.width(40) == 41 + 3
    packed = _pipeline(corpora, **CASES["packed rows, first fit, uint32"]).tokens_layout()
    assert (packed.join_mask, packed.content_column, packed.bits) == (True, True, 32)
    wide = _pipeline(corpora, **CASES["int64 tokens, packed"]).tokens_layout()
    # (31 bits a 64-bit column: JAX places it as int32 without x64, and a 32nd was refused)
    assert (wide.dtype, wide.bits, wide.mask_columns(63)) == (np.dtype("int64"), 31, 3)
    assert packed.width(40) == 41 + 2 + 1 and packed.seq_len(44) == 40
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


@pytest.mark.parametrize("devices", [1, 8], ids=["one_device_by_call", "8_devices_device_put"])
@pytest.mark.parametrize("on_device", [True, False], ids=["device_features", "host_features"])
def test_a_step_may_donate_the_batch(corpora, on_device, devices):
    """Every feature is its own device array, equal features included (the positions, and
    the segments where no join masks a target): a step that donates the batch must not
    donate one buffer twice (an error, then a crash on CPU), in every phase's shape, placed
    by one jitted call (one device) or by device_put (several)."""
    phases = [Phase(3, 16, 16), Phase(None, 8, 24)]
    pipe = TokenPipeline(corpora["a"], phases=phases, seed=2)
    host = pipe.map_dataset()
    step = jax.jit(lambda batch: {k: v + 1 for k, v in batch.items()}, donate_argnums=0)
    mesh = Mesh(np.asarray(jax.devices()[:devices]), ("data",))
    with MultiHostDataLoadIterator(pipe, mesh=mesh, features_on_device=on_device) as it:
        assert it._place_by_call is (devices == 1)
        for k in range(5):
            batch = next(it)
            buffers = (
                {v.unsafe_buffer_pointer() for v in batch.values()}
                if devices == 1
                else {id(v) for v in batch.values()}
            )
            assert len(buffers) == len(MAXTEXT_FEATURES), sorted(batch)
            out = jax.block_until_ready(step(batch))
            assert all(v.is_deleted() for v in batch.values())  # donated
            for key in MAXTEXT_FEATURES:
                np.testing.assert_array_equal(np.asarray(out[key]) - 1, host[k][key], key)


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
    columns = TokensLayout(join_columns=3, eos_id=None, eos_column=True, dtype=np.dtype("uint16"))
    packed = TokensLayout(
        join_columns=0,
        eos_id=0,
        eos_column=False,
        dtype=np.dtype("uint16"),
        join_mask=True,
        content_column=True,
    )
    for layout in (columns, packed):
        derive = jax.jit(lambda b, layout=layout: layout.unpack(b, out_dtype=np.int32),
                         out_shardings=sharding)  # fmt: skip
        rows = np.zeros((2 * jax.device_count(), layout.width(40)), np.uint16)
        compiled = derive.lower(jax.device_put(rows, sharding)).compile().as_text()
        for collective in ("all-gather", "all-reduce", "collective-permute", "all-to-all"):
            assert collective not in compiled, (layout, collective)


def test_a_state_restores_under_another_layout_with_the_same_batches(corpora):
    """The layout is the batches' form, not which batches: a state saved under one restores
    under another (a run may move to the one-array layout mid-way) and goes on with the same
    batches in the new form, for every iterator (MultiHostDataLoadIterator and iter_dataset
    refused it; data_loader accepted it). Segment features on or off change what the model
    attends to: refused by every iterator."""
    pipe = TokenPipeline(corpora["a"], seq_len=16, global_batch_size=8, seed=2)
    unmasked = TokenPipeline(corpora["a"], seq_len=16, global_batch_size=8, seed=2,
                             segmentation=False)  # fmt: skip
    forms = [pipe, pipe.with_layout("tokens"), pipe.with_layout("windows")]

    def features(form, batch):
        return form.unpack(batch) if form.layout != "maxtext" else batch

    for saved in forms:
        with MultiHostDataLoadIterator(saved) as it:
            next(it)
            state = it.get_state()
            expected = features(saved, next(it))
        for restored in forms:
            with MultiHostDataLoadIterator(restored) as again:
                again.set_state(state)
                got = features(restored, next(again))
            assert set(got) == set(expected) == set(MAXTEXT_FEATURES)
            assert all(np.array_equal(got[k], expected[k]) for k in expected), (saved, restored)
        with (
            MultiHostDataLoadIterator(unmasked) as other,
            pytest.raises(ValueError, match=r"segmentation: saved True -> now False"),
        ):
            other.set_state(state)
        for made in ("iter_dataset", "data_loader"):
            mine = iter(getattr(saved, made)())
            next(mine)
            inner = mine.get_state()
            following = features(saved, next(mine))
            for restored in forms:
                again = iter(getattr(restored, made)())
                again.set_state(inner)
                got = features(restored, next(again))
                assert all(np.array_equal(got[k], following[k]) for k in following)
            refusal = (
                "segmentation: saved True"
                if made == "iter_dataset"
                else r"changed \(config: saved \w+ -> now \w+\)\. .*'segmentation': False"
            )
            with pytest.raises(ValueError, match=refusal):
                iter(getattr(unmasked, made)()).set_state(inner)


def _two_devices() -> jax.sharding.NamedSharding:
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))


def test_int64_tokens_of_packed_rows_reach_the_devices_as_on_the_host(corpora):
    """A join at a mask column's 32nd bit made an int64 value of 2**31 or more, which JAX
    places as int32 without x64: the features on the devices (the accelerator default) and
    layout='tokens' were refused as a wrap, where the host features served the batches."""
    weights = {"signed": 0.5, "unsigned": 0.5}
    pipe = TokenPipeline({n: corpora[n] for n in weights}, phases=[Phase(None, 8, 63, weights)],
                         packing="best_fit", chunk_tokens=300, seed=1,
                         allow_mixed_tokenizers=True)  # fmt: skip
    host = pipe.batch_source()
    unpack = jax.jit(pipe.unpack)
    for kwargs, unpacked in (({"features_on_device": True}, False), ({}, True)):
        form = pipe.with_layout("tokens") if unpacked else pipe
        with MultiHostDataLoadIterator(form, data_sharding=_two_devices(), **kwargs) as it:
            for step in range(40):
                got = next(it)
                got = unpack(got) if unpacked else got
                for key, value in host[step].items():
                    np.testing.assert_array_equal(np.asarray(got[key]), value, err_msg=key)


def test_int64_from_uint32_ids_past_2_31_is_refused_on_the_devices_too(tmp_path):
    """dtype=int64 without x64 is placed as int32: the host refused ids from 2**31 on, but
    features derived on the devices (the accelerator default) and unpack in a jit wrapped them,
    silently."""
    path = str(tmp_path / "huge.rox")
    rng = np.random.default_rng(0)
    write_rox([rng.integers(2**31, 2**32 - 1, 200, dtype=np.uint32)] * 4, path, separator=0)
    pipe = TokenPipeline(path, seq_len=16, global_batch_size=8, seed=0, dtype=np.int64)
    wraps = r"holds int64 values up to \d+, which JAX places as int32 \(jax_enable_x64 is off\)"
    for kwargs in ({"features_on_device": True}, {"features_on_device": False}):
        with (
            MultiHostDataLoadIterator(pipe, data_sharding=_two_devices(), **kwargs) as it,
            pytest.raises(ValueError, match=wraps),
        ):
            next(it)
    tokens = pipe.with_layout("tokens")
    with MultiHostDataLoadIterator(tokens, data_sharding=_two_devices()) as it:
        batch = next(it)
    with pytest.raises(ValueError, match=r"^unpack: dtype=int64 needs jax_enable_x64, which is "
                       r"off, so JAX makes int32 of these uint32 tokens"):  # fmt: skip
        jax.jit(tokens.unpack)(batch)
    exact = TokenPipeline(path, seq_len=16, global_batch_size=8, seed=0, dtype=np.uint32)
    with MultiHostDataLoadIterator(exact, data_sharding=_two_devices(),
                                   features_on_device=True) as it:  # fmt: skip
        np.testing.assert_array_equal(np.asarray(next(it)["inputs"]),
                                      exact.batch_source()[0]["inputs"])  # fmt: skip


def test_int64_from_narrow_tokens_is_still_derived_on_the_devices(corpora, caplog):
    """Only tokens that may exceed int32 (unsigned 32-bit) need the host's check: uint16 tokens
    as int64 are exact as JAX's int32, and were sent as six host arrays instead of one."""
    from grain_rox._devices._narrowing import refuse_narrowing

    pipe = TokenPipeline(corpora["a"], seq_len=16, global_batch_size=8, seed=0, dtype=np.int64)
    with MultiHostDataLoadIterator(pipe, data_sharding=_two_devices(),
                                   features_on_device=True) as it:  # fmt: skip
        got = next(it)
    assert "computes the features on the host" not in caplog.text
    for key, value in pipe.batch_source()[0].items():
        np.testing.assert_array_equal(np.asarray(got[key]), value, err_msg=key)
    # jax_enable_x64 is asked each time (a cached answer let int64 values wrap after a toggle)
    big = [np.array([2**40], np.int64)]
    jax.config.update("jax_enable_x64", True)
    try:
        refuse_narrowing(big, where="a batch")  # placed as it is
    finally:
        jax.config.update("jax_enable_x64", False)
    with pytest.raises(ValueError, match=r"which JAX places as int32 \(jax_enable_x64 is off\)"):
        refuse_narrowing(big, where="a batch")
