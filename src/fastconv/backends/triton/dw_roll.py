"""Depthwise forward (and stride-1 data gradient) for channels-last tensors, each input row
loaded once per program: rolling accumulators down the rows.

depthwise.py's channels-last tile loads every tap's shifted ``[positions × channels]``
window: ``R·S`` loads and ``R·S`` conversions to fp32 per output element (49 of each for
ConvNeXt's 7x7), besides the ``R·S`` multiply-adds. Its best tile reached 0.55-0.75x cuDNN's
bf16 channels-last kernels (benchmarks/NOTES.md).

Here a program owns a ``[BLOCK_Q columns × BLOCK_C channels]`` strip of ``ROWS`` consecutive
output rows of one image and walks down it. Output row ``p`` reads input rows
``p·σ − π + r`` (``r < R``), so each input row feeds ``NA = ⌈R/σ⌉`` consecutive output
rows. The program keeps one accumulator tile per pending output row (``a0`` for the row
finished next, up to ``a6``) and, at each step, loads the ``σ`` input rows that the newest
pending row needs first: each as ``S`` column-shifted tiles (the column taps come from
L1), converted once and added into every pending accumulator it feeds, with the tap
``r`` that joins them. Then ``a0`` is finished (epilogue, store) and the accumulators
roll: ``a0 ← a1 ← … ← 0``. Per output element: ``σ·S`` loads and conversions instead of
``R·S``; the multiply-adds are the same. Rows outside the image are skipped whole (a
runtime branch), so they add nothing even against non-finite weights; padded columns
follow depthwise.py's rule (a select where a weight is non-finite).

The stride-1, multiplier-1 data gradient is the same walk over ``dy`` with the kernel
flipped (``FLIP``) and the padding ``R − 1 − π``: ``dx[h] = Σ_r dy[h + π − r] · w[r]``.

Requirements (``eligible``): channels-last (NHWC / NLC), one input channel per output
(depthwise), unit row dilation, ``NA ≤ 7``.

Measured on an H100 in bf16 (benchmarks/NOTES.md, "Depthwise channels-last: rolling rows"):
0.60x cuDNN's forward and 0.83x its data gradient over 32 model layers, 1.04-1.59x on the
7x7 data gradients; limited by re-reading the weights from L1 at low occupancy. Dispatch
times its tiles beside cuDNN's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import acc_type
from .depthwise import any_nonfinite, finish, plain_strides, tap
from .launch import Prepared, cdiv, prepare
from .launchargs import NO_EPILOGUE, EpilogueArgs, Geometry

__all__ = ["eligible", "dgrad_eligible", "pack_weight", "launch_fprop", "launch_dgrad"]

#: Accumulators the kernel holds (``a0 … a6``): at most this many output rows pending.
MAX_PENDING = 7


def pending(r: int, stride_h: int) -> int:
    """``NA``: output rows one input row feeds."""
    return -(-r // stride_h)


def eligible(*, channels_last: bool, c_per_group: int, kernel: tuple, stride: tuple,
             dilation: tuple) -> bool:
    """Whether the forward can run here (4-D terms: rank 1 is H = 1)."""
    return (channels_last and c_per_group == 1 and dilation[0] == 1
            and pending(kernel[0], stride[0]) <= MAX_PENDING)


def dgrad_eligible(*, channels_last: bool, c_per_group: int, multiplier: int, kernel: tuple,
                   stride: tuple, dilation: tuple) -> bool:
    """Whether the data gradient can run here: stride 1 and one output channel per input."""
    return (multiplier == 1 and stride == (1, 1)
            and eligible(channels_last=channels_last, c_per_group=c_per_group, kernel=kernel,
                         stride=stride, dilation=dilation))


@triton.jit
def _add_tap(acc, xv, w_base, wmask, ok, r: tl.constexpr, s: tl.constexpr, R: tl.constexpr,
             S: tl.constexpr, FLIP: tl.constexpr, BLOCK_C: tl.constexpr,
             SKIP_PADDED: tl.constexpr):
    """``acc + xv·w[r, s]`` (tap ``r`` when it exists: an input row beyond the kernel's
    reach of this accumulator adds nothing). The tap's offset is a compile-time constant
    (see ``pack_weight``); ``wmask``: the tile's outputs (channels past K hold no weight)."""
    if r < R:
        if FLIP:
            wv = tl.load(w_base + ((R - 1 - r) * S + S - 1 - s) * BLOCK_C, mask=wmask,
                         other=0.0)
        else:
            wv = tl.load(w_base + (r * S + s) * BLOCK_C, mask=wmask, other=0.0)
        acc = tap(acc, xv, wv, ok, SKIP_PADDED)
    return acc


@triton.jit
def _roll(x_base, w_base, out_ptr, scale_ptr, shift_ptr, res_ptr, n, k, kmask, q, omask, iw0,
          p0, p_end, H, W, pad_h, dil_w, sxh, sxw,
          son, sok, sop, soq, srn, srk, srp, srq, negative_slope,
          R: tl.constexpr, S: tl.constexpr, SH: tl.constexpr, NA: tl.constexpr,
          FLIP: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_SHIFT: tl.constexpr,
          HAS_RES: tl.constexpr, ACT: tl.constexpr, ACC: tl.constexpr,
          SKIP_PADDED: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr):
    """The walk down output rows ``[p0, p_end)`` (module docstring). At step ``t`` the
    accumulator ``a{i}`` holds output row ``p0 + t + i``; the steps before ``t = 0`` only
    load the rows that the first outputs need."""
    a0 = tl.zeros([BLOCK_Q, BLOCK_C], ACC)
    a1 = tl.zeros([BLOCK_Q, BLOCK_C], ACC)
    a2 = tl.zeros([BLOCK_Q, BLOCK_C], ACC)
    a3 = tl.zeros([BLOCK_Q, BLOCK_C], ACC)
    a4 = tl.zeros([BLOCK_Q, BLOCK_C], ACC)
    a5 = tl.zeros([BLOCK_Q, BLOCK_C], ACC)
    a6 = tl.zeros([BLOCK_Q, BLOCK_C], ACC)
    for t in range(1 - NA, p_end - p0):
        p = p0 + t
        for u in tl.static_range(SH):
            # the input row whose tap into output row p + i is r = (NA - 1 - i)·SH + u
            ih = (p + NA - 1) * SH - pad_h + u
            if (ih >= 0) & (ih < H):
                row = x_base + ih * sxh
                for s in tl.static_range(S):
                    iw = iw0 + s * dil_w
                    ok = omask & (iw >= 0) & (iw < W)
                    xv = tl.load(row + s * dil_w * sxw, mask=ok, other=0.0).to(ACC)
                    a0 = _add_tap(a0, xv, w_base, omask, ok, (NA - 1) * SH + u, s, R, S, FLIP,
                                   BLOCK_C, SKIP_PADDED)
                    if NA > 1:
                        a1 = _add_tap(a1, xv, w_base, omask, ok, (NA - 2) * SH + u, s, R, S, FLIP,
                                       BLOCK_C, SKIP_PADDED)
                    if NA > 2:
                        a2 = _add_tap(a2, xv, w_base, omask, ok, (NA - 3) * SH + u, s, R, S, FLIP,
                                       BLOCK_C, SKIP_PADDED)
                    if NA > 3:
                        a3 = _add_tap(a3, xv, w_base, omask, ok, (NA - 4) * SH + u, s, R, S, FLIP,
                                       BLOCK_C, SKIP_PADDED)
                    if NA > 4:
                        a4 = _add_tap(a4, xv, w_base, omask, ok, (NA - 5) * SH + u, s, R, S, FLIP,
                                       BLOCK_C, SKIP_PADDED)
                    if NA > 5:
                        a5 = _add_tap(a5, xv, w_base, omask, ok, (NA - 6) * SH + u, s, R, S, FLIP,
                                       BLOCK_C, SKIP_PADDED)
                    if NA > 6:
                        a6 = _add_tap(a6, xv, w_base, omask, ok, (NA - 7) * SH + u, s, R, S, FLIP,
                                       BLOCK_C, SKIP_PADDED)
        if t >= 0:
            finish(a0, out_ptr, scale_ptr, shift_ptr, res_ptr, n, k, kmask, p, q, omask,
                    son, sok, sop, soq, srn, srk, srp, srq, negative_slope, HAS_SCALE,
                    HAS_SHIFT, HAS_RES, ACT, ACC)
        a0 = a1
        a1 = a2
        a2 = a3
        a3 = a4
        a4 = a5
        a5 = a6
        a6 = tl.zeros([BLOCK_Q, BLOCK_C], ACC)


@triton.jit
def _dw_roll_kernel(
    x_ptr, w_ptr, out_ptr, scale_ptr, shift_ptr, res_ptr,
    H, W, K, P, Q, KG, ROWS,
    stride_w, pad_h, pad_w, dil_w,
    sxn, sxc, sxh, sxw, son, sok, sop, soq, srn, srk, srp, srq,
    negative_slope,
    R: tl.constexpr, S: tl.constexpr, SH: tl.constexpr, NA: tl.constexpr, FLIP: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_SHIFT: tl.constexpr, HAS_RES: tl.constexpr,
    ACT: tl.constexpr, ACC: tl.constexpr, INT64: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # program (image n, row block, column block) x channel block
    pid = tl.program_id(0)
    q_blocks = tl.cdiv(Q, BLOCK_Q)
    row_blocks = tl.cdiv(P, ROWS)
    qb = pid % q_blocks
    rest = pid // q_blocks
    pb = rest % row_blocks
    n = rest // row_blocks
    if INT64:
        n = n.to(tl.int64)
    q = (qb * BLOCK_Q + tl.arange(0, BLOCK_Q))[:, None]
    c_in = tl.arange(0, BLOCK_C)[None, :]
    k = tl.program_id(1) * BLOCK_C + c_in
    kmask = k < K
    omask = (q < Q) & kmask
    iw0 = q * stride_w - pad_w
    x_base = x_ptr + n * sxn + (k // KG) * sxc + iw0 * sxw
    # this channel block's weights (pack_weight), as [BLOCK_Q, BLOCK_C] tiles (each column
    # the same): loaded in the tile's own layout, no layout conversion per tap
    w_block = w_ptr + tl.program_id(1) * (R * S * BLOCK_C)
    w_base = w_block + c_in + q * 0
    p0 = pb * ROWS
    p_end = tl.minimum(p0 + ROWS, P)
    if any_nonfinite(w_block, c_in, 0, S * BLOCK_C, BLOCK_C, kmask, 1, R, S, ACC,
                      R * S <= 25):
        _roll(x_base, w_base, out_ptr, scale_ptr, shift_ptr, res_ptr, n, k, kmask, q, omask,
              iw0, p0, p_end, H, W, pad_h, dil_w, sxh, sxw,
              son, sok, sop, soq, srn, srk, srp, srq, negative_slope, R, S, SH, NA, FLIP,
              HAS_SCALE, HAS_SHIFT, HAS_RES, ACT, ACC, True, BLOCK_Q, BLOCK_C)
    else:
        _roll(x_base, w_base, out_ptr, scale_ptr, shift_ptr, res_ptr, n, k, kmask, q, omask,
              iw0, p0, p_end, H, W, pad_h, dil_w, sxh, sxw,
              son, sok, sop, soq, srn, srk, srp, srq, negative_slope, R, S, SH, NA, FLIP,
              HAS_SCALE, HAS_SHIFT, HAS_RES, ACT, ACC, False, BLOCK_Q, BLOCK_C)


def pack_weight(w4: torch.Tensor, block_c: int) -> torch.Tensor:
    """A depthwise weight (K, 1, R, S) as the kernel reads it: fp32 (float64 stays), blocks
    of ``block_c`` channels, each block tap by tap with its channels fastest:
    (⌈K/block_c⌉, R·S, block_c), the last block's slots past K left unwritten (the kernel
    masks them). A tap's offset in a block is then a compile-time constant (an immediate
    of the load), with no per-tap address kept live across the row loop. One copy kernel
    (two where K is not a multiple of ``block_c``)."""
    k, _, r, s = w4.shape
    acc = torch.float64 if w4.dtype == torch.float64 else torch.float32
    full, tail = divmod(k, block_c)
    packed = torch.empty((full + (tail > 0), r * s, block_c), dtype=acc, device=w4.device)
    by_channel = packed.transpose(1, 2)  # (blocks, block_c, R·S)
    flat = w4.detach().reshape(k, r * s)
    if full:
        by_channel[:full].copy_(flat[:full * block_c].view(full, block_c, r * s))
    if tail:
        by_channel[full, :tail].copy_(flat[full * block_c:])
    return packed


def launch_fprop(x4, wp, out4, epi: EpilogueArgs, geo: Geometry, *, kernel, config,
                 int64: bool, flip: bool = False) -> Prepared | None:
    """The forward on 4-D (N, C, H, W)-indexed channels-last views; ``wp``: the weight
    (K, 1, *kernel) as ``pack_weight(w4, config.block_b)`` gives it. ``flip``: with the
    kernel flipped (the data gradient's walk; ``x4`` is then ``dy``). ``config``: a
    ``DwConfig`` with ``roll`` rows per program, ``block_a`` columns, ``block_b`` channels.
    Returns the launch prepared as depthwise.launch_fprop's."""
    scale, shift, res4, act_code, negative_slope = epi
    stride, pad, dilation, _ = geo
    n, c, h, w = x4.shape
    _, k, p, q = out4.shape
    r, s = kernel
    dummy = out4  # never read: the matching HAS_* flag is False
    res_strides = plain_strides(res4) if res4 is not None else (0, 0, 0, 0)
    grid = (n * cdiv(p, config.roll) * cdiv(q, config.block_a), cdiv(k, config.block_b))
    return prepare(_dw_roll_kernel, grid, 6,
        x4, wp, out4, scale if scale is not None else dummy,
        shift if shift is not None else dummy, res4 if res4 is not None else dummy,
        h, w, k, p, q, k // c, config.roll, stride[1], pad[0], pad[1], dilation[1],
        *plain_strides(x4), *plain_strides(out4), *res_strides, float(negative_slope),
        R=r, S=s, SH=stride[0], NA=pending(r, stride[0]), FLIP=flip,
        HAS_SCALE=scale is not None, HAS_SHIFT=shift is not None, HAS_RES=res4 is not None,
        ACT=act_code, ACC=acc_type(x4.dtype), INT64=int64, BLOCK_Q=config.block_a,
        BLOCK_C=config.block_b, num_warps=config.num_warps)


def launch_dgrad(dy4, wp, dx4, geo: Geometry, *, kernel, config,
                 int64: bool) -> Prepared | None:
    """``dx`` of a stride-1, multiplier-1 depthwise convolution (``dgrad_eligible``): the
    forward walk over ``dy`` with the kernel flipped. Returns the launch prepared as
    :func:`launch_fprop`'s (called with ``dy4, wp, dx4`` and ``dx4`` three times more)."""
    r, s = kernel
    _, pad, dilation, groups = geo
    flipped_pad = ((r - 1) * dilation[0] - pad[0], (s - 1) * dilation[1] - pad[1])
    return launch_fprop(dy4, wp, dx4, NO_EPILOGUE,
                        Geometry((1, 1), flipped_pad, dilation, groups), kernel=kernel,
                        config=config, int64=int64, flip=True)
