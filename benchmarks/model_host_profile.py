"""Where an eager model forward's host time goes (GPU): a models-suite model (timm or
torchvision, eval; bf16/fp16 channels-last with autocast, tf32/ieee NCHW, as the models
bench runs them, with cudnn.benchmark on unless ``--cudnn-benchmark off``), torch's own
and ``fastconv.optimize``'d, each warmed up (fastconv's background builds waited for, as
the bench waits), then the wall clock per forward, fastconv's layers' plans by backend, and
a cProfile of ``--calls`` forwards (own time per forward, microseconds; cProfile inflates
every Python call alike: read shares).

    PYTHONPATH=src python benchmarks/model_host_profile.py --model timm_convnext_tiny \
        [--batch 32] [--precision tf32]
"""

import argparse
import collections
import cProfile
import pstats
import time

import torch

import fastconv
from fastconv.tools.bench import models


def _wall(fn, x, calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e3


def model_pair(name: str, batch: int, precision: str):
    """A models-suite model on the GPU as the models bench runs it (eval; bf16/fp16:
    channels-last under autocast, tf32/ieee: NCHW float32 with cuDNN's TF32 flag set to
    match), an input, torch's forward ``torch_fn(x)`` and the ``fastconv.optimize``'d model:
    ``(net, x, torch_fn, fast)``."""
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    net = models.BUILDERS[name]().cuda().eval()
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    if half is not None:
        net, x = (t.to(memory_format=torch.channels_last) for t in (net, x))
    fast = fastconv.optimize(net, mode="inference", precision=precision,
                             channels_last=half is not None)

    def torch_fn(t):
        with torch.autocast("cuda", half or torch.float32, enabled=half is not None):
            return net(t)
    return net, x, torch_fn, fast


def profiled(fn, calls: int, top: int) -> pstats.Stats:
    """cProfile of ``calls`` calls of ``fn`` (synchronised after); prints the ``top``
    functions by own time: us per call, and how many times each ran per call."""
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof)
    for (file, line, func), (_, ncalls, tottime, _, _) in sorted(
            stats.stats.items(), key=lambda kv: -kv[1][2])[:top]:
        where = file.split("site-packages/")[-1].split("src/")[-1]
        print(f"  {tottime / calls * 1e6:9.1f} {ncalls / calls:7.1f}  {where}:{line}({func})")
    return stats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="timm_convnext_tiny")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "tf32", "ieee"))
    ap.add_argument("--cudnn-benchmark", default="on", choices=("on", "off"),
                    help="torch.backends.cudnn.benchmark for both models (off: torch's default)")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark == "on"
    net, x, torch_fn, fast = model_pair(args.model, args.batch, args.precision)

    with torch.no_grad():
        for name, fn in (("torch", torch_fn), ("fastconv", fast)):
            start = time.perf_counter()
            fn(x)
            torch.cuda.synchronize()
            print(f"{args.model} b{args.batch} {args.precision} {name}: first call "
                  f"{time.perf_counter() - start:.2f} s (torch's ran first)")
            # (kernels left compiling in the background run provisional plans until built)
            fastconv.dispatch.finish_builds(upgrades=True)
            for _ in range(3):
                fn(x)
            print(f"  {_wall(fn, x, args.calls):.2f} ms per eager forward (wall, "
                  f"synchronised)")
            if fn is fast:
                held = [m.__dict__["_plan"][1] for m in fast.modules()
                        if m.__dict__.get("_plan") and m.__dict__["_plan"][1] is not None]
                census = collections.Counter((p.backend, getattr(p.run, "__name__", "?"))
                                             for p in held)
                print("  the layers' plans: " + ", ".join(
                    f"{n} {backend} ({run})" for (backend, run), n in census.most_common()))
            print(f"  own time per forward, us (calls per forward), top {args.top}:")
            profiled(lambda: fn(x), args.calls, args.top)


if __name__ == "__main__":
    main()
