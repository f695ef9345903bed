"""Where a model's first call goes: cProfile of ``fastconv.optimize(model)(x)`` in a fresh
process (run it with empty FASTCONV_CACHE_DIR / TRITON_CACHE_DIR), the top functions by
cumulative time, and per dispatch decision its wall time (slowest first).

    python benchmarks/firstcall_profile.py [timm model] [batch]

``FIRSTCALL_WARM=1`` first runs torch's own model once on a 64x64 input (CUDA, cuDNN and
cuBLAS initialised, as the bench's float64 reference run does before its timed first
calls, with no convolution shape shared), and also lists the top functions by own time.
Also printed: the wall time spent inside each of dispatch's steps (summed over the call,
calling thread only; nested steps count in their callers too). ``FIRSTCALL_PROFILE=0``: no
cProfile (its overhead inflates the Python-heavy steps), only those sums.
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
walls: dict[str, list] = {}


def summed(name):
    real_step = getattr(dispatch, name)
    walls[name] = [0, 0.0]

    def step(*args, **kwargs):
        begin = time.perf_counter()
        try:
            return real_step(*args, **kwargs)
        finally:
            walls[name][0] += 1
            walls[name][1] += time.perf_counter() - begin
    setattr(dispatch, name, step)


for name in ("choose", "_decide", "_upgrade", "_adopt", "_wait_built", "_compile_ahead",
             "time_costs", "time_graph_cost", "_refine_host"):
    summed(name)
profiling = os.environ.get("FIRSTCALL_PROFILE", "1") != "0"
profile = cProfile.Profile()
start = time.perf_counter()
if profiling:
    profile.enable()
with torch.no_grad():
    opt(x)
torch.cuda.synchronize()
profile.disable()
print(f"first call {time.perf_counter() - start:.1f} s; tuning spent {dispatch.TUNING.spent_s:.1f}"
      f" s ({dispatch.TUNING.describe()}); {len(decisions)} decisions")
for seconds, what in sorted(decisions, reverse=True)[:12]:
    print(f"  {seconds:7.2f} s  {what}")
print("wall time inside dispatch's steps (calls, seconds):")
for name, (calls, seconds) in walls.items():
    print(f"  {name:16s} {calls:5d} {seconds:7.2f} s")
if not profiling:
    sys.exit(0)
pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
if warm:
    pstats.Stats(profile).sort_stats("tottime").print_stats(20)
