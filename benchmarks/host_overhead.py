"""Host time per call of fastconv vs torch on a tiny convolution (compute negligible), on any
machine: a training step (forward + autograd backward) and a no-grad forward, aten backend
(dispatch's CPU choice). Best of 5 rounds of 300 calls, one thread.

Usage: PYTHONPATH=src python benchmarks/host_overhead.py
"""

import time

import torch
import torch.nn.functional as F

import fastconv

torch.set_num_threads(1)
x = torch.randn(1, 4, 5, 5, requires_grad=True)
w = torch.randn(4, 4, 3, 3, requires_grad=True)
g = torch.randn(1, 4, 5, 5)


def step(conv):
    return torch.autograd.grad(conv(x, w, None, 1, 1), (x, w), g)


def forward(conv):
    with torch.no_grad():
        return conv(x, w, None, 1, 1)


for what, fn in (("train step", step), ("no-grad forward", forward)):
    for name, conv in (("fastconv", fastconv.conv2d), ("torch", F.conv2d)):
        for _ in range(50):
            fn(conv)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(300):
                fn(conv)
            best = min(best, (time.perf_counter() - t0) / 300)
        print(f"{what:16} {name:9} {best * 1e6:6.0f} us")
