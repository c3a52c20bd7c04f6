"""Nested records compared and walked: numpy-aware equality with errors that point at the
differing leaf, and the leaves of a nested record (see :mod:`grain_rox.testing`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np


def as_numpy(tree: Any) -> Any:
    """``tree`` with every array leaf (``jax.Array`` included) as a numpy array.

    >>> as_numpy({"x": [np.int32(1)], "y": (2.0,)})
    {'x': [np.int32(1)], 'y': (2.0,)}
    """
    if isinstance(tree, Mapping):
        return {k: as_numpy(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(as_numpy(v) for v in tree)
    if isinstance(tree, np.ndarray | np.generic | str | bytes) or not hasattr(tree, "__array__"):
        return tree
    return np.asarray(tree)


def is_array(x: Any) -> bool:
    """Whether ``x`` is an array leaf (numpy, ``jax.Array``, anything with ``__array__``)."""
    return isinstance(x, np.ndarray | np.generic) or (
        hasattr(x, "__array__") and not isinstance(x, str | bytes | Mapping | list | tuple)
    )


def assert_tree_equal(actual: Any, expected: Any, *, what: str = "record") -> None:
    """Equal nested dicts/lists/tuples with equal leaves; an array leaf must match shape,
    values and (when ``expected`` holds a numpy array there too) dtype.

    >>> assert_tree_equal({"x": np.arange(3)}, {"x": [0, 1, 2]})
    >>> assert_tree_equal({"x": np.arange(3)}, {"x": np.arange(3.0)})
    Traceback (most recent call last):
    ...
    AssertionError: record['x']: dtype int64 != expected float64
    """
    if is_array(actual):
        a, e = np.asarray(actual), np.asarray(expected)
        if isinstance(expected, np.ndarray | np.generic) and a.dtype != e.dtype:
            raise AssertionError(f"{what}: dtype {a.dtype} != expected {e.dtype}")
        if a.shape != e.shape:
            raise AssertionError(f"{what}: shape {a.shape} != expected {e.shape}")
        equal = a == e if a.dtype.kind not in "fc" else (a == e) | (np.isnan(a) & np.isnan(e))
        if not np.all(equal):
            where = tuple(int(i) for i in np.argwhere(~np.asarray(equal))[0]) if a.ndim else ()
            raise AssertionError(
                f"{what}: values differ first at {list(where)}: {a[where]!r} != expected "
                f"{e[where]!r}"
            )
        return
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping) or set(actual) != set(expected):
            keys = sorted(actual) if isinstance(actual, Mapping) else type(actual).__name__
            raise AssertionError(f"{what}: keys {keys} != expected {sorted(expected)}")
        for key in expected:
            assert_tree_equal(actual[key], expected[key], what=f"{what}[{key!r}]")
    elif isinstance(expected, list | tuple) and not is_array(expected):
        if not isinstance(actual, list | tuple) or len(actual) != len(expected):
            raise AssertionError(f"{what}: {short(actual)} != expected {short(expected)}")
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_tree_equal(a, e, what=f"{what}[{i}]")
    elif is_array(expected):
        assert_tree_equal(np.asarray(actual), expected, what=what)
    elif actual != expected:
        raise AssertionError(f"{what}: {short(actual)} != expected {short(expected)}")


def short(x: Any) -> str:
    """``repr(x)``, cut at 200 characters for an error message."""
    text = repr(x)
    return text if len(text) <= 200 else text[:200] + "..."


def type_name(x: Any) -> str:
    """The name of ``x``'s class (how errors name a source)."""
    return type(x).__name__


def leaves(tree: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """``(path, leaf)`` of every leaf of a nested dict/list/tuple ``tree``.

    >>> list(leaves({"a": [1, 2], "b": 3}))
    [(('a', 0), 1), (('a', 1), 2), (('b',), 3)]
    """
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            yield from leaves(v, (*path, k))
    elif isinstance(tree, list | tuple):
        for i, v in enumerate(tree):
            yield from leaves(v, (*path, i))
    else:
        yield path, tree


def at(tree: Any, path: tuple, *, what: str = "record") -> Any:
    """The leaf of ``tree`` at ``path`` (as :func:`leaves` gives it); an ``AssertionError``
    naming the path where ``tree`` has none (a source whose reads differ in structure).

    >>> at({"a": [1, 2]}, ("a", 1))
    2
    >>> at({"a": [1]}, ("b", 0), what="record 3")
    Traceback (most recent call last):
    ...
    AssertionError: record 3 has no leaf at ['b', 0] (its keys: ['a']): a read of the same record had one there; records must have one structure
    """
    node = tree
    for depth, key in enumerate(path):
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            have = sorted(map(str, node)) if isinstance(node, Mapping) else short(node)
            kind = "its keys" if isinstance(node, Mapping) else f"at {list(path[:depth])}"
            raise AssertionError(
                f"{what} has no leaf at {list(path)} ({kind}: {have}): a read of the same "
                "record had one there; records must have one structure"
            ) from None
    return node
