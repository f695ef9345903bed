"""What cudnn.benchmark's search costs a first call, and what it buys in steady state, for
the layers of the shipped tuning database (issue 21: timm resnet50's first call).

For each 2-D bf16 batch-32 eager entry of the database: the convolution aten runs (the
entry's fused conv + bias (+ residual) + ReLU, torch.cudnn_convolution_[add_]relu, where the
entry chose ``cudnn_relu``; torch.conv2d otherwise, as a provisional aten choice runs while
the entry's Triton kernels compile), each way in a fresh thread (PyTorch keeps its cuDNN
plans per thread, so each starts from an empty cache):
- ``heur``: cudnn.benchmark off (cuDNN's heuristic plan);
- ``find``: cudnn.benchmark on (every plan timed; what torch's own first call does);
- ``det+find``: the heuristic plan with cudnn.deterministic on first, then the benchmark
  search in the same thread: whether the search still runs (the deterministic flag is part
  of PyTorch's plan-cache key, so a provisional call made so does not leave its heuristic
  plan where a later benchmark-mode call would find it);
- ``native``: cuDNN off (torch.backends.cudnn.enabled = False: PyTorch's own CUDA kernels,
  depthwise or im2col + GEMM, which build no plan), the plain convolutions only: what a
  stand-in that builds nothing would cost (cuDNN's heuristic plan took ~42 ms per new shape
  in mobilenetv3's first call, issue 21 session 17).
Each gives the first call's wall time and the steady state's GPU time (median of 30 CUDA
event timings of 20 calls). Usage (GPU): python benchmarks/cudnn_search_cost.py [DB.json]
"""
import json
import re
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

KEY = re.compile(r"r2_F_n(\d+)c(\d+)k(\d+)_in(\d+)x(\d+)_f(\d+)x(\d+)_s(\d+)x(\d+)"
                 r"_p(\d+)-(\d+)x(\d+)-(\d+)_d(\d+)x(\d+)_g(\d+)_bf16_nhwc_bf16_([a-z+]*)_cuda")


def problems(db: dict):
    for key, entry in db["entries"].items():
        m = KEY.match(key)
        if not key.endswith("|eager") or m is None or "|fprop|" not in key:
            continue
        n, c, k, h, w, r, s, sh, sw, p0, p1, q0, q1, dh, dw, g = map(int, m.groups()[:16])
        if n != 32 or p0 != p1 or q0 != q1:
            continue
        yield dict(key=key.split("|")[0], n=n, c=c, k=k, hw=(h, w), f=(r, s), stride=(sh, sw),
                   pad=(p0, q0), dil=(dh, dw), groups=g, epilogue=m.group(17),
                   fused=entry.get("config") == "cudnn_relu")


def call(p):
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(p["n"], p["c"], *p["hw"], device=dev, dtype=dt).to(
        memory_format=torch.channels_last)
    w = (torch.randn(p["k"], p["c"] // p["groups"], *p["f"], device=dev, dtype=dt) * 0.05).to(
        memory_format=torch.channels_last)
    b = torch.randn(p["k"], device=dev, dtype=dt)
    geo = (p["stride"], p["pad"], p["dil"], p["groups"])
    if not p["fused"]:
        return lambda: torch.conv2d(x, w, b, *geo)
    if "res" not in p["epilogue"]:
        return lambda: torch.cudnn_convolution_relu(x, w, b, *geo)
    z = torch.conv2d(x, w, None, *geo).normal_()
    return lambda: torch.cudnn_convolution_add_relu(x, w, z, 1.0, b, *geo)


def measure(fn, benchmark: bool, deterministic_first: bool = False,
            cudnn: bool = True) -> tuple[float, float]:
    """(first call ms, steady GPU ms per call) in a fresh thread (``cudnn``: the process-wide
    flag during the measurement)."""
    out = {}
    enabled = torch.backends.cudnn.enabled
    torch.backends.cudnn.enabled = cudnn
    try:
        _in_thread(fn, benchmark, deterministic_first, out)
    finally:
        torch.backends.cudnn.enabled = enabled
    return out["first"], out["steady"]


def _in_thread(fn, benchmark: bool, deterministic_first: bool, out: dict) -> None:
    def body():
        if deterministic_first:
            torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
            fn()
            torch.cuda.synchronize()
            torch.backends.cudnn.deterministic = False
        torch.backends.cudnn.benchmark = benchmark
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out["first"] = (time.perf_counter() - start) * 1e3
        times = []
        for _ in range(30):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(20):
                fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 20)
        out["steady"] = statistics.median(times)

    t = threading.Thread(target=body)
    t.start()
    t.join()


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else \
        Path(__file__).parents[1] / "src/fastconv/data/tuning/nvidia-h200.json"
    db = json.load(open(path))
    print(torch.__version__, torch.cuda.get_device_name(), "cudnn",
          torch.backends.cudnn.version())
    measure(lambda: torch.ones(1, device="cuda"), False)  # context, cuDNN handle
    rows = []
    print(f"{'problem':76s} {'fused':5s} {'first ms heur/find/det+find/native':>37s} "
          f"{'steady us heur/find/native':>29s}")
    nan = (float("nan"), float("nan"))
    for p in problems(db):
        fn = call(p)
        h = measure(fn, False)
        f = measure(fn, True)
        d = measure(fn, True, deterministic_first=True)
        n = nan if p["fused"] else measure(fn, False, cudnn=False)
        rows.append((p, h, f, d, n))
        print(f"{p['key']:76s} {str(p['fused']):5s} {h[0]:8.1f} {f[0]:8.1f} {d[0]:8.1f} "
              f"{n[0]:8.1f}   {h[1] * 1e3:8.1f} {f[1] * 1e3:8.1f} {n[1] * 1e3:8.1f}")
    for fused in (True, False):
        sel = [r for r in rows if r[0]["fused"] == fused]
        if not sel:
            continue
        ratio = statistics.geometric_mean([r[1][1] / r[2][1] for r in sel])
        worst = max(r[1][1] / r[2][1] for r in sel)
        native = "" if fused else f", native {sum(r[4][0] for r in sel):7.0f} ms"
        print(f"{'cudnn_relu' if fused else 'conv2d':10s} {len(sel):3d} problems: first calls "
              f"heur {sum(r[1][0] for r in sel):7.0f} ms, find {sum(r[2][0] for r in sel):7.0f}"
              f" ms, find after det heur {sum(r[3][0] for r in sel):7.0f} ms{native}; steady "
              f"heur/find geomean {ratio:.3f}, worst {worst:.3f}")


if __name__ == "__main__":
    main()
