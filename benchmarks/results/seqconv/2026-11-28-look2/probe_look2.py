"""Device probe (kept as the record of its output, probe-look2-*.log; the sha in a log's
name is the tree it measured): shortconv.py's kernels where they were not yet timed —
widths 16/17 (a tap reaches two chunks back), seq_idx (packed sequences) and x
dim-contiguous — forward and backward alone over candidate tiles (BLOCK_D, CHUNKS, warps),
against the byte floor at the measured copy bandwidth and against packed.py's kernels
(the route before: widths 10-17 and seq_idx calls)."""
import os
import sys

import torch

from fastconv.backends.triton import packed, shortconv

# the timing and copy-bandwidth helpers of the first round's probe (the same code)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-11-28"))
from probe_short import bench, copy_bw  # noqa: E402

dev = "cuda"


# candidates per (layout, look): forward tiles, backward tiles
CANDIDATES = {
    ("seqlen", 1): ([(1, 128, 2)], [(1, 64, 1), (1, 32, 1), (2, 32, 1)]),
    ("seqlen", 2): ([(1, 64, 2), (1, 128, 2), (2, 64, 2), (1, 32, 1)],
                    [(1, 32, 1), (1, 64, 1), (2, 32, 1), (1, 16, 1), (2, 16, 1)]),
    ("dim", 1): ([(128, 2, 4), (64, 4, 4)],
                 [(32, 8, 4), (32, 4, 4), (64, 4, 4), (32, 4, 2), (16, 8, 2), (64, 2, 4)]),
    ("dim", 2): ([(128, 2, 4), (64, 2, 2), (128, 4, 4), (64, 4, 4)],
                 [(32, 4, 4), (32, 2, 4), (64, 2, 4), (32, 4, 2), (16, 4, 2), (64, 4, 4)]),
}


def ids_for(bsz, n):
    """seq_idx of packed sequences: cut points at fixed pseudo-random positions."""
    g = torch.Generator().manual_seed(0)
    ids = torch.zeros(bsz, n, dtype=torch.int32)
    for b in range(bsz):
        cuts = torch.randint(1, n, (5,), generator=g).sort().values
        for c in cuts:
            ids[b, c:] += 1
    return ids.to(dev)


def probe(bw, bsz, dim, n, w, layout, with_ids):
    x = torch.randn(bsz, dim, n, device=dev, dtype=torch.bfloat16)
    if layout == "dim":
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    wt = torch.randn(dim, w, device=dev, dtype=torch.bfloat16) * w ** -0.5
    b = torch.randn(dim, device=dev, dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    si = ids_for(bsz, n) if with_ids else None
    fwd, bwd = CANDIDATES[layout, shortconv._look(w)]
    if with_ids:  # the rule halves the backward's chunks: time both
        bwd = sorted({(d, max(1, c // 2), wp) for d, c, wp in bwd} | set(bwd))
    saved = shortconv.tiles
    fns = {}
    for t in fwd:
        def run_f(t=t):
            shortconv.tiles = lambda *a: (t, t)
            return shortconv.short_forward(x, None, wt, b, True, si)
        fns[f"fwd {t}"] = run_f
    for t in bwd:
        def run_b(t=t):
            shortconv.tiles = lambda *a: (t, t)
            return shortconv.short_backward(dy, x, None, wt, b, True, False, si)
        fns[f"bwd {t}"] = run_b
    fns["fwd packed.py"] = lambda: packed.packed_forward(x, si, None, wt, b, True)

    def old_b():
        g = packed.silu_grad(dy, x, si, None, wt, b)
        out = packed.packed_backward(g, x, si, None, wt, False)
        g.sum((0, 2))
        return out
    fns["bwd packed.py"] = old_b
    try:
        t = bench(fns)
    finally:
        shortconv.tiles = saved
    nb = x.numel() * 2
    rule = saved(layout, w, with_ids)
    print(f"== {layout} b{bsz} d{dim} L{n} w{w}{' seq_idx' if with_ids else ''}: floor fwd "
          f"{2 * nb / bw / 1e6:.4f} ms, bwd {3 * nb / bw / 1e6:.4f} ms; rule {rule}",
          flush=True)
    for k, v in t.items():
        passes = 2 if k.startswith("fwd") else 3
        print(f"  {k:22s} {v:.4f} ms  {100 * passes * nb / bw / 1e6 / v:5.1f} % of floor",
              flush=True)
    for kind in ("fwd", "bwd"):
        k = min((k for k in t if k.startswith(kind) and "packed" not in k), key=t.get)
        print(f"  best {kind}: {k}", flush=True)


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(), os.environ.get("FASTCONV_GIT_SHA"),
          flush=True)
    bw = copy_bw()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    shapes = {"look2": [(8, 4096, 2048, 16, "seqlen", False), (8, 4096, 2048, 17, "seqlen", False),
                        (1, 8192, 16384, 16, "seqlen", False), (8, 4096, 2048, 16, "dim", False)],
              "ids": [(8, 4096, 2048, 4, "seqlen", True), (8, 4096, 2048, 16, "seqlen", True),
                      (8, 4096, 2048, 4, "dim", True), (8, 4096, 2048, 4, "dim", False)]}
    for args in shapes[sys.argv[1] if len(sys.argv) > 1 else "look2"]:
        probe(bw, *args)
    sys.exit(0)
