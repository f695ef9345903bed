# One device call (~420 s, H100): issue 54's two training rows below 0.98, each problem
# explained and measured alone in a new process (probe_choices.py, here): the dgrad with the
# default and the exhaustive budget, the squeeze-excitation wgrad with the default; then
# efficientnet_b0's training layer check under the warm-operand rule (policy.WARM_TOLERANCE),
# then the seqconv GPU tests' fused-FFT rows (fftsplit in bf16 and float16). Everything in
# $OUT/all.tgz.
source benchmarks/device_env.sh
D=benchmarks/results/dispatch/2026-12-08-choices; R=$OUT/r; mkdir -p $R
{ echo "git $FASTCONV_GIT_SHA"; python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'cudnn', torch.backends.cudnn.version())"; } > $R/env.log 2>&1
for run in "dgrad default" "dgrad exhaustive" "wgrad default"; do
  set -- $run
  FASTCONV_CACHE_DIR=/tmp/cache-$1-$2 timeout 90 python3 $D/probe_choices.py $1 $2 > $R/probe-$1-$2.log 2>&1
  echo "rc $?" >> $R/probe-$1-$2.log
done
FASTCONV_CACHE_DIR=/tmp/cache-lc timeout 150 python3 -m fastconv.tools.cli bench --precision bf16 --suite models \
  --cases tv_efficientnet_b0_b32 --mode train --layer-check --tune-budget default --out $R/lc-train-tv_efficientnet_b0_b32 > $R/layers.log 2>&1
echo "layer check rc $?"
timeout 120 python3 -m pytest -q tests/test_gpu_seqconv.py -k "fused or split_fft" > $R/tests-fft.log 2>&1; echo "tests rc $?"
tar czf $OUT/all.tgz -C $OUT r
for f in $R/probe-*.log; do echo "== $(basename $f)"; grep -vE "^\s+(triton|cudnn).*(pruned|budget)" $f | tail -14 | cut -c1-140; done
grep -E "worst|below" $R/layers.log | tail -3
tail -3 $R/tests-fft.log
