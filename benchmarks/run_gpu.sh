#!/usr/bin/env bash
# One device call: GPU tests, `fastconv check`, and the benchmark suites.
# Usage (on the device machine, from the repository root):
#   FASTCONV_GIT_SHA=<sha> bash benchmarks/run_gpu.sh [tests] [ptests] [check] [bench] [sweep] [launch]
# bench reads SUITES, PRECISIONS, MODES, PROVIDERS, CASES, BENCH_ARGS (more options, e.g.
# "--breakdown --tune-budget default"); TESTS selects pytest -k expressions,
# TEST_FILES the files (default: every tests/test_gpu*.py). All of them (234 tests at 976db49)
# take more than 330 s in 8 ptests processes on the H100 machine: test_gpu_depthwise.py (105)
# in one call, the rest in another.
# Full logs and results go under $OUT (default: ./out); bench results come back as
# results-<time>.tgz, one per bench step (JSON, CSV, PNG); the last lines are a short summary.
# At most 8 files come back from a device call: keep $OUT small (logs, tarballs).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
# SRC: another source tree to measure (an older commit's src/, for before/after runs), with
# SRC_SHA its commit: the results then record that sha, not the working tree's
source "$(dirname "$0")/device_env.sh"
if [ -n "${SRC:-}" ]; then export FASTCONV_GIT_SHA=${SRC_SHA:?SRC_SHA: the commit of SRC}; fi
export FASTCONV_CACHE_DIR=${FASTCONV_CACHE_DIR:-$OUT/plancache}
# A previous call's dispatch choices and cuDNN plans (its $OUT/plancache copied to the
# git-ignored .plancache/ and carried) save the autotuning a second time.
if [ -d .plancache ] && [ ! -e "$FASTCONV_CACHE_DIR" ]; then cp -r .plancache "$FASTCONV_CACHE_DIR"; fi
steps=${*:-tests check bench}
status=0
{ echo "git ${FASTCONV_GIT_SHA:-?}"
  python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'cudnn', torch.backends.cudnn.version())"
  python3 -c "from fastconv.backends.cudnn import CudnnBackend as C; print('cudnn backend:', C.available())"
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
} 2>&1 | tee "$OUT/env.log"  # the versions every log of this call ran under
for step in $steps; do
  case $step in
    # Correctness runs use heuristic dispatch: benchmark mode would compile and time every
    # tile candidate for each of hundreds of random keys (each candidate is checked on its own
    # by test_every_candidate_config_is_correct).
    tests) FASTCONV_DISPATCH=heuristic timeout ${TESTS_TIMEOUT:-240} python3 -m pytest -q -m gpu ${TEST_FILES:-tests/test_gpu*.py} -k "${TESTS:-}" 2>&1 | tee -a "$OUT/gpu_tests.log" | tail -15 || status=1 ;;
    # the same tests spread over JOBS processes (round-robin by test id): compilation is
    # CPU-bound and the device has 16 cores; one log, the processes' summaries last
    ptests) python3 -m pytest -q -m gpu --co ${TEST_FILES:-tests/test_gpu*.py} -k "${TESTS:-}" 2>/dev/null \
              | grep '::' > "$OUT/ids.txt"
            for j in $(seq 0 $((${JOBS:-8} - 1))); do
              awk -v j=$j -v n=${JOBS:-8} 'NR % n == j' "$OUT/ids.txt" > "$OUT/ids-$j.txt"
              # -v: each test's id and result, so a process cut by the timeout shows which ran
              (FASTCONV_DISPATCH=heuristic timeout ${TESTS_TIMEOUT:-240} xargs -r -a "$OUT/ids-$j.txt" \
                 python3 -m pytest -v --durations=5 -m gpu -p no:cacheprovider > "$OUT/ptest-$j.log" 2>&1
               [ $? = 124 ] && echo "TIMED OUT after ${TESTS_TIMEOUT:-240} s: the tests of" \
                 "ids-$j not marked above did not run" >> "$OUT/ptest-$j.log") &
            done
            wait
            grep -h "TIMED OUT" "$OUT"/ptest-*.log && status=1
            for j in $(seq 0 $((${JOBS:-8} - 1))); do echo "== process $j"; cat "$OUT/ptest-$j.log"; done \
              > "$OUT/gpu_tests.log"
            grep -hE "^(FAILED|ERROR)" "$OUT"/ptest-*.log | head -20
            grep -hE "passed|failed|error" "$OUT"/ptest-*.log | grep -E " in [0-9.]+s" || status=1
            grep -qhE "^(FAILED|ERROR)| failed" "$OUT"/ptest-*.log && status=1
            rm -f "$OUT"/ptest-*.log "$OUT"/ids-*.txt ;;
    check) FASTCONV_DISPATCH=heuristic timeout ${CHECK_TIMEOUT:-540} python3 -m fastconv.tools.cli check 2>&1 | tee "$OUT/check.log" | tail -12 || status=1 ;;
    # BENCH_TIMEOUT bounds one bench step; the results written so far are packed either way.
    bench) timeout ${BENCH_TIMEOUT:-540} python3 -m fastconv.tools.cli bench --suite ${SUITES:-seed000,resnet50} --precision ${PRECISIONS:-tf32,bf16} \
             --mode ${MODES:-fwd} ${CASES:+--cases $CASES} ${BENCH_ARGS:-} --provider ${PROVIDERS:-fastconv,fastconv_triton,torch,torch_compile} \
             --plot --out "$OUT/results" 2>"$OUT/bench.err" | tee -a "$OUT/bench.log" | grep -E "geomean|wrote" || status=1
           tail -5 "$OUT/bench.err"
           [ -d "$OUT/results" ] && tar czf "$OUT/results-$(date +%H%M%S).tgz" -C "$OUT" results \
             && rm -rf "$OUT/results" ;;
    launch) python3 benchmarks/launch_overhead.py 2>&1 | tee "$OUT/launch.log" | tail -80 || status=1 ;;
    sweep) timeout ${SWEEP_TIMEOUT:-400} python3 benchmarks/sweep.py ${SWEEP_ARGS:-} ${SWEEP_SUITE:+--suite $SWEEP_SUITE} $(echo ${CASES:-} | tr , " ") 2>&1 | tee "$OUT/sweep.log" | tail -40 || status=1 ;;
  esac
done
exit $status
