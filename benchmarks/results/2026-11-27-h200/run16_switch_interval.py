"""Run 16's wrapper: ``benchmarks/bench_device.py`` (its arguments) under the interpreter
switch interval in ``$SWITCH`` seconds (Python's default is 0.005), to see whether the
train-step stall comes from threads waiting for the GIL."""

import os
import runpy
import sys

sys.setswitchinterval(float(os.environ.get("SWITCH", "0.005")))
print("switch interval", sys.getswitchinterval(), flush=True)
sys.argv = ["benchmarks/bench_device.py", *sys.argv[1:]]
sys.path.insert(0, "benchmarks")
runpy.run_path("benchmarks/bench_device.py", run_name="__main__")
