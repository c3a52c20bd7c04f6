"""The sidecar manifest: grain_rox's extras beside the shards, never inside them.

Roxxel's format has no checksum, token count, EOS id or tokenizer identity, and its files must
stay readable by roxxel, so those facts live in one JSON file per shard set:
``train.rox`` and ``train_0000.rox, train_0001.rox, ...`` all map to ``train.manifest.json``.
A shard without a manifest (every file roxxel writes) is still a valid shard.

Several shards cannot be renamed into place in one atomic step, so a write is a small
transaction recorded in the manifest: (1) all shards are written and fsynced under temporary
names; (2) the manifest is written listing the new shards as ``pending`` (with the record each
name had before, if any); (3) the shards are renamed into place; (4) the manifest is rewritten
without ``pending``. A reader that finds ``pending`` entries accepts them only if every pending
shard is in place (the writer died after step 3); otherwise a pending shard that differs from
its previous record belongs to an interrupted write and opening it fails, naming the files to
delete. Shards from before the write are never touched. A manifest whose size facts disagree
with its shard (the shard was replaced or appended to by another tool) is reported as stale
rather than trusted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from typing import Any

from grain_rox._atomic import atomic_write_bytes
from grain_rox._rox_format import RoxFormatError, ShardHeader, read_header

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_FORMAT = "grain_rox.manifest"
MANIFEST_VERSION = 1
_SHARD_NUMBER = re.compile(r"_\d{4,}$")
_BROKEN: Any = object()  # a pending shard that exists but does not parse


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
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class ShardRecord:
    """One shard's entry in a manifest.

    >>> ShardRecord(file_size=64, num_blocks=2, raw_size=16, sha256=None, num_tokens=8).facts()
    (64, 2, 16)
    """

    file_size: int
    num_blocks: int
    raw_size: int
    sha256: str | None  # None: not known (a shard written by another tool)
    num_tokens: int
    num_padding_tokens: int = 0
    num_documents: int | None = None

    def facts(self) -> tuple[int, int, int]:
        return (self.file_size, self.num_blocks, self.raw_size)

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


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A shard set's manifest: shared facts plus one :class:`ShardRecord` per shard file name.

    >>> m = Manifest(dtype="uint16", block_size=8, shards={}, eos_id=256)
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
    pending: dict[str, ShardRecord | None] = dataclasses.field(default_factory=dict)
    version: int = MANIFEST_VERSION

    def matches(self, name: str, header: ShardHeader) -> bool:
        """Whether shard ``name`` on disk is the one this manifest records."""
        rec = self.shards.get(name)
        return rec is not None and rec.facts() == (
            header.file_size,
            header.num_blocks,
            header.raw_size,
        )

    def settle(self, directory: str) -> Manifest:
        """Resolve ``pending`` entries against the shards in ``directory``.

        Returns a manifest without pending entries that describes what is on disk. Raises
        :class:`RoxFormatError` naming the files of an interrupted write that reached the disk.
        """
        if not self.pending:
            return self
        on_disk: dict[str, ShardHeader | None] = {}
        for name in self.pending:
            path = os.path.join(directory, name)
            try:
                on_disk[name] = read_header(path)
            except FileNotFoundError:
                on_disk[name] = None
            except RoxFormatError:
                on_disk[name] = None if not os.path.exists(path) else _BROKEN
        if all(h not in (None, _BROKEN) and self.matches(n, h) for n, h in on_disk.items()):
            return dataclasses.replace(self, pending={})  # the write finished its renames
        shards = dict(self.shards)
        orphans = []
        for name, previous in self.pending.items():
            h = on_disk[name]
            if (
                previous is not None
                and h not in (None, _BROKEN)
                and previous.facts() == (h.file_size, h.num_blocks, h.raw_size)
            ):
                shards[name] = previous  # untouched by the interrupted write
            elif h is None:
                shards.pop(name, None)  # never renamed into place: as if not written
            else:
                shards.pop(name, None)
                orphans.append(os.path.join(directory, name))
        if orphans:
            raise RoxFormatError(
                orphans[0],
                f"{len(orphans)} shard(s) belong to a write that was interrupted before it "
                f"finished ({', '.join(orphans)}); the manifest lists them as pending",
                "delete those files and run the write again (shards written before it are intact)",
            )
        counts = [r.num_documents for r in shards.values()]
        docs = None if any(c is None for c in counts) else sum(c or 0 for c in counts)
        return dataclasses.replace(self, shards=shards, pending={}, num_documents=docs)

    def to_json(self) -> str:
        data = {
            "format": MANIFEST_FORMAT,
            "version": self.version,
            "dtype": self.dtype,
            "block_size": self.block_size,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "tokenizer": self.tokenizer,
            "num_documents": self.num_documents,
            "shards": {name: dataclasses.asdict(rec) for name, rec in self.shards.items()},
            "pending": {
                name: None if rec is None else dataclasses.asdict(rec)
                for name, rec in self.pending.items()
            },
        }
        return json.dumps(data, indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str, path: str) -> Manifest:
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or not isinstance(data.get("shards"), dict):
                raise ValueError("expected a JSON object with a 'shards' object")
            if data.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"'format' is {data.get('format')!r}, not {MANIFEST_FORMAT!r}")
            if data["version"] > MANIFEST_VERSION:
                raise RoxFormatError(
                    path,
                    f"manifest version {data['version']} is newer than this grain_rox "
                    f"understands ({MANIFEST_VERSION})",
                    "upgrade grain_rox",
                )
            shards = {name: ShardRecord(**rec) for name, rec in data["shards"].items()}
            pending = {
                name: None if rec is None else ShardRecord(**rec)
                for name, rec in data.get("pending", {}).items()
            }
            return cls(
                dtype=data["dtype"],
                block_size=int(data["block_size"]),
                shards=shards,
                eos_id=data.get("eos_id"),
                pad_id=data.get("pad_id"),
                tokenizer=data.get("tokenizer"),
                num_documents=data.get("num_documents"),
                pending=pending,
                version=data["version"],
            )
        except RoxFormatError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise RoxFormatError(
                path,
                f"the manifest is not valid grain_rox manifest JSON ({type(e).__name__}: {e})",
                "delete it (the shards read without it) or re-create the shard set",
            ) from None


def load_manifest(path: str, *, settle: bool = True) -> Manifest | None:
    """Return the manifest at ``path`` (pending writes settled), or None if there is none."""
    try:
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
    manifest = Manifest.from_json(text, path)
    return manifest.settle(os.path.dirname(path)) if settle else manifest


def write_manifest(path: str, manifest: Manifest) -> None:
    """Write ``manifest`` to ``path`` atomically (temporary file, fsync, rename)."""
    atomic_write_bytes(path, manifest.to_json().encode("utf-8"))
