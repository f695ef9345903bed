"""Device probe: shortconv's backward with g computed once per chunk (overlapping windows,
the chunks after read by gathers: ``shortconv.owned``) against the same kernel recomputing
g for the two chunks after (``SHIFT_MIN_CHUNKS`` set out of reach), widths 10-17 (taps two
chunks back), over backward tiles (BLOCK_D, CHUNKS, warps), bf16, SiLU, bias; each row's
time and percentage of the byte floor (x, dy read, dx written, at the measured copy
bandwidth), and each variant's dx and dw against float32 torch. Run from the repository
root with PYTHONPATH=src; the sha is FASTCONV_GIT_SHA."""
import os
import sys

import torch
import torch.nn.functional as F

from fastconv.backends.triton import shortconv

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-11-28"))
from probe_short import bench, copy_bw  # noqa: E402

dev = "cuda"
TILES = {"seqlen": [(1, 64, 1), (1, 32, 1), (1, 128, 1), (1, 64, 2), (1, 128, 2), (2, 64, 2)],
         "dim": [(16, 4, 2), (32, 4, 4), (16, 16, 2), (32, 16, 4), (16, 32, 4), (8, 32, 2)]}
SHAPES = [(8, 4096, 2048, 16, "seqlen", False), (8, 4096, 2048, 17, "seqlen", False),
          (8, 4096, 2048, 10, "seqlen", False), (1, 8192, 16384, 16, "seqlen", False),
          (8, 4096, 2048, 16, "seqlen", True), (8, 4096, 2048, 16, "dim", False)]


def ids_for(bsz, n):
    g = torch.Generator().manual_seed(0)
    ids = torch.zeros(bsz, n, dtype=torch.int32)
    for b in range(bsz):
        for c in torch.randint(1, n, (5,), generator=g).sort().values:
            ids[b, c:] += 1
    return ids.to(dev)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def probe(bw, bsz, dim, n, w, layout, with_ids):
    x = torch.randn(bsz, dim, n, device=dev, dtype=torch.bfloat16)
    if layout == "dim":
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    wt = torch.randn(dim, w, device=dev, dtype=torch.bfloat16) * w ** -0.5
    b = torch.randn(dim, device=dev, dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    si = ids_for(bsz, n) if with_ids else None
    ref = None
    if not with_ids:  # float32 torch: dx and dw of silu(conv1d(pad(x)) + b)
        xf, wf = x.float().requires_grad_(), wt.float().requires_grad_()
        out = F.silu(F.conv1d(F.pad(xf, (w - 1, 0)), wf.unsqueeze(1), b.float(), groups=dim))
        ref = torch.autograd.grad(out, (xf, wf), dy.float())
    saved_tiles, saved_min = shortconv.tiles, shortconv.SHIFT_MIN_CHUNKS
    fns, errs = {}, {}
    for t in TILES[layout]:
        for shift in (True, False):
            def run(t=t, shift=shift):
                shortconv.tiles = lambda *a: (t, t)
                shortconv.SHIFT_MIN_CHUNKS = 16 if shift else 1 << 30
                return shortconv.short_backward(dy, x, None, wt, b, True, False, si)
            once = shift and t[1] >= 16  # (owned's rule at SHIFT_MIN_CHUNKS = 16)
            name = f"{t} {'once ' if once else 'recompute'}"
            if name in fns:
                continue
            fns[name] = run
            try:
                got = run()
                errs[name] = (f"dx {rel(got[0], ref[0]):.1e} dw {rel(got[2], ref[1]):.1e}"
                              if ref is not None else "")
            except Exception as ex:  # noqa: BLE001 - a probe reports every failure
                errs[name] = f"FAILED {type(ex).__name__}: {str(ex)[:160]}"
                del fns[name]
    try:
        t = bench(fns)
    finally:
        shortconv.tiles, shortconv.SHIFT_MIN_CHUNKS = saved_tiles, saved_min
    nb = x.numel() * 2
    print(f"== {layout} b{bsz} d{dim} L{n} w{w}{' seq_idx' if with_ids else ''}: bwd floor "
          f"{3 * nb / bw / 1e6:.4f} ms; rule {saved_tiles(layout, w, with_ids)[1]}", flush=True)
    for k in errs:
        if k in t:
            print(f"  {k:24s} {t[k]:.4f} ms  {100 * 3 * nb / bw / 1e6 / t[k]:5.1f} % of floor"
                  f"  {errs[k]}", flush=True)
        else:
            print(f"  {k:24s} {errs[k]}", flush=True)


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(), os.environ.get("FASTCONV_GIT_SHA"),
          flush=True)
    bw = copy_bw()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    for args in SHAPES:  # (an argument: that layout's shapes only)
        if len(sys.argv) < 2 or args[4] == sys.argv[1]:
            probe(bw, *args)
    sys.exit(0)
