"""shortrows.py's kernels (x dim-contiguous, a position at a time) against shortconv.py's
(what runs with shortrows.TILES empty), in one process: bf16, SiLU, bias, no states, x
dim-contiguous, b8 d4096 L2048 at widths 2, 4, 8 and 16 (and b1 d8192 L16384 at width 4).
Each kernel's time per call (CUDA events over 10 back-to-back calls, median of 7 batches,
all candidates of a row interleaved batch by batch) as % of its byte floor (forward: x read,
out written; backward: x and dy read, dx written) at the copy bandwidth measured here, and
the errors against float64 (‖out − ref‖ / ‖ref‖). ``python probe_rows.py compile`` only
builds the candidates (a warm-up process: Triton's cache is shared); prints one line per
candidate and last a BEST line (JSON: per width class and direction the best tile at its
usual width, 4, 8 or 16, or null where it was not 2 % faster than shortconv.py's).
PROBE_TILES=file.json: other candidates ({"forward": {"2": [[BLOCK_D, SPAN, UNROLL, warps],
…], …}, "backward": …}) in place of FORWARD and BACKWARD below."""
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

from fastconv.backends.triton import shortconv, shortrows

FORWARD = {2: [(128, 64, 4, 1), (128, 64, 8, 1), (256, 64, 4, 1), (256, 128, 4, 2)],
           4: [(128, 64, 4, 1), (128, 64, 8, 1), (256, 64, 4, 1), (256, 128, 4, 2)],
           8: [(128, 64, 4, 1), (128, 64, 8, 1), (64, 64, 4, 1), (256, 64, 2, 1)],
           16: [(128, 64, 4, 1), (64, 64, 4, 1), (64, 64, 8, 1), (32, 64, 4, 1)]}
BACKWARD = {2: [(64, 64, 4, 1), (128, 64, 4, 1), (64, 64, 8, 1), (64, 128, 4, 1)],
            4: [(64, 64, 4, 1), (128, 64, 2, 1), (64, 64, 8, 1), (128, 128, 2, 2),
                (64, 128, 4, 1)],
            8: [(64, 64, 4, 1), (64, 64, 2, 1), (32, 64, 4, 1), (64, 128, 4, 1)],
            16: [(32, 64, 2, 1), (32, 64, 4, 1), (32, 128, 4, 1), (64, 64, 2, 1)]}
if os.environ.get("PROBE_TILES"):
    with open(os.environ["PROBE_TILES"]) as f:
        given = json.load(f)
    FORWARD, BACKWARD = ({int(w): [tuple(t) for t in ts] for w, ts in given[d].items()}
                         for d in ("forward", "backward"))
ROWS = [(8, 4096, 2048, w) for w in (2, 4, 8, 16)] + [(1, 8192, 16384, 4)]
only = sys.argv[1:] and sys.argv[1] == "compile"
part = int(sys.argv[2]) if only and len(sys.argv) > 2 else None  # (which worker: 0-3)
# shortconv.py's own kernels as the baseline: since 5f1204a its dim-contiguous backward runs
# shortrows.py's where TILES has a tile (the 2026-12-07-unroll run's "shortconv" rows were
# shortrows.py's shipped tile)
shortrows.TILES = {k: (None, None) for k in shortrows.TILES}
torch.manual_seed(0)


def batch_us(fn):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 100


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


big = torch.randn(8, 4096, 2048, device="cuda").bfloat16()
dst = torch.empty_like(big)
if not only:
    dst.copy_(big)
    copy_us = statistics.median(batch_us(lambda: dst.copy_(big)) for _ in range(7))
    GBPS = 2 * big.numel() * 2 / (copy_us * 1e3)
    print(f"{torch.cuda.get_device_name()}; copy {copy_us:.1f} us: {GBPS:.0f} GB/s", flush=True)
best = {}
for n, (batch, dim, seqlen, width) in enumerate(ROWS):
    if part is not None and n % 4 != part:
        continue
    x = torch.randn(batch, seqlen, dim, device="cuda").bfloat16().transpose(1, 2)
    w = (torch.randn(dim, width, device="cuda") / width ** 0.5).bfloat16()
    b = torch.randn(dim, device="cuda").bfloat16()
    dy = torch.randn(batch, seqlen, dim, device="cuda").bfloat16().transpose(1, 2)
    xd, wd, bd = (t.double().requires_grad_() for t in (x, w, b))
    y = F.silu(F.conv1d(xd, wd.unsqueeze(1), bd, padding=width - 1, groups=dim)[..., :seqlen])
    y.backward(dy.double())
    ref = (y.detach(), xd.grad, wd.grad, bd.grad)
    del xd, wd, bd, y
    name = f"b{batch} d{dim} L{seqlen} w{width}"
    cls = 5 if width <= 5 else 9 if width <= 9 else 17
    for direction, cands in (("forward", FORWARD), ("backward", BACKWARD)):
        if direction == "forward":
            calls = {"shortconv": lambda: shortconv.short_forward(x, None, w, b, True)}
            calls.update({t: (lambda t=t: shortrows.rows_forward(x, None, w, b, True, t))
                          for t in cands[width]})
            floor_bytes = 2 * x.numel() * 2
        else:
            calls = {"shortconv": lambda: shortconv.short_backward(dy, x, None, w, b, True,
                                                                  False)}
            calls.update({t: (lambda t=t: shortrows.rows_backward(dy, x, None, w, b, True,
                                                                  False, t))
                          for t in cands[width]})
            floor_bytes = 3 * x.numel() * 2
        errs = {}
        for key, fn in calls.items():
            out = fn()
            if direction == "forward":
                errs[key] = f"out {rel(out, ref[0]):.1e}"
            else:
                errs[key] = f"dx {rel(out[0], ref[1]):.1e} dw {rel(out[2], ref[2]):.1e} " \
                            f"db {rel(out[3], ref[3]):.1e}"
        if only:
            print(name, direction, "built", len(calls), flush=True)
            continue
        times = {k: [] for k in calls}
        for _ in range(7):
            for k, fn in calls.items():
                times[k].append(batch_us(fn))
        med = {k: statistics.median(v) for k, v in times.items()}
        base = med["shortconv"]
        for k, us in sorted(med.items(), key=lambda kv: kv[1]):
            pct = floor_bytes / (us * 1e3) / GBPS * 100
            print(f"{name} {direction:8} {str(k):22} {us:8.1f} us {pct:5.1f} % of floor "
                  f"{base / us:5.3f}x shortconv  {errs[k]}", flush=True)
        top = min(med, key=med.get)
        if batch == 8 and width in (4, 8, 16):  # (each class's best by its usual width)
            best[f"{direction} {cls}"] = top if top != "shortconv" and base / med[top] > 1.02 \
                else None
if not only:
    print("BEST " + json.dumps(best), flush=True)
