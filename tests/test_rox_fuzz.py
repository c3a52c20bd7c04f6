"""Hypothesis fuzzing of the `.rox` parser: arbitrary files never crash or mislead the reader.

Property: for any file, ``open_rox`` followed by reading every block, ``tokens(0, num_tokens)``
and ``verify(checksums=False)`` either succeeds with data exactly consistent with the file's
bytes, or raises only ``RoxFormatError`` (naming the file) or ``FileNotFoundError``.
"""

from __future__ import annotations

import contextlib
import pickle
import signal
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from shard_bytes import make_shard

from grain_rox import RoxFormatError, open_rox, write_rox

FOOTER = struct.Struct("<qq8s8s")
SIGNATURE = b"ROXXEL02"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
DTYPES = ["uint8", "int8", "uint16", "int16", ">u2", "float16", "int32", "uint32", "float32",
          "int64", "float64"]  # fmt: skip
EXAMPLE_TIME_LIMIT_S = 10.0

FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def raw_size_of(shard: bytes) -> int:
    return FOOTER.unpack(shard[-FOOTER.size :])[1]


@pytest.fixture(scope="module")
def fuzz_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "fuzz.rox"


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fail (TimeoutError, which the property does not allow) instead of hanging."""

    def on_alarm(signum: int, frame: object) -> None:
        raise TimeoutError(f"reading the fuzzed shard took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def assert_consistent(corpus, data: bytes) -> None:
    """Everything the corpus reports or reads must be what the file's bytes say."""
    num_blocks, raw_size, dtype_field, signature = FOOTER.unpack(data[-FOOTER.size :])
    assert signature == SIGNATURE
    assert len(data) == raw_size + 8 * num_blocks + FOOTER.size
    dtype = corpus.dtype
    # NULs stripped from both ends, as roxxel's reader does (a field "\x00b" is int8)
    assert dtype == np.dtype(dtype_field.strip(b"\x00").decode("ascii"))
    itemsize = dtype.itemsize
    raw = data[:raw_size]
    ends = np.frombuffer(data, "<i8", count=num_blocks, offset=raw_size)
    assert len(corpus) == num_blocks
    assert corpus.num_tokens * itemsize == raw_size
    start = 0
    for i, end in enumerate(ends.tolist()):
        assert 0 <= start < end <= raw_size
        assert start % itemsize == 0
        assert end % itemsize == 0
        block = corpus[i]
        assert block.dtype == dtype
        assert block.tobytes() == raw[start:end]
        start = end
    assert start == raw_size
    if num_blocks:
        assert corpus[-1].tobytes() == raw[int(ends[-2]) if num_blocks > 1 else 0 :]
        assert corpus.block_size == int(ends[0])
    tokens = corpus.tokens(0, corpus.num_tokens)
    assert tokens.dtype == dtype
    assert tokens.tobytes() == raw
    assert corpus.tokens(corpus.num_tokens, corpus.num_tokens).shape == (0,)
    corpus.verify(checksums=False)


def check_file(path: Path, data: bytes) -> bool:
    """Run the property on one file; return whether it opened."""
    path.unlink(missing_ok=True)  # a new inode: no stale map of an earlier example is touched
    path.write_bytes(data)
    with time_limit(EXAMPLE_TIME_LIMIT_S):
        try:
            corpus = open_rox(str(path))
        except RoxFormatError as err:
            assert err.path == str(path)
            assert str(err).startswith(f"{path}: ")
            assert str(err).endswith(f". Fix: {err.fix}.")
            return False
        except FileNotFoundError:  # allowed by the property; the file exists, so not expected
            return False
        with corpus:
            try:
                assert_consistent(corpus, data)
                copy = pickle.loads(pickle.dumps(corpus))
                assert repr(copy) == repr(corpus)
                assert copy.tokens(0, copy.num_tokens).tobytes() == data[: raw_size_of(data)]
                copy.close()
            except RoxFormatError as err:  # allowed, but must name the file
                assert err.path == str(path)
        return True


# ---- strategies --------------------------------------------------------------------------------
@st.composite
def valid_shards(draw: st.DrawFn) -> bytes:
    """A small valid shard: uniform blocks (as written) or not (after roxxel appends)."""
    dtype = draw(st.sampled_from(DTYPES))
    itemsize = np.dtype(dtype).itemsize
    num_blocks = draw(st.integers(0, 6))
    if draw(st.booleans()):
        block_tokens = [draw(st.integers(1, 6))] * num_blocks
    else:
        block_tokens = draw(st.lists(st.integers(1, 6), min_size=num_blocks, max_size=num_blocks))
    blocks = [draw(st.binary(min_size=n * itemsize, max_size=n * itemsize)) for n in block_tokens]
    return make_shard(blocks, dtype)


@st.composite
def footer_ended_bytes(draw: st.DrawFn) -> bytes:
    """Random raw bytes and index under a footer whose fields usually agree with the file size."""
    dtype = draw(st.sampled_from(DTYPES))
    itemsize = np.dtype(dtype).itemsize
    raw = draw(st.binary(max_size=64))
    if draw(st.booleans()):  # a plausible index: increasing whole tokens ending at the raw size
        raw = raw[: len(raw) - len(raw) % itemsize]
        cuts = st.sampled_from(range(itemsize, len(raw), itemsize)) if len(raw) > itemsize else None
        inner = draw(st.lists(cuts, max_size=6)) if cuts is not None else []
        ends = [*sorted(inner), len(raw)] if raw else []
    else:
        ends = draw(st.lists(st.integers(-4, len(raw) + 4), max_size=8))
    num_blocks = draw(st.one_of(st.just(len(ends)), st.integers(-2, 12)))
    raw_size = draw(st.one_of(st.just(len(raw)), st.integers(-8, 80)))
    return make_shard([raw], dtype, ends, num_blocks=num_blocks, raw_size=raw_size)


@st.composite
def truncated_shards(draw: st.DrawFn) -> bytes:
    shard = draw(valid_shards())
    if draw(st.booleans()):
        return shard[: draw(st.integers(0, len(shard) - 1))]
    start = draw(st.integers(0, len(shard) - 1))
    stop = draw(st.integers(start + 1, len(shard)))
    return shard[:start] + shard[stop:]  # a span lost from the middle


@st.composite
def bit_flipped_shards(draw: st.DrawFn) -> bytes:
    shard = bytearray(draw(valid_shards()))
    first_bit = raw_size_of(bytes(shard)) * 8  # only the index and footer are flipped
    positions = draw(
        st.lists(st.integers(first_bit, len(shard) * 8 - 1), min_size=1, max_size=4, unique=True)
    )
    for bit in positions:
        shard[bit // 8] ^= 1 << (bit % 8)
    return bytes(shard)


@st.composite
def int64_overwritten_shards(draw: st.DrawFn) -> bytes:
    shard = bytearray(draw(valid_shards()))
    size = len(shard)
    num_blocks, raw_size, _, _ = FOOTER.unpack(bytes(shard[-FOOTER.size :]))
    fields = [size - 32, size - 24] + [raw_size + 8 * k for k in range(num_blocks)]
    interesting = [0, 1, -1, 8, raw_size, raw_size - 1, raw_size + 1, raw_size + 8, size,
                   num_blocks + 1, 2**31, 2**32, 2**62, INT64_MAX, INT64_MIN]  # fmt: skip
    values = st.one_of(
        st.integers(INT64_MIN, INT64_MAX), st.integers(-64, 256), st.sampled_from(interesting)
    )
    for _ in range(draw(st.integers(1, 3))):
        offset = draw(st.sampled_from(fields))
        shard[offset : offset + 8] = struct.pack("<q", draw(values))
    return bytes(shard)


# ---- properties --------------------------------------------------------------------------------
@FUZZ
@given(
    data=st.one_of(st.binary(max_size=300), st.binary(max_size=300).map(lambda b: b + SIGNATURE))
)
@example(data=b"")
@example(data=SIGNATURE)
@example(data=b"\x00" * 24 + SIGNATURE)
def test_random_bytes(fuzz_path, data):
    check_file(fuzz_path, data)


@FUZZ
@given(data=footer_ended_bytes())
def test_random_bytes_with_plausible_footer(fuzz_path, data):
    check_file(fuzz_path, data)


@FUZZ
@given(data=valid_shards())
def test_valid_shards_read_back_exactly(fuzz_path, data):
    assert check_file(fuzz_path, data)


@FUZZ
@given(data=truncated_shards())
def test_truncated_shards(fuzz_path, data):
    check_file(fuzz_path, data)


@FUZZ
@given(data=bit_flipped_shards())
def test_bit_flips_in_index_and_footer(fuzz_path, data):
    check_file(fuzz_path, data)


@FUZZ
@given(data=int64_overwritten_shards())
def test_int64_overwrites_in_footer_and_index(fuzz_path, data):
    check_file(fuzz_path, data)


@settings(FUZZ, max_examples=100)
@given(name=st.text(alphabet="uifcbhlqedgSUVOM<>=|,()[]:0123456789 \x00", min_size=1, max_size=8))
@example(name="3et<")  # numpy raises ValueError for it
@example(name="|,289z")  # numpy raises SyntaxError for it
@example(name="\x00b")  # a leading NUL: stripped, as roxxel strips it (int8)
def test_dtype_field_fuzz(fuzz_path, name):
    """Any ASCII dtype name: a dtype numpy understands, or a RoxFormatError."""
    field = name.encode("ascii").ljust(8, b"\x00")
    check_file(fuzz_path, make_shard([bytes(range(16))] * 2, dtype_field=field))


@pytest.mark.parametrize("dtype", DTYPES)
@settings(FUZZ, max_examples=5)
@given(
    block_tokens=st.integers(1, 8), num_tokens=st.integers(1, 60), seed=st.integers(0, 2**32 - 1)
)
def test_make_shard_matches_write_rox(tmp_path_factory, dtype, block_tokens, num_tokens, seed):
    """The hand-built shards above have exactly the layout grain_rox's writer produces."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 100, size=num_tokens).astype(dtype)
    path = tmp_path_factory.mktemp("write") / "w.rox"
    block_bytes = block_tokens * tokens.itemsize
    write_rox([tokens], str(path), block_size=block_bytes, manifest=False)
    num_pad = (-num_tokens) % block_tokens
    padded = tokens.tobytes() + bytes(num_pad * tokens.itemsize)  # pad id 0, in any byte order
    blocks = [padded[i : i + block_bytes] for i in range(0, len(padded), block_bytes)]
    assert path.read_bytes() == make_shard(blocks, dtype)
