"""Check a built sdist and wheel of grain_rox: what they hold and what they must not.

``python tests/smoke/check_dist.py DIST_DIR`` (run by ``nox -s build``): the wheel holds every
file of the source tree's ``grain_rox/`` (modules and package data), the LICENSE in its
``.dist-info/licenses/`` and nothing else from outside ``grain_rox/``; its metadata says
``License-Expression: Apache-2.0`` and the version of ``grain_rox/__init__.py`` (the one
version source). The sdist holds README, LICENSE, pyproject.toml and the package, and no
build, cache or output folders. Prints what it checked; exits non-zero naming what is wrong.
"""

from __future__ import annotations

import re
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NEVER = {".nox", ".venv", "bench_out", "demo_out", "dist", "build", "__pycache__", ".git",
         ".hypothesis", ".mypy_cache", ".ruff_cache", ".pytest_cache"}  # fmt: skip
LICENSE = "Apache-2.0"


def source_version() -> str:
    """``__version__`` from the checkout's grain_rox/__init__.py (what hatch reads)."""
    text = (ROOT / "grain_rox" / "__init__.py").read_text()
    found = re.findall(r'^__version__ = "([^"]+)"$', text, flags=re.M)
    if len(found) != 1:
        sys.exit(f"grain_rox/__init__.py must set __version__ once, found {found}")
    return found[0]


def package_files() -> set[str]:
    """Every file under the checkout's grain_rox/ except bytecode, as posix paths from ROOT."""
    return {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "grain_rox").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def only(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    if len(found) != 1:
        sys.exit(f"expected exactly one {pattern} in {dist}, found {[p.name for p in found]}")
    return found[0]


def check_wheel(wheel: Path, expected: set[str]) -> list[str]:
    names = set(zipfile.ZipFile(wheel).namelist())
    dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
    errors = [f"wheel lacks {n}" for n in sorted(expected - names)]
    errors += [f"wheel holds {n} (outside grain_rox/)" for n in sorted(names)
               if n.split("/")[0] not in ("grain_rox", dist_info)]  # fmt: skip
    licenses = sorted(n for n in names if n.startswith(f"{dist_info}/licenses/"))
    if licenses != [f"{dist_info}/licenses/LICENSE"]:
        errors.append(f"wheel should hold {dist_info}/licenses/LICENSE alone, holds {licenses}")
    meta = zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA").decode()
    for field, value in (("License-Expression", LICENSE), ("Version", source_version())):
        if f"\n{field}: {value}\n" not in meta:
            got = re.findall(rf"^{field}: .*$", meta, flags=re.M)
            errors.append(f"wheel metadata should say '{field}: {value}', says {got}")
    errors += [f"wheel holds {n}" for n in sorted(names) if NEVER & set(n.split("/"))]
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    if "grain-rox = grain_rox.cli:main" not in entry_points:
        errors.append(f"wheel has no grain-rox console script: {entry_points!r}")
    if not wheel.name.endswith("-py3-none-any.whl"):
        errors.append(f"wheel is not pure Python: {wheel.name}")
    print(f"{wheel.name}: {len(names)} files, {len(expected)} from grain_rox/ all present")
    return errors


def check_sdist(sdist: Path, expected: set[str]) -> list[str]:
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    wanted = {"README.md", "pyproject.toml", "PKG-INFO", "LICENSE"} | expected
    errors = [f"sdist lacks {n}" for n in sorted(wanted - names)]
    errors += [f"sdist holds {n}" for n in sorted(names) if NEVER & set(n.split("/"))]
    tops = sorted({n.split("/")[0] for n in names})
    print(f"{sdist.name}: {len(names)} files; top level: {' '.join(tops)}")
    return errors


def main() -> None:
    dist = Path(sys.argv[1])
    expected = package_files()
    errors = check_wheel(only(dist, "*.whl"), expected)
    errors += check_sdist(only(dist, "*.tar.gz"), expected)
    if errors:
        sys.exit("dist check failed:\n  " + "\n  ".join(errors))
    print("dist contents OK")


if __name__ == "__main__":
    main()
