#!/usr/bin/env bash
# The accelerator benchmark (bench_device.py) as one prepared run on a lent GPU machine that
# reaches no package registry: the wheels it lacks travel in .whl/ (fetch them here first,
# as benchmarks/README.md shows), grain_rox comes from the checkout. The table and the JSON
# land in $OUT (the device tool's folder) or bench_out/. Extra arguments go to bench_device.py
# (e.g. --quick, --only t); with --trace first, the rest go to trace_stall.py instead.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench_out}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
export PYTHONUNBUFFERED=1
nvidia-smi -L || true
python3 -c "import jax, grain, grain_rox; print('jax', jax.__version__, jax.devices())"
if [ "${1:-}" = "--trace" ]; then  # where the stall goes: traces of the fed step loop
  shift
  python3 benchmarks/trace_stall.py --out "$out" "$@" 2>&1 | tee "$out/trace.log"
  exit
fi
python3 benchmarks/bench_device.py --out "$out/device.json" "$@" 2>&1 | tee "$out/device.log"
