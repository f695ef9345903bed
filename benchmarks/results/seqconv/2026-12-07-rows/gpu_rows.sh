# One device call: probe_rows.py (its candidates built first in 4 processes), then the
# seqconv GPU tests and the suite's channel-last training rows with the best tiles.
source benchmarks/device_env.sh
export FASTCONV_CACHE_DIR=$OUT/plancache
D=benchmarks/results/seqconv/2026-12-07-rows; R=$OUT/r; mkdir -p $R
{ echo "git $FASTCONV_GIT_SHA"; python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'cudnn', torch.backends.cudnn.version())"; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; } > $R/env.log 2>&1
for j in 0 1 2 3; do timeout 200 python3 $D/probe_rows.py compile $j > $R/build-$j.log 2>&1 & done; wait
timeout 150 python3 $D/probe_rows.py > $R/probe-rows.log 2>&1; echo "rc $?" >> $R/probe-rows.log
tar czf $OUT/all.tgz -C $OUT r
cat $R/probe-rows.log | grep -vE "^$" | awk '{print}' | tail -60
