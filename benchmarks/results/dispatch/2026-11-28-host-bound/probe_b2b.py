"""Back-to-back calls of seed002's c32_64 problem (fp conv1d N128 32->64 L448 k3, bf16):
torch, fastconv's aten route, a pinned Triton row tile and auto dispatch; per-call host
durations (perf_counter around each call), with the GPU idle (b2b) or behind a 40 ms spin
(queued), with and without Python's garbage collector; then a cProfile of 2000 calls.
Run on the device from the repository root with PYTHONPATH=src."""
import cProfile
import gc
import io
import pstats
import statistics
import threading
import time

import torch
import torch.nn.functional as F

import fastconv
from fastconv import costs, dispatch
from fastconv.backends.triton.configs import TileConfig
from fastconv.problem import ConvProblem

torch.backends.cudnn.benchmark = True
x = torch.randn(128, 32, 448, device="cuda", dtype=torch.bfloat16)
w = torch.randn(64, 32, 3, device="cuda", dtype=torch.bfloat16)
p = ConvProblem.from_tensors(x, w, None, (1,), ((1, 1),), (1,), 1, rank=1,
                             precision=fastconv.Precision.BF16)
dispatch.pin(p, "triton", TileConfig(64, 64, 32, 4, 4, False, rows=True))
fns = {"torch": lambda: F.conv1d(x, w, padding=1),
       "fc_aten": lambda: fastconv.conv1d(x, w, padding=1, backend="aten"),
       "fc_tile": lambda: fastconv.conv1d(x, w, padding=1, dispatch="pinned"),
       "fc_auto": lambda: fastconv.conv1d(x, w, padding=1)}
gcs = []
gc.callbacks.append(lambda ph, info: ph == "start" and gcs.append(info["generation"]))
pc = time.perf_counter_ns


def dist(f, n=2000, spin_ms=0.0):
    for _ in range(30):
        f()
    torch.cuda.synchronize()
    gcs.clear()
    if spin_ms:
        torch.cuda._sleep(int(spin_ms * costs._cycles_per_ms()))
    ts = []
    t0 = pc()
    for _ in range(n):
        t = pc()
        f()
        ts.append(pc() - t)
    wall = (pc() - t0) / n / 1e3
    torch.cuda.synchronize()
    total = (pc() - t0) / n / 1e3
    s = sorted(ts)
    return (f"loop {wall:6.1f} (+sync {total:6.1f}) mean {statistics.mean(ts) / 1e3:6.1f} "
            f"p10 {s[n // 10] / 1e3:5.1f} p50 {s[n // 2] / 1e3:5.1f} "
            f"p90 {s[n * 9 // 10] / 1e3:5.1f} p99 {s[n * 99 // 100] / 1e3:6.1f} "
            f"max {s[-1] / 1e3:7.0f} gc {[gcs.count(g) for g in (0, 1, 2)]}")


print("threads:", [t.name for t in threading.enumerate()])
for rep in range(2):
    for name, f in fns.items():
        print(f"{name:8s} b2b     ", dist(f))
    for name, f in fns.items():
        print(f"{name:8s} queued  ", dist(f, n=300, spin_ms=40))
    gc.disable()
    for name, f in fns.items():
        print(f"{name:8s} b2b nogc", dist(f))
    gc.enable()
print("threads:", [t.name for t in threading.enumerate()])
for name in ("fc_aten", "fc_tile"):
    f = fns[name]
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(2000):
        f()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
    print(name, s.getvalue()[:3500])
