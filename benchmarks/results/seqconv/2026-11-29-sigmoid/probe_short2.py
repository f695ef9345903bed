"""shortconv on a GPU, second pass (the working tree's kernels): g computed once per chunk
at widths 2-9 too (windows overlapping by a chunk, ``owned`` patched), the dim-contiguous
tiles and load kinds (split: one [BLOCK_D, CHUNKS, 8] load split in registers; columns:
a load per column) at widths 4, 8, 16, with and without seq_idx. b8 d4096 L2048 bf16,
silu, bias. Times: CUDA events, median of 5 batches of 10 calls, % of the byte floor at
the copy bandwidth measured here; errors against float64 (without seq_idx) or against the
first row of the group (with seq_idx)."""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from fastconv.backends.triton import shortconv as sc

T0 = time.time()
OWNED = sc.owned


def shifted(look, chunks):
    return chunks - look if chunks >= 16 else chunks


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
GBPS = 2 * big.numel() * 2 / (timed(lambda: dst.copy_(big)) * 1e3)
print(f"copy: {GBPS:.0f} GB/s", flush=True)
del big, dst


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def reference(x, w, b, dy):
    xd = x.double().requires_grad_()
    wd, bd = w.double().requires_grad_(), b.double().requires_grad_()
    y = F.silu(F.conv1d(xd, wd.unsqueeze(1), bd, padding=w.shape[1] - 1,
                        groups=x.shape[1])[..., :x.shape[-1]])
    y.backward(dy.double())
    return y.detach(), xd.grad, wd.grad, bd.grad


T, F_ = True, False
GROUPS = [  # (layout, width, ids, direction, [(tile, shift)])
    ("seqlen", 4, F_, "bwd", [((1, 64, 1, T), F_), ((1, 64, 1, T), T), ((1, 128, 2, T), T),
                              ((1, 32, 1, T), T), ((1, 256, 4, T), T)]),
    ("seqlen", 8, F_, "bwd", [((1, 64, 1, T), F_), ((1, 64, 1, T), T), ((1, 128, 2, T), T),
                              ((1, 32, 1, T), T)]),
    ("seqlen", 2, F_, "bwd", [((1, 64, 1, T), F_), ((1, 64, 1, T), T)]),
    ("dim", 4, F_, "bwd", [((16, 8, 2, F_), F_), ((16, 16, 2, F_), T), ((32, 16, 4, F_), T),
                           ((8, 16, 1, F_), T), ((16, 32, 4, F_), T), ((32, 8, 4, T), F_)]),
    ("dim", 8, F_, "bwd", [((16, 8, 2, F_), F_), ((16, 16, 2, F_), T), ((8, 16, 1, F_), T),
                           ((16, 32, 4, F_), T)]),
    ("dim", 16, F_, "bwd", [((16, 32, 4, T), T), ((16, 32, 4, F_), T), ((16, 16, 2, T), T),
                            ((8, 32, 2, T), T)]),
    ("dim", 16, F_, "fwd", [((32, 4, 1, F_), F_), ((16, 4, 1, F_), F_), ((32, 2, 1, F_), F_),
                            ((64, 2, 2, F_), F_), ((32, 8, 2, F_), F_), ((64, 4, 4, T), F_)]),
    ("dim", 4, F_, "fwd", [((128, 4, 4, F_), F_), ((128, 2, 4, T), F_), ((256, 4, 8, F_), F_),
                           ((64, 4, 2, F_), F_)]),
    ("dim", 4, T, "fwd", [((128, 2, 4, T), F_), ((128, 4, 4, F_), F_), ((64, 4, 2, F_), F_)]),
    ("dim", 4, T, "bwd", [((32, 8, 4, T), F_), ((16, 8, 2, F_), F_), ((32, 4, 1, F_), F_),
                          ((16, 16, 2, F_), T)]),
    ("dim", 16, T, "fwd", [((64, 4, 4, T), F_), ((32, 4, 1, F_), F_), ((16, 4, 1, F_), F_)]),
    ("dim", 16, T, "bwd", [((16, 4, 2, T), F_), ((16, 4, 2, F_), F_), ((16, 8, 2, F_), F_),
                           ((8, 4, 1, F_), F_), ((16, 16, 2, T), T)]),
    ("seqlen", 4, T, "bwd", [((1, 64, 1, T), F_), ((1, 64, 1, T), T)]),
]
for layout, width, ids, direction, rows in GROUPS:
    g = torch.Generator(device="cpu").manual_seed(width)
    shape = (8, 4096, 2048) if layout == "seqlen" else (8, 2048, 4096)
    x = torch.randn(shape, generator=g).cuda().bfloat16()
    dy = torch.randn(shape, generator=g).cuda().bfloat16()
    if layout == "dim":
        x, dy = x.transpose(1, 2), dy.transpose(1, 2)
    w = (torch.randn(4096, width, generator=g) * width ** -0.5).cuda().bfloat16()
    b = torch.randn(4096, generator=g).cuda().bfloat16()
    seq_idx = None
    if ids:
        lengths = torch.randint(37, 300, (64,), generator=g)
        seq_idx = torch.repeat_interleave(torch.arange(64), lengths)[:2048]
        seq_idx = seq_idx.expand(8, -1).contiguous().int().cuda()
    ref = None if ids else reference(x, w, b, dy)
    look = 1 if width <= 9 else 2
    passes = 2 if direction == "fwd" else 3
    floor = passes * x.numel() * 2 / (GBPS * 1e3)
    print(f"== {layout} w{width} {'seq_idx ' if ids else ''}{direction}: floor {floor:.1f} us "
          f"({time.time() - T0:.0f} s)", flush=True)
    shipped = sc.TILES[layout, look]
    ids_shipped = dict(sc.IDS_BACKWARD)
    for tile, shift in rows:
        sc.owned = shifted if shift else OWNED
        sc.TILES[layout, look] = (tile, shipped[1]) if direction == "fwd" else (shipped[0], tile)
        sc.IDS_BACKWARD[layout] = tile
        try:
            if direction == "fwd":
                def fn():
                    return sc.short_forward(x, None, w, b, True, seq_idx)
            else:
                def fn():
                    return sc.short_backward(dy, x, None, w, b, True, False, seq_idx)
            out = fn()
            us = timed(fn)
            if direction == "fwd":
                out = (out,)
            if ref is None:
                ref = [o.double() if o is not None else None for o in out]
                ref = (ref[0],) if direction == "fwd" else (None, *ref[:1], ref[2], ref[3])
            if direction == "fwd":
                err = f"err {rel(out[0], ref[0]):.1e}"
            else:
                err = (f"err dx {rel(out[0], ref[1]):.1e} dw {rel(out[2], ref[2]):.1e} "
                       f"db {rel(out[3], ref[3]):.1e}")
            print(f"  {tile} {'shift' if shift else '     '}: {us:7.1f} us "
                  f"{100 * floor / us:5.1f} %  {err}", flush=True)
        except Exception as exc:
            print(f"  {tile} shift={shift}: failed {type(exc).__name__} {str(exc)[:300]}",
                  flush=True)
    sc.TILES[layout, look] = shipped
    sc.IDS_BACKWARD.update(ids_shipped)
    sc.owned = OWNED
print(f"done {time.time() - T0:.0f} s")
