"""What ``fastconv.optimize`` itself costs (the trace, folding and fusion before the first
call; the models suite's ``prepare_s``), per model: the median over fresh model objects.

    python benchmarks/optimize_cost.py [--device cpu] [--reps 7] [MODEL ...]

MODEL: a models-suite name as ``fastconv tune --model`` takes it (default: issue 21's seven).
Run it under two source trees (``PYTHONPATH=OLD/src`` and this one), alternating processes,
for a before/after; the host is noisy, so compare medians of one machine only.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import fastconv
from fastconv.tools.tune import build

MODELS = ("timm_resnet50", "resnet50", "timm_mobilenetv3_large_100", "timm_efficientnet_b0",
          "timm_convnext_tiny", "timm_resnext50_32x4d", "deeplabv3_r50")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=MODELS)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--precision", default="bf16")
    args = ap.parse_args()
    half = args.precision in ("bf16", "fp16")
    fastconv.optimize(build("resnet50").eval().to(args.device), "inference", args.precision,
                      channels_last=half)  # first-use imports out of the figures
    print(f"fastconv {fastconv.__file__}, {args.device}, {args.precision}")
    for name in args.models:
        times = []
        for _ in range(args.reps):
            model = build(name).eval().to(args.device)
            if args.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fastconv.optimize(model, "inference", args.precision, channels_last=half)
            if args.device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        print(f"{name:30s} median {statistics.median(times):.3f} s "
              f"(min {min(times):.3f}, max {max(times):.3f}, {args.reps} runs)")


if __name__ == "__main__":
    main()
