"""The causal depthwise conv1d of packed sequences (``seqconv.causal_conv1d`` with
``seq_idx``) and its backward; without ``seq_idx`` (HAS_IDS off) the same kernels are
``causal_conv1d``'s training route.

Forward, one pass: each program computes a (channels × positions) tile of one batch row,
tap by tap, a tap's input counted only where its position has the output position's
``seq_idx``; positions before 0 read ``initial_states`` and have position 0's ``seq_idx``.
float32 accumulation (float64 for float64), bias and SiLU in the same pass. torch's form of
it (seqconv._packed) is one masked multiply-add pass over the whole tensor per tap; this
reads x once from memory (the taps' overlapping windows come from the cache) and writes the
output once.

Backward (:func:`packed_backward`, given the gradient of the pre-activation output, which
:func:`silu_grad` computes in one pass of the forward kernel where SiLU was applied): the
input gradient (and the initial states') in one pass, the same masked sum run the other
way; the weight gradient as per-chunk partial sums (1,024 positions of a row each, up to 32
taps per program, each gradient tile loaded once for all of them), added in a fixed order:
deterministic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import cdiv, launch


@triton.jit
def _packed_kernel(x_ptr, ids_ptr, si_b, si_t, init_ptr, w_ptr, b_ptr, dy_ptr, out_ptr, dim,
                   seqlen, sx_b, sx_d, sx_t, sh_b, sh_d, sh_k, sw_d, sw_k,
                   so_b, so_d, so_t,
                   WIDTH: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
                   HAS_INIT: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                   SILU_GRAD: tl.constexpr, HAS_IDS: tl.constexpr, ACC: tl.constexpr):
    # SILU_GRAD: the output is dy · SiLU'(pre-activation), dy laid out as the output
    # (positions on grid axis 0: the only one not limited to 65,535 programs)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    b = tl.program_id(2).to(tl.int64)
    dmask = d < dim
    tmask = t < seqlen
    if HAS_IDS:
        first = tl.load(ids_ptr + b * si_b)  # the id of position 0, and of those before it
        ids_t = tl.load(ids_ptr + b * si_b + t * si_t, mask=tmask, other=0)
    rows = x_ptr + b * sx_b + d[:, None].to(tl.int64) * sx_d
    acc = tl.zeros([BLOCK_D, BLOCK_T], ACC)
    for k in range(WIDTH):
        src = t - (WIDTH - 1) + k
        inside = src >= 0
        same = tmask
        if HAS_IDS:
            ids_src = tl.load(ids_ptr + b * si_b + src * si_t, mask=tmask & inside, other=0)
            same = same & (tl.where(inside, ids_src, first) == ids_t)
        xv = tl.load(rows + src[None, :].to(tl.int64) * sx_t,
                     mask=dmask[:, None] & (same & inside)[None, :], other=0.0)
        if HAS_INIT:  # position src < 0 reads initial_states[:, :, WIDTH - 1 + src]
            hv = tl.load(init_ptr + b * sh_b + d[:, None] * sh_d
                         + (WIDTH - 1 + src)[None, :] * sh_k,
                         mask=dmask[:, None] & (same & (src < 0))[None, :], other=0.0)
            xv += hv
        wv = tl.load(w_ptr + d * sw_d + k * sw_k, mask=dmask, other=0.0)
        acc += xv.to(ACC) * wv.to(ACC)[:, None]
    if HAS_BIAS:
        acc += tl.load(b_ptr + d, mask=dmask, other=0.0).to(ACC)[:, None]
    at = b * so_b + d[:, None].to(tl.int64) * so_d + t[None, :].to(tl.int64) * so_t
    tile = dmask[:, None] & tmask[None, :]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    if SILU_GRAD:
        sig = tl.sigmoid(acc)
        acc = tl.load(dy_ptr + at, mask=tile, other=0.0).to(ACC) * sig * (1 + acc * (1 - sig))
    tl.store(out_ptr + at, acc.to(out_ptr.dtype.element_ty), mask=tile)


def _ids(seq_idx, x: torch.Tensor) -> tuple:
    """The kernels' (ids_ptr, si_b, si_t) arguments: seq_idx's, or x's pointer (not read:
    HAS_IDS is off) without it."""
    return (seq_idx, *seq_idx.stride()) if seq_idx is not None else (x, 0, 0)


def _tiles(x: torch.Tensor) -> tuple[int, int]:
    """(BLOCK_T, BLOCK_D): a tile along the contiguous dimension of x."""
    return (64, 32) if x.stride(2) == 1 else (32, 64)


def _forward(x, seq_idx, initial_states, weight, bias, out, silu: bool, dy=None):
    batch, dim, seqlen = x.shape
    block_t, block_d = _tiles(x)
    init = initial_states if initial_states is not None else x
    launch(_packed_kernel, (cdiv(seqlen, block_t), cdiv(dim, block_d), batch),
           x, *_ids(seq_idx, x), init, weight, x if bias is None else bias,
           x if dy is None else dy, out, dim, seqlen,
           *x.stride(), *init.stride(), *weight.stride(), *out.stride(),
           WIDTH=weight.shape[1], BLOCK_D=block_d, BLOCK_T=block_t,
           HAS_INIT=initial_states is not None, HAS_BIAS=bias is not None, SILU=silu,
           SILU_GRAD=dy is not None, HAS_IDS=seq_idx is not None,
           ACC=tl.float64 if x.dtype == torch.float64 else tl.float32, num_warps=4)
    return out


def packed_forward(x: torch.Tensor, seq_idx: torch.Tensor, initial_states, weight: torch.Tensor,
                   bias, silu: bool) -> torch.Tensor:
    """The output (x's shape, layout and dtype) of ``seqconv.causal_conv1d`` with
    ``seq_idx`` (see the module docstring)."""
    return _forward(x, seq_idx, initial_states, weight, bias, torch.empty_like(x), silu)


def silu_grad(dy: torch.Tensor, x: torch.Tensor, seq_idx: torch.Tensor, initial_states,
              weight: torch.Tensor, bias) -> torch.Tensor:
    """dy · SiLU'(pre-activation) in float32 (float64 for float64), laid out as x: the
    pre-activation recomputed, never stored."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    out = torch.empty_like(x, dtype=acc)
    if dy.stride() != out.stride():  # (the kernel reads dy at the output's offsets)
        dy = torch.empty_like(out, dtype=dy.dtype).copy_(dy)
    return _forward(x, seq_idx, initial_states, weight, bias, out, False, dy)


@triton.jit
def _packed_dx_kernel(g_ptr, ids_ptr, si_b, si_t, w_ptr, dx_ptr, dh_ptr, dim, seqlen, s0,
                      sg_b, sg_d, sg_t, sw_d, sw_k, sx_b, sx_d, sx_t,
                      sh_b, sh_d, sh_k,
                      WIDTH: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
                      HAS_IDS: tl.constexpr, ACC: tl.constexpr):
    # the input gradient at positions s = s0 + e: dx[s] = Σ_k w[k]·g[s + WIDTH − 1 − k],
    # counted where that output position has s's seq_idx (positions before 0 have position
    # 0's: the initial states' gradient, written to dh)
    e = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    b = tl.program_id(2).to(tl.int64)
    s = s0 + e
    dmask = d < dim
    smask = s < seqlen
    if HAS_IDS:
        first = tl.load(ids_ptr + b * si_b)
        ids_s = tl.load(ids_ptr + b * si_b + s * si_t, mask=smask & (s >= 0), other=0)
        ids_s = tl.where(s >= 0, ids_s, first)
    rows = g_ptr + b * sg_b + d[:, None].to(tl.int64) * sg_d
    acc = tl.zeros([BLOCK_D, BLOCK_T], ACC)
    for k in range(WIDTH):
        t = s + (WIDTH - 1) - k
        same = smask & (t >= 0) & (t < seqlen)
        if HAS_IDS:
            same = same & (tl.load(ids_ptr + b * si_b + t * si_t, mask=same, other=0) == ids_s)
        gv = tl.load(rows + t[None, :].to(tl.int64) * sg_t, mask=dmask[:, None] & same[None, :],
                     other=0.0)
        wv = tl.load(w_ptr + d * sw_d + k * sw_k, mask=dmask, other=0.0)
        acc += gv.to(ACC) * wv.to(ACC)[:, None]
    inside = dmask[:, None] & (smask & (s >= 0))[None, :]
    tl.store(dx_ptr + b * sx_b + d[:, None].to(tl.int64) * sx_d
             + s[None, :].to(tl.int64) * sx_t, acc.to(dx_ptr.dtype.element_ty), mask=inside)
    before = dmask[:, None] & (s < 0)[None, :]
    tl.store(dh_ptr + b * sh_b + d[:, None] * sh_d + (WIDTH - 1 + s)[None, :] * sh_k,
             acc.to(dh_ptr.dtype.element_ty), mask=before)


@triton.jit
def _packed_dw_kernel(g_ptr, x_ptr, ids_ptr, si_b, si_t, init_ptr, part_ptr, dim, seqlen,
                      chunk, sg_b, sg_d, sg_t, sx_b, sx_d, sx_t, sh_b, sh_d, sh_k,
                      WIDTH: tl.constexpr, TAPS: tl.constexpr, BLOCK_D: tl.constexpr,
                      BLOCK_T: tl.constexpr, HAS_INIT: tl.constexpr, HAS_IDS: tl.constexpr,
                      ACC: tl.constexpr):
    # partial weight gradient of positions [c·chunk, (c+1)·chunk) of row b, taps
    # [j·TAPS, (j+1)·TAPS): part[b, c, d, k] = Σ_t g[t]·x[t − (WIDTH − 1) + k], where that
    # input has t's seq_idx. A gradient tile is loaded once for all TAPS taps.
    groups = tl.cdiv(WIDTH, TAPS)
    c = tl.program_id(0) // groups
    k0 = (tl.program_id(0) % groups) * TAPS
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    b = tl.program_id(2).to(tl.int64)
    dmask = d < dim
    if HAS_IDS:
        first = tl.load(ids_ptr + b * si_b)
    g_rows = g_ptr + b * sg_b + d[:, None].to(tl.int64) * sg_d
    x_rows = x_ptr + b * sx_b + d[:, None].to(tl.int64) * sx_d
    taps = k0 + tl.arange(0, TAPS)
    acc = tl.zeros([BLOCK_D, TAPS], ACC)
    stop = tl.minimum((c + 1) * chunk, seqlen)
    for t0 in range(c * chunk, stop, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        tmask = t < stop
        if HAS_IDS:
            ids_t = tl.load(ids_ptr + b * si_b + t * si_t, mask=tmask, other=0)
        gv = tl.load(g_rows + t[None, :].to(tl.int64) * sg_t,
                     mask=dmask[:, None] & tmask[None, :], other=0.0).to(ACC)
        for j in range(TAPS):
            src = t - (WIDTH - 1) + k0 + j
            same = tmask & (src <= t)  # (tap k0 + j < WIDTH; a block mask, as Triton 3.9's
            # interpreter refuses a block & scalar mask)
            if HAS_IDS:
                ids_src = tl.load(ids_ptr + b * si_b + src * si_t, mask=same & (src >= 0),
                                  other=0)
                same = same & (tl.where(src >= 0, ids_src, first) == ids_t)
            xv = tl.load(x_rows + src[None, :].to(tl.int64) * sx_t,
                         mask=dmask[:, None] & (same & (src >= 0))[None, :], other=0.0)
            if HAS_INIT:
                xv += tl.load(init_ptr + b * sh_b + d[:, None] * sh_d
                              + (WIDTH - 1 + src)[None, :] * sh_k,
                              mask=dmask[:, None] & (same & (src < 0))[None, :], other=0.0)
            tap = tl.sum(gv * xv.to(ACC), axis=1)
            acc += tl.where(taps[None, :] == k0 + j, tap[:, None], 0.0)
    out = part_ptr + ((b * tl.cdiv(seqlen, chunk) + c) * dim + d[:, None]) * WIDTH
    tl.store(out + taps[None, :], acc, mask=dmask[:, None] & (taps < WIDTH)[None, :])


def packed_backward(g: torch.Tensor, x: torch.Tensor, seq_idx: torch.Tensor, initial_states,
                    weight: torch.Tensor, init_grad: bool):
    """(dx, d initial_states or None, d weight) of :func:`packed_forward` without its
    activation and bias, given the gradient ``g`` of its pre-activation output (any
    float dtype: the sums run in float32, float64 for float64)."""
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    acc = tl.float64 if x.dtype == torch.float64 else tl.float32
    dx = torch.empty_like(x)
    dh = torch.empty((batch, dim, width - 1), device=x.device, dtype=x.dtype) \
        if init_grad else dx
    s0 = -(width - 1) if init_grad else 0
    block_t, block_d = _tiles(g)
    launch(_packed_dx_kernel, (cdiv(seqlen - s0, block_t), cdiv(dim, block_d), batch),
           g, *_ids(seq_idx, x), weight, dx, dh, dim, seqlen, s0, *g.stride(),
           *weight.stride(), *dx.stride(), *dh.stride(),
           WIDTH=width, BLOCK_D=block_d, BLOCK_T=block_t, HAS_IDS=seq_idx is not None,
           ACC=acc, num_warps=4)
    chunk = 1024
    taps = min(triton.next_power_of_2(width), 32)
    part = torch.empty((batch, cdiv(seqlen, chunk), dim, width), device=x.device,
                       dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)
    init = initial_states if initial_states is not None else x
    launch(_packed_dw_kernel, (part.shape[1] * cdiv(width, taps), cdiv(dim, block_d), batch),
           g, x, *_ids(seq_idx, x), init, part, dim, seqlen, chunk, *g.stride(), *x.stride(),
           *init.stride(),
           WIDTH=width, TAPS=taps, BLOCK_D=block_d, BLOCK_T=block_t,
           HAS_INIT=initial_states is not None, HAS_IDS=seq_idx is not None, ACC=acc,
           num_warps=4)
    return dx, (dh if init_grad else None), part.sum((0, 1)).to(weight.dtype)
