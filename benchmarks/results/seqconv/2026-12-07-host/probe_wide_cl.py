"""Why the seqconv suite's channel-last width-64 forward row did not finish in ~100 s
(``bench-cl.log``): causal_conv1d of a dim-contiguous x (b8 d4096 L2048, bf16, SiLU, bias)
at widths given on the command line, in a new process with an empty plan cache. Prints each
call's wall time for the first calls, then fastconv's and torch's (F.conv1d, slice, SiLU)
time per call (CUDA events over 10 calls, median of 5 batches, interleaved), and
fastconv.explain of the route's convolution after; every thread's stack is dumped to
stderr each 20 s meanwhile."""
import faulthandler
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import fastconv

faulthandler.dump_traceback_later(20, repeat=True)


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
    ours = lambda: fastconv.causal_conv1d(x, w, b, activation="silu")  # noqa: E731
    theirs = lambda: F.silu(F.conv1d(x, w.unsqueeze(1), b, padding=width - 1,  # noqa: E731
                                     groups=4096)[..., :2048])
    for i in range(4):
        start = time.perf_counter()
        ours()
        torch.cuda.synchronize()
        print(f"w{width} call {i}: {time.perf_counter() - start:.3f} s", flush=True)
    ref = theirs().float()
    err = ((ours().float() - ref).norm() / ref.norm()).item()
    t = {"fastconv": [], "torch": []}
    for _ in range(5):
        t["fastconv"].append(per_call_ms(ours))
        t["torch"].append(per_call_ms(theirs))
    mf, mt = statistics.median(t["fastconv"]), statistics.median(t["torch"])
    print(f"w{width}: fastconv {mf:.4f} ms, torch {mt:.4f} ms, {mt / mf:.2f}x; "
          f"rel diff {err:.1e}", flush=True)
    print(fastconv.explain(x, w.unsqueeze(1), b, padding=((width - 1, 0),), groups=4096,
                           activation="silu"), flush=True)
faulthandler.cancel_dump_traceback_later()
