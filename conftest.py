"""pytest, for the whole checkout: the doctests of the modules that import Apache Beam run only
where the ``[beam]`` extra is installed (the Python 3.12/3.13 and lowest-version sessions leave
it out). Kept here, not inside the package, so the wheel ships no test configuration."""

import importlib.util

_NEEDS_BEAM = ["_metrics.py", "_read.py", "_run.py", "_tokenize.py", "_write.py"]
collect_ignore = (
    [] if importlib.util.find_spec("apache_beam") else [f"grain_rox/_beam/{m}" for m in _NEEDS_BEAM]
)
