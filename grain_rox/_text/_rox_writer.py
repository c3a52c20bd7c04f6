"""Write items (text, bytes, token arrays) into ROXXEL02 shards that roxxel can read, atomically.

The byte layout is roxxel's: items are concatenated (each followed by the separator, if any),
cut into blocks of ``block_size`` bytes, the last block padded; with ``max_shard_bytes`` the
blocks are spread over ``<base>_0000.rox, <base>_0001.rox, ...`` by roxxel's rotation rule.
What differs is everything that can go wrong in roxxel:

* the dtype is chosen to fit the tokenizer's vocabulary (uint16 up to 65,536 ids, uint32
  above; never roxxel's int16 overflow) and every value is range-checked, never relabelled;
* the separator (EOS) is exactly one token; a block size that would split tokens is refused;
* every shard is written under a hidden temporary name and fsynced; the whole set is then
  published as one transaction recorded in the manifest (see :mod:`grain_rox._format._shard_set`):
  after a kill at any point the set opens as the complete old data, the complete new data, or
  refuses naming what to do; old shards are deleted only after the new ones are in place, and
  the next write to the set removes a killed writer's temporaries;
* an append never touches existing bytes: a single file is rewritten copy-on-write and a
  sharded set gets new shards after its last one;
* the index is arithmetic (blocks are uniform), so memory does not grow with the output.

:func:`write_rox` runs the steps in order: plan the token layout and encode items
(:mod:`grain_rox._text._item_encoding`), write blocks into temporary shard files
(:mod:`grain_rox._text._shard_files`), then build the new set's manifest
(:mod:`grain_rox._text._write_manifest`) and publish the set as one transaction.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from grain_rox._format._atomic import set_write_lock
from grain_rox._format._manifest import MANIFEST_SUFFIX, Manifest, manifest_path_for, set_base
from grain_rox._format._object_store import is_url
from grain_rox._format._object_upload import check_can_publish, publish_to_bucket
from grain_rox._format._rox_format import read_header
from grain_rox._format._shard_set import (
    clean_leftovers,
    previous_set,
    publish_set,
    roll_back_interrupted,
    scan_set,
    shard_number,
)
from grain_rox._text._item_encoding import Item, ItemEncoder, TokenLayout, plan_layout
from grain_rox._text._shard_files import IfExists, ShardSetWriter, is_set_member
from grain_rox._text._tokenize_ahead import tokenize_in_order
from grain_rox._text._tokenizers import Tokenizer, get_tokenizer
from grain_rox._text._write_manifest import (
    build_manifest,
    check_append_compatible,
    check_block_size,
)

logger = logging.getLogger("grain_rox")

_FLUSH_BYTES = 4 << 20  # encoded tokens gathered before whole blocks are written


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """What :func:`write_rox` wrote.

    Attributes:
      paths: the shards created or rewritten by this call, in order (empty if an append had
        nothing to add).
      manifest_path: the set's manifest, or ``None`` with ``manifest=False`` (or when nothing
        was written).
      num_tokens: tokens written by this call, separators included, padding excluded.
      num_padding_tokens: tokens that pad this call's final block.
      num_documents: items written by this call.
      dtype: the token dtype of the shards.
      block_size: bytes per block of this call's blocks.

    >>> import tempfile, os
    >>> result = write_rox(["ab", "c"], os.path.join(tempfile.mkdtemp(), "w.rox"), block_size=4)
    >>> result.num_documents, result.num_tokens, result.num_padding_tokens, len(result.paths)
    (2, 3, 1, 1)
    """

    paths: tuple[str, ...]
    manifest_path: str | None
    num_tokens: int
    num_padding_tokens: int
    num_documents: int
    dtype: np.dtype
    block_size: int


@dataclasses.dataclass
class _Written:
    """What the encode step wrote; documents by the shard (position) their first token is in."""

    num_tokens: int = 0
    num_documents: int = 0
    num_padding_tokens: int = 0
    documents_per_file: collections.Counter[int] = dataclasses.field(
        default_factory=collections.Counter
    )


def write_rox(
    items: Iterable[Item],
    path: str | os.PathLike[str],
    *,
    block_size: int = 4096,
    max_shard_bytes: int | None = None,
    dtype: Any = None,
    separator: Any = None,
    pad_id: int | None = None,
    tokenizer: str | os.PathLike[str] | Tokenizer | None = None,
    if_exists: IfExists = "error",
    manifest: bool = True,
    progress: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> WriteResult:
    """Write ``items`` into ROXXEL02 shard(s) at ``path`` that both grain_rox and roxxel read.

    Args:
      items: str (UTF-8 bytes, or token ids with ``tokenizer``), bytes, numpy arrays or lists
        of token ids. Each item is followed by ``separator``.
      path: the shard file, or with ``max_shard_bytes`` the set's name (``x.rox`` gives
        ``x_0000.rox, x_0001.rox, ...``).
      block_size: bytes per block; a multiple of the token size.
      max_shard_bytes: split into shards of at most this many bytes (roxxel's rule: a shard
        holds at least one block).
      dtype: token dtype; default from the tokenizer's vocabulary, else the first item.
      separator: one token (an id, or ``itemsize`` bytes) written after every item; with a
        tokenizer it defaults to the tokenizer's EOS id.
      pad_id: the token that pads the final block; default the tokenizer's pad id, else the
        separator, else 0.
      tokenizer: ``"bytes"``, ``"cl100k_base"``, ``"o200k_base"``, a ``tokenizer.json`` path,
        or a tokenizer object; str items are encoded with it, in batches of about a megabyte
        of text encoded ahead on a thread (on every core for tiktoken and HF tokenizers).
      if_exists: ``"error"`` (default), ``"append"`` (existing bytes are never modified) or
        ``"overwrite"``.
      manifest: write ``<base>.manifest.json`` with checksums, counts and tokenizer identity
        (``False`` for a new set or an overwrite only: an append keeps the set's manifest).
      progress: show a progress bar (tokens written) on a terminal.
      storage_options: fsspec options (endpoint, credentials) when ``path`` is a URL; None
        uses fsspec's configuration and the environment.

    A URL (``gs://bucket/data/train.rox``, ``s3://...``, any fsspec scheme) writes the set in
    a local staging directory (``tempfile``'s, so ``TMPDIR``), then publishes it to the
    bucket: manifest first with the write marked pending (readers refuse the set meanwhile),
    each shard uploaded create-only, the final manifest last (see
    :mod:`grain_rox._format._object_upload`). ``if_exists="append"`` is refused there.

    Returns:
      A :class:`WriteResult`: the shard paths, the manifest path, token, padding and
      document counts, dtype and block size of what this call wrote.

    Raises:
      FileExistsError: ``path`` exists and ``if_exists="error"``.
      ValueError: a token outside the dtype or the tokenizer's vocabulary, a block size that
        splits tokens, a separator that is not one token, or an append with another dtype.

    >>> import tempfile, os
    >>> from grain_rox import open_rox, write_rox
    >>> path = os.path.join(tempfile.mkdtemp(), "docs.rox")
    >>> result = write_rox(["hi", "yo!"], path, tokenizer="bytes", block_size=8)
    >>> result.num_documents, result.num_tokens, result.num_padding_tokens, str(result.dtype)
    (2, 7, 1, 'uint16')
    >>> with open_rox(path) as corpus:
    ...     print(corpus.tokens(0, 8).tolist(), corpus.eos_id)
    [104, 105, 256, 121, 111, 33, 256, 256] 256
    """
    path = os.fspath(path)
    _check_output_path(path, if_exists, max_shard_bytes)
    if is_url(path):
        return _write_to_bucket(
            items,
            path,
            dict(
                block_size=block_size,
                max_shard_bytes=max_shard_bytes,
                dtype=dtype,
                separator=separator,
                pad_id=pad_id,
                tokenizer=tokenizer,
                progress=progress,
            ),
            if_exists=if_exists,
            manifest=manifest,
            storage_options=storage_options,
        )
    tok = get_tokenizer(tokenizer) if tokenizer is not None else None
    if isinstance(items, (str, bytes, np.ndarray)):
        items = [items]  # a single item, not an iterable of characters/rows
    describe = getattr(items, "describe_item", None)  # e.g. an ArrayRecord file and record
    layout, item_iter = plan_layout(iter(items), dtype, block_size, separator, pad_id, tok)
    if tok is not None:  # text is encoded in batches, a batch ahead on a thread
        item_iter = tokenize_in_order(item_iter, tok)

    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    mpath = manifest_path_for(path) if max_shard_bytes is None else path[:-4] + MANIFEST_SUFFIX
    with set_write_lock(mpath, path):  # one writer per set at a time
        disk, previous = _prepare_set(path, mpath, max_shard_bytes, if_exists)
        shards = ShardSetWriter(path, layout.dtype, block_size, max_shard_bytes, if_exists, disk)
        _check_append(shards, previous, mpath, layout, if_exists)
        _check_block_size(shards, disk, mpath, layout, if_exists)
        if not manifest and previous.dtype and (if_exists == "append" or shards.member):
            raise ValueError(
                f"manifest=False would delete {mpath}, the manifest of the set this write "
                "adds to (its shards' checksums, EOS id, tokenizer and document counts); "
                "append with manifest=True (the default), or write a new set without one"
            )
        try:
            with _progress_bar(progress, path) as bar:
                written = _encode_and_write(item_iter, layout, shards, bar, describe)
            if not shards.files:
                return _nothing_written(path, layout, shards, if_exists)
            finished = shards.finish()
        except OSError as e:
            shards.discard()
            if e.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                raise
            raise OSError(
                e.errno,
                f"{e.strerror} while writing {path}: nothing was changed (the set is as it "
                "was, and this write's temporary files are deleted); free space, or write "
                "smaller shards (max_shard_bytes=), and run the write again",
            ) from e
        except BaseException:
            shards.discard()
            raise
        kept = previous.shards if if_exists == "append" or shards.member else {}
        final = build_manifest(
            previous,
            kept,
            shards.files,
            finished,
            written.documents_per_file,
            written.num_padding_tokens,
            layout,
        )
        publish_set(
            mpath,
            disk,
            previous,
            final,
            [(f.tmp_path, f.final_path) for f in shards.files],
            discard=shards.discard,
            keep_manifest=manifest,
        )
    return WriteResult(
        paths=tuple(f.final_path for f in shards.files),
        manifest_path=mpath if manifest else None,
        num_tokens=written.num_tokens,
        num_padding_tokens=written.num_padding_tokens,
        num_documents=written.num_documents,
        dtype=layout.dtype,
        block_size=block_size,
    )


def _write_to_bucket(
    items: Iterable[Item],
    url: str,
    options: dict[str, Any],
    *,
    if_exists: IfExists,
    manifest: bool,
    storage_options: dict[str, Any] | None,
) -> WriteResult:
    """:func:`write_rox` to a URL: stage the set locally, then publish it to the bucket."""
    if if_exists == "append":
        raise ValueError(
            f"if_exists='append' to {url}: a set in a bucket is written whole (objects cannot "
            "be extended in place). Fix: write a new set (and read both as one corpus with a "
            "list of paths), or rewrite the set with if_exists='overwrite'"
        )
    if not manifest:
        raise ValueError(
            f"manifest=False for {url}: a set in a bucket is published through its manifest "
            "(readers refuse it while a write is pending). Fix: leave manifest=True"
        )
    check_can_publish(url, if_exists=if_exists, storage_options=storage_options)
    with tempfile.TemporaryDirectory(prefix="grain_rox_upload_") as staging:
        staged = os.path.join(staging, os.path.basename(url))
        try:
            local = write_rox(items, staged, **options)
        except (ValueError, TypeError, OSError) as e:
            named = _named_by_url(e, staged, url)
            if named is e:
                raise
            raise named from e
        if not local.paths:
            return local
        assert local.manifest_path is not None
        urls, murl = publish_to_bucket(
            list(local.paths),
            local.manifest_path,
            url,
            if_exists=if_exists,
            storage_options=storage_options,
        )
    return dataclasses.replace(local, paths=tuple(urls), manifest_path=murl)


def _named_by_url(error: Exception, staged: str, url: str) -> Exception:
    """``error`` of the local write staged at ``staged`` as the user sees it: its message naming
    ``url`` (the staging directory is hidden and gone), the same type where it can be made
    from a message alone; else ``error`` itself."""
    stem, where = staged[: -len(".rox")], url[: -len(".rox")]
    text = str(error)
    if stem not in text:
        return error
    try:
        return type(error)(text.replace(stem, where))
    except Exception:  # (a type made otherwise)
        return error


def _check_output_path(path: str, if_exists: str, max_shard_bytes: int | None) -> None:
    """Refuse output paths roxxel would misread (globs, no ``.rox``) and a bad ``if_exists``."""
    if "*" in path or "?" in path:
        renamed = path.replace("*", "base").replace("?", "base")
        raise ValueError(
            f"the output path {path!r} contains glob characters (* or ?); roxxel would write "
            f"{renamed!r} or append to whatever the glob matches. Pass the real file name"
        )
    name = os.path.basename(path)
    if not name.endswith(".rox") or name == ".rox":
        # a folder (``out/``) or a bare ``.rox`` names no set: suggest a file, never a hidden
        # one (``*.rox`` globs leave those out)
        suggested = path + ".rox" if name not in ("", ".rox") else path.removesuffix(".rox")
        suggested = suggested if suggested.endswith(".rox") else suggested + "train.rox"
        raise ValueError(
            f"the output path {path!r} does not end in .rox after a name; roxxel and grain_rox "
            f"find shards by that suffix. Pass e.g. {suggested!r}"
        )
    if if_exists not in ("error", "append", "overwrite"):
        raise ValueError(f"if_exists={if_exists!r}; use 'error', 'append' or 'overwrite'")
    folder = os.path.dirname(path)
    while folder and not is_url(path) and not os.path.isdir(folder):
        if os.path.lexists(folder):  # a file where a folder of the path must be
            raise ValueError(
                f"the output path {path!r} lies under {folder!r}, which is a file, not a "
                "folder; pass an output path inside a folder"
            )
        folder = os.path.dirname(folder)
    if max_shard_bytes is not None and shard_number(os.path.basename(path)) >= 0:
        # Its set x_0003 would name x_0003.rox, a member of the set x, as one of its own.
        raise ValueError(
            f"the output path {path!r} ends in a shard number (_NNNN) but max_shard_bytes= "
            f"writes a shard set named after it ({path[:-4]}_NNNN.rox), whose names overlap "
            f"the set {set_base(path)}.rox; choose a base name without a shard number, e.g. "
            f"{set_base(path) + '-' + path[len(set_base(path)) + 1 :]!r}"
        )


def _prepare_set(
    path: str, mpath: str, max_shard_bytes: int | None, if_exists: IfExists
) -> tuple[dict[str, os.stat_result], Manifest]:
    """Tidy the set after killed writers; return its files on disk and its previous manifest.

    Call with the set's write lock held.
    """
    clean_leftovers(mpath)  # temporaries of killed writers to this set
    roll_back_interrupted(mpath)  # their uncommitted shards beside an intact previous set
    disk = scan_set(mpath)
    member = is_set_member(path, max_shard_bytes)
    previous = previous_set(
        mpath,
        disk,
        strict=if_exists == "append" or member,
        replaced=os.path.basename(path) if member and if_exists == "overwrite" else None,
    )
    return disk, previous


def _check_append(
    shards: ShardSetWriter,
    previous: Manifest,
    mpath: str,
    layout: TokenLayout,
    if_exists: IfExists,
) -> None:
    """An append (or a member written beside the set) keeps the set's dtype, EOS, pad id and
    tokenizer."""
    if (if_exists == "append" or shards.member) and previous.dtype:  # a grain_rox manifest
        check_append_compatible(previous, mpath, layout)
    if shards.copy_from is not None:
        record = previous.shards.get(os.path.basename(shards.copy_from))
        shards.copy_sha256 = None if record is None else record.sha256
        old = read_header(shards.copy_from)
        if old.dtype != layout.dtype:
            raise ValueError(
                f"cannot append {layout.dtype} tokens to {shards.copy_from}, which holds "
                f"{old.dtype}; pass dtype={old.dtype}"
            )


def _check_block_size(
    shards: ShardSetWriter,
    disk: Mapping[str, Any],
    mpath: str,
    layout: TokenLayout,
    if_exists: IfExists,
) -> None:
    """An append (or a member written beside the set) uses the set's block size (see
    :func:`check_block_size`)."""
    if if_exists != "append" and not shards.member:
        return
    replaced = os.path.basename(shards.single_path) if if_exists == "overwrite" else None
    check_block_size(
        os.path.dirname(mpath), disk, layout.block_size, first=shards.copy_from, replaced=replaced
    )


def _encode_and_write(
    items: Iterator[Any],
    layout: TokenLayout,
    shards: ShardSetWriter,
    bar: Any,
    describe: Callable[[int], str] | None = None,
) -> _Written:
    """Encode every item, follow it by the separator, write whole blocks as they fill and pad
    the final block; count tokens and documents. ``describe(i)``: where item ``i`` came from,
    for errors."""
    encode = ItemEncoder(layout.dtype, layout.tokenizer, describe)
    target = layout.dtype
    per_block = layout.tokens_per_block
    flush_tokens = max(per_block, (_FLUSH_BYTES // layout.block_size) * per_block)
    sep_arr = None if layout.separator is None else np.asarray([layout.separator], dtype=target)
    pending: list[np.ndarray] = []
    pending_tokens = 0
    written = _Written()
    # A document counts in the shard its first token lands in; shards have a fixed capacity.
    cap_tokens = None if shards.capacity is None else shards.capacity * per_block
    warned = False
    for index, item in enumerate(items):
        arr = encode(item, index)
        shard = 0 if cap_tokens is None else written.num_tokens // cap_tokens
        # an item holding the separator: readers see a document end there, so the manifest
        # counts one, in the shard where the next starts (and the first such item is logged).
        # Text through a tokenizer never holds its EOS id.
        inside = 0
        if sep_arr is not None and not (isinstance(item, str) and encode.tokenizer is not None):
            ends = np.flatnonzero(arr == sep_arr[0])
            inside = int(ends.size)
            if inside:  # the shard each of those documents starts in
                starts = written.num_tokens + ends + 1
                written.documents_per_file.update(
                    [shard] * inside if cap_tokens is None else (starts // cap_tokens).tolist()
                )
            if inside and not warned:
                warned = True
                logger.warning(
                    "item %d holds the separator (EOS) id %s %d time(s): readers see a "
                    "document end at each, and the manifest counts them as documents. Drop it "
                    "from the items, or pass separator=None if they carry their own",
                    index,
                    sep_arr[0],
                    inside,
                )
        written.documents_per_file[shard] += 1
        written.num_documents += 1 + inside
        pending.append(arr)
        pending_tokens += arr.size
        written.num_tokens += arr.size
        if sep_arr is not None:
            pending.append(sep_arr)
            pending_tokens += 1
            written.num_tokens += 1
        if pending_tokens >= flush_tokens:
            buf = np.concatenate(pending).astype(target, copy=False)  # keeps >u2 order
            whole = (buf.size // per_block) * per_block
            shards.write(buf[:whole])
            pending = [buf[whole:]]
            pending_tokens = buf.size - whole
            bar.update(whole)
    buf = np.concatenate(pending).astype(target, copy=False) if pending else np.empty((0,), target)
    written.num_padding_tokens = (-buf.size) % per_block
    if written.num_padding_tokens:
        padding = np.full(written.num_padding_tokens, layout.pad, dtype=target)
        buf = np.concatenate([buf, padding]).astype(target, copy=False)
    if buf.size:
        shards.write(buf)
    bar.update(buf.size)
    return written


def _nothing_written(
    path: str, layout: TokenLayout, shards: ShardSetWriter, if_exists: IfExists
) -> WriteResult:
    """An empty result for an append of no tokens; otherwise an error (no 0-byte shard)."""
    if shards.copy_from is not None or if_exists == "append":
        return WriteResult((), None, 0, 0, 0, layout.dtype, layout.block_size)
    raise ValueError(
        f"nothing to write to {path}: the items hold no tokens (roxxel would leave an "
        "unreadable 0-byte file here)"
    )


class _NoProgressBar:
    def update(self, n: int) -> None:
        pass


@contextlib.contextmanager
def _progress_bar(enabled: bool, path: str) -> Iterator[Any]:
    """A tqdm bar counting tokens written (a do-nothing one unless ``enabled``)."""
    if not enabled:
        yield _NoProgressBar()
        return
    from tqdm.auto import tqdm

    bar = tqdm(desc=f"writing {os.path.basename(path)}", unit="tok", unit_scale=True)
    try:
        yield bar
    finally:
        bar.close()
