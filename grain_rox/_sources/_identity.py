"""Restore checks: every iterator state grain_rox hands out names the data and config it
belongs to, and ``set_state`` refuses a state taken over other data or another config.

A Grain ``MapDataset``/``IterDataset`` state is only a position (``{"next_index": 7}``), so a
state saved over one file restores silently over another. :func:`with_identity` wraps a Grain
dataset so its iterator's state is ``{"identity": {...}, "state": <Grain's state>}`` and
``set_state`` compares the identity first, naming every field that changed.

>>> import grain
>>> ds = with_identity(grain.MapDataset.range(5), {"data": "abc", "seed": 0}, what="demo")
>>> it = iter(ds)
>>> _ = next(it); state = it.get_state()
>>> state["identity"], state["state"]
({'data': 'abc', 'seed': 0}, {'next_index': 1})
>>> other = iter(with_identity(grain.MapDataset.range(5), {"data": "xyz", "seed": 0}, what="demo"))
>>> other.set_state(state)
Traceback (most recent call last):
...
ValueError: cannot restore this demo state: its data or config changed (data: saved 'abc' -> now 'xyz'). Restore with the same data and config, or start a new run (a data fingerprint covers the content and, for files, their names and order: a file rewritten, added, removed or renamed since the save changes it; restore onto the data the run was saved with)
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np

from grain_rox._format._digest import facts_digest
from grain_rox._order._permutation import json_plain
from grain_rox._sources._batch_dataset import next_index_of

# Fields added to identities by later releases: a state saved without one (by an earlier
# release) is compared without it. "sources": mix_datasets' sources in order (each source's
# shuffle seed and selection index follow its place; a reordered mapping restored silently).
ADDED_FIELDS = frozenset({"sources"})
# The form of a pipeline's batches: another layout at a restore serves the same batches in that
# form (MaxText features, or one array to unpack in the step), as another mesh or process count
# serves them on other devices; an identity names it, and it may change. (Segment features on
# or off is not a form: it changes what the model attends to, and is refused.)
FORM_FIELDS = frozenset({"layout"})


# Fields an identity holds only when not their default: shown with it where missing (a
# pipeline read without Grain workers names no worker_count; "saved None" said nothing)
DEFAULT_FIELDS: Mapping[str, Any] = {"worker_count": 0}


def identity_changes(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Each field of ``now`` whose saved value differs, as ``"key: saved a -> now b"``."""
    keys = [k for k in [*now, *(k for k in saved if k not in now)] if k not in FORM_FIELDS]

    def value(of: Mapping[str, Any], k: str) -> Any:
        return of.get(k, DEFAULT_FIELDS.get(k))

    return [
        f"{k}: saved {value(saved, k)!r} -> now {value(now, k)!r}"
        for k in keys
        if value(saved, k) != value(now, k) and not (k in ADDED_FIELDS and k not in saved)
    ]


# Said where a restore is refused for its data: what the fingerprints shown cover
DATA_HINT = (
    "a data fingerprint covers the content and, for files, their names and order: a file "
    "rewritten, added, removed or renamed since the save changes it; restore onto the data "
    "the run was saved with"
)


def check_identity(saved: Any, now: Mapping[str, Any], *, what: str) -> None:
    """Raise ``ValueError`` naming every changed field if ``saved`` is not ``now``."""
    if not isinstance(saved, Mapping):
        raise ValueError(
            f"cannot restore this {what} state: its identity is {saved!r}, not a dict; pass a "
            "state returned by get_state() unchanged"
        )
    changes = identity_changes(saved, now)
    if changes:
        hint = f" ({DATA_HINT})" if any(c.startswith("data: ") for c in changes) else ""
        if any(c.startswith("worker_count: ") for c in changes):
            hint += (
                " (Grain's state of worker processes restores only with as many workers; "
                "the batches do not depend on them: continue on another worker count from "
                "the saved step with iter_dataset(first_step=step, worker_count=...))"
            )
        raise ValueError(
            f"cannot restore this {what} state: its data or config changed "
            f"({'; '.join(changes)}). Restore with the same data and config, or start a new "
            f"run{hint}"
        )


def split_state(
    state: Any, *, what: str, identity: Mapping[str, Any] | None = None
) -> tuple[Mapping[str, Any], Any]:
    """``(identity, inner state)`` of a state made by :func:`with_identity`, type-checked
    (``identity``: the restoring dataset's, to word how an older state can continue)."""
    if isinstance(state, Mapping) and {"version", "step"} <= set(state):
        step = state["step"]
        resume = (
            f", or continue this iterator there with iter_dataset(first_step={step})"
            if what == "TokenPipeline" and "pipeline" in state
            else ""
        )
        raise ValueError(
            f"not a {what} state: it is a MultiHostDataLoadIterator's (step {step}); restore "
            f"it with set_state on a MultiHostDataLoadIterator over the same input{resume}"
        )
    if not isinstance(state, Mapping) or set(state) != {"identity", "state"}:
        shown = repr(state)[:200]
        index = state.get("next_index") if isinstance(state, Mapping) else None
        # a bare stream's position is its batch count, which start_step can take (after a
        # slice, batch or shuffle it counts something else: no such advice there)
        bare = identity is not None and not identity.get("ops")
        if what == "roxxel_stream" and bare and isinstance(index, int):
            fix = (
                f"a roxxel_stream state saved before grain_rox recorded identities cannot be "
                f"restored; continue by building roxxel_stream(..., start_step=S + {index}), "
                "S being the start_step it was built with"
            )
        else:
            fix = (
                "another iterator's state (a grain.DataLoader's, a plain Grain dataset's) "
                "restores only into the iterator that saved it; one saved by grain_rox before "
                "identities were recorded cannot be restored: start a new run"
            )
        raise ValueError(
            f"not a {what} state: {shown}. Expected the dict get_state() returned, with keys "
            f"'identity' and 'state' ({fix})"
        )
    return state["identity"], state["state"]


class _IdentifiedIterator(grain.DatasetIterator):
    """Grain's iterator of the wrapped dataset, with ``owner``'s identity in its state; over a
    ``MapDataset`` of ``owner.length`` elements, the position is type-checked too."""

    def __init__(self, parent: grain.DatasetIterator, owner: IdentifiedIterDataset):
        super().__init__(parent)
        self._identity = owner.identity
        self._what = owner.what
        self._length = owner.length

    def __next__(self) -> Any:
        return next(self._parent)

    def get_state(self) -> dict[str, Any]:
        # a copy: a caller that edits the state it got must not edit this dataset's identity
        # (every iterator of it checks restores against that one object)
        return {"identity": copy.deepcopy(self._identity), "state": self._parent.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        saved, inner = split_state(state, what=self._what, identity=self._identity)
        check_identity(saved, self._identity, what=self._what)
        if self._length is not None:
            _check_position(inner, self._length, what=self._what)
        self._parent.set_state(inner)

    def _get_next_index(self) -> int:  # grain.experimental.get_next_index, as Grain's own
        return grain.experimental.get_next_index(self._parent)

    def _set_next_index(self, index: int) -> None:  # grain.experimental.set_next_index
        grain.experimental.set_next_index(self._parent, index)

    def close(self) -> None:
        closer = getattr(self._parent, "close", None)
        if callable(closer):
            closer()

    def __str__(self) -> str:
        return f"IdentifiedIterator({self._what})"


def _check_position(inner: Any, length: int, *, what: str) -> None:
    """A MapDataset iterator's position must be ``{"next_index": 0..length}``."""
    index = next_index_of(inner)
    if index is None or not 0 <= index <= length:
        raise ValueError(
            f"cannot restore this {what} state: its position {inner!r:.200} is not "
            f"{{'next_index': <an int from 0 to {length}>}}; pass the state "
            "get_state() returned, unchanged"
        )


class IdentifiedIterDataset(grain.IterDataset):
    """``parent`` whose iterators carry ``identity`` in their state (see the module doc);
    ``length``: that of the ``MapDataset`` it was made from, whose positions are checked."""

    def __init__(
        self,
        parent: grain.IterDataset,
        identity: dict[str, Any],
        *,
        what: str,
        length: int | None = None,
    ):
        super().__init__(parent)
        self.identity = dict(identity)
        self.what = what
        self.length = length

    def __iter__(self) -> grain.DatasetIterator:
        return _IdentifiedIterator(self._parent.__iter__(), self)

    def _keep(
        self, ds: grain.IterDataset, op: str | None = None, *, same_position: bool = True
    ) -> IdentifiedIterDataset:
        """``ds`` (a transformation of this dataset's parent) with this identity, plus ``op``,
        as ``IdentifiedMapDataset._keep``: applied under the wrapper, Grain's depth-derived
        default seeds are plain Grain's. ``same_position``: ``ds``'s iterators keep the
        parent's ``{"next_index"}`` state (map, filter, batch), so its range is still checked;
        ``random_map``'s and ``map_with_index``'s nest it, and Grain checks those."""
        # "iter.": a MapDataset's batch(2) position counts batches, an IterDataset's elements
        identity = _with_op(self.identity, None if op is None else f"iter.{op}")
        length = self.length if same_position else None
        return IdentifiedIterDataset(ds, identity, what=self.what, length=length)

    def map(self, transform: Any) -> IdentifiedIterDataset:
        return self._keep(self._parent.map(transform))

    def filter(self, transform: Any) -> IdentifiedIterDataset:
        return self._keep(self._parent.filter(transform))

    def map_with_index(self, transform: Any) -> IdentifiedIterDataset:
        return self._keep(self._parent.map_with_index(transform), same_position=False)

    def random_map(self, transform: Any, *, seed: int | None = None) -> IdentifiedIterDataset:
        made = self._parent.random_map(transform, seed=seed)
        return self._keep(made, f"random_map(seed={seed})", same_position=False)

    def seed(self, seed: int) -> IdentifiedIterDataset:
        return self._keep(self._parent.seed(seed), f"seed({seed})")

    def batch(
        self, batch_size: int, *, drop_remainder: bool = False, batch_fn: Any = None
    ) -> IdentifiedIterDataset:
        made = self._parent.batch(batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn)
        return self._keep(made, _batch_op(batch_size, drop_remainder, batch_fn))

    def apply(self, transformations: Any) -> grain.IterDataset:
        # Grain's apply makes a FlatMap's node itself, beneath no method of ours: kept here
        ds: Any = self
        for t in transformations if isinstance(transformations, Sequence) else [transformations]:
            if isinstance(t, grain.experimental.FlatMapTransform):
                made = grain.IterDataset.apply(ds._parent, t)
                ds = ds._keep(made, f"flat_map({_name_of(t)})", same_position=False)
            else:
                ds = grain.IterDataset.apply(ds, t)  # (through this class's own methods)
        return ds

    def __str__(self) -> str:
        return f"IdentifiedIterDataset({self.what})"


class IdentifiedMapDataset(grain.MapDataset):
    """``parent``, element for element; its ``to_iter_dataset()`` (and ``iter()``) give
    iterators whose state carries ``identity`` (and whose position is checked), and so do the
    datasets Grain's transformations of it return: element-wise ones (``map``,
    ``map_with_index``, ``filter``: their functions are not identified) and those that choose
    or order elements (``ds[a:b]``/``slice``, ``shuffle``, ``batch``, ``repeat``, ``seed``,
    ``random_map``), whose arguments join the identity as ``"ops"``, so that a state restores
    only onto the same slice, seeds and batching.

    >>> import grain
    >>> ds = with_identity(grain.MapDataset.range(8), {"data": "abc"}, what="demo")
    >>> it = iter(ds[:6].shuffle(seed=1)); _ = next(it)
    >>> it.get_state()["identity"]
    {'data': 'abc', 'ops': ['slice(0, 6, 1)', 'shuffle(seed=1)']}
    >>> iter(ds[:6].shuffle(seed=2)).set_state(it.get_state())
    Traceback (most recent call last):
    ...
    ValueError: cannot restore this demo state: its data or config changed (ops: saved ['slice(0, 6, 1)', 'shuffle(seed=1)'] -> now ['slice(0, 6, 1)', 'shuffle(seed=2)']). Restore with the same data and config, or start a new run
    """

    def __init__(self, parent: grain.MapDataset, identity: dict[str, Any], *, what: str):
        super().__init__(parent)
        self.identity = dict(identity)
        self.what = what

    def __len__(self) -> int:
        return len(self._parent)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        if isinstance(index, int | np.integer) and not isinstance(index, bool) and index < 0:
            length = len(self)  # modulo the length, as Grain's own datasets (range(10)[-11] is
            if 0 < length < sys.maxsize:  # 9), not of an endless one
                index = int(index) % length
        return self._parent[index]

    def _getitems(self, indices: Sequence[int]) -> Sequence[Any]:
        return self._parent._getitems(indices)

    def _keep(self, ds: grain.MapDataset, op: str | None = None) -> IdentifiedMapDataset:
        """``ds`` (a transformation of this dataset's parent) with this identity, plus ``op``.

        Each transformation applies to the parent, not to this wrapper, so the chain under the
        outer wrapper is Grain's own: Grain derives a ``.seed()``'s default seeds from the
        nodes' depth, and a wrapper between them changed a ``.seed(5).shuffle()`` order."""
        return IdentifiedMapDataset(ds, _with_op(self.identity, op), what=self.what)

    def map(self, transform: Any) -> IdentifiedMapDataset:
        return self._keep(self._parent.map(transform))

    def map_with_index(self, transform: Any) -> IdentifiedMapDataset:
        return self._keep(self._parent.map_with_index(transform))

    def random_map(self, transform: Any, *, seed: int | None = None) -> IdentifiedMapDataset:
        made = self._parent.random_map(transform, seed=seed)
        return self._keep(made, f"random_map(seed={seed})")

    def filter(self, transform: Any) -> IdentifiedMapDataset:
        return self._keep(self._parent.filter(transform))

    def slice(self, sl: slice) -> IdentifiedMapDataset:
        start, stop, step = sl.indices(len(self))
        return self._keep(self._parent.slice(sl), f"slice({start}, {stop}, {step})")

    def shuffle(self, seed: int | None = None) -> IdentifiedMapDataset:
        return self._keep(self._parent.shuffle(seed), f"shuffle(seed={seed})")

    def seed(self, seed: int) -> IdentifiedMapDataset:
        return self._keep(self._parent.seed(seed), f"seed({seed})")

    def batch(
        self, batch_size: int, *, drop_remainder: bool = False, batch_fn: Any = None
    ) -> IdentifiedMapDataset:
        made = self._parent.batch(batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn)
        return self._keep(made, _batch_op(batch_size, drop_remainder, batch_fn))

    def repeat(
        self, num_epochs: int | None = None, *, reseed_each_epoch: bool = True
    ) -> IdentifiedMapDataset:
        made = self._parent.repeat(num_epochs, reseed_each_epoch=reseed_each_epoch)
        return self._keep(made, f"repeat({num_epochs}, reseed_each_epoch={reseed_each_epoch})")

    def apply(self, transformations: Any) -> grain.MapDataset:
        # Grain's apply makes a FlatMap's node itself, beneath no method of ours: kept here
        ds: Any = self
        for t in transformations if isinstance(transformations, Sequence) else [transformations]:
            if isinstance(t, grain.experimental.FlatMapTransform):
                ds = ds._keep(grain.MapDataset.apply(ds._parent, t), f"flat_map({_name_of(t)})")
            else:
                ds = grain.MapDataset.apply(ds, t)  # (through this class's own methods)
        return ds

    def to_iter_dataset(
        self, read_options: grain.ReadOptions | None = None, *, allow_nones: bool = False
    ) -> grain.IterDataset:
        inner = self._parent.to_iter_dataset(read_options, allow_nones=allow_nones)
        return IdentifiedIterDataset(inner, self.identity, what=self.what, length=len(self))

    def __iter__(self) -> grain.DatasetIterator:
        return self.to_iter_dataset().__iter__()

    def __str__(self) -> str:
        return f"IdentifiedMapDataset({self.what})"

    def __repr__(self) -> str:
        # a grain.DataLoader over this dataset compares its repr on restore: the identity,
        # less the batches' form, which may change (as in set_state)
        kept = {k: v for k, v in self.identity.items() if k not in FORM_FIELDS}
        return f"IdentifiedMapDataset({self.what}, identity={facts_digest(kept)})"


def _with_op(identity: dict[str, Any], op: str | None) -> dict[str, Any]:
    """``identity`` with ``op`` after its ``"ops"`` (itself when ``op`` is None)."""
    return identity if op is None else {**identity, "ops": [*identity.get("ops", []), op]}


def _batch_op(batch_size: int, drop_remainder: bool, batch_fn: Any) -> str:
    """How a ``batch`` joins the identity's ops: its arguments, the function by name."""
    how = "" if batch_fn is None else f", batch_fn={_name_of(batch_fn)}"
    return f"batch({batch_size}, drop_remainder={drop_remainder}{how})"


def _name_of(fn: Any) -> str:
    """A function's name as the same code gives it in every process (no address)."""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{getattr(fn, '__module__', '')}.{name}".lstrip(".")


def with_identity(ds: Any, identity: dict[str, Any], *, what: str) -> Any:
    """``ds`` (a ``grain.MapDataset`` or ``IterDataset``) with ``identity`` in its iterators'
    states; ``identity`` must be JSON-serialisable (Grain's checkpoint handler writes JSON)."""
    identity = json_plain(identity)
    if isinstance(ds, grain.MapDataset):
        return IdentifiedMapDataset(ds, identity, what=what)
    if isinstance(ds, grain.IterDataset):
        return IdentifiedIterDataset(ds, identity, what=what)
    raise TypeError(f"with_identity takes a grain.MapDataset or IterDataset, not {type(ds)}")
