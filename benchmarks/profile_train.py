"""Profile one training step (forward + backward) of one convolution: fastconv vs torch.

Prints host time per step (no synchronisation inside the loop), GPU time per step (events
around a synchronised loop) and the torch.profiler table of the top operators by self CPU
and self CUDA time. Usage: PYTHONPATH=src python benchmarks/profile_train.py [bf16]
"""

import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import fastconv

dtype = torch.bfloat16 if "bf16" in sys.argv else torch.float32
torch.backends.cudnn.benchmark = True
x = torch.randn(32, 64, 56, 56, device="cuda", dtype=dtype, requires_grad=True)
w = torch.randn(256, 64, 1, 1, device="cuda", dtype=dtype, requires_grad=True)
if dtype == torch.bfloat16:
    x = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
g = torch.randn(32, 256, 56, 56, device="cuda", dtype=dtype)


def step(conv):
    y = conv(x, w)
    return torch.autograd.grad(y, (x, w), g)


for name, conv in (("torch", F.conv2d), ("fastconv", fastconv.conv2d)):
    for _ in range(10):
        step(conv)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        step(conv)
    host = (time.perf_counter() - t0) / 50
    torch.cuda.synchronize()
    total = (time.perf_counter() - t0) / 50
    print(f"{name}: host {host * 1e6:.0f} us/step, wall {total * 1e6:.0f} us/step")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step(conv)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
