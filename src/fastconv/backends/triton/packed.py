"""The causal depthwise conv1d of packed sequences (``seqconv.causal_conv1d`` with
``seq_idx``) in one pass: each program computes a (channels × positions) tile of one batch
row, tap by tap, a tap's input counted only where its position has the output position's
``seq_idx``; positions before 0 read ``initial_states`` and have position 0's ``seq_idx``.
float32 accumulation (float64 for float64), bias and SiLU in the same pass.

torch's form of it (seqconv._packed) is one masked multiply-add pass over the whole tensor
per tap; this reads x once from memory (the taps' overlapping windows come from the cache)
and writes the output once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import cdiv, launch


@triton.jit
def _packed_kernel(x_ptr, ids_ptr, init_ptr, w_ptr, b_ptr, out_ptr, dim, seqlen,
                   sx_b, sx_d, sx_t, si_b, si_t, sh_b, sh_d, sh_k, sw_d, sw_k,
                   so_b, so_d, so_t,
                   WIDTH: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
                   HAS_INIT: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                   ACC: tl.constexpr):
    # (positions on grid axis 0: the only one not limited to 65,535 programs)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    b = tl.program_id(2).to(tl.int64)
    dmask = d < dim
    tmask = t < seqlen
    first = tl.load(ids_ptr + b * si_b)  # the id of position 0, and of those before it
    ids_t = tl.load(ids_ptr + b * si_b + t * si_t, mask=tmask, other=0)
    rows = x_ptr + b * sx_b + d[:, None].to(tl.int64) * sx_d
    acc = tl.zeros([BLOCK_D, BLOCK_T], ACC)
    for k in range(WIDTH):
        src = t - (WIDTH - 1) + k
        inside = src >= 0
        ids_src = tl.load(ids_ptr + b * si_b + src * si_t, mask=tmask & inside, other=0)
        ids_src = tl.where(inside, ids_src, first)
        same = (ids_src == ids_t) & tmask
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
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(out_ptr + b * so_b + d[:, None].to(tl.int64) * so_d
             + t[None, :].to(tl.int64) * so_t,
             acc.to(out_ptr.dtype.element_ty), mask=dmask[:, None] & tmask[None, :])


def packed_forward(x: torch.Tensor, seq_idx: torch.Tensor, initial_states, weight: torch.Tensor,
                   bias, silu: bool) -> torch.Tensor:
    """The output (x's shape, dtype and layout) of ``seqconv.causal_conv1d`` with
    ``seq_idx`` (see the module docstring)."""
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    out = torch.empty_like(x)
    # a tile along the contiguous dimension of x
    block_t, block_d = (64, 32) if x.stride(2) == 1 else (32, 64)
    init = initial_states if initial_states is not None else x
    launch(_packed_kernel, (cdiv(seqlen, block_t), cdiv(dim, block_d), batch),
           x, seq_idx, init, weight, x if bias is None else bias, out, dim, seqlen,
           *x.stride(), *seq_idx.stride(), *init.stride(), *weight.stride(), *out.stride(),
           WIDTH=width, BLOCK_D=block_d, BLOCK_T=block_t,
           HAS_INIT=initial_states is not None, HAS_BIAS=bias is not None, SILU=silu,
           ACC=tl.float64 if x.dtype == torch.float64 else tl.float32, num_warps=4)
    return out
