"""shortconv's kernels on a GPU, before (shortconv.py at 2cb1f9b, copied beside this script as probe_shortconv_old.py with its `from .launch` import made absolute) and after (the working tree's: the
PTX sigmoid, the dim-contiguous layout's per-column loads) in one process: b8 d4096 L2048
bf16, silu, bias, widths 4/8/16, x seqlen- or dim-contiguous; forward and backward alone,
each tile's time (CUDA events, median of 5 batches of 10 calls) as % of the byte floor at
the copy bandwidth measured here, and its error against float64 (‖out − ref‖ / ‖ref‖)."""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
import probe_shortconv_old as old  # noqa: E402
from fastconv.backends.triton import shortconv as new  # noqa: E402

T0 = time.time()


def timed(fn):
    fn()
    times = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(10):
            fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 100)
    return statistics.median(times)


big = torch.randn(8, 4096, 2048, device="cuda").bfloat16()
dst = torch.empty_like(big)
copy_us = timed(lambda: dst.copy_(big))
GBPS = 2 * big.numel() * 2 / (copy_us * 1e3)
print(f"copy {copy_us:.1f} us: {GBPS:.0f} GB/s", flush=True)


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def reference(x, w, b, dy):
    xd = x.double().requires_grad_()
    wd, bd = w.double().requires_grad_(), b.double().requires_grad_()
    y = F.silu(F.conv1d(xd, wd.unsqueeze(1), bd, padding=w.shape[1] - 1,
                        groups=x.shape[1])[..., :x.shape[-1]])
    y.backward(dy.double())
    return y.detach(), xd.grad, wd.grad, bd.grad


FWD = {("seqlen", 1): [(1, 128, 2), (1, 64, 1), (1, 256, 4), (2, 64, 2)],
       ("seqlen", 2): [(1, 128, 2), (1, 64, 1), (1, 256, 4)],
       ("dim", 1): [(128, 2, 4), (64, 4, 2), (128, 4, 4), (32, 4, 1), (128, 8, 4), (64, 8, 4),
                    (256, 2, 4)],
       ("dim", 2): [(64, 4, 4), (128, 2, 4), (64, 2, 2), (32, 4, 1), (64, 8, 4), (128, 4, 4)]}
BWD = {("seqlen", 1): [(1, 64, 1), (1, 128, 2), (1, 32, 1), (2, 64, 2)],
       ("seqlen", 2): [(1, 64, 1), (1, 128, 2), (1, 32, 1)],
       ("dim", 1): [(32, 8, 4), (32, 4, 2), (16, 8, 2), (16, 4, 1), (64, 4, 4), (32, 4, 1),
                    (64, 2, 2)],
       ("dim", 2): [(16, 32, 4), (16, 16, 2), (32, 16, 4), (8, 32, 1), (16, 8, 2), (32, 8, 4),
                    (8, 16, 1)]}
only = sys.argv[1:]  # e.g. dim
for layout in ("seqlen", "dim"):
    if only and layout not in only:
        continue
    for width in (4, 8, 16):
        g = torch.Generator(device="cpu").manual_seed(width)
        shape = (8, 4096, 2048) if layout == "seqlen" else (8, 2048, 4096)
        x = torch.randn(shape, generator=g).cuda().bfloat16()
        dy = torch.randn(shape, generator=g).cuda().bfloat16()
        if layout == "dim":
            x, dy = x.transpose(1, 2), dy.transpose(1, 2)
        w = (torch.randn(4096, width, generator=g) * width ** -0.5).cuda().bfloat16()
        b = torch.randn(4096, generator=g).cuda().bfloat16()
        ref = reference(x, w, b, dy)
        look = 1 if width <= 9 else 2
        ffloor = 2 * x.numel() * 2 / (GBPS * 1e3)
        bfloor = 3 * x.numel() * 2 / (GBPS * 1e3)
        print(f"== {layout} w{width}: fwd floor {ffloor:.1f} us, bwd floor {bfloor:.1f} us "
              f"({time.time() - T0:.0f} s)", flush=True)
        for mod, name in ((old, "old"), (new, "new")):
            shipped = mod.TILES[layout, look]
            for tile in FWD[layout, look] if mod is new else [shipped[0]]:
                mod.TILES[layout, look] = (tile, shipped[1])
                try:
                    y = mod.short_forward(x, None, w, b, True)
                    us = timed(lambda: mod.short_forward(x, None, w, b, True))
                    print(f"  {name} fwd {tile}: {us:7.1f} us {100 * ffloor / us:5.1f} %  "
                          f"err {rel(y, ref[0]):.1e}", flush=True)
                except Exception as exc:
                    print(f"  {name} fwd {tile}: failed {type(exc).__name__} {str(exc)[:150]}")
            for tile in BWD[layout, look] if mod is new else [shipped[1]]:
                mod.TILES[layout, look] = (shipped[0], tile)
                try:
                    o = mod.short_backward(dy, x, None, w, b, True, False)
                    us = timed(lambda: mod.short_backward(dy, x, None, w, b, True, False))
                    print(f"  {name} bwd {tile}: {us:7.1f} us {100 * bfloor / us:5.1f} %  "
                          f"err dx {rel(o[0], ref[1]):.1e} dw {rel(o[2], ref[2]):.1e} "
                          f"db {rel(o[3], ref[3]):.1e}", flush=True)
                except Exception as exc:
                    print(f"  {name} bwd {tile}: failed {type(exc).__name__} {str(exc)[:150]}")
            mod.TILES[layout, look] = shipped
print(f"done {time.time() - T0:.0f} s")
