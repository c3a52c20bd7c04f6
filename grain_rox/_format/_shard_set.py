"""A shard set on disk against its manifest: how a write publishes one (:func:`publish_set`)
and which write a reader finds (:func:`current_manifest`), or why it refuses.

A write publishes several files (one rename each, never atomic together), so the manifest is
the commit record. While a write publishes, the manifest holds the previous set (``shards``)
and the complete new one (``pending``). A reader classifies every file named like a shard of
the set by its size and mtime_ns (a rename keeps both) and, only for a file that matches
neither record (e.g. a directory copied half-way), by its sha256:

* the files are exactly the new set -> the new data (the writer died after its renames);
* the files are exactly the previous set -> the previous data (it died before them);
* anything else is a mix of two writes and is refused, naming what to do.

Without ``pending``, the files named like shards must be exactly the manifest's: an extra or
missing shard is refused (cheap: one directory scan, no reads); each shard's size and footer
are checked against its record when it is opened.
Hidden temporary files of killed writers are listed by
:func:`grain_rox._format._leftovers.leftover_temps` and removed by the next write to the set
(:func:`clean_leftovers`), which also deletes the uncommitted shards
of a killed write that left the previous set intact (:func:`roll_back_interrupted`). An
overwrite of a set that was refused records why in its pending manifest, so a kill before its
renames refuses again instead of opening the refused files; an append checks the content of
every kept shard whose size or mtime changed before recording its new mtime.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import time
from collections.abc import Callable

from grain_rox._format._atomic import fsync_dir, set_writer_active
from grain_rox._format._hash_cache import cached_sha256
from grain_rox._format._leftovers import matching_temps
from grain_rox._format._manifest import (
    Manifest,
    ShardRecord,
    load_manifest,
    member_pattern,
    write_manifest,
)
from grain_rox._format._rox_format import RoxFormatError, read_header, require_regular

_log = logging.getLogger("grain_rox")


def shard_number(name: str) -> int:
    """Sort key of a set member: ``x.rox`` first, then ``x_NNNN.rox`` by number.

    >>> sorted(["a_10000.rox", "a_1001.rox", "a.rox"], key=shard_number)
    ['a.rox', 'a_1001.rox', 'a_10000.rox']
    """
    m = re.search(r"_(\d{4,})\.rox$", name)
    return int(m.group(1)) if m else -1


def scan_set(manifest_path: str) -> dict[str, os.stat_result]:
    """Return the files named like shards of the set, by name in shard order, with their stat."""
    directory = os.path.dirname(manifest_path) or "."
    members = member_pattern(manifest_path)
    found: dict[str, os.stat_result] = {}
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return found
    for entry in entries:
        if members.fullmatch(entry.name):
            st = os.stat(entry.path)
            require_regular(entry.path, st)
            found[entry.name] = st
    return {n: found[n] for n in sorted(found, key=shard_number)}


def clean_leftovers(manifest_path: str) -> list[str]:
    """Delete the temporaries that killed writers left for this set; return their paths.

    Call it only under the set's write lock (:func:`grain_rox._format._atomic.set_write_lock`): no
    other write of the set runs then, so every temporary of the set is a leftover.
    """
    removed = []
    for path, _pid in matching_temps(manifest_path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(path)
    return removed


def stat_matches(st: os.stat_result, rec: ShardRecord | None) -> bool:
    """Whether a file's size and mtime_ns are the ones recorded (no read)."""
    return rec is not None and st.st_size == rec.file_size and st.st_mtime_ns == rec.mtime_ns


@dataclasses.dataclass
class _Classified:
    new: dict[str, bool]
    old: dict[str, bool]


def _classify(directory: str, disk: dict[str, os.stat_result], m: Manifest) -> _Classified:
    assert m.pending is not None
    new_recs, old_recs = m.pending.shards, m.shards
    out = _Classified({}, {})
    for name, st in disk.items():
        new_rec, old_rec = new_recs.get(name), old_recs.get(name)
        is_new = stat_matches(st, new_rec)
        is_old = stat_matches(st, old_rec) or (
            old_rec is not None
            and old_rec.mtime_ns is None
            and old_rec.sha256 is None
            and st.st_size == old_rec.file_size
        )
        if not is_new and not is_old:  # e.g. copied mid-write: decide by content (rare)
            digest = None
            for rec in (new_rec, old_rec):
                if rec is not None and rec.sha256 and st.st_size == rec.file_size:
                    digest = digest or cached_sha256(os.path.join(directory, name), st)
            is_new = new_rec is not None and digest is not None and digest == new_rec.sha256
            is_old = old_rec is not None and digest is not None and digest == old_rec.sha256
        out.new[name], out.old[name] = is_new, is_old
    return out


def _surely_new(directory: str, disk: dict[str, os.stat_result], m: Manifest) -> bool:
    """Whether every file the interrupted write changed or added is its new version by
    content (sha256): size and mtime alone cannot tell a shard never replaced from its
    replacement on a filesystem with coarse timestamps, and completing the write on a wrong
    guess would record another write's facts for the old bytes."""
    assert m.pending is not None
    for name, st in disk.items():
        new_rec = m.pending.shards[name]
        if m.shards.get(name) == new_rec:
            continue  # kept as it was (an append's old shards)
        if new_rec.sha256 is None:
            return False
        if cached_sha256(os.path.join(directory, name), st) != new_rec.sha256:
            return False
    return True


def _listing(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _shared(m: Manifest) -> set[str]:
    """Shards an append keeps: recorded alike in the previous set and the pending one."""
    assert m.pending is not None
    new, old = m.pending.shards, m.shards

    def key(r: ShardRecord) -> tuple[object, ...]:
        return (r.file_size, r.sha256, r.mtime_ns)

    return {n for n in new if n in old and key(new[n]) == key(old[n])}


def _old_intact(disk: dict[str, os.stat_result], m: Manifest, c: _Classified) -> bool:
    return m.refused is None and all(n in disk and c.old[n] for n in m.shards)


def _mix_error(
    manifest_path: str, m: Manifest, disk: dict[str, os.stat_result], c: _Classified
) -> RoxFormatError:
    assert m.pending is not None
    new, old = m.pending.shards, m.shards
    shared = _shared(m)
    appending = bool(old) and set(old) == shared
    written = [n for n in new if n not in shared]
    published = [n for n in disk if n in written and c.new[n] and not c.old[n]]
    old_left = [n for n in disk if c.old[n]]
    what = "an append to" if appending else "a write to"
    before = "the set had before it" if appending else "the data it replaces"
    problem = (
        f"{what} this shard set (write {m.pending.write_id}) was interrupted while it "
        f"published its shards: on disk are {len(published)} of its {len(written)} new "
        f"shard(s) and {len(old_left)} of the {len(old)} shard(s) of {before}, so the files "
        "are neither the old nor the new data"
    )
    if m.refused is not None:
        fix = (
            "run the overwrite again (if_exists='overwrite'); the files it was to replace were "
            f"already refused ({m.refused})"
        )
    elif all(n in disk and c.new[n] for n in new):
        strays = [n for n in disk if n not in new]
        fix = (
            f"the new data is complete: delete the {len(strays)} leftover shard(s) of the old "
            f"data ({_listing(strays)}), or run the write again"
        )
    elif _old_intact(disk, m, c):
        extra = [n for n in disk if n not in old]
        fix = (
            f"the previous data is intact: the next write to this set removes the "
            f"{len(extra)} uncommitted shard(s) of the interrupted write ({_listing(extra)}) "
            "first, so running the write again works; or delete them to read the previous "
            "data now"
        )
    else:
        fix = (
            "run the write again with if_exists='overwrite' (it rewrites the whole set); the "
            "previous data was partly replaced and cannot be recovered from these files"
        )
    return RoxFormatError(manifest_path, problem, fix)


def roll_back_interrupted(manifest_path: str) -> list[str]:
    """Under the set's write lock: if a killed write left the previous set intact beside some
    of its own (never committed) shards, delete those and drop the ``pending`` record, so the
    next write starts from the previous set. Return the deleted paths.

    A write killed after every one of its shards was in place (an append, whose old shards
    stay) is completed instead: readers already serve that set (:func:`current_manifest`),
    so rolling it back would take away rows they were served."""
    try:
        m = load_manifest(manifest_path)
        if m is None or m.pending is None:
            return []
        directory = os.path.dirname(manifest_path) or "."
        disk = scan_set(manifest_path)
        c = _classify(directory, disk, m)
    except RoxFormatError:
        return []  # the write itself decides (an overwrite replaces it; an append refuses)
    if set(disk) == set(m.pending.shards) and all(c.new.values()):
        if _surely_new(directory, disk, m):
            write_manifest(manifest_path, m.pending)  # its publish, completed
        return []  # (a file as like the old record as the new: left to the write itself)
    extra = [n for n in disk if n not in m.shards]
    if not _old_intact(disk, m, c) or not all(c.new[n] for n in extra):
        return []
    removed = []
    for name in extra:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
            removed.append(os.path.join(directory, name))
    fsync_dir(directory)
    if m.dtype:
        write_manifest(manifest_path, dataclasses.replace(m, pending=None))
    else:  # the previous set had no manifest
        os.unlink(manifest_path)
        fsync_dir(directory)
    return removed


# A reader that finds the files between two writes' sets while a writer holds the set's
# lock looks again this often, this many times (a write publishes in a few renames).
_LIVE_WRITE_LOOKS = 40
_LIVE_WRITE_WAIT_S = 0.05


def current_manifest(manifest_path: str) -> Manifest | None:
    """Return the manifest that describes the set on disk, or None if there is none.

    Raises :class:`RoxFormatError` when the files are not exactly one write's set: a mix of
    an interrupted write and the data it replaces, extra or missing shards, a changed size.
    Files found so while a write holds the set's lock are a write still publishing, not an
    interrupted one: they are looked at again until it ends (about 2 s at most), then named
    as a write in progress, never with an interrupted write's fix (which would undo it).
    """
    for look in range(_LIVE_WRITE_LOOKS + 1):
        stamp = _stamp(manifest_path)
        try:
            return _current_manifest(manifest_path)
        except RoxFormatError as e:
            if not _publishing(manifest_path, stamp):
                raise
            if look == _LIVE_WRITE_LOOKS:
                raise RoxFormatError(
                    manifest_path,
                    "a write to this shard set is publishing its shards now (its writer holds "
                    f"the set's lock), so the files are between two sets ({e.problem})",
                    "open the set again when the write has ended; do not delete or rewrite "
                    "files meanwhile",
                ) from None
        time.sleep(_LIVE_WRITE_WAIT_S)
    raise AssertionError("unreachable: the last look returns or raises")


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _publishing(manifest_path: str, stamp: tuple[int, int] | None) -> bool:
    """Whether a write is publishing the set now: a writer holds its lock, and its manifest
    holds a pending write or changed during the look (``stamp``: before it). Other problems
    (a stray file while a writer is still encoding) are the set's own, said at once."""
    try:
        if not set_writer_active(manifest_path):
            return False
    except OSError:  # no advisory locks on this filesystem (ENOLCK): no writer to wait for
        return False
    if _stamp(manifest_path) != stamp:
        return True
    try:
        m = load_manifest(manifest_path)
    except RoxFormatError:
        return False
    return m is not None and m.pending is not None


def _current_manifest(manifest_path: str) -> Manifest | None:
    m = load_manifest(manifest_path)
    if m is None:
        return None
    directory = os.path.dirname(manifest_path) or "."
    disk = scan_set(manifest_path)
    if m.pending is not None:
        c = _classify(directory, disk, m)
        if set(disk) == set(m.pending.shards) and all(c.new.values()):
            return m.pending
        if set(disk) == set(m.shards) and all(c.old.values()):
            # The write never got to its renames: the previous set, which may have had no
            # manifest (its records then only describe the files, with an empty dtype).
            if m.refused is not None:
                raise RoxFormatError(
                    manifest_path,
                    f"an overwrite of this shard set (write {m.pending.write_id}) was "
                    "interrupted before it put its shards in place, and the files it was to "
                    f"replace were already refused ({m.refused})",
                    "run the overwrite again (if_exists='overwrite')",
                )
            return dataclasses.replace(m, pending=None) if m.dtype else None
        raise _mix_error(manifest_path, m, disk, c)
    extras = [n for n in disk if n not in m.shards]
    if extras:
        raise RoxFormatError(
            os.path.join(directory, extras[0]),
            f"{len(extras)} file(s) named like shards of this set are not in its manifest "
            f"{manifest_path} ({_listing(extras)}): no write of this set made them",
            "rename them if they belong to another set, or run the write again; to read the "
            "files without grain_rox's checks, delete the manifest",
        )
    missing = [n for n in m.shards if n not in disk]
    if missing:
        raise RoxFormatError(
            manifest_path,
            f"{len(missing)} shard(s) that the manifest records are missing ({_listing(missing)})",
            "restore them from a copy of the set, or run the write again",
        )
    # Sizes are checked per shard against its footer when it is opened or verified, so one
    # damaged shard does not hide the state of the others from verify.
    return m


def publish_set(
    mpath: str,
    disk: dict[str, os.stat_result],
    previous: Manifest,
    final: Manifest,
    moves: list[tuple[str, str]],
    *,
    discard: Callable[[], None] | None,
    keep_manifest: bool,
) -> None:
    """Put the new set in place as one transaction (see :mod:`grain_rox._format._shard_set`);
    ``discard`` removes the new shards if step 1 fails (None: they are kept, for a retry).

    1. the manifest names the set on disk now and, as ``pending``, the complete new set (its
       shards are already fsynced under temporary names); 2. the shards are renamed into place;
    3. shards of the old set that the new one does not have are deleted; 4. the manifest
    becomes the new set's (or is removed with ``manifest=False``). A reader that finds the
    files between 1 and 4 sees exactly the old set, exactly the new one, or a refused mix.
    """
    directory = os.path.dirname(mpath)
    try:
        write_manifest(mpath, dataclasses.replace(previous, pending=final))
    except BaseException:
        if discard is not None:
            discard()
        raise
    moved = 0
    try:
        for tmp, final_path in moves:
            os.replace(tmp, final_path)
            moved += 1
            _log.debug("committed shard %s", final_path)
        fsync_dir(directory)
        stale = [n for n in disk if n not in final.shards]
        for name in stale:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))
        if stale:
            fsync_dir(directory)
        if keep_manifest:
            write_manifest(mpath, final)
        else:
            os.unlink(mpath)  # the set is written without grain_rox's extras
            fsync_dir(directory)
    except OSError as e:  # after step 1: the set is not as it was; say what it is
        raise OSError(e.errno, _after_step_one(mpath, moved == len(moves), e)) from e
    _log.info(
        "published %d shard(s) of %s; manifest %s",
        len(moves),
        mpath[: -len(".manifest.json")],
        mpath if keep_manifest else "none (manifest=False)",
    )


def _after_step_one(mpath: str, all_moved: bool, error: OSError) -> str:
    """What a write that failed after its pending manifest was written left (see
    :func:`publish_set`), and what to do: not "run it again" where it is in place."""
    what = f"{error.strerror or error} while publishing {mpath[: -len('.manifest.json')]}"
    if all_moved:
        return (
            f"{what}, after every shard of this write was in place: readers see the new set, "
            "and the next write to it finishes this one (its manifest). Do not run this write "
            "again: an append would add its documents twice"
        )
    return (
        f"{what}, while this write's shards were put in place: readers refuse the set until "
        "the next write to it completes or undoes this one (it checks every shard's sha256). "
        "Look at the set after that write (grain-rox inspect) before running this one again"
    )


def _check_kept(path: str, st: os.stat_result, rec: ShardRecord, mpath: str) -> None:
    """A shard the write keeps whose size or mtime changed: its content must still be the
    recorded one before its new mtime is recorded beside the old sha256."""
    digest = cached_sha256(path, st)
    if digest != rec.sha256:
        raise RoxFormatError(
            path,
            f"its content changed after it was written: its sha256 is {digest} but {mpath} "
            f"records {rec.sha256}, so appending to the set would record the changed bytes as "
            "the set's",
            "restore the shard from a copy, or re-create the set with if_exists='overwrite'",
        )


def previous_set(
    mpath: str, disk: dict[str, os.stat_result], *, strict: bool, replaced: str | None = None
) -> Manifest:
    """The set on disk now, as a manifest with every file's size and mtime_ns.

    ``strict`` (append, or a member shard written alone) requires a consistent set, and the
    shards it keeps (all but ``replaced``) to hold their recorded content; otherwise
    (overwrite) a set left mixed by an interrupted write is described file by file, since all
    of it is replaced.
    """
    directory = os.path.dirname(mpath)
    refused = None
    try:
        current = _current_manifest(mpath)  # (the caller's own lock: no live write to wait for)
    except RoxFormatError as e:
        if strict:
            raise
        current, refused = None, f"{os.path.basename(e.path)}: {e.problem}"
    records: dict[str, ShardRecord] = {}
    for name, st in disk.items():
        rec = current.shards.get(name) if current is not None else None
        if rec is None:
            try:
                h = read_header(os.path.join(directory, name))
                rec = ShardRecord(h.file_size, h.num_blocks, h.raw_size, None, h.num_tokens)
            except RoxFormatError:
                if strict:
                    raise
                rec = ShardRecord(st.st_size, 0, 0, None, 0)
        elif strict and name != replaced and not stat_matches(st, rec) and rec.sha256:
            _check_kept(os.path.join(directory, name), st, rec, mpath)
        records[name] = dataclasses.replace(rec, mtime_ns=st.st_mtime_ns)
    if current is None:  # no manifest: the records only describe the files (empty dtype)
        return Manifest(dtype="", block_size=0, shards=records, refused=refused)
    return dataclasses.replace(current, shards=records, pending=None)
