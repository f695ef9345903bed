# One device call: causal_conv1d's public training step at widths 20-31 (probe_train_mid.py),
# the seqconv GPU tests, then per-layer graph-time checks (issue 54) for the models in CASES
# (one process per model and mode, MODES: eval and/or train), each cut at LAYER_TIMEOUT s;
# no new check starts after DEADLINE s of the call. Everything goes into $OUT/all.tgz.
source benchmarks/device_env.sh
export FASTCONV_CACHE_DIR=$OUT/plancache
R=$OUT/r; mkdir -p $R; start=$SECONDS
{ echo "git $FASTCONV_GIT_SHA"; python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'cudnn', torch.backends.cudnn.version())"; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; } > $R/env.log 2>&1
if [ -n "${PROBE:-}" ]; then
  timeout 120 python3 benchmarks/results/seqconv/2026-12-07-host/probe_train_mid.py > $R/probe-train-mid.log 2>&1; echo "rc $?" >> $R/probe-train-mid.log
fi
if [ -n "${TEST_FILES:-}" ]; then
  OUT=$R JOBS=8 TESTS_TIMEOUT=${TESTS_TIMEOUT:-170} bash benchmarks/run_gpu.sh ptests > $R/ptests.out 2>&1
fi
for mode in ${MODES:-eval}; do for c in ${CASES:-}; do
  [ $((SECONDS - start)) -gt ${DEADLINE:-480} ] && { echo "skipped $mode $c: deadline" >> $R/layers.log; continue; }
  timeout ${LAYER_TIMEOUT:-110} python3 -m fastconv.tools.cli bench --precision bf16 --suite models --cases $c --mode $mode \
    --layer-check --tune-budget default --out $R/lc-$mode-$c >> $R/layers.log 2>&1
  echo "== $mode $c rc $? at $((SECONDS - start)) s" >> $R/layers.log
done; done
tar czf $OUT/all.tgz -C $OUT r
tail -12 $R/probe-train-mid.log 2>/dev/null; tail -4 $R/ptests.out 2>/dev/null; grep -E "==|worst|below" $R/layers.log | tail -30
