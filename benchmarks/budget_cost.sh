#!/usr/bin/env bash
# What the default tuning budget costs in steady-state speed (issue 21): each suite benched
# twice in fresh processes with empty plan caches, `--tune-budget default` then `exhaustive`
# (fastconv and torch, bf16 channels-last forward, interleaved eager timings and CUDA-graph
# replays), the per-layer fastconv times compared by benchmarks/budget_cost.py.
# Usage (device): FASTCONV_GIT_SHA=<sha> bash benchmarks/budget_cost.sh SUITE...
# BUDGETS (default "default exhaustive"), SUITE_S caps each bench (default 280 s). The
# exhaustive run's plan cache is kept as $OUT/plans-<suite>.json (for the tuning database).
set -uo pipefail
out=${OUT:-out}/budget
mkdir -p "$out"
source "$(dirname "$0")/device_env.sh"
for suite in "$@"; do
  for budget in ${BUDGETS:-default exhaustive}; do
    cache=/tmp/budget-cache-$suite-$budget
    rm -rf "$cache"
    start=$SECONDS
    FASTCONV_CACHE_DIR=$cache timeout "${SUITE_S:-280}" python3 -m fastconv.tools.cli bench \
      --suite "$suite" --precision bf16 --mode fwd --provider fastconv,torch \
      --tune-budget "$budget" --out "$out/$budget" > "$out/$suite-$budget.log" 2>&1 \
      || echo "$suite $budget: exit $?"
    echo "$suite $budget: $((SECONDS - start)) s; $(grep geomean "$out/$suite-$budget.log")"
    [ "$budget" = exhaustive ] && cp "$cache/plans-v1.json" "${OUT:-out}/plans-$suite.json" 2>/dev/null
  done
done
python3 benchmarks/budget_cost.py "$out/default" "$out/exhaustive" | tee "$out/summary.log"
tar czf "${OUT:-out}/budget-$(date +%H%M%S).tgz" -C "$out" . && rm -rf "$out"
