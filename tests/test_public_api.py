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


def _private_imports(path: pathlib.Path) -> list[str]:
    """The ``grain_rox._...`` modules a Python file imports, or a Markdown page's code imports."""
    text = path.read_text()
    if path.suffix == ".md":
        blocks = text.split("```")[1::2]
        text = "\n".join(b.split("\n", 1)[1] for b in blocks if b.startswith("python"))
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [n for n in names if n.startswith("grain_rox._")]
    return found


def test_examples_notebooks_and_docs_use_only_the_public_api():
    root = pathlib.Path(__file__).resolve().parent.parent
    files = [
        *sorted((root / "examples").glob("*.py")),
        *sorted((root / "notebooks").glob("*.py")),
        root / "README.md",
        *sorted((root / "docs").glob("**/*.md")),
    ]
    assert len(files) > 5
    private = {str(f.relative_to(root)): _private_imports(f) for f in files}
    assert {f: mods for f, mods in private.items() if mods} == {}


def test_the_private_import_finder_finds_them(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```python\nfrom grain_rox._text._convert import x\nimport grain_rox\n```\n")
    assert _private_imports(page) == ["grain_rox._text._convert"]
