"""Where a warm eager forward of an optimized model spends its host time: optimize a timm
model (bf16 channels_last by default, the shipped database as a user gets it; tf32 and
ieee keep NCHW, as the models bench does), run its first call,
wait for every background build (``dispatch.finish_builds(upgrades=True)``, as the bench
does), warm up, then time 20 synchronised forwards, list the layers' plans by backend, and
cProfile 20 more (top functions by own time).

    python benchmarks/eager_profile.py [timm model] [batch] [precision]
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
precision = sys.argv[3] if len(sys.argv) > 3 else "bf16"
half = precision in ("bf16", "fp16")
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = precision == "tf32"  # (as the models bench sets it)
model = timm.create_model(name, pretrained=False).cuda().eval()
x = torch.randn(batch, 3, 224, 224, device="cuda")
if half:
    x = x.contiguous(memory_format=torch.channels_last)
opt = fastconv.optimize(model, "inference", precision, channels_last=half)
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
    # the layers' own plans (a module keeps its plan: nn.conv._planned) and the functional
    # path's (plans._PLANS)
    held = [m.__dict__["_plan"][1] for m in opt.modules()
            if m.__dict__.get("_plan") and m.__dict__["_plan"][1] is not None]
    census = collections.Counter(
        (where, p.backend, p.provisional, getattr(p.run, "__name__", "?"))
        for where, group in (("module", held), ("functional", list(plans._PLANS.values())))
        for p in group)
    for key, count in sorted(census.items(), key=str):
        print(f"  {count:3d} plans {key}")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(20):
        opt(x)
    torch.cuda.synchronize()
    profile.disable()
pstats.Stats(profile).sort_stats("tottime").print_stats(25)
