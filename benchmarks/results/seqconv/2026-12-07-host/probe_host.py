"""Host time per call of causal_conv1d's compiled-graph ops, layer by layer (issue 56's
host-bound Mamba-130M block): ``torch.ops.fastconv.short_conv`` / ``short_conv_backward``
(what a compiled graph calls), their implementations (``seqconv.short_conv_run`` /
``short_conv_grads``), shortconv.py's launchers (``short_forward`` / ``short_backward``), and
the public ``causal_conv1d`` without autograd. A tiny problem (b1 d64 L64, bf16, SiLU, bias,
x dim-contiguous) keeps the GPU idle, so back-to-back calls cost the host's time: the median
of 7 batches of 2,000 calls, µs per call."""
import statistics
import time

import torch

import fastconv
from fastconv import seqconv
from fastconv.backends.triton import shortconv

x = torch.randn(1, 64, 64, device="cuda").bfloat16().transpose(1, 2).contiguous().transpose(1, 2)
w = torch.randn(64, 4, device="cuda").bfloat16()
b = torch.randn(64, device="cuda").bfloat16()
dy = torch.randn_like(x)
ops = torch.ops.fastconv
calls = {
    "op short_conv": lambda: ops.short_conv(x, None, w, b, True, None),
    "short_conv_run": lambda: seqconv.short_conv_run(x, None, w, b, True, None),
    "short_forward": lambda: shortconv.short_forward(x, None, w, b, True),
    "causal_conv1d (no grad)": lambda: fastconv.causal_conv1d(x, w, b, activation="silu"),
    "op short_conv_backward": lambda: ops.short_conv_backward(dy, x, None, w, b, True, False,
                                                              None),
    "short_conv_grads": lambda: seqconv.short_conv_grads(dy, x, None, w, b, True, False, None),
    "short_backward": lambda: shortconv.short_backward(dy, x, None, w, b, True, False),
    "torch.empty_like": lambda: torch.empty_like(x),
}
for fn in calls.values():
    for _ in range(50):
        fn()
torch.cuda.synchronize()
print(torch.cuda.get_device_name(), torch.__version__)
for name, fn in calls.items():
    batches = []
    for _ in range(7):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(2000):
            fn()
        torch.cuda.synchronize()
        batches.append((time.perf_counter() - start) / 2000 * 1e6)
    print(f"{name:28s} {statistics.median(batches):7.2f} us/call "
          f"(batches {min(batches):.2f}-{max(batches):.2f})", flush=True)
