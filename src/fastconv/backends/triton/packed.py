"""The causal depthwise conv1d of packed sequences (``seqconv.causal_conv1d`` with
``seq_idx``) and its backward; without ``seq_idx`` (HAS_IDS off) the same kernels are
``causal_conv1d``'s training route.

Both kernels read a window of the sequence once, with aligned loads, and shift it in
registers (``tl.gather`` along the positions) instead of loading each tap's window at its
own, unaligned, offset. A program's window is ``BLOCK_T`` positions of ``BLOCK_D``
channels of one batch row; its first ``HALO`` positions (``width − 1`` rounded up to the
load's alignment) feed the taps of the positions after them, so consecutive windows
overlap by the halo and each writes the positions only it computes.

Forward, one pass: a tap's input counted only where its position has the output position's
``seq_idx`` (positions before 0 read ``initial_states`` and have position 0's
``seq_idx``); float32 accumulation (float64 for float64), bias and SiLU in the same pass.
torch's form of it (seqconv._packed) is one masked multiply-add pass over the whole tensor
per tap.

Backward, one pass (:func:`packed_backward`): the window's pre-activation is recomputed
from x, ``g = dy · SiLU'(pre)`` (or dy), and from the same registers the input gradient
(the masked sum run the other way, over a halo on the right: windows overlap by two
halos), the initial states' (the positions before 0), and the weight's and bias's partial
sums per window, added in a fixed order afterwards: deterministic, no atomics. x and dy
are read once and dx written once: the byte floor of the backward.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import cdiv, launch


@triton.jit
def _window(x_ptr, ids_ptr, si_b, si_t, init_ptr, b, d, dmask, p, seqlen, sx_b, sx_d, sx_t,
            sh_b, sh_d, sh_k, WIDTH: tl.constexpr, HAS_INIT: tl.constexpr,
            HAS_IDS: tl.constexpr, ACC: tl.constexpr):
    """x at positions ``p`` of row ``b``, channels ``d`` (``initial_states`` before 0, zero
    outside), in ACC; and the positions' ``seq_idx`` (position 0's before 0) or 0."""
    inside = (p >= 0) & (p < seqlen)
    xs = tl.load(x_ptr + b * sx_b + d[:, None].to(tl.int64) * sx_d
                 + p[None, :].to(tl.int64) * sx_t,
                 mask=dmask[:, None] & inside[None, :], other=0.0).to(ACC)
    if HAS_INIT:
        before = (p < 0) & (p >= 1 - WIDTH)
        xs += tl.load(init_ptr + b * sh_b + d[:, None] * sh_d + (WIDTH - 1 + p)[None, :] * sh_k,
                      mask=dmask[:, None] & before[None, :], other=0.0).to(ACC)
    ids = p * 0
    if HAS_IDS:
        ids = tl.load(ids_ptr + b * si_b + p * si_t, mask=inside, other=0)
        ids = tl.where(p < 0, tl.load(ids_ptr + b * si_b), ids)
    return xs, ids


@triton.jit
def _shifted(v, ids, i, shift, HAS_IDS: tl.constexpr):
    """``v`` moved ``shift`` positions along axis 1 (right for a positive shift: column i
    takes column i − shift, clamped to the window), zero where that position's ``seq_idx``
    differs from column i's."""
    src = tl.minimum(tl.maximum(i - shift, 0), v.shape[1] - 1)
    src = tl.zeros(v.shape, tl.int32) + src[None, :]
    out = tl.gather(v, src, axis=1)
    if HAS_IDS:
        same = tl.gather(tl.zeros(v.shape, tl.int32) + ids[None, :], src, axis=1) == ids[None, :]
        out = tl.where(same, out, 0.0)
    return out


@triton.jit
def _pre(xs, ids, i, w_ptr, b_ptr, d, dmask, sw_d, sw_k, WIDTH: tl.constexpr,
         HAS_BIAS: tl.constexpr, HAS_IDS: tl.constexpr, ACC: tl.constexpr):
    """The pre-activation output at the window's columns from HALO on (earlier columns
    lack their inputs): Σ_k w[k]·x[t − (WIDTH − 1) + k] (+ bias)."""
    acc = tl.zeros(xs.shape, ACC)
    for k in range(WIDTH):
        wv = tl.load(w_ptr + d * sw_d + k * sw_k, mask=dmask, other=0.0).to(ACC)
        acc += _shifted(xs, ids, i, WIDTH - 1 - k, HAS_IDS) * wv[:, None]
    if HAS_BIAS:
        acc += tl.load(b_ptr + d, mask=dmask, other=0.0).to(ACC)[:, None]
    return acc


@triton.jit
def _forward_kernel(x_ptr, ids_ptr, si_b, si_t, init_ptr, w_ptr, b_ptr, out_ptr, dim, seqlen,
                    sx_b, sx_d, sx_t, sh_b, sh_d, sh_k, sw_d, sw_k, so_b, so_d, so_t,
                    WIDTH: tl.constexpr, HALO: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_T: tl.constexpr, HAS_INIT: tl.constexpr, HAS_BIAS: tl.constexpr,
                    SILU: tl.constexpr, HAS_IDS: tl.constexpr, ACC: tl.constexpr):
    # window w covers positions [w·(BLOCK_T − HALO) − HALO, ...) and writes those from its
    # column HALO on (windows on grid axis 0: the only one not limited to 65,535 programs)
    i = tl.arange(0, BLOCK_T)
    p = tl.program_id(0) * (BLOCK_T - HALO) - HALO + i
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    b = tl.program_id(2).to(tl.int64)
    dmask = d < dim
    xs, ids = _window(x_ptr, ids_ptr, si_b, si_t, init_ptr, b, d, dmask, p, seqlen, sx_b,
                      sx_d, sx_t, sh_b, sh_d, sh_k, WIDTH, HAS_INIT, HAS_IDS, ACC)
    acc = _pre(xs, ids, i, w_ptr, b_ptr, d, dmask, sw_d, sw_k, WIDTH, HAS_BIAS, HAS_IDS, ACC)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    keep = (i >= HALO) & (p < seqlen)
    tl.store(out_ptr + b * so_b + d[:, None].to(tl.int64) * so_d
             + p[None, :].to(tl.int64) * so_t, acc.to(out_ptr.dtype.element_ty),
             mask=dmask[:, None] & keep[None, :])


@triton.jit
def _backward_kernel(x_ptr, ids_ptr, si_b, si_t, init_ptr, w_ptr, b_ptr, dy_ptr, dx_ptr,
                     dh_ptr, part_ptr, dim, seqlen, sx_b, sx_d, sx_t, sh_b, sh_d, sh_k,
                     sw_d, sw_k, sy_b, sy_d, sy_t, sdx_b, sdx_d, sdx_t, sdh_b, sdh_d, sdh_k,
                     WIDTH: tl.constexpr, HALO: tl.constexpr, FIRST: tl.constexpr,
                     TAPS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
                     HAS_INIT: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                     HAS_IDS: tl.constexpr, INIT_GRAD: tl.constexpr, ACC: tl.constexpr):
    # window w covers positions [w·(BLOCK_T − 2·HALO) + FIRST − HALO, ...) and writes the
    # gradients of its columns [HALO, BLOCK_T − HALO): the first HALO columns feed the
    # pre-activation, the last HALO the input gradient. FIRST: the first position written
    # (−HALO with the initial states' gradient, else 0).
    i = tl.arange(0, BLOCK_T)
    w = tl.program_id(0)
    p = w * (BLOCK_T - 2 * HALO) + (FIRST - HALO) + i
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    b = tl.program_id(2).to(tl.int64)
    dmask = d < dim
    xs, ids = _window(x_ptr, ids_ptr, si_b, si_t, init_ptr, b, d, dmask, p, seqlen, sx_b,
                      sx_d, sx_t, sh_b, sh_d, sh_k, WIDTH, HAS_INIT, HAS_IDS, ACC)
    inside = (p >= 0) & (p < seqlen)
    g = tl.load(dy_ptr + b * sy_b + d[:, None].to(tl.int64) * sy_d
                + p[None, :].to(tl.int64) * sy_t,
                mask=dmask[:, None] & inside[None, :], other=0.0).to(ACC)
    if SILU:
        pre = _pre(xs, ids, i, w_ptr, b_ptr, d, dmask, sw_d, sw_k, WIDTH, HAS_BIAS, HAS_IDS,
                   ACC)
        sig = tl.sigmoid(pre)
        g = g * sig * (1 + pre * (1 - sig))
    # dx[s] = Σ_k w[k]·g[s + WIDTH − 1 − k] (where that position has s's seq_idx)
    dx = tl.zeros(xs.shape, ACC)
    for k in range(WIDTH):
        wv = tl.load(w_ptr + d * sw_d + k * sw_k, mask=dmask, other=0.0).to(ACC)
        dx += _shifted(g, ids, i, k + 1 - WIDTH, HAS_IDS) * wv[:, None]
    own = (i >= HALO) & (i < BLOCK_T - HALO)
    tl.store(dx_ptr + b * sdx_b + d[:, None].to(tl.int64) * sdx_d
             + p[None, :].to(tl.int64) * sdx_t, dx.to(dx_ptr.dtype.element_ty),
             mask=dmask[:, None] & (own & inside)[None, :])
    if INIT_GRAD:
        before = own & (p < 0) & (p >= 1 - WIDTH)
        tl.store(dh_ptr + b * sdh_b + d[:, None] * sdh_d + (WIDTH - 1 + p)[None, :] * sdh_k,
                 dx.to(dh_ptr.dtype.element_ty), mask=dmask[:, None] & before[None, :])
    # this window's share of dw[k] = Σ_t g[t]·x[t − (WIDTH − 1) + k] and db = Σ_t g[t]
    g = tl.where(own[None, :], g, 0.0)
    taps = tl.arange(0, TAPS)
    part = tl.zeros([BLOCK_D, TAPS], ACC)
    for k in range(WIDTH):
        tap = tl.sum(g * _shifted(xs, ids, i, WIDTH - 1 - k, HAS_IDS), axis=1)
        part += tl.where(taps[None, :] == k, tap[:, None], 0.0)
    if HAS_BIAS:
        part += tl.where(taps[None, :] == WIDTH, tl.sum(g, axis=1)[:, None], 0.0)
    out = part_ptr + ((b * tl.num_programs(0) + w) * dim + d[:, None].to(tl.int64)) * TAPS
    tl.store(out + taps[None, :], part, mask=dmask[:, None] & (taps <= WIDTH)[None, :])


def _ids(seq_idx, x: torch.Tensor) -> tuple:
    """The kernels' (ids_ptr, si_b, si_t) arguments: seq_idx's, or x's pointer (not read:
    HAS_IDS is off) without it."""
    return (seq_idx, *seq_idx.stride()) if seq_idx is not None else (x, 0, 0)


def _tile(x: torch.Tensor, width: int) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_D, HALO): windows along the contiguous dimension of x, their halo
    ``width − 1`` rounded up to 8 positions where positions are contiguous (16-byte loads
    of 16-bit data), and long enough that the halos cost at most a quarter of a window."""
    align = 8 if x.stride(2) == 1 else 1
    halo = cdiv(width - 1, align) * align
    block_t = max(512 if align > 1 else 64, triton.next_power_of_2(8 * halo))
    return block_t, max(1, 2048 // block_t), halo


def _acc(x: torch.Tensor):
    return tl.float64 if x.dtype == torch.float64 else tl.float32


def packed_forward(x: torch.Tensor, seq_idx: torch.Tensor | None, initial_states,
                   weight: torch.Tensor, bias, silu: bool) -> torch.Tensor:
    """The output (x's shape, layout and dtype) of ``seqconv.causal_conv1d`` with
    ``seq_idx`` (None: one sequence per row; see the module docstring)."""
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    block_t, block_d, halo = _tile(x, width)
    out = torch.empty_like(x)
    init = initial_states if initial_states is not None else x
    launch(_forward_kernel, (cdiv(seqlen, block_t - halo), cdiv(dim, block_d), batch),
           x, *_ids(seq_idx, x), init, weight, x if bias is None else bias, out, dim, seqlen,
           *x.stride(), *init.stride(), *weight.stride(), *out.stride(),
           WIDTH=width, HALO=halo, BLOCK_D=block_d, BLOCK_T=block_t,
           HAS_INIT=initial_states is not None, HAS_BIAS=bias is not None, SILU=silu,
           HAS_IDS=seq_idx is not None, ACC=_acc(x), num_warps=4)
    return out


def packed_backward(dy: torch.Tensor, x: torch.Tensor, seq_idx: torch.Tensor | None,
                    initial_states, weight: torch.Tensor, bias, silu: bool,
                    init_grad: bool) -> tuple:
    """(dx, d initial_states or None, d weight, d bias or None) of :func:`packed_forward`
    given the output's gradient ``dy`` (any layout): one pass (see the module docstring),
    then the weight's and bias's per-window sums added in a fixed order (float32, float64
    for float64)."""
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    block_t, block_d, halo = _tile(x, width)
    first = -halo if init_grad else 0
    windows = cdiv(seqlen - first, block_t - 2 * halo)
    dx = torch.empty_like(x)
    dh = torch.empty((batch, dim, width - 1), device=x.device, dtype=x.dtype) \
        if init_grad else dx
    taps = triton.next_power_of_2(width + 1)
    part = torch.empty((batch, windows, dim, taps), device=x.device,
                       dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)
    init = initial_states if initial_states is not None else x
    launch(_backward_kernel, (windows, cdiv(dim, block_d), batch),
           x, *_ids(seq_idx, x), init, weight, x if bias is None else bias, dy, dx, dh, part,
           dim, seqlen, *x.stride(), *init.stride(), *weight.stride(), *dy.stride(),
           *dx.stride(), *dh.stride(),
           WIDTH=width, HALO=halo, FIRST=first, TAPS=taps, BLOCK_D=block_d, BLOCK_T=block_t,
           HAS_INIT=initial_states is not None, HAS_BIAS=bias is not None, SILU=silu,
           HAS_IDS=seq_idx is not None, INIT_GRAD=init_grad, ACC=_acc(x), num_warps=4)
    sums = part[..., :width + 1].sum((0, 1))
    return (dx, dh if init_grad else None, sums[:, :width].to(weight.dtype),
            sums[:, width].to(bias.dtype) if bias is not None else None)
