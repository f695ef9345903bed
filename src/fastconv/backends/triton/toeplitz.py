"""The causal depthwise conv1d of wide filters on tensor cores (``seqconv.causal_conv1d``
without ``seq_idx``, forward).

A channel's sequence, cut into blocks of ``BLOCK`` positions, is a (blocks × BLOCK) matrix
X; its causal convolution with a filter of ``WIDTH`` taps is, block row by block row,
``out[r] = Σ_m X[r − m] @ T_m`` with ``T_m[j, i] = w[j − i + WIDTH − 1 − m·BLOCK]`` (zero
outside 0..WIDTH−1) and m = 0..⌊(WIDTH + BLOCK − 2) / BLOCK⌋: Toeplitz matrices of the channel's
taps. One program takes ``ROWS`` block rows of one channel (ROWS · BLOCK consecutive
positions, a contiguous span where the sequence dimension is), builds each T_m once from
the taps (gathered from the cache) and runs one (ROWS × BLOCK) @ (BLOCK × BLOCK) product
per m, float32 accumulation. The direct kernels issue one load and one multiply-add per
tap and output; here a wide filter costs BLOCK² multiply-adds per block on the tensor cores
instead, and x is read from memory once (each block by at most 1 + ⌈(WIDTH−1)/BLOCK⌉
programs' products, from the cache). Positions before 0 read ``initial_states``; bias and
SiLU are applied to the tile before it is written once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import mma
from .launch import INTERPRETED, cdiv, launch

#: (positions per block: the products' K and N; block rows per program: their M; warps)
#: (benchmarks/sweep.py --toeplitz times others)
TILE = (64, 64, 4)


@triton.jit
def _toeplitz_kernel(x_ptr, w_ptr, b_ptr, h_ptr, out_ptr, seqlen,
                     sx_b, sx_d, sx_t, sw_d, sw_k, sh_b, sh_d, sh_k, so_b, so_d, so_t,
                     WIDTH: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
                     HAS_INIT: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                     DOT_FP32: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr):
    # (position blocks on grid axis 0: the only one not limited to 65,535 programs)
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # block rows
    d = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    i = tl.arange(0, BLOCK)  # an output's place in its block (T's column)
    j = tl.arange(0, BLOCK)  # an input's place in its block (T's row)
    x_row = x_ptr + b * sx_b + d * sx_d
    acc = tl.zeros([ROWS, BLOCK], ACC)
    for m in range((WIDTH + BLOCK - 2) // BLOCK + 1):
        tap = j[:, None] - i[None, :] + (WIDTH - 1) - m * BLOCK
        taps = tl.load(w_ptr + d * sw_d + tap * sw_k, mask=(tap >= 0) & (tap < WIDTH),
                       other=0.0)
        src = (r[:, None] - m) * BLOCK + j[None, :]  # input positions, (ROWS, BLOCK)
        xv = tl.load(x_row + src.to(tl.int64) * sx_t, mask=(src >= 0) & (src < seqlen),
                     other=0.0)
        if HAS_INIT:  # position src < 0 reads initial_states[:, :, WIDTH - 1 + src]
            xv += tl.load(h_ptr + b * sh_b + d * sh_d + (WIDTH - 1 + src) * sh_k,
                          mask=(src < 0) & (src >= 1 - WIDTH), other=0.0)
        acc = mma(xv, taps.to(xv.dtype), acc, DOT_FP32, False, PRECISION, ACC)
    if HAS_BIAS:
        acc += tl.load(b_ptr + d).to(ACC)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    t = r[:, None] * BLOCK + i[None, :]
    tl.store(out_ptr + b * so_b + d * so_d + t.to(tl.int64) * so_t,
             acc.to(out_ptr.dtype.element_ty), mask=t < seqlen)


def toeplitz_forward(x: torch.Tensor, weight: torch.Tensor, bias, initial_states,
                     silu: bool) -> torch.Tensor:
    """The output (x's shape, layout and dtype) of ``seqconv.causal_conv1d`` without
    ``seq_idx`` (see the module docstring). float16 and bfloat16 on a GPU (float32 and
    float64 exactly under the interpreter, for the tests)."""
    batch, dim, seqlen = x.shape
    block, rows, warps = TILE
    out = torch.empty_like(x)
    init = initial_states if initial_states is not None else x
    launch(_toeplitz_kernel, (cdiv(seqlen, block * rows), dim, batch),
           x, weight, x if bias is None else bias, init, out, seqlen,
           *x.stride(), *weight.stride(), *init.stride(), *out.stride(),
           WIDTH=weight.shape[1], BLOCK=block, ROWS=rows,
           HAS_INIT=initial_states is not None, HAS_BIAS=bias is not None, SILU=silu,
           DOT_FP32=INTERPRETED and x.dtype == torch.bfloat16,
           PRECISION="ieee", ACC=tl.float64 if x.dtype == torch.float64 else tl.float32,
           num_warps=warps)
    return out
