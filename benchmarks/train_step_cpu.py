"""Host cost of a whole eager training step (forward, backward, SGD) on the CPU: torch's own
model against ``optimize(model, "training")``, at a tiny size (batch 2, 32x32, float32, one
thread) where the step is mostly host work. Medians of alternating steps.

On the CPU fastconv's convolutions go through dispatch (its CPU choice, aten, differentiated
by torch's autograd where ``plans._native`` allows); ``--gpu-path`` makes them take the path
eager GPU training runs (``plans._eager_native``: torch's own convolution and autograd,
untimed), so the rows compare the two libraries' host layers as a GPU host runs them,
without a GPU's noise. ``--precision``: optimize's (default: its default).

    PYTHONPATH=src python benchmarks/train_step_cpu.py [--gpu-path] [--precision P]
        [--reps 15] MODEL ...
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import time

import torch

import fastconv
from fastconv import plans
from fastconv.tools.bench import models
from fastconv.tools.tune import build

_EAGER_NATIVE = plans._eager_native


def _native_everywhere(problem) -> bool:
    """``plans._eager_native``, asked as if the problem were on the GPU."""
    return _EAGER_NATIVE(dataclasses.replace(problem, device="cuda"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--gpu-path", action="store_true")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--precision", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.gpu_path:
        plans._eager_native = _native_everywhere
    x = torch.randn(2, 3, 32, 32)
    print(f"torch {torch.__version__}, CPU, 1 thread, batch 2, 32x32, float32; "
          f"fastconv convolutions on {'the GPU eager path' if args.gpu_path else 'the CPU path'}"
          f", precision {args.precision or 'default'}")
    for name in args.models:
        torch.manual_seed(0)
        model = build(name).train()
        nets = {"torch": copy.deepcopy(model),
                "fastconv": fastconv.optimize(model, "training", args.precision)}
        steps = {}
        for key, net in nets.items():
            opt = torch.optim.SGD(net.parameters(), lr=1e-4)

            def step(net=net, opt=opt):
                models.output(net(x)).float().square().mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            step()
            step()
            steps[key] = step
        times = {key: [] for key in steps}
        for _ in range(args.reps):
            for key, step in steps.items():
                start = time.perf_counter()
                step()
                times[key].append(time.perf_counter() - start)
        ms = {key: statistics.median(v) * 1e3 for key, v in times.items()}
        print(f"{name:30s} torch {ms['torch']:7.2f} ms  fastconv {ms['fastconv']:7.2f} ms  "
              f"torch / fastconv {ms['torch'] / ms['fastconv']:.3f}")


if __name__ == "__main__":
    main()
