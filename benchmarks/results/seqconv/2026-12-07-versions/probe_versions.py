"""shortrows.py's backward (and width 16's forward) at several versions in one process, the
kernels interleaved batch by batch. Versions: ``new``, this tree's shortrows.py (at 05b2547,
when this ran first: the split loops of f1aa919), and ``v`` for a module ``shortrows_v`` that
the caller copies into the package (gpu_versions.sh, from tmp_versions/): by default ``045``
(b045087: one masked loop, masks as ``tl.where``) and ``598`` (598f1c3, the kernel the
2026-12-07 probe timed: masks as ``dmask & scalar``). bf16, SiLU, bias, no states, x and dy
dim-contiguous; per call CUDA events over 10 back-to-back calls, median of 9 batches; % of
the byte floor (forward: x read, out written; backward: x and dy read, dx written) at the
copy bandwidth measured here; errors against float64.
``python probe_versions.py compile N``: builds worker N's rows only (of 4).
VERSIONS="split 045" and WIDTHS="2 4 8" (the b8 rows; 4 adds b1 d8192 L16384) choose
others. With VERSIONS given, outputs are compared with the last version's (no float64
reference: faster). PROBE_TILES=file.json ({"2": [[BLOCK_D, SPAN, UNROLL, warps[,
registers]], …], …}): more candidates, timed on the first version alone, in place of
NEW_ONLY (which the first version, new by default, also runs)."""
import importlib
import json
import os
import statistics
import sys
from functools import partial

import torch
import torch.nn.functional as F

VERSIONS = os.environ.get("VERSIONS", "new 045 598").split()
MODS = {v: importlib.import_module("fastconv.backends.triton.shortrows"
                                   + ("" if v == "new" else f"_{v}")) for v in VERSIONS}
BASE = VERSIONS[-1]
F64 = "VERSIONS" not in os.environ
SHIPPED = {2: (64, 128, 4, 1), 4: (64, 128, 4, 1), 8: (64, 128, 4, 1), 16: (32, 128, 4, 1)}
NEW_ONLY = {2: [(64, 128, 8, 1)], 4: [(64, 128, 16, 1), (64, 128, 8, 1, 128)],
            8: [(64, 128, 8, 1, 128), (32, 128, 8, 1, 128)],
            16: [(32, 128, 8, 1), (32, 128, 16, 1, 168), (32, 256, 16, 1, 168),
                 (32, 128, 4, 1, 128)]}
if os.environ.get("PROBE_TILES"):
    with open(os.environ["PROBE_TILES"]) as f:
        NEW_ONLY = {int(w): [tuple(t) for t in ts] for w, ts in json.load(f).items()}
FORWARD16 = [("new", (64, 64, 8, 1)), ("045", (64, 64, 8, 1)), ("598", (64, 64, 8, 1)),
             ("new", (64, 64, 8, 1, 96)), ("new", (32, 128, 16, 1))]
WIDTHS = [int(w) for w in os.environ.get("WIDTHS", "2 4 8 16").split()]
ROWS = [(8, 4096, 2048, w) for w in WIDTHS] + [(1, 8192, 16384, 4)] * (4 in WIDTHS)
only = sys.argv[1:2] == ["compile"]
part = int(sys.argv[2]) if only else None
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


if not only:
    big = torch.randn(8, 4096, 2048, device="cuda").bfloat16()
    dst = torch.empty_like(big)
    dst.copy_(big)
    copy_us = statistics.median(batch_us(lambda: dst.copy_(big)) for _ in range(9))
    GBPS = 2 * big.numel() * 2 / (copy_us * 1e3)
    print(f"{torch.cuda.get_device_name()}; copy {copy_us:.1f} us: {GBPS:.0f} GB/s", flush=True)
for n, (batch, dim, seqlen, width) in enumerate(ROWS):
    if only and n % 4 != part:
        continue
    x = torch.randn(batch, seqlen, dim, device="cuda").bfloat16().transpose(1, 2)
    w = (torch.randn(dim, width, device="cuda") / width ** 0.5).bfloat16()
    b = torch.randn(dim, device="cuda").bfloat16()
    dy = torch.randn(batch, seqlen, dim, device="cuda").bfloat16().transpose(1, 2)
    if F64:
        xd, wd, bd = (t.double().requires_grad_() for t in (x, w, b))
        y = F.silu(F.conv1d(xd, wd.unsqueeze(1), bd, padding=width - 1,
                            groups=dim)[..., :seqlen])
        y.backward(dy.double())
        ref = (y.detach(), xd.grad, wd.grad, bd.grad)
        del xd, wd, bd, y
    else:
        grads = MODS[BASE].rows_backward(dy, x, None, w, b, True, False, SHIPPED[width])
        ref = (None, grads[0].double(), grads[2].double(), grads[3].double())
    name = f"b{batch} d{dim} L{seqlen} w{width}"
    runs = [("backward", v, SHIPPED[width]) for v in MODS] + \
        [("backward", VERSIONS[0], t) for t in NEW_ONLY.get(width, [])]
    if width == 16 and batch == 8 and F64:
        runs += [("forward", v, t) for v, t in FORWARD16]
    for direction in ("backward", "forward"):
        calls, errs = {}, {}
        for d, v, t in runs:
            if d != direction:
                continue
            m = MODS[v]
            fn = partial(m.rows_forward, x, None, w, b, True, t) if d == "forward" else \
                partial(m.rows_backward, dy, x, None, w, b, True, False, t)
            out = fn()
            errs[(v, t)] = f"out {rel(out, ref[0]):.1e}" if d == "forward" else \
                f"dx {rel(out[0], ref[1]):.1e} dw {rel(out[2], ref[2]):.1e} " \
                f"db {rel(out[3], ref[3]):.1e}"
            calls[(v, t)] = fn
        if not calls:
            continue
        if only:
            print(name, direction, "built", len(calls), flush=True)
            continue
        floor_bytes = (2 if direction == "forward" else 3) * x.numel() * 2
        times = {k: [] for k in calls}
        for _ in range(9):
            for k, fn in calls.items():
                times[k].append(batch_us(fn))
        med = {k: statistics.median(v) for k, v in times.items()}
        base = med[(BASE, SHIPPED[width] if direction == "backward" else (64, 64, 8, 1))]
        for k, us in sorted(med.items(), key=lambda kv: kv[1]):
            pct = floor_bytes / (us * 1e3) / GBPS * 100
            print(f"{name} {direction:8} {k[0]:3} {str(k[1]):22} {us:8.1f} us {pct:5.1f} % of "
                  f"floor {base / us:5.3f}x {BASE}  {errs[k]}", flush=True)
