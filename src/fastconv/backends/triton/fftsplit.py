"""long_conv1d's fused FFT route past ``fftconv.MAX_N`` points: the 2M-point transform
(M = the power of two ≥ ``max(256, seqlen)``) as its even and odd bins, two M-point halves
in tiles of fftconv's M-point kernel (whose N-point tiles leave the register file from
N = 8192 on).

- Even bins: the M-point DFT of x. Their product with the filter's even bins, inverted,
  is the circular convolution mod M: z0[t] = y[t] + y[t + M].
- Odd bins: the M-point DFT of x[n]·ω^n (ω = exp(−2πi / 2M)). Inverted and multiplied by
  ω^(−t), their product gives the negacyclic convolution u1[t] = y[t] − y[t + M].
- So y[t] = (z0[t] + u1[t]) / 2 for t < seqlen ≤ M (2M ≥ seqlen + K − 1: no wrap-around).

The twist is folded into the odd half's matrices (n = N2·r + c: F1's column r times
ω^(N2·r), the twiddle's column c times ω^c, conjugates for the inverse), so the odd half
costs what the even half costs. Layout and stages as ``fftconv``'s (M = N1·N2, a sequence
an (R, N2) tile), but over blocks of ``BK`` spectrum rows k1: live tiles of (BK, N2), the
row's output accumulated over the blocks, the matrices read where used (L1/L2), and the
filter's two half spectra computed once per channel into a float32 scratch (dim, 4, N1,
N2) read back per block.

Forward: two batch rows as one complex signal x_b + i·x_(b+1) (the filter is real, so the
result is y_b + i·y_(b+1)): 16 tile products a row instead of 24. Backward (one program a
channel, as fftconv's): dx = IDFT(G ∘ conj(W)) row by row; dw = IDFT(Σ_rows G ∘ conj(X))[:K],
the spectra summed in a float32 scratch in batch order (deterministic).

Measured on an H100 (bf16, K = seqlen, CUDA graphs; benchmarks/results/seqconv/
2026-12-07-longconv8k/): forward 2.63x a torch.fft implementation at b4 d768 L4096, 2.33x
at L3000, 2.88x at b8 d1024 L4096, 2.21x at b4 d768 L8192 (BK 32, 8 warps); forward +
backward 1.79x at L4096, 1.17x at L8192. Errors 2.7-4.3e-3 against float64 (bf16's bound:
2e-2). fp16 has not run on a GPU, so the route is offered for bf16 only.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .fftconv import _DTYPES, MAX_N, MIN_N, split, transform_size
from .launch import INTERPRETED, launch

#: the largest half transform offered (measured up to seqlen 8,192)
MAX_M = 8192
#: spectrum rows a block, and warps (the best of the probe at L 3K-8K)
BK = 32
WARPS = 8


def eligible(x: torch.Tensor, k: int) -> bool:
    """Whether this route runs ``long_conv1d(x, weight of length k)``: bfloat16 (the dtype
    measured on a GPU; float32 runs in the interpreter's tests), a transform beyond
    ``fftconv.MAX_N`` whose half fits ``MAX_M``, at most 65,535 channels, and kernels
    compiled for the tensor's device."""
    seqlen = x.shape[-1]
    return x.dtype == torch.bfloat16 and transform_size(seqlen, k) > MAX_N \
        and max(MIN_N, triton.next_power_of_2(seqlen)) <= MAX_M \
        and 0 < x.shape[1] <= 65535 and INTERPRETED == (x.device.type == "cpu")


@triton.jit
def _ld(p, ROWS: tl.constexpr, COLS: tl.constexpr):
    """A row-major (ROWS, COLS) matrix, loaded where it is used."""
    return tl.load(p + tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :])


@triton.jit
def _twiddle_f2(br, bi, k, tr_p, ti_p, f2r_p, f2i_p, N2: tl.constexpr, DT: tl.constexpr):
    """(B ∘ T) @ F2 for the spectrum rows ``k`` of B."""
    tw = k[:, None] * N2 + tl.arange(0, N2)[None, :]
    tr = tl.load(tr_p + tw)
    ti = tl.load(ti_p + tw)
    cr = (br * tr - bi * ti).to(DT)
    ci = (br * ti + bi * tr).to(DT)
    f2r = _ld(f2r_p, N2, N2)
    f2i = _ld(f2i_p, N2, N2)
    return tl.dot(cr, f2r) - tl.dot(ci, f2i), tl.dot(cr, f2i) + tl.dot(ci, f2r)


@triton.jit
def _f2_twiddle(yr, yi, k, inv_n, f2r_p, f2i_p, tr_p, ti_p, N2: tl.constexpr,
                DT: tl.constexpr):
    """((Y / 2M) @ conj(F2)) ∘ conj(T) for the spectrum rows ``k`` of Y, in DT (Y scaled
    first: fftconv._inverse's float16 overflow)."""
    yr = (yr * inv_n).to(DT)
    yi = (yi * inv_n).to(DT)
    f2r = _ld(f2r_p, N2, N2)
    f2i = _ld(f2i_p, N2, N2)
    er = tl.dot(yr, f2r) + tl.dot(yi, f2i)
    ei = tl.dot(yi, f2r) - tl.dot(yr, f2i)
    tw = k[:, None] * N2 + tl.arange(0, N2)[None, :]
    tr = tl.load(tr_p + tw)
    ti = tl.load(ti_p + tw)
    return (er * tr + ei * ti).to(DT), (ei * tr - er * ti).to(DT)


@triton.jit
def _fwd(a, f1r_p, f1i_p, tr_p, ti_p, f2r_p, f2i_p, j, BK: tl.constexpr, R: tl.constexpr,
         N2: tl.constexpr, DT: tl.constexpr):
    """Spectrum rows j·BK … j·BK + BK − 1 of one half for the real (R, N2) tile ``a``."""
    k = j * BK + tl.arange(0, BK)
    f1 = k[:, None] * R + tl.arange(0, R)[None, :]
    br = tl.dot(tl.load(f1r_p + f1), a)
    bi = tl.dot(tl.load(f1i_p + f1), a)
    return _twiddle_f2(br, bi, k, tr_p, ti_p, f2r_p, f2i_p, N2, DT)


@triton.jit
def _inv(yr, yi, f2r_p, f2i_p, tr_p, ti_p, g1r_p, g1i_p, j, inv_n, BK: tl.constexpr,
         N1: tl.constexpr, R: tl.constexpr, N2: tl.constexpr, DT: tl.constexpr):
    """The spectrum rows' share of the half's real inverse (its first R·N2 values)."""
    k = j * BK + tl.arange(0, BK)
    gr, gi = _f2_twiddle(yr, yi, k, inv_n, f2r_p, f2i_p, tr_p, ti_p, N2, DT)
    g1 = tl.arange(0, R)[:, None] * N1 + k[None, :]
    return tl.dot(tl.load(g1r_p + g1), gr) - tl.dot(tl.load(g1i_p + g1), gi)


@triton.jit
def _fwd2(ar, ai, f1r_p, f1i_p, tr_p, ti_p, f2r_p, f2i_p, j, BK: tl.constexpr,
          R: tl.constexpr, N2: tl.constexpr, DT: tl.constexpr):
    """``_fwd`` of the complex tile ar + i·ai."""
    k = j * BK + tl.arange(0, BK)
    f1 = k[:, None] * R + tl.arange(0, R)[None, :]
    f1r = tl.load(f1r_p + f1)
    f1i = tl.load(f1i_p + f1)
    br = tl.dot(f1r, ar) - tl.dot(f1i, ai)
    bi = tl.dot(f1r, ai) + tl.dot(f1i, ar)
    return _twiddle_f2(br, bi, k, tr_p, ti_p, f2r_p, f2i_p, N2, DT)


@triton.jit
def _inv2(yr, yi, f2r_p, f2i_p, tr_p, ti_p, g1r_p, g1i_p, j, inv_n, BK: tl.constexpr,
          N1: tl.constexpr, R: tl.constexpr, N2: tl.constexpr, DT: tl.constexpr):
    """``_inv`` with the complex result (the two rows' shares: real and imaginary)."""
    k = j * BK + tl.arange(0, BK)
    gr, gi = _f2_twiddle(yr, yi, k, inv_n, f2r_p, f2i_p, tr_p, ti_p, N2, DT)
    g1 = tl.arange(0, R)[:, None] * N1 + k[None, :]
    g1r = tl.load(g1r_p + g1)
    g1i = tl.load(g1i_p + g1)
    return tl.dot(g1r, gr) - tl.dot(g1i, gi), tl.dot(g1r, gi) + tl.dot(g1i, gr)


@triton.jit
def _spectra(src, sk, length, h_row, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr,
             o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, f2r_ptr, f2i_ptr,
             N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
             DT: tl.constexpr):
    """Both half spectra of ``length`` values at ``src`` into the float32 scratch row
    ``h_row`` ((4, N1, N2): even re/im, odd re/im)."""
    pos = tl.arange(0, R)[:, None] * N2 + tl.arange(0, N2)[None, :]
    blk = tl.arange(0, BK)[:, None] * N2 + tl.arange(0, N2)[None, :]
    wa = tl.load(src + pos * sk, mask=pos < length, other=0.0).to(DT)
    for j in range(N1 // BK):
        at = h_row + j * BK * N2 + blk
        hr, hi = _fwd(wa, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr, f2r_ptr, f2i_ptr, j, BK,
                      R, N2, DT)
        tl.store(at, hr)
        tl.store(at + N1 * N2, hi)
        hr, hi = _fwd(wa, o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, f2r_ptr, f2i_ptr, j, BK,
                      R, N2, DT)
        tl.store(at + 2 * N1 * N2, hr)
        tl.store(at + 3 * N1 * N2, hi)


@triton.jit
def _paired_kernel(x_ptr, w_ptr, b_ptr, y_ptr, h_ptr,
                   e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr, e_g1r_ptr, e_g1i_ptr,
                   o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, o_g1r_ptr, o_g1i_ptr,
                   f2r_ptr, f2i_ptr,
                   batch, seqlen, K, sx_b, sx_d, sx_t, sw_d, sw_k, sy_b, sy_d, sy_t, inv_n,
                   N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
                   HAS_BIAS: tl.constexpr, DT: tl.constexpr):
    """y = (z0 + u1) / 2 + bias (module docstring) for one channel, batch rows in pairs."""
    d = tl.program_id(0).to(tl.int64)
    pos = tl.arange(0, R)[:, None] * N2 + tl.arange(0, N2)[None, :]
    blk = tl.arange(0, BK)[:, None] * N2 + tl.arange(0, N2)[None, :]
    h_row = h_ptr + d * (4 * N1 * N2)
    _spectra(w_ptr + d * sw_d, sw_k, K, h_row, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr,
             o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, f2r_ptr, f2i_ptr, N1, N2, R, BK, DT)
    tl.debug_barrier()  # (the spectra's stores before any thread reads them)
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(b_ptr + d).to(tl.float32)
    x_row = x_ptr + d * sx_d  # (pointers advanced row by row: no 32-bit batch offsets)
    y_row = y_ptr + d * sy_d
    for b in range(0, batch, 2):
        # the pair's second row (a mask as tl.where: Triton 3.9's interpreter refuses a
        # scalar condition in &)
        second = tl.where(b + 1 < batch, pos < seqlen, False)
        ar = tl.load(x_row + pos * sx_t, mask=pos < seqlen, other=0.0).to(DT)
        ai = tl.load(x_row + sx_b + pos * sx_t, mask=second, other=0.0).to(DT)
        out_r = tl.zeros([R, N2], dtype=tl.float32)
        out_i = tl.zeros([R, N2], dtype=tl.float32)
        for j in range(N1 // BK):
            at = h_row + j * BK * N2 + blk
            dr, di = _fwd2(ar, ai, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr, f2r_ptr, f2i_ptr,
                           j, BK, R, N2, DT)
            hr = tl.load(at)
            hi = tl.load(at + N1 * N2)
            pr, pi = _inv2(dr * hr - di * hi, dr * hi + di * hr, f2r_ptr, f2i_ptr, e_tr_ptr,
                           e_ti_ptr, e_g1r_ptr, e_g1i_ptr, j, inv_n, BK, N1, R, N2, DT)
            out_r += pr
            out_i += pi
            dr, di = _fwd2(ar, ai, o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, f2r_ptr, f2i_ptr,
                           j, BK, R, N2, DT)
            hr = tl.load(at + 2 * N1 * N2)
            hi = tl.load(at + 3 * N1 * N2)
            pr, pi = _inv2(dr * hr - di * hi, dr * hi + di * hr, f2r_ptr, f2i_ptr, o_tr_ptr,
                           o_ti_ptr, o_g1r_ptr, o_g1i_ptr, j, inv_n, BK, N1, R, N2, DT)
            out_r += pr
            out_i += pi
        tl.store(y_row + pos * sy_t, (out_r + bias).to(y_ptr.dtype.element_ty),
                 mask=pos < seqlen)
        tl.store(y_row + sy_b + pos * sy_t, (out_i + bias).to(y_ptr.dtype.element_ty),
                 mask=second)
        x_row += 2 * sx_b
        y_row += 2 * sy_b


@triton.jit
def _backward_kernel(x_ptr, w_ptr, g_ptr, dx_ptr, dw_ptr, h_ptr, acc_ptr,
                     e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr, e_g1r_ptr, e_g1i_ptr,
                     o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, o_g1r_ptr, o_g1i_ptr,
                     f2r_ptr, f2i_ptr, batch, seqlen, K, sx_b, sx_d, sx_t, sw_d, sw_k,
                     sg_b, sg_d, sg_t, sdx_b, sdx_d, sdx_t, sdw_d, sdw_k, inv_n,
                     N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
                     NEED_DX: tl.constexpr, NEED_DW: tl.constexpr, DT: tl.constexpr):
    """dx = IDFT(G ∘ conj(W)) row by row and dw = IDFT(Σ_rows G ∘ conj(X))[:K] for one
    channel, both through the two halves over blocks of spectrum rows; Σ_rows in the
    float32 scratch ``acc_ptr`` (zeroed by the caller), in batch order."""
    d = tl.program_id(0).to(tl.int64)
    pos = tl.arange(0, R)[:, None] * N2 + tl.arange(0, N2)[None, :]
    blk = tl.arange(0, BK)[:, None] * N2 + tl.arange(0, N2)[None, :]
    h_row = h_ptr + d * (4 * N1 * N2)
    acc_row = acc_ptr + d * (4 * N1 * N2)
    if NEED_DX:
        _spectra(w_ptr + d * sw_d, sw_k, K, h_row, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr,
                 o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, f2r_ptr, f2i_ptr, N1, N2, R, BK,
                 DT)
        tl.debug_barrier()
    x_row = x_ptr + d * sx_d
    g_row = g_ptr + d * sg_d
    dx_row = dx_ptr + d * sdx_d
    for _ in range(batch):
        ga = tl.load(g_row + pos * sg_t, mask=pos < seqlen, other=0.0).to(DT)
        xa = tl.load(x_row + pos * sx_t, mask=pos < seqlen, other=0.0).to(DT)
        out = tl.zeros([R, N2], dtype=tl.float32)
        for j in range(N1 // BK):
            at = j * BK * N2 + blk
            gr, gi = _fwd(ga, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr, f2r_ptr, f2i_ptr, j,
                          BK, R, N2, DT)
            if NEED_DX:
                hr = tl.load(h_row + at)
                hi = tl.load(h_row + at + N1 * N2)
                out += _inv(gr * hr + gi * hi, gi * hr - gr * hi, f2r_ptr, f2i_ptr, e_tr_ptr,
                            e_ti_ptr, e_g1r_ptr, e_g1i_ptr, j, inv_n, BK, N1, R, N2, DT)
            if NEED_DW:
                xr, xi = _fwd(xa, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr, f2r_ptr, f2i_ptr,
                              j, BK, R, N2, DT)
                ae = acc_row + at
                tl.store(ae, tl.load(ae) + gr * xr + gi * xi)
                tl.store(ae + N1 * N2, tl.load(ae + N1 * N2) + gi * xr - gr * xi)
            gr, gi = _fwd(ga, o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, f2r_ptr, f2i_ptr, j,
                          BK, R, N2, DT)
            if NEED_DX:
                hr = tl.load(h_row + at + 2 * N1 * N2)
                hi = tl.load(h_row + at + 3 * N1 * N2)
                out += _inv(gr * hr + gi * hi, gi * hr - gr * hi, f2r_ptr, f2i_ptr, o_tr_ptr,
                            o_ti_ptr, o_g1r_ptr, o_g1i_ptr, j, inv_n, BK, N1, R, N2, DT)
            if NEED_DW:
                xr, xi = _fwd(xa, o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, f2r_ptr, f2i_ptr,
                              j, BK, R, N2, DT)
                ao = acc_row + at + 2 * N1 * N2
                tl.store(ao, tl.load(ao) + gr * xr + gi * xi)
                tl.store(ao + N1 * N2, tl.load(ao + N1 * N2) + gi * xr - gr * xi)
        if NEED_DX:
            tl.store(dx_row + pos * sdx_t, out.to(dx_ptr.dtype.element_ty),
                     mask=pos < seqlen)
        x_row += sx_b
        g_row += sg_b
        dx_row += sdx_b
    if NEED_DW:
        dw = tl.zeros([R, N2], dtype=tl.float32)
        for j in range(N1 // BK):
            at = acc_row + j * BK * N2 + blk
            dw += _inv(tl.load(at), tl.load(at + N1 * N2), f2r_ptr, f2i_ptr, e_tr_ptr,
                       e_ti_ptr, e_g1r_ptr, e_g1i_ptr, j, inv_n, BK, N1, R, N2, DT)
            dw += _inv(tl.load(at + 2 * N1 * N2), tl.load(at + 3 * N1 * N2), f2r_ptr,
                       f2i_ptr, o_tr_ptr, o_ti_ptr, o_g1r_ptr, o_g1i_ptr, j, inv_n, BK, N1,
                       R, N2, DT)
        tl.store(dw_ptr + d * sdw_d + pos * sdw_k, dw.to(dw_ptr.dtype.element_ty),
                 mask=pos < K)


def sizes(seqlen: int, k: int) -> tuple[int, int, int, int, int]:
    """(M, N1, N2, R, BK): the half transform M = N1 · N2, R rows of N2 holding the
    sequence (fftconv's sizes for M points), BK spectrum rows a block."""
    if k > seqlen:
        raise ValueError(f"a filter of {k} taps for {seqlen} positions")
    m = max(MIN_N, triton.next_power_of_2(seqlen))
    n1, n2 = split(m)
    return m, n1, n2, max(16, triton.next_power_of_2(triton.cdiv(seqlen, n2))), min(BK, n1)


_MATRICES: dict = {}


def _matrices(n1: int, n2: int, rows: int, device: torch.device,
              dtype: torch.dtype) -> list[torch.Tensor]:
    """The even half's F1[:, :R], T, conj(F1)[:R, :]; the odd half's, twisted by ω^(N2·r)
    and ω^c; F2 (shared): real and imaginary parts, T in float32, the others in ``dtype``
    (the products' operand type). Made once per size, device and dtype, in float64."""
    key = (n1, n2, rows, str(device), dtype)
    if key not in _MATRICES:
        m = n1 * n2
        k1 = torch.arange(n1, dtype=torch.float64)
        r = torch.arange(rows, dtype=torch.float64)
        c = torch.arange(n2, dtype=torch.float64)
        f1 = torch.exp(-2j * math.pi * torch.outer(k1, r) / n1)
        tw = torch.exp(-2j * math.pi * torch.outer(k1, c) / m)
        g1 = torch.exp(2j * math.pi * torch.outer(r, k1) / n1)
        f2 = torch.exp(-2j * math.pi * torch.outer(c, c) / n2)
        half = -2j * math.pi / (2 * m)  # ω = exp(half)
        f1o = f1 * torch.exp(half * n2 * r)[None, :]
        two = tw * torch.exp(half * c)[None, :]
        g1o = g1 * torch.exp(-half * n2 * r)[:, None]
        _MATRICES[key] = [t.to(device, torch.float32 if i in (1, 4) else dtype).contiguous()
                          for i, mat in enumerate((f1, tw, g1, f1o, two, g1o, f2))
                          for t in (mat.real, mat.imag)]
    return _MATRICES[key]


def long_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``long_conv1d(x, weight, bias)`` (no autograd here), as ``fftconv.long_conv``."""
    batch, dim, seqlen = x.shape
    k = weight.shape[1]
    m, n1, n2, rows, bk = sizes(seqlen, k)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    h = torch.empty(dim, 4, n1, n2, device=x.device, dtype=torch.float32)
    launch(_paired_kernel, (dim,), x, weight, y if bias is None else bias.contiguous(), y, h,
           *_matrices(n1, n2, rows, x.device, x.dtype), batch, seqlen, k, *x.stride(),
           *weight.stride(), *y.stride(), 1.0 / (2 * m), N1=n1, N2=n2, R=rows, BK=bk,
           HAS_BIAS=bias is not None, DT=_DTYPES[x.dtype], num_warps=WARPS, num_stages=1)
    return y


def long_conv_backward(x: torch.Tensor, weight: torch.Tensor, grad: torch.Tensor,
                       need_dx: bool = True, need_dw: bool = True) -> tuple:
    """(dx, dw) of :func:`long_conv` for the output gradient ``grad`` (None where not
    needed), one kernel, as ``fftconv.long_conv_backward``."""
    batch, dim, seqlen = x.shape
    k = weight.shape[1]
    m, n1, n2, rows, bk = sizes(seqlen, k)
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if need_dx else None
    dw = torch.empty_like(weight, memory_format=torch.contiguous_format) if need_dw else None
    h = torch.empty(dim if need_dx else 1, 4, n1, n2, device=x.device, dtype=torch.float32)
    acc = torch.zeros(dim if need_dw else 1, 4, n1, n2, device=x.device, dtype=torch.float32)
    launch(_backward_kernel, (dim,), x, weight, grad, x if dx is None else dx,
           weight if dw is None else dw, h, acc, *_matrices(n1, n2, rows, x.device, x.dtype),
           batch, seqlen, k, *x.stride(), *weight.stride(), *grad.stride(),
           *(x if dx is None else dx).stride(), *(weight if dw is None else dw).stride(),
           1.0 / (2 * m), N1=n1, N2=n2, R=rows, BK=bk, NEED_DX=need_dx, NEED_DW=need_dw,
           DT=_DTYPES[x.dtype], num_warps=WARPS, num_stages=1)
    return dx, dw
