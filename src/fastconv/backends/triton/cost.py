"""A cost model for the Triton candidates: which tiles are worth compiling and timing.

Dispatch compiles every candidate of a problem before timing it (seconds each); the model
orders them and the tuning budget keeps the most promising (``dispatch``'s pruning). It
estimates a tile's time from what decides it on a GPU, with no measurement:

* GEMM tiles (``TileConfig``): the padded multiply-adds on the tensor cores, the operand
  traffic of every program through L2 (small tiles re-read their operands more), the wave
  quantisation of programs over the SMs at the occupancy the pipeline's shared memory allows,
  a split reduction's partial sums, the layout copies a channels-first problem costs the
  channels-last tiles (row tiles read and write it as it is), and a pipeline fill per program.
* Direct (depthwise and grouped) tiles (``DwConfig``) are not modelled: a first model of their
  bytes and idle lanes ordered the database's winners worse than their lists' own order
  (benchmarks/NOTES.md), so they are never pruned.

Only the order matters, not the seconds. How well it orders is measured against the shipped
tuning database's winners (``benchmarks/cost_model_recall.py``; benchmarks/NOTES.md).
"""

from __future__ import annotations

import math

from ...problem import ConvProblem
from .configs import TileConfig

#: Hopper's figures (H100 SXM; an H200 differs only in HBM), per second
TENSOR_FLOPS = {2: 989e12, 4: 495e12}  # dense, by operand bytes (16-bit, TF32)
L2_BYTES_S = 14e12  # what the SMs read from L2 together (effective: fitted, see NOTES)
HBM_BYTES_S = 3.35e12
SMEM_PER_SM = 227 * 1024
WARPS_PER_SM = 64
SMS = 132
#: the tile area (block_m x block_n) at which a program alone reaches half an SM's tensor
#: rate (fitted with L2_BYTES_S and STEP_S on half the database's problems, see NOTES)
TILE_AREA = 128 * 128
STEP_S = 0.1e-6  # a program's pipeline fill and epilogue per stage, in seconds


def estimate(problem: ConvProblem, op: str, config) -> float:
    """Seconds ``config`` is expected to take for ``op`` of ``problem`` (an order, not a
    prediction to quote); ``inf`` for a configuration the model does not know."""
    if isinstance(config, TileConfig):
        return _gemm(problem, op, config)
    return math.inf


def _gemm_sizes(problem: ConvProblem, op: str, config: TileConfig):
    """(rows, columns, reduction per tap, taps, groups) of the implicit GEMM a tile covers."""
    p = problem.conv_equivalent() if problem.transposed else problem
    taps = math.prod(p.kernel)
    groups = p.groups // config.pack_groups
    cpg, kpg = p.c_per_group * config.pack_groups, p.k_per_group * config.pack_groups
    if op == "wgrad" and config.tap_rows:  # tiles over (K, one kernel row's (s, c) run)
        return kpg, cpg * p.kernel[-1], p.n * math.prod(p.out_size), taps // p.kernel[-1], \
            groups
    if op == "wgrad":  # tiles over (K, C) of one tap; the reduction runs over the pixels
        return kpg, cpg, p.n * math.prod(p.out_size), taps, groups
    pixels_in, pixels_out = p.n * math.prod(p.in_size), p.n * math.prod(p.out_size)
    if op == "dgrad" or (op == "fprop" and problem.transposed):
        return pixels_in, cpg, kpg, taps, groups
    if config.rows:  # a tile never spans two output rows
        q = p.out_size[-1]
        return pixels_out // q * _ceil(q, config.block_m) * config.block_m, kpg, cpg, taps, groups
    return pixels_out, kpg, cpg, taps, groups


def _gemm(problem: ConvProblem, op: str, config: TileConfig) -> float:
    item = problem.dtype.itemsize
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    rows, cols, red, taps, groups = _gemm_sizes(problem, op, config)
    # reduction steps of one program (a split's share of the reduction)
    if op == "wgrad":  # a program per tap and split
        steps = _ceil(_ceil(red, config.split_k), bk)
    elif config.tap_rows:  # one step per kernel row
        steps = _ceil(taps // problem.kernel[-1], config.split_k)
    elif config.flat_k:  # the (r, s, c) reduction flattened
        steps = _ceil(_ceil(red * taps, bk), config.split_k)
    else:
        steps = _ceil(taps * _ceil(red, bk), config.split_k)
    tiles = _ceil(rows, bm) * _ceil(cols, bn) * groups * config.split_k
    if op == "wgrad":
        tiles *= taps
    smem = config.num_stages * (bm + bn) * bk * item
    occupancy = max(1, min(SMEM_PER_SM // max(smem, 1), WARPS_PER_SM // config.num_warps))
    slots = SMS * occupancy
    # A program alone reaches a fraction of the SM's tensor rate that grows with its tile
    # (more independent multiply-adds per operand load in flight); programs sharing an SM
    # add up to the SM's rate. Its operands come from L2 at the SM's share.
    area = bm * bn
    program_rate = TENSOR_FLOPS.get(item, TENSOR_FLOPS[4]) / SMS * area / (area + TILE_AREA)
    sm_rate = min(TENSOR_FLOPS.get(item, TENSOR_FLOPS[4]) / SMS, occupancy * program_rate)
    flops = 2 * bm * bn * bk * steps
    loads = (bm + bn) * bk * steps * item
    per_program = max(flops * occupancy / sm_rate, loads * occupancy / (L2_BYTES_S / SMS)) \
        + STEP_S * config.num_stages
    waves = _ceil(tiles, slots)
    last = tiles - (waves - 1) * slots  # programs in the last wave, spread over the SMs
    seconds = (waves - 1) * per_program + per_program * min(occupancy, _ceil(last, SMS)) \
        / occupancy
    out_bytes = rows * cols * groups * (taps if op == "wgrad" else 1)
    if config.split_k > 1:  # fp32 partial sums written, read back and reduced
        seconds += 2 * out_bytes * config.split_k * 4 / HBM_BYTES_S + 3e-6
    if problem.layout == "nchw" and not config.rows and op != "wgrad":
        # channels-last copies of a channels-first input and output, each read and written
        moved = problem.n * (problem.c * math.prod(problem.in_size)
                             + problem.k * math.prod(problem.out_size))
        seconds += 2 * moved * item / HBM_BYTES_S
    return seconds


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def prune(problem: ConvProblem, op: str, configs: list, keep: int) -> tuple[list, list]:
    """``(kept, pruned)``: the ``keep`` modelled configurations expected fastest, in that
    order, then every configuration the model does not know (in the list's order); and
    the modelled ones left out, in the model's order (the list's order breaks ties)."""
    times = [estimate(problem, op, c) for c in configs]
    modelled = [configs[i] for _, i in sorted((t, i) for i, t in enumerate(times)
                                              if math.isfinite(t))]
    unknown = [c for c, t in zip(configs, times) if not math.isfinite(t)]
    return modelled[:keep] + unknown, modelled[keep:]
