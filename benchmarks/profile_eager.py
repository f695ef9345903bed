"""Where an eager training (or inference) step of a timm model goes: torch's modules against
fastconv.optimize(model), bf16 autocast, channels-last, as the models suite runs them.
Per variant: the step's wall time (synchronised, median of 20), the host time to issue it
(wall clock until the last launch returns, GPU kept busy ahead by a spinning kernel), the
GPU kernel time of one step and its kernels grouped by name, the host's time by operator
(torch.profiler, every thread: the backward runs on autograd's device thread) and by Python
function of the calling thread (cProfile: shares, not absolutes). Variant fastconv_aten is
fastconv with every layer's backend forced to aten.

    python benchmarks/profile_eager.py [timm model name] [batch] [--eval] [--top N]

A step is host-bound when its wall time is near its host time and well above its kernel
time: then the host's microseconds per layer are what to cut.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time

import torch
from timm_steps import VARIANTS, eager_step, kernels_by_name

flags = [a for a in sys.argv[1:] if a.startswith("--")]
args = [a for a in sys.argv[1:] if not a.startswith("--")]
name = args[0] if args else "resnet50"
batch = int(args[1]) if len(args) > 1 else 32
TRAIN = "--eval" not in flags
torch.backends.cudnn.benchmark = True
torch.manual_seed(0)
x = torch.randn(batch, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)


def host_ms(step) -> float:
    """Issue time of one step while the GPU is busy with a spinning kernel ahead of it."""
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        torch.cuda._sleep(400_000_000)  # ~0.2 s at 2 GHz: longer than any step's issue
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
        torch.cuda.synchronize()
    return statistics.median(times)


for variant in VARIANTS:
    step = eager_step(name, variant, x, TRAIN)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    walls = []
    for _ in range(20):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - start) * 1e3)
    host = host_ms(step)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = kernels_by_name(prof)
    total = sum(v[1] for v in kernels.values())
    print(f"== {variant} {name} b{batch} {'train' if TRAIN else 'eval'}: wall "
          f"{statistics.median(walls):.2f} ms per step, host issue {host:.2f} ms, kernels "
          f"{sum(v[0] for v in kernels.values())} taking {total / 1000:.2f} ms")
    for kname, (n, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:8]:
        print(f"  {n:4d} x {us:8.1f} us  {kname}")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22,
                                    max_name_column_width=50))
    profile = cProfile.Profile()
    profile.enable()
    step()
    profile.disable()
    torch.cuda.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(10)
