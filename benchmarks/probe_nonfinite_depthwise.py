"""Which torch paths skip a depthwise convolution's padded taps on the GPU: an infinite
weight at a corner tap, counts of NaN outputs for torch with cuDNN on and off and for each
fastconv backend, fp32 NCHW and bf16 channels-last (issue 27, row 3).

Usage (GPU): PYTHONPATH=src python benchmarks/probe_nonfinite_depthwise.py
"""

import torch
import torch.nn.functional as F

import fastconv

x = torch.randn(2, 8, 9, 10, device="cuda")
w = torch.randn(8, 1, 3, 3, device="cuda")
w[0, 0, 0, 0] = float("inf")
for dtype, channels_last in ((torch.float32, False), (torch.bfloat16, True)):
    xx, ww = x.to(dtype), w.to(dtype)
    if channels_last:
        xx = xx.contiguous(memory_format=torch.channels_last)
    layout = "cl" if channels_last else "nchw"
    for cudnn in (True, False):
        torch.backends.cudnn.enabled = cudnn
        y = F.conv2d(xx, ww, None, 1, 1, 1, 8)
        path = "torch cudnn" if cudnn else "torch native"
        print(dtype, layout, path, "nan:", int(y.isnan().sum()))
    torch.backends.cudnn.enabled = True
    for backend in ("triton", "cudnn", "aten"):
        try:
            y = fastconv.conv2d(xx, ww, None, 1, 1, 1, 8, backend=backend)
            print(dtype, "fastconv", backend, "nan:", int(y.isnan().sum()))
        except Exception as e:
            print(dtype, "fastconv", backend, "error", type(e).__name__, str(e)[:80])
