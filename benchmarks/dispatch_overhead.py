"""Dispatch overhead on a cached choice: host time per call of ``fastconv.conv2d`` (auto)
minus the chosen backend's own bound callable (``plan.run``) on the same tensors, and torch's
``F.conv2d`` for scale. Tiny problem (GPU time negligible against the host), no grad, median
of 7 rounds of 2000 calls, synchronised at the end of each round.

Usage (GPU): PYTHONPATH=src python benchmarks/dispatch_overhead.py
"""

import statistics
import time

import torch
import torch.nn.functional as F

import fastconv
from fastconv import plans


def per_call_us(fn, calls=2000, rounds=7):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def main():
    x = torch.randn(2, 16, 12, 12, device="cuda").contiguous(memory_format=torch.channels_last)
    w = torch.randn(16, 16, 3, 3, device="cuda").contiguous(memory_format=torch.channels_last)
    b = torch.randn(16, device="cuda")
    with torch.no_grad():
        for act in ("none", "relu"):
            bias = b if act == "relu" else None
            args = (2, False, x, w, bias, 1, 1, 1, 1, 0, act, 0.01, None, None, None, None,
                    "auto", "tf32")
            plan = plans.forward_plan(*args)
            fc = per_call_us(lambda: fastconv.conv2d(x, w, bias, 1, 1, activation=act,
                                                     precision="tf32"))
            direct = per_call_us(lambda: plan.run(x, w, bias, None, None, None, None))
            ref = per_call_us(lambda: F.relu(F.conv2d(x, w, bias, 1, 1)) if act == "relu"
                              else F.conv2d(x, w, None, 1, 1))
            print(f"{act:5s} choice {plan.backend:7s} fastconv.conv2d {fc:6.1f} us  "
                  f"plan.run {direct:6.1f} us  dispatch overhead {fc - direct:5.1f} us  "
                  f"torch {ref:6.1f} us")


if __name__ == "__main__":
    main()
