# One device call: the 130M Mamba block's training row (torch.compile against
# fastconv.compile) four times in new processes, alternating shortrows.py's tiles off
# (bench_rows.py none) and as shipped (bench_rows.py shipped: TILES unchanged).
source benchmarks/device_env.sh
export FASTCONV_CACHE_DIR=$OUT/plancache
D=benchmarks/results/seqconv/2026-12-07-rows; R=$OUT/r; mkdir -p $R
{ echo "git $FASTCONV_GIT_SHA"; python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"; } > $R/env.log 2>&1
for i in 1 2; do for t in none shipped; do
  timeout 60 python3 $D/bench_rows.py $t bench --suite models --cases mamba130m_conv_b8_l2048 --provider torch_compile,fastconv_compile --precision bf16 --tune-budget default --mode train --out $R/m-$t-$i > $R/mamba-$t-$i.log 2>&1; echo "rc $?" >> $R/mamba-$t-$i.log
done; done
tar czf $OUT/all.tgz -C $OUT r
for f in $R/mamba-*.log; do echo "== $(basename $f)"; grep -E "^TILES|^mamba|^rc" $f | cut -c1-110; done
