"""Where a causal_conv1d training step's GPU time goes (b8 d4096 L2048 bf16, widths 4 and 16,
silu, x seqlen-contiguous): the kernels of one fwd+bwd under torch.profiler."""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import fastconv

for width in (4, 16):
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(8, 4096, 2048, generator=g).cuda().bfloat16().requires_grad_()
    w = (torch.randn(4096, width, generator=g) * width ** -0.5).cuda().bfloat16().requires_grad_()
    b = torch.randn(4096, generator=g).cuda().bfloat16().requires_grad_()
    dy = torch.randn(8, 4096, 2048, generator=g).cuda().bfloat16()

    def step():
        out = fastconv.causal_conv1d(x, w, b, activation="silu")
        out.backward(dy)
        x.grad = w.grad = b.grad = None

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    print(f"== width {width}: per step (10 steps)")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))
    sys.stdout.flush()
