"""The bytes of an input file for the converter: decompressed by suffix (``.gz``, ``.bz2``,
``.xz``, ``.zst``), told binary or text by a look at its first 8 KiB, decoded as UTF-8 with
errors that name the file and the byte offset; UTF-16 and UTF-32 text with a byte order mark is
read as such.

>>> binary_reason(b"PK\\x03\\x04\\x00"), binary_reason("plain text\\n".encode())
('a NUL byte at offset 4', None)
"""

from __future__ import annotations

import bz2
import codecs
import contextlib
import gzip
import lzma
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

COMPRESSIONS = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd"}
SNIFF = 8192  # bytes looked at to tell binary from text
_TEXT_CONTROLS = frozenset(b"\t\n\r\f\b\x1b")


def compression_of(path: str) -> str | None:
    """``"gzip"``, ``"bzip2"``, ``"xz"`` or ``"zstd"`` from the name's suffix, else ``None``.

    >>> compression_of("notes.jsonl.gz"), compression_of("a.txt")
    ('gzip', None)
    """
    return COMPRESSIONS.get(os.path.splitext(path)[1].lower())


def open_input(raw: Any, compression: str | None, path: str) -> Any:  # a binary file object
    """``raw`` (the file ``path`` opened ``"rb"``) decompressed as ``compression`` says; closing
    the result leaves ``raw`` open."""
    if compression is None:
        return contextlib.nullcontext(raw)
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "bzip2":
        return bz2.BZ2File(raw, "rb")
    if compression == "xz":
        return lzma.LZMAFile(raw, "rb")
    try:
        import zstandard
    except ImportError:
        raise ImportError(
            f"{path} is zstd-compressed: reading it needs the zstandard package "
            "(pip install zstandard), or decompress it first (zstd -d)"
        ) from None
    return _ZstdFrames(zstandard, raw)


class _ZstdFrames:
    """A ``.zst`` file's frames, decompressed one after another, read as a binary file: each
    ``read(size)`` returns at most ``size`` bytes (b"" at the end); input that ends inside a
    frame is an :class:`EOFError` and input that is not zstd an :class:`OSError`, as ``gzip``,
    ``bz2`` and ``lzma`` raise (zstandard's ``stream_reader`` read a cut file's first part as
    the whole, and raised errors of its own)."""

    # compressed bytes decoded at once (zstandard's decompressobj takes no output bound):
    # text decodes to a few times that; only input of one byte repeated decodes to far more
    _PIECE = 1 << 13

    def __init__(self, zstandard: Any, raw: Any) -> None:
        self._zstandard = zstandard
        self._dctx = zstandard.ZstdDecompressor()
        self._raw = raw
        self._frame: Any = None  # the frame being decoded, None between frames
        self._left = b""  # input read past the end of the last frame
        self._out = memoryview(b"")  # decoded bytes not yet returned

    def __enter__(self) -> _ZstdFrames:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(1 << 20), b""))
        while not self._out:
            data, self._left = self._left or self._raw.read(self._PIECE), b""
            if not data:
                if self._frame is not None:
                    raise EOFError(
                        "Compressed file ended before the end-of-stream marker was reached"
                    )
                return b""
            if self._frame is None:
                self._frame = self._dctx.decompressobj()
            try:
                self._out = memoryview(self._frame.decompress(data))
            except self._zstandard.ZstdError as e:
                raise OSError(str(e)) from None
            if self._frame.eof:
                self._frame, self._left = None, self._frame.unused_data
        got, self._out = self._out[:size], self._out[size:]
        return bytes(got)


def byte_chunks(
    path: str, size: int = 1 << 20, *, on_bytes: Callable[[int], None] | None = None
) -> Iterator[bytes]:
    """The file's bytes (decompressed), in chunks; a damaged compressed file is an error
    naming it. ``on_bytes`` is told how many bytes of the file (compressed, as on disk) each
    chunk took.

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "a.txt.gz")
    >>> with gzip.open(path, "wb") as f:
    ...     _ = f.write(b"abc" * 1000)
    >>> read = []
    >>> len(b"".join(byte_chunks(path, on_bytes=read.append))), sum(read) == os.path.getsize(path)
    (3000, True)
    """
    compression = compression_of(path)
    try:
        with open(path, "rb") as raw, open_input(raw, compression, path) as f:
            done = 0
            while chunk := f.read(size):
                if on_bytes is not None:
                    at = raw.tell()
                    on_bytes(at - done)
                    done = at
                yield chunk
    except (OSError, EOFError, lzma.LZMAError) as e:
        if compression is None or isinstance(e, FileNotFoundError | PermissionError):
            raise
        raise ValueError(
            f"{path} is not a readable {compression} file ({type(e).__name__}: {e}); it is "
            "damaged or misnamed: regenerate it, or leave it out of the inputs"
        ) from None


# Byte order marks that say a file is UTF-16 or UTF-32 text (UTF-32's first: it begins with
# UTF-16LE's), and the codec that reads it (each removes its own mark).
_UNICODE_BOMS = (
    (b"\xff\xfe\x00\x00", "utf-32"),
    (b"\x00\x00\xfe\xff", "utf-32"),
    (b"\xff\xfe", "utf-16"),
    (b"\xfe\xff", "utf-16"),
)


def bom_encoding(head: bytes) -> str | None:
    """``"utf-16"`` or ``"utf-32"`` when ``head`` opens with that encoding's byte order mark
    (Windows tools write UTF-16 so), else ``None``.

    >>> bom_encoding("hi".encode("utf-16")), bom_encoding(b"hi")
    ('utf-16', None)
    """
    return next((codec for bom, codec in _UNICODE_BOMS if head.startswith(bom)), None)


def as_utf8(chunks: Iterable[bytes], encoding: str, path: str, errors: str) -> Iterator[bytes]:
    r"""``chunks`` of ``encoding`` text (its byte order mark first), as UTF-8 chunks, decoded as
    they come; text that is not valid ``encoding`` is an error naming the file (``errors=
    "replace"``: U+FFFD instead).

    >>> b"".join(as_utf8([b"\xff\xfeh", b"\x00i\x00"], "utf-16", "a.txt", "strict"))
    b'hi'
    """
    decoder = codecs.getincrementaldecoder(encoding)(errors)
    done = 0
    try:
        for chunk in chunks:
            text = decoder.decode(chunk)
            done += len(chunk)
            if text:
                yield text.encode("utf-8")
        tail = decoder.decode(b"", final=True)
        if tail:
            yield tail.encode("utf-8")
    except UnicodeDecodeError as e:
        name = encoding.upper()
        raise ValueError(
            f"{path} opens with a {name} byte order mark but is not {name} text near byte "
            f"offset {done + e.start} ({e.reason}); convert it to UTF-8 (e.g. iconv -f {name} "
            "-t utf-8), or pass --encoding-errors replace (encoding_errors='replace') to read "
            "it with U+FFFD replacement characters"
        ) from None


def binary_reason(head: bytes) -> str | None:
    """Why ``head`` (a file's first bytes) looks binary, or ``None`` if it looks like text.

    >>> print(binary_reason("plain text, no mark".encode("utf-16-le")))
    a NUL byte at offset 1; every second byte is NUL, as in UTF-16LE text without a byte order mark: convert it to UTF-8 (iconv -f UTF-16LE -t utf-8)
    """
    nul = head.find(b"\0")
    if nul >= 0:
        return f"a NUL byte at offset {nul}{_utf16_hint(head)}"
    controls = sum(1 for b in head if b < 32 and b not in _TEXT_CONTROLS)
    if head and controls * 10 > len(head) * 3:
        return f"{controls} of its first {len(head)} bytes are control bytes"
    return None


def _utf16_hint(head: bytes) -> str:
    """What a file with NUL bytes may be: UTF-16 without a mark, when every second byte of its
    start is NUL and the others are not."""
    pairs = len(head) // 2
    if pairs < 2:
        return ""
    for order, zeros, others in (("LE", head[1::2], head[0::2]), ("BE", head[0::2], head[1::2])):
        if zeros[:pairs].count(0) == pairs and others[:pairs].count(0) == 0:
            return (
                f"; every second byte is NUL, as in UTF-16{order} text without a byte order "
                f"mark: convert it to UTF-8 (iconv -f UTF-16{order} -t utf-8)"
            )
    return ""


def without_lone_surrogates(text: str) -> str:
    """``text`` with each lone surrogate (a code point UTF-8 cannot hold, e.g. from a JSON
    escape ``\\ud800``) replaced by U+FFFD, as tiktoken does.

    >>> without_lone_surrogates("a\\ud800b")
    'a\ufffdb'
    """
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def without_bom(text: str) -> str:
    """``text`` without the byte order mark some editors open a UTF-8 file with (not text,
    so not tokens; removed after decoding, so errors keep the file's byte offsets).

    >>> without_bom("\ufeffhello"), without_bom("hello")
    ('hello', 'hello')
    """
    return text.removeprefix("\ufeff")


def decode(data: bytes, path: str, errors: str, *, base: int = 0, line: int = 0) -> str:
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        where = f"line {line}, " if line else ""
        packed = " of the decompressed data" if compression_of(path) else ""
        raise ValueError(
            f"{path} is not UTF-8: {where}byte offset {base + e.start}{packed} holds "
            f"0x{data[e.start]:02x}; convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8), or "
            "pass --encoding-errors replace (encoding_errors='replace') to read it with "
            "U+FFFD replacement characters"
        ) from None


def lines(chunks: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    r"""(byte offset, line without its newline) of each line. A line longer than a chunk is
    joined once, when it ends (joining it to each chunk as it came was quadratic: a 200 MB
    line took 33 s and 2.5 GB).

    >>> list(lines([b"ab\ncd", b"e", b"f\n\ng"]))
    [(0, b'ab'), (3, b'cdef'), (8, b''), (9, b'g')]
    """
    offset = 0
    pending: list[bytes] = []  # the start of a line that has not ended yet
    for chunk in chunks:
        if b"\n" not in chunk:
            pending.append(chunk)
            continue
        parts = chunk.split(b"\n")
        if pending:
            parts[0] = b"".join([*pending, parts[0]])
            pending = []
        tail = parts.pop()
        for part in parts:
            yield offset, part
            offset += len(part) + 1
        if tail:
            pending.append(tail)
    rest = b"".join(pending)
    if rest:
        yield offset, rest


def chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest
