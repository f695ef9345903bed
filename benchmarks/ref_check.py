"""Cross-check the bench's float64 GPU reference against a float64 CPU one (GPU).

The tf32 rows of conv1d_short reported relative errors near 4 for every provider on the
causal depthwise cases, and for torch/cuDNN on w2v2_conv0, while the bf16 rows of the
same cases were within contract. For each such case this recomputes, on the first two
batch elements, float64 on the CPU and prints every result's error against it: the bench's
float64 GPU reference, torch fp32 with and without TF32, fastconv's Triton kernels.
"""

import torch
import torch.nn.functional as F

import fastconv
from fastconv.bench.runner import run_case
from fastconv.bench.suites import SUITES
from fastconv.precision import Precision, relative_error


def _conv(case, x, w):
    pad = case.padding_arg()
    if case.causal:
        x, pad = F.pad(x, pad[0]), 0
    return F.conv1d(x, w, None, case.stride, pad, case.dilation, case.groups)


def main():
    names = ("causal_dw_k4_8x4096x2048", "causal_dw_k4_32x2048x1024", "w2v2_conv0_k10_s5",
             "w2v2_conv1_k3_s2")
    for case in (c for c in SUITES["conv1d_short"] if c.name in names):
        x = torch.randn(case.n, case.c, *case.spatial, device="cuda")
        fan_in = case.weight_shape()[1] * case.kernel[0]
        w = torch.randn(case.weight_shape(), device="cuda") / fan_in**0.5
        cpu = _conv(case, x[:2].double().cpu(), w.double().cpu())
        results = {"float64 GPU (bench reference)": _conv(case, x.double(), w.double())}
        torch.backends.cudnn.benchmark = True
        results["float64 GPU, cudnn.benchmark"] = _conv(case, x.double(), w.double())
        torch.backends.cudnn.benchmark = False
        for tf32 in (False, True):
            torch.backends.cudnn.allow_tf32 = tf32
            results[f"torch fp32 tf32={tf32}"] = _conv(case, x, w)
        results["fastconv triton tf32"] = fastconv.conv1d(
            x, w, None, case.stride, case.padding_arg(), case.dilation, case.groups,
            backend="triton", precision="tf32")
        results["fastconv triton bf16"] = fastconv.conv1d(
            x.bfloat16(), w.bfloat16(), None, case.stride, case.padding_arg(), case.dilation,
            case.groups, backend="triton")
        for name, y in results.items():
            print(f"{case.name:<28} {name:<32} rel err vs CPU float64 "
                  f"{relative_error(y[:2].cpu(), cpu):.3e}")
        # the bench's own rows, as `fastconv bench` computes them (tf32 after bf16)
        for precision in (Precision.BF16, Precision.TF32):
            for row in run_case(case, ["torch", "fastconv_triton"], precision, "nchw", reps=3):
                print(f"{case.name:<28} run_case {precision.value} {row['provider']:<16} "
                      f"rel_err {row.get('rel_err', row.get('error'))}")


if __name__ == "__main__":
    main()
