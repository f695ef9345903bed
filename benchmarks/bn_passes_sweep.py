"""Tile sizes and warps of the training BatchNorm passes (backends/triton/bnstats.py), timed
on ResNet-50 b256 activations (bf16, channels-last) against their least traffic.

Each pass of the fused layer (statistics, normalise + ReLU (+ residual), backward sums,
backward apply) moves a known number of bytes: the table gives each config's GB/s per pass
and the sum of the four passes' times per shape, with the default config's first; every
config's outputs are compared with the default's, norm-wise (element-wise, the ReLU masks of
the backward flip where the bf16 output rounds to zero, as in torch). Usage (GPU):
    PYTHONPATH=src python3 benchmarks/bn_passes_sweep.py [--default-only]
"""

from __future__ import annotations

import itertools
import sys

import torch
import triton

from fastconv.backends.triton import bnstats

SHAPES = [  # (N, C, H, W, residual): layer1 conv3 (+ shortcut), layer1 conv2, layer3, layer4
    (256, 256, 56, 56, True), (256, 64, 56, 56, False), (256, 1024, 14, 14, True),
    (256, 512, 7, 7, False)]
CONFIGS = [(r, c, w) for r, c, w in itertools.product((64, 128, 256), (32, 64, 128), (4, 8))
           if r * c <= 16384]


def passes(y, res, dz):
    mean, var, invstd, scale, shift = bnstats.forward_stats(y, torch.float32, None, None,
                                                            1e-5, None, None, 0.1)
    z = bnstats.apply(y, res, scale, shift, "relu", 0.0)
    sums = bnstats.backward_sums(dz, z, y, res, mean, invstd, scale, shift, "relu", 0.0)
    dy, dres = bnstats.backward_apply(dz, z, y, res, mean, invstd, scale, shift, sums,
                                      y.numel() // y.shape[1], "relu", 0.0)
    calls = {
        "stats": lambda: bnstats.forward_stats(y, torch.float32, None, None, 1e-5, None,
                                               None, 0.1),
        "apply": lambda: bnstats.apply(y, res, scale, shift, "relu", 0.0),
        "bwd_sums": lambda: bnstats.backward_sums(dz, z, y, res, mean, invstd, scale, shift,
                                                  "relu", 0.0),
        "bwd_apply": lambda: bnstats.backward_apply(dz, z, y, res, mean, invstd, scale, shift,
                                                    sums, y.numel() // y.shape[1], "relu",
                                                    0.0),
    }
    return (mean, var, z, sums, dy), calls


def main() -> None:
    default = (bnstats.BLOCK_R, bnstats.BLOCK_C, bnstats.NUM_WARPS)
    print(torch.cuda.get_device_name(), "triton", triton.__version__)
    for n, c, h, w, has_res in SHAPES:
        torch.manual_seed(0)
        fmt = torch.channels_last
        y = (torch.randn(n, c, h, w, device="cuda") * 2 + 0.5).to(torch.bfloat16) \
            .contiguous(memory_format=fmt)
        res = torch.randn_like(y) if has_res else None
        dz = torch.randn_like(y)
        t = y.numel() * 2  # bytes of one activation
        moved = {"stats": t, "apply": t * (3 if has_res else 2),
                 "bwd_sums": 3 * t, "bwd_apply": t * (5 if has_res else 4)}
        print(f"\nshape {n}x{c}x{h}x{w} residual={has_res}: GB/s per pass, total ms")
        ref = None
        others = [] if "--default-only" in sys.argv else [k for k in CONFIGS if k != default]
        for cfg in [default] + others:
            bnstats.BLOCK_R, bnstats.BLOCK_C, bnstats.NUM_WARPS = cfg
            outs, calls = passes(y, res, dz)
            if ref is None:
                ref = outs
            err = max(float((a.float() - b.float()).norm() / b.float().norm())
                      for a, b in zip(outs, ref))
            ms = {k: triton.testing.do_bench(f, warmup=10, rep=40) for k, f in calls.items()}
            print(f"  R{cfg[0]:<4}C{cfg[1]:<4}w{cfg[2]}  " +
                  "  ".join(f"{k} {moved[k] / v / 1e6:6.0f}" for k, v in ms.items()) +
                  f"  total {sum(ms.values()):.3f} ms  rel.diff {err:.1e}", flush=True)
    bnstats.BLOCK_R, bnstats.BLOCK_C, bnstats.NUM_WARPS = default


if __name__ == "__main__":
    main()
