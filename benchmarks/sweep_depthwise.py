"""Time every depthwise tile candidate on the depthwise and causal conv1d layers (GPU;
CUDA-graph timing, four input sets rotated so that small layers do not stay in L2).

Per case, dtype and layout: cuDNN's time (torch, cudnn.benchmark), each candidate's time
for the bare kernel through TritonBackend.bind (the launch the library makes), the best
one's bandwidth (input + output + weight bytes / time) and its speed ratio to cuDNN.
Usage: python benchmarks/sweep_depthwise.py [case names]; DW_VARIANTS=bf16-cf,fp32-cl picks
the dtype/layout variants (default: all four).
"""

import os
import statistics
import sys

import torch
import torch.nn.functional as F
from sweep_fprop import time_configs  # (run as a script: benchmarks/ is on sys.path)

from fastconv import ConvProblem
from fastconv.backends.triton import TritonBackend
from fastconv.tools.bench.report import geomean
from fastconv.tools.bench.runner import time_graph
from fastconv.tools.bench.suites import SUITES

SETS = 4
VARIANTS = [(torch.bfloat16, True), (torch.bfloat16, False), (torch.float32, False),
            (torch.float32, True)]


def _tensors(case, dtype, channels_last):
    x = torch.randn(case.n, case.c, *case.spatial, device="cuda").to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 \
            else x.transpose(1, 2).contiguous().transpose(1, 2)
    w = (torch.randn(case.k, 1, *case.kernel, device="cuda") / 4).to(dtype)
    return x, w


def _torch_conv(case, x, w):
    pad = case.padding_arg()
    if case.causal:
        x, pad = F.pad(x, pad[0]), 0
    conv = F.conv1d if case.rank == 1 else F.conv2d
    return conv(x, w, None, case.stride, pad, case.dilation, case.groups)


def main(names):
    cases = [c for c in SUITES["depthwise"] + SUITES["conv1d_short"]
             if c.groups == c.c and (not names or c.name in names)]
    torch.backends.cudnn.benchmark = True
    print(f"{'case':<28} {'variant':<10} {'cudnn ms':>9} {'best ms':>9} {'GB/s':>6} "
          f"{'ratio':>6}  best config  (runners-up)")
    ratios = {}
    wanted = os.environ.get("DW_VARIANTS")
    for dtype, cl in VARIANTS:
        label = f"{'bf16' if dtype == torch.bfloat16 else 'fp32'}-{'cl' if cl else 'cf'}"
        if wanted and label not in wanted.split(","):
            continue
        for case in cases:
            if case.rank == 1 and cl:
                continue  # the conv1d suite runs channels-first
            sets = [_tensors(case, dtype, cl) for _ in range(SETS)]
            refs = [_torch_conv(case, x, w) for x, w in sets]
            t_cudnn = statistics.median(time_graph(
                [lambda x=x, w=w: _torch_conv(case, x, w) for x, w in sets]))
            x0, w0 = sets[0]
            problem = ConvProblem.from_tensors(x0, w0, None, case.stride, case.padding_arg(),
                                               case.dilation, case.groups, rank=case.rank)
            ref = _torch_conv(case, x0.double(), w0.double())
            outs = [torch.empty_like(r) for r in refs]
            nbytes = (x0.numel() + outs[0].numel() + w0.numel()) * x0.element_size()

            def fns(run):
                return [lambda x=x, w=w, o=o: run(x, w, None, None, None, None, o)
                        for (x, w), o in zip(sets, outs)]
            results = time_configs(case.name, problem, TritonBackend.candidates(problem), fns,
                                   outs[0], ref)
            if not results:
                continue
            best = results[0]
            ratios.setdefault(label, []).append(t_cudnn / best[0])
            others = ", ".join(f"{n} {t:.4f}" for t, n in results[1:4])
            print(f"{case.name:<28} {label:<10} {t_cudnn:9.4f} {best[0]:9.4f} "
                  f"{nbytes / best[0] / 1e6:6.0f} {t_cudnn / best[0]:6.2f}  {best[1]}  "
                  f"({others})", flush=True)
    for label, r in ratios.items():
        print(f"{label}: geomean best-kernel/cuDNN speed ratio {geomean(r):.3f} over "
              f"{len(r)} cases")


if __name__ == "__main__":
    main(sys.argv[1:])
