"""``roxxel_stream`` against the real roxxel 0.9.14 ``stream()``, batch for batch, bit for bit.

Every file is written inside the test, by roxxel itself or by ``grain_rox.write_rox``. For each
configuration, every batch of ``Roxxel(path).stream(..., prefetch_size=0)`` (as numpy) is
compared with record ``k`` of ``roxxel_stream(...)``, and the number of batches roxxel actually
yields with ``len(dataset)``.

Roxxel places batches with ``jax.make_array_from_process_local_data``; to allow any batch size
under the 8 fake CPU devices of ``conftest.py`` we pass it a one-device mesh and sharding (it
uses them only when both are given). With JAX's default ``jax_enable_x64=False`` roxxel's int64
/ float64 batches come back as int32 / float32; ``roxxel_stream`` returns the numpy dtype that
was asked for, with the same values.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import struct
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
import pytest
import roxxel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as PS

from grain_rox import open_rox, write_rox
from grain_rox._roxxel._roxxel_stream import RoxxelStreamSource, roxxel_stream

BF16 = np.dtype(ml_dtypes.bfloat16)
_MESH = Mesh(np.array(jax.devices()[:1]), ("data",))
_SHARDING = NamedSharding(_MESH, PS("data", None))


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def roxxel_write(path: str | Path, items: Sequence[Any], **kwargs: Any) -> None:
    """``roxxel.Roxxel(path).write(items, **kwargs)`` without its stdout chatter."""
    with contextlib.redirect_stdout(io.StringIO()):
        roxxel.Roxxel(str(path)).write(items, **kwargs)


def roxxel_batches(
    paths: str | list[str], *, default_mesh: bool = False, **kwargs: Any
) -> tuple[list[np.ndarray], int]:
    """Every batch roxxel's stream yields (as numpy) and the stream's own ``len()``."""
    placement = {} if default_mesh else {"mesh": _MESH, "data_sharding": _SHARDING}
    with contextlib.redirect_stdout(io.StringIO()):
        r = roxxel.Roxxel(paths)
        stream = r.stream(prefetch_size=0, **placement, **kwargs)
        batches = [np.asarray(b) for b in stream]
        r.close()
    return batches, len(stream)


def assert_same_batch(ours: np.ndarray, theirs: np.ndarray, dtype: Any) -> None:
    assert ours.dtype == np.dtype(dtype)
    assert ours.shape == theirs.shape
    if theirs.dtype == ours.dtype:
        assert ours.tobytes() == theirs.tobytes()
    else:  # JAX without x64 narrowed roxxel's 64-bit batch; ours keeps the asked-for dtype
        assert theirs.dtype == jax.dtypes.canonicalize_dtype(ours.dtype)
        np.testing.assert_array_equal(ours, theirs)


def assert_matches_roxxel(paths: str | list[str], **kwargs: Any) -> tuple[Any, list[np.ndarray]]:
    """Compare every batch and the length; return (dataset, roxxel's batches)."""
    theirs, _ = roxxel_batches(paths, **kwargs)
    ds = roxxel_stream(paths, **kwargs)
    assert len(ds) == len(theirs), kwargs
    dtype = kwargs.get("dtype", np.int32)
    for k, batch in enumerate(theirs):
        assert_same_batch(ds[k], batch, dtype)
    return ds, theirs


def _docs(rng: np.random.Generator, n: int, dtype: Any, high: int) -> list[np.ndarray]:
    lengths = rng.integers(1, 90, n)
    if np.dtype(dtype) == BF16:
        return [rng.normal(0, 100, int(m)).astype(BF16) for m in lengths]
    return [rng.integers(0, high, int(m)).astype(dtype) for m in lengths]


def _sep(value: Any, dtype: Any) -> bytes:
    return np.array([value], dtype).tobytes()


# ---------------------------------------------------------------------------------------------
# Corpora (module scope: written once)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("roxxel_stream")
    rng = np.random.default_rng(20240611)
    out: dict[str, str] = {}

    # roxxel-written, one file, uint16, 64-byte blocks
    roxxel_write(
        d / "u16.rox", _docs(rng, 120, np.uint16, 60000), separator=_sep(65535, np.uint16),
        block_size=64,
    )  # fmt: skip
    out["u16_single"] = str(d / "u16.rox")

    # roxxel-written, sharded (7 blocks of 128 bytes per 1000-byte shard), uint16
    roxxel_write(
        d / "sh.rox", _docs(rng, 90, np.uint16, 60000), separator=_sep(0, np.uint16),
        block_size=128, max_shard_bytes=1000,
    )  # fmt: skip
    out["u16_sharded"] = str(d / "sh.rox")  # a prefix: resolves to sh_0000.rox, sh_0001.rox, ...

    # roxxel-written text, uint8, 32-byte blocks
    texts = [bytes(rng.integers(32, 127, int(m), dtype=np.uint8)) for m in rng.integers(1, 60, 150)]
    roxxel_write(d / "text.rox", texts, separator=b"\n", block_size=32)
    out["u8_single"] = str(d / "text.rox")

    # roxxel-written int32, 256-byte blocks, sharded into 2-block shards
    roxxel_write(
        d / "i32.rox", _docs(rng, 80, np.int32, 2**31 - 1), separator=_sep(-1, np.int32),
        block_size=256, max_shard_bytes=600,
    )  # fmt: skip
    out["i32_sharded"] = str(d / "i32.rox")

    # roxxel-written bfloat16, 48-byte blocks
    roxxel_write(
        d / "bf.rox", _docs(rng, 60, BF16, 0), separator=_sep(1.0, BF16), block_size=48
    )  # fmt: skip
    out["bf16_single"] = str(d / "bf.rox")

    # grain_rox-written: uint16 one file, and a sharded uint16 set given as an explicit list
    write_rox(_docs(rng, 100, np.uint16, 50000), d / "g.rox", block_size=96, separator=7)
    out["grain_u16"] = str(d / "g.rox")
    res = write_rox(
        _docs(rng, 100, np.uint16, 50000), d / "gs.rox", block_size=64, max_shard_bytes=700,
        separator=3,
    )  # fmt: skip
    assert len(res.paths) > 3
    out["grain_u16_sharded_list"] = ",".join(res.paths)

    # non-uniform: roxxel appends with another block size (B = 64, later blocks 144 bytes)
    roxxel_write(d / "nu_grow.rox", _docs(rng, 20, np.uint16, 9000), block_size=64)
    roxxel_write(d / "nu_grow.rox", _docs(rng, 30, np.uint16, 9000), block_size=144)
    out["nonuniform_grow"] = str(d / "nu_grow.rox")
    # ... and the other way round (B = 144, later blocks 64 bytes): roxxel's generator runs
    # out of blocks before its own len(), and a resume can skip a whole short block
    roxxel_write(d / "nu_shrink.rox", _docs(rng, 8, np.uint16, 9000), block_size=144)
    roxxel_write(d / "nu_shrink.rox", _docs(rng, 60, np.uint16, 9000), block_size=64)
    out["nonuniform_shrink"] = str(d / "nu_shrink.rox")
    return out


def _spec(corpora: dict[str, str], name: str) -> str | list[str]:
    value = corpora[name]
    return value.split(",") if "," in value else value


# ---------------------------------------------------------------------------------------------
# Bit-exactness
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "seq_len", "batch_size", "seed", "dtype"),
    [
        ("u16_single", 8, 2, 0, np.int32),  # P = 32 bytes < B: two batches per block
        ("u16_single", 5, 3, 1, np.int64),  # P = 30: batches straddle blocks at odd offsets
        ("u16_single", 40, 6, 2, np.int32),  # P = 480: a batch spans ~8 blocks
        ("u16_sharded", 16, 4, 3, np.int32),
        ("u16_sharded", 300, 4, 4, np.float32),  # P = 2400: spans ~19 blocks and 3+ shards
        ("u8_single", 7, 3, 5, np.int32),
        ("u8_single", 64, 4, 6, np.int64),
        ("i32_sharded", 10, 3, 7, np.int32),
        ("i32_sharded", 3, 1, 8, np.int64),
        ("bf16_single", 6, 2, 9, np.float32),
        ("bf16_single", 50, 3, 10, BF16),
        ("grain_u16", 24, 2, 11, np.int32),
        ("grain_u16_sharded_list", 20, 5, 12, np.int32),
        ("nonuniform_grow", 12, 3, 13, np.int32),
        ("nonuniform_grow", 100, 2, 14, np.int32),
        ("nonuniform_shrink", 9, 2, 15, np.int32),
        ("nonuniform_shrink", 70, 3, 16, np.int64),
    ],
)
def test_every_batch_matches_roxxel(
    corpora: dict[str, str], name: str, seq_len: int, batch_size: int, seed: int, dtype: Any
) -> None:
    _, theirs = assert_matches_roxxel(
        _spec(corpora, name), seq_len=seq_len, batch_size=batch_size, seed=seed, dtype=dtype
    )
    assert len(theirs) > 0


def test_block_layouts_are_what_the_cases_claim(corpora: dict[str, str]) -> None:
    assert open_rox(corpora["u16_single"]).uniform_blocks is True
    assert len(open_rox(corpora["u16_sharded"]).paths) > 5
    assert len(open_rox(corpora["i32_sharded"]).paths) > 5
    assert open_rox(corpora["bf16_single"]).dtype == BF16
    grow = open_rox(corpora["nonuniform_grow"])
    shrink = open_rox(corpora["nonuniform_shrink"])
    assert grow.uniform_blocks is False and grow.block_size == 64
    assert shrink.uniform_blocks is False and shrink.block_size == 144


def test_seeds_give_roxxels_orders(corpora: dict[str, str]) -> None:
    firsts = []
    for seed in (0, 1, 17, 2**40 + 3):
        ds, _ = assert_matches_roxxel(corpora["u16_single"], seq_len=8, batch_size=4, seed=seed)
        firsts.append(ds[0].tobytes())
    assert len(set(firsts)) == len(firsts)


@pytest.mark.parametrize("name", ["u16_single", "u16_sharded", "u8_single", "nonuniform_shrink"])
def test_resume_at_any_step_matches_roxxel(corpora: dict[str, str], name: str) -> None:
    kwargs: dict[str, Any] = {"seq_len": 11, "batch_size": 3, "seed": 21}
    full = roxxel_stream(corpora[name], **kwargs)
    n = len(full)
    assert n > 10
    for start in (0, 1, 2, n // 2, n - 1, n, n + 7):
        ds, theirs = assert_matches_roxxel(corpora[name], start_step=start, **kwargs)
        assert len(ds) == (max(0, n - start) if name != "nonuniform_shrink" else len(theirs))
        if len(ds) > 0 and name != "nonuniform_shrink":
            assert ds[0].tobytes() == full[start].tobytes()


def test_resume_past_the_end_is_empty(corpora: dict[str, str]) -> None:
    ds, theirs = assert_matches_roxxel(
        corpora["u16_single"], seq_len=8, batch_size=2, seed=0, start_step=10**6
    )
    assert len(ds) == 0 and theirs == []
    assert list(ds.to_iter_dataset()) == []


@pytest.mark.parametrize(
    ("completed_phases", "start_steps"),
    [
        ([(7, 2, 16)], (0, 3, 7, 8, 20)),  # inside the phase, at its end, after it
        ([(5, 4, 8), (6, 1, 30)], (0, 2, 5, 9, 11, 12, 30)),  # two phases
        ([(0, 9, 9), (4, 3, 5)], (0, 4, 6)),  # an empty phase
        ([(10**6, 4, 8)], (0, 40)),  # a phase longer than the data
    ],
)
def test_completed_phases_match_roxxel(
    corpora: dict[str, str], completed_phases: list[tuple[int, int, int]], start_steps: tuple
) -> None:
    for name in ("u16_sharded", "nonuniform_shrink"):
        for start in start_steps:
            assert_matches_roxxel(
                corpora[name],
                seq_len=10,
                batch_size=3,
                seed=4,
                start_step=start,
                completed_phases=completed_phases,
            )


def test_phases_continue_the_byte_stream(corpora: dict[str, str]) -> None:
    """After a phase of 5 batches of 4x8 tokens, the next phase starts at token 160."""
    path = corpora["u16_single"]
    flat = roxxel_stream(path, seq_len=200, batch_size=1, seed=3)[0][0]
    ds = roxxel_stream(
        path, seq_len=6, batch_size=2, seed=3, start_step=5, completed_phases=[(5, 4, 8)]
    )
    np.testing.assert_array_equal(ds[0].ravel(), flat[160:172])
    np.testing.assert_array_equal(ds[2].ravel(), flat[184:196])


@pytest.mark.parametrize("total_steps", [0, 1, 5, 33, 10**9])
def test_total_steps_limits_like_roxxel(corpora: dict[str, str], total_steps: int) -> None:
    for name in ("u16_single", "nonuniform_shrink"):
        ds, _ = assert_matches_roxxel(
            corpora[name], seq_len=9, batch_size=2, seed=8, start_step=3, total_steps=total_steps
        )
        assert len(ds) <= total_steps


def test_nonuniform_early_stop_and_skipped_first_block(corpora: dict[str, str]) -> None:
    """B = 144 but most blocks are 64 bytes: roxxel's len() overstates what it yields, and
    resuming at a remainder beyond a short block's end skips that block entirely."""
    path = corpora["nonuniform_shrink"]
    theirs, roxxel_len = roxxel_batches(path, seq_len=8, batch_size=2, seed=0)
    assert len(roxxel_stream(path, seq_len=8, batch_size=2, seed=0)) == len(theirs) < roxxel_len

    corpus = open_rox(path)
    perm = np.random.default_rng(0).permutation(len(corpus))
    skipped_whole_block = 0
    for start in range(0, 100, 7):
        consumed, rem = divmod(start * 2 * 8 * 2, corpus.block_size)
        if consumed < len(corpus) and rem >= corpus[int(perm[consumed])].nbytes:
            skipped_whole_block += 1
        assert_matches_roxxel(path, seq_len=8, batch_size=2, seed=0, start_step=start)
    assert skipped_whole_block > 0


def test_default_roxxel_mesh_gives_the_same_batches(corpora: dict[str, str]) -> None:
    """With roxxel's own 8-device default placement (batch_size divisible by 8)."""
    kwargs: dict[str, Any] = {"seq_len": 4, "batch_size": 8, "seed": 2, "start_step": 3}
    theirs, _ = roxxel_batches(corpora["u16_sharded"], default_mesh=True, **kwargs)
    ds = roxxel_stream(corpora["u16_sharded"], **kwargs)
    assert len(ds) == len(theirs) > 0
    for k, batch in enumerate(theirs):
        assert_same_batch(ds[k], batch, np.int32)


@st.composite
def _configs(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(
        st.sampled_from(
            ["u16_single", "u16_sharded", "u8_single", "i32_sharded", "bf16_single",
             "grain_u16_sharded_list", "nonuniform_grow", "nonuniform_shrink"]
        )
    )  # fmt: skip
    phases = draw(
        st.lists(st.tuples(st.integers(0, 30), st.integers(0, 6), st.integers(0, 40)), max_size=2)
    )
    seq_len = draw(st.integers(1, 200))
    batch_size = draw(st.integers(1, 6))
    total = draw(st.none() | st.integers(0, 60))
    if total is None and seq_len * batch_size < 32:  # keep roxxel's side (~0.1 ms/batch) short
        total = draw(st.integers(0, 300))
    return {
        "name": name,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "seed": draw(st.integers(0, 2**32)),
        "start_step": draw(st.integers(0, 80)),
        "completed_phases": phases or None,
        "total_steps": total,
        "dtype": draw(st.sampled_from([np.int32, np.int64, np.float32])),
    }


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=_configs())
def test_property_random_configs_match_roxxel(
    corpora: dict[str, str], config: dict[str, Any]
) -> None:
    kwargs = dict(config)
    name = kwargs.pop("name")
    if kwargs["dtype"] is not np.float32 and name == "bf16_single":
        kwargs["dtype"] = np.float32  # bfloat16 -> int is only defined for finite in-range values
    assert_matches_roxxel(_spec(corpora, name), **kwargs)


# ---------------------------------------------------------------------------------------------
# Through Grain; pickling; the source protocol
# ---------------------------------------------------------------------------------------------


def test_a_state_restores_onto_the_same_stream_and_is_refused_on_other_arguments(
    corpora: dict[str, str],
) -> None:
    """The state of a roxxel_stream iterator names its shards and arguments: it restores onto
    the same stream (the next batches are the ones the first iterator gave) and a restore
    onto another seed, start_step or completed_phases is refused naming the change."""
    path = corpora["u16_sharded"]
    args: dict[str, Any] = {"seq_len": 13, "batch_size": 3, "seed": 5}
    first = iter(roxxel_stream(path, **args).to_iter_dataset())
    for _ in range(2):
        next(first)
    state = first.get_state()
    expected = [next(first) for _ in range(2)]
    again = iter(roxxel_stream(path, **args).to_iter_dataset())
    again.set_state(state)
    for batch in expected:
        assert next(again).tobytes() == batch.tobytes()
    for change, saying in [
        ({"seed": 6}, "seed: saved 5 -> now 6"),
        ({"start_step": 2}, "start_step: saved 0 -> now 2"),
        ({"completed_phases": [(1, 3, 13)]}, "completed_phases: saved [] -> now [[1, 3, 13]]"),
    ]:
        other = iter(roxxel_stream(path, **(args | change)).to_iter_dataset())
        with pytest.raises(ValueError) as info:
            other.set_state(state)
        assert str(info.value).startswith(
            "cannot restore this roxxel_stream state: its data or config changed ("
        ), info.value
        assert saying in str(info.value), info.value


def test_iter_dataset_and_pickle_give_the_same_batches(corpora: dict[str, str]) -> None:
    for name in ("u16_sharded", "nonuniform_shrink"):
        kwargs: dict[str, Any] = {
            "seq_len": 13, "batch_size": 3, "seed": 5, "start_step": 4,
            "completed_phases": [(2, 5, 7)],
        }  # fmt: skip
        ds, theirs = assert_matches_roxxel(corpora[name], **kwargs)
        iterated = list(ds.to_iter_dataset())
        assert len(iterated) == len(theirs) > 0
        for ours, batch in zip(iterated, theirs, strict=True):
            assert_same_batch(ours, batch, np.int32)
        clone = pickle.loads(pickle.dumps(ds))
        assert len(clone) == len(ds)
        for k in range(len(ds)):
            assert clone[k].tobytes() == theirs[k].tobytes()


def _source(ds: Any) -> RoxxelStreamSource:
    source = ds._parent._source  # under the identity, grain's SourceMapDataset keeps it here
    assert isinstance(source, RoxxelStreamSource)
    return source


def test_source_protocol_repr_and_pickle_size(corpora: dict[str, str]) -> None:
    ds = roxxel_stream(corpora["u16_single"], seq_len=8, batch_size=2, seed=0, start_step=1)
    source = _source(ds)
    n = len(source)
    assert source[n - 1].tobytes() == source[-1].tobytes()
    with pytest.raises(IndexError):
        source[n]
    with pytest.raises(IndexError):
        source[-n - 1]
    got = source.__getitems__([0, n - 1, 3])
    assert [g.tobytes() for g in got] == [source[i].tobytes() for i in (0, n - 1, 3)]
    assert [g.tobytes() for g in source._getitems([2])] == [source[2].tobytes()]
    assert "0x" not in repr(source) and open_rox(corpora["u16_single"]).fingerprint in repr(source)
    assert repr(source) == repr(_source(roxxel_stream(
        corpora["u16_single"], seq_len=8, batch_size=2, seed=0, start_step=1
    )))  # fmt: skip
    assert repr(source) != repr(_source(roxxel_stream(
        corpora["u16_single"], seq_len=8, batch_size=2, seed=1, start_step=1
    )))  # fmt: skip
    blob = pickle.dumps(source)
    assert len(blob) < 8 * len(source.corpus)  # the permutation is not pickled
    clone = pickle.loads(blob)
    assert repr(clone) == repr(source)
    assert clone[5].tobytes() == source[5].tobytes()


def test_accepts_an_open_corpus(corpora: dict[str, str]) -> None:
    with open_rox(corpora["u16_sharded"]) as corpus:
        ds = roxxel_stream(corpus, seq_len=8, batch_size=2, seed=0)
        assert ds[3].tobytes() == roxxel_stream(
            corpora["u16_sharded"], seq_len=8, batch_size=2, seed=0
        )[3].tobytes()  # fmt: skip


def test_concurrent_reads_are_consistent(corpora: dict[str, str]) -> None:
    for name in ("u16_sharded", "nonuniform_grow"):
        path = corpora[name]
        expected = [b.tobytes() for b in roxxel_stream(path, seq_len=7, batch_size=3, seed=1)]
        source = _source(
            pickle.loads(pickle.dumps(roxxel_stream(path, seq_len=7, batch_size=3, seed=1)))
        )  # fmt: skip  (a fresh copy: the permutation is built lazily, under contention)
        order = np.random.default_rng(0).permutation(np.tile(np.arange(len(source)), 4))
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda k, src=source: src[int(k)].tobytes(), order))
        assert all(expected[k] == b for k, b in zip(order, got, strict=True))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"seq_len": 0}, ValueError, "seq_len=0"),
        ({"batch_size": 0}, ValueError, "batch_size=0"),
        ({"seq_len": 2.0}, TypeError, "seq_len"),
        ({"seed": -1}, ValueError, "seed=-1"),
        ({"seed": None}, TypeError, "seed"),
        ({"start_step": -1}, ValueError, "start_step=-1"),
        ({"total_steps": -2}, ValueError, "total_steps=-2"),
        ({"completed_phases": [(1, 2)]}, ValueError, r"completed_phases\[0\]"),
        ({"completed_phases": [(1, 2, 3), (4, -1, 3)]}, ValueError, "batch_size=-1"),
        ({"completed_phases": [(1, 2, True)]}, TypeError, "seq_len"),
        ({"completed_phases": "abc"}, TypeError, "completed_phases"),
    ],
)
def test_bad_arguments_are_refused(
    corpora: dict[str, str], kwargs: dict[str, Any], error: type, match: str
) -> None:
    args: dict[str, Any] = {"seq_len": 4, "batch_size": 2, "seed": 0, **kwargs}
    with pytest.raises(error, match=match):
        roxxel_stream(corpora["u16_single"], **args)


def test_empty_corpus_is_refused_like_roxxel(tmp_path: Path) -> None:
    path = tmp_path / "empty.rox"
    path.write_bytes(struct.pack("<qq8s8s", 0, 0, b"uint16", b"ROXXEL02"))
    with pytest.raises(ValueError, match="empty"), contextlib.redirect_stdout(io.StringIO()):
        roxxel.Roxxel(str(path)).stream(seq_len=4, batch_size=8, seed=0, prefetch_size=0)
    with pytest.raises(ValueError, match=r"empty\.rox.*empty"):
        roxxel_stream(str(path), seq_len=4, batch_size=8, seed=0)


@pytest.mark.parametrize("name", ["u16_sharded", "nonuniform_grow"])
def test_unwalked_index_of_a_large_corpus_is_walked_first(
    corpora: dict[str, str], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Corpora over ~1M blocks open without walking their index (uniform_blocks is None)."""
    import grain_rox._format._rox_corpus

    monkeypatch.setattr(grain_rox._format._rox_corpus, "FULL_INDEX_CHECK_LIMIT", 0)
    corpus = open_rox(corpora[name])
    assert corpus.uniform_blocks is None
    kwargs: dict[str, Any] = {"seq_len": 30, "batch_size": 3, "seed": 6, "start_step": 2}
    theirs, _ = roxxel_batches(corpora[name], **kwargs)
    ds = roxxel_stream(corpus, **kwargs)
    assert corpus.uniform_blocks is (name == "u16_sharded")
    assert len(ds) == len(theirs) > 0
    for k, batch in enumerate(theirs):
        assert_same_batch(ds[k], batch, np.int32)


def test_a_state_saved_before_identities_names_the_start_step_that_continues_it(
    corpora: dict[str, str],
) -> None:
    """A roxxel_stream state from before its iterators recorded identities (a bare Grain
    position) is refused, and the start_step the message names continues the stream exactly."""
    path = corpora["u16_sharded"]
    args: dict[str, Any] = {"seq_len": 13, "batch_size": 3, "seed": 5, "start_step": 1}
    first = iter(roxxel_stream(path, **args).to_iter_dataset())
    for _ in range(2):
        next(first)
    old_state = first.get_state()["state"]  # what a bare MapDataset.source's iterator saved
    assert old_state == {"next_index": 2}, old_state
    expected = [next(first) for _ in range(2)]
    again = iter(roxxel_stream(path, **args).to_iter_dataset())
    with pytest.raises(ValueError, match=r"build(ing)? roxxel_stream\(\.\.\., start_step=S \+ 2\)"):
        again.set_state(old_state)
    continued = iter(roxxel_stream(path, **(args | {"start_step": 1 + 2})).to_iter_dataset())
    for batch in expected:
        assert next(continued).tobytes() == batch.tobytes()


def test_a_state_saved_before_identities_from_a_sliced_or_batched_stream_gets_no_start_step(
    corpora: dict[str, str],
) -> None:
    """After a slice, batch or shuffle a position counts other things than stream batches, so
    the start_step advice would replay or skip batches: the message does not give one."""
    path = corpora["u16_sharded"]
    args: dict[str, Any] = {"seq_len": 13, "batch_size": 3, "seed": 5}
    for view in (
        lambda ds: ds[1::2].to_iter_dataset(),
        lambda ds: ds.batch(2).to_iter_dataset(),
        lambda ds: ds.to_iter_dataset().batch(2),
    ):
        first = iter(view(roxxel_stream(path, **args)))
        for _ in range(3):
            next(first)
        old_state = first.get_state()["state"]
        again = iter(view(roxxel_stream(path, **args)))
        with pytest.raises(ValueError, match="start a new run") as info:
            again.set_state(old_state)
        assert "start_step" not in str(info.value), info.value
