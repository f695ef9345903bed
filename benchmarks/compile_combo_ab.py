"""fastconv.compile in torch.compile's default mode with and without Inductor's combo
kernels, against torch.compile alone, in one process (timm models, eval, bf16 channels-last,
batch 32, 224x224): median ms per call of back-to-back calls (no CUDA graphs: host and GPU).

    python benchmarks/compile_combo_ab.py [model ...]
"""

from __future__ import annotations

import statistics
import sys
import time

import timm
import torch

import fastconv


def ms_per_call(fn, x, calls: int = 20, rounds: int = 7) -> float:
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn(x)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / calls * 1e3)
    return statistics.median(times)


def main() -> None:
    names = sys.argv[1:] or ["convnext_tiny", "resnet50"]
    for name in names:
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False).eval().cuda().to(
            memory_format=torch.channels_last)
        x = torch.randn(32, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
        variants = {
            "torch.compile": torch.compile(model.bfloat16()),
            "fastconv.compile": fastconv.compile(model, "bf16"),
            "fastconv.compile, no combo kernels": fastconv.compile(model, "bf16",
                                                                   combo_kernels=False),
        }
        xb = x.bfloat16()
        with torch.no_grad():
            first = {}
            for k, fn in variants.items():
                t = time.perf_counter()
                fn(xb)
                torch.cuda.synchronize()
                first[k] = time.perf_counter() - t
            for k, fn in variants.items():
                print(f"{name:16s} {k:36s} {ms_per_call(fn, xb):7.3f} ms  "
                      f"(first call {first[k]:5.1f} s)", flush=True)


if __name__ == "__main__":
    main()
