"""Every notebook in notebooks/ runs top to bottom (as the percent-format script it is)."""

from __future__ import annotations

import pathlib
import runpy

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.py"))


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS] == [
        "01_quickstart.py",
        "02_pipelines.py",
        "03_multihost_checkpointing.py",
    ]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(notebook, monkeypatch, tmp_path):
    if notebook.stem.startswith("02"):
        pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(notebook), run_name="__main__")
