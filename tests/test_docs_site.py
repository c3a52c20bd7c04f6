"""The documentation site: ``mkdocs build --strict`` passes (a warning fails it), the API page
documents every public name, every page is in the navigation, every page's examples run as
written, in order, in an empty directory, and the figures are what docs/figures.py draws."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import pathlib
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator

import pytest

import grain_rox

ROOT = pathlib.Path(__file__).parent.parent
DOCS = ROOT / "docs"
NOT_RUN = "<!-- not run -->"  # before a block that needs a GPU or the network: shown, not run
MAX_NOT_RUN = 2  # keep such blocks few
PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))


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
    listed = re.findall(r"^\s+- [^:]+: (\S+\.md)$", nav, flags=re.MULTILINE)
    assert sorted(listed) == PAGES


def code_blocks(text: str) -> Iterator[tuple[int, str, str, bool]]:
    """(line, language, body, marked not-run) of each ```python / ```bash block of a page."""
    for m in re.finditer(r"^(<!-- not run -->\n)?```(python|bash)\n(.*?)^```$", text, re.M | re.S):
        yield text.count("\n", 0, m.start(2)) + 1, m[2], m[3], m[1] is not None


def run_cli(line: str, where: str) -> None:
    """One ``grain-rox`` line, through the CLI's entry point in this process (the console
    script itself is run by test_readme and test_cli); a non-zero status fails."""
    from grain_rox import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(shlex.split(line, comments=True)[1:])
    assert status == 0, f"{where}: {line}\n{out.getvalue()}{err.getvalue()}"


def run_page(page: str) -> tuple[dict[str, object], int, int]:
    """Run a page's blocks top to bottom in the current directory: python blocks in one
    namespace, each ``print(...)  # text`` line's output checked against its comment (the
    first printed lines, in order), and the ``grain-rox`` lines of bash blocks (pip, git and
    the like are not run). Returns the namespace, blocks run, blocks marked not run."""
    text = (DOCS / page).read_text()
    namespace: dict[str, object] = {"__name__": "__docs__"}
    ran = skipped = 0
    for line, lang, body, not_run in code_blocks(text):
        where = f"docs/{page}:{line}"
        if not_run:
            skipped += 1
            continue
        if lang == "bash":
            commands = [c for c in body.splitlines() if c.startswith("grain-rox ")]
            for command in commands:
                run_cli(command, where)
            ran += bool(commands)
            continue
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(body, where, "exec"), namespace)
        expected = re.findall(r"^\s*print\(.*\)  # (.*)$", body, flags=re.MULTILINE)
        lines = printed.getvalue().splitlines()
        assert lines[: len(expected)] == expected, f"{where}\n{body}"
        ran += 1
    return namespace, ran, skipped


RUNNABLE = [p for p in PAGES if any(True for _ in code_blocks((DOCS / p).read_text()))]


@pytest.mark.parametrize("page", RUNNABLE)
def test_every_page_runs_top_to_bottom(page, tmp_path, monkeypatch):
    """Each page in a fresh empty directory, as a reader would run it."""
    if page == "beam.md":  # the [beam] extra: not in the 3.12/3.13 and lowest-version sessions
        pytest.importorskip("apache_beam")
    if page == "object_storage.md":  # fsspec: with the [hf] extra (datasets), [gcs] or [s3]
        pytest.importorskip("fsspec")
    monkeypatch.chdir(tmp_path)
    namespace, ran, _ = run_page(page)
    assert ran >= 1
    if page == "index.md":
        assert ran == 3  # its shell block (3 grain-rox lines) and two python blocks
        assert namespace["batch"]["inputs"].shape == (8, 64)  # type: ignore[index]


def test_few_blocks_are_shown_without_running():
    marked = [
        (p, line)
        for p in PAGES
        for line, *_, not_run in code_blocks((DOCS / p).read_text())
        if not_run
    ]
    assert len(marked) <= MAX_NOT_RUN, marked
    assert all(p in RUNNABLE for p in ("getting_started.md", "concepts.md", "trainer.md", "cli.md"))


def test_the_figures_are_what_the_script_draws(tmp_path):
    """docs/figures/*.svg are current: docs/figures.py draws them again byte for byte (with the
    matplotlib version that drew them; regenerate with ``python docs/figures.py``)."""
    matplotlib = pytest.importorskip("matplotlib")
    committed = sorted((DOCS / "figures").glob("*.svg"))
    versions = {re.search(r"Matplotlib v([\d.]+)", p.read_text())[1] for p in committed}  # type: ignore[index]
    if versions != {matplotlib.__version__}:
        pytest.skip(f"figures drawn with matplotlib {versions}, this is {matplotlib.__version__}")
    if sys.version_info[:2] != (3, 11):  # the packing figure reads the embedded Python docs
        pytest.skip(
            "figures are drawn on Python 3.11 (CI's main stack): the embedded corpus differs"
        )
    spec = importlib.util.spec_from_file_location("docs_figures", DOCS / "figures.py")
    assert spec is not None and spec.loader is not None
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    figures.write_figures(tmp_path)
    drawn = sorted(tmp_path.glob("*.svg"))
    assert [p.name for p in drawn] == [p.name for p in committed]
    stale = [p.name for p in committed if p.read_bytes() != (tmp_path / p.name).read_bytes()]
    assert not stale, f"{stale} are stale: run python docs/figures.py and commit docs/figures/"
    pages = "".join((DOCS / p).read_text() for p in PAGES)
    assert all(f"figures/{p.name}" in pages for p in committed)  # each one is shown somewhere
