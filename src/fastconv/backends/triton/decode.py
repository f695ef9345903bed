"""One decode step of a causal depthwise conv1d in one kernel (``decode.causal_conv1d_update``
for one token): each program reads its channels' state rows and the token, writes the output
(``bias + Σ weight · window``, float32 accumulation, SiLU optional) and shifts the state rows
left by one in place, the token last. torch's step (cat, copy, conv1d, silu) is four
launches; this is one, and reads and writes each state element once.

Each program owns whole state rows (every position of its channels), and reads them all
before a barrier, writes after it: rows are never shared between programs unless the state
pool's indices repeat a row (the caller's contract, as for ``index_copy_``). An index
outside the pool (causal-conv1d's pad slot, −1) is a padded entry: its program reads and
writes no state and stores zeros.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import cdiv, launch


@triton.jit
def _decode_kernel(x_ptr, state_ptr, idx_ptr, w_ptr, b_ptr, out_ptr, dim, state_len, pool,
                   sx_b, sx_d, ss_b, ss_d, ss_l, sw_d, sw_k, so_b, so_d,
                   WIDTH: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,
                   HAS_IDX: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < dim
    row = b
    if HAS_IDX:
        row = tl.load(idx_ptr + b).to(tl.int64)
    # a padded entry's row has no positions (a scalar condition, not a mask term: Triton
    # 3.9's interpreter refuses a block mask combined with one)
    row_len = tl.where((row >= 0) & (row < pool), state_len, 0)
    pos = tl.arange(0, BLOCK_L)
    rows = state_ptr + row * ss_b + d[:, None].to(tl.int64) * ss_d
    inside = dmask[:, None] & (pos < row_len)[None, :]
    state = tl.load(rows + pos[None, :] * ss_l, mask=inside, other=0.0)
    later = tl.load(rows + (pos[None, :] + 1) * ss_l,
                    mask=dmask[:, None] & (pos + 1 < row_len)[None, :], other=0.0)
    token = tl.load(x_ptr + b * sx_b + d * sx_d, mask=dmask, other=0.0)
    # tap j < WIDTH - 1 multiplies state position state_len - (WIDTH - 1) + j; the last, x
    tap = pos - (state_len - (WIDTH - 1))
    wv = tl.load(w_ptr + d[:, None] * sw_d + tap[None, :] * sw_k,
                 mask=inside & (tap >= 0)[None, :], other=0.0)
    acc = tl.sum(state.to(tl.float32) * wv.to(tl.float32), axis=1)
    w_last = tl.load(w_ptr + d * sw_d + (WIDTH - 1) * sw_k, mask=dmask, other=0.0)
    acc += token.to(tl.float32) * w_last.to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(b_ptr + d, mask=dmask, other=0.0).to(tl.float32)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    acc = tl.where(row_len > 0, acc, 0.0)
    tl.store(out_ptr + b * so_b + d * so_d, acc.to(out_ptr.dtype.element_ty), mask=dmask)
    tl.debug_barrier()  # every read of the rows above happens before any write below
    shifted = tl.where((pos == state_len - 1)[None, :], token[:, None].to(later.dtype), later)
    tl.store(rows + pos[None, :] * ss_l, shifted.to(state_ptr.dtype.element_ty), mask=inside)


def decode_step(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None, silu: bool,
                indices: torch.Tensor | None) -> torch.Tensor:
    """The output of one token ``x`` (batch, dim), ``state`` (rows, dim, state_len) shifted
    in place (the rows ``indices`` names, else row b for batch entry b)."""
    batch, dim = x.shape
    state_len = state.shape[-1]
    width = weight.shape[1]
    out = torch.empty_like(x)
    block_l = max(2, triton.next_power_of_2(state_len))
    block_d = max(16, min(256, 4096 // block_l))
    launch(_decode_kernel, (batch, cdiv(dim, block_d)),
           x, state, x if indices is None else indices, weight,
           x if bias is None else bias, out, dim, state_len, state.shape[0],
           x.stride(0), x.stride(1), state.stride(0), state.stride(1), state.stride(2),
           weight.stride(0), weight.stride(1), out.stride(0), out.stride(1),
           WIDTH=width, BLOCK_D=block_d, BLOCK_L=block_l, HAS_IDX=indices is not None,
           HAS_BIAS=bias is not None, SILU=silu, num_warps=4)
    return out
