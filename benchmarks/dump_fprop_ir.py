"""Write the TTGIR and PTX of the fprop kernel and of the probe's plain GEMM for one 1x1
problem (bf16, 128x128x64, 8 warps, 3 stages) under $OUT, for reading off the device."""

import os

import torch

from benchmarks.probe_fprop import _gemm_kernel
from fastconv.backends.triton import fprop
from fastconv.backends.triton.configs import TileConfig

out_dir = os.environ.get("OUT", "out")
n, c, k, hw = 32, 512, 2048, 7
x = torch.randn(n, c, hw, hw, device="cuda", dtype=torch.bfloat16)
x = x.contiguous(memory_format=torch.channels_last)
w = torch.randn(k, c, 1, 1, device="cuda", dtype=torch.bfloat16).contiguous(
    memory_format=torch.channels_last)
o = torch.empty(n, k, hw, hw, device="cuda", dtype=torch.bfloat16,
                memory_format=torch.channels_last)
fprop.launch_fprop(x, w, o, None, None, None, stride=(1, 1), pad=(0, 0), dilation=(1, 1),
                   groups=1, act_code=0, negative_slope=0.0, precision="ieee",
                   config=TileConfig(128, 128, 64, 8, 3, False), int64=False, bounds_post=False)
a = x.permute(0, 2, 3, 1).reshape(-1, c)
m = a.shape[0]
cm = o.permute(0, 2, 3, 1).view(-1, k)
_gemm_kernel[(13 * 16,)](a, w.view(k, c), cm, m, k, c, a.stride(0), c, cm.stride(0),
                         BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8,
                         num_stages=3)
for name, fn in (("conv", fprop._conv_fprop_kernel), ("gemm", _gemm_kernel)):
    kern = next(iter(fn.device_caches[0][0].values()))
    for ext in ("ttgir", "ptx"):
        with open(f"{out_dir}/{name}.{ext}", "w") as f:
            f.write(kern.asm[ext])
    print(name, "regs", kern.n_regs, "spills", kern.n_spills, "smem", kern.metadata.shared)
