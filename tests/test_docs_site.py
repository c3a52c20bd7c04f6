"""The documentation site: ``mkdocs build --strict`` passes (a warning fails it), the API page
documents every public name, and the landing page's examples run as written, in order."""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

import grain_rox

ROOT = pathlib.Path(__file__).parent.parent
DOCS = ROOT / "docs"
GRAIN_ROX = os.path.join(os.path.dirname(sys.executable), "grain-rox")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    pytest.importorskip("material")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    return out


def test_the_api_page_documents_every_public_name(site):
    api = (DOCS / "api.md").read_text()
    assert re.findall(r"^::: grain_rox\.(\w+)$", api, flags=re.MULTILINE) == grain_rox.__all__
    html = (site / "api" / "index.html").read_text()
    documented = set(re.findall(r'id="grain_rox\.(\w+)"', html))
    assert documented == set(grain_rox.__all__)
    # Each docstring's doctest is shown as code, not as Markdown (a blockquote, links).
    assert "<blockquote" not in html
    assert "&gt;&gt;&gt;" in html


def test_every_page_in_the_docs_folder_is_in_the_navigation():
    config = (ROOT / "mkdocs.yml").read_text()
    nav = config[config.index("\nnav:") : config.index("\nmarkdown_extensions:")]
    listed = re.findall(r"^  - [^:]+: (\S+\.md)$", nav, flags=re.MULTILINE)
    assert sorted(listed) == sorted(p.name for p in DOCS.glob("*.md"))


def test_the_landing_page_runs_top_to_bottom(tmp_path, monkeypatch):
    """Its python blocks in one namespace, printing what their comments say, and its grain-rox
    lines through the installed console script, in an empty directory."""
    text = (DOCS / "index.md").read_text()
    blocks = re.findall(r"```(python|bash)\n(.*?)```", text, flags=re.DOTALL)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    ran = 0
    for index, (lang, body) in enumerate(blocks):
        if lang == "bash":
            for line in body.splitlines():
                if not line.startswith("grain-rox "):
                    continue  # pip and git lines: the install section
                argv = shlex.split(line, comments=True)
                proc = subprocess.run([GRAIN_ROX, *argv[1:]], capture_output=True, text=True)
                assert proc.returncode == 0, f"docs/index.md: {line}\n{proc.stdout}{proc.stderr}"
                ran += 1
            continue
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(body, f"docs/index.md[block {index}]", "exec"), namespace)
        expected = re.findall(r"^\s*print\(.*\)  # (.*)$", body, flags=re.MULTILINE)
        lines = printed.getvalue().splitlines()
        assert lines[: len(expected)] == expected, body
        ran += 1
    assert ran == 5
    assert namespace["batch"]["inputs"].shape == (8, 64)  # type: ignore[index]
