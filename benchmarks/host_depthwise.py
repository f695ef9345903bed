"""Host time per call of a depthwise forward through fastconv's cached plan (Triton forced)
against torch's F.conv2d, on a problem whose kernel takes a few microseconds: bf16
channels-last 1x64x8x8, 3x3, groups=64, with a bias and ReLU epilogue for fastconv (torch:
conv + relu). Min over 7 rounds of 300 back-to-back calls, device synchronised around each
round; run it on two source trees (PYTHONPATH) in one device call to compare them.

Usage: PYTHONPATH=src python benchmarks/host_depthwise.py
"""

import time

import torch
import torch.nn.functional as F

import fastconv


def per_call_us(fn, calls: int = 300, rounds: int = 7) -> float:
    for _ in range(20):
        fn()
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


x = torch.randn(1, 64, 8, 8, device="cuda", dtype=torch.bfloat16)
x = x.contiguous(memory_format=torch.channels_last)
w = torch.randn(64, 1, 3, 3, device="cuda", dtype=torch.bfloat16)
b = torch.randn(64, device="cuda", dtype=torch.bfloat16)
with torch.no_grad():
    ours = per_call_us(lambda: fastconv.conv2d(x, w, b, padding=1, groups=64,
                                               activation="relu", backend="triton"))
    theirs = per_call_us(lambda: F.relu(F.conv2d(x, w, b, padding=1, groups=64)))
print(f"depthwise fwd host us per call: fastconv triton {ours:.1f}, torch {theirs:.1f}, "
      f"difference {ours - theirs:+.1f}")
