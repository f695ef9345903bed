# The next device call for issue 56 (~400 s, H100): fftsplit.py's route through the public
# long_conv1d in the seqconv bench (forward and training, L = 1K-16K, fastconv against the
# bench's torch.fft), then the seqconv GPU tests (the split route's first GPU test, and the
# 8-warp backward tiles of widths 6-17). Everything in $OUT/all.tgz.
source benchmarks/device_env.sh
export FASTCONV_CACHE_DIR=$OUT/plancache
R=$OUT/r; mkdir -p $R
python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'cudnn', torch.backends.cudnn.version())" > $R/env.log 2>&1
C=long_b4_d768_l1024,long_b4_d768_l2048,long_b4_d768_l4096,long_b4_d768_l8192,long_b4_d768_l16384
for mode in fwd train; do
  timeout ${BENCH_TIMEOUT:-100} python3 -m fastconv.tools.cli bench --suite seqconv --mode $mode --cases $C --provider fastconv,torch --precision bf16 --tune-budget default --out $R/results > $R/bench-$mode.log 2>&1; echo "bench $mode rc $?"
done
OUT=$R JOBS=8 TEST_FILES=tests/test_gpu_seqconv.py TESTS_TIMEOUT=${TESTS_TIMEOUT:-170} bash benchmarks/run_gpu.sh ptests | tail -3
tar czf $OUT/all.tgz -C $OUT r
grep -hE "^long|geomean" $R/bench-*.log | cut -c1-120
