"""The main job (examples/train_demo.py) runs end to end: a short version of `nox -s demo`."""

from __future__ import annotations

import pathlib
import re
import runpy
import sys

import pytest

DEMO = pathlib.Path(__file__).parent.parent / "examples" / "train_demo.py"


@pytest.mark.slow
@pytest.mark.parametrize("packing", [None, "best_fit"])
def test_demo_trains_checkpoints_and_resumes_bit_exactly(tmp_path, monkeypatch, capsys, packing):
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
            *(["--packing", packing] if packing else []),
        ]
    )
    out = capsys.readouterr().out
    rows = f"whole documents, packed ({packing})" if packing else "concatenated"
    assert re.search(rf"\n  rows +{re.escape(rows)}\n", out), out
    assert "batches bit-identical after resume  True" in out
    assert "losses bit-identical after resume   True" in out
    assert code == 0, out


def test_demo_reads_a_saved_hf_dataset_as_its_own_source(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    import argparse

    import numpy as np

    import grain_rox

    module = runpy.run_path(str(DEMO), run_name="train_demo")
    texts = [f"user document number {i} " * (i + 1) for i in range(30)]
    datasets.Dataset.from_dict({"body": texts, "id": list(range(30))}).save_to_disk(
        str(tmp_path / "saved")
    )
    args = argparse.Namespace(
        text=[], jsonl=[], hf=[str(tmp_path / "saved")], text_column="body", rox=[]
    )
    build_sources = module["build_sources"]
    builtin = grain_rox.builtin_documents
    monkeypatch.setattr(  # a small slice of the embedded prose keeps this test quick
        grain_rox, "builtin_documents", lambda what: builtin(what, limit=20)
    )
    paths = build_sources(args, str(tmp_path / "out"))
    assert list(paths) == ["yours", "prose"]
    tok = module["pick_tokenizer"]()
    with grain_rox.open_rox(paths["yours"]) as corpus:
        want = np.concatenate([np.append(tok.encode(t), tok.eos_id) for t in texts])
        assert corpus.num_documents == 30
        assert np.array_equal(corpus.tokens(0, want.size), want.astype(corpus.dtype))
