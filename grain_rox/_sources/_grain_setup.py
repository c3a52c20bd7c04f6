"""Grain 0.2.18's traps, set right once.

* With JAX installed, starting Grain worker processes (``mp_prefetch``,
  ``DataLoader(worker_count > 0)``) reads Grain's absl flag
  ``--grain_enable_multiprocess_worker_profiling`` in the parent process; unless the flags
  were parsed (an ``app.run`` main), that raises ``UnparsedFlagAccessError`` (fixed upstream
  after 0.2.18, google/grain#1362). :func:`make_grain_workers_usable` makes *that flag*
  readable (its default kept) the way Grain's own workers do for their debug flags: it marks
  it present. It does not mark the flags parsed, so a user's own flags behave as absl says:
  reading one before parsing is still an error, ``app.run``/``FLAGS(argv)`` still parse the
  command line (Grain's flag included), and code that parses only ``if not
  FLAGS.is_parsed()`` still does. Every grain_rox source and dataset calls it when built.
* ``ReadOptions(num_threads=16)`` (the default) is 5-14x slower than ``num_threads=0`` for
  cheap memory-mapped reads on small machines; our records are whole batches assembled by
  vectorised reads, so one thread is right.

>>> from absl import flags
>>> make_grain_workers_usable()
>>> flags.FLAGS.grain_enable_multiprocess_worker_profiling
False
"""

from __future__ import annotations

import grain

# Grain flags that Grain 0.2.18 reads directly (not through its unparsed-safe config lookup)
# on the way to starting worker processes.
_FLAGS_READ_BEFORE_WORKERS = ("grain_enable_multiprocess_worker_profiling",)


def make_grain_workers_usable() -> None:
    """Let Grain 0.2.18 start worker processes before (or without) absl flag parsing, touching
    only Grain's own flag (see the module doc); cheap, idempotent, thread-safe enough (an int
    store)."""
    from absl import flags

    if flags.FLAGS.is_parsed():
        return
    for name in _FLAGS_READ_BEFORE_WORKERS:
        if name in flags.FLAGS and not flags.FLAGS[name].present:
            flags.FLAGS[name].present = 1  # readable; a later FLAGS(argv) still sets it


# The name earlier code (and tests) call; it never marks the user's flags parsed any more.
ensure_absl_flags_parsed = make_grain_workers_usable


def batch_read_options(*, remote: bool = False) -> grain.ReadOptions:
    """Read options for sources whose records are whole batches: read in the calling thread
    (a memory-mapped batch is one cheap gather, and threads only add hand-offs), or, when
    the data is in a bucket (``remote``), 8 batches in flight on threads, since a batch then
    waits on the network's round trip, not on the CPU."""
    if remote:
        return grain.ReadOptions(num_threads=8, prefetch_buffer_size=16)
    return grain.ReadOptions(num_threads=0, prefetch_buffer_size=2)
