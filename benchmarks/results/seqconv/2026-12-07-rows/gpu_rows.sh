# One device call: probe_rows.py (its candidates built first in 4 processes), then the
# suite's channel-last training rows as shipped and with the best tiles.
source benchmarks/device_env.sh
export FASTCONV_CACHE_DIR=$OUT/plancache
D=benchmarks/results/seqconv/2026-12-07-rows; R=$OUT/r; mkdir -p $R
{ echo "git $FASTCONV_GIT_SHA"; python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'cudnn', torch.backends.cudnn.version())"; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; } > $R/env.log 2>&1
for j in 0 1 2 3; do timeout 200 python3 $D/probe_rows.py compile $j > $R/build-$j.log 2>&1 & done; wait
timeout 150 python3 $D/probe_rows.py > $R/probe-rows.log 2>&1; echo "rc $?" >> $R/probe-rows.log
# the suite's channel-last training rows, as shipped and with the probe's best tiles
CL=causal_b8_d4096_l2048_w2_cl,causal_b8_d4096_l2048_w4_cl,causal_b8_d4096_l2048_w8_cl,causal_b8_d4096_l2048_w16_cl,causal_b1_d8192_l16384_w4_cl
for t in shipped $R/probe-rows.log; do n=$(basename $t .log)
  timeout 130 python3 $D/bench_rows.py $t bench --suite seqconv --mode train --cases $CL --provider fastconv,torch --precision bf16 --tune-budget default --out $R/cl-$n > $R/bench-cl-$n.log 2>&1; echo "rc $?" >> $R/bench-cl-$n.log
done
tar czf $OUT/all.tgz -C $OUT r
cut -c1-150 $R/probe-rows.log | tail -75
grep -hE "^TILES|^causal.*fastconv|geomean|^rc" $R/bench-cl-*.log | cut -c1-125
