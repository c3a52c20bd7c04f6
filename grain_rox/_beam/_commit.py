"""The one step that makes a Beam conversion visible: check that every shard is there, then
publish the set as one transaction, with no Beam in it.

Workers write each shard under a hidden temporary name (a retried bundle writes the same bytes
under a new one) and report it as a :class:`WrittenShard`. :func:`commit_shards` runs once,
after all of them: it refuses a hole (a shard missing) or two different shards with one number,
then, under the set's write lock, publishes the shards and the manifest with the package's own
transaction (:func:`grain_rox._format._shard_set.publish_set`: the manifest names the old set
and the pending new one, the shards are renamed into place, the manifest becomes the new
set's). Until then nothing of the conversion opens as a shard set; a killed commit leaves the
old set, the new one, or a refused mix, as any write does. The temporaries of retried attempts
are removed after the publish. A commit that fails keeps the shards it was to publish, and one
run again for the same conversion (a retried commit step) finishes what the first one began
and otherwise changes nothing.

>>> import os, tempfile
>>> import numpy as np
>>> from grain_rox import open_rox
>>> from grain_rox._beam._write_shard import write_shard
>>> plan = ShardPlan.from_parts([(0, 3, 1)], tokens_per_block=4, blocks_per_shard=None)
>>> layout = conversion_layout("bytes", block_size=8)
>>> path = os.path.join(tempfile.mkdtemp(), "t.rox")
>>> tokens = np.array([104, 105, 256], layout.dtype).tobytes()
>>> shard = write_shard(path, None, 0, [(0, tokens, 1)], plan, layout)
>>> manifest = commit_shards(path, None, [shard], plan, layout, run_id="0123456789abcdef")
>>> with open_rox(path) as corpus:
...     corpus.tokens(0, 4).tolist(), corpus.num_documents
([104, 105, 256, 256], 1)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Sequence
from typing import NamedTuple, cast

from grain_rox._beam._plan import ShardPlan
from grain_rox._format._atomic import set_write_lock
from grain_rox._format._manifest import (
    MANIFEST_SUFFIX,
    Manifest,
    load_manifest,
    manifest_path_for,
)
from grain_rox._format._rox_format import RoxFormatError
from grain_rox._format._shard_set import (
    clean_leftovers,
    previous_set,
    publish_set,
    roll_back_interrupted,
    scan_set,
    stat_matches,
)
from grain_rox._text._item_encoding import TokenLayout, plan_layout
from grain_rox._text._shard_files import (
    FinishedShard,
    IfExists,
    ShardFile,
    ShardSetWriter,
    is_set_member,
)
from grain_rox._text._tokenizers import get_tokenizer
from grain_rox._text._write_manifest import (
    build_manifest,
    check_append_compatible,
    check_block_size,
)


class WrittenShard(NamedTuple):
    """One shard a worker wrote in full (fsynced) under ``tmp_path``, to be named
    ``final_path``; what the manifest records of it."""

    shard: int
    final_path: str
    tmp_path: str
    num_blocks: int
    file_size: int
    raw_size: int
    sha256: str
    mtime_ns: int
    num_documents: int


def conversion_layout(
    tokenizer: str | os.PathLike[str],
    *,
    block_size: int,
    dtype: object = None,
) -> TokenLayout:
    """The token layout of a conversion, as :func:`~grain_rox.write_rox` settles it for
    ``tokenizer=`` (dtype from its vocabulary, separator its EOS id, padding its pad id or EOS).

    >>> layout = conversion_layout("bytes", block_size=4096)
    >>> str(layout.dtype), layout.separator, layout.pad
    ('uint16', 256, 256)
    """
    tok = get_tokenizer(tokenizer)
    layout, _ = plan_layout(iter(()), dtype, block_size, None, None, tok)
    return layout


def manifest_path(path: str, max_shard_bytes: int | None) -> str:
    """Where the set written to ``path`` keeps its manifest (as :func:`~grain_rox.write_rox`)."""
    return manifest_path_for(path) if max_shard_bytes is None else path[:-4] + MANIFEST_SUFFIX


def shard_writer(
    path: str,
    max_shard_bytes: int | None,
    layout: TokenLayout,
    if_exists: IfExists,
    disk: dict[str, os.stat_result],
) -> ShardSetWriter:
    """The local writer's view of the set (nothing is created): it refuses an existing set
    with ``if_exists="error"`` exactly as ``write_rox`` does and knows the shard capacity."""
    if if_exists == "append":
        raise ValueError(
            f"appending to {path} is not supported on Beam: convert into a new set (another "
            "-o) and mix the two sets, or convert locally with --if-exists append"
        )
    try:
        return ShardSetWriter(
            path, layout.dtype, layout.block_size, max_shard_bytes, if_exists, disk
        )
    except FileExistsError as e:  # the local writer's advice names an append, refused here
        what = str(e).split(";")[0]
        raise FileExistsError(
            f"{what}; pass --if-exists overwrite (if_exists='overwrite') to replace it, or "
            "convert into another -o (appending is not supported on Beam)"
        ) from None


def set_on_disk(mpath: str, label: str) -> dict[str, os.stat_result]:
    """The set's files as a new write finds them: the uncommitted shards of a killed write
    beside an intact previous set rolled back first (under the set's write lock), as
    ``write_rox`` does, so a conversion run again after a killed commit is not refused as if
    those shards were a set."""
    if os.path.exists(mpath):  # (a killed write's pending record is in the manifest)
        with set_write_lock(mpath, label):
            roll_back_interrupted(mpath)
    return scan_set(mpath)


def final_path(path: str, max_shard_bytes: int | None, shard: int) -> str:
    """Shard ``shard``'s file name: ``path`` itself, or ``<base>_NNNN.rox``."""
    return path if max_shard_bytes is None else f"{path[:-4]}_{shard:04d}.rox"


def _one_per_shard(
    path: str, written: Sequence[WrittenShard], plan: ShardPlan
) -> list[WrittenShard]:
    """One report per shard number ``0 .. num_shards - 1``: a hole or two different shards with
    one number is an error; equal duplicates (a retried bundle reported twice) are dropped."""
    chosen: dict[int, WrittenShard] = {}
    for w in sorted(written, key=lambda w: (w.shard, w.tmp_path)):
        first = chosen.setdefault(w.shard, w)
        if first is not w:
            if (first.sha256, first.file_size) != (w.sha256, w.file_size):
                raise RoxFormatError(
                    w.final_path,
                    f"two attempts wrote shard {w.shard} with different bytes ({first.tmp_path}"
                    f" and {w.tmp_path}): the conversion is not deterministic",
                    "check that the inputs did not change during the run, and run it again",
                )
            with contextlib.suppress(FileNotFoundError):
                os.unlink(w.tmp_path)
    expected = set(range(plan.num_shards))
    missing, extra = sorted(expected - set(chosen)), sorted(set(chosen) - expected)
    if missing or extra:
        raise RoxFormatError(
            path,
            f"the conversion planned {plan.num_shards} shard(s) but the workers reported "
            f"{len(chosen)} (missing {missing[:8]}, unexpected {extra[:8]}); nothing was "
            "published",
            "run the conversion again (the next write removes the temporaries left behind)",
        )
    return [chosen[s] for s in range(plan.num_shards)]


class _Published(NamedTuple):
    """What :func:`build_manifest` reads of a written shard file."""

    final_path: str
    num_blocks: int
    copied_from: None = None


def commit_shards(
    path: str,
    max_shard_bytes: int | None,
    written: Sequence[WrittenShard],
    plan: ShardPlan,
    layout: TokenLayout,
    *,
    run_id: str,
    if_exists: IfExists = "error",
) -> Manifest:
    """Publish the conversion ``run_id``'s shards and manifest; return the manifest.

    Raises :class:`~grain_rox.RoxFormatError` for a hole or conflicting duplicates (nothing is
    published) and ``FileExistsError`` when the set exists and ``if_exists="error"``.
    """
    shards = _one_per_shard(path, written, plan)
    mpath = manifest_path(path, max_shard_bytes)
    with set_write_lock(mpath, path):
        done = _already_published(mpath, run_id)
        if done is not None:
            return done
        # one member of a set (x_0050.rox, no max_shard_bytes) joins it, the others stay
        member = is_set_member(path, max_shard_bytes)
        resumed = _resumed(mpath, run_id)
        if resumed is None:
            roll_back_interrupted(mpath)
            disk = scan_set(mpath)
            shard_writer(path, max_shard_bytes, layout, if_exists, disk)  # refuses as write_rox
            previous = previous_set(
                mpath,
                disk,
                strict=member,
                replaced=os.path.basename(path) if member and if_exists == "overwrite" else None,
            )
            if member and previous.dtype:  # a grain_rox manifest: the same dtype, EOS, ...
                check_append_compatible(previous, mpath, layout)
            if member:  # ... and the same block size (roxxel misreads a mix)
                replaced = os.path.basename(path) if if_exists == "overwrite" else None
                check_block_size(os.path.dirname(mpath), disk, layout.block_size, replaced=replaced)
        else:
            previous, disk = resumed, scan_set(mpath)
        finished = [FinishedShard(w.file_size, w.raw_size, w.sha256, w.mtime_ns) for w in shards]
        files = [_Published(w.final_path, w.num_blocks) for w in shards]
        docs = {k: w.num_documents for k, w in enumerate(shards)}
        final = build_manifest(
            previous,
            previous.shards if member else {},
            cast(Sequence[ShardFile], files),
            finished,
            docs,
            plan.num_padding_tokens,
            layout,
        )
        final = dataclasses.replace(final, write_id=run_id)
        moves = _moves(shards, final)

        # a failed publish keeps the shards: the runner retries this step with the same
        # reports (a failed conversion's are removed by the next write)
        publish_set(mpath, disk, previous, final, moves, discard=None, keep_manifest=True)
        clean_leftovers(mpath)  # the temporaries of retried attempts, and of killed writers
    return final


def _already_published(mpath: str, run_id: str) -> Manifest | None:
    """The manifest, if this conversion already published it (a retried commit)."""
    with contextlib.suppress(RoxFormatError):
        m = load_manifest(mpath)
        if m is not None and m.pending is None and m.write_id == run_id:
            return m
    return None


def _resumed(mpath: str, run_id: str) -> Manifest | None:
    """The set this conversion's interrupted commit was replacing (its pending manifest is
    this run's), so a retried commit finishes the same transaction; else None."""
    with contextlib.suppress(RoxFormatError):
        m = load_manifest(mpath)
        if m is not None and m.pending is not None and m.pending.write_id == run_id:
            return dataclasses.replace(m, pending=None)
    return None


def _moves(shards: Sequence[WrittenShard], final: Manifest) -> list[tuple[str, str]]:
    """The renames still to do; a shard a first commit attempt already renamed is checked."""
    moves = []
    for w in shards:
        if os.path.exists(w.tmp_path):
            moves.append((w.tmp_path, w.final_path))
            continue
        rec = final.shards[os.path.basename(w.final_path)]
        try:
            st = os.stat(w.final_path)
        except FileNotFoundError:
            st = None
        if st is None or not stat_matches(st, rec):
            raise RoxFormatError(
                w.final_path,
                f"shard {w.shard} was written under {w.tmp_path}, which is gone, and the file "
                "in its place is not the one written",
                "run the conversion again (with --if-exists overwrite)",
            )
    return moves
