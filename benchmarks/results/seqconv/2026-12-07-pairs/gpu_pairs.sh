# the 16-position backward on a GPU: the probe, the seqconv GPU tests, the training rows
# (with the probe's best tiles)
source benchmarks/device_env.sh
export FASTCONV_CACHE_DIR=$OUT/plancache
python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'cudnn', torch.backends.cudnn.version())" > $OUT/env.log 2>&1
timeout 200 python3 probe_pairs.py > $OUT/probe-pairs.log 2>&1; echo "probe rc $?"
JOBS=8 TEST_FILES=tests/test_gpu_seqconv.py TESTS_TIMEOUT=150 bash benchmarks/run_gpu.sh ptests | tail -3
B="--precision bf16 --tune-budget default --out $OUT/results"
timeout 90 python3 bench_pairs.py $OUT/probe-pairs.log bench --suite seqconv --mode train --cases causal_b8_d4096_l2048_w2,causal_b8_d4096_l2048_w4,causal_b8_d4096_l2048_w8,causal_b1_d8192_l16384_w4 --provider fastconv,torch $B > $OUT/bench.log 2>&1; echo "bench rc $?"
tar czf $OUT/results-pairs.tgz -C $OUT results 2>/dev/null; rm -rf $OUT/results
grep -E "^[a-z]|us \(|BEST" $OUT/probe-pairs.log | cut -c1-140
grep -E "PAIRS|%|ms" $OUT/bench.log | tail -14
