#!/usr/bin/env bash
# Fill one plan cache by exhaustive tuning (`fastconv tune`) for the tuning database:
# models of the models suite (bf16 eval at their suite batch and size) and bench suites.
# Usage (device): CACHE=/path bash benchmarks/tune_models.sh model:NAME[:BATCH[:SIZE]] suite:NAME ...
# Each item is capped at ITEM_S seconds (default 280); the cache is copied to $OUT after each.
set -uo pipefail
cache=${CACHE:-/tmp/tune-cache}
mkdir -p "$cache" "${OUT:-out}"
for item in "$@"; do
  IFS=: read -r kind name batch size <<< "$item"
  start=$SECONDS
  if [ "$kind" = model ]; then
    args=(--model "$name" --batch "${batch:-32}" --size "${size:-224}" --precision bf16)
  else
    args=(--suite "$name" --mode "${SUITE_MODES:-fwd,dgrad,wgrad}" --precision bf16)
  fi
  FASTCONV_CACHE_DIR=$cache timeout "${ITEM_S:-280}" python3 -m fastconv.cli tune "${args[@]}" \
    > "${OUT:-out}/tune-$name.log" 2>&1 || echo "$item: exit $?"
  echo "$item: $((SECONDS - start)) s, $(tail -1 "${OUT:-out}/tune-$name.log")"
  cp "$cache"/plans-v1.json "${OUT:-out}/plans-tuned.json" 2>/dev/null
done
