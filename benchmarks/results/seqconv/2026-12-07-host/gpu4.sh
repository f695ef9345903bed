# The fourth device call (~150 s, H100): channel-last wide filters with relayout.py's copies
# (probe_cl_split.py; the suite's w64/w256 channel-last rows) and the wide GPU tests.
source benchmarks/device_env.sh
export FASTCONV_CACHE_DIR=/tmp/plancache4
R=$OUT/r4; mkdir -p $R
timeout 60 python3 benchmarks/results/seqconv/2026-12-07-host/probe_cl_split.py > $R/probe-cl-split.log 2>&1; echo "split rc $?"
CL=causal_b8_d4096_l2048_w64_cl,causal_b8_d4096_l2048_w256_cl
timeout 90 python3 -m fastconv.tools.cli bench --suite seqconv --mode fwd,train --cases $CL --provider fastconv,torch --precision bf16 --tune-budget default --out $R/cl > $R/bench-cl-wide.log 2>&1; echo "cl wide rc $?"
FASTCONV_DISPATCH=heuristic timeout 100 python3 -m pytest -q -m gpu tests/test_gpu_seqconv.py -k "wide" > $R/gpu_tests.log 2>&1; tail -1 $R/gpu_tests.log
tar czf $OUT/r4.tgz -C $OUT r4
cat $R/probe-cl-split.log
grep -E "^causal|geomean" $R/bench-cl-wide.log | cut -c1-125
