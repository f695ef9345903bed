#!/usr/bin/env bash
# The dispatch picks item 4 of issue 20 names, benchmarked with an empty plan cache
# (exhaustive tuning, fastconv auto against torch in one process per precision):
# resnet50 stem and layer-1 and two depthwise layers in bf16 channels-last, seed002's
# c128_256 and three resnet50_cbr 1x1 layers (eval) in tf32 NCHW.
# Usage (device): FASTCONV_GIT_SHA=<sha> bash benchmarks/graph_pick_ab.sh <label> [src dir]
set -uo pipefail
label=$1
export PYTHONPATH=${2:-$PWD/src}:/tmp/site FASTCONV_CACHE_DIR=/tmp/pc-$label
rm -rf "$FASTCONV_CACHE_DIR"
out=${OUT:-out}/$label
mkdir -p "$out"
timeout 300 python3 -m fastconv.tools.cli bench --suite resnet50,depthwise --precision bf16 --mode fwd \
  --cases r50_stem_7x7_s2,r50_l1_1x1_64_64,r50_l1_3x3_64,r50_l1_1x1_64_256,r50_l1_1x1_256_64,dw_576_14_k3,dw_32_112_k3 \
  --provider torch,fastconv --out "$out" > "$out/bench-bf16.log" 2>&1
timeout 120 python3 -m fastconv.tools.cli bench --suite seed002_conv1d --precision tf32 --mode fwd \
  --cases seed002_c128_256 --provider torch,fastconv --out "$out" > "$out/bench-tf32.log" 2>&1
timeout 200 python3 -m fastconv.tools.cli bench --suite resnet50_cbr --precision tf32 --mode eval \
  --cases cbr_l1_1x1_64_64,cbr_l3_1x1_1024_256,cbr_l4_1x1_1024_512 \
  --provider torch,fastconv --out "$out" > "$out/bench-tf32-cbr.log" 2>&1
grep -hE "^(r50|dw|seed|cbr).* fastconv |geomean" "$out"/bench-*.log
