"""Weight gradient (wgrad) as an implicit GEMM with a deterministic split-K reduction.

    dw[k, c, r, s] = Σ_{n, p, q} dy[n, k, p, q] · x[n, c, p·σ_h − π_h + r·δ_h, q·σ_w − π_w + s·δ_w]

GEMM view per group and tap ``(r, s)``: rows the group's ``K_G`` output channels, columns its
``C_G`` input channels, reduction over all ``N·P·Q`` output pixels. The output is small and
the reduction long, so the reduction is split over program axis 2: each split writes fp32
partial sums to its own slice of a ``[SPLIT, K, C_G, R, S]`` buffer and ``_wgrad_reduce``
adds the slices in a fixed order. The result is bit-for-bit reproducible (no atomics).

Tap-row tiles (``TileConfig.tap_rows``, few input channels per group: the RGB stem) cover
one kernel row ``r`` and its whole ``(s, c)`` run as the columns instead of one tap's
channels: ``_tap_rows_wgrad_kernel``, with the forward's tap-row addressing, writes the same
partial-sum buffer. One tap's tile of a 3-channel stem would be 3 of 16 columns wide and
read the output gradient 49 times; a kernel row's is 21 of 32, and 7 times (the programs of
one split's rows run side by side, so mostly from L2).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...precision import accumulate_dtype
from .common import acc_type, mma, strides
from .launch import INTERPRETED, cdiv, launch, prepare
from .launchargs import Geometry


@triton.jit
def _split_pixels(N, P, Q, split, SPLIT_K, BLOCK_K: tl.constexpr):
    """[begin, end) of the output pixels that split ``split`` of ``SPLIT_K`` sums over."""
    M = N * P * Q
    per_split = tl.cdiv(tl.cdiv(M, BLOCK_K), SPLIT_K)
    begin = split * per_split * BLOCK_K
    return begin, min(M, begin + per_split * BLOCK_K)


@triton.jit
def _pixels(red, end, P, Q, INT64: tl.constexpr):
    """(in range, image, row, column) of output pixels ``red`` (flat ``n·P·Q + p·Q + q``)."""
    red_ok = red < end
    img = red // (P * Q)
    pq = red % (P * Q)
    p = pq // Q
    q = pq % Q
    if INT64:
        img = img.to(tl.int64)
        p = p.to(tl.int64)
        q = q.to(tl.int64)
    return red_ok, img, p, q


@triton.jit
def _conv_wgrad_kernel(
    dy_ptr, x_ptr, out_ptr,
    N, H, W, C_G, P, Q, K_G, R, S,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    stride_dn, stride_dk, stride_dp, stride_dq,
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_ok, stride_oc, stride_or, stride_os, stride_split,
    PRECISION: tl.constexpr, INT64: tl.constexpr, DOT_FP32: tl.constexpr,
    ROUND_TF32: tl.constexpr, ACC: tl.constexpr,
    SPLIT_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
):
    pid = tl.program_id(0)
    group = tl.program_id(1)
    split = tl.program_id(2)
    num_pid_m = tl.cdiv(K_G, BLOCK_M)
    num_pid_n = tl.cdiv(C_G, BLOCK_N)
    tiles = num_pid_m * num_pid_n
    rs = pid // tiles
    pid_m = (pid % tiles) % num_pid_m  # consecutive programs share the x tile in L2
    pid_n = (pid % tiles) // num_pid_m
    r = rs // S
    s = rs % S

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_glob = group * K_G + offs_m
    # In channels-last tensors the channel axes are the contiguous ones: a tile that divides
    # the group's channels keeps them as plain aranges, which Triton can prove contiguous
    # (vector loads); a modulo (the tail tile re-reading valid channels) would hide that.
    if EVEN_M:
        k_load = k_glob
    else:
        k_load = group * K_G + offs_m % K_G
    if EVEN_N:
        c_load = group * C_G + offs_n
    else:
        c_load = group * C_G + offs_n % C_G
    if INT64:
        k_load = k_load.to(tl.int64)
        c_load = c_load.to(tl.int64)
    a_cols = dy_ptr + k_load * stride_dk  # [BLOCK_M]
    b_cols = x_ptr + c_load * stride_xc + (r * dil_h - pad_h) * stride_xh + \
        (s * dil_w - pad_w) * stride_xw  # [BLOCK_N]

    begin, end = _split_pixels(N, P, Q, split, SPLIT_K, BLOCK_K)
    offs_red = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    for m0 in range(begin, end, BLOCK_K):
        red_ok, img, p, q = _pixels(m0 + offs_red, end, P, Q, INT64)
        ih = p * stride_h + (r * dil_h - pad_h)
        iw = q * stride_w + (s * dil_w - pad_w)
        x_ok = red_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        a = tl.load(a_cols[:, None] + (img * stride_dn + p * stride_dp + q * stride_dq)[None, :],
                    mask=red_ok[None, :], other=0.0)
        b = tl.load(b_cols[None, :] + (img * stride_xn + p * stride_h * stride_xh +
                                       q * stride_w * stride_xw)[:, None],
                    mask=x_ok[:, None], other=0.0)
        acc = mma(a, b, acc, DOT_FP32, ROUND_TF32, PRECISION, ACC)

    mask = (offs_m < K_G)[:, None] & (offs_n < C_G)[None, :]
    if INT64:
        k_glob = k_glob.to(tl.int64)
    ptrs = out_ptr + split * stride_split + (k_glob * stride_ok)[:, None] + \
        (offs_n * stride_oc)[None, :] + (r * stride_or + s * stride_os)
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tap_rows_wgrad_kernel(
    dy_ptr, x_ptr, out_ptr,
    N, H, W, C_G, P, Q, K_G, R, S,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    stride_dn, stride_dk, stride_dp, stride_dq,
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_ok, stride_oc, stride_or, stride_os, stride_split,
    PRECISION: tl.constexpr, INT64: tl.constexpr, DOT_FP32: tl.constexpr,
    ROUND_TF32: tl.constexpr, ACC: tl.constexpr,
    SPLIT_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_M: tl.constexpr,
):
    """Program (kernel row r and output-channel tile, group, split): ``[BLOCK_M output
    channels x BLOCK_N (s, c) run elements]`` of row r, summed over the split's pixels."""
    pid = tl.program_id(0)
    group = tl.program_id(1)
    split = tl.program_id(2)
    r = pid % R  # a split's kernel rows are consecutive programs: they share dy in L2
    pid_m = pid // R
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    k_glob = group * K_G + offs_m
    if EVEN_M:  # a plain arange: contiguous channels-last dy loads as vectors (_conv_wgrad_kernel)
        k_load = k_glob
    else:
        k_load = group * K_G + offs_m % K_G
    offs_j = tl.arange(0, BLOCK_N)  # (s, c) of row r, c fastest
    if INT64:
        offs_j = offs_j.to(tl.int64)
    s_j = offs_j // C_G
    c_j = offs_j % C_G
    run_ok = offs_j < S * C_G
    if INT64:
        k_load = k_load.to(tl.int64)
    a_cols = dy_ptr + k_load * stride_dk  # [BLOCK_M]
    b_cols = x_ptr + (group * C_G + c_j) * stride_xc + (s_j * dil_w - pad_w) * stride_xw + \
        (r * dil_h - pad_h) * stride_xh  # [BLOCK_N]

    begin, end = _split_pixels(N, P, Q, split, SPLIT_K, BLOCK_K)
    offs_red = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    for m0 in range(begin, end, BLOCK_K):
        red_ok, img, p, q = _pixels(m0 + offs_red, end, P, Q, INT64)
        ih = p * stride_h + (r * dil_h - pad_h)
        iw = q[:, None] * stride_w + (s_j * dil_w - pad_w)[None, :]
        x_ok = (red_ok & (ih >= 0) & (ih < H))[:, None] & run_ok[None, :] & \
            (iw >= 0) & (iw < W)
        a = tl.load(a_cols[:, None] + (img * stride_dn + p * stride_dp + q * stride_dq)[None, :],
                    mask=red_ok[None, :], other=0.0)
        b = tl.load(b_cols[None, :] + (img * stride_xn + p * stride_h * stride_xh +
                                       q * stride_w * stride_xw)[:, None],
                    mask=x_ok, other=0.0)
        acc = mma(a, b, acc, DOT_FP32, ROUND_TF32, PRECISION, ACC)

    mask = (offs_m < K_G)[:, None] & run_ok[None, :]
    if INT64:
        k_glob = k_glob.to(tl.int64)
    ptrs = out_ptr + split * stride_split + (k_glob * stride_ok)[:, None] + \
        (c_j * stride_oc + s_j * stride_os)[None, :] + r * stride_or
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _wgrad_reduce(ws_ptr, out_ptr, numel, C_G, R, S,
                  stride_ok, stride_oc, stride_or, stride_os,
                  SPLIT_K, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.load(ws_ptr + offs, mask=mask, other=0.0)
    for split in range(1, SPLIT_K):  # fixed order: the same bits every run
        acc += tl.load(ws_ptr + split * numel + offs, mask=mask, other=0.0)
    s = offs % S  # the buffer is [K, C_G, R, S] contiguous per split
    r = (offs // S) % R
    c = (offs // (R * S)) % C_G
    k = offs // (C_G * R * S)
    tl.store(out_ptr + k * stride_ok + c * stride_oc + r * stride_or + s * stride_os,
             acc.to(out_ptr.dtype.element_ty), mask=mask)


def launch_wgrad(dy4, x4, out4, geo: Geometry, *, precision, config, int64):
    """``out4 = wgrad(dy4, x4)``: the gradient of the weight ``(K, C/groups, R, S)`` of a
    convolution of ``x4`` whose output gradient is ``dy4`` (4-D views, any strides)."""
    prepare_wgrad(dy4, x4, out4, geo, precision=precision, config=config, int64=int64,
                  keep=False)
    return out4


def prepare_wgrad(dy4, x4, out4, geo: Geometry, *, precision, config, int64, keep=True):
    """:func:`launch_wgrad`, returning (where ``keep``) the launch for later calls with
    operands of the same shapes, strides and dtypes (``launch.Prepared``, called with
    ``dy4, x4, out4``), or None where there is none to reuse (split-K: two launches and a
    buffer; the interpreter)."""
    stride, pad, dilation, groups = geo
    n, k, p, q = dy4.shape
    _, c, h, w = x4.shape
    _, c_g, r, s = out4.shape
    k_g = k // groups
    split = config.split_k
    if config.tap_rows:
        grid = (cdiv(k_g, config.block_m) * r, groups, split)
    else:
        grid = (cdiv(k_g, config.block_m) * cdiv(c_g, config.block_n) * r * s,
                groups, split)
    if split > 1:
        target = torch.empty((split, k, c_g, r, s), device=out4.device,
                             dtype=accumulate_dtype(out4.dtype))
        out_strides = (*target.stride()[1:], target.stride(0))
    else:
        target = out4
        out_strides = (*strides(out4), 0)
    args = (dy4, x4, target, n, h, w, c_g, p, q, k_g, r, s,
            stride[0], stride[1], pad[0], pad[1], dilation[0], dilation[1],
            *strides(dy4), *strides(x4), *out_strides)
    meta = dict(
        PRECISION=precision, INT64=int64,
        DOT_FP32=INTERPRETED and dy4.dtype == torch.bfloat16,  # see launch_fprop
        ROUND_TF32=precision == "tf32" and dy4.dtype == torch.float32,
        ACC=acc_type(dy4.dtype),
        SPLIT_K=split, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, num_warps=config.num_warps, num_stages=config.num_stages,
    )
    meta.update(EVEN_M=k_g % config.block_m == 0)
    if config.tap_rows:
        kernel = _tap_rows_wgrad_kernel
    else:
        kernel = _conv_wgrad_kernel
        meta.update(EVEN_N=c_g % config.block_n == 0)
    if split > 1 or not keep:
        launch(kernel, grid, *args, **meta)
        if split > 1:
            numel = k * c_g * r * s
            block = 1024
            launch(_wgrad_reduce, (cdiv(numel, block),),
                target, out4, numel, c_g, r, s, *out4.stride(), SPLIT_K=split, BLOCK=block,
                num_warps=4)
        return None
    return prepare(kernel, grid, 3, *args, **meta)
