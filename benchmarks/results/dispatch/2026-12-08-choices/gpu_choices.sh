# One device call (~250 s, H100): issue 54's two training rows below 0.98, each problem
# explained and measured alone in a new process (probe_choices.py, here): the dgrad with the
# default and the exhaustive budget, the squeeze-excitation wgrad with the default. Then the
# seqconv GPU tests' fused-FFT rows (fftsplit in bf16 and float16). Everything in
# $OUT/all.tgz.
source benchmarks/device_env.sh
D=benchmarks/results/dispatch/2026-12-08-choices; R=$OUT/r; mkdir -p $R
{ echo "git $FASTCONV_GIT_SHA"; python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'cudnn', torch.backends.cudnn.version())"; } > $R/env.log 2>&1
for run in "dgrad default" "dgrad exhaustive" "wgrad default"; do
  set -- $run
  FASTCONV_CACHE_DIR=$OUT/cache-$1-$2 timeout 90 python3 $D/probe_choices.py $1 $2 > $R/probe-$1-$2.log 2>&1
  echo "rc $?" >> $R/probe-$1-$2.log
done
timeout 150 python3 -m pytest -q tests/test_gpu_seqconv.py -k "fused or split_fft" > $R/tests-fft.log 2>&1; echo "tests rc $?"
tar czf $OUT/all.tgz -C $OUT r
for f in $R/probe-*.log; do echo "== $(basename $f)"; grep -vE "^\s+(triton|cudnn).*(pruned|budget)" $f | tail -14 | cut -c1-140; done
tail -3 $R/tests-fft.log
