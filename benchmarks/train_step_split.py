"""Whether an eager training step (forward, backward, SGD: the models bench's ``train`` step)
is host- or GPU-bound, torch against ``fastconv.optimize`` (GPU). Per model, in interleaved
rounds (medians): the step's GPU time and host time (``costs.time_costs``: the calls queued
behind a spinning kernel; a host time above the wall time means the launch queue filled),
its synchronised wall time, and the same split for the forward alone (with autograd); which
backend each fastconv convolution runs. ``--kernels``: the CUDA kernels of a step
(torch.profiler), the largest differences from torch's. ``--profile``: where the host time
of a step goes (cProfile: cumulative ms per step of the forward (counted twice: the bench's
forward and its wrapper), the backward, the optimizer step; the top own-time functions).
cProfile slows Python frames, fastconv's more than torch's: read its rows for structure,
the wall column for speed.

    PYTHONPATH=src python benchmarks/train_step_split.py timm_resnet50_b32 [CASE ...] \
        [--precision bf16] [--aten] [--kernels] [--profile] [--top 15]
"""

import argparse
import collections
import pstats
import statistics

import torch
from model_eager_split import _wall
from model_host_profile import profiled
from timm_steps import kernels_by_name
from torch.profiler import ProfilerActivity, profile

import fastconv
from fastconv.costs import time_costs
from fastconv.precision import Precision
from fastconv.tools.bench import models


def _steps(case: models.ModelCase, precision: Precision, aten: bool):
    """``({variant: step}, {variant: forward alone, with autograd}, {variant: model})``."""
    torch.manual_seed(0)
    net = models.BUILDERS[case.model]().cuda().train()
    x = torch.randn(case.batch, 3, case.size, case.size, device="cuda")
    half = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(precision)
    steps, nets = {}, {}
    for who in ("torch", "fastconv") + (("fc-aten",) if aten else ()):
        steps[who], nets[who] = models._callable(who.replace("fc-aten", "fastconv"), net, x,
                                                 precision, "train")
    if aten:
        for mod in nets["fc-aten"].modules():
            if hasattr(mod, "backend") and hasattr(mod, "_planned"):
                mod.backend = "aten"
    x_torch = x if half is None else x.contiguous(memory_format=torch.channels_last)

    def torch_forward():
        with torch.autocast("cuda", half or torch.float32, enabled=half is not None):
            return nets["torch"](x_torch)
    forwards = {who: (torch_forward if who == "torch" else (lambda n=n: n(x)))
                for who, n in nets.items()}
    return steps, forwards, nets


def _census(net) -> str:
    """Which backend each convolution's kept plan runs (native: torch's autograd)."""
    got = collections.Counter()
    for mod in net.modules():
        plan = mod.__dict__.get("_plan")
        if plan is not None and plan[1] is not None:
            p = plan[1]
            got[f"{'dw' if p.problem.depthwise else 'conv'}:{p.backend}"
                f"{' native' if p.native_grad else ''}"] += 1
        elif hasattr(mod, "_planned"):
            got["general path (ConvFunction)"] += 1
    return ", ".join(f"{k} {n}" for k, n in got.most_common())


def _kernels(step, calls: int = 3) -> dict:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    return {k: (n / calls, us / calls) for k, (n, us) in kernels_by_name(prof).items()}


def _phases(stats: pstats.Stats, calls: int) -> str:
    """Cumulative ms per step of the step's parts (by function name)."""
    parts = {"forward": ("forward", "models.py"), "backward": ("backward", "_tensor.py"),
             "opt.step": ("step", "sgd.py"), "zero_grad": ("zero_grad", "optimizer.py")}
    got = []
    for label, (func, file) in parts.items():
        cum = sum(v[3] for (f, _, fn), v in stats.stats.items()
                  if fn == func and f.endswith(file))
        got.append(f"{label} {cum / calls * 1e3:.2f}")
    return ", ".join(got)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="+", help="models-suite case names (timm_resnet50_b32)")
    ap.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "tf32", "ieee"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--profile", action="store_true", help="also the cProfile rows")
    ap.add_argument("--kernels", action="store_true",
                    help="also the CUDA kernels of a step (torch.profiler), the largest "
                         "per-name differences from torch's")
    ap.add_argument("--aten", action="store_true",
                    help="also fastconv with every convolution's backend set to aten")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True  # as the models bench runs both
    precision = Precision(args.precision)
    cases = {c.name: c for c in models.CASES}
    for name in args.cases:
        steps, forwards, nets = _steps(cases[name], precision, args.aten)
        for step in steps.values():
            for _ in range(3):
                step()
                fastconv.dispatch.finish_builds(upgrades=True)
        got = collections.defaultdict(list)
        for _ in range(args.rounds):
            for who, step in steps.items():
                gpu, host = time_costs(step, warmup=2, batches=3, per_batch=3)
                fgpu, fhost = time_costs(forwards[who], warmup=2, batches=3, per_batch=3)
                got[who].append((gpu, host, _wall(step, 10), fgpu, fhost))
        for who, rows in got.items():
            gpu, host, wall, fgpu, fhost = (statistics.median(r[i] for r in rows)
                                            for i in range(5))
            print(f"{name} {args.precision} {who:9s} step: GPU {gpu:7.2f} ms  host {host:7.2f}"
                  f" ms  wall {wall:7.2f} ms; forward alone: GPU {fgpu:6.2f} host {fhost:6.2f}"
                  f" ms")
        for who, net in nets.items():
            if who != "torch":
                print(f"  {who} plans: {_census(net)}")
        if args.kernels:
            ks = {who: _kernels(step) for who, step in steps.items()}
            for who, k in ks.items():
                print(f"  {who}: {sum(n for n, _ in k.values()):.0f} kernels, "
                      f"{sum(us for _, us in k.values()) / 1e3:.2f} ms per step")
                if who == "torch":
                    continue
                diff = {n: k.get(n, (0, 0))[1] - ks["torch"].get(n, (0, 0))[1]
                        for n in set(k) | set(ks["torch"])}
                for n, d in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:10]:
                    print(f"    {d:+8.1f} us  x{k.get(n, (0, 0))[0]:.0f} vs "
                          f"x{ks['torch'].get(n, (0, 0))[0]:.0f}  {n}")
        for who, step in steps.items() if args.profile else ():
            print(f"  {who} under cProfile, own us per step (calls per step):")
            stats = profiled(step, 5, args.top)
            print(f"  {who}: cumulative ms per step: {_phases(stats, 5)}")


if __name__ == "__main__":
    main()
