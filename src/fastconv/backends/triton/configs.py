"""Tile configurations for the Triton convolution kernels.

Under the interpreter one small tile keeps the CPU tests fast (each program instance costs
numpy work, so fewer, larger-than-needed tiles would only add masked lanes). On the GPU the
candidates are the shapes that the Hopper sweep in benchmarks/NOTES.md found worth timing;
the first one is the heuristic's pick. Changing a candidate list needs
``plancache.CANDIDATES_REVISION`` raised, or stored benchmark choices ignore the change.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from ...problem import ConvProblem


@dataclasses.dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    flat_k: bool
    split_k: int = 1  # >1: the reduction split over programs, partial sums reduced after
    # >1: this many groups run as one, with a block-diagonal weight (see pack_candidates)
    pack_groups: int = 1
    # forward only: tile rows are consecutive columns of one output row, read and written
    # in a channels-first tensor's own layout (no channels-last copy; see rows_candidates)
    rows: bool = False
    # one kernel row's (s, c) run at once (S * C_G of 16-64 elements): the forward's
    # reduction step, with flat_k and block_k >= the run (tap_rows_candidates), or the
    # weight gradient's columns, block_n >= the run (tap_rows_wgrad_candidates)
    tap_rows: bool = False

    def name(self) -> str:
        return (f"m{self.block_m}n{self.block_n}k{self.block_k}w{self.num_warps}"
                f"s{self.num_stages}{'f' if self.flat_k else ''}"
                + (f"x{self.split_k}" if self.split_k > 1 else "")
                + (f"g{self.pack_groups}" if self.pack_groups > 1 else "")
                + ("r" if self.rows else "") + ("t" if self.tap_rows else ""))


def _flat_k(problem: ConvProblem) -> bool:
    """Walk the flattened (r, s, c) reduction when a group has too few channels for a tile."""
    return problem.c_per_group < 16


def tap_run(problem: ConvProblem) -> int:
    """Elements of one kernel row's ``(s, c)`` run: kernel width times channels per group."""
    return problem.kernel[-1] * problem.c_per_group


def _reduction_block(block_k: int, problem: ConvProblem) -> int:
    """``block_k`` narrowed to a group with few channels (16 below 32, 32 below 64)."""
    cpg = problem.c_per_group
    return min(block_k, 16 if cpg < 32 else 32 if cpg < 64 else block_k)


def interpreter_config(problem: ConvProblem, op: str = "fprop") -> TileConfig:
    flat = op == "fprop" and not problem.transposed and _flat_k(problem)  # forward kernel only
    return TileConfig(32, 16, 16, 4, 1, flat)


# Tile shapes (block_m, block_n, block_k, warps, stages) that won at least one ResNet-50 layer
# in the H200 sweep (benchmarks/NOTES.md), most often first.
_HALF = [(128, 128, 64, 8, 3), (256, 128, 64, 8, 3), (128, 64, 32, 4, 5), (128, 128, 32, 4, 4),
         (64, 128, 64, 4, 4), (64, 64, 64, 4, 4), (256, 64, 64, 8, 3), (128, 64, 64, 4, 4)]
_TF32 = [(128, 128, 32, 4, 3), (256, 128, 32, 8, 3), (128, 128, 32, 8, 3), (64, 128, 32, 4, 4),
         (64, 64, 64, 4, 3), (128, 128, 16, 4, 4), (64, 64, 32, 4, 4)]
_FLAT = [(128, 64, 32, 4, 3), (64, 64, 32, 4, 3), (128, 128, 32, 8, 3), (128, 16, 32, 4, 3),
         (64, 16, 32, 4, 3)]


@functools.lru_cache(maxsize=8)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def fprop_candidates(problem: ConvProblem) -> list[TileConfig]:
    """GPU tile configurations for ``problem``, the heuristic's pick first.

    Split-K variants are added when the output tiles alone cannot fill the GPU and the
    reduction is long enough to share (late ResNet stages: few pixels, many channels).
    """
    m = problem.n * math.prod(problem.out_size)
    if _flat_k(problem):
        narrow = problem.k_per_group <= 16
        shapes = [s for s in _FLAT if (s[1] == 16) == narrow]
        return tap_rows_candidates(problem) + [TileConfig(*s, True) for s in shapes]
    half = problem.dtype in (torch.float16, torch.bfloat16)
    cands = []
    for bm, bn, bk, w, st in (_HALF if half else _TF32):
        bk = _reduction_block(bk, problem)
        if bn > 64 and problem.k_per_group <= 64:
            continue  # a wide tile over a narrow output wastes half its work
        cfg = TileConfig(bm, bn, bk, w, st, False)
        if cfg not in cands:
            cands.append(cfg)
    if not cands:
        cands = [TileConfig(128, 64, 32, 4, 4, False)]
    if m < 4096:  # few output pixels: small tiles first
        cands.sort(key=lambda c: c.block_m * c.block_n)
    sms = _sm_count(torch.cuda.current_device()) if torch.cuda.is_available() else 132
    steps = math.prod(problem.kernel) * -(-problem.c_per_group // 32)
    for base in list(cands[:3]):
        tiles = -(-m // base.block_m) * -(-problem.k_per_group // base.block_n) * problem.groups
        if tiles >= sms:
            continue
        for split in (2, 3, 4, 6):
            if tiles * split <= 3 * sms and steps // split >= 4:
                cands.append(dataclasses.replace(base, split_k=split))
    return cands


#: Shared memory a GEMM tile's pipeline may ask for (the H100 has 227 KiB per block).
SMEM_LIMIT = 200 * 1024


def _stages_that_fit(bm: int, bn: int, bk: int, problem: ConvProblem, stages: int):
    """``stages``, or 2 where that pipeline of ``(bm + bn) x bk`` operands would exceed the
    shared memory (fp32 operands), or None where even 2 stages would."""
    for st in (stages, 2):
        if (bm + bn) * bk * problem.dtype.itemsize * st <= SMEM_LIMIT:
            return st
    return None


def tap_rows_fit(problem: ConvProblem) -> bool:
    """Whether tap-row tiles serve ``problem``: a non-transposed convolution whose groups
    have 2-15 channels and whose kernel rows hold 16-64 elements (``S * C_G``: the 7x7 RGB
    stem's 21; a 4x4 patchify's 12 is too few)."""
    return (not problem.transposed and 2 <= problem.c_per_group < 16
            and 16 <= tap_run(problem) <= 64)


# Tap-row tile shapes (block_m, block_n, warps, stages); block_k is the run rounded up.
_TAP_ROWS = [(128, 64, 4, 3), (256, 64, 8, 3), (64, 64, 4, 3), (128, 32, 4, 3)]


def tap_rows_candidates(problem: ConvProblem) -> list[TileConfig]:
    """Forward tap-row tiles (``tap_rows_fit``' problems): one step per kernel row instead
    of per-element index arithmetic over the flattened reduction."""
    if not tap_rows_fit(problem):
        return []
    block_k = _pow2_at_least_16(tap_run(problem))
    narrow = problem.k_per_group <= 32
    cands = []
    for bm, bn, w, st in _TAP_ROWS:
        st = _stages_that_fit(bm, bn, block_k, problem, st)
        if (bn == 32) == narrow and st is not None:
            cands.append(TileConfig(bm, bn, block_k, w, st, True, tap_rows=True))
    return cands


# dgrad reuses the forward's tile shapes (the same GEMM with the roles of C and K swapped);
# wgrad's reduction runs over pixels, so its tiles cover (K, C) of one tap.
_WGRAD_HALF = [(128, 128, 64, 8, 3), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4)]
_WGRAD_TF32 = [(128, 128, 32, 8, 3), (64, 128, 32, 4, 4), (64, 64, 32, 4, 4)]


def dgrad_candidates(problem: ConvProblem) -> list[TileConfig]:
    """GPU tiles for the data gradient of the (non-transposed) convolution ``problem``:
    rows are input pixels, columns the group's input channels, reduction its output channels."""
    half = problem.dtype in (torch.float16, torch.bfloat16)
    cands = []
    for bm, bn, bk, w, st in (_HALF if half else _TF32)[:5]:
        bk = min(bk, _pow2_at_least_16(problem.k_per_group))
        bn = min(bn, _pow2_at_least_16(problem.c_per_group))
        cfg = TileConfig(bm, bn, bk, w, st, False)
        if cfg not in cands:
            cands.append(cfg)
    return cands


def wgrad_candidates(problem: ConvProblem) -> list[TileConfig]:
    """GPU tiles for the weight gradient, each with two splits of the pixel reduction: one
    that fills the GPU about twice (every split keeping at least 8 steps), and one that keeps
    the fp32 partial sums (written and read back once) under half the bytes of the operands
    the kernel streams. Which wins depends on the layer; benchmark dispatch times both."""
    half = problem.dtype in (torch.float16, torch.bfloat16)
    sms = _sm_count(torch.cuda.current_device()) if torch.cuda.is_available() else 132
    pixels = problem.n * math.prod(problem.out_size)
    operands = pixels * (problem.k + problem.c) * problem.dtype.itemsize
    partial = problem.k * problem.c_per_group * math.prod(problem.kernel) * 4
    cands = tap_rows_wgrad_candidates(problem, sms)
    for bm, bn, bk, w, st in (_WGRAD_HALF if half else _WGRAD_TF32):
        bm = min(bm, _pow2_at_least_16(problem.k_per_group))
        bn = min(bn, _pow2_at_least_16(problem.c_per_group))
        tiles = (-(-problem.k_per_group // bm) * -(-problem.c_per_group // bn)
                 * math.prod(problem.kernel) * problem.groups)
        # (the partial buffer is indexed with 32-bit offsets)
        fill = max(1, min(-(-2 * sms // tiles), pixels // (8 * bk), 128,
                          (2**31 - 1) // (partial // 4)))
        for split in (fill, max(1, min(fill, operands // (4 * partial)))):
            cfg = TileConfig(bm, bn, bk, w, st, False, split)
            if cfg not in cands:
                cands.append(cfg)
    return cands


# Tap-row weight-gradient shapes (block_m: output channels, block_k: pixels per step, warps,
# stages) and the factors applied to the split that fills the GPU four times: the winners of
# the stem sweep on the H100 (7x7 s2, 3 -> 64 channels, bf16/fp16; benchmarks/NOTES.md):
# 256 pixels per step and twice the filling split at b256 and DeepLabV3's 512² b8, half of
# it at b32. (Tiles over every kernel row at once, which read dy once, measured 1.2x slower:
# the x gather, not dy, limits.)
_TAP_ROWS_WGRAD = [(64, 256, 4, 3, 2.0), (64, 256, 4, 3, 0.5), (64, 128, 4, 3, 2.0),
                   (64, 128, 4, 3, 1.0), (64, 256, 4, 3, 1.0)]


def tap_rows_wgrad_candidates(problem: ConvProblem, sms: int) -> list[TileConfig]:
    """Weight-gradient tiles over one kernel row's ``(s, c)`` run (``tap_rows_fit``'
    problems), the pixel reduction split around what fills the GPU four times (every split
    keeping at least 8 steps)."""
    if not tap_rows_fit(problem):
        return []
    block_n = _pow2_at_least_16(tap_run(problem))
    pixels = problem.n * math.prod(problem.out_size)
    rows = problem.kernel[0] if problem.rank == 2 else 1
    partial = problem.k * problem.c_per_group * math.prod(problem.kernel) * 4
    cands = []
    for bm, bk, w, st, factor in _TAP_ROWS_WGRAD:
        bm = min(bm, _pow2_at_least_16(problem.k_per_group))
        st = _stages_that_fit(bm, block_n, bk, problem, st)
        if st is None:
            continue
        tiles = -(-problem.k_per_group // bm) * rows * problem.groups
        split = max(1, min(round(factor * -(-4 * sms // tiles)), pixels // (8 * bk), 128,
                           (2**31 - 1) // (partial // 4)))
        cfg = TileConfig(bm, block_n, bk, w, st, False, split, tap_rows=True)
        if cfg not in cands:
            cands.append(cfg)
    return cands


# Row-tile shapes (block_m, block_n, block_k, warps, stages) from the seed002_conv1d sweep on
# the H100 (sweep.py --rows-grid; benchmarks/NOTES.md): the winners of the grouped and
# narrow cases, most often first. 64-column blocks split a 448-column row without padding.
_ROWS_HALF = [(64, 128, 32, 4, 4), (64, 256, 32, 4, 4), (128, 256, 64, 8, 3),
              (128, 128, 32, 4, 4), (64, 64, 32, 4, 4), (128, 64, 32, 4, 5)]
_ROWS_TF32 = [(128, 256, 32, 8, 3), (64, 128, 16, 4, 4), (128, 128, 16, 4, 4),
              (64, 256, 16, 4, 4), (64, 64, 32, 4, 3), (64, 64, 16, 4, 4), (128, 64, 16, 4, 4)]


def rows_candidates(problem: ConvProblem) -> list[TileConfig]:
    """Row tiles for channels-first rank-1 forward problems (NCL: torch has no channels-last
    3-D tensors, so the GEMM tiles copy a conv1d input to NLC each call and write the output
    across the channel stride; row tiles read and write NCL as it is). A row tile never
    spans two rows: an output row of ``Q`` columns runs ``ceil(Q / block_m)`` tiles."""
    if problem.rank != 1 or problem.layout != "nchw" or problem.transposed \
            or _flat_k(problem):
        return []
    half = problem.dtype in (torch.float16, torch.bfloat16)
    cands = []
    for bm, bn, bk, w, st in (_ROWS_HALF if half else _ROWS_TF32):
        if bn > max(64, problem.k_per_group):
            continue  # wider than the group's outputs: idle columns
        bk = _reduction_block(bk, problem)
        cands.append(TileConfig(bm, bn, bk, w, st, False, rows=True))
    return cands


#: Packed group widths: channels per packed group (in and out) that the candidates aim at.
_PACK_WIDTHS = (32, 64)


def pack_candidates(problem: ConvProblem, op: str) -> list[TileConfig]:
    """Tiles that run ``pack_groups`` groups with few channels as one group of a
    block-diagonal weight (zeros between the groups): the GEMM tiles then cover 32 or 64
    channels instead of masking most of a tile to 4-16, at the price of ``pack_groups``
    times the multiply-adds, which the tensor cores have to spare where a group is narrow
    (ResNeXt's 4-32 channels per group). The two first tiles of each packed problem."""
    widest = max(problem.c_per_group, problem.k_per_group)
    if problem.groups == 1 or problem.transposed or widest > 32:
        return []
    listing = {"fprop": fprop_candidates, "dgrad": dgrad_candidates,
               "wgrad": wgrad_candidates}[op]
    cands = []
    for width in _PACK_WIDTHS:
        pack = next((g for g in range(2, problem.groups + 1)
                     if problem.groups % g == 0 and g * widest >= width), None)
        if pack is None or any(c.pack_groups == pack for c in cands):
            continue
        packed = dataclasses.replace(problem, groups=problem.groups // pack)
        cands += [dataclasses.replace(c, pack_groups=pack) for c in listing(packed)[:2]]
    return cands


def _pow2_at_least_16(n: int) -> int:
    """The smallest power of two >= max(n, 16) (tl.dot needs every tile side >= 16)."""
    return max(16, 1 << (max(n, 1) - 1).bit_length())
