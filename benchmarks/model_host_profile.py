"""Where an eager model forward's host time goes (GPU): a models-suite model (timm or
torchvision, bf16 channels-last, eval), torch's own and ``fastconv.optimize``'d, each
warmed up, then the wall clock per forward and a cProfile of ``--calls`` forwards (own
time per forward, microseconds; cProfile inflates every Python call alike: read shares).

    PYTHONPATH=src python benchmarks/model_host_profile.py --model timm_convnext_tiny [--batch 32]
"""

import argparse
import cProfile
import pstats
import time

import torch

import fastconv
from fastconv.bench import models


def _wall(fn, x, calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="timm_convnext_tiny")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    net = models.BUILDERS[args.model]().cuda().eval().to(memory_format=torch.channels_last)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda").to(
        memory_format=torch.channels_last)
    fast = fastconv.optimize(net, mode="inference", precision="bf16")

    def torch_fn(t):
        with torch.autocast("cuda", torch.bfloat16):
            return net(t)

    with torch.no_grad():
        for name, fn in (("torch", torch_fn), ("fastconv", fast)):
            for _ in range(3):
                fn(x)
                # (kernels left compiling in the background run as aten until built)
                fastconv.dispatch.finish_builds()
            print(f"{args.model} b{args.batch} {name}: {_wall(fn, x, args.calls):.2f} ms per "
                  f"eager forward (wall, synchronised)")
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.calls):
                fn(x)
            torch.cuda.synchronize()
            prof.disable()
            stats = pstats.Stats(prof)
            rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:args.top]
            print(f"  own time per forward, us (calls per forward), top {args.top}:")
            for (file, line, func), (_, ncalls, tottime, _, _) in rows:
                where = file.split("site-packages/")[-1].split("src/")[-1]
                print(f"  {tottime / args.calls * 1e6:9.1f} {ncalls / args.calls:7.1f}  "
                      f"{where}:{line}({func})")


if __name__ == "__main__":
    main()
