"""The ``grain.DataLoader`` of :meth:`TokenPipeline.data_loader`, whose restore refusals say
what changed and how to go on.

Grain checks a ``DataLoader`` state against the loader by comparing ``repr(data_source)``, the
sampler's repr and the worker count, and says only "does not match" with both strings (and
"you may need to implement a custom ``__repr__``"). A batch source's repr is part of every
saved state, so it cannot grow new fields without refusing the states already saved; this
loader keeps Grain's checks and their order of strictness, and words each refusal: which
fields of the repr changed, what its config digest covers (with the pipeline's config now, to
compare with the run that saved it), and the state another iterator saved, named as such.

>>> parse_source_repr("GlobalBatchSource(data=a:1f,b:2e, phases=1, seed=0, first_step=0, config=9c)")
{'data': 'a:1f,b:2e', 'phases': '1', 'seed': '0', 'first_step': '0', 'config': '9c'}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import grain

from grain_rox._sources._identity import DATA_HINT

_NAME = "TokenPipeline.data_loader()"
# The keys of every state a grain.DataLoader hands out (grain 0.2.x)
_LOADER_KEYS = frozenset({"last_seen_indices", "worker_count", "sampler", "data_source"})
# What a batch source's config digest covers (the repr shows data, phases, seed and
# first_step besides)
_DIGEST_COVERS = (
    "the phases (steps, batch sizes, seq_len, weights), seed, num_epochs, EOS ids, the "
    "order and its settings, dtype and first_step"
)


def parse_source_repr(text: Any) -> dict[str, str] | None:
    """The fields of a ``GlobalBatchSource(...)`` repr (None: not one)."""
    head = "GlobalBatchSource("
    if not isinstance(text, str) or not text.startswith(head) or not text.endswith(")"):
        return None
    fields = {}
    for part in text[len(head) : -1].split(", "):
        key, eq, value = part.partition("=")
        if not eq:
            return None
        fields[key] = value
    return fields


def _source_changes(saved: Any, now: str) -> list[str]:
    """Each field of the batch source's repr that differs, as ``"key: saved a -> now b"``
    (the whole reprs when either is not a batch source's)."""
    old, new = parse_source_repr(saved), parse_source_repr(now)
    if old is None or new is None or set(old) != set(new):
        return [f"data source: saved {saved!r} -> now {now!r}"]
    return [f"{k}: saved {old[k]} -> now {new[k]}" for k in new if old[k] != new[k]]


class PipelineDataLoader(grain.DataLoader):
    """A ``grain.DataLoader`` over a :class:`GlobalBatchSource`: Grain's own loader and
    iterator (its states, workers and Orbax handler unchanged), with worded restore refusals."""

    def __iter__(self) -> grain.DataLoaderIterator:
        return _PipelineLoaderIterator(self, state=None)

    def _validate_state(self, state: Any) -> None:
        if not isinstance(state, Mapping) or not set(state) >= _LOADER_KEYS:
            raise ValueError(_not_a_loader_state(state))
        source = self._data_source
        now = repr(source)
        if state["data_source"] != now:
            changes = _source_changes(state["data_source"], now)
            hint = f" ({DATA_HINT})" if any(c.startswith("data: ") for c in changes) else ""
            config = {k: v for k, v in source.pipeline.describe().items() if k != "data"}
            raise ValueError(
                f"cannot restore this {_NAME} state: its data or config changed "
                f"({'; '.join(changes)}). The config digest covers {_DIGEST_COVERS}; this "
                f"pipeline's config is {config}. Restore with the same data and config, or "
                f"start a new run{hint}"
            )
        saved_workers, workers = state["worker_count"], self._multiprocessing_options.num_workers
        if saved_workers != workers:
            step = _next_step(state, source.first_step)
            go_on = (
                f", or continue from step {step} with data_loader(first_step={step}, "
                f"worker_count={workers})"
                if step is not None
                else ""
            )
            raise ValueError(
                f"cannot restore this {_NAME} state: it was saved with worker_count="
                f"{saved_workers}, and this loader has worker_count={workers}; Grain's state of "
                f"worker processes restores only with as many workers (the batches do not "
                f"depend on them): pass data_loader(worker_count={saved_workers}){go_on}"
            )
        super()._validate_state(state)  # the sampler (its record count follows the config)


class _PipelineLoaderIterator(grain.DataLoaderIterator):
    """Grain's iterator; a state that is not a ``DataLoader``'s (bytes of JSON) is named."""

    def set_state(self, state: bytes) -> None:
        if not isinstance(state, bytes):
            raise ValueError(_not_a_loader_state(state))
        try:
            decoded = json.loads(state.decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(
                f"cannot restore this {_NAME} state: it is not JSON ({e}); pass the bytes "
                "get_state() returned, unchanged"
            ) from None
        if not isinstance(decoded, Mapping) or not set(decoded) >= _LOADER_KEYS:
            raise ValueError(_not_a_loader_state(decoded))
        super().set_state(state)


def _not_a_loader_state(state: Any) -> str:
    """Why ``state`` cannot restore a ``DataLoader``, naming the iterator that saved it."""
    if isinstance(state, Mapping) and {"identity", "state"} <= set(state):
        saved_by = (
            "pipe.iter_dataset() or pipe.map_dataset() (a Grain dataset's iterator): restore "
            "it with set_state on that same kind of iterator"
        )
        inner, identity = state["state"], state["identity"]
        index = inner.get("next_index") if isinstance(inner, Mapping) else None
        first = identity.get("first_step") if isinstance(identity, Mapping) else None
        if isinstance(index, int) and isinstance(first, int):
            step = first + index
            saved_by += f", or continue from step {step} with data_loader(first_step={step})"
    elif isinstance(state, Mapping) and {"version", "step"} <= set(state):
        saved_by = (
            f"a MultiHostDataLoadIterator (step {state['step']}): restore it with set_state on "
            "a MultiHostDataLoadIterator over the same pipeline"
        )
    else:
        return (
            f"cannot restore this {_NAME} state: it is not a grain.DataLoader's state "
            f"({repr(state)[:200]}); pass the bytes get_state() returned, unchanged"
        )
    return f"cannot restore this {_NAME} state: it was saved by {saved_by}"


def _next_step(state: Mapping[str, Any], first_step: int) -> int | None:
    """The global step a state saved without workers continues at (None: saved with
    workers, whose position Grain spreads over them)."""
    seen = state.get("last_seen_indices")
    if state.get("worker_count") != 0 or not isinstance(seen, Mapping):
        return None
    last = seen.get("0")
    return first_step + last + 1 if isinstance(last, int) else None
