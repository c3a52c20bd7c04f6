"""The JSON state of :class:`~grain_rox.MultiHostDataLoadIterator`, read back strictly.

A state is ``{"version": 3, "step": <batches handed out>, ...}`` plus either ``"pipeline"``
(the :class:`~grain_rox.TokenPipeline`'s identity: the state is global, valid on any number
of processes) or ``"grain"`` (the Grain iterator's own state after the last batch: a dict, or
``{"bytes": ...}`` for a ``grain.DataLoader``). Hand-edited or foreign states are refused here,
with what is wrong and what to pass instead, before any data is read.

>>> decode_state(b'{"version": 3, "step": 3, "grain": null}')["step"]
3
>>> decode_state({"version": 3, "step": "5", "grain": None})
Traceback (most recent call last):
...
ValueError: this data state's step is '5' (str), not a non-negative int (the number of batches handed out); pass the state get_state() returned, unchanged
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

STATE_VERSION = 3
# Version 2 (grain_rox 0.1) differs only in a TokenPipeline's order: it had one, the lanes
# order, and did not name it. Such a state restores onto TokenPipeline(order="lanes").
READABLE_VERSIONS = (2, 3)
_KINDS = ("pipeline", "grain")


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def decode_state(state: bytes | str | dict[str, Any]) -> dict[str, Any]:
    """The state as a dict, type-checked: ``version`` an int this release reads,
    ``step`` a non-negative int, exactly one of ``pipeline`` / ``grain``, no other keys."""
    raw = state
    if isinstance(state, bytes):
        try:
            state = state.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"not a MultiHostDataLoadIterator state: {state[:200]!r}") from None
    if isinstance(state, str):
        try:
            state = json.loads(state)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"not a MultiHostDataLoadIterator state (not JSON: {e}): {str(raw)[:200]}"
            ) from None
    if not isinstance(state, dict):
        raise ValueError(f"not a MultiHostDataLoadIterator state: {str(state)[:200]}")
    missing = [k for k in ("version", "step") if k not in state]
    kinds = [k for k in _KINDS if k in state]
    if missing or len(kinds) != 1:
        need = missing + ([] if len(kinds) == 1 else ["exactly one of 'pipeline' / 'grain'"])
        if set(state) == {"identity", "state"}:  # a grain_rox Grain dataset iterator's
            raise ValueError(
                "not a MultiHostDataLoadIterator state: it is a Grain dataset iterator's (keys "
                "'identity' and 'state', e.g. of TokenPipeline.iter_dataset() or .batches()); "
                "restore it with set_state on an iterator of that same dataset"
            )
        raise ValueError(
            f"not a MultiHostDataLoadIterator state: it lacks {', '.join(map(repr, need))} "
            f"(keys: {sorted(state)}); pass the state get_state() returned, unchanged"
        )
    extra = sorted(set(state) - {"version", "step", *kinds})
    if extra:
        raise ValueError(
            f"this data state has unknown keys {extra}; pass the state get_state() returned, "
            "unchanged"
        )
    version, step = state["version"], state["step"]
    if not _is_int(version):
        raise ValueError(
            f"this data state's version is {version!r} ({type(version).__name__}), not an int; "
            "pass the state get_state() returned, unchanged"
        )
    if version not in READABLE_VERSIONS:
        raise ValueError(
            f"this data state has format version {version}, but this grain_rox reads "
            f"versions {' and '.join(map(str, READABLE_VERSIONS))}: it was saved by another grain_rox release, whose batch "
            "order may differ; restore with that release or start a new run"
        )
    if not _is_int(step) or step < 0:
        raise ValueError(
            f"this data state's step is {step!r} ({type(step).__name__}), not a non-negative "
            "int (the number of batches handed out); pass the state get_state() returned, "
            "unchanged"
        )
    return {**state, "step": int(step), "version": int(version)}


def check_step(step: int, length: int | None, *, limit: int, what: str) -> None:
    """Refuse a step past the end of ``what`` (``length`` batches; ``None``: endless or of
    unknown length, which cannot start at ``limit`` or later): restoring there would end the
    iteration at once, or fail at the next batch.

    >>> check_step(80, 79, limit=1 << 62, what="this TokenPipeline")
    Traceback (most recent call last):
    ...
    ValueError: this data state's step 80 is past the end of this TokenPipeline, which has 79 batches; pass a state saved from this pipeline, unchanged
    """
    if length is not None and step > length:
        raise ValueError(
            f"this data state's step {step} is past the end of {what}, which has {length} "
            "batches; pass a state saved from this pipeline, unchanged"
        )
    if length is None and step >= limit:
        raise ValueError(
            f"this data state's step {step} is beyond {limit - 1}, the last step {what} "
            "(endless or of unknown length) can start at; pass a state saved from it, unchanged"
        )
