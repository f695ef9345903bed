"""The backward's weight sums on a GPU (part: batch·windows × dim × TAPS float32): torch's
sum over the slice and two casts (before f9fba61) against shortconv._sums_kernel's tiles,
each as 20 calls captured in a CUDA graph (µs per call, median of 7 replays)."""
import statistics

import torch

from fastconv.backends.triton import shortconv as sc
from fastconv.backends.triton.launch import cdiv, launch


def graphed(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(20):
            fn()
    times = []
    for _ in range(7):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000 / 20)
    return statistics.median(times)


for rows, dim, width in ((32, 4096, 4), (32, 8192, 4), (32, 4096, 8), (32, 4096, 16),
                         (16, 1024, 4)):
    taps = 1 << (width).bit_length()
    part = torch.randn(rows, dim, taps, device="cuda")
    ref = part[..., :width + 1].double().sum(0)
    row = [f"rows {rows} dim {dim} w{width}:"]

    def old():
        s = part[..., :width + 1].sum(0)
        return s[:, :width].to(torch.bfloat16), s[:, width].to(torch.bfloat16)
    row.append(f"torch {graphed(old):.2f}")
    for bd, rr in ((128, 1), (16, 8), (32, 8), (16, 4), (32, 4), (64, 4), (8, 8), (16, 16)):
        dw = torch.empty(dim, width, device="cuda", dtype=torch.bfloat16)
        db = torch.empty(dim, device="cuda", dtype=torch.bfloat16)

        def new():
            launch(sc._sums_kernel, (cdiv(dim, bd),), part, dw, db, rows, dim, WIDTH=width,
                   TAPS=taps, HAS_BIAS=True, BLOCK_D=bd, ROWS=rr)
        us = graphed(new)
        err = max(((dw.double() - ref[:, :width]).abs().max() / ref.abs().max()).item(),
                  ((db.double() - ref[:, width]).abs().max() / ref.abs().max()).item())
        row.append(f"({bd},{rr}) {us:.2f}{'' if err < 1e-2 else ' WRONG'}")
    print("  ".join(row), flush=True)
