# One device call: probe_rows.py on the kernel before the split loops (b045087's src/, which
# the caller puts in build/old: `git archive b045087 src | tar -x -C build/old`, carried),
# on the candidates of tiles-old.json (those without a register cap, which that kernel does
# not take); its candidates built first in 4 processes.
source benchmarks/device_env.sh
export FASTCONV_CACHE_DIR=$OUT/plancache PYTHONPATH=$PWD/build/old/src:/tmp/site
D=benchmarks/results/seqconv/2026-12-07-rows; U=benchmarks/results/seqconv/2026-12-07-unroll
R=$OUT/r; mkdir -p $R; export PROBE_TILES=$U/tiles-old.json
{ echo "git $FASTCONV_GIT_SHA, src b045087"; python3 -c "import torch, triton, fastconv; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), fastconv.__file__)"; } > $R/env.log 2>&1
for j in 0 1 2 3; do timeout 200 python3 $D/probe_rows.py compile $j > $R/build-old-$j.log 2>&1 & done; wait
timeout 150 python3 $D/probe_rows.py > $R/probe-old.log 2>&1; echo "rc $?" >> $R/probe-old.log
tar czf $OUT/all.tgz -C $OUT r
cat $R/env.log; cut -c1-150 $R/probe-old.log | tail -70
