"""The package's layers import only downward (DESIGN.md §3): the folders are the picture.

``_format`` and ``_order`` import nothing of ours; ``_text`` stands on ``_format``; ``_sources`` on
``_format``/``_text``/``_order``; ``_pipeline`` and ``_roxxel`` on ``_sources`` (``_roxxel`` for
the identity its states carry); ``_devices`` on ``_pipeline``; the public face (``__init__``, ``cli``, ``testing`` and ``_testing``) on anything.
An import inside a layer is fine; an import of a layer ranked higher is not.
"""

from __future__ import annotations

import ast
import collections
import pathlib
import sys

import grain_rox

PACKAGE = pathlib.Path(grain_rox.__file__).parent
DRAWING = PACKAGE.parent / "docs" / "architecture.md"

# A module may import a layer only of a lower rank (or its own layer).
RANK = {
    "_format": 0,
    "_order": 0,
    "_text": 1,
    "_sources": 2,
    "_roxxel": 3,
    "_pipeline": 3,
    "_devices": 4,
    "_testing": 5,
    "__init__": 5,
    "cli": 5,
    "_cli": 5,
    "testing": 5,
    "_beam": 5,
    "beam": 5,
}
# Layers of the same rank that must not import each other either.
INDEPENDENT = {frozenset({"_format", "_order"}), frozenset({"_pipeline", "_roxxel"})}


def _layer(module: str) -> str:
    """``grain_rox._sources._batches`` -> ``_sources``; ``grain_rox`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, module) of every ``grain_rox`` module ``path`` imports, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: use absolute grain_rox imports"
            if node.module == "grain_rox":  # from grain_rox import X: X may be a subpackage
                found += [(node.lineno, f"grain_rox.{a.name}") for a in node.names]
            elif node.module:
                found.append((node.lineno, node.module))
    return [(line, m) for line, m in found if m == "grain_rox" or m.startswith("grain_rox.")]


def _modules() -> list[pathlib.Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_sits_in_a_known_layer():
    unknown = [
        str(p.relative_to(PACKAGE))
        for p in _modules()
        if p.relative_to(PACKAGE).parts[0].removesuffix(".py") not in RANK
    ]
    assert unknown == [], f"add these to RANK in {__file__} (and to DESIGN.md §3): {unknown}"


def test_imports_only_go_down_the_layers():
    upward = []
    for path in _modules():
        here = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for line, module in _imports(path):
            there = _layer(module)
            if there == "__init__" and module != "grain_rox":
                there = module.split(".")[1]  # grain_rox.X: a public name or a top module
            if there not in RANK:  # from grain_rox import SomePublicName: the public face
                there = "__init__"
            if there == here:
                continue
            if RANK[there] > RANK[here] or (
                RANK[there] == RANK[here] and frozenset({here, there}) in INDEPENDENT
            ):
                upward.append(f"{path.relative_to(PACKAGE)}:{line} imports {module}")
    assert upward == []


def test_the_bottom_layers_import_nothing_of_ours():
    for layer in ("_format", "_order"):
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            outside = [m for _, m in _imports(path) if _layer(m) != layer]
            assert outside == [], f"{path.relative_to(PACKAGE)} imports {outside}"


def _layer_graph() -> dict[tuple[str, str], int]:
    """(importing layer, imported layer) -> number of module-level import lines."""
    edges: collections.Counter[tuple[str, str]] = collections.Counter()
    for path in _modules():
        here = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for _, module in _imports(path):
            there = _layer(module)
            if there == "__init__" and module != "grain_rox":
                there = module.split(".")[1]
            if there in RANK and there != here:
                edges[here, there] += 1
    return dict(sorted(edges.items()))


def render_drawing() -> str:
    """docs/architecture.md: the layers and every import between them, drawn from the code."""
    modules = collections.Counter(
        p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in _modules()
    )
    lines = [
        "# The package's layers",
        "",
        "Drawn from the code by `python tests/test_layering.py --write`; `tests/test_layering.py`",
        "fails when this drawing is stale or an arrow points up. An arrow `A --> B` means modules",
        "of `A` import `B` (the label counts the import statements). Layers further down the",
        "drawing import nothing above them; `_format` and `_order` import nothing of ours.",
        "",
        "```mermaid",
        "flowchart TD",
    ]
    lines += [
        f'    n{layer}["{layer} ({modules[layer]} module{"s" * (modules[layer] > 1)})"]'
        for layer in sorted(RANK, key=lambda name: (-RANK[name], name))
        if modules[layer]
    ]
    lines += [f"    n{src} -->|{count}| n{dst}" for (src, dst), count in _layer_graph().items()]
    lines += ["```", ""]
    return "\n".join(lines)


def test_the_architecture_drawing_is_current():
    assert DRAWING.exists() and DRAWING.read_text() == render_drawing(), (
        f"{DRAWING} is stale: run `python tests/test_layering.py --write`"
    )


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    DRAWING.parent.mkdir(exist_ok=True)
    DRAWING.write_text(render_drawing())
    print(f"wrote {DRAWING}")
