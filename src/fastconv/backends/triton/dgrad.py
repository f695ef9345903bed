"""Data gradient (dgrad) as an implicit GEMM; also the transposed convolution's forward.

For a convolution ``y = conv(x, w)`` with stride σ, padding π and dilation δ,

    dx[n, c, h, w] = Σ_{k, r, s} dy[n, k, p, q] · w[k, c, r, s]
    where p = (h + π_h − r·δ_h) / σ_h and q = (w + π_w − s·δ_w) / σ_w,

summed only over taps for which both divisions are exact and ``(p, q)`` lies inside ``dy``.
A transposed convolution of ``x`` with ``w`` is exactly this with ``dy = x``.

Stride phases: whether a tap ``r`` contributes to row ``h`` depends only on ``h mod σ_h``.
Program axis 2 picks a phase ``(φ_h, φ_w)``; its rows are the pixels ``h = φ_h + σ_h·i``,
``w = φ_w + σ_w·j``, and it visits only the taps valid for that phase — ``r = r₀ + t·ρ_h``
with ``ρ_h = σ_h / gcd(σ_h, δ_h)`` — so no multiply-add is spent on a structural zero
(a naive masked loop would waste ``1 − 1/(σ_h·σ_w)`` of the work: 3/4 at stride 2). For a
valid tap ``p = i + (φ_h + π_h − r·δ_h) / σ_h``: the tile's pointers are loop-invariant
bases plus one scalar offset per step, as in the forward kernel.

GEMM view per phase and group: rows ``(n, i, j)``, columns the group's ``C_G`` input
channels, reduction over ``(r, s, k)`` of valid taps × the group's ``K_G`` output channels.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .common import acc_type, mma, strides
from .fprop import store_tile, tile_of
from .launch import INTERPRETED, cdiv, launch, prepare
from .launchargs import EpilogueArgs, Geometry


@triton.jit
def _first_tap(phase, pad, dil, stride, STEP):
    """The smallest tap ``t`` in ``[0, STEP)`` with ``(phase + pad − t·dil) mod stride == 0``,
    or ``STEP`` if there is none (then no tap of this phase contributes)."""
    first = STEP
    for t in range(0, STEP):
        first = tl.where(((phase + pad - t * dil) % stride == 0) & (first == STEP), t, first)
    return first


@triton.jit
def _conv_dgrad_kernel(
    dy_ptr, w_ptr, out_ptr, scale_ptr, shift_ptr, res_ptr,
    N, H, W, C_G, P, Q, K_G, R, S,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, step_r, step_s,
    stride_dn, stride_dk, stride_dp, stride_dq,
    stride_wk, stride_wc, stride_wr, stride_ws,
    stride_on, stride_oc, stride_oh, stride_ow,
    stride_rn, stride_rc, stride_rh, stride_rw,
    negative_slope,
    HAS_SCALE: tl.constexpr, HAS_SHIFT: tl.constexpr, HAS_RES: tl.constexpr,
    ACT: tl.constexpr, PRECISION: tl.constexpr, INT64: tl.constexpr, DOT_FP32: tl.constexpr,
    ROUND_TF32: tl.constexpr,
    ACC: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    group = tl.program_id(1)
    phase = tl.program_id(2)
    ph = phase // stride_w
    pw = phase % stride_w
    HP = tl.cdiv(H, stride_h)  # rows of phase 0, the largest; others mask their tail
    WP = tl.cdiv(W, stride_w)
    M = N * HP * WP
    pid_m, pid_n = tile_of(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(C_G, BLOCK_N), GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = offs_m % M
    img = rows // (HP * WP)
    ij = rows % (HP * WP)
    i = ij // WP
    j = ij % WP
    h = ph + i * stride_h
    w = pw + j * stride_w
    mask_m = (offs_m < M) & (h < H) & (w < W)
    mask_n = offs_n < C_G
    if INT64:
        img = img.to(tl.int64)
        i = i.to(tl.int64)
        j = j.to(tl.int64)
    c_glob = group * C_G + offs_n
    c_w = offs_n % C_G  # the weight's channel index is within the group
    offs_k = tl.arange(0, BLOCK_K)
    k_rows = group * K_G + offs_k
    if INT64:
        k_rows = k_rows.to(tl.int64)
    a_base = (dy_ptr + img * stride_dn + i * stride_dp + j * stride_dq)[:, None] + \
        (k_rows * stride_dk)[None, :]
    b_base = w_ptr + (k_rows * stride_wk)[:, None] + (c_w * stride_wc)[None, :]

    r0 = _first_tap(ph, pad_h, dil_h, stride_h, step_r)
    s0 = _first_tap(pw, pad_w, dil_w, stride_w, step_s)
    # Valid taps repeat with period step: none in [0, step) means none at all.
    n_r = tl.where((r0 < step_r) & (r0 < R), tl.cdiv(R - r0, step_r), 0)
    n_s = tl.where((s0 < step_s) & (s0 < S), tl.cdiv(S - s0, step_s), 0)
    k_steps = tl.cdiv(K_G, BLOCK_K)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    for it in range(0, n_r * n_s * k_steps):
        rs = it // k_steps
        k0 = (it % k_steps) * BLOCK_K
        r = r0 + (rs // n_s) * step_r
        s = s0 + (rs % n_s) * step_s
        p_off = (ph + pad_h - r * dil_h) // stride_h  # exact: r is a tap of this phase
        q_off = (pw + pad_w - s * dil_w) // stride_w
        p = i + p_off
        q = j + q_off
        row_ok = (p >= 0) & (p < P) & (q >= 0) & (q < Q)
        a_ptrs = a_base + (p_off * stride_dp + q_off * stride_dq + k0 * stride_dk)
        b_ptrs = b_base + (k0 * stride_wk + r * stride_wr + s * stride_ws)
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            k_ok = k0 + offs_k < K_G
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        acc = mma(a, b, acc, DOT_FP32, ROUND_TF32, PRECISION, ACC)

    store_tile(acc, img, h, w, c_glob, mask_m, mask_n,
               out_ptr, stride_on, stride_oc, stride_oh, stride_ow,
               scale_ptr, shift_ptr, res_ptr, stride_rn, stride_rc, stride_rh, stride_rw,
               negative_slope, HAS_SCALE, HAS_SHIFT, HAS_RES, ACT, INT64)


def launch_dgrad(dy4, w4, out4, epi: EpilogueArgs, geo: Geometry, *, precision, config,
                 int64):
    """``out4 = act(scale·dgrad(dy4, w4) + shift + residual)`` on 4-D ``(N, C, H, W)``-indexed
    views of any strides. ``w4`` is the convolution's weight ``(K, C/groups, R, S)``; ``geo``
    the convolution's geometry; ``out4``'s size is the input size."""
    grid, args, meta = _dgrad_launch(dy4, w4, out4, epi, geo, precision, config, int64)
    launch(_conv_dgrad_kernel, grid, *args, **meta)
    return out4


def prepare_dgrad(dy4, w4, out4, epi: EpilogueArgs, geo: Geometry, *, precision, config,
                  int64):
    """:func:`launch_dgrad`, returning the launch for later calls with operands of the same
    shapes, strides and dtypes (``launch.Prepared``, called with ``dy4, w4, out4`` and the
    scale, shift and residual tensors, ``out4`` in place of each one absent), or None (the
    interpreter)."""
    grid, args, meta = _dgrad_launch(dy4, w4, out4, epi, geo, precision, config, int64)
    return prepare(_conv_dgrad_kernel, grid, 6, *args, **meta)


def _dgrad_launch(dy4, w4, out4, epi: EpilogueArgs, geo: Geometry, precision, config, int64):
    """(grid, arguments, constexprs) of the dgrad kernel."""
    scale, shift, res4, act_code, negative_slope = epi
    stride, pad, dilation, groups = geo
    n, k, p, q = dy4.shape
    _, c_g, r, s = w4.shape
    _, c, h, w = out4.shape
    k_g = k // groups
    hp, wp = -(-h // stride[0]), -(-w // stride[1])
    grid = (cdiv(n * hp * wp, config.block_m) * cdiv(c_g, config.block_n),
            groups, stride[0] * stride[1])
    dummy = out4
    res_strides = strides(res4) if res4 is not None else (0, 0, 0, 0)
    args = (dy4, w4, out4, scale if scale is not None else dummy,
            shift if shift is not None else dummy, res4 if res4 is not None else dummy,
            n, h, w, c_g, p, q, k_g, r, s,
            stride[0], stride[1], pad[0], pad[1], dilation[0], dilation[1],
            stride[0] // math.gcd(stride[0], dilation[0]),
            stride[1] // math.gcd(stride[1], dilation[1]),
            *strides(dy4), *strides(w4), *strides(out4), *res_strides,
            float(negative_slope))
    meta = dict(
        HAS_SCALE=scale is not None, HAS_SHIFT=shift is not None, HAS_RES=res4 is not None,
        ACT=act_code, PRECISION=precision, INT64=int64,
        DOT_FP32=INTERPRETED and dy4.dtype == torch.bfloat16,  # see launch_fprop
        ROUND_TF32=precision == "tf32" and dy4.dtype == torch.float32,
        ACC=acc_type(dy4.dtype),
        EVEN_K=k_g % config.block_k == 0,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=8,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return grid, args, meta
