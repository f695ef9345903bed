"""Whether an eager model forward is host- or GPU-bound (GPU): a models-suite model, torch's
own and ``fastconv.optimize``'d (``--precision``: as ``model_host_profile.model_pair``
builds them), each warmed up; then per forward the GPU time and the host time
(``costs.time_costs``: the calls queued behind a spinning kernel, so CUDA events see the GPU
alone and the wall clock the host alone) and the synchronised wall time, in interleaved
rounds (medians) -- beside ``fastconv.nn.convert`` (the model's own module tree, its
convolutions swapped) -- and which backend each fastconv convolution's plan runs. (A host
time above the wall time means the launch queue filled: the host waited for the GPU, so read
the wall time.)

    PYTHONPATH=src python benchmarks/model_eager_split.py timm_convnext_tiny [MODEL ...] \
        [--precision tf32] [--aten]
"""

import argparse
import collections
import statistics
import time

import torch
from model_host_profile import model_pair

import fastconv
from fastconv.costs import time_costs


def _wall(fn, calls: int = 20) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "tf32", "ieee"))
    ap.add_argument("--no-convert", action="store_true", help="no fastconv.nn.convert row")
    ap.add_argument("--aten", action="store_true",
                    help="also a row for the optimized model with every convolution's backend "
                         "set to aten (what the Triton plans' eager choices gain or cost)")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True  # as the models bench runs both
    for name in args.models:
        net, x, torch_model, fast = model_pair(name, args.batch, args.precision)
        half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
        swapped = fastconv.nn.convert(net)  # the module tree kept, convolutions swapped

        def convert_fn():
            with torch.autocast("cuda", half or torch.float32, enabled=half is not None):
                return swapped(x)

        fns = {"torch": lambda: torch_model(x), "fastconv": lambda: fast(x),
               "convert": convert_fn}
        if args.aten:
            aten = fastconv.optimize(net, mode="inference", precision=args.precision,
                                     channels_last=half is not None)
            for mod in aten.modules():
                if hasattr(mod, "backend") and hasattr(mod, "_planned"):
                    mod.backend = "aten"
            fns["fc-aten"] = lambda: aten(x)
        if args.no_convert:
            del fns["convert"]
        got = collections.defaultdict(list)
        with torch.no_grad():
            for fn in fns.values():
                for _ in range(3):
                    fn()
                    fastconv.dispatch.finish_builds(upgrades=True)
            for _ in range(args.rounds):
                for who, fn in fns.items():
                    gpu, host = time_costs(fn, warmup=2, batches=3, per_batch=5)
                    got[who].append((gpu, host, _wall(fn)))
        for who, rows in got.items():
            gpu, host, wall = (statistics.median(r[i] for r in rows) for i in range(3))
            print(f"{name} b{args.batch} {who:9s} GPU {gpu:7.3f} ms  host {host:7.3f} ms  "
                  f"wall {wall:7.3f} ms per forward")
        backends = collections.Counter()
        for mod in fast.modules():
            plan = mod.__dict__.get("_plan")
            if plan is not None and plan[1] is not None:
                p = plan[1]
                kind = "dw" if p.problem.depthwise else "conv"
                backends[f"{kind}:{p.backend}{' (provisional)' if p.provisional else ''}"] += 1
        print(f"  fastconv plans: {dict(backends)}")


if __name__ == "__main__":
    main()
