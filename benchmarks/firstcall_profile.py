"""Where a model's first call goes: cProfile of ``fastconv.optimize(model)(x)`` in a fresh
process (run it with empty FASTCONV_CACHE_DIR / TRITON_CACHE_DIR), the top functions by
cumulative time, and per dispatch decision its wall time (slowest first).

    python benchmarks/firstcall_profile.py [timm model] [batch]

``FIRSTCALL_WARM=1`` first runs torch's own model once on a 64x64 input (CUDA, cuDNN and
cuBLAS initialised, as the bench's float64 reference run does before its timed first
calls, with no convolution shape shared), and also lists the top functions by own time.
"""

import cProfile
import os
import pstats
import sys
import time

import timm
import torch

import fastconv
from fastconv import dispatch

name = sys.argv[1] if len(sys.argv) > 1 else "convnext_tiny"
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 32
torch.backends.cudnn.benchmark = True
model = timm.create_model(name, pretrained=False).cuda().eval()
x = torch.randn(batch, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
warm = os.environ.get("FIRSTCALL_WARM") == "1"
if warm:
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        model(torch.randn(2, 3, 64, 64, device="cuda"))
    torch.cuda.synchronize()
opt = fastconv.optimize(model, "inference", "bf16")
decisions = []
real = dispatch._decide


def timed(problem, backend, mode, op, det, run):
    start = time.perf_counter()
    try:
        return real(problem, backend, mode, op, det, run)
    finally:
        decisions.append((time.perf_counter() - start, problem.describe()))


dispatch._decide = timed
profile = cProfile.Profile()
start = time.perf_counter()
profile.enable()
with torch.no_grad():
    opt(x)
torch.cuda.synchronize()
profile.disable()
print(f"first call {time.perf_counter() - start:.1f} s; tuning spent {dispatch.TUNING.spent_s:.1f}"
      f" s ({dispatch.TUNING.describe()}); {len(decisions)} decisions")
for seconds, what in sorted(decisions, reverse=True)[:12]:
    print(f"  {seconds:7.2f} s  {what}")
pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
if warm:
    pstats.Stats(profile).sort_stats("tottime").print_stats(20)
