"""Conformance checks that need other processes (see :mod:`grain_rox.testing`): stable reprs
across interpreters and data copies, Orbax restores in a fresh interpreter, Grain worker
processes (``mp_prefetch``), and a ``grain.DataLoader`` with workers restored elsewhere."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from grain_rox._testing._fresh_process import FreshProcess, fresh_processes
from grain_rox._testing._iterating import ENDLESS, close, iter_dataset, take
from grain_rox._testing._trees import as_numpy, assert_tree_equal, type_name


def _build(make: Callable[..., Any], directory: str | None) -> Any:
    return make() if directory is None else make(directory)


def _reprs(make_source: Callable[..., Any], directories: Sequence[str | None]) -> list[str]:
    return [repr(_build(make_source, d)) for d in directories]


def check_stable_repr(
    make_source: Callable[..., Any],
    *,
    data_dir: str | None = None,
    processes: int = 2,
    fresh: FreshProcess | Sequence[FreshProcess] | None = None,
) -> None:
    """``repr(make_source(...))`` (Grain's ``DataLoader`` compares it on restore) names no
    memory address, and is the same here, in ``processes`` fresh interpreters (concurrently),
    and, with ``data_dir``, for a byte-identical copy of that directory elsewhere (new
    modification times): ``make_source(data_dir)`` and ``make_source(copy)``; and copies with
    one byte changed (in one of its largest files each) do not all give that repr.

    Args:
      make_source: builds the source; called with ``data_dir`` when one is given, else with
        no argument (in the fresh interpreters too).
      data_dir: a directory holding the source's data, copied elsewhere for the check.
      processes: how many fresh interpreters build it concurrently.
      fresh: interpreters to use instead of starting ``processes`` new ones.

    >>> import functools
    >>> check_stable_repr(functools.partial(range, 3), processes=1)
    >>> check_stable_repr(object)
    Traceback (most recent call last):
    ...
    AssertionError: repr(object) names a memory address: '<object object at 0x...>'; define a __repr__ from the data's content and the config
    """
    here = repr(_build(make_source, data_dir))
    if " at 0x" in here or "object at" in here:
        shown = here.split(" at 0x")[0] + " at 0x...>" if " at 0x" in here else here
        raise AssertionError(
            f"repr({type_name(_build(make_source, data_dir))}) names a memory address: {shown!r}; "
            "define a __repr__ from the data's content and the config"
        )
    with contextlib.ExitStack() as stack:
        directories: list[str | None] = [data_dir]
        if data_dir is not None:
            copy = os.path.join(stack.enter_context(tempfile.TemporaryDirectory()), "copy")
            shutil.copytree(data_dir, copy, copy_function=shutil.copyfile)
            directories.append(copy)
            there = repr(make_source(copy))
            if there != here:
                raise AssertionError(
                    f"repr differs for a byte-identical copy of {data_dir}:\n  {here}\n  {there}"
                )
            _check_repr_names_the_data(make_source, data_dir, here, stack)
        procs = stack.enter_context(fresh_processes(fresh, processes))
        with concurrent.futures.ThreadPoolExecutor(len(procs)) as pool:
            results = list(pool.map(lambda p: p.call(_reprs, make_source, directories), procs))
        for p, reprs in enumerate(results):
            for d, r in zip(directories, reprs, strict=True):
                if r != here:
                    raise AssertionError(
                        f"repr differs in fresh process {p} (data {d}):\n  here:  {here}\n  "
                        f"there: {r}"
                    )


def _check_repr_names_the_data(
    make_source: Callable[..., Any], data_dir: str, here: str, stack: contextlib.ExitStack
) -> None:
    """Copies of ``data_dir``, each with one byte changed (the middle one of one of its
    largest files, up to 4), must not all give the same repr: a Grain ``DataLoader`` restores
    a checkpoint onto any source of the same repr. (A file the source does not read may keep
    it; a copy the source refuses counts as noticed.)"""
    names = [
        os.path.relpath(os.path.join(d, f), data_dir)
        for d, _, files in os.walk(data_dir)
        for f in files
    ]
    sized = sorted((n for n in names if os.path.getsize(os.path.join(data_dir, n))),
                   key=lambda n: -os.path.getsize(os.path.join(data_dir, n)))[:4]  # fmt: skip
    for name in sized:
        edited = os.path.join(stack.enter_context(tempfile.TemporaryDirectory()), "edited")
        shutil.copytree(data_dir, edited, copy_function=shutil.copyfile)
        path = os.path.join(edited, name)
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        try:
            if repr(make_source(edited)) != here:
                return
        except Exception:  # refused: no checkpoint can restore onto it silently
            return
    if sized:
        raise AssertionError(
            f"repr is the same for copies of {data_dir} with one byte changed in any of "
            f"{sized}: {here!r}; a Grain DataLoader would restore a checkpoint onto other "
            "data. Name the data's content in the repr (a digest, as grain_rox's sources do)"
        )


def _orbax_args(handler: str) -> tuple[Any, Any]:
    if handler == "grain":
        import grain

        return grain.checkpoint.CheckpointSave, grain.checkpoint.CheckpointRestore
    if handler == "grain_rox":
        from grain_rox._devices._checkpoint import RoxCheckpointRestore, RoxCheckpointSave

        return RoxCheckpointSave, RoxCheckpointRestore
    raise ValueError(f"handler={handler!r}; use 'grain' or 'grain_rox'")


def _restore_and_read(
    make_iterable: Callable[[], Any], directory: str, step: int, read: int, handler: str
) -> list[Any]:
    import orbax.checkpoint as ocp

    _, restore = _orbax_args(handler)
    it = iter(make_iterable())
    manager = ocp.CheckpointManager(directory)
    try:
        manager.restore(step, args=ocp.args.Composite(data=restore(it)))
    finally:
        manager.close()
    return take(it, read)


def check_orbax_roundtrip(
    make_iterable: Callable[[], Any],
    *,
    steps: int = 2,
    read: int = 3,
    handler: str = "grain",
    fresh: FreshProcess | None = None,
) -> None:
    """Orbax saves an iterator of ``make_iterable()`` after ``steps`` elements here; a fresh
    interpreter builds ``make_iterable()`` again, restores it from the checkpoint and reads
    ``read`` elements: they equal what this iterator read next.

    Args:
      make_iterable: builds the dataset (or loader) whose iterator is checkpointed; called
        here and in the fresh interpreter.
      steps: elements read before the save.
      read: elements compared after the restore.
      handler: ``"grain"`` (``grain.checkpoint.CheckpointSave/Restore``, default) or
        ``"grain_rox"`` (:class:`~grain_rox.RoxCheckpointSave`; iterators with JSON
        ``get_state``).
      fresh: the interpreter that restores (default: a new one).

    >>> import grain
    >>> check_orbax_roundtrip(lambda: grain.MapDataset.range(9).to_iter_dataset())  # doctest: +SKIP
    """
    import orbax.checkpoint as ocp

    save, _ = _orbax_args(handler)
    with tempfile.TemporaryDirectory() as directory:
        it = iter(make_iterable())
        try:
            head = [next(it) for _ in range(steps)]
            if len(head) != steps:
                raise AssertionError(f"{make_iterable} gave fewer than {steps} elements")
            manager = ocp.CheckpointManager(directory)
            manager.save(steps, args=ocp.args.Composite(data=save(it)))
            manager.wait_until_finished()
            manager.close()
            expected = [as_numpy(next(it)) for _ in range(read)]
        finally:
            close(it)
        with fresh_processes(fresh, 1) as (proc,):
            got = proc.call(_restore_and_read, make_iterable, directory, steps, read, handler)
    for i, (a, e) in enumerate(zip(got, expected, strict=True)):
        assert_tree_equal(a, e, what=f"element {steps + i} after the Orbax restore")


def check_mp_prefetch_equal(ds: Any, *, workers: int = 2, max_elements: int | None = None) -> None:
    """``ds.mp_prefetch(...)`` with ``workers`` Grain worker processes yields what ``ds``
    yields in this process.

    Args:
      ds: a ``grain.MapDataset`` (read as an ``IterDataset``) or ``IterDataset``.
      workers: how many Grain worker processes.
      max_elements: how many elements to compare (default: all; required for an endless
        ``ds``).

    >>> import grain
    >>> check_mp_prefetch_equal(grain.MapDataset.range(6).to_iter_dataset())  # doctest: +SKIP
    """
    import grain

    from grain_rox._sources._grain_setup import make_grain_workers_usable

    make_grain_workers_usable()  # Grain 0.2.18's absl trap, for datasets built without us
    ds = iter_dataset(ds)
    expected = take(iter(ds), max_elements)
    options = grain.MultiprocessingOptions(num_workers=workers)
    got = take(iter(ds.mp_prefetch(options)), max_elements)
    if len(got) != len(expected):
        raise AssertionError(
            f"with {workers} Grain workers: {len(got)} elements, in-process {len(expected)}"
        )
    for i, (a, e) in enumerate(zip(got, expected, strict=True)):
        assert_tree_equal(a, e, what=f"element {i} with {workers} Grain workers")


def data_loader(
    make_source: Callable[[], Any],
    *,
    worker_count: int = 2,
    batch_size: int | None = 2,
    seed: int = 0,
) -> Any:
    """The ``grain.DataLoader`` :func:`check_dataloader_restore_in_fresh_process` uses:
    ``make_source()`` in a seeded shuffled order (in order if endless), one epoch.

    Args:
      make_source: builds the ``RandomAccessDataSource``.
      worker_count: Grain worker processes (0: read in this process).
      batch_size: records per batch (``None``: records as they are).
      seed: the shuffle's seed.

    >>> next(iter(data_loader(lambda: list(range(8)), worker_count=0))).tolist()
    [0, 4]
    """
    import grain

    from grain_rox._sources._grain_setup import make_grain_workers_usable

    make_grain_workers_usable()  # Grain 0.2.18's absl trap, for sources built without us
    source = make_source()
    finite = len(source) < ENDLESS
    sampler = grain.samplers.IndexSampler(
        num_records=len(source),
        shard_options=grain.sharding.NoSharding(),
        shuffle=finite,
        seed=seed,
        num_epochs=1,
    )
    ops = [grain.transforms.Batch(batch_size)] if batch_size else []
    return grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=ops,
        worker_count=worker_count,
        read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=4),
    )


def check_dataloader_restore_in_fresh_process(
    make_source: Callable[[], Any],
    *,
    worker_count: int = 2,
    batch_size: int | None = 2,
    steps: int = 2,
    read: int = 2,
    fresh: FreshProcess | None = None,
) -> None:
    """``grain.DataLoader(worker_count=2)`` over ``make_source()`` (see :func:`data_loader`),
    checkpointed with Grain's Orbax handler after ``steps`` batches, restores in a fresh
    interpreter (where Grain checks ``repr(source)``) to the same next ``read`` batches.

    Args:
      make_source: builds the ``RandomAccessDataSource`` (here and in the fresh interpreter).
      worker_count: the loader's Grain worker processes.
      batch_size: records per batch (``None``: records as they are).
      steps: batches read before the save.
      read: batches compared after the restore.
      fresh: the interpreter that restores (default: a new one).

    >>> check_dataloader_restore_in_fresh_process(lambda: list(range(8)))  # doctest: +SKIP
    """
    make = functools.partial(
        data_loader, make_source, worker_count=worker_count, batch_size=batch_size
    )
    check_orbax_roundtrip(make, steps=steps, read=read, handler="grain", fresh=fresh)
