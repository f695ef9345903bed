#!/usr/bin/env bash
# One device call on a machine of several GPUs: job queues side by side, one per GPU, each
# job a shell command run with CUDA_VISIBLE_DEVICES set and its own OUT ($OUT/gpuI-jobN).
# Usage (device): FASTCONV_GIT_SHA=<sha> DEADLINE_S=540 bash benchmarks/parallel_gpu.sh JOBFILE
# JOBFILE: one line per GPU queue, its jobs separated by " ;; " (each a command such as
# `SUITES=models CASES=resnet50_b256 ... bash benchmarks/run_gpu.sh bench`). Every job is
# cut at the call's deadline (DEADLINE_S after the start); one not started is said so.
# Each GPU runs one process at a time, so the timings of one queue do not share a GPU; the
# host's CPU cores are shared (compilation). Everything written comes back as one archive
# ($OUT/parallel-<time>.tgz: the device returns at most 8 files); printed last: each job's
# exit status and the last lines of its log.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
deadline=$(( $(date +%s) + ${DEADLINE_S:-540} ))
gpu=0
while IFS= read -r line; do
  [ -z "$line" ] && continue
  ( n=0
    while IFS= read -r job; do
      [ -z "${job// }" ] && continue
      dir="$OUT/gpu$gpu-job$n"; mkdir -p "$dir"; echo "$job" > "$dir/command"
      left=$(( deadline - $(date +%s) ))
      if [ $left -le 10 ]; then echo "not started: deadline" > "$dir/status"
      else # its own process group, so that the deadline stops its python processes too
           CUDA_VISIBLE_DEVICES=$gpu OUT="$dir" setsid bash -c "$job" > "$dir/log" 2>&1 &
           pid=$!
           while kill -0 $pid 2>/dev/null && [ "$(date +%s)" -lt $deadline ]; do sleep 1; done
           kill -0 $pid 2>/dev/null && { kill -TERM -- -$pid; sleep 3; kill -KILL -- -$pid; } 2>/dev/null
           wait $pid; echo "exit $?" > "$dir/status"; fi
      n=$((n + 1))
    done < <(echo "$line" | sed 's/ ;; /\n/g') ) &
  gpu=$((gpu + 1))
done < "$1"
wait
for d in "$OUT"/gpu*-job*; do
  echo "== $(basename "$d"): $(cat "$d/status") :: $(cat "$d/command")"
  tail -n ${TAIL_LINES:-8} "$d/log" 2>/dev/null
done
tar czf "$OUT/parallel-$(date +%H%M%S).tgz" -C "$OUT" $(cd "$OUT" && ls -d gpu*-job*) \
  && rm -rf "$OUT"/gpu*-job*
