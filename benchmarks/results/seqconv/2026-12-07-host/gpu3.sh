# The third device call (~250 s, H100): channel-last wide filters through the Toeplitz
# kernels on a seqlen-contiguous copy (first calls and time per call against torch; the
# suite's w64/w256 channel-last rows, forward and forward + backward), and the seqconv GPU tests.
source benchmarks/device_env.sh
export FASTCONV_CACHE_DIR=/tmp/plancache3
R=$OUT/r3; mkdir -p $R
{ echo "git $FASTCONV_GIT_SHA"; python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'cudnn', torch.backends.cudnn.version())"; } > $R/env.log 2>&1
timeout 90 python3 benchmarks/results/seqconv/2026-12-07-host/probe_wide_cl.py 64,256 > $R/probe-wide-cl.log 2> $R/probe-wide-cl.err; echo "wide rc $?"
CL=causal_b8_d4096_l2048_w64_cl,causal_b8_d4096_l2048_w256_cl
timeout 120 python3 -m fastconv.tools.cli bench --suite seqconv --mode fwd,train --cases $CL --provider fastconv,torch --precision bf16 --tune-budget default --out $R/cl > $R/bench-cl-wide.log 2>&1; echo "cl wide rc $?"
JOBS=8 TEST_FILES=tests/test_gpu_seqconv.py TESTS_TIMEOUT=150 bash benchmarks/run_gpu.sh ptests 2>&1 | tail -2
cp $OUT/gpu_tests.log $R/ 2>/dev/null
tar czf $OUT/r3.tgz -C $OUT r3
grep -E "^w|: fastconv" $R/probe-wide-cl.log
grep -E "^causal|geomean" $R/bench-cl-wide.log | cut -c1-125
