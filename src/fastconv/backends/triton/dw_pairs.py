"""Depthwise forward for 16-bit channels-first rows with unit column stride, reading and
writing pairs of elements as 32-bit words.

The generic channels-first tile (depthwise.py) loads each kernel tap's shifted window
separately. For bf16/fp16 those windows start one 2-byte element apart, so none is
known to be aligned and every load is a 2-byte scalar; with the taps re-read from L1 the
kernel is bound by L1 load instructions, not DRAM (a causal k=4 conv1d reached 42 % of
HBM bandwidth in bf16 against 76 % in fp32: benchmarks/NOTES.md).

Here a program computes output columns in pairs ``(2i, 2i+1)``. Input element
``2i + e + d`` (output parity ``e``, tap offset ``d = s·δ − pad``) lies in 32-bit word
``i + ⌊(e + d)/2⌋``, low half when ``e + d`` is even. With the padding and dilation
compile-time constants, each distinct word offset is loaded once per kernel row as a
``uint32`` vector and both halves are unpacked in registers (bf16: a shift into an fp32's
high half; fp16: a bit-cast and a conversion). For a causal k=4 window that is 3 word
loads for 2 outputs instead of 8 element loads. Output pairs are packed and stored as
words. The epilogue is the generic one (scale, shift, residual, activation), in fp32.

Requirements (``eligible``): 16-bit type, unit column stride and unit column strides in
memory, even widths, even row/channel/image strides and 4-byte aligned base pointers for
the input, the output and the residual. Everything else runs on depthwise.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import activation
from .depthwise import ROW_LOOP_PAST, and_row, any_nonfinite, channels_by_columns, tap
from .launch import Prepared, cdiv, prepare
from .launchargs import EpilogueArgs, Geometry

__all__ = ["eligible", "launch_fprop"]


@triton.jit
def _unpack(v, IS_BF16: tl.constexpr):
    """(low, high) 16-bit halves of the uint32 words ``v`` as fp32."""
    if IS_BF16:
        lo = (v << 16).to(tl.float32, bitcast=True)
        hi = (v & 0xFFFF0000).to(tl.float32, bitcast=True)
    else:
        lo = (v & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (v >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _pack(lo, hi, DTYPE: tl.constexpr):
    """fp32 ``lo``, ``hi`` rounded to ``DTYPE`` and packed into uint32 words."""
    a = lo.to(DTYPE).to(tl.uint16, bitcast=True).to(tl.uint32)
    b = hi.to(DTYPE).to(tl.uint16, bitcast=True).to(tl.uint32)
    return a | (b << 16)


@triton.jit
def _pair_taps(x_base, w_ptr, k, kmask, mask, i, p, H, W2, stride_h, pad_h, dil_h,
               sxh, swk, swr, sws,
               R: tl.constexpr, S: tl.constexpr, PAD_W: tl.constexpr, DIL_W: tl.constexpr,
               IS_BF16: tl.constexpr, SKIP_PADDED: tl.constexpr, BLOCK_A: tl.constexpr,
               BLOCK_B: tl.constexpr, UNROLL_ROWS: tl.constexpr):
    """Sums over taps of the even and odd output columns (the fast loop, and the one
    skipping padded words: depthwise._fprop_taps explains); the kernel rows unrolled where
    ``UNROLL_ROWS``, else looped at run time."""
    acc_e = tl.zeros([BLOCK_A, BLOCK_B], tl.float32)  # output columns 2i
    acc_o = tl.zeros([BLOCK_A, BLOCK_B], tl.float32)  # output columns 2i + 1
    if UNROLL_ROWS:
        for r in tl.static_range(R):
            acc_e, acc_o = _pair_row(acc_e, acc_o, x_base, w_ptr, k, kmask, mask, i, p, r, H,
                                     W2, stride_h, pad_h, dil_h, sxh, swk, swr, sws, S, PAD_W,
                                     DIL_W, IS_BF16, SKIP_PADDED)
    else:
        for r in range(R):
            acc_e, acc_o = _pair_row(acc_e, acc_o, x_base, w_ptr, k, kmask, mask, i, p, r, H,
                                     W2, stride_h, pad_h, dil_h, sxh, swk, swr, sws, S, PAD_W,
                                     DIL_W, IS_BF16, SKIP_PADDED)
    return acc_e, acc_o


@triton.jit
def _pair_row(acc_e, acc_o, x_base, w_ptr, k, kmask, mask, i, p, r, H, W2, stride_h, pad_h,
              dil_h, sxh, swk, swr, sws, S: tl.constexpr, PAD_W: tl.constexpr,
              DIL_W: tl.constexpr, IS_BF16: tl.constexpr, SKIP_PADDED: tl.constexpr):
    """Kernel row ``r``'s taps of :func:`_pair_taps`."""
    # word offsets of the window: element 2i + e + s·DIL_W − PAD_W, e in {0, 1}
    J_LO: tl.constexpr = (-PAD_W) // 2
    J_HI: tl.constexpr = (1 + (S - 1) * DIL_W - PAD_W) // 2
    ih = p * stride_h - pad_h + r * dil_h
    row_ok = (ih >= 0) & (ih < H)
    for j in tl.static_range(J_LO, J_HI + 1):
        word = i + j
        ok = and_row(mask & (word >= 0) & (word < W2), row_ok)
        lo, hi = _unpack(tl.load(x_base + ih * sxh + word, mask=ok, other=0), IS_BF16)
        for s in tl.static_range(S):
            # output 2i reads element 2i + s·DIL_W − PAD_W: word j when ⌊·/2⌋ == j
            if (s * DIL_W - PAD_W) // 2 == j:
                wv = tl.load(w_ptr + k * swk + r * swr + s * sws, mask=kmask,
                             other=0.0).to(tl.float32)
                if (s * DIL_W - PAD_W) % 2 == 0:
                    acc_e = tap(acc_e, lo, wv, ok, SKIP_PADDED)
                else:
                    acc_e = tap(acc_e, hi, wv, ok, SKIP_PADDED)
            if (1 + s * DIL_W - PAD_W) // 2 == j:  # output 2i + 1, one element on
                wv = tl.load(w_ptr + k * swk + r * swr + s * sws, mask=kmask,
                             other=0.0).to(tl.float32)
                if (1 + s * DIL_W - PAD_W) % 2 == 0:
                    acc_o = tap(acc_o, lo, wv, ok, SKIP_PADDED)
                else:
                    acc_o = tap(acc_o, hi, wv, ok, SKIP_PADDED)
    return acc_e, acc_o


@triton.jit
def _dw_pairs_fprop_kernel(
    x_ptr, w_ptr, out_ptr, scale_ptr, shift_ptr, res_ptr,
    H, W2, K, P, Q2, KG,
    stride_h, pad_h, dil_h,
    sxn, sxc, sxh, swk, swr, sws, son, sok, sop, srn, srk, srp,
    negative_slope,
    R: tl.constexpr, S: tl.constexpr, PAD_W: tl.constexpr, DIL_W: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_SHIFT: tl.constexpr, HAS_RES: tl.constexpr,
    ACT: tl.constexpr, IS_BF16: tl.constexpr, INT64: tl.constexpr, BLOCK_A: tl.constexpr,
    BLOCK_B: tl.constexpr, UNROLL_ROWS: tl.constexpr,
):
    # x/out/res strides are in 32-bit words; W2, Q2 are widths in words (pairs)
    n, k, p, i, mask = channels_by_columns(tl.program_id(0), tl.program_id(1), K, P, Q2,
                                            BLOCK_A, BLOCK_B)
    if INT64:
        n = n.to(tl.int64)
    kmask = k < K
    x_base = x_ptr.to(tl.pointer_type(tl.uint32)) + n * sxn + (k // KG) * sxc
    if any_nonfinite(w_ptr, k * swk, 0, swr, sws, kmask, 1, R, S, tl.float32, UNROLL_ROWS):
        acc_e, acc_o = _pair_taps(x_base, w_ptr, k, kmask, mask, i, p, H, W2, stride_h, pad_h,
                                  dil_h, sxh, swk, swr, sws, R, S, PAD_W, DIL_W, IS_BF16, True,
                                  BLOCK_A, BLOCK_B, UNROLL_ROWS)
    else:
        acc_e, acc_o = _pair_taps(x_base, w_ptr, k, kmask, mask, i, p, H, W2, stride_h, pad_h,
                                  dil_h, sxh, swk, swr, sws, R, S, PAD_W, DIL_W, IS_BF16, False,
                                  BLOCK_A, BLOCK_B, UNROLL_ROWS)
    if HAS_SCALE:
        sc = tl.load(scale_ptr + k, mask=kmask, other=0.0).to(tl.float32)
        acc_e = acc_e * sc
        acc_o = acc_o * sc
    if HAS_SHIFT:
        sh = tl.load(shift_ptr + k, mask=kmask, other=0.0).to(tl.float32)
        acc_e = acc_e + sh
        acc_o = acc_o + sh
    if HAS_RES:
        rv = tl.load(res_ptr.to(tl.pointer_type(tl.uint32)) + n * srn + k * srk + p * srp + i,
                     mask=mask, other=0)
        r_lo, r_hi = _unpack(rv, IS_BF16)
        acc_e = acc_e + r_lo
        acc_o = acc_o + r_hi
    acc_e = activation(acc_e, ACT, negative_slope)
    acc_o = activation(acc_o, ACT, negative_slope)
    tl.store(out_ptr.to(tl.pointer_type(tl.uint32)) + n * son + k * sok + p * sop + i,
             _pack(acc_e, acc_o, out_ptr.dtype.element_ty), mask=mask)


def _words(t: torch.Tensor) -> bool:
    """Whether the 4-D (N, C, H, W) view ``t`` can be addressed in 32-bit words along W."""
    return (t.stride(3) == 1 and t.shape[3] % 2 == 0 and t.data_ptr() % 4 == 0
            and all(s % 2 == 0 for s in t.stride()[:3]))


def eligible(x4, out4, res4, stride_w: int) -> bool:
    """Whether ``launch_fprop`` can run these 4-D views (see the module docstring)."""
    return (x4.dtype in (torch.bfloat16, torch.float16) and stride_w == 1
            and _words(x4) and _words(out4) and (res4 is None or _words(res4)))


def launch_fprop(x4, w4, out4, epi: EpilogueArgs, geo: Geometry, *, channels_last: bool,
                 config, int64: bool) -> Prepared | None:
    """The depthwise forward of depthwise.launch_fprop on ``eligible`` views: ``config``'s
    ``block_a`` channels x ``block_b`` column pairs per program (prepared as there)."""
    scale, shift, res4, act_code, negative_slope = epi
    stride, pad, dilation, _ = geo
    n, c, h, w = x4.shape
    k, cg, r, s = w4.shape
    _, _, p, q = out4.shape
    assert cg == 1 and not channels_last and eligible(x4, out4, res4, stride[1])
    dummy = out4  # never read: the matching HAS_* flag is False
    res_words = tuple(st // 2 for st in res4.stride()[:3]) if res4 is not None else (0, 0, 0)
    grid = (n * p * cdiv(q // 2, config.block_b), cdiv(k, config.block_a))
    return prepare(_dw_pairs_fprop_kernel, grid, 6,
        x4, w4, out4, scale if scale is not None else dummy,
        shift if shift is not None else dummy, res4 if res4 is not None else dummy,
        h, w // 2, k, p, q // 2, k // c, stride[0], pad[0], dilation[0],
        *(st // 2 for st in x4.stride()[:3]), w4.stride(0), w4.stride(2), w4.stride(3),
        *(st // 2 for st in out4.stride()[:3]), *res_words, float(negative_slope),
        R=r, S=s, PAD_W=pad[1], DIL_W=dilation[1], HAS_SCALE=scale is not None,
        HAS_SHIFT=shift is not None, HAS_RES=res4 is not None, ACT=act_code,
        IS_BF16=x4.dtype == torch.bfloat16, INT64=int64, BLOCK_A=config.block_a,
        BLOCK_B=config.block_b, UNROLL_ROWS=r * s <= ROW_LOOP_PAST, num_warps=config.num_warps)
