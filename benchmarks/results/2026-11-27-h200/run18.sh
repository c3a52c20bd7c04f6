#!/usr/bin/env bash
# Stop 42's one device call: the stall with a device-bound step, its trace, and throughput.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench_out}"; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
nvidia-smi -L; uptime
t0=$SECONDS
S="--only s --rounds ${R:-9} --stall-steps 300 --stall-ms 3 --stall-ways fed,put,host --tokens 2e7"
timeout 150 python3 benchmarks/bench_device.py $S --stall-dim 4096 --out "$out/s4096.json" > "$out/s4096.log" 2>&1
echo "s4096 rc=$? at $((SECONDS-t0)) s"; tail -25 "$out/s4096.log"
timeout 100 python3 benchmarks/trace_stall.py --out /tmp/tr1 --steps 60 --tokens 5e6 > "$out/trace1024.log" 2>&1
echo "trace1024 rc=$? at $((SECONDS-t0)) s"
timeout 80 python3 benchmarks/trace_stall.py --out /tmp/tr4 --steps 40 --dim 4096 --tokens 5e6 > "$out/trace4096.log" 2>&1
echo "trace4096 rc=$? at $((SECONDS-t0)) s"
timeout 130 python3 benchmarks/bench_device.py $S --stall-unroll --out "$out/s1024u.json" > "$out/s1024u.log" 2>&1
echo "s1024u rc=$? at $((SECONDS-t0)) s"; tail -25 "$out/s1024u.log"
timeout 90 python3 benchmarks/bench_device.py --only t --shapes 32x1024 --contenders floor_step,fast,windows1,default,roxxel --rounds 5 --seconds 0.5 --tokens 2e7 --out "$out/t.json" > "$out/t.log" 2>&1
echo "t rc=$? at $((SECONDS-t0)) s"; tail -20 "$out/t.log"
