"""Probe (issue 56, 2026-12-07): long_conv1d's fused FFT past N = 4096 points without
larger tiles. The shipped kernel (``backends/triton/fftconv.py``) holds an N-point
spectrum in two-stage tiles, and from N = 8192 those leave the register file (0.31x
torch.fft, ``../2026-11-29-longconv/``), so ``fftconv.MAX_N`` is 4096 and L = 4K runs
torch.fft (1.00x).

This kernel splits the 2M-point transform (M = the power of two ≥ seqlen, M ≥ 256) into its
even and odd bins, each an M-point transform with the shipped kernel's tiles:
- even bins: the M-point DFT of x. Their product with the filter's even bins, inverted, is
  the circular convolution mod M: z0[t] = y[t] + y[t + M];
- odd bins: the M-point DFT of x[n]·ω^n (ω = exp(−2πi / 2M)). Inverted and multiplied by
  ω^(−t), their product gives the negacyclic convolution u1[t] = y[t] − y[t + M].
So y[t] = (z0[t] + u1[t]) / 2 for t < M, and seqlen ≤ M. The twist is folded into the
matrices (n = N2·r + c: F1's column r times ω^(N2·r), the twiddle's column c times ω^c, and
conjugate ones for the inverse), so the odd half costs what the even half costs: 24 tile
products a row, against the 12 of an M-point row, in tiles of the M-point kernel.

Variants (``KEEP_H``): the filter's two half spectra computed once per channel and kept
for its batch rows (two (N1, N2) complex float32 tiles more in registers), or recomputed
for every row (18 products a half instead of 12). ``HOIST``: the DFT matrices loaded
before the batch loop, or in it (L2 reads every row).

Checked in the interpreter (float32, M = 256: 3e-8 to 2e-7 against float64 expected, as the
shipped kernel's). On a GPU: the relative error against float64 and the median ms in CUDA
graphs of each variant, of the seqconv bench's torch.fft provider and of
``fastconv.long_conv1d`` (torch.fft at these sizes), interleaved over 5 rounds.
``train``: forward + backward of the blocked kernels (``_blocked_backward_kernel``: dx and
dw through the same halves and blocks, dw's spectra summed over the batch in a float32
scratch) against the torch.fft provider through autograd.
Run: PYTHONPATH=src python3 probe_twisted.py [train] [cases: B,D,L,K ...]"""

import json
import math
import sys

import torch
import triton
import triton.language as tl

from fastconv import long_conv1d
from fastconv.backends.triton.fftconv import split
from fastconv.tools.bench.seqconv import _torch_fft as torch_fft  # the bench's provider


@triton.jit
def _ld(p, ROWS: tl.constexpr, COLS: tl.constexpr):
    """A row-major (ROWS, COLS) matrix, loaded where it is used (L1/L2: no registers held
    across the row's other products)."""
    return tl.load(p + tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :])


@triton.jit
def _fwd(src, stride, length, f1r_p, f1i_p, tr_p, ti_p, f2r_p, f2i_p, N1: tl.constexpr,
         N2: tl.constexpr, R: tl.constexpr, DT: tl.constexpr):
    """D = ((F1[:, :R] @ A) ∘ T) @ F2 of ``length`` real values at ``src`` (zeros after);
    F1, F2 stored in DT, T in float32."""
    pos = tl.arange(0, R)[:, None] * N2 + tl.arange(0, N2)[None, :]
    a = tl.load(src + pos * stride, mask=pos < length, other=0.0).to(DT)
    br = tl.dot(_ld(f1r_p, N1, R), a)
    bi = tl.dot(_ld(f1i_p, N1, R), a)
    tr = _ld(tr_p, N1, N2)
    ti = _ld(ti_p, N1, N2)
    cr = (br * tr - bi * ti).to(DT)
    ci = (br * ti + bi * tr).to(DT)
    f2r = _ld(f2r_p, N2, N2)
    f2i = _ld(f2i_p, N2, N2)
    return tl.dot(cr, f2r) - tl.dot(ci, f2i), tl.dot(cr, f2i) + tl.dot(ci, f2r)


@triton.jit
def _inv(yr, yi, f2r_p, f2i_p, tr_p, ti_p, g1r_p, g1i_p, inv_n, N1: tl.constexpr,
         N2: tl.constexpr, R: tl.constexpr, DT: tl.constexpr):
    """Re(conj(F1)[:R] @ (((Y / M') @ conj(F2)) ∘ conj(T))) (``fftconv._inverse``)."""
    yr = (yr * inv_n).to(DT)
    yi = (yi * inv_n).to(DT)
    f2r = _ld(f2r_p, N2, N2)
    f2i = _ld(f2i_p, N2, N2)
    er = tl.dot(yr, f2r) + tl.dot(yi, f2i)
    ei = tl.dot(yi, f2r) - tl.dot(yr, f2i)
    tr = _ld(tr_p, N1, N2)
    ti = _ld(ti_p, N1, N2)
    gr = (er * tr + ei * ti).to(DT)
    gi = (ei * tr - er * ti).to(DT)
    return tl.dot(_ld(g1r_p, R, N1), gr) - tl.dot(_ld(g1i_p, R, N1), gi)


@triton.jit
def _half(x_row, sx_t, seqlen, hr, hi, f1r_p, f1i_p, tr_p, ti_p, f2r_p, f2i_p, g1r_p, g1i_p,
          inv_n, N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr, DT: tl.constexpr):
    """One half's contribution (z0 or u1, scaled by 1/2M) to a row's first R·N2 outputs."""
    dr, di = _fwd(x_row, sx_t, seqlen, f1r_p, f1i_p, tr_p, ti_p, f2r_p, f2i_p, N1, N2, R, DT)
    hr = hr.to(tl.float32)
    hi = hi.to(tl.float32)
    return _inv(dr * hr - di * hi, dr * hi + di * hr, f2r_p, f2i_p, tr_p, ti_p, g1r_p, g1i_p,
                inv_n, N1, N2, R, DT)


@triton.jit
def _h(w_row, sw_k, K, f1r_p, f1i_p, tr_p, ti_p, f2r_p, f2i_p, g1r_p, g1i_p,
       N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr, DT: tl.constexpr,
       HT: tl.constexpr):
    """The filter's half spectrum (the matrices of one half), kept in HT."""
    hr, hi = _fwd(w_row, sw_k, K, f1r_p, f1i_p, tr_p, ti_p, f2r_p, f2i_p, N1, N2, R, DT)
    return hr.to(HT), hi.to(HT)


@triton.jit
def _twisted_kernel(x_ptr, w_ptr, b_ptr, y_ptr,
                    e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr, e_g1r_ptr, e_g1i_ptr,
                    o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, o_g1r_ptr, o_g1i_ptr,
                    f2r_ptr, f2i_ptr,
                    batch, seqlen, K, sx_b, sx_d, sx_t, sw_d, sw_k, sy_b, sy_d, sy_t, inv_n,
                    N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr,
                    HAS_BIAS: tl.constexpr, DT: tl.constexpr, KEEP_H: tl.constexpr,
                    HT: tl.constexpr):
    """y = (z0 + u1) / 2 + bias (module docstring), one program per channel."""
    d = tl.program_id(0).to(tl.int64)
    w_row = w_ptr + d * sw_d
    if KEEP_H:
        her, hei = _h(w_row, sw_k, K, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr, f2r_ptr,
                      f2i_ptr, e_g1r_ptr, e_g1i_ptr, N1, N2, R, DT, HT)
        hor, hoi = _h(w_row, sw_k, K, o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, f2r_ptr,
                      f2i_ptr, o_g1r_ptr, o_g1i_ptr, N1, N2, R, DT, HT)
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(b_ptr + d).to(tl.float32)
    pos = tl.arange(0, R)[:, None] * N2 + tl.arange(0, N2)[None, :]
    x_row = x_ptr + d * sx_d
    y_row = y_ptr + d * sy_d
    for _ in range(batch):
        if not KEEP_H:
            her, hei = _h(w_row, sw_k, K, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr, f2r_ptr,
                          f2i_ptr, e_g1r_ptr, e_g1i_ptr, N1, N2, R, DT, HT)
        out = _half(x_row, sx_t, seqlen, her, hei, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr,
                    f2r_ptr, f2i_ptr, e_g1r_ptr, e_g1i_ptr, inv_n, N1, N2, R, DT)
        if not KEEP_H:
            hor, hoi = _h(w_row, sw_k, K, o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, f2r_ptr,
                          f2i_ptr, o_g1r_ptr, o_g1i_ptr, N1, N2, R, DT, HT)
        out += _half(x_row, sx_t, seqlen, hor, hoi, o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr,
                     f2r_ptr, f2i_ptr, o_g1r_ptr, o_g1i_ptr, inv_n, N1, N2, R, DT)
        tl.store(y_row + pos * sy_t, (out + bias).to(y_ptr.dtype.element_ty),
                 mask=pos < seqlen)
        x_row += sx_b
        y_row += sy_b


@triton.jit
def _blk_twiddle_f2(br, bi, k, tr_p, ti_p, f2r_p, f2i_p, N2: tl.constexpr, DT: tl.constexpr):
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
def _blk_f2_twiddle(yr, yi, k, inv_n, f2r_p, f2i_p, tr_p, ti_p, N2: tl.constexpr,
                    DT: tl.constexpr):
    """((Y / M') @ conj(F2)) ∘ conj(T) for the spectrum rows ``k`` of Y, in DT."""
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
def _blk_fwd(a, f1r_p, f1i_p, tr_p, ti_p, f2r_p, f2i_p, j, BK: tl.constexpr,
             N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr, DT: tl.constexpr):
    """Rows j·BK … j·BK + BK − 1 of D (``_fwd``) for the real (R, N2) tile ``a`` (in DT)."""
    k = j * BK + tl.arange(0, BK)
    f1 = k[:, None] * R + tl.arange(0, R)[None, :]
    br = tl.dot(tl.load(f1r_p + f1), a)
    bi = tl.dot(tl.load(f1i_p + f1), a)
    return _blk_twiddle_f2(br, bi, k, tr_p, ti_p, f2r_p, f2i_p, N2, DT)


@triton.jit
def _blk_inv(yr, yi, f2r_p, f2i_p, tr_p, ti_p, g1r_p, g1i_p, j, inv_n, BK: tl.constexpr,
             N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr, DT: tl.constexpr):
    """The rows' share of the output (``_inv`` over the block's k1 only)."""
    k = j * BK + tl.arange(0, BK)
    gr, gi = _blk_f2_twiddle(yr, yi, k, inv_n, f2r_p, f2i_p, tr_p, ti_p, N2, DT)
    g1 = tl.arange(0, R)[:, None] * N1 + k[None, :]
    return tl.dot(tl.load(g1r_p + g1), gr) - tl.dot(tl.load(g1i_p + g1), gi)


@triton.jit
def _blocked_kernel(x_ptr, w_ptr, b_ptr, y_ptr, h_ptr,
                    e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr, e_g1r_ptr, e_g1i_ptr,
                    o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, o_g1r_ptr, o_g1i_ptr,
                    f2r_ptr, f2i_ptr,
                    batch, seqlen, K, sx_b, sx_d, sx_t, sw_d, sw_k, sy_b, sy_d, sy_t, inv_n,
                    N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
                    HAS_BIAS: tl.constexpr, DT: tl.constexpr):
    """The twisted kernel over blocks of BK spectrum rows (k1): live tiles of (BK, N2)
    instead of (N1, N2), the row's output accumulated over the blocks. The filter's half
    spectra are computed once per channel into ``h_ptr`` (float32 scratch, (dim, 4, N1,
    N2): even re/im, odd re/im) and read back per block (L2)."""
    d = tl.program_id(0).to(tl.int64)
    pos = tl.arange(0, R)[:, None] * N2 + tl.arange(0, N2)[None, :]
    blk = tl.arange(0, BK)[:, None] * N2 + tl.arange(0, N2)[None, :]
    h_row = h_ptr + d * (4 * N1 * N2)
    _blk_spectra(w_ptr + d * sw_d, sw_k, K, h_row, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr,
                 o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, f2r_ptr, f2i_ptr, N1, N2, R, BK,
                 DT)
    tl.debug_barrier()  # (the spectra's stores before any thread reads them)
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(b_ptr + d).to(tl.float32)
    x_row = x_ptr + d * sx_d
    y_row = y_ptr + d * sy_d
    for _ in range(batch):
        a = tl.load(x_row + pos * sx_t, mask=pos < seqlen, other=0.0).to(DT)
        out = tl.zeros([R, N2], dtype=tl.float32)
        for j in range(N1 // BK):
            at = h_row + j * BK * N2 + blk
            dr, di = _blk_fwd(a, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr, f2r_ptr, f2i_ptr,
                              j, BK, N1, N2, R, DT)
            hr = tl.load(at)
            hi = tl.load(at + N1 * N2)
            out += _blk_inv(dr * hr - di * hi, dr * hi + di * hr, f2r_ptr, f2i_ptr, e_tr_ptr,
                            e_ti_ptr, e_g1r_ptr, e_g1i_ptr, j, inv_n, BK, N1, N2, R, DT)
            dr, di = _blk_fwd(a, o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, f2r_ptr, f2i_ptr,
                              j, BK, N1, N2, R, DT)
            hr = tl.load(at + 2 * N1 * N2)
            hi = tl.load(at + 3 * N1 * N2)
            out += _blk_inv(dr * hr - di * hi, dr * hi + di * hr, f2r_ptr, f2i_ptr, o_tr_ptr,
                            o_ti_ptr, o_g1r_ptr, o_g1i_ptr, j, inv_n, BK, N1, N2, R, DT)
        tl.store(y_row + pos * sy_t, (out + bias).to(y_ptr.dtype.element_ty),
                 mask=pos < seqlen)
        x_row += sx_b
        y_row += sy_b


@triton.jit
def _blk_fwd2(ar, ai, f1r_p, f1i_p, tr_p, ti_p, f2r_p, f2i_p, j, BK: tl.constexpr,
              N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr, DT: tl.constexpr):
    """``_blk_fwd`` of the complex tile ar + i·ai (two real rows as one complex signal)."""
    k = j * BK + tl.arange(0, BK)
    f1 = k[:, None] * R + tl.arange(0, R)[None, :]
    f1r = tl.load(f1r_p + f1)
    f1i = tl.load(f1i_p + f1)
    br = tl.dot(f1r, ar) - tl.dot(f1i, ai)
    bi = tl.dot(f1r, ai) + tl.dot(f1i, ar)
    return _blk_twiddle_f2(br, bi, k, tr_p, ti_p, f2r_p, f2i_p, N2, DT)


@triton.jit
def _blk_inv2(yr, yi, f2r_p, f2i_p, tr_p, ti_p, g1r_p, g1i_p, j, inv_n, BK: tl.constexpr,
              N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr, DT: tl.constexpr):
    """``_blk_inv`` with the complex result (the two rows' shares: real and imaginary)."""
    k = j * BK + tl.arange(0, BK)
    gr, gi = _blk_f2_twiddle(yr, yi, k, inv_n, f2r_p, f2i_p, tr_p, ti_p, N2, DT)
    g1 = tl.arange(0, R)[:, None] * N1 + k[None, :]
    g1r = tl.load(g1r_p + g1)
    g1i = tl.load(g1i_p + g1)
    return tl.dot(g1r, gr) - tl.dot(g1i, gi), tl.dot(g1r, gi) + tl.dot(g1i, gr)


@triton.jit
def _paired_kernel(x_ptr, w_ptr, b_ptr, y_ptr, h_ptr,
                   e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr, e_g1r_ptr, e_g1i_ptr,
                   o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, o_g1r_ptr, o_g1i_ptr,
                   f2r_ptr, f2i_ptr,
                   batch, seqlen, K, sx_b, sx_d, sx_t, sw_d, sw_k, sy_b, sy_d, sy_t, inv_n,
                   N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
                   HAS_BIAS: tl.constexpr, DT: tl.constexpr):
    """``_blocked_kernel`` over pairs of batch rows: rows b and b + 1 as one complex signal
    x_b + i·x_(b+1) (the filter is real, so the result is y_b + i·y_(b+1)): 16 tile products
    a row instead of 24."""
    d = tl.program_id(0).to(tl.int64)
    pos = tl.arange(0, R)[:, None] * N2 + tl.arange(0, N2)[None, :]
    blk = tl.arange(0, BK)[:, None] * N2 + tl.arange(0, N2)[None, :]
    h_row = h_ptr + d * (4 * N1 * N2)
    _blk_spectra(w_ptr + d * sw_d, sw_k, K, h_row, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr,
                 o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, f2r_ptr, f2i_ptr, N1, N2, R, BK,
                 DT)
    tl.debug_barrier()
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(b_ptr + d).to(tl.float32)
    x_row = x_ptr + d * sx_d
    y_row = y_ptr + d * sy_d
    for b in range(0, batch, 2):
        two = b + 1 < batch
        ar = tl.load(x_row + pos * sx_t, mask=pos < seqlen, other=0.0).to(DT)
        ai = tl.load(x_row + sx_b + pos * sx_t, mask=(pos < seqlen) & two, other=0.0).to(DT)
        out_r = tl.zeros([R, N2], dtype=tl.float32)
        out_i = tl.zeros([R, N2], dtype=tl.float32)
        for j in range(N1 // BK):
            at = h_row + j * BK * N2 + blk
            dr, di = _blk_fwd2(ar, ai, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr, f2r_ptr,
                               f2i_ptr, j, BK, N1, N2, R, DT)
            hr = tl.load(at)
            hi = tl.load(at + N1 * N2)
            pr, pi = _blk_inv2(dr * hr - di * hi, dr * hi + di * hr, f2r_ptr, f2i_ptr,
                               e_tr_ptr, e_ti_ptr, e_g1r_ptr, e_g1i_ptr, j, inv_n, BK, N1, N2,
                               R, DT)
            out_r += pr
            out_i += pi
            dr, di = _blk_fwd2(ar, ai, o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, f2r_ptr,
                               f2i_ptr, j, BK, N1, N2, R, DT)
            hr = tl.load(at + 2 * N1 * N2)
            hi = tl.load(at + 3 * N1 * N2)
            pr, pi = _blk_inv2(dr * hr - di * hi, dr * hi + di * hr, f2r_ptr, f2i_ptr,
                               o_tr_ptr, o_ti_ptr, o_g1r_ptr, o_g1i_ptr, j, inv_n, BK, N1, N2,
                               R, DT)
            out_r += pr
            out_i += pi
        tl.store(y_row + pos * sy_t, (out_r + bias).to(y_ptr.dtype.element_ty),
                 mask=pos < seqlen)
        tl.store(y_row + sy_b + pos * sy_t, (out_i + bias).to(y_ptr.dtype.element_ty),
                 mask=(pos < seqlen) & two)
        x_row += 2 * sx_b
        y_row += 2 * sy_b


@triton.jit
def _blk_spectra(src, sk, length, h_row, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr,
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
        hr, hi = _blk_fwd(wa, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr, f2r_ptr, f2i_ptr, j,
                          BK, N1, N2, R, DT)
        tl.store(at, hr)
        tl.store(at + N1 * N2, hi)
        hr, hi = _blk_fwd(wa, o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, f2r_ptr, f2i_ptr, j,
                          BK, N1, N2, R, DT)
        tl.store(at + 2 * N1 * N2, hr)
        tl.store(at + 3 * N1 * N2, hi)


@triton.jit
def _blocked_backward_kernel(x_ptr, w_ptr, g_ptr, dx_ptr, dw_ptr, h_ptr, acc_ptr,
                             e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr, e_g1r_ptr, e_g1i_ptr,
                             o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, o_g1r_ptr, o_g1i_ptr,
                             f2r_ptr, f2i_ptr, batch, seqlen, K, sx_b, sx_d, sx_t, sw_d, sw_k,
                             sg_b, sg_d, sg_t, sdx_b, sdx_d, sdx_t, sdw_d, sdw_k, inv_n,
                             N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr,
                             BK: tl.constexpr, DT: tl.constexpr):
    """dx = IDFT(G ∘ conj(W)) row by row and dw = IDFT(Σ_rows G ∘ conj(X))[:K], both
    through the two halves over blocks of spectrum rows (``_blocked_kernel``); Σ_rows in a
    float32 scratch (``acc_ptr``, zeroed by the caller), in batch order: deterministic."""
    d = tl.program_id(0).to(tl.int64)
    pos = tl.arange(0, R)[:, None] * N2 + tl.arange(0, N2)[None, :]
    blk = tl.arange(0, BK)[:, None] * N2 + tl.arange(0, N2)[None, :]
    h_row = h_ptr + d * (4 * N1 * N2)
    acc_row = acc_ptr + d * (4 * N1 * N2)
    _blk_spectra(w_ptr + d * sw_d, sw_k, K, h_row, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr,
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
            gr, gi = _blk_fwd(ga, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr, f2r_ptr, f2i_ptr,
                              j, BK, N1, N2, R, DT)
            hr = tl.load(h_row + at)
            hi = tl.load(h_row + at + N1 * N2)
            out += _blk_inv(gr * hr + gi * hi, gi * hr - gr * hi, f2r_ptr, f2i_ptr, e_tr_ptr,
                            e_ti_ptr, e_g1r_ptr, e_g1i_ptr, j, inv_n, BK, N1, N2, R, DT)
            xr, xi = _blk_fwd(xa, e_f1r_ptr, e_f1i_ptr, e_tr_ptr, e_ti_ptr, f2r_ptr, f2i_ptr,
                              j, BK, N1, N2, R, DT)
            tl.store(acc_row + at, tl.load(acc_row + at) + gr * xr + gi * xi)
            tl.store(acc_row + at + N1 * N2, tl.load(acc_row + at + N1 * N2) + gi * xr - gr * xi)
            gr, gi = _blk_fwd(ga, o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, f2r_ptr, f2i_ptr,
                              j, BK, N1, N2, R, DT)
            hr = tl.load(h_row + at + 2 * N1 * N2)
            hi = tl.load(h_row + at + 3 * N1 * N2)
            out += _blk_inv(gr * hr + gi * hi, gi * hr - gr * hi, f2r_ptr, f2i_ptr, o_tr_ptr,
                            o_ti_ptr, o_g1r_ptr, o_g1i_ptr, j, inv_n, BK, N1, N2, R, DT)
            xr, xi = _blk_fwd(xa, o_f1r_ptr, o_f1i_ptr, o_tr_ptr, o_ti_ptr, f2r_ptr, f2i_ptr,
                              j, BK, N1, N2, R, DT)
            at2 = acc_row + at + 2 * N1 * N2
            tl.store(at2, tl.load(at2) + gr * xr + gi * xi)
            tl.store(at2 + N1 * N2, tl.load(at2 + N1 * N2) + gi * xr - gr * xi)
        tl.store(dx_row + pos * sdx_t, out.to(dx_ptr.dtype.element_ty), mask=pos < seqlen)
        x_row += sx_b
        g_row += sg_b
        dx_row += sdx_b
    dw = tl.zeros([R, N2], dtype=tl.float32)
    for j in range(N1 // BK):
        at = acc_row + j * BK * N2 + blk
        dw += _blk_inv(tl.load(at), tl.load(at + N1 * N2), f2r_ptr, f2i_ptr, e_tr_ptr,
                       e_ti_ptr, e_g1r_ptr, e_g1i_ptr, j, inv_n, BK, N1, N2, R, DT)
        dw += _blk_inv(tl.load(at + 2 * N1 * N2), tl.load(at + 3 * N1 * N2), f2r_ptr, f2i_ptr,
                       o_tr_ptr, o_ti_ptr, o_g1r_ptr, o_g1i_ptr, j, inv_n, BK, N1, N2, R, DT)
    tl.store(dw_ptr + d * sdw_d + pos * sdw_k, dw.to(dw_ptr.dtype.element_ty), mask=pos < K)


def sizes(seqlen: int, k: int) -> tuple[int, int, int, int]:
    """(M, N1, N2, R): M the power of two ≥ max(256, seqlen); the 2M-point transform holds
    the linear convolution (2M ≥ seqlen + K − 1 for K ≤ seqlen)."""
    if k > seqlen:
        raise ValueError(f"a filter of {k} taps for {seqlen} positions")
    m = max(256, triton.next_power_of_2(seqlen))
    n1, n2 = split(m)
    return m, n1, n2, max(16, triton.next_power_of_2(triton.cdiv(seqlen, n2)))


_MATS: dict = {}


def matrices(n1: int, n2: int, rows: int, device, dtype) -> list[torch.Tensor]:
    """The even half's F1[:, :R], T, conj(F1)[:R, :]; the odd half's (twisted by
    ω^(N2·r) and ω^c); F2 (shared): real and imaginary parts, the twiddles T in float32,
    the others in ``dtype`` (the products' operand type)."""
    key = (n1, n2, rows, str(device), dtype)
    if key not in _MATS:
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
        _MATS[key] = [t.to(device, torch.float32 if i in (1, 4) else dtype).contiguous()
                      for i, mat in enumerate((f1, tw, g1, f1o, two, g1o, f2))
                      for t in (mat.real, mat.imag)]
    return _MATS[key]


_DT = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


#: the filter's half spectra: kept per channel in float32 or in x's dtype, or recomputed
#: for every batch row
H_MODES = ("k32", "k16", "r")


def twisted(x, w, bias=None, warps=4, h="k32"):
    batch, dim, seqlen = x.shape
    k = w.shape[1]
    m, n1, n2, rows = sizes(seqlen, k)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    _twisted_kernel[(dim,)](
        x, w, y if bias is None else bias, y, *matrices(n1, n2, rows, x.device, x.dtype), batch,
        seqlen, k, *x.stride(), *w.stride(), *y.stride(), 1.0 / (2 * m), N1=n1, N2=n2,
        R=rows, HAS_BIAS=bias is not None, DT=_DT[x.dtype], KEEP_H=h != "r",
        HT=tl.float32 if h == "k32" else _DT[x.dtype], num_warps=warps, num_stages=1)
    return y


def _launch_blocked(kernel, x, w, bias, warps, bk):
    """``kernel`` (the blocked or the paired one) on x, w, bias: y."""
    batch, dim, seqlen = x.shape
    k = w.shape[1]
    m, n1, n2, rows = sizes(seqlen, k)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    h = torch.empty(dim, 4, n1, n2, device=x.device, dtype=torch.float32)
    kernel[(dim,)](
        x, w, y if bias is None else bias, y, h, *matrices(n1, n2, rows, x.device, x.dtype),
        batch, seqlen, k, *x.stride(), *w.stride(), *y.stride(), 1.0 / (2 * m), N1=n1,
        N2=n2, R=rows, BK=min(bk, n1), HAS_BIAS=bias is not None, DT=_DT[x.dtype],
        num_warps=warps, num_stages=1)
    return y


def blocked(x, w, bias=None, warps=4, bk=32):
    return _launch_blocked(_blocked_kernel, x, w, bias, warps, bk)


def paired(x, w, bias=None, warps=8, bk=16):
    return _launch_blocked(_paired_kernel, x, w, bias, warps, bk)


def blocked_backward(x, w, g, warps=8, bk=16):
    """(dx, dw) of ``blocked`` for the output gradient g."""
    batch, dim, seqlen = x.shape
    k = w.shape[1]
    m, n1, n2, rows = sizes(seqlen, k)
    bk = min(bk, n1)
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    dw = torch.empty_like(w, memory_format=torch.contiguous_format)
    h = torch.empty(dim, 4, n1, n2, device=x.device, dtype=torch.float32)
    acc = torch.zeros(dim, 4, n1, n2, device=x.device, dtype=torch.float32)
    _blocked_backward_kernel[(dim,)](
        x, w, g, dx, dw, h, acc, *matrices(n1, n2, rows, x.device, x.dtype), batch, seqlen,
        k, *x.stride(), *w.stride(), *g.stride(), *dx.stride(), *dw.stride(), 1.0 / (2 * m),
        N1=n1, N2=n2, R=rows, BK=bk, DT=_DT[x.dtype], num_warps=warps, num_stages=1)
    return dx, dw


class Blocked(torch.autograd.Function):
    """``blocked`` with its backward (the bias's gradient a sum)."""

    @staticmethod
    def forward(ctx, x, w, b, warps, bk):
        ctx.save_for_backward(x, w)
        ctx.meta = warps, bk
        return blocked(x, w, b, warps, bk)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        dx, dw = blocked_backward(x, w, g, *ctx.meta)
        return dx, dw, g.sum((0, 2), dtype=torch.float32).to(g.dtype), None, None


def train_rows(cases, device, dt, gpu):
    """Forward + backward (x, w, b) of the blocked kernels against the bench's torch.fft
    provider through autograd: errors against float64, CUDA-graph medians."""
    for batch, dim, L, K in cases:
        g = torch.Generator(device="cpu").manual_seed(L * 7 + K + 1)
        x = torch.randn(batch, dim, L, generator=g).to(device, dt).requires_grad_()
        w = (torch.randn(dim, K, generator=g) / K ** 0.5).to(device, dt).requires_grad_()
        b = torch.randn(dim, generator=g).to(device, dt).requires_grad_()
        dy = torch.randn(batch, dim, L, generator=g).to(device, dt)
        refs = [t.detach().double().requires_grad_() for t in (x, w, b)]
        want = torch.autograd.grad(reference(*refs), refs, dy.double())
        row = dict(mode="train", batch=batch, dim=dim, L=L, K=K, M=sizes(L, K)[0])
        fns = {"torch": torch_fft} if gpu else {}
        for warps, bk in ((8, 16), (8, 32)) if gpu else ((4, 16),):
            fns[f"twb{warps}_{bk}"] = lambda x, w, b, warps=warps, bk=bk: \
                Blocked.apply(x, w, b, warps, bk)
        ok = {}
        for name, f in fns.items():
            try:
                got = torch.autograd.grad(f(x, w, b), (x, w, b), dy)
                row[f"err_{name}"] = [float(f"{rel(a, c):.3g}") for a, c in zip(got, want)]
                ok[name] = f
            except Exception as exc:
                row[f"error_{name}"] = f"{type(exc).__name__}: {str(exc)[:160]}"
        if gpu:
            times = {k: [] for k in ok}
            for _ in range(5):
                for k, f in ok.items():
                    times[k].append(graph_ms(lambda f=f: torch.autograd.grad(
                        f(x, w, b), (x, w, b), dy)))
            row.update({f"ms_{k}": round(sorted(v)[2], 4) for k, v in times.items()})
        print(json.dumps(row), flush=True)


def reference(x, w, b):
    L = x.shape[-1]
    return torch.nn.functional.conv1d(torch.nn.functional.pad(x.double(), (w.shape[1] - 1, 0)),
                                      w.double().flip(-1).unsqueeze(1),
                                      None if b is None else b.double(),
                                      groups=x.shape[1])[..., :L]


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def graph_ms(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    for a, e in ev:
        a.record()
        g.replay()
        e.record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(e) for a, e in ev)
    return t[len(t) // 2]


def main(argv):
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    if argv[:1] == ["train"]:
        cases = [tuple(int(v) for v in a.split(",")) for a in argv[1:]] or (
            [(4, 768, 4096, 4096), (4, 768, 8192, 8192)] if gpu else
            [(2, 2, 137, 9), (1, 2, 300, 300), (2, 2, 700, 650)])
        if gpu:
            print("#", torch.cuda.get_device_name(), torch.__version__, triton.__version__,
                  flush=True)
        return train_rows(cases, device, torch.bfloat16 if gpu else torch.float32, gpu)
    if argv:
        cases = [tuple(int(v) for v in a.split(",")) for a in argv]
    elif gpu:
        cases = [(4, 768, 4096, 4096), (4, 768, 3000, 3000), (8, 1024, 4096, 4096),
                 (4, 768, 8192, 8192)]
    else:  # interpreter: M = 256 (seqlen 129-256) and 512, K up to seqlen, odd sizes
        cases = [(2, 3, 200, 200), (1, 2, 256, 131), (2, 2, 137, 9), (1, 2, 300, 300)]
    dt = torch.bfloat16 if gpu else torch.float32
    if gpu:
        print("#", torch.cuda.get_device_name(), torch.__version__, triton.__version__,
              flush=True)
    for batch, dim, L, K in cases:
        g = torch.Generator(device="cpu").manual_seed(L * 7 + K)
        x = torch.randn(batch, dim, L, generator=g).to(device, dt)
        w = (torch.randn(dim, K, generator=g) / K ** 0.5).to(device, dt)
        b = torch.randn(dim, generator=g).to(device, dt)
        ref = reference(x, w, b)
        row = dict(batch=batch, dim=dim, L=L, K=K, dtype=str(dt).split(".")[-1],
                   M=sizes(L, K)[0])
        variants = {}
        if gpu:
            variants = {"torch": lambda: torch_fft(x, w, b),
                        "long_conv1d": lambda: long_conv1d(x, w, b)}
        if gpu:  # the variants the offline counts leave (README); L > 4K: 8 warps only
            names = ["twb8_16", "twp8_16", "twp8_32"] + (
                ["tw8k32", "twb4_16", "twb8_32"] if row["M"] <= 4096 else [])
        else:
            names = [f"tw4{h}" for h in H_MODES] + [f"tw{p}4_{bk}" for p in "bp"
                                                     for bk in (16, 32)]
        for name in names:
            if name.startswith("twb") or name.startswith("twp"):
                warps, bk = (int(v) for v in name[3:].split("_"))
                fn = blocked if name[2] == "b" else paired
                variants[name] = lambda fn=fn, warps=warps, bk=bk: fn(x, w, b, warps, bk)
            else:
                variants[name] = lambda warps=int(name[2]), h=name[3:]: twisted(x, w, b, warps, h)
        if not gpu:  # a strided x and no bias, once
            xt = x.transpose(1, 2).contiguous().transpose(1, 2)
            row["err_strided_nobias"] = float(f"{rel(twisted(xt, w), reference(x, w, None)):.3g}")
        fns = {}
        for name, fn in variants.items():
            try:
                row[f"err_{name}"] = float(f"{rel(fn(), ref):.3g}")
                fns[name] = fn
            except Exception as exc:
                row[f"error_{name}"] = f"{type(exc).__name__}: {str(exc)[:160]}"
        if gpu:
            times = {k: [] for k in fns}
            for _ in range(5):  # interleaved
                for k, fn in fns.items():
                    times[k].append(graph_ms(fn))
            row.update({f"ms_{k}": round(sorted(v)[2], 4) for k, v in times.items()})
            best = min((k for k in fns if k.startswith("tw")), key=lambda k: row[f"ms_{k}"],
                       default=None)
            if best and "ms_torch" in row:
                row["best"] = best
                row["speedup"] = round(row["ms_torch"] / row[f"ms_{best}"], 3)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
