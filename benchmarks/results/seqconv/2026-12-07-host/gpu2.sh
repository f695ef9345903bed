# The second device call (~300 s, H100): the channel-last width-64/256 forward that stalled
# in gpu.sh (probe_wide_cl.py, stacks every 20 s), then the channel-last training rows.
source benchmarks/device_env.sh
export FASTCONV_CACHE_DIR=/tmp/plancache2
R=$OUT/r2; mkdir -p $R
{ echo "git $FASTCONV_GIT_SHA"; python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'cudnn', torch.backends.cudnn.version())"; } > $R/env.log 2>&1
timeout 130 python3 benchmarks/results/seqconv/2026-12-07-host/probe_wide_cl.py 64,256 > $R/probe-wide-cl.log 2> $R/probe-wide-cl.err; echo "wide rc $?"
CL=causal_b8_d4096_l2048_w2_cl,causal_b8_d4096_l2048_w4_cl,causal_b8_d4096_l2048_w8_cl,causal_b8_d4096_l2048_w16_cl,causal_b1_d8192_l16384_w4_cl
timeout 120 python3 -m fastconv.tools.cli bench --suite seqconv --mode train --cases $CL --provider fastconv,torch --precision bf16 --tune-budget default --out $R/cl > $R/bench-cl-train.log 2>&1; echo "cl train rc $?"
tar czf $OUT/r2.tgz -C $OUT r2
cat $R/probe-wide-cl.log | cut -c1-160 | head -60
grep -E "^causal|geomean" $R/bench-cl-train.log | cut -c1-125
