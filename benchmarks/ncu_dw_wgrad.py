"""One dw_wgrad weight gradient on a depthwise_models layer, for Nsight Compute (GPU):
    ncu --kernel-name regex:_dw_wgrad --launch-skip 2 --launch-count 1 --section ... \
        python3 benchmarks/ncu_dw_wgrad.py CASE CONFIG
CONFIG as DwConfig fields: block_a,block_b,num_warps,roll (e.g. 8,16,2,64, the sweep's best
tile for dwm_96_56_k7)."""

import sys

import torch

from fastconv.backends.triton.depthwise import DwConfig
from fastconv.backends.triton.dw_wgrad import launch_wgrad
from fastconv.tools.bench.suites import SUITES

case = next(c for c in SUITES["depthwise_models"] if c.name == sys.argv[1])
a, b, w, r = (int(v) for v in sys.argv[2].split(","))
x = torch.randn(case.n, case.c, *case.spatial, device="cuda").to(torch.bfloat16)
x = x.contiguous(memory_format=torch.channels_last)
wt = torch.randn(case.k, 1, *case.kernel, device="cuda").to(torch.bfloat16)
dy = torch.nn.functional.conv2d(x, wt, None, case.stride, case.padding_arg(), case.dilation,
                                case.groups)
dy = torch.randn_like(dy).contiguous(memory_format=torch.channels_last)
dw = torch.empty_like(wt, dtype=torch.float32)
for _ in range(4):
    launch_wgrad(dy, x, dw, stride=(case.stride,) * 2, pad=(case.padding,) * 2,
                 dilation=(case.dilation,) * 2, config=DwConfig(a, b, w, roll=r), int64=False)
ref = torch.ops.aten.convolution_backward(
    dy.double(), x.double(), wt.double(), None, [case.stride] * 2, [case.padding] * 2,
    [case.dilation] * 2, False, [0, 0], case.groups, [False, True, False])[1]
print(f"{case.name} dw{a}x{b}w{w}r{r}: rel. err {float((dw - ref).norm() / ref.norm()):.1e}")
