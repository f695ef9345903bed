# One device call (or the tail of one): probe_twisted.py on the GPU, forward cut at
# LONG_TIMEOUT s, then its train mode cut at TRAIN_TIMEOUT s (0: skipped); the logs and the
# environment in $OUT/long.tgz.
source benchmarks/device_env.sh
D=benchmarks/results/seqconv/2026-12-07-longconv8k; R=$OUT/long; mkdir -p $R
{ echo "git $FASTCONV_GIT_SHA"; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; } > $R/env.log 2>&1
timeout ${LONG_TIMEOUT:-150} python3 $D/probe_twisted.py ${LONG_CASES:-} > $R/probe-twisted.log 2>&1; echo "rc $?" >> $R/probe-twisted.log
if [ "${TRAIN_TIMEOUT:-120}" != 0 ]; then
  timeout ${TRAIN_TIMEOUT:-120} python3 $D/probe_twisted.py train > $R/probe-twisted-train.log 2>&1; echo "rc $?" >> $R/probe-twisted-train.log
fi
tar czf $OUT/long.tgz -C $OUT long
cut -c1-400 $R/probe-twisted.log $R/probe-twisted-train.log 2>/dev/null
