"""One decode step of a causal depthwise conv1d in one kernel (``decode.causal_conv1d_update``
for one token): each program reads its channels' state rows and the token, writes the output
(``bias + Σ weight · window``, float32 accumulation, SiLU optional) and shifts the state rows
left by one in place, the token last. torch's step (cat, copy, conv1d, silu) is four
launches; this is one, and reads and writes each state element once.

A program owns ``BLOCK_D`` channels' whole state rows and treats them as one flat range of
``BLOCK_D · state_len`` elements (contiguous when the rows are): the shift is a load of
each element's successor and a store of the range, the window's taps one vector of the
channels per tap. (The range as a (channels, positions) tile ran at 21 % of the HBM floor
at batch 256 in graph time, the flat range at 45 %: ``results/seqconv/2026-11-29-decode/``.)
Every read of the rows happens before a barrier, every write after it: rows are never shared
between programs unless the state pool's indices repeat a row (the caller's contract, as for
``index_copy_``). An index outside the pool (causal-conv1d's pad slot, −1) is a padded entry:
its program reads and writes no state and stores zeros.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import cdiv, launch

#: State elements per program (a power of two): channels per program are the most whose
#: rows fit, at most ``MAX_BLOCK_D`` (128 channels of 3 positions were the fastest tile
#: measured at batch 1, 16 and 256).
BLOCK_ELEMENTS = 512
MAX_BLOCK_D = 128
#: Widths whose taps are unrolled (a loop beyond: width 256 unrolled compiles slowly)
UNROLLED_WIDTH = 16


@triton.jit
def _tap(acc, rows, w_ptr, ch, c, cmask, used_d, p, j, ss_d, ss_l, sw_d, sw_k):
    s = tl.load(rows + c * ss_d + p * ss_l, mask=c < used_d, other=0.0)
    wv = tl.load(w_ptr + ch * sw_d + j * sw_k, mask=cmask, other=0.0)
    return acc + s.to(tl.float32) * wv.to(tl.float32)


@triton.jit
def _decode_kernel(x_ptr, state_ptr, idx_ptr, w_ptr, b_ptr, out_ptr, dim, pool,
                   sx_b, sx_d, ss_b, ss_d, ss_l, sw_d, sw_k, so_b, so_d,
                   STATE_LEN: tl.constexpr, WIDTH: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_F: tl.constexpr, CONTIGUOUS: tl.constexpr, HAS_IDX: tl.constexpr,
                   HAS_BIAS: tl.constexpr, SILU: tl.constexpr, UNROLL: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    d0 = tl.program_id(1) * BLOCK_D
    c = tl.arange(0, BLOCK_D)
    ch = d0 + c
    cmask = ch < dim
    row = b
    if HAS_IDX:
        row = tl.load(idx_ptr + b).to(tl.int64)
    # a padded entry's program owns no channels' state (scalar bounds, not mask terms:
    # Triton 3.9's interpreter refuses a block mask combined with a scalar condition)
    used = (row >= 0) & (row < pool)
    used_d = tl.where(used, dim - d0, 0)  # channels of this program whose rows it owns
    rows = state_ptr + tl.where(used, row, 0) * ss_b + d0.to(tl.int64) * ss_d
    token = tl.load(x_ptr + b * sx_b + ch * sx_d, mask=cmask, other=0.0)
    w_last = tl.load(w_ptr + ch * sw_d + (WIDTH - 1) * sw_k, mask=cmask, other=0.0)
    acc = token.to(tl.float32) * w_last.to(tl.float32)
    # tap j < WIDTH - 1 multiplies state position STATE_LEN - (WIDTH - 1) + j; the last, x
    if UNROLL:
        for j in tl.static_range(WIDTH - 1):
            acc = _tap(acc, rows, w_ptr, ch, c, cmask, used_d, STATE_LEN - (WIDTH - 1) + j, j,
                       ss_d, ss_l, sw_d, sw_k)
    else:
        for j in tl.range(0, WIDTH - 1):
            acc = _tap(acc, rows, w_ptr, ch, c, cmask, used_d, STATE_LEN - (WIDTH - 1) + j, j,
                       ss_d, ss_l, sw_d, sw_k)
    if HAS_BIAS:
        acc += tl.load(b_ptr + ch, mask=cmask, other=0.0).to(tl.float32)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    acc = tl.where(used, acc, 0.0)
    tl.store(out_ptr + b * so_b + ch * so_d, acc.to(out_ptr.dtype.element_ty), mask=cmask)
    # the rows as one range: element i is channel i // STATE_LEN's position i % STATE_LEN
    i = tl.arange(0, BLOCK_F)
    inside = i < tl.minimum(used_d, BLOCK_D) * STATE_LEN
    last = (i % STATE_LEN) == STATE_LEN - 1
    if CONTIGUOUS:  # (ss_d == STATE_LEN and ss_l == 1)
        at = i
    else:
        at = (i // STATE_LEN) * ss_d + (i % STATE_LEN) * ss_l
    later = tl.load(rows + at + ss_l, mask=inside & ~last, other=0.0)
    newest = tl.load(x_ptr + b * sx_b + (d0 + i // STATE_LEN) * sx_d, mask=inside & last,
                     other=0.0)
    tl.debug_barrier()  # every read of the rows above happens before any write below
    tl.store(rows + at, tl.where(last, newest.to(later.dtype), later), mask=inside)


def decode_step(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None, silu: bool,
                indices: torch.Tensor | None) -> torch.Tensor:
    """The output of one token ``x`` (batch, dim), ``state`` (rows, dim, state_len) shifted
    in place (the rows ``indices`` names, else row b for batch entry b)."""
    batch, dim = x.shape
    state_len = state.shape[-1]
    width = weight.shape[1]
    out = torch.empty_like(x)
    fit = max(1, BLOCK_ELEMENTS // state_len)
    block_d = min(MAX_BLOCK_D, max(2, 1 << (fit.bit_length() - 1)))  # a power of two
    contiguous = state.stride(2) == 1 and state.stride(1) == state_len
    launch(_decode_kernel, (batch, cdiv(dim, block_d)),
           x, state, x if indices is None else indices, weight,
           x if bias is None else bias, out, dim, state.shape[0],
           x.stride(0), x.stride(1), state.stride(0), state.stride(1), state.stride(2),
           weight.stride(0), weight.stride(1), out.stride(0), out.stride(1),
           STATE_LEN=state_len, WIDTH=width, BLOCK_D=block_d,
           BLOCK_F=triton.next_power_of_2(block_d * state_len), CONTIGUOUS=contiguous,
           HAS_IDX=indices is not None, HAS_BIAS=bias is not None, SILU=silu,
           UNROLL=width <= UNROLLED_WIDTH, num_warps=4)
    return out
