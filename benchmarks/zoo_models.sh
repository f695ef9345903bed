#!/usr/bin/env bash
# The models suite over issue 22's zoo, one process per model (each with its own tuning
# budget, as a user's run gets), bf16 channels-last, fastconv (optimize) against torch.
# Usage (device): FASTCONV_GIT_SHA=<sha> MODE=eval|train bash benchmarks/zoo_models.sh CASE...
# (PROVIDERS: default torch,fastconv; PER_MODEL_S: each model's limit, default 150 s)
# Logs and JSON in $OUT/zoo-$MODE-<time>.tgz; printed: each model's fastconv rows.
set -uo pipefail
mode=${MODE:-eval}
out=${OUT:-out}/zoo-$mode
mkdir -p "$out"
source "$(dirname "$0")/device_env.sh"
for case in "$@"; do
  FASTCONV_CACHE_DIR=/tmp/zoo-cache-$case timeout ${PER_MODEL_S:-150} python3 -m fastconv.tools.cli bench \
    --suite models --cases "$case" --precision bf16 --mode "$mode" --provider ${PROVIDERS:-torch,fastconv} \
    --tune-budget default --out "$out" > "$out/$case.log" 2>&1 || echo "$case: exit $?"
  for f in "$out"/models-*.json; do [ -e "$f" ] && mv "$f" "$out/$case-$(basename "$f")"; done
  rm -f "$out"/models-*.csv
done
grep -hE "^\S+ +fastconv" "$out"/*.log  # (every fastconv provider's row)
# (the device returns few files: one archive per call)
tar czf "$out-$(date +%H%M%S).tgz" -C "$out" . && rm -rf "$out"
