"""What the Triton kernel files share: the interpreter's lock, the epilogue's activation
in a kernel, TF32 rounding and one matrix-multiply-accumulate step, the accumulator type,
and the stride convention of the implicit-GEMM kernels."""

from __future__ import annotations

import functools
import threading

import torch
import triton
import triton.language as tl

from .launch import INTERPRETED

_INTERPRETER_LOCK = threading.RLock()



def serialized(fn):
    """``fn`` holding one process-wide lock when the kernels are interpreted (Triton's
    interpreter is not thread-safe: threads launching at once fail); compiled, ``fn``."""
    if not INTERPRETED:
        return fn

    @functools.wraps(fn)
    def locked(*args, **kwargs):
        with _INTERPRETER_LOCK:
            return fn(*args, **kwargs)
    return locked


@triton.jit
def activation(y, ACT: tl.constexpr, negative_slope):
    # Codes follow epilogue.ACTIVATIONS. Comparisons are written so that NaN passes through,
    # as in torch (``where(y < 0, 0, y)`` keeps a NaN; ``maximum(y, 0)`` need not).
    if ACT == 1:  # relu
        y = tl.where(y < 0, 0.0, y)
    elif ACT == 2:  # relu6
        y = tl.where(y < 0, 0.0, tl.where(y > 6.0, 6.0, y))
    elif ACT == 3:  # leaky_relu
        y = tl.where(y < 0, y * negative_slope, y)
    elif ACT == 4:  # silu
        y = y * tl.sigmoid(y)
    elif ACT == 5:  # gelu (erf)
        y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    elif ACT == 6:  # gelu_tanh
        inner = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        y = 0.5 * y * (1.0 + (2.0 * tl.sigmoid(2.0 * inner) - 1.0))
    elif ACT == 7:  # sigmoid
        y = tl.sigmoid(y)
    elif ACT == 8:  # tanh
        y = 2.0 * tl.sigmoid(2.0 * y) - 1.0
    elif ACT == 9:  # hardswish
        y = y * tl.where(y < -3.0, 0.0, tl.where(y > 3.0, 6.0, y + 3.0)) / 6.0
    return y


@triton.jit
def round_tf32(x):
    """float32 values rounded to the nearest TF32 value (10 mantissa bits; ties away from
    zero). A TF32 ``tl.dot`` otherwise drops the low 13 bits of each operand: a truncation
    whose bias (every product ~1e-3 too small in magnitude) compounds from layer to layer of
    a network, where cuDNN's round-to-nearest errors cancel (benchmarks/NOTES.md)."""
    bits = x.to(tl.uint32, bitcast=True)
    return ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def mma(a, b, acc, DOT_FP32: tl.constexpr, ROUND_TF32: tl.constexpr, PRECISION: tl.constexpr,
        ACC: tl.constexpr):
    """``acc + a @ b``: one step of a tile's product. ``DOT_FP32``: 16-bit operands made
    float32 first (the interpreter's bf16 ``tl.dot`` is wrong); ``ROUND_TF32``: float32
    operands rounded to the nearest TF32 value first (:func:`round_tf32`)."""
    if DOT_FP32:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    if ROUND_TF32:
        a = round_tf32(a)
        b = round_tf32(b)
    return tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=ACC)


def acc_type(dtype: torch.dtype):
    """The accumulator type: fp32, or fp64 for float64 data (interpreter-only, gradcheck)."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def strides(t: torch.Tensor) -> tuple[int, ...]:
    """``t``'s strides with 0 for size-1 dimensions (their index is always 0).

    torch gives size-1 dimensions arbitrary strides, often 1. Triton specialises an integer
    argument equal to 1 as the constant 1 and then cannot prove 16-byte alignment of
    ``r * stride_wr + c0``: on 1x1 weights that turned the weight tile into scalar loads that
    the pipeliner left synchronous (TTGIR, H200), about 2x slower. 0 keeps the alignment.
    """
    return tuple(0 if size == 1 else st for size, st in zip(t.shape, t.stride()))
