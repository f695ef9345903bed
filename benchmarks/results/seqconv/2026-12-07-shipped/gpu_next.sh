# The next device call for issue 56 (~500 s, H100): the shipped 16-position tiles' training
# rows (widths 2-16; w3 and w16 never run on an H100), the seqconv GPU tests with them, and
# the Mamba-130M profiler (profile_steps.py, here).
source benchmarks/device_env.sh
export FASTCONV_CACHE_DIR=$OUT/plancache
python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'cudnn', torch.backends.cudnn.version())" > $OUT/env.log 2>&1
C=causal_b8_d4096_l2048_w2,causal_b8_d4096_l2048_w3,causal_b8_d4096_l2048_w4,causal_b8_d4096_l2048_w8,causal_b8_d4096_l2048_w16,causal_b1_d8192_l16384_w4,causal_b1_d8192_l16384_w8
timeout 150 python3 -m fastconv.tools.cli bench --suite seqconv --mode train --cases $C --provider fastconv,torch --precision bf16 --tune-budget default --out $OUT/results > $OUT/bench.log 2>&1; echo "bench rc $?"
JOBS=8 TEST_FILES=tests/test_gpu_seqconv.py TESTS_TIMEOUT=150 bash benchmarks/run_gpu.sh ptests | tail -3
timeout 180 python3 benchmarks/results/seqconv/2026-12-07-shipped/profile_steps.py mamba130m_conv_b8_l2048 torch_compile,fastconv_compile eval,train $OUT > $OUT/profile.log 2>&1; echo "profile rc $?"
gzip -q $OUT/trace-*.json 2>/dev/null
grep -E "^causal|geomean" $OUT/bench.log | cut -c1-120
grep -E "^==" $OUT/profile.log
