# One device call (~500 s, H100) for issue 56: the host time of the compiled-graph ops
# (probe_host.py), the seqconv suite's channel-last rows (x dim-contiguous, forward and
# forward + backward), and the Mamba blocks against torch.compile (training, then inference).
source benchmarks/device_env.sh
export FASTCONV_CACHE_DIR=/tmp/plancache
R=$OUT/r; mkdir -p $R
{ echo "git $FASTCONV_GIT_SHA"; python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'cudnn', torch.backends.cudnn.version())"; } > $R/env.log 2>&1
timeout 60 python3 benchmarks/results/seqconv/2026-12-07-host/probe_host.py > $R/probe-host.log 2>&1; echo "probe rc $?"
CL=causal_b8_d4096_l2048_w2_cl,causal_b8_d4096_l2048_w4_cl,causal_b8_d4096_l2048_w8_cl,causal_b8_d4096_l2048_w16_cl,causal_b8_d4096_l2048_w64_cl,causal_b8_d4096_l2048_w256_cl,causal_b1_d8192_l16384_w4_cl
timeout 170 python3 -m fastconv.tools.cli bench --suite seqconv --mode fwd,train --cases $CL --provider fastconv,torch --precision bf16 --tune-budget default --out $R/cl > $R/bench-cl.log 2>&1; echo "cl rc $?"
M="--suite models --cases mamba_conv_b8_l2048,mamba130m_conv_b8_l2048 --provider torch,torch_compile,fastconv_compile,fastconv --precision bf16 --tune-budget default"
timeout 150 python3 -m fastconv.tools.cli bench $M --mode train --out $R/mamba > $R/bench-mamba-train.log 2>&1; echo "train rc $?"
timeout 120 python3 -m fastconv.tools.cli bench $M --mode eval --out $R/mamba > $R/bench-mamba-eval.log 2>&1; echo "eval rc $?"
tar czf $OUT/r.tgz -C $OUT r
cat $R/probe-host.log
grep -E "^causal|geomean" $R/bench-cl.log | cut -c1-125
grep -E "^mamba|geomean" $R/bench-mamba-*.log | cut -c1-140
