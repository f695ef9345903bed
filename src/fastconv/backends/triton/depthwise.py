"""Depthwise convolution (groups == input channels, any channel multiplier), rank 1 and 2:
forward with the fused epilogue, data gradient and weight gradient. The same three also run
grouped convolutions with few channels per group: each output element reduces its group's
``C/groups`` input channels over the window, each input element's gradient its group's
``K/groups`` outputs, and the weight gradient takes one input channel of each group per pass.

Each output channel ``k`` reads one input channel ``k // M`` (``M = K / C``, the multiplier)
through an ``R × S`` window, so the work is ``R·S`` multiply-adds per output element and the
problem is memory-bound: the kernels stream the input once (the window's taps hit L1/L2)
and write the output once, in fp32 registers, with no im2col and no GEMM.

Tiles follow the layout so that the contiguous dimension is the vector dimension:

* channels-last (NHWC / NLC): ``[BLOCK_A positions × BLOCK_B channels]``, positions
  flattened over ``(n, p, q)``;
* channels-first (NCHW / NCL): ``[BLOCK_A channels × BLOCK_B columns]`` of one output row
  ``(n, p)``, columns contiguous; or, for images narrower than a tile (``plane``),
  ``[BLOCK_A channels × BLOCK_B positions]`` of one image's flattened ``(p, q)`` plane,
  which is contiguous in NCHW too (a 14-wide row would leave most of a 64-column tile idle).

The data gradient is the same walk over the input's positions, taking for each tap the
output position it fed (``p = (h + π − r·δ) / σ`` when exact and in range). The weight
gradient reduces ``dy · x`` over positions: programs take contiguous position ranges
(``SPLIT`` of them per channel block), keep one fp32 accumulator row per tap (per tap of
one kernel row, for kernels past ``ROW_LOOP_PAST``), and write partial sums that one
fixed-order sum combines (deterministic, no atomics).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from .common import acc_type, activation
from .launch import INTERPRETED, Fixed, Prepared, cdiv, prepare
from .launchargs import EpilogueArgs, Geometry

__all__ = ["DwConfig", "candidates", "launch_fprop", "launch_dgrad", "launch_wgrad"]


@dataclasses.dataclass(frozen=True)
class DwConfig:
    """A depthwise tile: ``block_a × block_b`` (see the module docstring for which is which
    in each layout) and the warps per program. ``pairs``: the forward runs dw_pairs.py's
    kernel (16-bit channels-first rows, ``block_b`` counting column pairs) when the tensors
    allow it, this module's otherwise. ``plane``: channels-first tiles span an image's
    flattened positions instead of one row. ``roll``: channels-last rows walked by
    dw_roll.py's kernel, ``roll`` output rows per program, ``block_a`` columns by
    ``block_b`` channels (0: this module's tiles)."""
    block_a: int
    block_b: int
    num_warps: int
    pairs: bool = False
    plane: bool = False
    roll: int = 0

    def name(self) -> str:
        return (f"dw{self.block_a}x{self.block_b}w{self.num_warps}"
                f"{'p' if self.pairs else ''}{'q' if self.plane else ''}"
                f"{f'r{self.roll}' if self.roll else ''}")


_CL = [(64, 64, 4), (128, 32, 4), (32, 128, 4), (16, 128, 4), (256, 16, 4)]
_ROWS = [(4, 256, 4), (8, 128, 4), (2, 512, 4), (16, 64, 4), (1, 1024, 4)]
_PAIRS = [(8, 128, 4), (2, 256, 4), (4, 128, 4), (8, 64, 4), (16, 64, 8)]
_PLANE = [(16, 64, 4), (8, 128, 4), (32, 64, 8), (16, 128, 8)]
# (columns, channels, warps, rows per program): the best of 18 tiles on seven
# depthwise_models layers (H100 sweep; git 0c96fb4:benchmarks/sweep_dw_roll.py), most wins
# first
_ROLL = [(16, 32, 4, 16), (16, 32, 2, 32), (32, 32, 8, 8), (8, 64, 4, 8), (32, 16, 4, 8),
         (16, 32, 2, 8)]
_ROLL_CPU = [(4, 8, 4, 3)]
# dw_wgrad.py's tiles (columns, channels, warps, rows per program): the best of 20 on the 32
# depthwise_models layers (H100, benchmarks/sweep_dw_roll.py --ops wgrad --grid), most wins first
_ROLL_WGRAD = [(16, 16, 4, 64), (8, 32, 4, 64), (8, 16, 2, 64), (16, 8, 4, 64), (4, 32, 2, 64),
               (4, 64, 4, 64)]


def candidates(channels_last: bool, on_gpu: bool, *, pairs: bool = False,
               plane: bool = False, narrow: bool = False,
               roll: bool = False, wgrad: bool = False) -> list[DwConfig]:
    """Tiles for the layout, the heuristic's pick first. Channels-first, optionally:
    ``pairs`` tiles (a 16-bit forward that dw_pairs.py can run; first, as they won every
    causal conv1d layer they were timed on) and ``plane`` tiles (rank 2; first for
    ``narrow`` outputs, under 64 columns, where a row tile idles most of its lanes).
    Channels-last, optionally: ``roll`` tiles (first): dw_roll.py's walk down the rows, or
    dw_wgrad.py's for the weight gradient (``wgrad``)."""
    tiles = _ROLL_CPU if not on_gpu else _ROLL_WGRAD if wgrad else _ROLL
    rolled = [DwConfig(*t, roll=rows) for *t, rows in tiles] if roll and channels_last else []
    if not on_gpu:
        if channels_last:
            return rolled + [DwConfig(8, 16, 4)]
        return ([DwConfig(4, 16, 4)] + ([DwConfig(4, 16, 4, plane=True)] if plane else [])
                + ([DwConfig(4, 8, 4, pairs=True)] if pairs else []))
    if channels_last:
        return rolled + [DwConfig(*t) for t in _CL]
    rows = [DwConfig(*t) for t in _ROWS]
    planes = [DwConfig(*t, plane=True) for t in _PLANE] if plane else []
    tiles = planes + rows if narrow else rows + planes
    return ([DwConfig(*t, pairs=True) for t in _PAIRS] if pairs else []) + tiles


@triton.jit
def _positions_by_channels(pid0, pid1, N, K, P, Q, BLOCK_A: tl.constexpr,
                           BLOCK_B: tl.constexpr):
    """Channels-last tile: (n, k, p, q, mask) broadcastable to [BLOCK_A, BLOCK_B]."""
    m = pid0 * BLOCK_A + tl.arange(0, BLOCK_A)
    k = (pid1 * BLOCK_B + tl.arange(0, BLOCK_B))[None, :]
    n = m // (P * Q)
    pq = m - n * (P * Q)
    p = pq // Q
    q = pq - p * Q
    mask = (m < N * P * Q)[:, None] & (k < K)
    return n[:, None], k, p[:, None], q[:, None], mask


@triton.jit
def channels_by_columns(pid0, pid1, K, P, Q, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr):
    """Channels-first tile of one output row: (n, k, p, q, mask), n and p scalars."""
    q_blocks = tl.cdiv(Q, BLOCK_B)
    row = pid0 // q_blocks
    n = row // P
    p = row - n * P
    q = ((pid0 - row * q_blocks) * BLOCK_B + tl.arange(0, BLOCK_B))[None, :]
    k = (pid1 * BLOCK_A + tl.arange(0, BLOCK_A))[:, None]
    return n, k, p, q, (k < K) & (q < Q)


@triton.jit
def _channels_by_plane(pid0, pid1, K, P, Q, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr):
    """Channels-first tile of ``BLOCK_B`` flattened positions of image n: (n, k, p, q, mask),
    n scalar."""
    blocks = tl.cdiv(P * Q, BLOCK_B)
    n = pid0 // blocks
    pq = ((pid0 - n * blocks) * BLOCK_B + tl.arange(0, BLOCK_B))[None, :]
    p = pq // Q
    k = (pid1 * BLOCK_A + tl.arange(0, BLOCK_A))[:, None]
    return n, k, p, pq - p * Q, (k < K) & (pq < P * Q)


@triton.jit
def and_row(mask, row_ok):
    """``mask & row_ok`` where ``row_ok`` may be a scalar (channels-first tiles hold one row).
    A select, not ``&``: Triton 3.9's interpreter broadcasts a scalar boolean as int32, and a
    load refuses an integer mask; compiled, both forms are one predicate ``and``."""
    return tl.where(row_ok, mask, False)


@triton.jit
def any_nonfinite(w_ptr, base, s_outer, swr, sws, wmask, OUTER, R: tl.constexpr,
                   S: tl.constexpr, ACC: tl.constexpr, UNROLL_ROWS: tl.constexpr = True):
    """Whether any of the weights ``w_ptr[base + o·s_outer + r·swr + s·sws]`` (o < OUTER,
    where ``wmask``) is ±inf or NaN (``v·0`` is NaN exactly there): a scalar. A pass over
    the tile's weight vectors only (cached; R·S·OUTER small loads), before the main loop.
    ``UNROLL_ROWS``: the kernel rows unrolled too (see ``UNROLLED_TAPS``)."""
    bad = wmask & False
    for o in range(OUTER):
        if UNROLL_ROWS:
            for r in tl.static_range(R):
                bad = _nonfinite_row(bad, w_ptr, base + o * s_outer + r * swr, sws, wmask, S,
                                     ACC)
        else:
            for r in range(R):
                bad = _nonfinite_row(bad, w_ptr, base + o * s_outer + r * swr, sws, wmask, S,
                                     ACC)
    return tl.max(bad.to(tl.int32)) > 0


@triton.jit
def _nonfinite_row(bad, w_ptr, base, sws, wmask, S: tl.constexpr, ACC: tl.constexpr):
    for s in tl.static_range(S):
        v = tl.load(w_ptr + base + s * sws, mask=wmask, other=0.0)
        bad = bad | (v.to(ACC) * 0.0 != 0.0)
    return bad


@triton.jit
def tap(acc, v, wv, ok, SKIP_PADDED: tl.constexpr):
    """``acc + v·wv``, or (``SKIP_PADDED``) that only where ``ok``: one FMA, or a select."""
    if SKIP_PADDED:
        return tl.where(ok, acc + v * wv, acc)
    return acc + v * wv


@triton.jit
def _fprop_taps(x_base, w_ptr, k, kmask, mask, ih0, iw0, H, W, dil_h, dil_w,
                sxc, sxh, sxw, swk, swc, swr, sws,
                CG: tl.constexpr, R: tl.constexpr, S: tl.constexpr, ACC: tl.constexpr,
                SKIP_PADDED: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,
                UNROLL_ROWS: tl.constexpr):
    """The forward's sum over taps. A padded tap multiplies the zero padding by the weight:
    exact for finite weights, so the fast loop (``SKIP_PADDED`` off) is one FMA per tap and
    element; the kernel runs the loop with ``SKIP_PADDED`` (a select per tap, 1.3-1.5x
    slower on an H100) only when one of its weights is non-finite, so that padded taps add
    nothing, as in torch's native depthwise kernels, never 0·inf = NaN. The kernel's
    columns are unrolled, its rows too where ``UNROLL_ROWS`` (see ``UNROLLED_TAPS``)."""
    acc = tl.zeros([BLOCK_A, BLOCK_B], ACC)
    for c in range(CG):
        if UNROLL_ROWS:
            for r in tl.static_range(R):
                acc = _fprop_row(acc, x_base, w_ptr, k, kmask, mask, c, r, ih0, iw0, H, W,
                                 dil_h, dil_w, sxc, sxh, sxw, swk, swc, swr, sws, S, ACC,
                                 SKIP_PADDED)
        else:
            for r in range(R):
                acc = _fprop_row(acc, x_base, w_ptr, k, kmask, mask, c, r, ih0, iw0, H, W,
                                 dil_h, dil_w, sxc, sxh, sxw, swk, swc, swr, sws, S, ACC,
                                 SKIP_PADDED)
    return acc


@triton.jit
def _fprop_row(acc, x_base, w_ptr, k, kmask, mask, c, r, ih0, iw0, H, W, dil_h, dil_w,
               sxc, sxh, sxw, swk, swc, swr, sws, S: tl.constexpr, ACC: tl.constexpr,
               SKIP_PADDED: tl.constexpr):
    """One kernel row's taps of :func:`_fprop_taps`."""
    ih = ih0 + r * dil_h
    row_ok = (ih >= 0) & (ih < H)
    for s in tl.static_range(S):
        iw = iw0 + s * dil_w
        ok = and_row(mask & (iw >= 0) & (iw < W), row_ok)
        xv = tl.load(x_base + c * sxc + ih * sxh + iw * sxw, mask=ok, other=0.0)
        wv = tl.load(w_ptr + k * swk + c * swc + r * swr + s * sws, mask=kmask, other=0.0)
        acc = tap(acc, xv.to(ACC), wv.to(ACC), ok, SKIP_PADDED)
    return acc


@triton.jit
def _dw_fprop_kernel(
    x_ptr, w_ptr, out_ptr, scale_ptr, shift_ptr, res_ptr,
    N, H, W, K, P, Q, KG,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    sxn, sxc, sxh, sxw, swk, swc, swr, sws, son, sok, sop, soq, srn, srk, srp, srq,
    negative_slope,
    CG: tl.constexpr, R: tl.constexpr, S: tl.constexpr, HAS_SCALE: tl.constexpr,
    HAS_SHIFT: tl.constexpr,
    HAS_RES: tl.constexpr, ACT: tl.constexpr, ACC: tl.constexpr, INT64: tl.constexpr,
    CL: tl.constexpr, PLANE: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,
    UNROLL_ROWS: tl.constexpr,
):
    if CL:  # a compile-time branch: only one helper is compiled
        n, k, p, q, mask = _positions_by_channels(tl.program_id(0), tl.program_id(1), N, K, P,
                                                  Q, BLOCK_A, BLOCK_B)
    elif PLANE:
        n, k, p, q, mask = _channels_by_plane(tl.program_id(0), tl.program_id(1), K, P, Q,
                                              BLOCK_A, BLOCK_B)
    else:
        n, k, p, q, mask = channels_by_columns(tl.program_id(0), tl.program_id(1), K, P, Q,
                                                BLOCK_A, BLOCK_B)
    if INT64:
        n = n.to(tl.int64)
    kmask = k < K
    ih0 = p * stride_h - pad_h
    iw0 = q * stride_w - pad_w
    # output channel k reads input channels (k // KG)·CG + c, c < CG (CG = 1: depthwise)
    x_base = x_ptr + n * sxn + ((k // KG) * CG) * sxc
    if any_nonfinite(w_ptr, k * swk, swc, swr, sws, kmask, CG, R, S, ACC, UNROLL_ROWS):
        acc = _fprop_taps(x_base, w_ptr, k, kmask, mask, ih0, iw0, H, W, dil_h, dil_w,
                          sxc, sxh, sxw, swk, swc, swr, sws, CG, R, S, ACC, True,
                          BLOCK_A, BLOCK_B, UNROLL_ROWS)
    else:
        acc = _fprop_taps(x_base, w_ptr, k, kmask, mask, ih0, iw0, H, W, dil_h, dil_w,
                          sxc, sxh, sxw, swk, swc, swr, sws, CG, R, S, ACC, False,
                          BLOCK_A, BLOCK_B, UNROLL_ROWS)
    finish(acc, out_ptr, scale_ptr, shift_ptr, res_ptr, n, k, kmask, p, q, mask,
            son, sok, sop, soq, srn, srk, srp, srq, negative_slope, HAS_SCALE, HAS_SHIFT,
            HAS_RES, ACT, ACC)


@triton.jit
def finish(acc, out_ptr, scale_ptr, shift_ptr, res_ptr, n, k, kmask, p, q, mask,
            son, sok, sop, soq, srn, srk, srp, srq, negative_slope,
            HAS_SCALE: tl.constexpr, HAS_SHIFT: tl.constexpr, HAS_RES: tl.constexpr,
            ACT: tl.constexpr, ACC: tl.constexpr):
    """The forward's epilogue (scale, shift, residual, activation) and store of a tile."""
    if HAS_SCALE:
        acc = acc * tl.load(scale_ptr + k, mask=kmask, other=0.0).to(ACC)
    if HAS_SHIFT:
        acc = acc + tl.load(shift_ptr + k, mask=kmask, other=0.0).to(ACC)
    if HAS_RES:
        acc = acc + tl.load(res_ptr + n * srn + k * srk + p * srp + q * srq, mask=mask,
                            other=0.0).to(ACC)
    acc = activation(acc, ACT, negative_slope)
    tl.store(out_ptr + n * son + k * sok + p * sop + q * soq,
             acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _dgrad_taps(dy_ptr, w_ptr, n, c, h, w, mask, C, P, Q, KG, CG, stride_h, stride_w, pad_h,
                pad_w, dil_h, dil_w, sdn, sdk, sdp, sdq, swk, swc, swr, sws,
                R: tl.constexpr, S: tl.constexpr, ACC: tl.constexpr,
                SKIP_PADDED: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,
                UNROLL_ROWS: tl.constexpr):
    """dgrad's sum over taps, as :func:`_fprop_taps` (rows unrolled where ``UNROLL_ROWS``)."""
    acc = tl.zeros([BLOCK_A, BLOCK_B], ACC)
    # input channel c feeds output channels (c // CG)·KG + j, j < KG, through w[k, c % CG]
    grp = c // CG
    c_in = c - grp * CG
    for j in range(0, KG):
        k = grp * KG + j
        dy_base = dy_ptr + n * sdn + k * sdk
        if UNROLL_ROWS:
            for r in tl.static_range(R):
                acc = _dgrad_row(acc, dy_base, w_ptr, k, c, c_in, h, w, mask, C, P, Q, r,
                                 stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, sdp, sdq, swk,
                                 swc, swr, sws, S, ACC, SKIP_PADDED)
        else:
            for r in range(R):
                acc = _dgrad_row(acc, dy_base, w_ptr, k, c, c_in, h, w, mask, C, P, Q, r,
                                 stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, sdp, sdq, swk,
                                 swc, swr, sws, S, ACC, SKIP_PADDED)
    return acc


@triton.jit
def _dgrad_row(acc, dy_base, w_ptr, k, c, c_in, h, w, mask, C, P, Q, r, stride_h, stride_w,
               pad_h, pad_w, dil_h, dil_w, sdp, sdq, swk, swc, swr, sws, S: tl.constexpr,
               ACC: tl.constexpr, SKIP_PADDED: tl.constexpr):
    """One kernel row's taps of :func:`_dgrad_taps`."""
    hp = h + pad_h - r * dil_h
    p = hp // stride_h
    row_ok = (hp >= 0) & (hp - p * stride_h == 0) & (p < P)
    for s in tl.static_range(S):
        wq = w + pad_w - s * dil_w
        q = wq // stride_w
        ok = and_row(mask & (wq >= 0) & (wq - q * stride_w == 0) & (q < Q), row_ok)
        g = tl.load(dy_base + p * sdp + q * sdq, mask=ok, other=0.0)
        wv = tl.load(w_ptr + k * swk + c_in * swc + r * swr + s * sws, mask=c < C, other=0.0)
        acc = tap(acc, g.to(ACC), wv.to(ACC), ok, SKIP_PADDED)
    return acc


@triton.jit
def _dw_dgrad_kernel(
    dy_ptr, w_ptr, dx_ptr,
    N, C, H, W, P, Q, KG, CG,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    sdn, sdk, sdp, sdq, swk, swc, swr, sws, sxn, sxc, sxh, sxw,
    R: tl.constexpr, S: tl.constexpr, ACC: tl.constexpr, INT64: tl.constexpr,
    CL: tl.constexpr, PLANE: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,
    UNROLL_ROWS: tl.constexpr,
):
    # positions are the input's (n, h, w), channels its c: the tile's (n, c, h, w)
    if CL:
        n, c, h, w, mask = _positions_by_channels(tl.program_id(0), tl.program_id(1), N, C, H,
                                                  W, BLOCK_A, BLOCK_B)
    elif PLANE:
        n, c, h, w, mask = _channels_by_plane(tl.program_id(0), tl.program_id(1), C, H, W,
                                              BLOCK_A, BLOCK_B)
    else:
        n, c, h, w, mask = channels_by_columns(tl.program_id(0), tl.program_id(1), C, H, W,
                                                BLOCK_A, BLOCK_B)
    if INT64:
        n = n.to(tl.int64)
    # the weights this tile reads: w[k, c % CG] for its channels' KG output channels
    if any_nonfinite(w_ptr, ((c // CG) * KG) * swk + (c % CG) * swc, swk, swr, sws, c < C,
                      KG, R, S, ACC, UNROLL_ROWS):
        acc = _dgrad_taps(dy_ptr, w_ptr, n, c, h, w, mask, C, P, Q, KG, CG, stride_h,
                          stride_w, pad_h, pad_w, dil_h, dil_w, sdn, sdk, sdp, sdq, swk, swc,
                          swr, sws, R, S, ACC, True, BLOCK_A, BLOCK_B, UNROLL_ROWS)
    else:
        acc = _dgrad_taps(dy_ptr, w_ptr, n, c, h, w, mask, C, P, Q, KG, CG, stride_h,
                          stride_w, pad_h, pad_w, dil_h, dil_w, sdn, sdk, sdp, sdq, swk, swc,
                          swr, sws, R, S, ACC, False, BLOCK_A, BLOCK_B, UNROLL_ROWS)
    tl.store(dx_ptr + n * sxn + c * sxc + h * sxh + w * sxw, acc.to(dx_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def _dw_wgrad_kernel(
    dy_ptr, x_ptr, part_ptr,
    N, H, W, K, P, Q, KG, CG, C_OFF, M_PER,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    sdn, sdk, sdp, sdq, sxn, sxc, sxh, sxw,
    R: tl.constexpr, S: tl.constexpr, TAPS: tl.constexpr, ACC: tl.constexpr,
    INT64: tl.constexpr, CL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    ROWS: tl.constexpr,
):
    # one program: channels k-block, positions [split·M_PER, (split+1)·M_PER) of N·P·Q, and
    # every tap (TAPS >= R·S accumulator rows) or (ROWS) kernel row program_id(2)'s S taps
    split = tl.program_id(0)
    row = tl.program_id(2)
    k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    kmask = k < K
    taps = tl.arange(0, TAPS)
    acc = tl.zeros([TAPS, BLOCK_K], ACC)
    for m0 in range(split * M_PER, tl.minimum((split + 1) * M_PER, N * P * Q), BLOCK_M):
        m = m0 + tl.arange(0, BLOCK_M)
        n = m // (P * Q)
        pq = m - n * (P * Q)
        p = pq // Q
        q = pq - p * Q
        if INT64:
            n = n.to(tl.int64)
        mmask = (m < N * P * Q) & (m < (split + 1) * M_PER)
        if CL:  # [positions, channels]
            mk = mmask[:, None] & kmask[None, :]
            g = tl.load(dy_ptr + (n * sdn + p * sdp + q * sdq)[:, None] + (k * sdk)[None, :],
                        mask=mk, other=0.0).to(ACC)
            x_base = x_ptr + (n * sxn)[:, None] + ((k // KG * CG + C_OFF) * sxc)[None, :]
            ih0 = (p * stride_h - pad_h)[:, None]
            iw0 = (q * stride_w - pad_w)[:, None]
        else:  # [channels, positions]
            mk = kmask[:, None] & mmask[None, :]
            g = tl.load(dy_ptr + (k * sdk)[:, None] + (n * sdn + p * sdp + q * sdq)[None, :],
                        mask=mk, other=0.0).to(ACC)
            x_base = x_ptr + ((k // KG * CG + C_OFF) * sxc)[:, None] + (n * sxn)[None, :]
            ih0 = (p * stride_h - pad_h)[None, :]
            iw0 = (q * stride_w - pad_w)[None, :]
        if ROWS:
            acc = _wgrad_row(acc, g, x_base, ih0 + row * dil_h, iw0, mk, taps, 0, dil_w, H, W,
                             sxh, sxw, S, ACC, CL)
        else:
            for r in tl.static_range(R):
                acc = _wgrad_row(acc, g, x_base, ih0 + r * dil_h, iw0, mk, taps, r * S, dil_w,
                                 H, W, sxh, sxw, S, ACC, CL)
    tl.store(part_ptr + ((split * tl.num_programs(2) + row) * TAPS + taps)[:, None] * K
             + k[None, :], acc, mask=(taps < (S if ROWS else R * S))[:, None] & kmask[None, :])


@triton.jit
def _wgrad_row(acc, g, x_base, ih, iw0, mk, taps, t0, dil_w, H, W, sxh, sxw,
               S: tl.constexpr, ACC: tl.constexpr, CL: tl.constexpr):
    """``acc`` plus one kernel row's S taps of ``Σ dy·x`` over the tile's positions (into
    accumulator rows ``t0 + s``); ``ih``, ``iw0`` broadcast along the positions' axis."""
    for s in tl.static_range(S):
        iw = iw0 + s * dil_w
        ok = mk & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        xv = tl.load(x_base + ih * sxh + iw * sxw, mask=ok, other=0.0).to(ACC)
        part = tl.sum(g * xv, axis=0 if CL else 1)
        acc += tl.where((taps == t0 + s)[:, None], part[None, :], 0.0)
    return acc



def plain_strides(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.stride())


def _grid(channels_last: bool, n: int, k: int, p: int, q: int, config: DwConfig):
    if channels_last:
        return cdiv(n * p * q, config.block_a), cdiv(k, config.block_b)
    if config.plane:
        return n * cdiv(p * q, config.block_b), cdiv(k, config.block_a)
    return n * p * cdiv(q, config.block_b), cdiv(k, config.block_a)


def launch_fprop(x4, w4, out4, epi: EpilogueArgs, geo: Geometry, *, channels_last: bool,
                 config: DwConfig, int64: bool) -> Prepared | None:
    """Depthwise forward on 4-D (N, C, H, W)-indexed views (any strides); also any grouped
    convolution (``w4`` of shape (K, C/groups, R, S)): each output element reduces its
    group's C/groups input channels over the window, on CUDA cores (no tensor-core tile is
    wasted on 4-32 channels per group; benchmarks/NOTES.md). Returns the launch
    prepared for its six tensors (``x4, w4, out4`` and scale, shift, residual, ``out4``
    where absent), see ``launch.prepare``."""
    scale, shift, res4, act_code, negative_slope = epi
    stride, pad, dilation, _ = geo
    n, c, h, w = x4.shape
    k, cg, r, s = w4.shape
    _, _, p, q = out4.shape
    dummy = out4  # never read: the matching HAS_* flag is False
    res_strides = plain_strides(res4) if res4 is not None else (0, 0, 0, 0)
    return prepare(_dw_fprop_kernel, _grid(channels_last, n, k, p, q, config), 6,
        x4, w4, out4, scale if scale is not None else dummy,
        shift if shift is not None else dummy, res4 if res4 is not None else dummy,
        n, h, w, k, p, q, k // (c // cg), stride[0], stride[1], pad[0], pad[1], dilation[0],
        dilation[1], *plain_strides(x4), *plain_strides(w4), *plain_strides(out4), *res_strides,
        float(negative_slope), CG=cg, R=r, S=s, HAS_SCALE=scale is not None,
        HAS_SHIFT=shift is not None,
        HAS_RES=res4 is not None, ACT=act_code, ACC=acc_type(x4.dtype), INT64=int64,
        CL=channels_last, PLANE=config.plane and not channels_last, BLOCK_A=config.block_a,
        BLOCK_B=config.block_b, UNROLL_ROWS=r * s <= UNROLLED_TAPS, num_warps=config.num_warps)


#: Kernels of at most this many taps run their forward's tap loop fully unrolled; larger
#: ones (7x7 and up) loop over kernel rows at run time, unrolling only the columns: a
#: fully unrolled 7x7 bf16 forward took ~30 s to compile on the H100 machine (Triton 3.6:
#: make_ttgir and make_llir), which a first call would wait for.
UNROLLED_TAPS = 25
#: The same bound for the data and weight gradients and dw_pairs.py's forward: past it (9x9
#: and up) the data gradient and the pairs forward loop over kernel rows at run time and
#: the weight gradient gives each kernel row its own programs (S accumulator rows, not
#: R·S). Fully unrolled, a 13x13 layer's gradients and 16-bit pairs forward held GPU test
#: processes for over four minutes, and the weight gradient's select-adds grew
#: with (R·S)². Up to 7x7 these stay as measured and tuned.
ROW_LOOP_PAST = 49


def launch_dgrad(dy4, w4, dx4, geo: Geometry, *, channels_last: bool, config: DwConfig,
                 int64: bool) -> Prepared | None:
    """``dx`` of a depthwise (or grouped: ``w4`` (K, C/groups, R, S)) convolution, written
    into the 4-D view ``dx4``. Returns the launch for later calls of the same plan (called
    with ``dy4, w4, dx4`` of the same shapes and strides), or None (the interpreter)."""
    stride, pad, dilation, _ = geo
    n, c, h, w = dx4.shape
    k, cg, r, s = w4.shape
    _, _, p, q = dy4.shape
    return prepare(_dw_dgrad_kernel, _grid(channels_last, n, c, h, w, config), 3,
        dy4, w4, dx4, n, c, h, w, p, q, k // (c // cg), cg, stride[0], stride[1], pad[0],
        pad[1], dilation[0], dilation[1], *plain_strides(dy4), *plain_strides(w4),
        *plain_strides(dx4),
        R=r, S=s, ACC=acc_type(dy4.dtype), INT64=int64, CL=channels_last,
        PLANE=config.plane and not channels_last, BLOCK_A=config.block_a,
        BLOCK_B=config.block_b, UNROLL_ROWS=r * s <= ROW_LOOP_PAST,
        num_warps=config.num_warps)


def launch_wgrad(dy4, x4, dw4, geo: Geometry, *, channels_last: bool, config: DwConfig,
                 int64: bool):
    """``dw`` of a depthwise convolution (shape (K, 1, R, S)), written into ``dw4``; of a
    grouped one (K, C/groups, R, S) one input channel of each group per pass. Returns the
    same run for later calls of the plan (``run(dy4, x4, dw4)``, operands of the same
    shapes and strides; its launches prepared: ``launch.Fixed``)."""
    stride, pad, dilation, _ = geo
    n, c, h, w = x4.shape
    k, cg, r, s = dw4.shape
    _, _, p, q = dy4.shape
    m = n * p * q
    block_m, block_k = ((config.block_a, config.block_b) if channels_last
                        else (config.block_b, config.block_a))
    block_m = min(block_m, 256)
    rows = r if r * s > ROW_LOOP_PAST else 1  # programs per kernel row
    if INTERPRETED or not dy4.is_cuda:
        splits = cdiv(m, block_m)
    else:
        sms = torch.cuda.get_device_properties(dy4.device).multi_processor_count
        splits = max(1, min(cdiv(m, block_m), 4 * sms // (cdiv(k, block_k) * rows)))
    m_per = cdiv(cdiv(m, splits), block_m) * block_m
    splits = cdiv(m, m_per)
    per = r * s // rows  # taps per program
    taps = triton.next_power_of_2(per)
    acc = torch.float64 if dy4.dtype == torch.float64 else torch.float32
    part_shape = (splits, rows, taps, k)
    meta = dict(R=r, S=s, TAPS=taps, ACC=acc_type(dy4.dtype), INT64=int64, CL=channels_last,
                BLOCK_M=block_m, BLOCK_K=block_k, ROWS=rows > 1, num_warps=config.num_warps)
    passes = [Fixed(_dw_wgrad_kernel, (splits, cdiv(k, block_k), rows),
                    (n, h, w, k, p, q, k // (c // cg), cg, c_off, m_per, stride[0], stride[1],
                     pad[0], pad[1], dilation[0], dilation[1], *plain_strides(dy4),
                     *plain_strides(x4)), meta) for c_off in range(cg)]

    def run(dy4, x4, dw4) -> bool:
        part = torch.empty(part_shape, device=dy4.device, dtype=acc)
        for c_off, one in enumerate(passes):
            one(dy4, x4, part)
            # (R·S, K): one fixed-order sum over the splits
            total = part.sum(0)[:, :per].reshape(r * s, k)
            dw4[:, c_off].copy_(total.t().reshape(k, r, s))
        return True
    run(dy4, x4, dw4)
    return run
