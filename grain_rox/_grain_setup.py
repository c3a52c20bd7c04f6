"""Grain 0.2.18's traps, set right once.

* With JAX installed, Grain worker processes read absl flags; unless the flags were parsed
  (an ``app.run`` main), ``worker_count > 0`` / ``mp_prefetch`` raises
  ``UnparsedFlagAccessError``. We mark them parsed (keeping defaults) when they are not.
* ``ReadOptions(num_threads=16)`` (the default) is 5-14x slower than ``num_threads=0`` for
  cheap memory-mapped reads on small machines; our records are whole batches assembled by
  vectorised reads, so one thread is right.
"""

from __future__ import annotations

import grain


def ensure_absl_flags_parsed() -> None:
    """Mark absl flags as parsed (defaults kept) if nobody parsed them yet."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def batch_read_options() -> grain.ReadOptions:
    """Read options for sources whose records are whole batches."""
    return grain.ReadOptions(num_threads=0, prefetch_buffer_size=2)
