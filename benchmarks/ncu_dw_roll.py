"""One dw_roll forward on a depthwise_models layer, for Nsight Compute (GPU):
    ncu --kernel-name regex:_dw_roll --launch-skip 2 --launch-count 1 --section ... \
        python3 benchmarks/ncu_dw_roll.py CASE CONFIG
CONFIG as DwConfig fields: block_a,block_b,num_warps,roll (e.g. 32,32,4,8)."""

import sys

import torch

from fastconv import ConvProblem
from fastconv.backends.triton import TritonBackend
from fastconv.backends.triton.depthwise import DwConfig
from fastconv.tools.bench.suites import SUITES

case = next(c for c in SUITES["depthwise_models"] if c.name == sys.argv[1])
a, b, w, r = (int(v) for v in sys.argv[2].split(","))
x = torch.randn(case.n, case.c, *case.spatial, device="cuda").to(torch.bfloat16)
x = x.contiguous(memory_format=torch.channels_last)
wt = (torch.randn(case.k, 1, *case.kernel, device="cuda") / 7).to(torch.bfloat16)
problem = ConvProblem.from_tensors(x, wt, None, case.stride, case.padding_arg(), case.dilation,
                                   case.groups, rank=2)
run = TritonBackend.bind(problem, DwConfig(a, b, w, roll=r))
out = problem.new_output(x.device)
for _ in range(4):
    run(x, wt, None, None, None, None, out)
torch.cuda.synchronize()
