"""Benchmark dispatch's two GPU timings on real candidates (GPU only): for each problem, every
candidate's back-to-back GPU time (warm L2) and its time replayed from a CUDA graph on
rotated operands (``graph_ms``), the eager and the graph choice, and whether any timed
candidate lacks a graph time (with its reason). Covers forward candidates of aten, cuDNN
and Triton, a forward timed with its backward (grad trials capture autograd), and the data
and weight gradients' own choices. Also the tuning time per problem.

    PYTHONPATH=src python benchmarks/graph_timing_check.py [--budget default|exhaustive]
"""

from __future__ import annotations

import argparse
import time

import torch

import fastconv
from fastconv import dispatch


def _cl(t):
    return t.contiguous(memory_format=torch.channels_last)


def problems():
    bf = dict(device="cuda", dtype=torch.bfloat16)
    yield "bf16 CL 3x3 64ch 56^2 b32", _cl(torch.randn(32, 64, 56, 56, **bf)), \
        _cl(torch.randn(64, 64, 3, 3, **bf) / 24), dict(padding=1)
    yield "bf16 CL 1x1 256->64 56^2 b32 +bias+relu", _cl(torch.randn(32, 256, 56, 56, **bf)), \
        _cl(torch.randn(64, 256, 1, 1, **bf) / 16), dict(bias=torch.randn(64, **bf),
                                                           activation="relu")
    yield "tf32 NCHW 1x1 1024->256 14^2 b32", torch.randn(32, 1024, 14, 14, device="cuda"), \
        torch.randn(256, 1024, 1, 1, device="cuda") / 32, dict(precision="tf32")
    yield "bf16 CL dw 3x3 576ch 14^2 b32", _cl(torch.randn(32, 576, 14, 14, **bf)), \
        _cl(torch.randn(576, 1, 3, 3, **bf) / 3), dict(padding=1, groups=576)
    yield "tf32 NCL conv1d 128->256 k3 (seed002 c128_256)", \
        torch.randn(16, 128, 4096, device="cuda"), torch.randn(256, 128, 3, device="cuda") / 20, \
        dict(padding=1, precision="tf32")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", default="default")
    args = parser.parse_args()
    if args.budget == "exhaustive":
        dispatch.tuning_budget()
    else:
        dispatch.tuning_budget(*dispatch.DEFAULT_BUDGET)
    missing = 0
    for what, x, w, kw in problems():
        conv = fastconv.conv1d if x.dim() == 3 else fastconv.conv2d
        for graph in (False, True):
            with dispatch.settings(graph=graph):
                start = time.perf_counter()
                ex = fastconv.explain(x, w, dispatch="benchmark", **kw)
                took = time.perf_counter() - start
            print(f"== {what} ({'graph' if graph else 'eager'} ranking; {took:.1f} s)")
            print(ex)
            for r in ex.rows:
                if r.timed and r.graph_ms is None:
                    missing += 1
        # a call that needs gradients: its forward timed with its backward, then dgrad/wgrad
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        start = time.perf_counter()
        with dispatch.settings("benchmark"):
            conv(xg, wg, **kw).float().square().mean().backward()
        torch.cuda.synchronize()
        print(f"   fwd+bwd call tuned in {time.perf_counter() - start:.1f} s")
    rows = [(k, e) for k, e in dispatch.CACHE.items() if "|benchmark|" in k]
    grads = [(k, e) for k, e in rows if "|dgrad|" in k or "|wgrad|" in k or "+grad" in k]
    print(f"\n{len(rows)} benchmark choices in memory; gradient-related {len(grads)}:")
    for k, e in grads:
        print(f"  {k.split('|')[1]:5s} {k.rsplit('|', 1)[1]:10s} {e['backend']:6s} "
              f"gpu {e['gpu_ms']} graph {e.get('graph_ms')}")
    lacking = [k for k, e in rows if e.get("graph_ms") is None]
    print(f"timed rows without a graph time: {missing}; stored choices without one: "
          f"{len(lacking)}")


if __name__ == "__main__":
    main()
