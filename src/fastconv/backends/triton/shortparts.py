"""The parts that causal_conv1d's short-filter kernels share (``shortconv.py``'s columns and
``shortrows.py``'s rows): SiLU's sigmoid, a program's taps and bias, and the weight's and
bias's gradients, summed per window in the backward pass and then added in a fixed order
(deterministic) by :func:`_sums_kernel`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import INTERPRETED, cdiv, launch

#: σ by approximate PTX instructions (:func:`_sigmoid`): compiled kernels only
FAST_SIGMOID = tl.constexpr(not INTERPRETED)


@triton.jit
def _sigmoid(v):
    """σ(v) in float32: 1 / (1 + 2^(−v·log2 e)) by PTX's approximate ex2 and rcp, flushing
    subnormals (four instructions; tl.sigmoid's exp is the same ex2 behind a range check,
    its division ~5 instructions more), in compiled kernels; tl.sigmoid in the interpreter,
    which runs no PTX."""
    if FAST_SIGMOID:
        return tl.inline_asm_elementwise(
            "{ .reg .f32 t; mul.f32 t, $1, 0fBFB8AA3B; ex2.approx.ftz.f32 t, t; "
            "add.f32 t, t, 0f3F800000; rcp.approx.ftz.f32 $0, t; }",
            "=f,f", [v], dtype=tl.float32, is_pure=True, pack=1)
    return tl.sigmoid(v)


@triton.jit
def _tap(w_ptr, d, dmask, sw_d, sw_k, K: tl.constexpr, WIDTH: tl.constexpr):
    """Tap K of channels d in float32 (zero from WIDTH on, not loaded)."""
    if K < WIDTH:
        return tl.load(w_ptr + d * sw_d + K * sw_k, mask=dmask, other=0.0).to(tl.float32)
    return tl.zeros(d.shape, tl.float32)


@triton.jit
def _taps(w_ptr, b_ptr, d, dmask, sw_d, sw_k, WIDTH: tl.constexpr, HAS_BIAS: tl.constexpr):
    """(the taps of channels d in float32, seqargs.SHORT_MAX_WIDTH of them (zero past
    WIDTH); the bias or zeros)."""
    w = (_tap(w_ptr, d, dmask, sw_d, sw_k, 0, WIDTH), _tap(w_ptr, d, dmask, sw_d, sw_k, 1, WIDTH),
         _tap(w_ptr, d, dmask, sw_d, sw_k, 2, WIDTH), _tap(w_ptr, d, dmask, sw_d, sw_k, 3, WIDTH),
         _tap(w_ptr, d, dmask, sw_d, sw_k, 4, WIDTH), _tap(w_ptr, d, dmask, sw_d, sw_k, 5, WIDTH),
         _tap(w_ptr, d, dmask, sw_d, sw_k, 6, WIDTH), _tap(w_ptr, d, dmask, sw_d, sw_k, 7, WIDTH),
         _tap(w_ptr, d, dmask, sw_d, sw_k, 8, WIDTH), _tap(w_ptr, d, dmask, sw_d, sw_k, 9, WIDTH),
         _tap(w_ptr, d, dmask, sw_d, sw_k, 10, WIDTH),
         _tap(w_ptr, d, dmask, sw_d, sw_k, 11, WIDTH),
         _tap(w_ptr, d, dmask, sw_d, sw_k, 12, WIDTH),
         _tap(w_ptr, d, dmask, sw_d, sw_k, 13, WIDTH),
         _tap(w_ptr, d, dmask, sw_d, sw_k, 14, WIDTH),
         _tap(w_ptr, d, dmask, sw_d, sw_k, 15, WIDTH),
         _tap(w_ptr, d, dmask, sw_d, sw_k, 16, WIDTH))
    bias = tl.zeros(d.shape, tl.float32)
    if HAS_BIAS:
        bias = tl.load(b_ptr + d, mask=dmask, other=0.0).to(tl.float32)
    return w, bias


@triton.jit
def _store_part(part_ptr, part, b, d, dmask, dim, WIDTH: tl.constexpr, TAPS: tl.constexpr):
    """Stores a backward window's sums of the weight's and bias's gradients ([BLOCK_D, TAPS]:
    taps 0 … WIDTH − 1, then the bias) at its row of ``part`` ([batch, windows, dim, TAPS])."""
    taps = tl.arange(0, TAPS)[None, :]
    out = part_ptr + ((b * tl.num_programs(0) + tl.program_id(0)) * dim
                      + d[:, None].to(tl.int64)) * TAPS
    tl.store(out + taps, part, mask=dmask[:, None] & (taps <= WIDTH))


@triton.jit
def _sums_kernel(part_ptr, dw_ptr, db_ptr, rows, dim, WIDTH: tl.constexpr, TAPS: tl.constexpr,
                 HAS_BIAS: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    # the weight's and bias's gradients of BLOCK_D channels: the backward's per-window sums
    # (part: [rows, dim, TAPS] float32), ROWS at a time, added in a fixed order, written in
    # the weight's dtype
    r = tl.arange(0, ROWS)[:, None, None]
    d = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)[None, :, None]
    taps = tl.arange(0, TAPS)[None, None, :]
    mask = (d < dim) & (taps <= WIDTH)
    acc = tl.zeros([BLOCK_D, TAPS], tl.float32)
    for r0 in range(0, rows, ROWS):
        acc += tl.sum(tl.load(part_ptr + ((r0 + r) * dim + d.to(tl.int64)) * TAPS + taps,
                              mask=mask & (r0 + r < rows), other=0.0), axis=0)
    d = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)[:, None]
    taps = tl.arange(0, TAPS)[None, :]
    tl.store(dw_ptr + d * WIDTH + taps, acc.to(dw_ptr.dtype.element_ty),
             mask=(d < dim) & (taps < WIDTH))
    if HAS_BIAS:
        tl.store(db_ptr + d + 0 * taps, acc.to(db_ptr.dtype.element_ty),
                 mask=(d < dim) & (taps == WIDTH))


#: (channels, rows) per program and step of the sums (:func:`_sums_kernel`): 2.3-6.1 µs a
#: call in CUDA graphs at 16-32 rows of 1,024-8,192 channels and widths 4-16, against 6.7-9.0
#: for torch's sum and casts (H200, results/seqconv/2026-11-29-sigmoid/probe-sums-*.log)
SUMS_TILE = (16, 4)


def backward_buffers(x: torch.Tensor, width: int, windows: int, init_grad: bool) -> tuple:
    """A backward's outputs before its pass: (dx like x, the initial states' gradient
    (batch, dim, width − 1) or dx where not asked, the per-window sums of the weight's and
    bias's gradients [batch, windows, dim, TAPS] float32, TAPS ≥ width + 1)."""
    batch, dim, _ = x.shape
    dx = torch.empty_like(x)
    dh = torch.empty((batch, dim, width - 1), device=x.device, dtype=x.dtype) \
        if init_grad else dx
    part = torch.empty((batch, windows, dim, triton.next_power_of_2(width + 1)),
                       device=x.device, dtype=torch.float32)
    return dx, dh, part


def weight_sums(part: torch.Tensor, weight: torch.Tensor, bias) -> tuple:
    """(d weight, d bias or None) in their own dtypes: the per-window sums ``part``
    (:func:`backward_buffers`) added in a fixed order (:func:`_sums_kernel`)."""
    batch, windows, dim, taps = part.shape
    width = weight.shape[1]
    dw = torch.empty((dim, width), device=part.device, dtype=weight.dtype)
    db = torch.empty(dim, device=part.device, dtype=bias.dtype) if bias is not None else dw
    launch(_sums_kernel, (cdiv(dim, SUMS_TILE[0]),), part, dw, db, batch * windows, dim,
           WIDTH=width, TAPS=taps, HAS_BIAS=bias is not None, BLOCK_D=SUMS_TILE[0],
           ROWS=SUMS_TILE[1])
    return dw, db if bias is not None else None
