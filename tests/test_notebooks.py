"""Every notebook in notebooks/ runs top to bottom (as the percent-format script it is)."""

from __future__ import annotations

import pathlib
import runpy

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.py"))


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS][:1] == ["01_quickstart.py"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(notebook, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(notebook), run_name="__main__")
