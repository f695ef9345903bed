"""Depthwise weight gradient for channels-last tensors: rolling ``dy`` rows down the image,
one accumulator per tap, no reduction until the end.

``dw[k, r, s] = Σ_{n,p,q} dy[n, p, q, k] · x[n, p·σ − π + r, q·σ_w − π_w + s·δ_w, k/KG]``.
depthwise.py's wgrad loads every tap's shifted window for a block of positions and reduces
it across the block at once: ``R·S`` loads and ``R·S`` cross-thread sums (and a select
into the ``[taps × channels]`` accumulator) per block, the cost of a 7x7 layer being the
sums and selects, not the multiply-adds.

Here a program owns a ``[BLOCK_Q columns × BLOCK_C channels]`` strip of ``ROWS``
consecutive output rows, in each of ``IMGS`` images one after another (the forward walk of
dw_roll.py, transposed). It keeps the ``NA = ⌈R/σ⌉`` most recent ``dy`` rows (``d0``
oldest … ``d6``) as tiles, and one accumulator tile per tap, ``R·S`` of them carried as one
tuple. Each step takes the newest ``dy`` row and the ``σ`` input rows it meets first, each
as ``S`` column-shifted tiles (from L1), all loaded one step ahead (so that the loads'
latency overlaps the multiply-adds), and adds every shifted tile's product with each pending
``dy`` row it meets into that tap: ``acc[r, s] += X_s · d_i`` with ``r = (NA − 1 − i)·σ + u``.
Per ``dy`` element: one load, ``σ·S`` input loads, ``R·S`` multiply-adds, no reduction.
At the end each accumulator is summed over its columns into ``part[program, r, s, k]``
(fp32), and a second kernel sums the programs' partials in a fixed order into ``dw``
(deterministic: no atomics); ``IMGS`` keeps their number near four programs per
multiprocessor. (A first form held the ``S`` column taps as a third tile dimension, one
accumulator per kernel row: each ``dy`` row was then repeated ``next_pow2(S)`` times in
registers, and it ran at half this one's speed on the 7x7 layers; benchmarks/NOTES.md.)

Requirements (``eligible``): channels-last (NHWC / NLC), depthwise (one input channel per
group; any channel multiplier), unit row dilation, row stride 1 or 2, ``R ≤ 7``, ``S ≤ 8``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import acc_type
from .depthwise import and_row, plain_strides
from .launch import INTERPRETED, Fixed, cdiv
from .launchargs import Geometry

__all__ = ["eligible", "launch_wgrad"]

#: Kernel rows (``d0 … d6``: pending dy rows) and columns (``R·S`` accumulators) it takes.
MAX_R, MAX_S = 7, 8


def eligible(*, channels_last: bool, c_per_group: int, kernel: tuple, stride: tuple,
             dilation: tuple) -> bool:
    """Whether the weight gradient can run here (4-D terms: rank 1 is H = 1)."""
    return (channels_last and c_per_group == 1 and dilation[0] == 1 and stride[0] <= 2
            and kernel[0] <= MAX_R and kernel[1] <= MAX_S)


@triton.jit
def _pick(d0, d1, d2, d3, d4, d5, d6, i: tl.constexpr):
    """``d{i}`` (``i`` known at compile time)."""
    if i == 0:
        v = d0
    elif i == 1:
        v = d1
    elif i == 2:
        v = d2
    elif i == 3:
        v = d3
    elif i == 4:
        v = d4
    elif i == 5:
        v = d5
    else:
        v = d6
    return v


@triton.jit
def _input_rows(x_base, pn, H, W, pad_h, dil_w, sxh, sxw, iw0, dmask, S: tl.constexpr,
                SH: tl.constexpr):
    """The ``SH`` input rows that dy row ``pn`` meets first (``pn·SH − π + u``), each as ``S``
    column-shifted tiles (zero outside the image): a tuple of ``SH·S`` tiles as stored."""
    xs = ()
    for u in tl.static_range(SH):
        ih = pn * SH - pad_h + u
        row_ok = (ih >= 0) & (ih < H)
        for s in tl.static_range(S):
            iw = iw0 + s * dil_w
            xs = xs + (tl.load(x_base + ih * sxh + s * dil_w * sxw,
                               mask=and_row(dmask & (iw >= 0) & (iw < W), row_ok),
                               other=0.0),)
    return xs


@triton.jit
def _upd(acc, j: tl.constexpr, v):
    """The tuple ``acc`` with ``v`` added to its element ``j``."""
    return acc[:j] + (acc[j] + v,) + acc[j + 1:]


@triton.jit
def _dw_wgrad_kernel(
    dy_ptr, x_ptr, part_ptr,
    N, H, W, K, P, Q, KG, ROWS, IMGS,
    stride_w, pad_h, pad_w, dil_w,
    sdn, sdk, sdp, sdq, sxn, sxc, sxh, sxw,
    R: tl.constexpr, S: tl.constexpr, SH: tl.constexpr, NA: tl.constexpr,
    ACC: tl.constexpr, INT64: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # program (IMGS images, row block, column block) x channel block
    pid = tl.program_id(0)
    q_blocks = tl.cdiv(Q, BLOCK_Q)
    row_blocks = tl.cdiv(P, ROWS)
    qb = pid % q_blocks
    rest = pid // q_blocks
    pb = rest % row_blocks
    n0 = (rest // row_blocks) * IMGS
    q = (qb * BLOCK_Q + tl.arange(0, BLOCK_Q))[:, None]
    k1 = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    k = k1[None, :]
    dmask = (q < Q) & (k < K)
    iw0 = q * stride_w - pad_w
    x_off = (k // KG) * sxc + iw0 * sxw
    d_off = k * sdk + q * sdq
    p0 = pb * ROWS
    p_end = tl.minimum(p0 + ROWS, P)
    acc = (tl.zeros([BLOCK_Q, BLOCK_C], ACC),) * (R * S)  # carried as one tuple
    for n in range(n0, tl.minimum(n0 + IMGS, N)):
        if INT64:
            n = n.to(tl.int64)
        x_base = x_ptr + n * sxn + x_off
        d_base = dy_ptr + n * sdn + d_off
        d0 = tl.zeros([BLOCK_Q, BLOCK_C], ACC)
        d1 = tl.zeros([BLOCK_Q, BLOCK_C], ACC)
        d2 = tl.zeros([BLOCK_Q, BLOCK_C], ACC)
        d3 = tl.zeros([BLOCK_Q, BLOCK_C], ACC)
        d4 = tl.zeros([BLOCK_Q, BLOCK_C], ACC)
        d5 = tl.zeros([BLOCK_Q, BLOCK_C], ACC)
        d6 = tl.zeros([BLOCK_Q, BLOCK_C], ACC)
        dn_next = tl.load(d_base + p0 * sdp, mask=and_row(dmask, p0 < p_end), other=0.0)
        xs_next = _input_rows(x_base, p0, H, W, pad_h, dil_w, sxh, sxw, iw0, dmask, S, SH)
        for t in range(1 - NA, p_end - p0):
            pn = p0 + t + NA - 1
            dn = dn_next.to(ACC)
            xs = xs_next
            dn_next = tl.load(d_base + (pn + 1) * sdp, mask=and_row(dmask, pn + 1 < p_end),
                              other=0.0)
            xs_next = _input_rows(x_base, pn + 1, H, W, pad_h, dil_w, sxh, sxw, iw0, dmask, S,
                                  SH)
            if NA == 1:
                d0 = dn
            elif NA == 2:
                d1 = dn
            elif NA == 3:
                d2 = dn
            elif NA == 4:
                d3 = dn
            elif NA == 5:
                d4 = dn
            elif NA == 6:
                d5 = dn
            else:
                d6 = dn
            for u in tl.static_range(SH):
                for s in tl.static_range(S):
                    xv = xs[u * S + s].to(ACC)
                    for i in tl.static_range(NA):
                        if (NA - 1 - i) * SH + u < R:
                            acc = _upd(acc, ((NA - 1 - i) * SH + u) * S + s,
                                       xv * _pick(d0, d1, d2, d3, d4, d5, d6, i))
            d0 = d1
            d1 = d2
            d2 = d3
            d3 = d4
            d4 = d5
            d5 = d6
    base = part_ptr + pid.to(tl.int64) * (R * S * K) + k1
    for j in tl.static_range(R * S):
        tl.store(base + j * K, tl.sum(acc[j], axis=0), mask=k1 < K)


@triton.jit
def _sum_parts_kernel(part_ptr, dw_ptr, PARTS, K, swk, swr, sws,
                      R: tl.constexpr, S: tl.constexpr, ACC: tl.constexpr,
                      BLOCK_J: tl.constexpr, BLOCK: tl.constexpr):
    # dw[k, 0, r, s] = Σ_j part[j, r, s, k]: BLOCK_J partials loaded at once (independent
    # loads in flight), summed by a fixed tree, chunks in order
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # (r, s, k) flattened, k fastest
    mask = e < R * S * K
    j = tl.arange(0, BLOCK_J)[:, None]
    acc = tl.zeros([BLOCK], ACC)
    for j0 in range(0, PARTS, BLOCK_J):
        tile = tl.load(part_ptr + (j0 + j).to(tl.int64) * (R * S * K) + e[None, :],
                       mask=(j0 + j < PARTS) & mask[None, :], other=0.0)
        acc += tl.sum(tile, axis=0)
    k = e % K
    rs = e // K
    r = rs // S
    s = rs - r * S
    tl.store(dw_ptr + k * swk + r * swr + s * sws, acc.to(dw_ptr.dtype.element_ty), mask=mask)


def launch_wgrad(dy4, x4, dw4, geo: Geometry, *, config, int64: bool,
                 images: int | None = None):
    """``dw`` (K, 1, R, S) of a depthwise convolution (``eligible``) on 4-D (N, C, H, W)-
    indexed channels-last views, written into ``dw4`` (any strides). ``config``: a
    ``DwConfig`` with ``roll`` rows per program, ``block_a`` columns, ``block_b`` channels.
    ``images``: per program (fewer partials to sum); by default as many as leave about four
    programs per multiprocessor. Returns the same run for later calls of the plan
    (``run(dy4, x4, dw4)``, operands of the same shapes and strides; its two launches
    prepared: ``launch.Fixed``)."""
    stride, pad, dilation, _ = geo
    n, c, h, w = x4.shape
    _, k, p, q = dy4.shape
    r, s = dw4.shape[2:]
    tiles = cdiv(p, config.roll) * cdiv(q, config.block_a)
    if images is None:
        images = 1
        if dy4.is_cuda and not INTERPRETED:
            sms = torch.cuda.get_device_properties(dy4.device).multi_processor_count
            images = max(1, n * tiles * cdiv(k, config.block_b) // (4 * sms))
    programs = cdiv(n, images) * tiles
    acc = torch.float64 if dy4.dtype == torch.float64 else torch.float32
    part_shape = (programs, r, s, k)
    rest = (n, h, w, k, p, q, k // c, config.roll, images, stride[1], pad[0], pad[1],
            dilation[1], *plain_strides(dy4), *plain_strides(x4))
    meta = dict(R=r, S=s, SH=stride[0], NA=-(-r // stride[0]), ACC=acc_type(dy4.dtype),
                INT64=int64, BLOCK_Q=config.block_a, BLOCK_C=config.block_b,
                num_warps=config.num_warps)
    partials = Fixed(_dw_wgrad_kernel, (programs, cdiv(k, config.block_b)), rest, meta)
    block = 16 if INTERPRETED or not dy4.is_cuda else 64
    total = Fixed(_sum_parts_kernel, (cdiv(r * s * k, block),),
                  (programs, k, dw4.stride(0), dw4.stride(2), dw4.stride(3)),
                  dict(R=r, S=s, ACC=acc_type(dy4.dtype),
                       BLOCK_J=8 if INTERPRETED or not dy4.is_cuda else 32, BLOCK=block,
                       num_warps=4))

    def run(dy4, x4, dw4) -> bool:
        part = torch.empty(part_shape, device=dy4.device, dtype=acc)
        partials(dy4, x4, part)
        total(part, dw4)
        return True
    run(dy4, x4, dw4)
    return run
