"""Grain side of exact mixing: :func:`mix_datasets` serves sample ``n`` from the source that
the exact mixture (:mod:`grain_rox._order._mixture`) gives it.

:func:`mix_datasets` puts the identity of its inputs (:func:`describe_dataset`) and of its
weights, phases, seed and length into its iterators' states, so a state saved over another
mixture is refused, naming what changed.
"""

from __future__ import annotations

import bisect
import hashlib
import inspect
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np

from grain_rox._format._digest import FULL_HASH_BYTES, SAMPLE_BYTES, facts_digest
from grain_rox._order._curriculum import EXACT_MIXING
from grain_rox._order._mixture import Mixture, own_samples, resolve_weights
from grain_rox._order._permutation import derive_key, int_arg, seed_arg
from grain_rox._sources._batch_dataset import dataset_source
from grain_rox._sources._grain_setup import make_grain_workers_usable
from grain_rox._sources._identity import IdentifiedIterDataset, IdentifiedMapDataset, with_identity

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_SHOWN = 400  # longer descriptions keep their start and a digest of the whole
# Python containers up to this size are identified by all their elements; longer ones by this
# many, evenly spaced (the first and the last among them)
_DIGEST_ITEMS = 100_000
# arrays up to this size are identified by all their bytes; larger ones (a memory map of a
# corpus) by their shape and _SAMPLES windows of _SAMPLE bytes, evenly spaced: the sizes a
# source's files are hashed by (_format._digest)
_DIGEST_BYTES = FULL_HASH_BYTES
_HF_ROWS = 4096  # rows of an HF dataset read for its digest (each read costs ~10-50 us)
_SAMPLE = 1 << 20
_SAMPLES = SAMPLE_BYTES // _SAMPLE


def _feed(h: Any, x: Any) -> None:
    """Feed ``x`` to ``h``: arrays by dtype, shape and bytes (sampled past ``_DIGEST_BYTES``;
    object arrays element by element), mappings key by key, lists and tuples item by item,
    anything else by repr."""
    if isinstance(x, np.ndarray):
        h.update(f"{x.dtype.str}{x.shape}".encode())
        if x.dtype.hasobject:  # references, not values: each element's own content
            for item in x.reshape(-1):
                _feed(h, item)
        elif x.nbytes > _DIGEST_BYTES:
            # _SAMPLES windows of _SAMPLE bytes, evenly spaced over the elements in order: from
            # a flat view where x is contiguous, else by x.flat (a window's copy alone)
            flat = x.reshape(-1) if x.flags.c_contiguous else x.flat
            per = max(1, _SAMPLE // x.itemsize)
            for start in np.linspace(0, x.size - per, _SAMPLES).astype(np.int64).tolist():
                h.update(np.ascontiguousarray(flat[start : start + per]).tobytes())
        else:
            h.update(np.ascontiguousarray(x).tobytes())
    elif isinstance(x, Mapping):
        for k in sorted(x, key=repr):
            h.update(repr(k).encode())
            _feed(h, x[k])
    elif isinstance(x, (list, tuple)):
        h.update(f"{type(x).__name__}{len(x)}[".encode())
        for y in x:
            _feed(h, y)
        h.update(b"]")
    else:
        h.update(repr(x).encode())
    h.update(b"\x00")


def _content_digest(items: Sequence[Any]) -> str:
    """SHA-1 digest (16 hex digits) of a container's elements (see :func:`_feed`); past
    ``_DIGEST_ITEMS`` items, that many of them, evenly spaced (and the length)."""
    h = hashlib.sha1()
    if len(items) > _DIGEST_ITEMS:
        h.update(f"len={len(items)}".encode())
        items = [items[int(i)] for i in np.linspace(0, len(items) - 1, _DIGEST_ITEMS)]
    for item in items:
        _feed(h, item)
    return h.hexdigest()[:16]


def _source_description(source: Any) -> str:
    """A source's repr when it identifies the content (grain_rox sources hold a content
    fingerprint); a digest of the elements of a Python list or tuple (sampled past
    ``_DIGEST_ITEMS`` of them) or of a NumPy array's bytes (sampled past ``_DIGEST_BYTES``);
    an HF ``datasets.Dataset``'s rows (sampled past ``_HF_ROWS``); else (a repr that is an
    object address, different in every process) the type and length."""
    name = type(source).__qualname__
    if isinstance(source, (list, tuple)):
        sampled = "sampled " if len(source) > _DIGEST_ITEMS else ""
        return f"{name}(len={len(source)}, {sampled}digest={_content_digest(source)})"
    if isinstance(source, np.ndarray):
        sampled = "sampled " if source.nbytes > _DIGEST_BYTES else ""
        return (
            f"{name}(shape={source.shape}, dtype={source.dtype}, {sampled}digest="
            f"{_content_digest([source])})"
        )
    if type(source).__module__.split(".")[0] == "datasets" and hasattr(source, "features"):
        # an HF datasets.Dataset: its repr names only the columns and the row count, and HF's
        # fingerprint is random where a map's function cannot be hashed: its rows, sampled
        n = len(source)
        rows = [source[int(i)] for i in np.linspace(0, n - 1, min(n, _HF_ROWS))] if n else []
        sampled = "sampled " if n > _HF_ROWS else ""
        digest = _content_digest([repr(source.features), *rows])
        return f"{name}(num_rows={n}, {sampled}digest={digest})"
    text = repr(source)
    if _ADDRESS.search(text) or text.startswith("<"):
        try:
            return f"{name}(len={len(source)})"
        except TypeError:
            return name
    return text


# Settings Grain nodes keep inside helper objects, not in their ``str``: (attribute, field)
_HIDDEN = (("_rng_pool", "_seed"), ("_selection_map", "_proportions"))


def _hidden_facts(node: Any) -> list[str]:
    """Settings of a Grain node that its ``str`` may not show, each as ``name=value``:
    ``random_map``'s seed (in its ``_rng_pool``), ``MapDataset.mix``'s proportions (in its
    ``_selection_map``) and the node's own constructor arguments (:func:`_argument_facts`).

    >>> import grain
    >>> _hidden_facts(grain.MapDataset.range(4).random_map(lambda x, rng: x, seed=7))
    ['rng_pool.seed=7']
    """
    facts = []
    for holder, field in _HIDDEN:
        value = getattr(vars(node).get(holder), field, None)
        if value is not None:
            value = [int(v) for v in value] if isinstance(value, (list, tuple)) else value
            facts.append(f"{holder.lstrip('_')}.{field.lstrip('_')}={value!r}")
    return facts + _argument_facts(node)


def _argument_facts(node: Any) -> list[str]:
    """The arguments a Grain node was made with and keeps as attributes (``x`` or ``_x``):
    each plain value (numbers, text, and lists and dicts of them) other than the argument's
    default, as ``name=value``. ``WindowShuffleMapDataset``'s window size, the packers'
    lengths and bins and ``repeat``'s ``reseed_each_epoch=False`` are not in their ``str``.

    >>> import grain
    >>> _argument_facts(grain.MapDataset.range(9).repeat(2, reseed_each_epoch=False))
    ['num_epochs=2', 'reseed_each_epoch=False']
    """
    try:
        parameters = inspect.signature(type(node).__init__).parameters.values()
    except (TypeError, ValueError):  # (a constructor without a signature: nothing to add)
        return []
    kept = vars(node)
    facts = []
    for p in parameters:
        name = p.name
        key = f"_{name}" if f"_{name}" in kept else name
        if name in ("self", "parent", "parents") or key not in kept:
            continue
        value = kept[key]
        if value is None or not _plain(value):
            continue
        if p.default is not inspect.Parameter.empty and _plain(p.default) and value == p.default:
            continue
        facts.append(f"{name}={value!r}")
    return facts


def _plain(value: Any) -> bool:
    """Whether ``value`` is numbers, text, ``None`` and lists, tuples and dicts of them: a
    value whose repr is the same in every process."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _node_description(node: Any) -> str:
    source = dataset_source(node)  # a source dataset is described by its source
    if source is not None and not node.parents:
        return _source_description(source)
    if isinstance(node, (IdentifiedMapDataset, IdentifiedIterDataset)):
        return f"{node.what}(identity={facts_digest(node.identity)})"
    text = _ADDRESS.sub("", str(node))
    seed = vars(node).get("_seed")
    if seed is not None:
        text += f"[seed={seed}]"
    hidden = [fact for fact in _hidden_facts(node) if fact not in text]
    if hidden:
        text += f"{{{', '.join(hidden)}}}"
    parents = [p for p in node.parents]
    if not parents:
        return text
    inner = ", ".join(_node_description(p) for p in parents)
    return f"{text}<-{inner}" if len(parents) == 1 else f"{text}<-[{inner}]"


def describe_dataset(ds: Any) -> str:
    """A description of a Grain dataset (its chain of operations back to its sources) or of a
    data source that is the same in every process and changes when the data or an operation
    does (sources are described by their repr, which is content-based for grain_rox's own).

    >>> import grain
    >>> describe_dataset(grain.MapDataset.range(4).shuffle(seed=3))
    'ShuffleMapDataset[seed=3]<-RangeMapDataset(start=0, stop=4, step=1)'
    """
    if isinstance(ds, (grain.MapDataset, grain.IterDataset)):
        text = _node_description(ds)
    else:
        text = _source_description(ds)
    if len(text) > _SHOWN:
        text = f"{text[: _SHOWN - 40]}...(digest={facts_digest(text)})"
    return text


_SPAN = 1024  # elements whose sources are worked out at once, when reads look sequential


class _ExactSelection(grain.transforms.DatasetSelectionMap):
    """Grain selection map: element ``i`` -> (source, the source's own sample index).

    An element is found on its own (two ``counts``: O(#sources)); when a second element of
    the same :data:`_SPAN` is asked for next (an iterator reads in order), the whole span is
    worked out at once and kept (a few spans; not pickled), so reading in order costs about a
    microsecond an element however many sources there are."""

    def __init__(self, mixture: Mixture, length: int) -> None:
        self.mixture = mixture
        self.length = length
        self._spans: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._last = -1  # the span of the last element found on its own

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_spans": {}, "_last": -1}

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[int, int]:
        span, x = divmod(index, _SPAN)
        hit = self._spans.get(span)
        if hit is None:
            if self._last != span:  # a read out of order: this element alone
                self._last = span
                before = self.mixture.counts(index)
                after = self.mixture.counts(index + 1)
                source = next(
                    i for i, (a, b) in enumerate(zip(before, after, strict=True)) if b > a
                )
                return source, before[source]
            hit = self._span(span)
        return int(hit[0][x]), int(hit[1][x])

    def _span(self, span: int) -> tuple[np.ndarray, np.ndarray]:
        """Each element's source and own sample index, for elements of ``span``."""
        a = span * _SPAN
        before = self.mixture.counts(a)
        sources = self.mixture.sources_from(a, a + _SPAN, before)
        own, _ = own_samples(sources, before, len(before))
        if len(self._spans) >= 4:
            self._spans = {}
        self._spans[span] = (sources, own)
        return sources, own


class _PhasedSelection(grain.transforms.DatasetSelectionMap):
    """Phase ``p`` covers elements ``[starts[p], starts[p + 1])`` with its own mixture; each
    source's sample index continues from where the earlier phases left it."""

    def __init__(self, mixtures: Sequence[Mixture], lengths: Sequence[int]) -> None:
        self.phases = [_ExactSelection(m, 1 << 62) for m in mixtures]
        self.starts = [0, *np.cumsum(lengths).tolist()]
        self.offsets = [tuple(0 for _ in mixtures[0].weights)]
        for mixture, n in zip(mixtures[:-1], lengths[:-1], strict=True):
            served = mixture.counts(n)
            self.offsets.append(tuple(a + b for a, b in zip(self.offsets[-1], served, strict=True)))

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, index: int) -> tuple[int, int]:
        # past the end (a repeated mixture) the last phase continues
        p = min(bisect.bisect_right(self.starts, index), len(self.phases)) - 1
        source, k = self.phases[p][index - self.starts[p]]
        return source, self.offsets[p][source] + k


def mix_datasets(
    datasets: Mapping[str, grain.MapDataset],
    weights: Mapping[str, float] | None = None,
    *,
    phases: Sequence[tuple[int | None, Mapping[str, float]]] | None = None,
    seed: int = 0,
    length: int | None = None,
) -> grain.MapDataset:
    """Mix Grain ``MapDataset``s with exact proportions, as a random-access ``MapDataset``.

    Element ``i`` comes from the source that the exact mixture assigns to sample ``i``
    (after ``n`` elements a source of weight share ``w`` has given ``round(w * n) ± 1``, at
    every ``n``: Sainte-Laguë apportionment, of groups of sources where that needs them; see
    :mod:`grain_rox._order._mixture`); each source is shuffled with a new permutation every
    epoch and repeats, so the mixture never ends early (``length`` defaults to the largest
    source's length divided by its weight share). An endless source (``len == sys.maxsize``,
    Grain's convention, e.g. ``ds.repeat()`` or an endless :class:`~grain_rox.TokenPipeline`'s
    ``map_dataset()``) is read in its own order, and makes the default length endless too.

    A curriculum: ``phases=[(num_samples, weights), ..., (None, weights)]`` instead of
    ``weights`` changes the proportions after each phase's samples (the last phase may run to
    ``length``); every source continues where the previous phase left it, so nothing is
    replayed or skipped at a phase change. Any element is still found in O(#sources), so a
    Grain iterator over the mixture restores at once.

    Args:
        datasets: ``{name: grain.MapDataset}``, the sources (a data source goes in as
            ``grain.MapDataset.source(source)``).
        weights: ``{name: weight}``, the proportions (a missing name has weight 0; may be
            left out for a single dataset).
        phases: ``[(num_samples, weights), ..., (None, weights)]``, a curriculum, instead of
            ``weights``.
        seed: Seeds each source's per-epoch shuffle.
        length: Elements of the mixture (default: see above; with ``phases`` ending in a
            fixed count, their sum).

    Returns:
        A ``grain.MapDataset`` whose element ``i`` is the mixture's sample ``i``; its
        iterators' states name the sources and this config.

    Raises:
        TypeError: ``datasets`` is not a non-empty mapping of ``grain.MapDataset``s.
        ValueError: Unknown names or bad values in ``weights`` or ``phases``, both or
            neither of them (with several datasets), or a ``length`` the phases contradict.

    >>> import grain
    >>> ds = mix_datasets({"a": grain.MapDataset.range(100), "b": grain.MapDataset.range(1000, 1010)},
    ...                   {"a": 0.75, "b": 0.25}, seed=0, length=8)
    >>> [int(x >= 1000) for x in ds]
    [0, 0, 1, 0, 0, 0, 1, 0]
    >>> phased = mix_datasets({"a": grain.MapDataset.range(100), "b": grain.MapDataset.range(1000, 1010)},
    ...                       phases=[(4, {"a": 1.0}), (None, {"b": 1.0})], length=6)
    >>> [int(x >= 1000) for x in phased]
    [0, 0, 0, 0, 1, 1]
    """
    if not isinstance(datasets, Mapping) or not datasets:
        raise TypeError(
            f"mix_datasets: datasets={datasets!r} must be a non-empty mapping "
            "{name: grain.MapDataset}"
        )
    make_grain_workers_usable()
    names = list(datasets)
    for name, ds in datasets.items():
        if not isinstance(ds, grain.MapDataset):
            raise TypeError(
                f"mix_datasets: dataset {name!r} is a {type(ds).__name__}, not a "
                "grain.MapDataset; wrap a data source as grain.MapDataset.source(source)"
            )
    seed = seed_arg(seed, where="mix_datasets")
    if length is not None:
        length = int_arg(length, "length", where="mix_datasets")
    if weights is not None and phases is not None:  # (one dataset's weights were dropped)
        raise ValueError(
            "mix_datasets: give weights= or phases=[(num_samples, weights), ...], not both"
        )
    if weights is None and phases is None and len(names) > 1:
        raise ValueError("mix_datasets: give weights= or phases=[(num_samples, weights), ...]")
    if phases is None:
        phases = [(None, weights)]  # type: ignore[list-item]
    if not phases:
        raise ValueError("phases= is empty; give at least one (num_samples, weights)")
    for p, phase in enumerate(phases):
        if not isinstance(phase, (tuple, list)) or len(phase) != 2:
            raise ValueError(
                f"mix_datasets: phases[{p}] is {phase!r:.100}, not a pair (num_samples, "
                "weights); pass phases=[(num_samples, {name: weight, ...}), ..., (None, {...})]"
            )
    shares = [
        resolve_weights(names, w, f"mix_datasets phase {p}") for p, (_, w) in enumerate(phases)
    ]
    counts = [
        None if n is None else int_arg(n, f"phases[{p}] num_samples", where="mix_datasets")
        for p, (n, _) in enumerate(phases)
    ]
    if any(n is None for n in counts[:-1]):
        raise ValueError(
            f"phase lengths {counts} must be >= 1; only the last phase may be None (until length)"
        )
    # the weights' own checks first (all 0 was "max() arg is an empty sequence" below)
    mixtures = [Mixture.from_weights(w) for w in shares]
    for p, w in enumerate(shares):
        empty = [(n, x) for n, x in zip(names, w, strict=True) if x and len(datasets[n]) == 0]
        if empty:  # (it was a ZeroDivisionError at the first element of it)
            name, weight = empty[0]
            raise ValueError(
                f"mix_datasets: dataset {name!r} has no elements but weight {weight} in phase "
                f"{p}; give it elements, or weight 0"
            )
    fixed = sum(n for n in counts[:-1] if n is not None)
    if counts[-1] is None:
        if length is None:
            last, total = shares[-1], sum(shares[-1])
            tail = max(
                int(len(datasets[n]) * total / w) for n, w in zip(names, last, strict=True) if w
            )
            length = min(sys.maxsize, fixed + tail)  # an endless input: an endless mixture
        if length <= fixed:
            raise ValueError(f"length={length} ends before the last phase starts (sample {fixed})")
        counts[-1] = length - fixed
    elif length is not None and length != fixed + counts[-1]:
        raise ValueError(f"length={length} differs from the phases' {fixed + counts[-1]} samples")
    parts = [
        datasets[n]  # endless (Grain's len == sys.maxsize): taken in its own order
        if len(datasets[n]) >= sys.maxsize
        else datasets[n].shuffle(seed=derive_key(seed, i) % (1 << 31)).repeat()
        for i, n in enumerate(names)
    ]
    if len(mixtures) == 1:
        selection: grain.transforms.DatasetSelectionMap = _ExactSelection(
            mixtures[0], int(counts[0] or 0)
        )
    else:
        selection = _PhasedSelection(mixtures, [int(n) for n in counts if n is not None])
    mixed = grain.MapDataset.select_from_datasets(parts, selection)
    identity: dict[str, Any] = {f"dataset {n!r}": describe_dataset(datasets[n]) for n in names}
    identity["sources"] = names  # in order: a source's place seeds its shuffle and selection
    identity["phases"] = [
        [n, dict(zip(names, w, strict=True))] for n, w in zip(counts, shares, strict=True)
    ]
    grouped = [m.groups(names) for m in mixtures]
    if any(grouped):  # named only where sources are grouped (as TokenPipeline's phases)
        identity["mixing"] = grouped
    if any(m.mixes for m in mixtures):  # by the exact weights (states of quantised ones refused)
        identity["apportioned"] = EXACT_MIXING
    identity["seed"] = seed
    identity["length"] = int(sum(n for n in counts if n is not None))
    return with_identity(mixed, identity, what="mix_datasets")
