# The fifth device call (~120 s, H100): channel-last widths 18-31 through the Toeplitz
# kernels (probe_mid_cl.py at 20 and 24; the suite's w24 channel-last rows) and the wide
# GPU tests (widths 20-256, both layouts).
source benchmarks/device_env.sh
export FASTCONV_CACHE_DIR=/tmp/plancache5
R=$OUT/r5; mkdir -p $R
timeout 75 python3 benchmarks/results/seqconv/2026-12-07-host/probe_mid_cl.py 24,20 > $R/probe-mid-cl.log 2>&1; echo "mid rc $?"
timeout 60 python3 -m fastconv.tools.cli bench --suite seqconv --mode fwd,train --cases causal_b8_d4096_l2048_w24_cl --provider fastconv,torch --precision bf16 --tune-budget default --out $R/cl > $R/bench-cl-w24.log 2>&1; echo "cl w24 rc $?"
FASTCONV_DISPATCH=heuristic timeout 60 python3 -m pytest -q -m gpu tests/test_gpu_seqconv.py -k "wide" > $R/gpu_tests.log 2>&1; tail -1 $R/gpu_tests.log
tar czf $OUT/r5.tgz -C $OUT r5
cat $R/probe-mid-cl.log
grep -E "^causal|geomean" $R/bench-cl-w24.log | cut -c1-125
