"""Conformance checks for Grain sources and iterators: each a function that raises
``AssertionError`` saying what is wrong.

grain_rox runs every source and iterator it offers through these (``tests/test_conformance.py``);
a project that wraps our sources, or writes its own, can run them too::

    from grain_rox import testing
    testing.check_random_access_source(source)          # len, indices, errors, batched reads
    testing.check_pickle(source)                        # small, no open handles
    testing.check_read_only_records(source)             # no aliasing between records
    testing.check_stable_repr(make_source, data_dir=d)  # across processes and data copies
    testing.check_checkpoint_every_step(ds)             # Grain's own restore-at-every-step
    testing.check_orbax_roundtrip(make_ds)              # Orbax save here, restore elsewhere
    testing.check_mp_prefetch_equal(ds)                 # 2 Grain workers == in-process
    testing.check_dataloader_restore_in_fresh_process(make_source)  # 2 workers, restored
    testing.check_processes_equal(make_iterator)        # 2 jax.distributed processes == 1

The checks that need another interpreter (repr, Orbax, DataLoader) run their half there
through :class:`FreshProcess`; pass one ``fresh=`` to several checks to start it once.
Factories (``make_source``, ``make_iterable``) travel there with cloudpickle: module-level
functions, ``functools.partial`` of them, or lambdas. The other process gets this
process's ``sys.path`` and environment.

>>> import grain, numpy as np
>>> check_random_access_source(grain.sources.RangeDataSource(0, 3, 1), expected=[0, 1, 2],
...                            negative_indices=False)
>>> class Shared:  # two records that alias one buffer
...     buffer = np.zeros(4)
...     def __len__(self): return 2
...     def __getitem__(self, i): return {"x": Shared.buffer}
>>> check_read_only_records(Shared())
Traceback (most recent call last):
...
AssertionError: record 0 of Shared: editing ['x'] in place changed a new read of record 0 ['x'] (records must be read-only arrays or independent copies)
"""

from __future__ import annotations

from grain_rox._testing._checks_distributed import check_processes_equal
from grain_rox._testing._checks_processes import (
    check_dataloader_restore_in_fresh_process,
    check_mp_prefetch_equal,
    check_orbax_roundtrip,
    check_stable_repr,
    data_loader,
)
from grain_rox._testing._checks_records import (
    check_pickle,
    check_random_access_source,
    check_read_only_records,
)
from grain_rox._testing._fresh_process import FreshProcess
from grain_rox._testing._iterating import check_checkpoint_every_step, iterators
from grain_rox._testing._trees import as_numpy, assert_tree_equal

__all__ = [
    "FreshProcess",
    "as_numpy",
    "assert_tree_equal",
    "check_checkpoint_every_step",
    "check_dataloader_restore_in_fresh_process",
    "check_mp_prefetch_equal",
    "check_orbax_roundtrip",
    "check_pickle",
    "check_processes_equal",
    "check_random_access_source",
    "check_read_only_records",
    "check_stable_repr",
    "data_loader",
    "iterators",
]
