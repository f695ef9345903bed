#!/usr/bin/env bash
# First call of a model, each in a fresh process with an empty fastconv plan cache and an
# empty Triton kernel cache: torch (cudnn.benchmark=True) and fastconv.optimize in separate
# processes, through the models suite (its rows carry first_call_s, prepare_s: optimize()
# itself or torch's deepcopy before it, and the steady state).
# Usage (device machine, repository root): bash benchmarks/firstcall.sh CASE... ; env:
# BUDGET (--tune-budget, default "default"), MODE (default eval), PRECISION (bf16), OUT,
# RUNS (default 1): with 2, fastconv runs a second process that keeps the first's plan and
# Triton caches (a user's second run; results under CASE-fastconv-run2); PROVIDERS (default
# "torch fastconv"); TAG (appended to the result names, e.g. to compare
# FASTCONV_COMPILE_WORKERS settings in one call); PRELUDE (Python run before the CLI in
# each process, e.g. "import fastconv.dispatch as d; d.BUILD_WAIT_S = 1e9" for an A/B);
# CASE_TIMEOUT (seconds per process, default 300: without a database the steady state is
# timed only after every candidate the budget left compiling is built, tens of seconds).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
OUT=${OUT:-out}
mkdir -p "$OUT/firstcall"
for case in "$@"; do
  runs=${PROVIDERS:-torch fastconv}
  [ "${RUNS:-1}" = 2 ] && runs="$runs fastconv-run2"
  for run in $runs; do
    provider=${run%-run2}
    [ "$run" = "$provider" ] && rm -rf /tmp/fc-plans /tmp/fc-triton
    FASTCONV_CACHE_DIR=/tmp/fc-plans TRITON_CACHE_DIR=/tmp/fc-triton timeout ${CASE_TIMEOUT:-300} \
      python3 -c "${PRELUDE:-}
import runpy, sys; sys.argv[0] = 'fastconv'; runpy.run_module('fastconv.tools.cli', run_name='__main__')" \
      bench --suite models --cases "$case" --mode "${MODE:-eval}" \
      --precision "${PRECISION:-bf16}" --provider "$provider" --tune-budget "${BUDGET:-default}" \
      --reps 20 --out "$OUT/firstcall/$case-$run${TAG:-}" > "$OUT/firstcall/$case-$run${TAG:-}.log" 2>&1 \
      || echo "$case $run: exit $?"
  done
done
python3 - "$OUT/firstcall" <<'PY'
import glob, json, sys
print(f"{'case':34s} {'run':22s} {'prepare s':>9s} {'first call s':>12s} {'builds s':>8s} "
      f"{'eager ms':>9s} {'graph ms':>9s}")
for f in sorted(glob.glob(sys.argv[1] + "/*/*.json")):
    doc = json.load(open(f))
    run = f.split("/")[-2][len(doc["rows"][0]["case"]) + 1:] if doc["rows"] else ""
    for r in doc["rows"]:
        print(f"{r['case']:34s} {run:22s} {r.get('prepare_s') or float('nan'):9.2f} "
              f"{r.get('first_call_s') or float('nan'):12.1f} "
              f"{r.get('builds_left_s') or float('nan'):8.1f} "
              f"{r.get('ms_p50') or float('nan'):9.3f} {r.get('graph_ms_p50') or float('nan'):9.3f}")
PY
