"""Where a warm eager forward of an optimized model spends its host time: optimize a timm
model (bf16, channels_last, the shipped database as a user gets it), run its first call,
wait for every background build (``dispatch.finish_builds(upgrades=True)``, as the bench
does), warm up, then time 20 synchronised forwards, list the plans by backend, and
cProfile 20 more (top functions by own time).

    python benchmarks/eager_profile.py [timm model] [batch]
"""

import collections
import cProfile
import pstats
import statistics
import sys
import time

import timm
import torch

import fastconv
from fastconv import dispatch, plans

name = sys.argv[1] if len(sys.argv) > 1 else "resnet50"
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 32
torch.backends.cudnn.benchmark = True
model = timm.create_model(name, pretrained=False).cuda().eval()
x = torch.randn(batch, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
opt = fastconv.optimize(model, "inference", "bf16")
with torch.no_grad():
    start = time.perf_counter()
    opt(x)
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    start = time.perf_counter()
    dispatch.finish_builds(upgrades=True)
    print(f"first call {first:.2f} s, builds after it {time.perf_counter() - start:.2f} s")
    for _ in range(5):
        opt(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        start = time.perf_counter()
        opt(x)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    print(f"eager forward (synchronised) median {statistics.median(times):.3f} ms, "
          f"min {min(times):.3f} ms")
    census = collections.Counter(
        (p.backend, p.provisional, getattr(p.run, "__name__", "?"))
        for p in list(plans._PLANS.values()))
    for key, count in sorted(census.items(), key=str):
        print(f"  {count:3d} plans {key}")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(20):
        opt(x)
    torch.cuda.synchronize()
    profile.disable()
pstats.Stats(profile).sort_stats("tottime").print_stats(25)
