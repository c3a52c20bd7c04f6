"""Check that an environment holds every declared dependency at its declared lower bound.

``python tests/smoke/check_lowest.py EXTRA,... [--skip NAME,...]`` (run by ``nox -s oldest``
after its lowest-direct install): for grain_rox's dependencies and those of the named extras in
pyproject.toml, the installed version must equal the lower bound (``>=X`` or ``==X``). A version
above it means something else lifted it (another dependency's own bound, or a missing wheel),
so the declared bound is not what the session tests: raise it, or find what lifts it with
``uv pip tree --invert --package NAME``. Prints each package checked; exits non-zero naming the
ones that are off. Where a package is named twice (``pyarrow`` in ``hf`` and ``test``), the
higher bound counts.
"""

from __future__ import annotations

import argparse
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def declared(extras: list[str], skip: set[str]) -> dict[str, Version]:
    """The lower bound of each dependency of the core and ``extras``, by canonical name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    unknown = set(extras) - set(project["optional-dependencies"])
    if unknown:
        raise SystemExit(f"no such extra(s) {sorted(unknown)} in pyproject.toml")
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    bounds: dict[str, Version] = {}
    for line in lines:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if name == canonicalize_name(project["name"]) or name in skip:
            continue  # a self-reference ([all]) or a package left out on purpose
        lows = [Version(s.version) for s in req.specifier if s.operator in (">=", "==")]
        if not lows:
            raise SystemExit(f"{line!r} in pyproject.toml has no lower bound (>= or ==)")
        bounds[name] = max([*lows, bounds.get(name, Version("0"))])
    return bounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("extras", help="comma-separated extras installed besides the core")
    parser.add_argument("--skip", default="", help="comma-separated packages not installed")
    args = parser.parse_args()
    extras = [e for e in args.extras.split(",") if e]
    skip = {canonicalize_name(s) for s in args.skip.split(",") if s}
    errors = []
    for name, low in sorted(declared(extras, skip).items()):
        try:
            have = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            errors.append(f"{name} is not installed (declared >={low})")
            continue
        print(f"{name:24} {have!s:12} declared >={low}")
        if have != low:
            errors.append(
                f"{name} is {have}, not its declared lower bound {low}: something lifts it "
                f"(`uv pip tree --invert --package {name}` shows what); raise the bound in "
                "pyproject.toml to the version that is tested, with the reason"
            )
    if errors:
        raise SystemExit("lower bounds not met:\n  " + "\n  ".join(errors))
    print("every declared lower bound is what is installed")


if __name__ == "__main__":
    main()
