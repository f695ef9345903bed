"""Time every Triton fprop candidate on ResNet-50 layers, or on the cases of the suite named
by ``--suite`` (GPU; CUDA-graph timing).

For each case and dtype: cuDNN's time (torch, cudnn.benchmark) and each candidate
configuration's time, through TritonBackend.bind, so the launch (and any layout copy) is the
one the library makes. Rank-2 tensors are channels-last (the numbers that say what the kernel
itself reaches, without layout copies); rank-1 tensors are NCL, as conv1d users hand them
(torch has no channels-last 3-D tensors). Prints one line per case: best configuration, its
time, cuDNN's, the ratio, the runners-up.

Usage: python3 benchmarks/sweep_fprop.py [--rows-grid] [--suite NAME] [case names...]
--rows-grid adds row tiles (TileConfig.rows) of a grid of shapes beyond dispatch's list, and
flat-reduction variants of its row tiles, for the rank-1 cases: a search for better entries.
"""

import dataclasses
import itertools
import statistics
import sys

import torch
import torch.nn.functional as F

from fastconv import ConvProblem
from fastconv.backends.triton import TritonBackend
from fastconv.backends.triton.configs import TileConfig
from fastconv.precision import relative_error
from fastconv.tools.bench.report import geomean
from fastconv.tools.bench.suites import SUITES
from fastconv.tools.bench.timers import time_graph


def time_configs(name, problem, configs, fns_of, out, ref, op="fprop"):
    """[(median ms, config name)] of each configuration that compiles and matches ``ref``
    (``out`` after the first of ``fns_of(bound run)``; ``op``'s run), fastest first; the
    others are reported and left out."""
    results = []
    for cfg in configs:
        fns = fns_of(TritonBackend.bind(problem, cfg, op))
        try:
            fns[0]()
            err = relative_error(out, ref)
            t = statistics.median(time_graph(fns, reps=10, calls=8))
        except Exception as exc:  # e.g. out of shared memory, a compile failure
            print(f"  {name} {cfg.name()}: {type(exc).__name__}: {exc}"[:300])
            continue
        if err > 2e-2:
            print(f"  {name} {cfg.name()}: WRONG rel err {err:.2e}")
            continue
        results.append((t, cfg.name()))
    return sorted(results)


def rows_grid(problem, listed):
    """Row tiles of shapes (block_m 64/128, block_n 64-256, two reduction depths, 4 or 8
    warps) not in ``listed``, and flat-reduction twins of the listed row tiles."""
    half = problem.dtype != torch.float32
    grid = [TileConfig(bm, bn, bk, w, st, False, rows=True)
            for bm, bn, bk, (w, st) in itertools.product(
                (64, 128), (64, 128, 256), (32, 64) if half else (16, 32), ((4, 4), (8, 3)))
            if bn <= max(64, problem.k_per_group)]
    flat = [dataclasses.replace(t, flat_k=True) for t in listed if getattr(t, "rows", False)]
    return [t for t in grid + flat if t not in listed]


def main(args):
    grid = args[:1] == ["--rows-grid"]
    args = args[1:] if grid else args
    suite = args[1] if args[:1] == ["--suite"] else None
    names = args[2:] if suite else args
    cases = SUITES[suite] if suite else SUITES["resnet50"] + SUITES["seed000"][:1]
    cases = [c for c in cases if not names or c.name in names]
    conv = {1: F.conv1d, 2: F.conv2d}
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    print(f"{'case':<24} {'dtype':<9} {'cudnn ms':>9} {'best ms':>9} {'ratio':>6}  best config"
          "  (runners-up)")
    ratios = {}
    for dtype in (torch.float32, torch.bfloat16):
        for case in cases:
            x = torch.randn(case.n, case.c, *case.spatial, device="cuda").to(dtype)
            w = (torch.randn(case.k, case.c // case.groups, *case.kernel, device="cuda")
                 / 30).to(dtype)
            if case.rank == 2:
                x = x.contiguous(memory_format=torch.channels_last)
                w = w.contiguous(memory_format=torch.channels_last)
            args = (case.stride, case.padding, case.dilation, case.groups)
            ref = conv[case.rank](x, w, None, *args)
            t_cudnn = statistics.median(time_graph(
                [lambda: conv[case.rank](x, w, None, *args)]))
            out = torch.empty_like(ref)
            problem = ConvProblem.from_tensors(x, w, None, *args, rank=case.rank,
                                               precision="tf32" if dtype == torch.float32
                                               else None)
            def fns(run):
                return [lambda: run(x, w, None, None, None, None, out)]
            configs = TritonBackend.candidates(problem)
            if grid and case.rank == 1:
                configs = configs + rows_grid(problem, configs)
            results = time_configs(case.name, problem, configs, fns, out, ref)
            best = results[0]
            ratios.setdefault(str(dtype), []).append(t_cudnn / best[0])
            others = ", ".join(f"{n} {t:.4f}" for t, n in results[1:6])
            print(f"{case.name:<24} {str(dtype)[6:]:<9} {t_cudnn:9.4f} {best[0]:9.4f} "
                  f"{t_cudnn / best[0]:6.2f}  {best[1]}  ({others})", flush=True)
    for dt, r in ratios.items():
        print(f"{dt}: geomean kernel/cuDNN speed ratio {geomean(r):.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
