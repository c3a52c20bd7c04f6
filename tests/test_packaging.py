"""The packaging facts pyproject.toml states, checked against the tree and the installed package.

One version source (grain_rox/__init__.py, read by hatch), the license text beside the license
field, an ``[all]`` extra that is every feature extra, and dependency ranges that are lower
bounds (tested by ``nox -s oldest``) with upper bounds only where a break is known.
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

import grain_rox

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
# Extras for working on grain_rox, not for using it: [all] leaves them out.
DEVELOPMENT_EXTRAS = {"test", "notebooks", "docs", "dev"}
# Bounds other than a lone >=, each for a reason stated in pyproject.toml: the Grain releases
# the suite passes on, and the roxxel release the format tests compare against.
BOUNDED = {"grain": "<0.2.19,>=0.2.17", "roxxel": "==0.9.14"}


def test_the_version_has_one_source_grain_rox_init():
    assert "version" not in PROJECT, "pyproject.toml sets a static version: use dynamic only"
    assert PROJECT["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["hatch"]["version"] == {"path": "grain_rox/__init__.py"}
    text = (ROOT / "grain_rox" / "__init__.py").read_text()
    assert re.findall(r'^__version__ = "([^"]+)"$', text, flags=re.M) == [grain_rox.__version__]
    assert str(Version(grain_rox.__version__)) == grain_rox.__version__  # PEP 440, normalized


def test_the_installed_metadata_has_the_same_version():
    installed = metadata.version("grain_rox")
    assert installed == grain_rox.__version__, (
        f"grain_rox is installed as {installed} but grain_rox/__init__.py says "
        f"{grain_rox.__version__}: reinstall it (uv pip install -e .)"
    )


def test_the_license_field_and_file_agree():
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    lines = [line.strip() for line in (ROOT / "LICENSE").read_text().splitlines()[:3]]
    assert lines == [
        "Apache License",
        "Version 2.0, January 2004",
        "http://www.apache.org/licenses/",
    ]
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]  # PEP 639


def test_all_is_every_feature_extra():
    extras = PROJECT["optional-dependencies"]
    (line,) = extras["all"]
    req = Requirement(line)
    assert req.name == PROJECT["name"]
    assert req.extras == set(extras) - DEVELOPMENT_EXTRAS - {"all"}


def test_every_dependency_has_a_lower_bound_and_no_unexplained_upper_bound():
    lines = list(PROJECT["dependencies"])
    for name, extra in PROJECT["optional-dependencies"].items():
        lines += [] if name == "all" else extra
    bounded = {}
    for line in lines:
        req = Requirement(line)
        ops = [s.operator for s in req.specifier]
        if ops != [">="]:
            bounded[req.name] = str(req.specifier)
    assert bounded == BOUNDED, "a lower bound (>=) alone, or a reason in pyproject.toml"


def test_the_python_classifiers_start_at_requires_python():
    assert PROJECT["requires-python"] == ">=3.11"
    versions = [c.rsplit(" :: ", 1)[1] for c in PROJECT["classifiers"]]
    assert [v for v in versions if v.startswith("3.")] == ["3.11", "3.12", "3.13"]
