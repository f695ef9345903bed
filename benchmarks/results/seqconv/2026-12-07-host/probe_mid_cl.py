"""Channel-last causal_conv1d at widths between shortconv.py's (≤ 17) and 32 (b8 d4096
L2048, bf16, SiLU, bias, x a (batch, seqlen, dim) tensor's transpose): the public call (the
Toeplitz kernels through relayout.py since this probe's commit) against the conv1d route it
took before (``fastconv.conv1d`` with width − 1 left padding: dispatch's choice) and torch
(F.conv1d, slice, SiLU). First calls' wall time in a new process (empty plan cache), then
time per call (CUDA events over 10 calls, median of 5 batches, interleaved) after 15 s of
the conv1d route's calls (its background builds)."""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import fastconv


def per_call_ms(fn):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / 10


for width in [int(w) for w in sys.argv[1].split(",")]:
    x = torch.randn(8, 2048, 4096, device="cuda").bfloat16().transpose(1, 2)
    w = (torch.randn(4096, width, device="cuda") * width ** -0.5).bfloat16()
    b = torch.randn(4096, device="cuda").bfloat16()
    calls = {
        "causal_conv1d": lambda: fastconv.causal_conv1d(x, w, b, activation="silu"),
        "conv1d route": lambda: fastconv.conv1d(x, w.unsqueeze(1), b, padding=((width - 1, 0),),
                                                groups=4096, activation="silu"),
        "torch": lambda: F.silu(F.conv1d(x, w.unsqueeze(1), b, padding=width - 1,
                                         groups=4096)[..., :2048])}
    for name, fn in calls.items():
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        print(f"w{width} {name}: first call {time.perf_counter() - start:.3f} s", flush=True)
    end = time.perf_counter() + 15
    while time.perf_counter() < end:
        calls["conv1d route"]()
    torch.cuda.synchronize()
    ref = calls["torch"]().float()
    t = {k: [] for k in calls}
    for _ in range(5):
        for k, fn in calls.items():
            t[k].append(per_call_ms(fn))
    m = {k: statistics.median(v) for k, v in t.items()}
    for k in calls:
        err = ((calls[k]().float() - ref).norm() / ref.norm()).item()
        print(f"w{width} {k:14s} {m[k]:.4f} ms  {m['torch'] / m[k]:5.2f}x torch  "
              f"rel diff {err:.1e}", flush=True)
