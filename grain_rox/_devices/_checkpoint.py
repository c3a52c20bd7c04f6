"""Save and restore the data position with Orbax, beside the model.

``RoxCheckpointSave(iterator)`` / ``RoxCheckpointRestore(iterator)`` are Orbax checkpoint
args for :class:`~grain_rox.MultiHostDataLoadIterator` (and any iterator with JSON-able
``get_state``/``set_state``). A :class:`~grain_rox.TokenPipeline` iterator's state is global
(the step and the pipeline's identity), so one file, ``data_state.json``, is written by the
primary process and read by every process on restore — whatever their number. Other
iterators' states are per process and are kept as ``process_<i>-of-<n>.json``, like Grain's;
they restore on the same number of processes, and on any number when every process saved the
same ``.batches()`` state (its position is a global batch index, its identity has no shard).

Grain's own ``grain.checkpoint.CheckpointSave`` also works on our iterator (its state is JSON
bytes), but ties the files to the process count.

>>> import tempfile, os, numpy as np, orbax.checkpoint as ocp
>>> from grain_rox import MultiHostDataLoadIterator, TokenPipeline, write_rox
>>> path = os.path.join(tempfile.mkdtemp(), "c.rox")
>>> _ = write_rox([np.arange(20000, dtype=np.uint16)], path)
>>> pipe = TokenPipeline(path, seq_len=32, global_batch_size=8)
>>> it = MultiHostDataLoadIterator(pipe)
>>> _ = next(it), next(it)
>>> manager = ocp.CheckpointManager(tempfile.mkdtemp())
>>> manager.save(2, args=ocp.args.Composite(data=RoxCheckpointSave(it)))
True
>>> manager.wait_until_finished()
>>> restored = MultiHostDataLoadIterator(pipe)
>>> _ = manager.restore(2, args=ocp.args.Composite(data=RoxCheckpointRestore(restored)))
>>> restored.step, bool((next(restored)["inputs"] == next(it)["inputs"]).all())
(2, True)
>>> it.close(); restored.close(); manager.close()
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp
from etils import epath

from grain_rox._devices._feeds import misfit_state
from grain_rox._devices._multihost import MultiHostDataLoadIterator

GLOBAL_STATE_FILE = "data_state.json"


def _is_global(state: dict[str, Any]) -> bool:
    return "pipeline" in state


# Identities whose state is one global position, the same in every process: a .batches()
# dataset's (any shard) and a TokenPipeline's (any rows)
_SHARED_IDENTITIES = ({"data", "batch_size", "seed"}, {"data", "phases", "seed"})


def _shared_batches_state(directory: epath.Path) -> str | None:
    """The state every process of a complete per-process save holds, if they all hold the
    same ``.batches()`` state (then it is valid on any number of processes); else None."""
    saved: dict[int, set[int]] = {}
    for p in directory.glob("process_*-of-*.json"):
        index, _, count = p.stem.removeprefix("process_").partition("-of-")
        if index.isdigit() and count.isdigit():
            saved.setdefault(int(count), set()).add(int(index))
    complete = [n for n, done in saved.items() if done == set(range(n))]
    if len(complete) != 1:
        return None
    n = complete[0]
    texts = {(directory / f"process_{i}-of-{n}.json").read_text() for i in range(n)}
    if len(texts) != 1:
        return None
    text = texts.pop()
    state = json.loads(text)
    # a MultiHostDataLoadIterator's state holds Grain's under "grain"; a Grain dataset
    # iterator's (saved as it is) is Grain's own
    grain_state = state.get("grain", state) if isinstance(state, dict) else None
    identity = grain_state.get("identity") if isinstance(grain_state, dict) else None
    if not (isinstance(identity, dict) and any(k <= set(identity) for k in _SHARED_IDENTITIES)):
        return None
    return text


def _text(raw: Any) -> str:
    return raw.decode("utf-8") if isinstance(raw, bytes) else raw


def _set_state(item: Any, text: str) -> None:
    """Hand a saved state back as the item gives its own: a Grain dataset iterator takes the
    dict, a ``grain.DataLoader`` iterator bytes, others the text."""
    if isinstance(item, grain.DatasetIterator):
        state = json.loads(text)
        try:
            item.set_state(state)
        except (KeyError, IndexError, TypeError) as e:  # Grain's own, on a misfit state
            raise misfit_state(item, state, e) from e
    elif isinstance(item, MultiHostDataLoadIterator):  # takes the text as it is
        item.set_state(text)
    else:  # (a Grain input's get_state would open its iterator only to be asked this)
        item.set_state(text.encode("utf-8") if isinstance(item.get_state(), bytes) else text)


def write_state(directory: epath.Path, raw: Any) -> None:
    """Write ``raw``, an iterator's ``get_state()``, into ``directory``: a global state (a
    TokenPipeline's) once, by the primary process; any other as this process's file."""
    # JSON text or bytes (a MultiHostDataLoadIterator's, a DataLoader iterator's), or the
    # dict a Grain dataset iterator gives (as Grain's own handler takes it)
    state = raw if isinstance(raw, dict) else json.loads(_text(raw))
    if _is_global(state):
        if jax.process_index() == 0:
            (directory / GLOBAL_STATE_FILE).write_text(json.dumps(state, indent=1))
        return
    name = f"process_{jax.process_index()}-of-{jax.process_count()}.json"
    (directory / name).write_text(json.dumps(state, indent=1))


def read_state(directory: epath.Path, item: Any) -> None:
    """Restore ``item`` from the state :func:`write_state` left in ``directory``."""
    path = directory / GLOBAL_STATE_FILE
    if not path.exists():
        path = directory / f"process_{jax.process_index()}-of-{jax.process_count()}.json"
    if not path.exists():
        elastic = _shared_batches_state(directory)
        if elastic is not None:
            _set_state(item, elastic)
            return
        found = sorted(p.name for p in directory.iterdir())
        others = [n for n in found if re.fullmatch(r"process_\d+-of-\d+\.json", n)]
        why = (
            "these per-process states are not one position every process shares (as a "
            "TokenPipeline's or a .batches() dataset's are, saved whole), so they restore "
            "only on the number of processes that saved them"
            if others
            else f"no data state file is there ({GLOBAL_STATE_FILE} or "
            "process_<i>-of-<n>.json): the checkpoint is damaged or was saved without its "
            "data state; restore an earlier step"
        )
        raise FileNotFoundError(
            f"no data state for process {jax.process_index()} of {jax.process_count()} in "
            f"{directory} (it holds {found}); {why}"
        )
    text = path.read_text()
    try:
        json.loads(text)
    except ValueError as e:
        raise ValueError(
            f"{path}: the data state is not JSON ({e}): the checkpoint is damaged (a "
            "truncated or edited file); restore an earlier step"
        ) from None
    _set_state(item, text)


class RoxCheckpointHandler(ocp.CheckpointHandler):
    """Orbax handler for data iterators; see the module doc (registered for the args below).

    >>> RoxCheckpointHandler().typestr()
    'grain_rox._devices._checkpoint.RoxCheckpointHandler'
    """

    def save(self, directory: epath.Path, args: RoxCheckpointSave) -> None:
        write_state(epath.Path(directory), args.item.get_state())

    def restore(self, directory: epath.Path, args: RoxCheckpointRestore) -> Any:
        read_state(epath.Path(directory), args.item)
        return args.item

    def metadata(self, directory: epath.Path) -> None:
        return None

    def finalize(self, directory: epath.Path) -> None:
        pass

    def close(self) -> None:
        pass


@dataclasses.dataclass
class IteratorArgs(ocp.args.CheckpointArgs):
    """Orbax args that hand a data iterator to :class:`RoxCheckpointHandler`.

    Args:
      item: the iterator: a :class:`~grain_rox.MultiHostDataLoadIterator`, a Grain dataset
        iterator (its ``get_state()`` a JSON-able dict, as Grain's own handler saves it), or
        any iterator whose ``get_state()`` is JSON (text or bytes) and whose ``set_state``
        takes it back.

    >>> IteratorArgs(item=None).item is None
    True
    """

    item: Any


@ocp.args.register_with_handler(RoxCheckpointHandler, for_save=True)
class RoxCheckpointSave(IteratorArgs):
    """Orbax args: save ``item``'s data state (a MultiHostDataLoadIterator).

    Args:
      item: the iterator whose state is saved (see :class:`IteratorArgs`).

    >>> isinstance(RoxCheckpointSave(item=None), ocp.args.CheckpointArgs)
    True
    """


@ocp.args.register_with_handler(RoxCheckpointHandler, for_restore=True)
class RoxCheckpointRestore(IteratorArgs):
    """Orbax args: restore ``item``'s data state in place (returns ``item``).

    Args:
      item: the iterator to restore, built the same way as the one saved (see
        :class:`IteratorArgs`).

    >>> isinstance(RoxCheckpointRestore(item=None), ocp.args.CheckpointArgs)
    True
    """
