"""Where the channel-last wide forward's time goes (w64 and w256, b8 d4096 L2048, bf16, SiLU,
bias): x's copy to seqlen-contiguous, the Toeplitz forward on it, the output's copy back to
dim-contiguous (torch's copies), the same two by relayout.py, and the whole public call;
CUDA events over 10 calls, median of 5 batches. (Its first run, f4a1fea, printed the copy
bandwidth in TB/s labelled GB/s.)"""
import statistics

import torch

import fastconv
from fastconv.backends.triton.relayout import relayout
from fastconv.backends.triton.toeplitz import toeplitz_forward


def per_call_ms(fn):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / 10


x = torch.randn(8, 2048, 4096, device="cuda").bfloat16().transpose(1, 2)
seq = x.contiguous()
dst = torch.empty_like(seq)
plain = lambda: dst.copy_(seq)  # noqa: E731
copy_ms = statistics.median(per_call_ms(plain) for _ in range(5))
print(f"{torch.cuda.get_device_name()}: contiguous copy {copy_ms:.4f} ms "
      f"({2 * seq.numel() * 2 / copy_ms / 1e6:.0f} GB/s)", flush=True)
for width in (64, 256):
    w = (torch.randn(4096, width, device="cuda") * width ** -0.5).bfloat16()
    b = torch.randn(4096, device="cuda").bfloat16()
    out = toeplitz_forward(seq, w, b, None, True)
    steps = {"x to seqlen-contiguous": lambda: x.contiguous(),
             "toeplitz_forward": lambda: toeplitz_forward(seq, w, b, None, True),
             "output to dim-contiguous": lambda: out.transpose(1, 2).contiguous(),
             "relayout x": lambda: relayout(x, True),
             "relayout output": lambda: relayout(out, False),
             "causal_conv1d (all)": lambda: fastconv.causal_conv1d(x, w, b, activation="silu")}
    for step in steps.values():
        step()
    times = {k: [] for k in steps}
    for _ in range(5):
        for k, step in steps.items():
            times[k].append(per_call_ms(step))
    for k, t in times.items():
        m = statistics.median(t)
        print(f"w{width} {k:26s} {m:.4f} ms", flush=True)
