#!/usr/bin/env bash
# Issue 21: what a process without tuning-database entries reaches. Per suite: a loop over
# its layers until every choice is final (benchmarks/upgrade_check.py, default budget, the
# database off, an empty plan cache), then `fastconv bench` in a new process on that cache.
# Usage (device): FASTCONV_GIT_SHA=<sha> bash benchmarks/upgrade_check.sh SUITE...
set -uo pipefail
out=${OUT:-out}/upgrade
mkdir -p "$out"
source "$(dirname "$0")/device_env.sh"
export FASTCONV_TUNING_DB=off
for suite in "$@"; do
  export FASTCONV_CACHE_DIR=/tmp/upgrade-cache-$suite
  rm -rf "$FASTCONV_CACHE_DIR"
  timeout "${LOOP_S:-300}" python3 benchmarks/upgrade_check.py "$suite" --timeout "${WAIT_S:-240}" \
    > "$out/$suite-loop.log" 2>&1 || echo "$suite loop: exit $?"
  grep -E "first round" "$out/$suite-loop.log"
  timeout "${SUITE_S:-200}" python3 -m fastconv.tools.cli bench --suite "$suite" --precision bf16 \
    --mode fwd --provider fastconv,torch --tune-budget default --out "$out/after" \
    > "$out/$suite-after.log" 2>&1 || echo "$suite bench: exit $?"
  grep geomean "$out/$suite-after.log"
done
tar czf "${OUT:-out}/upgrade-$(date +%H%M%S).tgz" -C "$out" . && rm -rf "$out"
