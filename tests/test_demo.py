"""The main job (examples/train_demo.py) runs end to end: a short version of `nox -s demo`."""

from __future__ import annotations

import pathlib
import runpy
import sys

import pytest

DEMO = pathlib.Path(__file__).parent.parent / "examples" / "train_demo.py"


@pytest.mark.slow
def test_demo_trains_checkpoints_and_resumes_bit_exactly(tmp_path, monkeypatch, capsys):
    pytest.importorskip("flax")
    pytest.importorskip("optax")
    module = runpy.run_path(str(DEMO), run_name="train_demo")
    monkeypatch.setattr(sys, "argv", [str(DEMO)])
    monkeypatch.chdir(tmp_path)  # a relative --out, as `nox -s demo` uses
    code = module["main"](
        [
            "--out",
            "out",
            "--phase1",
            "20",
            "--phase2",
            "20",
            "--checkpoint-step",
            "30",
            "--min-loss-drop",
            "0.1",
        ]
    )
    out = capsys.readouterr().out
    assert "batches bit-identical after resume  True" in out
    assert "losses bit-identical after resume   True" in out
    assert code == 0, out
