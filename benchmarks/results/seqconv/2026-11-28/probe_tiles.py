"""Device probe (kept as the record of its output, probe-tiles-H100-7d88e2e.log; it runs
against 7d88e2e's packed.py, the tl.gather kernels, reverted by 9ce6edc): (1) the one-pass
packed kernels' windows (BLOCK_T x BLOCK_D) on causal_conv1d's training shapes, forward and
backward alone, against the byte floor at the measured copy bandwidth; (2) the training
route's size rule: kernels against fastconv.conv1d's route, forward + backward, per size."""
import os
import sys

import torch
import torch.nn.functional as F

import fastconv
from fastconv import seqconv
from fastconv.backends.triton import packed

dev = "cuda"


def bench(fns, rounds=7, n=20):
    ts = {k: [] for k in fns}
    for f in fns.values():
        for _ in range(3):
            f()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for k, f in fns.items():
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(n):
                f()
            e.record()
            e.synchronize()
            ts[k].append(s.elapsed_time(e) / n)
    return {k: sorted(v)[len(v) // 2] for k, v in ts.items()}


def copy_bw():
    a = torch.empty(1 << 28, device=dev, dtype=torch.uint8)
    b = torch.empty_like(a)
    t = bench({"c": lambda: b.copy_(a)})["c"]
    return 2 * a.numel() / (t * 1e-3) / 1e9  # GB/s


def tiles(bw):
    orig = packed._tile
    variants = [None, (512, 8), (1024, 2), (1024, 4), (256, 8), (2048, 1), (512, 2), (256, 4)]
    for (bsz, dim, n, w) in [(8, 4096, 2048, 4), (1, 8192, 16384, 4), (8, 4096, 2048, 2),
                             (8, 4096, 2048, 16)]:
        x = torch.randn(bsz, dim, n, device=dev, dtype=torch.bfloat16)
        wt = torch.randn(dim, w, device=dev, dtype=torch.bfloat16) * w ** -0.5
        b = torch.randn(dim, device=dev, dtype=torch.bfloat16)
        dy = torch.randn_like(x)
        fns = {}
        for v in variants:
            def run_f(v=v):
                packed._tile = orig if v is None else (lambda x, width, v=v: (v[0], v[1], orig(x, width)[2]))
                return packed.packed_forward(x, None, None, wt, b, True)

            def run_b(v=v):
                packed._tile = orig if v is None else (lambda x, width, v=v: (v[0], v[1], orig(x, width)[2]))
                return packed.packed_backward(dy, x, None, None, wt, b, True, False)
            fns[f"fwd {v or 'default'}"] = run_f
            fns[f"bwd {v or 'default'}"] = run_b
        t = bench(fns)
        packed._tile = orig
        nb = x.numel() * 2
        print(f"== b{bsz} d{dim} L{n} w{w}: floor fwd {2 * nb / bw / 1e6:.4f} ms, "
              f"bwd {3 * nb / bw / 1e6:.4f} ms", flush=True)
        for k, v in t.items():
            passes = 2 if k.startswith("fwd") else 3
            print(f"  {k:18s} {v:.4f} ms  {100 * passes * nb / bw / 1e6 / v:5.1f} % of floor",
                  flush=True)


def size_rule():
    for (bsz, dim, n, w) in [(16, 1024, 256, 4), (4, 2048, 1024, 4), (8, 2048, 1024, 4),
                             (8, 4096, 1024, 4), (8, 4096, 2048, 4), (8, 4096, 2048, 16)]:
        x = torch.randn(bsz, dim, n, device=dev, dtype=torch.bfloat16, requires_grad=True)
        wt = (torch.randn(dim, w, device=dev, dtype=torch.bfloat16) * w ** -0.5).requires_grad_()
        b = torch.randn(dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(x.shape, device=dev, dtype=torch.bfloat16)

        def step(kernels):
            def f():
                seqconv._TRAIN_KERNELS_MIN_NUMEL = 0 if kernels else 1 << 62
                out = fastconv.causal_conv1d(x, wt, b, activation="silu")
                out.backward(dy)
                x.grad = wt.grad = b.grad = None
            return f

        def torch_step():
            out = F.silu(F.conv1d(x, wt.unsqueeze(1), b, padding=w - 1, groups=dim)[..., :n])
            out.backward(dy)
            x.grad = wt.grad = b.grad = None
        t = bench({"kernels": step(True), "conv1d": step(False), "torch": torch_step}, n=10)
        print(f"size b{bsz} d{dim} L{n} w{w} ({x.numel() / 2**20:.0f}M): kernels "
              f"{t['kernels']:.4f} conv1d {t['conv1d']:.4f} torch {t['torch']:.4f} ms; "
              f"kernels/conv1d {t['conv1d'] / t['kernels']:.2f}x", flush=True)


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(), os.environ.get("FASTCONV_GIT_SHA"),
          flush=True)
    bw = copy_bw()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    tiles(bw)
    size_rule()
    sys.exit(0)
