"""shortconv's backward over 16-position chunks (``_backward_pairs_kernel``) against the
8-position one (``_backward_kernel``, what runs with ``PAIRS`` empty), in one process:
bf16, silu, bias, widths 2/4/8, x seqlen- or dim-contiguous, b8 d4096 L2048 (and b1 d8192
L16384 at width 4); each kernel's time per call (CUDA events over 10 back-to-back calls,
median of 7 batches, the two interleaved batch by batch) as % of the backward's byte floor
(x, dy read, dx written: three passes) at the copy bandwidth measured here, and dx's, dw's
and db's errors against float64 (‖out − ref‖ / ‖ref‖)."""
import collections
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F

from fastconv.backends.triton import shortconv

torch.manual_seed(0)


def batch_us(fn):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 100


big = torch.randn(8, 4096, 2048, device="cuda").bfloat16()
dst = torch.empty_like(big)
dst.copy_(big)
copy_us = statistics.median(batch_us(lambda: dst.copy_(big)) for _ in range(7))
GBPS = 2 * big.numel() * 2 / (copy_us * 1e3)
print(f"{torch.cuda.get_device_name()}; copy {copy_us:.1f} us: {GBPS:.0f} GB/s", flush=True)


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def reference(x, w, b, dy):
    xd = x.double().requires_grad_()
    wd, bd = w.double().requires_grad_(), b.double().requires_grad_()
    y = F.silu(F.conv1d(xd, wd.unsqueeze(1), bd, padding=w.shape[1] - 1,
                        groups=x.shape[1])[..., :x.shape[-1]])
    y.backward(dy.double())
    return xd.grad, wd.grad, bd.grad


TRIED = {"seqlen": [(1, 32, 1, True), (1, 64, 1, True), (1, 128, 2, True), (1, 64, 2, True)],
         "dim": [(16, 4, 2, False), (32, 4, 2, False), (16, 8, 2, False), (8, 8, 1, False),
                 (32, 8, 4, False), (8, 4, 1, False)]}
CASES = [(layout, width, (8, 4096, 2048)) for width in (4, 8, 2) for layout in ("seqlen", "dim")]
CASES += [("seqlen", 4, (1, 8192, 16384)), ("dim", 4, (1, 8192, 16384))]
only = sys.argv[1:]
logs = collections.defaultdict(list)  # (layout, tile) -> log(its time / the 8-position's)
for layout, width, (batch, dim, seqlen) in CASES:
    if only and layout not in only:
        continue
    shape = (batch, dim, seqlen) if layout == "seqlen" else (batch, seqlen, dim)
    x, dy = (torch.randn(shape, device="cuda").bfloat16() for _ in range(2))
    if layout == "dim":
        x, dy = x.transpose(1, 2), dy.transpose(1, 2)
    w = (torch.randn(dim, width, device="cuda") * width ** -0.5).bfloat16()
    b = torch.randn(dim, device="cuda").bfloat16()
    ref = reference(x, w, b, dy)
    floor = 3 * x.numel() * 2 / (GBPS * 1e3)
    saved = shortconv.PAIRS

    def call(dy=dy, x=x, w=w, b=b):
        return shortconv.short_backward(dy, x, None, w, b, True, False)

    def errors(ref=ref):
        dx, _, dw, db = call()
        return f"err dx {rel(dx, ref[0]):.1e} dw {rel(dw, ref[1]):.1e} db {rel(db, ref[2]):.1e}"

    shortconv.PAIRS = {}
    print(f"{layout:6} w{width} b{batch} d{dim} L{seqlen}: 8-position {errors()}", flush=True)
    for tile in TRIED[layout]:
        shortconv.PAIRS = {layout: tile}
        try:
            err = errors()
        except Exception as exc:  # a tile the compiler refuses
            print(f"  {tile}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            continue
        old, new = [], []
        for _ in range(7):
            shortconv.PAIRS = {}
            old.append(batch_us(call))
            shortconv.PAIRS = {layout: tile}
            new.append(batch_us(call))
        o, n = statistics.median(old), statistics.median(new)
        logs[layout, tile].append(math.log(n / o))
        print(f"  {tile}: 16-position {n:7.1f} us ({100 * floor / n:4.1f} %) | 8-position "
              f"{o:7.1f} us ({100 * floor / o:4.1f} %) | {o / n:.3f}x | {err}", flush=True)
    shortconv.PAIRS = saved
gain = {key: math.exp(-statistics.mean(v)) for key, v in logs.items()}
best = {layout: max((t for lay, t in gain if lay == layout), key=lambda t: gain[layout, t])
        for layout in {lay for lay, _ in gain}}
for (layout, tile), v in sorted(gain.items()):
    print(f"{layout} {tile}: geomean {v:.3f}x the 8-position kernel ({len(logs[layout, tile])}"
          " cases)")
print("BEST", json.dumps(best))
