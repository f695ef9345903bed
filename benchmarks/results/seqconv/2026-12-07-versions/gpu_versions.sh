# One device call: probe_versions.py (this tree's shortrows.py and the versions in
# tmp_versions/, shortrows_<v>.py files from `git show`, untracked and so carried, copied into
# the package here; VERSIONS names them), then issue 54's training layer checks of the models
# in CASES (layers.sh's loop: one process each, cut at LAYER_TIMEOUT s, none started after
# DEADLINE s). TAG: a suffix for the probe's logs, so that two runs in one call keep both.
source benchmarks/device_env.sh
export FASTCONV_CACHE_DIR=$OUT/plancache
D=benchmarks/results/seqconv/2026-12-07-versions; R=$OUT/r; mkdir -p $R; start=$SECONDS
cp tmp_versions/shortrows_*.py src/fastconv/backends/triton/
{ echo "git $FASTCONV_GIT_SHA"; python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'cudnn', torch.backends.cudnn.version())"; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; } > $R/env.log 2>&1
for j in 0 1 2 3; do timeout ${BUILD_TIMEOUT:-110} python3 $D/probe_versions.py compile $j > $R/build${TAG:-}-$j.log 2>&1 & done; wait
echo "built at $((SECONDS - start)) s" >> $R/steps.log
P=$R/probe-versions${TAG:-}.log
timeout ${PROBE_TIMEOUT:-100} python3 $D/probe_versions.py > $P 2>&1; echo "rc $?" >> $P
echo "probed at $((SECONDS - start)) s" >> $R/steps.log
rm src/fastconv/backends/triton/shortrows_?*.py
for c in ${CASES:-}; do
  [ $((SECONDS - start)) -gt ${DEADLINE:-380} ] && { echo "skipped train $c: deadline" >> $R/layers.log; continue; }
  timeout ${LAYER_TIMEOUT:-190} python3 -m fastconv.tools.cli bench --precision bf16 --suite models --cases $c --mode train \
    --layer-check --tune-budget default --out $R/lc-train-$c >> $R/layers.log 2>&1
  echo "== train $c rc $? at $((SECONDS - start)) s" >> $R/layers.log
done
tar czf $OUT/all.tgz -C $OUT r
cat $R/steps.log; cut -c1-140 $P; grep -E "==|worst|below" $R/layers.log | tail -20
