"""Tile sweeps on the GPU: every Triton fprop candidate on ResNet-50 layers, or on the cases
of the suite named by ``--suite`` (CUDA-graph timing); with ``--bn``, the tile sizes and
warps of the training BatchNorm passes.

For each case and dtype: cuDNN's time (torch, cudnn.benchmark) and each candidate
configuration's time, through TritonBackend.bind, so the launch (and any layout copy) is the
one the library makes. Rank-2 tensors are channels-last (the numbers that say what the kernel
itself reaches, without layout copies); rank-1 tensors are NCL, as conv1d users hand them
(torch has no channels-last 3-D tensors). Prints one line per case: best configuration, its
time, cuDNN's, the ratio, the runners-up.

Usage: python3 benchmarks/sweep.py [--rows-grid] [--suite NAME] [case names...]
--rows-grid adds row tiles (TileConfig.rows) of a grid of shapes beyond dispatch's list, and
flat-reduction variants of its row tiles, for the rank-1 cases: a search for better entries.

``python3 benchmarks/sweep.py --bn [--default-only]``: the four passes of the fused training
BatchNorm (backends/triton/bnstats.py: statistics, normalise + ReLU (+ residual), backward
sums, backward apply) on ResNet-50 b256 activations (bf16, channels-last), each config's
GB/s per pass against the pass's least traffic and the four passes' total time per shape,
the default tiles (each pass its own, ``bnstats.PASS_TILES``) first, then each config for
every pass; every config's outputs compared with the default's, norm-wise
(element-wise, the backward's ReLU masks flip where the bf16 output rounds to zero, as in
torch).

``python3 benchmarks/sweep.py --toeplitz``: the wide-filter kernel's tiles
(``toeplitz.TILE``: block, block rows per program, warps) on causal conv1d shapes (bf16,
seqlen-contiguous, SiLU) at widths 32-256, each tile's time (CUDA-graph replays), its
percentage of the HBM floor and its error against float64. ``--toeplitz-backward``: the
backward's launches of that kernel (input gradient, dy · SiLU') over fewer tiles.
"""

import dataclasses
import itertools
import statistics
import sys

import torch
import torch.nn.functional as F
import triton

from fastconv import ConvProblem
from fastconv.backends.triton import TritonBackend, bnstats, toeplitz
from fastconv.backends.triton.configs import TileConfig
from fastconv.precision import relative_error
from fastconv.tools.bench.report import geomean
from fastconv.tools.bench.suites import SUITES
from fastconv.tools.bench.timers import time_graph


def time_configs(name, problem, configs, fns_of, out, ref, op="fprop"):
    """[(median ms, config name)] of each configuration that compiles and matches ``ref``
    (``out`` after the first of ``fns_of(bound run)``; ``op``'s run), fastest first; the
    others are reported and left out."""
    results = []
    for cfg in configs:
        fns = fns_of(TritonBackend.bind(problem, cfg, op))
        try:
            fns[0]()
            err = relative_error(out, ref)
            t = statistics.median(time_graph(fns, reps=10, calls=8))
        except Exception as exc:  # e.g. out of shared memory, a compile failure
            print(f"  {name} {cfg.name()}: {type(exc).__name__}: {exc}"[:300])
            continue
        if err > 2e-2:
            print(f"  {name} {cfg.name()}: WRONG rel err {err:.2e}")
            continue
        results.append((t, cfg.name()))
    return sorted(results)


def rows_grid(problem, listed):
    """Row tiles of shapes (block_m 64/128, block_n 64-256, two reduction depths, 4 or 8
    warps) not in ``listed``, and flat-reduction twins of the listed row tiles."""
    half = problem.dtype != torch.float32
    grid = [TileConfig(bm, bn, bk, w, st, False, rows=True)
            for bm, bn, bk, (w, st) in itertools.product(
                (64, 128), (64, 128, 256), (32, 64) if half else (16, 32), ((4, 4), (8, 3)))
            if bn <= max(64, problem.k_per_group)]
    flat = [dataclasses.replace(t, flat_k=True) for t in listed if getattr(t, "rows", False)]
    return [t for t in grid + flat if t not in listed]


BN_SHAPES = [  # (N, C, H, W, residual): layer1 conv3 (+ shortcut), layer1 conv2, layer3, layer4
    (256, 256, 56, 56, True), (256, 64, 56, 56, False), (256, 1024, 14, 14, True),
    (256, 512, 7, 7, False)]
BN_CONFIGS = [(r, c, w) for r, c, w in itertools.product((64, 128, 256), (32, 64, 128), (4, 8))
              if r * c <= 16384]  # (BLOCK_R, BLOCK_C, NUM_WARPS)


def bn_passes(y, res, dz):
    """The four passes run once (their outputs) and as calls to time."""
    mean, var, invstd, scale, shift = bnstats.forward_stats(y, None, None,
                                                            1e-5, None, None, 0.1)
    z = bnstats.apply(y, res, scale, shift, "relu", 0.0)
    stats = (mean, invstd, scale, shift)
    sums = bnstats.backward_sums(dz, z, y, res, stats, "relu", 0.0)
    dy, dres = bnstats.backward_apply(dz, z, y, res, stats, sums, y.numel() // y.shape[1],
                                      "relu", 0.0)
    calls = {
        "stats": lambda: bnstats.forward_stats(y, None, None, 1e-5, None,
                                               None, 0.1),
        "apply": lambda: bnstats.apply(y, res, scale, shift, "relu", 0.0),
        "bwd_sums": lambda: bnstats.backward_sums(dz, z, y, res, stats, "relu", 0.0),
        "bwd_apply": lambda: bnstats.backward_apply(dz, z, y, res, stats, sums,
                                                    y.numel() // y.shape[1], "relu", 0.0),
    }
    return (mean, var, z, sums, dy), calls


def bn_main(default_only: bool) -> None:
    """``--bn``: see the module docstring."""
    default = dict(bnstats.PASS_TILES)  # each pass its own tile
    print(torch.cuda.get_device_name(), "triton", triton.__version__)
    for n, c, h, w, has_res in BN_SHAPES:
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
        others = [] if default_only else BN_CONFIGS
        for cfg in [None] + others:  # None: the default tiles
            bnstats.PASS_TILES.update(default if cfg is None else
                                      {k: bnstats.Tile(*cfg) for k in default})
            outs, calls = bn_passes(y, res, dz)
            if ref is None:
                ref = outs
            err = max(float((a.float() - b.float()).norm() / b.float().norm())
                      for a, b in zip(outs, ref))
            ms = {k: triton.testing.do_bench(f, warmup=10, rep=40) for k, f in calls.items()}
            name = "default    " if cfg is None else f"R{cfg[0]:<4}C{cfg[1]:<4}w{cfg[2]}"
            print(f"  {name}  " +
                  "  ".join(f"{k} {moved[k] / v / 1e6:6.0f}" for k, v in ms.items()) +
                  f"  total {sum(ms.values()):.3f} ms  rel.diff {err:.1e}", flush=True)
    bnstats.PASS_TILES.update(default)


#: (batch, dim, seqlen) of the --toeplitz sweep, and its widths and tiles
TOEPLITZ_SHAPES = ((8, 4096, 2048), (1, 8192, 16384), (16, 1024, 256))
TOEPLITZ_WIDTHS = (32, 64, 128, 256)
TOEPLITZ_TILES = [(b, r, w) for b in (32, 64) for r in (16, 32, 64, 128) for w in (4, 8)]


def toeplitz_main() -> None:
    """``--toeplitz``: see the module docstring."""
    default = toeplitz.TILE  # None: each problem's tile by toeplitz.tile
    print(torch.cuda.get_device_name(), "triton", triton.__version__)
    for (batch, dim, seqlen), width in itertools.product(TOEPLITZ_SHAPES, TOEPLITZ_WIDTHS):
        torch.manual_seed(0)
        x = torch.randn(batch, dim, seqlen, device="cuda").bfloat16()
        w = (torch.randn(dim, width, device="cuda") / width ** 0.5).bfloat16()
        b = torch.randn(dim, device="cuda").bfloat16()
        ref = F.silu(F.conv1d(F.pad(x.double(), (width - 1, 0)), w.double().unsqueeze(1),
                              b.double(), groups=dim))
        floor_ms = 2 * x.numel() * 2 / 4.2e12 * 1e3  # x read and out written at ~4.2 TB/s
        results = []
        mine = toeplitz.tile(seqlen, width)
        for tile in [mine] + [t for t in TOEPLITZ_TILES if t != mine]:
            toeplitz.TILE = tile
            try:
                out = toeplitz.toeplitz_forward(x, w, b, None, True)
                err = relative_error(out, ref)
                ms = statistics.median(time_graph(
                    [lambda: toeplitz.toeplitz_forward(x, w, b, None, True)], reps=10, calls=8))
            except Exception as exc:  # e.g. out of registers or shared memory
                print(f"  {tile}: {type(exc).__name__}: {exc}"[:200])
                continue
            results.append((ms, tile, err))
        toeplitz.TILE = default
        results.sort()
        line = ", ".join(f"{t} {ms:.3f} ({floor_ms / ms * 100:.0f}%, err {e:.1e})"
                         for ms, t, e in results[:4])
        ms = next((r[0] for r in results if r[1] == mine), float("nan"))
        print(f"b{batch} d{dim} l{seqlen} w{width}: toeplitz.tile's {mine} {ms:.3f} ms; "
              f"best {line}", flush=True)


#: the tiles the backward's launches are timed with (``--toeplitz-backward``)
TOEPLITZ_BACKWARD_TILES = [(b, r, 4) for b in (32, 64) for r in (16, 64, 128)]


def toeplitz_backward_main() -> None:
    """``--toeplitz-backward``: the backward's two launches of the forward kernel, the input
    gradient (``REVERSE``) and dy · SiLU' (``silu_grad``), each with toeplitz.tile's tile
    and TOEPLITZ_BACKWARD_TILES (ms per call, CUDA-graph replays)."""
    from fastconv.backends.triton.toeplitz import _launch

    print(torch.cuda.get_device_name(), "triton", triton.__version__)
    for (batch, dim, seqlen), width in itertools.product(TOEPLITZ_SHAPES, TOEPLITZ_WIDTHS):
        torch.manual_seed(0)
        x = torch.randn(batch, dim, seqlen, device="cuda").bfloat16()
        g = torch.randn_like(x)
        w = (torch.randn(dim, width, device="cuda") / width ** 0.5).bfloat16()
        b = torch.randn(dim, device="cuda").bfloat16()
        ops = {"dx": lambda: _launch(g, w, None, None, torch.empty_like(x), reverse=True),
               "silu_grad": lambda: toeplitz.silu_grad(g, x, w, b, None)}
        mine = toeplitz.tile(seqlen, width)
        for name, op in ops.items():
            results = []
            for tile in [mine] + [t for t in TOEPLITZ_BACKWARD_TILES if t != mine]:
                toeplitz.TILE = tile
                try:
                    ms = statistics.median(time_graph([op], reps=10, calls=8))
                except Exception as exc:  # e.g. out of registers or shared memory
                    print(f"  {tile}: {type(exc).__name__}: {exc}"[:200])
                    continue
                results.append((ms, tile))
            toeplitz.TILE = None
            results.sort()
            ms = next((r[0] for r in results if r[1] == mine), float("nan"))
            print(f"b{batch} d{dim} l{seqlen} w{width} {name}: toeplitz.tile's {mine} "
                  f"{ms:.3f} ms; best " + ", ".join(f"{t} {m:.3f}" for m, t in results[:3]),
                  flush=True)


def main(args):
    if args[:1] == ["--bn"]:
        bn_main("--default-only" in args)
        return
    if args[:1] == ["--toeplitz"]:
        toeplitz_main()
        return
    if args[:1] == ["--toeplitz-backward"]:
        toeplitz_backward_main()
        return
    grid = args[:1] == ["--rows-grid"]
    args = args[1:] if grid else args
    suite = args[1] if args[:1] == ["--suite"] else None
    names = args[2:] if suite else args
    cases = SUITES[suite] if suite else SUITES["resnet50"] + SUITES["seed000"][:1]
    cases = [c for c in cases if not names or c.name in names]
    conv = {1: F.conv1d, 2: F.conv2d}
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    print(f"{'case':<24} {'dtype':<9} {'cudnn ms':>9} {'best ms':>9} {'ratio':>6}  best config"
          "  (runners-up)")
    ratios = {}
    for dtype in (torch.float32, torch.bfloat16):
        for case in cases:
            x = torch.randn(case.n, case.c, *case.spatial, device="cuda").to(dtype)
            w = (torch.randn(case.k, case.c // case.groups, *case.kernel, device="cuda")
                 / 30).to(dtype)
            if case.rank == 2:
                x = x.contiguous(memory_format=torch.channels_last)
                w = w.contiguous(memory_format=torch.channels_last)
            args = (case.stride, case.padding, case.dilation, case.groups)
            ref = conv[case.rank](x, w, None, *args)
            t_cudnn = statistics.median(time_graph(
                [lambda: conv[case.rank](x, w, None, *args)]))
            out = torch.empty_like(ref)
            problem = ConvProblem.from_tensors(x, w, None, *args, rank=case.rank,
                                               precision="tf32" if dtype == torch.float32
                                               else None)
            def fns(run):
                return [lambda: run(x, w, None, None, None, None, out)]
            configs = TritonBackend.candidates(problem)
            if grid and case.rank == 1:
                configs = configs + rows_grid(problem, configs)
            results = time_configs(case.name, problem, configs, fns, out, ref)
            best = results[0]
            ratios.setdefault(str(dtype), []).append(t_cudnn / best[0])
            others = ", ".join(f"{n} {t:.4f}" for t, n in results[1:6])
            print(f"{case.name:<24} {str(dtype)[6:]:<9} {t_cudnn:9.4f} {best[0]:9.4f} "
                  f"{t_cudnn / best[0]:6.2f}  {best[1]}  ({others})", flush=True)
    for dt, r in ratios.items():
        print(f"{dt}: geomean kernel/cuDNN speed ratio {geomean(r):.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
