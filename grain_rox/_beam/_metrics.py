"""The Beam metrics a conversion reports (namespace ``grain_rox``) and how to read them back.

Counters: ``documents`` and ``tokens`` (EOS tokens included, padding not) as tokenized,
``skipped_inputs`` (input files skipped: empty, binary, special), ``null_texts`` (records
skipped with ``on_null="skip"``), ``shards`` (shard files written, retries included only where
the runner reports attempted counts).
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter

NAMESPACE = "grain_rox"
COUNTERS = ("documents", "tokens", "skipped_inputs", "null_texts", "shards")


def counter(name: str) -> Any:
    """The ``grain_rox`` counter ``name`` (one of :data:`COUNTERS`)."""
    assert name in COUNTERS, name
    return beam.metrics.Metrics.counter(NAMESPACE, name)


def read_counters(result: Any) -> dict[str, int]:
    """Every ``grain_rox`` counter of a finished pipeline (committed values where the runner
    has them, else attempted), 0 for those never incremented."""
    found = dict.fromkeys(COUNTERS, 0)
    query = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))
    for c in query["counters"]:
        value = c.committed if c.committed is not None else c.attempted
        found[c.key.metric.name] = found.get(c.key.metric.name, 0) + int(value or 0)
    return found
