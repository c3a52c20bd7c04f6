"""Every Python example in README.md runs as written, in order, on small real data."""

from __future__ import annotations

import pathlib
import re

import pytest

README = pathlib.Path(__file__).parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 4


def test_readme_examples_run_in_order(tmp_path, monkeypatch):
    pytest.importorskip("tiktoken")
    from grain_rox import write_rox
    from grain_rox._builtin_corpus import builtin_documents

    monkeypatch.chdir(tmp_path)
    # The data the examples name: small slices of the embedded corpus.
    write_rox(builtin_documents("code", limit=40), "data/code.rox", tokenizer="bytes")
    write_rox(builtin_documents("prose", limit=120), "data/prose.rox", tokenizer="bytes")
    namespace: dict[str, object] = {}
    for index, block in enumerate(BLOCKS):
        exec(compile(block, f"README.md[python block {index}]", "exec"), namespace)
