# Issue 54 on an H100 at HEAD: fresh-process rows, DeepLabV3 b8 graph vs eager, per-layer check.
source benchmarks/device_env.sh
export FASTCONV_CACHE_DIR=$OUT/plancache
R=$OUT/r54; mkdir -p $R
{ git_sha=$FASTCONV_GIT_SHA; echo "git $git_sha"; python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'cudnn', torch.backends.cudnn.version())"; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; } > $OUT/env.log 2>&1
fc() { timeout ${2} python3 -m fastconv.tools.cli bench --precision bf16 $1 --out $R/$3 >> $OUT/run54.log 2>&1; echo "== $3 rc $?" >> $OUT/run54.log; }
F="--mode fwd --provider fastconv,fastconv_triton,torch --tune-budget default"
fc "--suite conv1d_short --cases causal_dw_k4_8x4096x2048 --fresh 12 $F" 60 db
fc "--suite seed002_conv1d --cases seed002_g8,seed002_g16 --fresh 12 $F" 90 db
FASTCONV_TUNING_DB=off fc "--suite conv1d_short --cases causal_dw_k4_8x4096x2048 --fresh 12 --spent-budget $F" 60 nodb-spent
FASTCONV_TUNING_DB=off fc "--suite seed002_conv1d --cases seed002_g8,seed002_g16 --fresh 12 --spent-budget $F" 90 nodb-spent
fc "--suite models --cases deeplabv3_r50_b8 --mode eval --provider torch,fastconv,fastconv_cuda_graph --tune-budget default" 150 deeplab
fc "--suite models --cases deeplabv3_r50_b8 --mode eval --layer-check --tune-budget default" 130 layercheck
tar czf $OUT/r54.tgz -C $OUT r54 run54.log env.log
grep -hE "speedup|geomean|x torch|==|ms" $OUT/run54.log | tail -40
