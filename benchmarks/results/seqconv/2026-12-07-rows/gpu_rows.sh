# One device call: probe_rows.py (its candidates built first in 4 processes); its best tiles
# written into shortrows.py's TILES (set_tiles.py); the suite's channel-last training rows
# without tiles (shortconv.py's kernels) and with them; the seqconv GPU tests and the Mamba
# blocks' training rows with them. No step starts after DEADLINE s.
source benchmarks/device_env.sh
export FASTCONV_CACHE_DIR=$OUT/plancache
D=benchmarks/results/seqconv/2026-12-07-rows; R=$OUT/r; mkdir -p $R; start=$SECONDS
late() { [ $((SECONDS - start)) -gt ${DEADLINE:-420} ] && echo "skipped $1: deadline" >> $R/steps.log; }
{ echo "git $FASTCONV_GIT_SHA"; python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'cudnn', torch.backends.cudnn.version())"; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; } > $R/env.log 2>&1
for j in 0 1 2 3; do timeout 150 python3 $D/probe_rows.py compile $j > $R/build-$j.log 2>&1 & done; wait
echo "built at $((SECONDS - start)) s" >> $R/steps.log
timeout 120 python3 $D/probe_rows.py > $R/probe-rows.log 2>&1; echo "rc $?" >> $R/probe-rows.log
python3 $D/set_tiles.py $R/probe-rows.log src >> $R/steps.log 2>&1
echo "probed at $((SECONDS - start)) s" >> $R/steps.log
CL=causal_b8_d4096_l2048_w2_cl,causal_b8_d4096_l2048_w4_cl,causal_b8_d4096_l2048_w8_cl,causal_b8_d4096_l2048_w16_cl,causal_b1_d8192_l16384_w4_cl
for t in none $R/probe-rows.log; do n=$(basename $t .log)
  late "bench $n" || timeout 100 python3 $D/bench_rows.py $t bench --suite seqconv --mode train --cases $CL --provider fastconv,torch --precision bf16 --tune-budget default --out $R/cl-$n > $R/bench-cl-$n.log 2>&1; echo "rc $?" >> $R/bench-cl-$n.log
done
late tests || OUT=$R JOBS=8 TEST_FILES=tests/test_gpu_seqconv.py TESTS_TIMEOUT=120 bash benchmarks/run_gpu.sh ptests > $R/ptests.out 2>&1
echo "tested at $((SECONDS - start)) s" >> $R/steps.log
late mamba || timeout 120 python3 -m fastconv.tools.cli bench --suite models --cases mamba_conv_b8_l2048,mamba130m_conv_b8_l2048 --provider torch,torch_compile,fastconv_compile,fastconv --precision bf16 --tune-budget default --mode train --out $R/mamba > $R/bench-mamba-train.log 2>&1
tar czf $OUT/all.tgz -C $OUT r
cat $R/steps.log; cut -c1-150 $R/probe-rows.log | tail -70
grep -hE "^TILES|^causal.*fastconv|geomean|^rc" $R/bench-cl-*.log | cut -c1-125
grep -hE " passed| failed|^FAILED" $R/ptests.out | tail -10; grep -E "^mamba" $R/bench-mamba-train.log | cut -c1-125
