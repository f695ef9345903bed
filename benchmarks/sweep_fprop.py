"""Time every Triton fprop candidate on ResNet-50 layers (GPU; CUDA-graph timing).

For each case and dtype: cuDNN's time (torch, cudnn.benchmark, channels-last) and each
candidate configuration's time for the bare kernel on channels-last tensors — the numbers
that say what the kernel itself reaches, without host overhead or layout copies (through
TritonBackend.bind, so the launch is the one the library makes). Prints one
line per case: best configuration, its time, cuDNN's, the ratio, the runners-up.
"""

import statistics
import sys

import torch
import torch.nn.functional as F

from fastconv import ConvProblem
from fastconv.backends.triton import TritonBackend
from fastconv.backends.triton.configs import fprop_candidates
from fastconv.bench.report import geomean
from fastconv.bench.runner import time_graph
from fastconv.bench.suites import SUITES
from fastconv.precision import relative_error


def time_configs(name, problem, configs, fns_of, out, ref):
    """[(median ms, config name)] of each configuration that compiles and matches ``ref``
    (``out`` after the first of ``fns_of(bound run)``), fastest first; the others are
    reported and left out."""
    results = []
    for cfg in configs:
        fns = fns_of(TritonBackend.bind(problem, cfg))
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


def main(names):
    cases = [c for c in SUITES["resnet50"] + SUITES["seed000"][:1] if not names or c.name in names]
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    print(f"{'case':<24} {'dtype':<9} {'cudnn ms':>9} {'best ms':>9} {'ratio':>6}  best config"
          "  (runners-up)")
    ratios = {}
    for dtype in (torch.float32, torch.bfloat16):
        for case in cases:
            x = torch.randn(case.n, case.c, *case.spatial, device="cuda").to(dtype)
            x = x.contiguous(memory_format=torch.channels_last)
            w = (torch.randn(case.k, case.c, *case.kernel, device="cuda") / 30).to(dtype)
            w = w.contiguous(memory_format=torch.channels_last)
            ref = F.conv2d(x, w, None, case.stride, case.padding)
            t_cudnn = statistics.median(time_graph(
                [lambda: F.conv2d(x, w, None, case.stride, case.padding)]))
            out = torch.empty_like(ref)
            problem = ConvProblem.from_tensors(x, w, None, case.stride, case.padding, rank=2,
                                               precision="tf32" if dtype == torch.float32
                                               else None)
            def fns(run):
                return [lambda: run(x, w, None, None, None, None, out)]
            results = time_configs(case.name, problem, fprop_candidates(problem), fns, out,
                                   ref)
            best = results[0]
            ratios.setdefault(str(dtype), []).append(t_cudnn / best[0])
            others = ", ".join(f"{n} {t:.4f}" for t, n in results[1:3])
            print(f"{case.name:<24} {str(dtype)[6:]:<9} {t_cudnn:9.4f} {best[0]:9.4f} "
                  f"{t_cudnn / best[0]:6.2f}  {best[1]}  ({others})", flush=True)
    for dt, r in ratios.items():
        print(f"{dt}: geomean kernel/cuDNN speed ratio {geomean(r):.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
