"""shortconv's backward tile on the H200 (b8 d4096 L2048 bf16, x seqlen-contiguous, silu,
widths 4 and 8): each candidate tile's time (CUDA events, median of 5 batches of 10 calls)
and its outputs against the shipped tile's (bitwise for dx; the weight sums in float32)."""
import statistics
import sys

import torch

from fastconv.backends.triton import shortconv

TILES = [(1, 64, 1), (1, 64, 2), (1, 128, 2), (1, 128, 4), (1, 32, 1), (2, 64, 2), (1, 256, 4),
         (2, 32, 1)]
FLOOR_GBPS = 4250.0
for width in (4, 8):
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(8, 4096, 2048, generator=g).cuda().bfloat16()
    w = (torch.randn(4096, width, generator=g) * width ** -0.5).cuda().bfloat16()
    b = torch.randn(4096, generator=g).cuda().bfloat16()
    dy = torch.randn(8, 4096, 2048, generator=g).cuda().bfloat16()
    fwd = shortconv.TILES["seqlen", 1][0]
    ref = None
    floor_us = 3 * x.numel() * 2 / (FLOOR_GBPS * 1e3)
    for tile in TILES:
        shortconv.TILES["seqlen", 1] = (fwd, tile)
        try:
            out = shortconv.short_backward(dy, x, None, w, b, True, False)
        except Exception as exc:
            print(width, tile, "failed", type(exc).__name__, str(exc)[:200], flush=True)
            continue
        if ref is None:
            ref = out
        same = torch.equal(out[0], ref[0])
        dw_err = ((out[2].float() - ref[2].float()).norm() / ref[2].float().norm()).item()
        times = []
        for _ in range(5):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(10):
                shortconv.short_backward(dy, x, None, w, b, True, False)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 100)  # µs per call
        us = statistics.median(times)
        print(f"w{width} tile {tile}: {us:.1f} us ({100 * floor_us / us:.1f} % of the floor), "
              f"dx equal {same}, dw rel {dw_err:.1e}", flush=True)
    sys.stdout.flush()
