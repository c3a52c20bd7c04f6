"""The sidecar manifest: grain_rox's extras beside the shards, never inside them.

Roxxel's format has no checksum, token count, EOS id or tokenizer identity, and its files must
stay readable by roxxel, so those facts live in one JSON file per shard set:
``train.rox`` and ``train_0000.rox, train_0001.rox, ...`` all map to ``train.manifest.json``.
A shard without a manifest (every file roxxel writes) is still a valid shard.

The manifest is also the commit record of a write (see :mod:`grain_rox._format._shard_set`): it names
a write id and, per shard, its size, footer facts, sha256 and mtime_ns. While a write publishes
its shards (several renames, never atomic together) the manifest holds the previous set and the
complete new one as ``pending``; a reader decides from the files on disk which of the two is in
place, and refuses a mix. Every name in a manifest must be a shard of its own set
(``<base>.rox`` or ``<base>_NNNN.rox`` in the manifest's directory).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import secrets
import stat
from collections.abc import Callable
from typing import Any

import numpy as np

from grain_rox._format._atomic import atomic_write_bytes
from grain_rox._format._rox_format import RoxFormatError, ShardHeader

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_FORMAT = "grain_rox.manifest"
MANIFEST_VERSION = 3  # the newest version this grain_rox reads
# Manifests are written as version 2, or 3 where a record holds padding_spans (an older
# grain_rox then says "upgrade" instead of refusing a field it does not know).
_WRITTEN_VERSION, _SPANS_VERSION = 2, 3
_SHARD_NUMBER = re.compile(r"_\d{4,}$")


def set_base(shard_path: str) -> str:
    """Return a shard's set name: the path minus ``.rox`` and a roxxel ``_NNNN`` shard number.

    >>> set_base("data/train_0003.rox"), set_base("data/train.rox")
    ('data/train', 'data/train')
    """
    base = shard_path[:-4] if shard_path.endswith(".rox") else shard_path
    return _SHARD_NUMBER.sub("", base)


def manifest_path_for(shard_path: str) -> str:
    """Return where the manifest describing ``shard_path`` lives.

    >>> manifest_path_for("data/train_0003.rox")
    'data/train.manifest.json'
    """
    return set_base(shard_path) + MANIFEST_SUFFIX


def sha256_file(path: str, *, chunk_bytes: int = 8 << 20) -> str:
    """Return the hex sha256 of a whole file, read in chunks (bounded memory)."""
    return file_hexdigest(path, hashlib.sha256, chunk_bytes=chunk_bytes)


def file_hexdigest(path: str, new: Callable[[], Any], *, chunk_bytes: int = 8 << 20) -> str:
    """The hex digest of a whole file by the hash ``new()`` makes, read in chunks."""
    h = new()
    with open(path, "rb", buffering=0) as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return str(h.hexdigest())


def member_pattern(manifest_path: str) -> re.Pattern[str]:
    """Return the pattern of shard file names that belong to a manifest's set.

    >>> bool(member_pattern("d/t.manifest.json").fullmatch("t_0012.rox"))
    True
    >>> [bool(member_pattern("d/t.manifest.json").fullmatch(n)) for n in ["t_v2_0000.rox", "../t.rox"]]
    [False, False]
    """
    return re.compile(re.escape(set_name(manifest_path)) + r"(?:_\d{4,})?\.rox")


def set_name(manifest_path: str) -> str:
    """Return the set's file-name base of a manifest path (``d/t.manifest.json`` -> ``t``)."""
    base = os.path.basename(manifest_path)
    return base[: -len(MANIFEST_SUFFIX)] if base.endswith(MANIFEST_SUFFIX) else base


def new_write_id() -> str:
    """Return a fresh random id for one write (the set's generation)."""
    return secrets.token_hex(8)


@dataclasses.dataclass(frozen=True)
class ShardRecord:
    """One shard's entry in a manifest.

    ``mtime_ns`` is the shard's modification time when it was written: a shard whose size and
    mtime still match is taken to be unchanged without reading it; otherwise its sha256 is
    compared (see :attr:`grain_rox.RoxCorpus.fingerprint`).

    Attributes:
      file_size: the shard's size in bytes.
      num_blocks: its blocks, as its footer says.
      raw_size: the bytes of its raw (token) region, as its footer says.
      sha256: the hex sha256 of the whole file, or None when not known (a shard written by
        another tool).
      num_tokens: the tokens in its raw region, padding included.
      num_padding_tokens: how many of those are padding: the last block's, and (after
        appends to a single file) earlier writes' last blocks, now mid-stream.
      padding_spans: ``[token offset, count]`` of each padding an append left mid-stream (None:
        none, or a manifest from before they were recorded); the rest of
        ``num_padding_tokens`` ends the shard.
      num_documents: the documents written to it, or None when not recorded.
      mtime_ns: its modification time when written, or None (older manifests).
      object_tag: for a set published to a bucket, the content hash the store keeps for the
        shard's object (GCS's crc32c, S3's ETag), recorded after the upload was checked; an
        object whose hash differs was replaced, and is refused. None for local sets.

    >>> ShardRecord(file_size=64, num_blocks=2, raw_size=16, sha256=None, num_tokens=8).facts()
    (64, 2, 16)
    """

    file_size: int
    num_blocks: int
    raw_size: int
    sha256: str | None
    num_tokens: int
    num_padding_tokens: int = 0
    num_documents: int | None = None
    mtime_ns: int | None = None
    object_tag: str | None = None
    padding_spans: list[list[int]] | None = None

    def facts(self) -> tuple[int, int, int]:
        return (self.file_size, self.num_blocks, self.raw_size)

    @property
    def trailing_padding(self) -> int:
        """The padding that ends the shard (its last write's)."""
        return (self.num_padding_tokens or 0) - sum(n for _, n in self.padding_spans or ())

    def to_data(self) -> dict[str, Any]:
        """The record as manifest JSON: ``object_tag`` and ``padding_spans`` only when set (a
        local set's manifest reads as before, in older grain_rox too)."""
        data = dataclasses.asdict(self)
        for key in ("object_tag", "padding_spans"):
            if data[key] is None:
                del data[key]
        return data

    def check_checksum(self, path: str) -> bool:
        """Compare the shard's sha256 with this record; False if no checksum is recorded."""
        if self.sha256 is None:
            return False
        actual = sha256_file(path)
        if actual != self.sha256:
            raise RoxFormatError(
                path,
                f"sha256 is {actual} but the manifest records {self.sha256}: "
                "the shard's bytes are damaged",
                "restore the shard from a good copy or re-create it",
            )
        return True

    def check(self, header: ShardHeader, manifest_path: str) -> None:
        """Raise if ``header`` (read from the shard itself) disagrees with this record."""
        ours = self.facts()
        theirs = (header.file_size, header.num_blocks, header.raw_size)
        if ours != theirs:
            raise RoxFormatError(
                header.path,
                f"the manifest {manifest_path} records (file size, blocks, raw bytes) = {ours} "
                f"but the shard has {theirs}: the shard changed after the manifest was written",
                "re-create the shard set with grain-rox, or delete the stale manifest to read "
                "the shards without its extras",
            )
        if self.num_tokens != header.num_tokens:  # its raw bytes / its dtype's size
            raise RoxFormatError(
                header.path,
                f"the manifest {manifest_path} records {self.num_tokens:,} tokens but the "
                f"shard holds {header.num_tokens:,} ({header.raw_size:,} raw bytes of "
                f"{header.dtype}): the manifest was edited or belongs to other data",
                "re-create the shard set with grain-rox, or delete the stale manifest to read "
                "the shards without its extras",
            )


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A shard set's manifest: shared facts plus one :class:`ShardRecord` per shard file name.

    ``write_id`` names the write that made the set; ``pending`` is the complete manifest of a
    write that is publishing its shards (present only while it runs, or after it was killed).

    Attributes:
      dtype: the token dtype's name, as in the shards' footers (empty when the records only
        describe files that had no manifest).
      block_size: the bytes per block the set was written with.
      shards: one record per shard, by file name (``<set>.rox`` or ``<set>_NNNN.rox``).
      eos_id: the EOS / separator token id, or None.
      pad_id: the padding token id, or None.
      tokenizer: the tokenizer's identity (its ``identity()`` dict), or None.
      num_documents: the documents written to the whole set, or None.
      write_id: the random id of the write that made the set.
      pending: the complete manifest of a write still publishing its shards, or None.
      version: the manifest format version.
      refused: on the previous-set side of an overwrite's pending manifest, why the set it
        replaces was refused (a mix, an invalid manifest), else None.

    >>> m = Manifest(dtype="uint16", block_size=8, shards={}, eos_id=256, write_id="ab")
    >>> Manifest.from_json(m.to_json(), "x.manifest.json") == m
    True
    """

    dtype: str
    block_size: int
    shards: dict[str, ShardRecord]
    eos_id: int | None = None
    pad_id: int | None = None
    tokenizer: dict[str, Any] | None = None
    num_documents: int | None = None
    write_id: str | None = None
    pending: Manifest | None = None
    version: int = _WRITTEN_VERSION
    # Set on the previous-set side of an overwrite's pending manifest when the set it replaces
    # was refused (a mix, an invalid manifest): the reason, so a kill before the renames
    # refuses again rather than opening those files.
    refused: str | None = None

    def check_shard(self, header: ShardHeader, manifest_path: str) -> ShardRecord | None:
        """Raise if shard ``header`` disagrees with this manifest (its record's sizes, or the
        set's dtype); return its record, or None when the manifest does not list it."""
        record = self.shards.get(os.path.basename(header.path))
        if record is None:
            return None
        record.check(header, manifest_path)
        if self.dtype != header.dtype.str and self.dtype != str(header.dtype):
            raise RoxFormatError(
                header.path,
                f"the manifest {manifest_path} says dtype {self.dtype} but the shard's footer "
                f"says {header.dtype}",
                "delete the stale manifest or re-create the shard set",
            )
        return record

    def matches(self, name: str, header: ShardHeader) -> bool:
        """Whether shard ``name`` on disk is the one this manifest records."""
        rec = self.shards.get(name)
        return rec is not None and rec.facts() == (
            header.file_size,
            header.num_blocks,
            header.raw_size,
        )

    def _has_spans(self) -> bool:
        mine = any(r.padding_spans for r in self.shards.values())
        return mine or (self.pending is not None and self.pending._has_spans())

    def _data(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "version": max(self.version, _SPANS_VERSION) if self._has_spans() else self.version,
            "write_id": self.write_id,
            "dtype": self.dtype,
            "block_size": self.block_size,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "tokenizer": self.tokenizer,
            "num_documents": self.num_documents,
            "shards": {name: rec.to_data() for name, rec in self.shards.items()},
            "pending": None if self.pending is None else self.pending._data(),
            **({"refused": self.refused} if self.refused is not None else {}),
        }

    def to_json(self) -> str:
        data = {**self._data(), "sealed": True}  # so a copy without its checksum is refused
        data["checksum"] = _checksum(data)  # an edited manifest is refused, not believed
        return json.dumps(data, indent=1, sort_keys=False) + "\n"

    @classmethod
    def _from_data(cls, data: Any, path: str, where: str) -> Manifest:
        if not isinstance(data, dict) or not isinstance(data.get("shards"), dict):
            raise ValueError(f"expected {where}a JSON object with a 'shards' object")
        if data.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"'format' is {data.get('format')!r}, not {MANIFEST_FORMAT!r}")
        version = data["version"]
        if not isinstance(version, int) or version > MANIFEST_VERSION:
            raise RoxFormatError(
                path,
                f"manifest version {version!r} is newer than this grain_rox understands "
                f"({MANIFEST_VERSION})",
                "upgrade grain_rox",
            )
        if not where:  # a pending manifest is sealed by the one that holds it
            _check_seal(data, path)
        members = member_pattern(path)
        names = list(data["shards"])
        pending_data = data.get("pending")
        if version == 1 and pending_data:
            raise RoxFormatError(
                path,
                "it was left by a write of an older grain_rox that was interrupted (its "
                "'pending' entries are set)",
                "run the write again with if_exists='overwrite' (the files may mix the old and "
                "the new data)",
            )
        pending = None
        if version >= 2 and pending_data is not None:
            pending = cls._from_data(pending_data, path, "'pending' to be ")
            names += list(pending.shards)
        for name in names:
            if not isinstance(name, str) or not members.fullmatch(name):
                raise RoxFormatError(
                    path,
                    f"the manifest names {name!r}, which is not a shard of this set (expected "
                    f"{set_name(path)}.rox or {set_name(path)}_NNNN.rox in the manifest's own "
                    "directory)",
                    "the manifest was edited or damaged: re-create the shard set, or delete "
                    "this manifest to read the shards without its extras",
                )
        _check_counts(data, ("block_size",), ("num_documents",), "")
        for name, rec in data["shards"].items():
            if not isinstance(rec, dict):
                raise ValueError(f"the record of {name!r} is {rec!r}, not a JSON object")
            _check_counts(rec, _RECORD_COUNTS, _RECORD_OPTIONAL_COUNTS, f"{name!r}: ")
            _check_padding_spans(rec, f"{name!r}: ")
            mtime = rec.get("mtime_ns")  # any int: a file may date from before 1970
            if mtime is not None and not _is_int(mtime):
                raise ValueError(f"{name!r}: mtime_ns is {mtime!r}, not an int")
        for key in ("eos_id", "pad_id"):
            token = data.get(key)
            if token is not None and (
                isinstance(token, bool) or not isinstance(token, (int, float))
            ):
                raise ValueError(f"{key} is {token!r}, not a token id")
        return cls(
            dtype=data["dtype"],
            block_size=int(data["block_size"]),
            shards={name: ShardRecord(**rec) for name, rec in data["shards"].items()},
            eos_id=data.get("eos_id"),
            pad_id=data.get("pad_id"),
            tokenizer=data.get("tokenizer"),
            num_documents=data.get("num_documents"),
            write_id=data.get("write_id"),
            pending=pending,
            version=version,
            refused=data.get("refused"),
        )

    @classmethod
    def from_json(cls, text: str, path: str) -> Manifest:
        try:
            return cls._from_data(json.loads(text), path, "")
        except RoxFormatError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise RoxFormatError(
                path,
                f"the manifest is not valid grain_rox manifest JSON ({type(e).__name__}: {e})",
                "delete it (the shards read without it) or re-create the shard set",
            ) from None


_RECORD_COUNTS = ("file_size", "num_blocks", "raw_size", "num_tokens")
_RECORD_OPTIONAL_COUNTS = ("num_padding_tokens", "num_documents")


def _check_seal(data: dict[str, Any], path: str) -> None:
    """Raise unless the manifest ``data`` read from ``path`` is as it was written: its
    ``checksum`` is that of the rest of its content.

    Every manifest grain_rox writes now is sealed and says so (``"sealed": true``), so one
    that says so but has no checksum had it removed, the way an edit would get past the seal,
    and is refused. Only a manifest with neither key, as a grain_rox from before the seal
    wrote it, is read unsealed; a ``checksum`` of any value (``null`` too) is checked.

    >>> content = {"shards": {}, "sealed": True}
    >>> _check_seal({**content, "checksum": _checksum(content)}, "t.manifest.json")
    >>> _check_seal({"shards": {}}, "t.manifest.json")  # from before manifests were sealed
    >>> try:
    ...     _check_seal(content, "t.manifest.json")
    ... except RoxFormatError as e:
    ...     print(e.problem[:50])
    its checksum is missing, but it says it was sealed
    """
    if "checksum" not in data:
        if "sealed" in data:
            raise RoxFormatError(
                path,
                'its checksum is missing, but it says it was sealed ("sealed": true, as '
                "grain_rox writes every manifest): the seal was removed, and an edit of its "
                "facts (EOS id, counts, checksums of the shards) would pass unseen",
                "restore the manifest from a copy of the set (grain-rox verify then checks "
                "the shards against it) or re-create the shard set with grain-rox; to read "
                "the shards without its extras, delete the manifest",
            )
        return  # written before manifests were sealed
    recorded = data["checksum"]
    content = {k: v for k, v in data.items() if k != "checksum"}
    if recorded != _checksum(content):
        raise RoxFormatError(
            path,
            "the manifest was edited or damaged after it was written: its checksum "
            f"{recorded!r} is not that of its content ({_checksum(content)}); its "
            "facts (EOS id, counts, checksums of the shards) cannot be trusted",
            "re-create the shard set with grain-rox, or delete the manifest to read "
            "the shards without its extras",
        )


def _checksum(data: dict[str, Any]) -> str:
    """sha256 of a manifest's content (without its checksum), as canonical JSON."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def pad_run(tokens: np.ndarray, pad: Any) -> int:
    """How many tokens at the end of ``tokens`` are the pad id ``pad`` (a NaN pad too).

    >>> pad_run(np.array([5, 0, 7, 0, 0]), 0), pad_run(np.array([1.0, np.nan]), float("nan"))
    (2, 1)
    """
    is_pad = np.isnan(tokens) if isinstance(pad, float) and math.isnan(pad) else tokens == pad
    other = np.flatnonzero(~is_pad)
    return int(tokens.size if other.size == 0 else tokens.size - 1 - other[-1])


def _is_int(value: Any) -> bool:
    """A JSON integer (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_counts(
    data: dict[str, Any], required: tuple[str, ...], optional: tuple[str, ...], where: str
) -> None:
    """The counts a manifest records are whole numbers >= 0 (an edited or damaged manifest
    is refused, not believed: ``num_documents: -3`` passed ``verify``)."""
    for key in required + optional:
        if key not in data:
            continue  # a missing field is the KeyError/TypeError of reading it
        value = data[key]
        if value is None and key in optional:
            continue
        if not _is_int(value) or value < 0:
            raise ValueError(f"{where}{key} is {value!r}, not a count (a whole number >= 0)")


def _check_padding_spans(rec: dict[str, Any], where: str) -> None:
    """``padding_spans``, when recorded: ``[offset, count]`` pairs of counts, inside the
    shard's tokens and its recorded padding."""
    spans = rec.get("padding_spans")
    if spans is None:
        return
    pairs = isinstance(spans, list) and all(
        isinstance(p, list) and len(p) == 2 and all(_is_int(v) and v >= 0 for v in p) for p in spans
    )
    tokens, padding = rec.get("num_tokens", 0), rec.get("num_padding_tokens", 0)
    if not pairs or any(a + n > tokens for a, n in spans) or sum(n for _, n in spans) > padding:
        raise ValueError(
            f"{where}padding_spans is {spans!r:.200}, not [offset, count] pairs of the shard's "
            "padding"
        )


def load_manifest(path: str) -> Manifest | None:
    """Return the manifest at ``path`` as written (pending write included), or None if none.

    Use :func:`grain_rox._format._shard_set.current_manifest` for the one that describes the disk.
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise RoxFormatError(
                path,
                "the manifest is not a regular file (a FIFO, device or directory)",
                "remove it or rename it; a manifest is a JSON file written by grain_rox",
            )
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as e:
        raise RoxFormatError(
            path,
            f"the manifest is not UTF-8 JSON ({e})",
            "delete it (the shards read without it) or re-create the shard set",
        ) from None
    return Manifest.from_json(text, path)


def write_manifest(path: str, manifest: Manifest) -> None:
    """Write ``manifest`` to ``path`` atomically (temporary file, fsync, rename)."""
    atomic_write_bytes(path, manifest.to_json().encode("utf-8"))
