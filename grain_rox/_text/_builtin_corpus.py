"""The embedded default corpus: real text that every machine with Python already has.

* ``"code"``: the standard library's own ``.py`` sources (about 30 MB, ~10M cl100k tokens),
  one document per file, in sorted path order (``site-packages`` and caches excluded).
* ``"prose"``: the reference manual's topics shipped in ``pydoc_data.topics`` plus the
  standard library's long docstrings (modules, classes, functions; > 200 characters).

Both are deterministic for a given Python build, need no network, and are large enough to
train a small language model on.
"""

from __future__ import annotations

import ast
import os
import sysconfig
from collections.abc import Iterator

BUILTIN_CORPORA = ("code", "prose")
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
_MIN_DOCSTRING = 200


def stdlib_dir() -> str:
    """The directory of this interpreter's standard library sources."""
    return sysconfig.get_paths()["stdlib"]


def _stdlib_sources(skip: set[str] = _SKIP_DIRS) -> Iterator[str]:
    for root, dirs, files in os.walk(stdlib_dir()):
        dirs[:] = sorted(d for d in dirs if d not in skip)
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(root, name)


def _read_source(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (UnicodeDecodeError, OSError):
        return None  # a few test fixtures are deliberately not UTF-8


def code_documents() -> Iterator[str]:
    """Yield the standard library's ``.py`` files, one document each."""
    for path in _stdlib_sources():
        text = _read_source(path)
        if text:
            yield text


def prose_documents() -> Iterator[str]:
    """Yield ``pydoc_data`` topics, then the standard library's long docstrings."""
    from pydoc_data.topics import topics

    for key in sorted(topics):
        yield topics[key]
    skip = _SKIP_DIRS | {"test", "tests", "idle_test"}
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for path in _stdlib_sources(skip):
        text = _read_source(path)
        if not text:
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, kinds):
                doc = ast.get_docstring(node)
                if doc and len(doc) > _MIN_DOCSTRING:
                    yield doc


def builtin_documents(name: str, *, limit: int | None = None) -> Iterator[str]:
    """Yield the documents of an embedded corpus: real text every machine with Python has.

    ``"code"`` is the standard library's ``.py`` sources, one document per file in sorted path
    order (about 30 MB); ``"prose"`` is the reference manual's topics and the standard library's
    long docstrings. Both are deterministic for a given Python build and need no network; the
    demo and ``grain-rox convert --builtin`` use them.

    Args:
      name: ``"code"`` or ``"prose"``.
      limit: stop after this many documents (default: all of them).

    Returns:
      An iterator of ``str`` documents, read lazily.

    Raises:
      ValueError: an unknown ``name`` (raised when iteration starts).

    >>> from grain_rox import builtin_documents
    >>> docs = list(builtin_documents("prose", limit=2))
    >>> len(docs), all(isinstance(d, str) and d for d in docs)
    (2, True)
    """
    if name == "code":
        docs = code_documents()
    elif name == "prose":
        docs = prose_documents()
    else:
        raise ValueError(f"unknown built-in corpus {name!r}; choose one of {BUILTIN_CORPORA}")
    for i, doc in enumerate(docs):
        if limit is not None and i >= limit:
            return
        yield doc
