"""Every public name has a docstring with an example (run as a doctest by pytest)."""

from __future__ import annotations

import ast
import inspect
import pathlib

import grain_rox


def test_every_public_name_has_a_runnable_example():
    missing = [
        name
        for name in grain_rox.__all__
        if ">>>" not in (inspect.getdoc(getattr(grain_rox, name)) or "")
    ]
    assert missing == []


def test_the_lazy_names_resolve_and_are_listed():
    assert set(grain_rox._LAZY) <= set(grain_rox.__all__)
    assert sorted(set(grain_rox.__all__)) == sorted(grain_rox.__all__)  # no duplicates


def test_the_type_checking_imports_match_the_lazy_table():
    tree = ast.parse(pathlib.Path(grain_rox.__file__).read_text())
    block = next(
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    )
    imported = {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == grain_rox._LAZY
