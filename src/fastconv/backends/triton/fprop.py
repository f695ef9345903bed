"""Forward convolution as an implicit GEMM, with the fused epilogue.

The convolution of one group is a matrix product ``out[m, k] = Σ_red A[m, red] · B[red, k]``:

* ``m`` runs over output pixels ``(n, p, q)`` — ``M = N·P·Q`` rows;
* ``k`` runs over the group's output channels — ``K_G`` columns;
* ``red`` runs over ``(r, s, c)``: kernel tap and input channel of the group —
  ``R·S·C_G`` terms. ``A[m, (r, s, c)] = x[n, c, p·σh − pad_h + r·δh, q·σw − pad_w + s·δw]``
  (zero outside the input) is never materialised: each tile is gathered from ``x`` with a
  mask, which is why this is an *implicit* GEMM.

Three ways to walk the reduction, chosen by the constexprs ``FLAT_K`` and ``TAP_ROWS``:

* ``FLAT_K = False`` (channels per group >= 16): tap by tap, ``BLOCK_K`` channels at a time.
  The tap's pixel coordinates and the padding mask are per-row scalars of the tile, and the
  channel offsets are contiguous, so NHWC inputs load as wide vectors.
* ``FLAT_K = True`` (few channels per group: the RGB stem, depthwise): the flattened
  ``(r, s, c)`` index is decomposed per element, so no lane of the reduction is wasted on
  channel padding.
* ``TAP_ROWS = True`` (few channels per group, ``S·C_G`` at most 64: the 7x7 RGB stem's 21):
  one kernel row ``r`` per step, its ``(s, c)`` run in one ``BLOCK_K`` block. The run's
  offsets and padding mask are the same for every row, so they are worked out once and a
  step costs a pointer add and a row mask; in a channels-last input each run is contiguous.
  cuDNN has no fast bf16 kernel for a 3-channel input (1.8 ms for the ResNet-50 b256 stem
  on an H100, 0.6 ms in fp16).

Every tensor is addressed through its strides, so NCHW, NHWC and non-contiguous inputs are
all correct; the wrapper hands NHWC copies to the kernel for speed where it pays (see
``backend.py``). Rank-1 problems arrive as ``H = P = R = 1``. The epilogue is
``act(scale[k]·acc + shift[k] + residual)``, in fp32, then one cast to the output dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...precision import accumulate_dtype
from .common import acc_type, activation, mma, strides
from .launch import INTERPRETED, cdiv, launch, prepare
from .launchargs import EpilogueArgs, Geometry


@triton.jit
def tile_of(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(row tile, column tile) of program ``pid`` in grouped order: GROUP_M row tiles share
    each weight column tile while it is in L2."""
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _epilogue_store(acc, offs_m, k_glob, mask_m, mask_n, P, Q,
                    out_ptr, stride_on, stride_ok, stride_op, stride_oq,
                    scale_ptr, shift_ptr, res_ptr, stride_rn, stride_rk, stride_rp, stride_rq,
                    negative_slope, HAS_SCALE: tl.constexpr, HAS_SHIFT: tl.constexpr,
                    HAS_RES: tl.constexpr, ACT: tl.constexpr, INT64: tl.constexpr):
    """The epilogue for rows that are output pixels ``offs_m`` of an ``N x P x Q`` output."""
    img = offs_m // (P * Q)
    pq = offs_m % (P * Q)
    store_tile(acc, img, pq // Q, pq % Q, k_glob, mask_m, mask_n,
               out_ptr, stride_on, stride_ok, stride_op, stride_oq,
               scale_ptr, shift_ptr, res_ptr, stride_rn, stride_rk, stride_rp, stride_rq,
               negative_slope, HAS_SCALE, HAS_SHIFT, HAS_RES, ACT, INT64)


@triton.jit
def store_tile(acc, img, p, q, k_glob, mask_m, mask_n,
               out_ptr, stride_on, stride_ok, stride_op, stride_oq,
               scale_ptr, shift_ptr, res_ptr, stride_rn, stride_rk, stride_rp, stride_rq,
               negative_slope, HAS_SCALE: tl.constexpr, HAS_SHIFT: tl.constexpr,
               HAS_RES: tl.constexpr, ACT: tl.constexpr, INT64: tl.constexpr):
    """act(scale·acc + shift + residual) in fp32, one cast, one masked store; row ``i`` of
    the tile is pixel ``(img[i], p[i], q[i])``, column ``j`` is channel ``k_glob[j]``."""
    if INT64:
        img = img.to(tl.int64)
        p = p.to(tl.int64)
        q = q.to(tl.int64)
        k_glob = k_glob.to(tl.int64)
    if HAS_SCALE:
        acc = acc * tl.load(scale_ptr + k_glob, mask=mask_n, other=0.0).to(acc.dtype)[None, :]
    if HAS_SHIFT:
        acc = acc + tl.load(shift_ptr + k_glob, mask=mask_n, other=0.0).to(acc.dtype)[None, :]
    out_mask = mask_m[:, None] & mask_n[None, :]
    if HAS_RES:
        res = tl.load(res_ptr + (img * stride_rn + p * stride_rp + q * stride_rq)[:, None] +
                      (k_glob * stride_rk)[None, :], mask=out_mask, other=0.0)
        acc = acc + res.to(acc.dtype)
    acc = activation(acc, ACT, negative_slope)
    out_ptrs = out_ptr + (img * stride_on + p * stride_op + q * stride_oq)[:, None] + \
        (k_glob * stride_ok)[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _conv_fprop_kernel(
    # pointers
    x_ptr, w_ptr, out_ptr, scale_ptr, shift_ptr, res_ptr, ws_ptr,
    # sizes
    N, H, W, C_G, P, Q, K_G, R, S,
    # geometry
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    # strides (elements)
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_wk, stride_wc, stride_wr, stride_ws,
    stride_on, stride_ok, stride_op, stride_oq,
    stride_rn, stride_rk, stride_rp, stride_rq,
    negative_slope,
    # meta-parameters
    HAS_SCALE: tl.constexpr, HAS_SHIFT: tl.constexpr, HAS_RES: tl.constexpr,
    ACT: tl.constexpr, PRECISION: tl.constexpr, FLAT_K: tl.constexpr, TAP_ROWS: tl.constexpr,
    INT64: tl.constexpr,
    DOT_FP32: tl.constexpr,
    ROUND_TF32: tl.constexpr, ACC: tl.constexpr, SPLIT_K: tl.constexpr, BOUNDS: tl.constexpr,
    EVEN_C: tl.constexpr, ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    group = tl.program_id(1)
    pid_k = tl.program_id(2)
    M = N * P * Q
    if ROWS:
        # Tile rows are BLOCK_M consecutive columns q of one output row (n, p): contiguous
        # in a channels-first tensor, so loads and stores run along memory (rank 1 NCL).
        q_blocks = tl.cdiv(Q, BLOCK_M)
        pid_m, pid_n = tile_of(pid, N * P * q_blocks, tl.cdiv(K_G, BLOCK_N), GROUP_M)
        row = pid_m // q_blocks
        q = (pid_m - row * q_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = q < Q
        zero = tl.zeros_like(q)
        img = zero + row // P
        p = zero + row % P
    else:
        pid_m, pid_n = tile_of(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(K_G, BLOCK_N), GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < M
        # Loads address rows and columns modulo the matrix size (as the Triton matmul
        # tutorial does): the tail tile re-reads valid data instead of carrying a mask into
        # every load; the store masks it away.
        rows = offs_m % M
        img = rows // (P * Q)
        pq = rows % (P * Q)
        p = pq // Q
        q = pq % Q
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < K_G
    if INT64:  # element offsets can pass 2**31: widen before any stride product
        img = img.to(tl.int64)
        p = p.to(tl.int64)
        q = q.to(tl.int64)
    ih0 = p * stride_h - pad_h
    iw0 = q * stride_w - pad_w
    x_rows = x_ptr + img * stride_xn + (group * C_G) * stride_xc  # [BLOCK_M] pointers
    k_glob = group * K_G + offs_n
    k_load = group * K_G + offs_n % K_G
    if INT64:
        k_load = k_load.to(tl.int64)
    w_cols = w_ptr + k_load * stride_wk  # [BLOCK_N] pointers

    # This program's share of the reduction (all of it unless split-K).
    if TAP_ROWS:
        steps = R
    elif FLAT_K:
        red_total = R * S * C_G
        steps = tl.cdiv(red_total, BLOCK_K)
    else:
        c_steps = tl.cdiv(C_G, BLOCK_K)
        steps = R * S * c_steps
    per_split = tl.cdiv(steps, SPLIT_K)
    it_begin = pid_k * per_split
    it_end = min(steps, it_begin + per_split)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    if TAP_ROWS:
        offs_j = tl.arange(0, BLOCK_K)  # (s, c) of one kernel row, c fastest
        if INT64:
            offs_j = offs_j.to(tl.int64)
        s_j = offs_j // C_G
        c_j = offs_j % C_G
        run_ok = offs_j < S * C_G
        iw = iw0[:, None] + (s_j * dil_w)[None, :]
        a_ok = run_ok[None, :] & (iw >= 0) & (iw < W)
        a_base = x_rows[:, None] + iw * stride_xw + (c_j * stride_xc)[None, :]
        b_base = w_cols[None, :] + (c_j * stride_wc + s_j * stride_ws)[:, None]
        for r in range(it_begin, it_end):
            ih = ih0 + r * dil_h
            a = tl.load(a_base + (ih * stride_xh)[:, None],
                        mask=a_ok & ((ih >= 0) & (ih < H))[:, None], other=0.0)
            b = tl.load(b_base + r * stride_wr, mask=run_ok[:, None], other=0.0)
            acc = mma(a, b, acc, DOT_FP32, ROUND_TF32, PRECISION, ACC)
    elif FLAT_K:
        for red0 in range(it_begin * BLOCK_K, it_end * BLOCK_K, BLOCK_K):
            offs_red = red0 + tl.arange(0, BLOCK_K)
            mask_red = offs_red < red_total
            c = offs_red % C_G
            rs = offs_red // C_G
            r = rs // S
            s = rs % S
            ih = ih0[:, None] + (r * dil_h)[None, :]
            iw = iw0[:, None] + (s * dil_w)[None, :]
            a_mask = mask_red[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            if ROWS:  # tail columns are not wrapped: keep them off memory
                a_mask = a_mask & mask_m[:, None]
            a = tl.load(x_rows[:, None] + c[None, :] * stride_xc + ih * stride_xh + iw * stride_xw,
                        mask=a_mask, other=0.0)
            b = tl.load(w_cols[None, :] + (c * stride_wc + r * stride_wr + s * stride_ws)[:, None],
                        mask=mask_red[:, None], other=0.0)
            acc = mma(a, b, acc, DOT_FP32, ROUND_TF32, PRECISION, ACC)
    else:
        # Tap by tap: the tile pointers are loop-invariant bases plus one scalar offset per
        # step, so each step costs what a plain GEMM step costs (measured: recomputing the
        # per-element addresses every step ran 2x slower than a Triton GEMM on 1x1 convs).
        offs_c = tl.arange(0, BLOCK_K)
        a_base = (x_rows + ih0 * stride_xh + iw0 * stride_xw)[:, None] + \
            (offs_c * stride_xc)[None, :]
        b_base = w_cols[None, :] + (offs_c * stride_wc)[:, None]
        for it in range(it_begin, it_end):
            rs = it // c_steps
            c0 = (it % c_steps) * BLOCK_K
            r = rs // S
            s = rs % S
            a_ptrs = a_base + (r * dil_h * stride_xh + s * dil_w * stride_xw + c0 * stride_xc)
            b_ptrs = b_base + (r * stride_wr + s * stride_ws + c0 * stride_wc)
            if BOUNDS:  # padding: rows whose tap falls outside the input read zeros
                ih = ih0 + r * dil_h
                iw = iw0 + s * dil_w
                row_ok = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                if ROWS:
                    row_ok = row_ok & mask_m
                if EVEN_C:
                    a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
                else:
                    a = tl.load(a_ptrs, mask=row_ok[:, None] & (c0 + offs_c < C_G)[None, :],
                                other=0.0)
            else:
                if EVEN_C:
                    a = tl.load(a_ptrs)
                else:
                    a = tl.load(a_ptrs, mask=(c0 + offs_c < C_G)[None, :], other=0.0)
            if EVEN_C:
                b = tl.load(b_ptrs)
            else:
                b = tl.load(b_ptrs, mask=(c0 + offs_c < C_G)[:, None], other=0.0)
            acc = mma(a, b, acc, DOT_FP32, ROUND_TF32, PRECISION, ACC)

    if ROWS:
        store_tile(acc, img, p, q, k_glob, mask_m, mask_n,
                   out_ptr, stride_on, stride_ok, stride_op, stride_oq,
                   scale_ptr, shift_ptr, res_ptr, stride_rn, stride_rk, stride_rp, stride_rq,
                   negative_slope, HAS_SCALE, HAS_SHIFT, HAS_RES, ACT, INT64)
    elif SPLIT_K == 1:
        _epilogue_store(acc, offs_m, k_glob, mask_m, mask_n, P, Q,
                        out_ptr, stride_on, stride_ok, stride_op, stride_oq,
                        scale_ptr, shift_ptr, res_ptr, stride_rn, stride_rk, stride_rp, stride_rq,
                        negative_slope, HAS_SCALE, HAS_SHIFT, HAS_RES, ACT, INT64)
    else:
        # fp32 partial sums, [SPLIT_K, M, K] row-major; _splitk_reduce_kernel adds them in a
        # fixed order (deterministic) and applies the epilogue.
        k_total = K_G * tl.num_programs(1)
        rows = (pid_k * M + offs_m).to(tl.int64) * k_total
        tl.store(ws_ptr + rows[:, None] + k_glob[None, :], acc,
                 mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _splitk_reduce_kernel(
    ws_ptr, out_ptr, scale_ptr, shift_ptr, res_ptr,
    M, K, P, Q, split_stride,
    stride_on, stride_ok, stride_op, stride_oq,
    stride_rn, stride_rk, stride_rp, stride_rq,
    negative_slope,
    HAS_SCALE: tl.constexpr, HAS_SHIFT: tl.constexpr, HAS_RES: tl.constexpr,
    ACT: tl.constexpr, INT64: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < K
    mask = mask_m[:, None] & mask_n[None, :]
    ptrs = ws_ptr + offs_m.to(tl.int64)[:, None] * K + offs_n[None, :]
    acc = tl.load(ptrs, mask=mask, other=0.0)
    for split in tl.static_range(1, SPLIT_K):
        acc += tl.load(ptrs + split * split_stride, mask=mask, other=0.0)
    _epilogue_store(acc, offs_m, offs_n, mask_m, mask_n, P, Q,
                    out_ptr, stride_on, stride_ok, stride_op, stride_oq,
                    scale_ptr, shift_ptr, res_ptr, stride_rn, stride_rk, stride_rp, stride_rq,
                    negative_slope, HAS_SCALE, HAS_SHIFT, HAS_RES, ACT, INT64)


def launch_fprop(x4, w4, out4, epi: EpilogueArgs, geo: Geometry, *, precision, config, int64,
                 bounds_post=True):
    """Launch on 4-D (N, C, H, W)-indexed views (any strides); ``config.split_k > 1`` adds a
    partial-sum buffer and the reduce kernel, which applies the epilogue. Returns ``out4``.

    ``bounds_post`` says whether any tap can fall past the end of the input (padding
    after): without it or padding before (``geo.pad``), no bounds test runs.
    """
    grid, args, meta, reduce = _fprop_launch(x4, w4, out4, epi, geo, precision, config,
                                             int64, bounds_post)
    launch(_conv_fprop_kernel, grid, *args, **meta)
    if reduce is not None:
        launch(_splitk_reduce_kernel, *reduce[0], **reduce[1])
    return out4


def prepare_fprop(x4, w4, out4, epi: EpilogueArgs, geo: Geometry, *, precision, config,
                  int64, bounds_post=True):
    """:func:`launch_fprop`, returning the launch for later calls of the same plan
    (``launch.Prepared``, called with ``x4, w4, out4`` and the scale, shift and residual
    tensors, ``out4`` in place of each one absent), or None where there is none to reuse
    (split-K: two launches; the interpreter)."""
    grid, args, meta, reduce = _fprop_launch(x4, w4, out4, epi, geo, precision, config,
                                             int64, bounds_post)
    if reduce is not None:
        launch(_conv_fprop_kernel, grid, *args, **meta)
        launch(_splitk_reduce_kernel, *reduce[0], **reduce[1])
        return None
    return prepare(_conv_fprop_kernel, grid, PREPARED_TENSORS, *args, **meta)


#: the leading tensor arguments of a prepared forward launch: x, w, out, scale, shift,
#: residual and the split-K buffer (``out`` again without split-K)
PREPARED_TENSORS = 7


def _fprop_launch(x4, w4, out4, epi: EpilogueArgs, geo: Geometry, precision, config, int64,
                  bounds_post):
    """(grid, arguments, constexprs) of the forward kernel and, with split-K, ((grid,
    *arguments), constexprs) of its reduce kernel, else None."""
    scale, shift, res4, act_code, negative_slope = epi
    stride, pad, dilation, groups = geo
    n, c, h, w = x4.shape
    k, c_g, r, s = w4.shape
    _, _, p, q = out4.shape
    k_g = k // groups
    m = n * p * q
    split = config.split_k
    rows = config.rows
    assert not (rows and split > 1), "row tiles do not split the reduction"
    m_tiles = n * p * cdiv(q, config.block_m) if rows else cdiv(m, config.block_m)
    grid = (m_tiles * cdiv(k_g, config.block_n), groups, split)
    dummy = out4  # never read: the matching HAS_* flag is False
    res_strides = strides(res4) if res4 is not None else (0, 0, 0, 0)
    ws = torch.empty((split, m, k), device=x4.device, dtype=accumulate_dtype(x4.dtype)) \
        if split > 1 else dummy
    epi = dict(HAS_SCALE=scale is not None, HAS_SHIFT=shift is not None,
               HAS_RES=res4 is not None, ACT=act_code, INT64=int64)
    epi_ptrs = (scale if scale is not None else dummy, shift if shift is not None else dummy,
                res4 if res4 is not None else dummy)
    args = (x4, w4, out4, *epi_ptrs, ws,
            n, h, w, c_g, p, q, k_g, r, s,
            stride[0], stride[1], pad[0], pad[1], dilation[0], dilation[1],
            *strides(x4), *strides(w4), *strides(out4), *res_strides,
            float(negative_slope))
    meta = dict(
        PRECISION=precision, FLAT_K=config.flat_k, TAP_ROWS=config.tap_rows,
        # The interpreter computes a bf16 tl.dot wrongly (seen with triton 3.6): give it fp32.
        DOT_FP32=INTERPRETED and x4.dtype == torch.bfloat16,
        ROUND_TF32=precision == "tf32" and x4.dtype == torch.float32,
        ACC=acc_type(x4.dtype), SPLIT_K=split,
        BOUNDS=any(pad) or bounds_post or rows, EVEN_C=c_g % config.block_k == 0, ROWS=rows,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        GROUP_M=8, num_warps=config.num_warps, num_stages=config.num_stages, **epi)
    reduce = None
    if split > 1:
        bm, bn = 64, 64
        reduce = (((cdiv(m, bm), cdiv(k, bn)), ws, out4, *epi_ptrs, m, k, p, q, m * k,
                   *strides(out4), *res_strides, float(negative_slope)),
                  dict(SPLIT_K=split, BLOCK_M=bm, BLOCK_N=bn, num_warps=4, **epi))
    return grid, args, meta, reduce
