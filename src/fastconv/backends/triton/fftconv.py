"""long_conv1d's fused FFT route: a causal depthwise convolution whose filter is as long as
the sequence, one program per channel, the whole convolution on chip (FlashFFTConv's
scheme: DFTs as matrix products on the tensor cores).

Sizes. ``N`` is the power of two ≥ ``max(256, seqlen + K − 1)`` (the product of two
circular transforms of length N is the linear convolution: no wrap-around reaches the first
``seqlen`` outputs), split ``N = N1 · N2`` with ``N1 ≥ N2`` (both powers of two ≥ 16). A
sequence is an ``(R, N2)`` matrix ``A[r, c] = x[N2·r + c]`` (``R``: its rows that hold
positions below ``seqlen``, a power of two ≥ 16 and ≤ N1; the rows after are zero).

Transform (two stages, each a matrix product): ``B = F1[:, :R] @ A`` (N1 × N2, F1 the
N1-point DFT), ``C = B ∘ T`` (the twiddles ``T[k1, n2] = ω_N^(k1·n2)``), ``D = C @ F2`` (F2
the N2-point DFT): ``D[k1, k2]`` is the spectrum at ``k1 + N1·k2``. The product with the
filter's spectrum (computed the same way, once per channel, kept for the channel's batch
rows) is pointwise in that order, and the inverse runs the stages backwards with conjugate
matrices, only for the output's R rows. Operands of the products are in the input's 16-bit
dtype, accumulation in float32: 12 products for a row (2 for the real first stage, 4 for
each complex stage, 2 for the real last), x read once and the output written once.

Measured on an H200 (bf16, batch 4, dim 768, K = seqlen; the probe in
``benchmarks/results/seqconv/2026-11-29-longconv``): 2.75x a torch.fft implementation at
seqlen 1K and 2K, 0.94x at 4K (N = 8192: the tiles no longer fit the register file), so the
route is offered up to ``MAX_N`` and chosen by measurement (``long_conv1d``).

Backward (``long_conv_backward``), one program per channel too: the filter's spectrum W
once; per batch row the output gradient's spectrum G, dx = IDFT(G ∘ conj(W)) (a
correlation: no wrap-around reaches the first ``seqlen`` lags, as N ≥ seqlen + K − 1), and
x's spectrum X added into Σ G ∘ conj(X) (float32, in batch order); then dw = the first K
values of its inverse.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .launch import INTERPRETED, launch

#: the largest transform offered (see the module docstring: 0.94x torch.fft at 8192)
MAX_N = 4096
#: the smallest transform (every factor ≥ 16, tl.dot's least size)
MIN_N = 256


def transform_size(seqlen: int, k: int) -> int:
    """N: the power of two ≥ ``max(MIN_N, seqlen + k − 1)``."""
    return max(MIN_N, triton.next_power_of_2(seqlen + k - 1))


def eligible(x: torch.Tensor, k: int) -> bool:
    """Whether the fused route runs ``long_conv1d(x, weight of length k)``: 16-bit inputs
    (its products' operands; float32 inputs would lose their precision), a transform of at
    most ``MAX_N`` points, at most 65,535 channels (the grid), and kernels compiled for the
    tensor's device (not the interpreter's, which runs on CPU tensors only)."""
    return x.dtype in (torch.float16, torch.bfloat16) and \
        transform_size(x.shape[-1], k) <= MAX_N and 0 < x.shape[1] <= 65535 \
        and INTERPRETED == (x.device.type == "cpu")


@triton.jit
def _cmm(ar, ai, br, bi, DT: tl.constexpr):
    """(ar + i·ai) @ (br + i·bi): operands in DT, float32 accumulation."""
    ar, ai, br, bi = ar.to(DT), ai.to(DT), br.to(DT), bi.to(DT)
    return tl.dot(ar, br) - tl.dot(ai, bi), tl.dot(ar, bi) + tl.dot(ai, br)


@triton.jit
def _spectrum(src, stride, length, f1r, f1i, tr, ti, f2r, f2i, N1: tl.constexpr,
              N2: tl.constexpr, R: tl.constexpr, DT: tl.constexpr):
    """The N-point DFT of ``length`` real values at ``src`` (``stride`` apart, zeros after),
    as D[k1, k2] (module docstring); the matrices are loaded by the caller."""
    r = tl.arange(0, R)
    c = tl.arange(0, N2)
    pos = r[:, None] * N2 + c[None, :]
    a = tl.load(src + pos * stride, mask=pos < length, other=0.0).to(DT)
    br = tl.dot(f1r.to(DT), a)
    bi = tl.dot(f1i.to(DT), a)
    return _cmm(br * tr - bi * ti, br * ti + bi * tr, f2r, f2i, DT)


@triton.jit
def _inverse(yr, yi, f2r, f2i, tr, ti, g1r, g1i, inv_n, DT: tl.constexpr):
    """The first R·N2 values of the real inverse DFT of Y (in D order):
    E = (Y / N) @ conj(F2), G = E ∘ conj(T), out = Re(conj(F1)[:R] @ G). Y is scaled first:
    a product of two spectra (the filter's gradient sums x's times the output gradient's
    over the batch) summed over N2 terms overflowed float16 operands (65,504)."""
    er, ei = _cmm(yr * inv_n, yi * inv_n, f2r, -f2i, DT)
    gr = er * tr + ei * ti
    gi = ei * tr - er * ti
    return tl.dot(g1r.to(DT), gr.to(DT)) - tl.dot(g1i.to(DT), gi.to(DT))


@triton.jit
def _load_matrices(f1r_ptr, f1i_ptr, tw_r_ptr, tw_i_ptr, f2r_ptr, f2i_ptr, g1r_ptr, g1i_ptr,
                   N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr):
    """F1[:, :R], T, F2 and conj(F1)[:R, :] (real, imaginary), float32."""
    k1 = tl.arange(0, N1)
    c = tl.arange(0, N2)
    r = tl.arange(0, R)
    f1 = k1[:, None] * R + r[None, :]
    tw = k1[:, None] * N2 + c[None, :]
    f2 = c[:, None] * N2 + c[None, :]
    g1 = r[:, None] * N1 + k1[None, :]
    return (tl.load(f1r_ptr + f1), tl.load(f1i_ptr + f1), tl.load(tw_r_ptr + tw),
            tl.load(tw_i_ptr + tw), tl.load(f2r_ptr + f2), tl.load(f2i_ptr + f2),
            tl.load(g1r_ptr + g1), tl.load(g1i_ptr + g1))


@triton.jit
def _long_conv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, f1r_ptr, f1i_ptr, tw_r_ptr, tw_i_ptr,
                      f2r_ptr, f2i_ptr, g1r_ptr, g1i_ptr, batch, seqlen, K,
                      sx_b, sx_d, sx_t, sw_d, sw_k, sy_b, sy_d, sy_t, inv_n,
                      N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr,
                      HAS_BIAS: tl.constexpr, DT: tl.constexpr):
    """y = IDFT(DFT(x) ∘ DFT(w)) + bias, one program per channel over the batch."""
    d = tl.program_id(0).to(tl.int64)
    f1r, f1i, tr, ti, f2r, f2i, g1r, g1i = _load_matrices(
        f1r_ptr, f1i_ptr, tw_r_ptr, tw_i_ptr, f2r_ptr, f2i_ptr, g1r_ptr, g1i_ptr, N1, N2, R)
    hr, hi = _spectrum(w_ptr + d * sw_d, sw_k, K, f1r, f1i, tr, ti, f2r, f2i, N1, N2, R, DT)
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(b_ptr + d).to(tl.float32)
    pos = tl.arange(0, R)[:, None] * N2 + tl.arange(0, N2)[None, :]
    x_row = x_ptr + d * sx_d  # (pointers advanced row by row: no 32-bit batch offsets)
    y_row = y_ptr + d * sy_d
    for _ in range(batch):
        dr, di = _spectrum(x_row, sx_t, seqlen, f1r, f1i, tr, ti, f2r, f2i, N1, N2, R, DT)
        out = _inverse(dr * hr - di * hi, dr * hi + di * hr, f2r, f2i, tr, ti, g1r, g1i,
                       inv_n, DT) + bias
        tl.store(y_row + pos * sy_t, out.to(y_ptr.dtype.element_ty), mask=pos < seqlen)
        x_row += sx_b
        y_row += sy_b


@triton.jit
def _long_conv_backward_kernel(x_ptr, w_ptr, g_ptr, dx_ptr, dw_ptr, f1r_ptr, f1i_ptr,
                               tw_r_ptr, tw_i_ptr, f2r_ptr, f2i_ptr, g1r_ptr, g1i_ptr,
                               batch, seqlen, K, sx_b, sx_d, sx_t, sw_d, sw_k, sg_b, sg_d,
                               sg_t, sdx_b, sdx_d, sdx_t, sdw_d, sdw_k, inv_n,
                               N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr,
                               NEED_DX: tl.constexpr, NEED_DW: tl.constexpr,
                               DT: tl.constexpr):
    """The gradients of x and w for one channel: dx = IDFT(G ∘ conj(W)) (the output
    gradient's correlation with the filter) row by row, dw = IDFT(Σ_rows G ∘ conj(X))[:K]
    (its correlation with x, the spectra summed over the batch in a fixed order)."""
    d = tl.program_id(0).to(tl.int64)
    f1r, f1i, tr, ti, f2r, f2i, g1r, g1i = _load_matrices(
        f1r_ptr, f1i_ptr, tw_r_ptr, tw_i_ptr, f2r_ptr, f2i_ptr, g1r_ptr, g1i_ptr, N1, N2, R)
    pos = tl.arange(0, R)[:, None] * N2 + tl.arange(0, N2)[None, :]
    if NEED_DX:
        hr, hi = _spectrum(w_ptr + d * sw_d, sw_k, K, f1r, f1i, tr, ti, f2r, f2i, N1, N2, R,
                           DT)
    acc_r = tl.zeros([N1, N2], dtype=tl.float32)
    acc_i = tl.zeros([N1, N2], dtype=tl.float32)
    x_row = x_ptr + d * sx_d
    g_row = g_ptr + d * sg_d
    dx_row = dx_ptr + d * sdx_d
    for _ in range(batch):
        gr, gi = _spectrum(g_row, sg_t, seqlen, f1r, f1i, tr, ti, f2r, f2i, N1, N2, R, DT)
        if NEED_DX:
            dx = _inverse(gr * hr + gi * hi, gi * hr - gr * hi, f2r, f2i, tr, ti, g1r, g1i,
                          inv_n, DT)
            tl.store(dx_row + pos * sdx_t, dx.to(dx_ptr.dtype.element_ty), mask=pos < seqlen)
        if NEED_DW:
            xr, xi = _spectrum(x_row, sx_t, seqlen, f1r, f1i, tr, ti, f2r, f2i, N1, N2, R, DT)
            acc_r += gr * xr + gi * xi
            acc_i += gi * xr - gr * xi
        x_row += sx_b
        g_row += sg_b
        dx_row += sdx_b
    if NEED_DW:
        dw = _inverse(acc_r, acc_i, f2r, f2i, tr, ti, g1r, g1i, inv_n, DT)
        tl.store(dw_ptr + d * sdw_d + pos * sdw_k, dw.to(dw_ptr.dtype.element_ty),
                 mask=pos < K)


def _sizes(seqlen: int, k: int) -> tuple[int, int, int, int]:
    """(N, N1, N2, R) of a filter of ``k`` taps over ``seqlen`` positions (K ≤ seqlen: the
    transform reads the filter's first R·N2 ≥ seqlen taps only)."""
    if k > seqlen:
        raise ValueError(f"a filter of {k} taps for {seqlen} positions")
    n = transform_size(seqlen, k)
    n1, n2 = split(n)
    return n, n1, n2, max(16, triton.next_power_of_2(triton.cdiv(seqlen, n2)))


def split(n: int) -> tuple[int, int]:
    """(N1, N2) with N1 · N2 = n, N1 = N2 or 2·N2 (N1 ≥ N2: the complex products cost
    N1 · N2² multiply-adds each)."""
    n2 = 1 << (n.bit_length() - 1) // 2
    return n // n2, n2


_MATRICES: dict = {}


def _matrices(n1: int, n2: int, rows: int, device: torch.device) -> list[torch.Tensor]:
    """F1[:, :R], T, F2 and conj(F1)[:R, :], real and imaginary parts, float32 on
    ``device`` (made once per size and device, in float64: a CUDA-graph capture finds them
    made by the eager call that chose this route)."""
    key = (n1, n2, rows, str(device))
    if key not in _MATRICES:
        k1 = torch.arange(n1, dtype=torch.float64)
        r = torch.arange(rows, dtype=torch.float64)
        c = torch.arange(n2, dtype=torch.float64)
        f1 = torch.exp(-2j * math.pi * torch.outer(k1, r) / n1)
        tw = torch.exp(-2j * math.pi * torch.outer(k1, c) / (n1 * n2))
        f2 = torch.exp(-2j * math.pi * torch.outer(c, c) / n2)
        g1 = torch.exp(2j * math.pi * torch.outer(r, k1) / n1)
        _MATRICES[key] = [t.to(device, torch.float32).contiguous()
                          for m in (f1, tw, f2, g1) for t in (m.real, m.imag)]
    return _MATRICES[key]


_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def long_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``long_conv1d(x, weight, bias)`` in one kernel (no autograd here). ``x`` (batch, dim,
    seqlen) and ``weight`` (dim, K) in any strides; float32 runs too (its products' operands
    in float32: the CPU tests' interpreter), but ``eligible`` offers the route for 16-bit
    inputs only. ``K ≤ seqlen`` (``long_conv1d`` checks it)."""
    batch, dim, seqlen = x.shape
    k = weight.shape[1]
    n, n1, n2, rows = _sizes(seqlen, k)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    launch(_long_conv_kernel, (dim,), x, weight, y if bias is None else bias.contiguous(), y,
           *_matrices(n1, n2, rows, x.device), batch, seqlen, k, *x.stride(), *weight.stride(),
           *y.stride(), 1.0 / n, N1=n1, N2=n2, R=rows, HAS_BIAS=bias is not None,
           DT=_DTYPES[x.dtype], num_warps=4, num_stages=1)
    return y


def long_conv_backward(x: torch.Tensor, weight: torch.Tensor, grad: torch.Tensor,
                       need_dx: bool = True, need_dw: bool = True) -> tuple:
    """(dx, dw) of :func:`long_conv` for the output gradient ``grad`` (None where not
    needed), one kernel: a program per channel, the filter's spectrum once, the output
    gradient's and x's spectra per batch row, the filter's gradient summed over the batch
    in the frequency domain (a fixed order: deterministic). The bias's gradient (a sum) is
    the caller's."""
    batch, dim, seqlen = x.shape
    k = weight.shape[1]
    n, n1, n2, rows = _sizes(seqlen, k)
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if need_dx else None
    dw = torch.empty_like(weight, memory_format=torch.contiguous_format) if need_dw else None
    launch(_long_conv_backward_kernel, (dim,), x, weight, grad, x if dx is None else dx,
           weight if dw is None else dw, *_matrices(n1, n2, rows, x.device), batch, seqlen, k,
           *x.stride(), *weight.stride(), *grad.stride(),
           *(x if dx is None else dx).stride(), *(weight if dw is None else dw).stride(),
           1.0 / n, N1=n1, N2=n2, R=rows, NEED_DX=need_dx, NEED_DW=need_dw,
           DT=_DTYPES[x.dtype], num_warps=4, num_stages=1)
    return dx, dw
