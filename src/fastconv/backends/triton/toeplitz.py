"""The causal depthwise conv1d of wide filters on tensor cores (``seqconv.causal_conv1d``
without ``seq_idx``), forward and backward.

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

Backward (:func:`toeplitz_backward`, given dy · SiLU' from :func:`silu_grad`): the input
gradient is the same sum of products with the blocks after a row and T_m transposed
(``REVERSE``); the weight gradient is, per channel and m, the gradient of T_m,
Σ X[r − m]ᵀ @ G[r] over every row and batch row (one (BLOCK × ROWS) @ (ROWS × BLOCK)
product per ROWS rows), whose diagonals are the taps' sums; the initial states' gradient is
the forward kernel on the first WIDTH − 1 gradient positions with the taps reversed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import mma
from .launch import INTERPRETED, cdiv, launch

#: The forward kernel's tile, (positions per block: the products' K and N; block rows per
#: program: their M; warps): None picks it per problem (:func:`tile`), a tuple here is used
#: for every problem (benchmarks/sweep.py --toeplitz times each). DW_TILE: the weight
#: gradient's.
TILE: tuple[int, int, int] | None = None
DW_TILE = (64, 64, 4)


def tile(seqlen: int, width: int) -> tuple[int, int, int]:
    """The forward kernel's tile for a sequence length and filter width: 32-position blocks
    (64 for filters of 128 taps and more on sequences past 4096), as many block rows as
    cover the sequence, 16 to 128, and 4 warps. From ``sweep.py --toeplitz`` on an H100
    (benchmarks/results/seqconv/2026-11-27/wide/sweep-toeplitz-e8c2895.log, widths 32-256,
    lengths 256-16384): the best of 16 tiles on each of its 12 problems, 1.2-3.8x faster
    than the one (64, 64, 4) tile used for all before."""
    if TILE is not None:
        return TILE
    block = 64 if width >= 128 and seqlen > 4096 else 32
    return block, min(128, max(16, triton.next_power_of_2(seqlen) // block)), 4


@triton.jit
def _toeplitz_kernel(x_ptr, w_ptr, b_ptr, h_ptr, dy_ptr, out_ptr, seqlen,
                     sx_b, sx_d, sx_t, sw_d, sw_k, sh_b, sh_d, sh_k, so_b, so_d, so_t,
                     WIDTH: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
                     HAS_INIT: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                     SILU_GRAD: tl.constexpr, REVERSE: tl.constexpr, DOT_FP32: tl.constexpr,
                     PRECISION: tl.constexpr, ACC: tl.constexpr):
    # REVERSE: the input gradient, out[s] = Σ_k w[k]·x[s + WIDTH − 1 − k] (x: the output's
    # gradient), the same products with the blocks after a row instead of before it and
    # the Toeplitz matrices transposed; SILU_GRAD: the output is dy · SiLU'(the
    # pre-activation), dy laid out as the output.
    # (position blocks on grid axis 0: the only one not limited to 65,535 programs)
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # block rows
    d = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    i = tl.arange(0, BLOCK)  # an output's place in its block (T's column)
    j = tl.arange(0, BLOCK)  # an input's place in its block (T's row)
    x_row = x_ptr + b * sx_b + d * sx_d
    acc = tl.zeros([ROWS, BLOCK], ACC)
    for m in range((WIDTH + BLOCK - 2) // BLOCK + 1):
        if REVERSE:
            tap = i[None, :] - j[:, None] + (WIDTH - 1) - m * BLOCK
            src = (r[:, None] + m) * BLOCK + j[None, :]  # input positions, (ROWS, BLOCK)
        else:
            tap = j[:, None] - i[None, :] + (WIDTH - 1) - m * BLOCK
            src = (r[:, None] - m) * BLOCK + j[None, :]
        taps = tl.load(w_ptr + d * sw_d + tap * sw_k, mask=(tap >= 0) & (tap < WIDTH),
                       other=0.0)
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
    at = b * so_b + d * so_d + t.to(tl.int64) * so_t
    if SILU_GRAD:
        sig = tl.sigmoid(acc)
        acc = tl.load(dy_ptr + at, mask=t < seqlen, other=0.0).to(ACC) \
            * sig * (1 + acc * (1 - sig))
    tl.store(out_ptr + at, acc.to(out_ptr.dtype.element_ty), mask=t < seqlen)


def _launch(x, weight, bias, initial_states, out, silu=False, dy=None, reverse=False):
    batch, dim, seqlen = x.shape
    block, rows, warps = tile(seqlen, weight.shape[1])
    init = initial_states if initial_states is not None else x
    launch(_toeplitz_kernel, (cdiv(seqlen, block * rows), dim, batch),
           x, weight, x if bias is None else bias, init, x if dy is None else dy, out, seqlen,
           *x.stride(), *weight.stride(), *init.stride(), *out.stride(),
           WIDTH=weight.shape[1], BLOCK=block, ROWS=rows,
           HAS_INIT=initial_states is not None, HAS_BIAS=bias is not None, SILU=silu,
           SILU_GRAD=dy is not None, REVERSE=reverse,
           DOT_FP32=INTERPRETED and x.dtype == torch.bfloat16,
           PRECISION="ieee", ACC=tl.float64 if x.dtype == torch.float64 else tl.float32,
           num_warps=warps)
    return out


def toeplitz_forward(x: torch.Tensor, weight: torch.Tensor, bias, initial_states,
                     silu: bool) -> torch.Tensor:
    """The output (x's shape, layout and dtype) of ``seqconv.causal_conv1d`` without
    ``seq_idx`` (see the module docstring). float16 and bfloat16 on a GPU (float32 and
    float64 exactly under the interpreter, for the tests)."""
    return _launch(x, weight, bias, initial_states, torch.empty_like(x), silu)


def silu_grad(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias,
              initial_states) -> torch.Tensor:
    """dy · SiLU'(pre-activation) in x's dtype and layout (the tensor cores' operand for the
    backward products), the pre-activation recomputed, never stored."""
    out = torch.empty_like(x)
    if dy.stride() != out.stride():  # (the kernel reads dy at the output's offsets)
        dy = torch.empty_like(out).copy_(dy)
    return _launch(x, weight, bias, initial_states, out, dy=dy)


@triton.jit
def _toeplitz_dw_kernel(x_ptr, g_ptr, h_ptr, part_ptr, scratch_ptr, batch, seqlen,
                        sx_b, sx_d, sx_t, sg_b, sg_d, sg_t, sh_b, sh_d, sh_k,
                        WIDTH: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
                        SHIFTS: tl.constexpr, HAS_INIT: tl.constexpr,
                        DOT_FP32: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr):
    # The weight gradient's part of shift m for channel d: the gradient of T_m,
    # P[j, i] = Σ over rows and batch of X[r − m, j]·G[r, i] (one product per ROWS block
    # rows), then its diagonals: part[d, m, c] = Σ_i P[i + c − (BLOCK − 1), i], the taps
    # k = c − (BLOCK − 1) + WIDTH − 1 − m·BLOCK (added up by toeplitz_backward).
    d = tl.program_id(0).to(tl.int64)
    m = tl.program_id(1)
    i = tl.arange(0, BLOCK)
    j = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK, BLOCK], ACC)
    for b in range(batch):
        x_row = x_ptr + b * sx_b + d * sx_d
        g_row = g_ptr + b * sg_b + d * sg_d
        for r0 in range(0, tl.cdiv(seqlen, BLOCK), ROWS):
            r = r0 + tl.arange(0, ROWS)
            t = r[:, None] * BLOCK + i[None, :]
            gv = tl.load(g_row + t.to(tl.int64) * sg_t, mask=t < seqlen, other=0.0)
            src = (r[:, None] - m) * BLOCK + j[None, :]
            xv = tl.load(x_row + src.to(tl.int64) * sx_t, mask=(src >= 0) & (src < seqlen),
                         other=0.0)
            if HAS_INIT:
                xv += tl.load(h_ptr + b * sh_b + d * sh_d + (WIDTH - 1 + src) * sh_k,
                              mask=(src < 0) & (src >= 1 - WIDTH), other=0.0)
            acc = mma(tl.trans(xv), gv.to(xv.dtype), acc, DOT_FP32, False, PRECISION, ACC)
    # the diagonals, through a (BLOCK × BLOCK) scratch tile of this program's own
    scratch = scratch_ptr + (d * SHIFTS + m) * BLOCK * BLOCK
    tl.store(scratch + j[:, None] * BLOCK + i[None, :], acc)
    tl.debug_barrier()
    c = tl.arange(0, 2 * BLOCK)
    row = i[:, None] + c[None, :] - (BLOCK - 1)  # P's row j for column i, diagonal c
    skew = tl.load(scratch + row * BLOCK + i[:, None],
                   mask=(row >= 0) & (row < BLOCK) & (c[None, :] < 2 * BLOCK - 1), other=0.0)
    tl.store(part_ptr + (d * SHIFTS + m) * 2 * BLOCK + c, tl.sum(skew, axis=0))


def toeplitz_backward(g: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, initial_states,
                      needs: tuple[bool, bool, bool]):
    """(dx, d weight, d initial_states), each where ``needs`` asks (else None), given ``g``,
    the gradient of the pre-activation output (x's layout and dtype): dx by the forward
    kernel run in reverse, the weight's by :func:`_toeplitz_dw_kernel` (float32, summed in
    a fixed order: deterministic), the initial states' by the forward kernel on g's first
    width − 1 positions with the taps reversed."""
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    dx = _launch(g, weight, None, None, torch.empty_like(x), reverse=True) \
        if needs[0] else None
    dw = None
    if needs[1]:
        block, rows, warps = DW_TILE
        shifts = (width + block - 2) // block + 1
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        part = torch.empty(dim, shifts, 2 * block, device=x.device, dtype=acc)
        scratch = torch.empty(dim * shifts * block * block, device=x.device, dtype=acc)
        init = initial_states if initial_states is not None else x
        launch(_toeplitz_dw_kernel, (dim, shifts), x, g, init, part, scratch, batch, seqlen,
               *x.stride(), *g.stride(), *init.stride(),
               WIDTH=width, BLOCK=block, ROWS=rows, SHIFTS=shifts,
               HAS_INIT=initial_states is not None,
               DOT_FP32=INTERPRETED and x.dtype == torch.bfloat16, PRECISION="ieee",
               ACC=tl.float64 if acc == torch.float64 else tl.float32, num_warps=warps)
        dw = torch.zeros(dim, width, device=x.device, dtype=acc)
        for m in range(shifts):  # diagonal c of shift m is tap c + WIDTH − BLOCK − m·BLOCK
            low = width - block - m * block
            k0, k1 = max(0, low), min(width, low + 2 * block - 1)
            if k0 < k1:
                dw[:, k0:k1] += part[:, m, k0 - low:k1 - low]
        dw = dw.to(weight.dtype)
    dh = None
    if needs[2]:
        head = g[..., :width - 1]
        if head.shape[-1] < width - 1:  # (a sequence shorter than the state: zeros after it)
            head = torch.nn.functional.pad(head, (0, width - 1 - head.shape[-1]))
        dh = _launch(head, weight.flip(-1), None, None, torch.empty_like(head))
    return dx, dw, dh
