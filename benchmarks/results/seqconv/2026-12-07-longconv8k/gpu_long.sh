# One device call (or the tail of one): probe_twisted.py on the GPU, cut at LONG_TIMEOUT s,
# its log and the environment in $OUT/long.tgz.
source benchmarks/device_env.sh
D=benchmarks/results/seqconv/2026-12-07-longconv8k; R=$OUT/long; mkdir -p $R
{ echo "git $FASTCONV_GIT_SHA"; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; } > $R/env.log 2>&1
timeout ${LONG_TIMEOUT:-150} python3 $D/probe_twisted.py ${LONG_CASES:-} > $R/probe-twisted.log 2>&1; echo "rc $?" >> $R/probe-twisted.log
tar czf $OUT/long.tgz -C $OUT long
cut -c1-400 $R/probe-twisted.log
