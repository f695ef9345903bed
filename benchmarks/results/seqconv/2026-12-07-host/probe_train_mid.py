"""causal_conv1d's training step at widths 20, 24 and 31 (b8 d4096 L2048, bf16, SiLU, bias;
x seqlen- or dim-contiguous) against torch (F.conv1d, slice, SiLU): forward + backward per
call (CUDA events over 5 calls, median of 3, after two warm-up steps). With ``toeplitz``
on the command line it also times the Toeplitz route directly (``seqconv._wide_kernel``),
as the run that chose it did (probe-train-mid-32497b2.log, a one-off command of the same
steps)."""
import statistics
import sys

import torch
import torch.nn.functional as F

import fastconv
from fastconv import seqconv


def per_call_ms(fn):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(5):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / 5


for layout in ("dim", "seqlen"):
    for width in (20, 24, 31):
        x = torch.randn(8, 2048, 4096, device="cuda").bfloat16().transpose(1, 2)
        if layout == "seqlen":
            x = x.contiguous()
        x.requires_grad_()
        w = (torch.randn(4096, width, device="cuda") * width ** -0.5).bfloat16().requires_grad_()
        b = torch.randn(4096, device="cuda").bfloat16().requires_grad_()
        g = torch.randn_like(x)

        def step(f):
            def call():
                f().backward(g)
                x.grad = w.grad = b.grad = None
            return call
        calls = {"public": step(lambda: fastconv.causal_conv1d(x, w, b, activation="silu")),
                 "torch": step(lambda: F.silu(F.conv1d(x, w.unsqueeze(1), b, padding=width - 1,
                                                       groups=4096)[..., :2048]))}
        if "toeplitz" in sys.argv[1:]:
            calls["toeplitz"] = step(lambda: seqconv._wide_kernel(x, w, b, None, True))
        for fn in calls.values():
            fn()
            fn()
        t = {k: statistics.median(per_call_ms(fn) for _ in range(3)) for k, fn in calls.items()}
        print(layout, width, {k: round(v, 3) for k, v in t.items()},
              "public x torch %.2f" % (t["torch"] / t["public"]), flush=True)
