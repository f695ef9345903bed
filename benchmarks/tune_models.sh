#!/usr/bin/env bash
# Fill one plan cache by exhaustive tuning (`fastconv tune`) for the tuning database:
# models of the models suite (eval at their suite batch and size; TRAIN=1: a training step)
# bench suites and single convolutions (shape:SPEC, SPEC as `fastconv tune --shape` takes it),
# in PRECISION (default bf16: fp16, tf32 for the database's other columns).
# Usage (device): CACHE=/path bash benchmarks/tune_models.sh model:NAME[:BATCH[:SIZE]] suite:NAME
#   shape:SPEC ...  (SUITE_MODES: the modes of suites and shapes, default fwd,dgrad,wgrad)
# Each item is capped at ITEM_S seconds (default 280); the cache is copied to $OUT after each.
# Then (here, with the cache that came back) `build_tuning_db.py --keep --capability 9.0 FILE`.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
cache=${CACHE:-/tmp/tune-cache}
logs=${OUT:-out}/tune-logs  # tarred at the end: at most 8 files come back from a device call
mkdir -p "$cache" "$logs"
prec=${PRECISION:-bf16}
train=(); [ "${TRAIN:-0}" = 1 ] && train=(--train)
tune=(python3 -m fastconv.tools.cli tune)
for item in "$@"; do
  IFS=: read -r kind name batch size <<< "$item"
  start=$SECONDS
  if [ "$kind" = model ]; then
    args=(--model "$name" --batch "${batch:-32}" --size "${size:-224}" --precision "$prec"
          "${train[@]}")
  elif [ "$kind" = shape ]; then
    name=${item#shape:}
    args=(--shape "$name" --mode "${SUITE_MODES:-fwd,dgrad,wgrad}" --precision "$prec")
    name=${name//[:=]/_}
  else
    args=(--suite "$name" --mode "${SUITE_MODES:-fwd,dgrad,wgrad}" --precision "$prec")
  fi
  FASTCONV_CACHE_DIR=$cache timeout "${ITEM_S:-280}" "${tune[@]}" "${args[@]}" \
    > "$logs/tune-$name-$prec.log" 2>&1 || echo "$item: exit $?"
  echo "$item: $((SECONDS - start)) s, $(tail -1 "$logs/tune-$name-$prec.log")"
  cp "$cache"/plans-v1.json "${OUT:-out}/plans-tuned.json" 2>/dev/null
done
tar czf "${OUT:-out}/tune-logs-$prec.tgz" -C "$logs" . && rm -rf "$logs"
