"""Batch-norm statistics, normalisation + activation, and their backward, as Triton kernels.

A convolution output ``y`` is viewed as ``(N, C, S)`` with its own strides (NCHW, NHWC or
rank 1 alike); rows are the ``N·S`` positions of one channel. Every kernel walks tiles of
``BLOCK_R`` rows by ``BLOCK_C`` channels (each pass its own: ``PASS_TILES``), so each pass
reads ``y`` once:

* forward: per-program (mean, M2) partials, each over ``TILES`` consecutive row tiles
  combined in order -> a finalize that combines the programs' partials in a fixed order
  (Chan's formula: deterministic, no atomics, no E[x²]−E[x]² cancellation) and updates the
  running statistics -> ``z = act(y·scale + shift (+ residual))``;
* backward: per-program sums of ``du`` and ``du·x̂`` (``du = act'·dz``, recomputed from
  ``z`` or from the pre-activation) -> one reduction over programs -> ``dy`` (and ``du``
  for a residual).

The partial passes run at most ``PARTIALS`` row programs per channel block (``TILES`` tiles
each, set by the row count alone, so the result does not depend on the GPU): one program
per 64-row tile left the finalize, one program per 32 channels, 12,544 partials to walk on a
ResNet-50 layer at batch 256 (10.4 ms of its 59 ms training step on an H200, 2026-11-27).

Statistics and arithmetic are float32 for half and single inputs, float64 for float64 ones.
The activation codes are epilogue.ACTIVATIONS', as in the convolution kernels.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ...epilogue import ACTIVATIONS
from ...precision import accumulate_dtype
from .common import activation, serialized
from .launch import INTERPRETED, Fixed, cdiv

BLOCK_T = 64  # partial-statistics tiles combined at once by the finalize
PARTIALS = 512  # row programs per channel block of the partial passes, at most


class Tile(NamedTuple):
    block_r: int  # rows (positions) of a tile
    block_c: int  # channels of a tile
    num_warps: int


#: each pass's tile, the fastest per pass in ``benchmarks/sweep.py --bn`` (H200, bf16
#: channels-last ResNet-50 b256 activations, results/kernels/bnstats/2026-11-27/): against
#: one 64x64 4-warp tile for every pass, statistics 1.45-1.67x faster on the three large
#: shapes (equal on 256x512x7x7), the backward apply 1.05-1.20x; the others best at 64x64
PASS_TILES = {"stats": Tile(256, 32, 4), "apply": Tile(64, 64, 4),
              "backward_sums": Tile(64, 64, 4), "backward_apply": Tile(64, 64, 8)}


def usable(y: torch.Tensor) -> bool:
    """Whether these kernels can run on ``y``'s device in this process."""
    if INTERPRETED:
        return y.device.type == "cpu"
    return y.is_cuda and torch.cuda.get_device_capability(y.device) >= (8, 0)


def _view(t: torch.Tensor) -> tuple[int, int, int, int, int, int]:
    """(N, C, S, stride N, stride C, stride S) of a tensor whose trailing dims are one
    flat spatial dim (true of contiguous and channels-last tensors)."""
    shape, stride = t.shape, t.stride()
    if len(shape) <= 2:
        return shape[0], shape[1], 1, stride[0], stride[1], 1
    return shape[0], shape[1], math.prod(shape[2:]), stride[0], stride[1], stride[-1]


def _flat_spatial(t: torch.Tensor) -> bool:
    if t.dim() <= 3:
        return True
    expect = t.stride(-1)
    for size, stride in zip(reversed(t.shape[2:]), reversed(t.stride()[2:])):
        if size != 1 and stride != expect:
            return False
        expect *= size
    return True


def supports(y: torch.Tensor) -> bool:
    """The kernels index ``(N, C, S)`` with one spatial stride: ``y`` needs a flat spatial
    part (the other operands are laid out like ``y`` by the caller)."""
    return _flat_spatial(y)


def _acc(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


@triton.jit
def _tile(r0, c0, R, C, S, s_n, s_c, s_s, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = r0 + tl.arange(0, BLOCK_R)
    cols = c0 + tl.arange(0, BLOCK_C)
    n = rows // S
    s = rows - n * S
    offs = (n * s_n + s * s_s)[:, None] + (cols * s_c)[None, :]
    mask = (rows < R)[:, None] & (cols < C)[None, :]
    return offs, mask, cols, cols < C


@triton.jit
def _stats_partials_kernel(y_ptr, part_ptr, R, C, S, s_n, s_c, s_s, TILES,
                           ACC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # (mean, M2) of rows [t·TILES·BLOCK_R, (t+1)·TILES·BLOCK_R): each tile's, combined into
    # the running pair in order by Chan's formula; part is (2, T, C): means, then M2s
    t = tl.program_id(0)
    T = tl.num_programs(0)
    c0 = tl.program_id(1) * BLOCK_C
    cols = c0 + tl.arange(0, BLOCK_C)
    cmask = cols < C
    n = tl.zeros([BLOCK_C], ACC)
    mean = tl.zeros([BLOCK_C], ACC)
    m2 = tl.zeros([BLOCK_C], ACC)
    for i in range(TILES):
        r0 = (t * TILES + i) * BLOCK_R
        offs, mask, cols, cmask = _tile(r0, c0, R, C, S, s_n, s_c, s_s, BLOCK_R, BLOCK_C)
        y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(ACC)
        count = tl.maximum(tl.minimum(R - r0, BLOCK_R), 0).to(ACC)
        tmean = tl.sum(y, axis=0) / tl.maximum(count, 1.0)
        d = tl.where(mask, y - tmean[None, :], 0.0)
        total = n + count
        delta = tmean - mean
        share = count / tl.maximum(total, 1.0)
        mean += delta * share
        m2 += tl.sum(d * d, axis=0) + delta * delta * n * share
        n = total
    tl.store(part_ptr + t * C + cols, mean, mask=cmask)
    tl.store(part_ptr + (T + t) * C + cols, m2, mask=cmask)


@triton.jit
def _stats_finalize_kernel(part_ptr, gamma_ptr, beta_ptr, out_ptr, rmean_ptr, rvar_ptr,
                           T, R, ROWS, n, C, eps, momentum,
                           HAS_GAMMA: tl.constexpr, HAS_BETA: tl.constexpr,
                           HAS_RUNNING: tl.constexpr, ACC: tl.constexpr,
                           BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    # The partials' (count, mean, M2) (``ROWS`` rows each, the last one fewer) combined
    # exactly as Chan's pairwise formula does, in two fixed-order passes:
    # mean = Σ nₜ·meanₜ / n, then M2 = Σ M2ₜ + nₜ·(meanₜ − mean)². ``out`` is (5, C):
    # mean, variance, invstd, scale, shift.
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    total = tl.zeros([BLOCK_C], ACC)
    for t0 in range(0, T, BLOCK_T):
        ts = t0 + tl.arange(0, BLOCK_T)
        nt = tl.minimum(R - ts * ROWS, ROWS).to(ACC)
        m = (ts < T)[:, None] & cmask[None, :]
        mt = tl.load(part_ptr + ts[:, None] * C + cols[None, :], mask=m, other=0.0)
        total += tl.sum(tl.where(m, nt[:, None] * mt, 0.0), axis=0)
    mean = total / n
    m2 = tl.zeros([BLOCK_C], ACC)
    for t0 in range(0, T, BLOCK_T):
        ts = t0 + tl.arange(0, BLOCK_T)
        nt = tl.minimum(R - ts * ROWS, ROWS).to(ACC)
        m = (ts < T)[:, None] & cmask[None, :]
        mt = tl.load(part_ptr + ts[:, None] * C + cols[None, :], mask=m, other=0.0)
        m2t = tl.load(part_ptr + (T + ts[:, None]) * C + cols[None, :], mask=m, other=0.0)
        d = mt - mean[None, :]
        m2 += tl.sum(tl.where(m, m2t + nt[:, None] * d * d, 0.0), axis=0)
    var = m2 / n
    invstd = 1.0 / tl.sqrt(var + eps)
    scale = invstd
    if HAS_GAMMA:
        scale = scale * tl.load(gamma_ptr + cols, mask=cmask, other=1.0).to(ACC)
    shift = -mean * scale
    if HAS_BETA:
        shift += tl.load(beta_ptr + cols, mask=cmask, other=0.0).to(ACC)
    tl.store(out_ptr + cols, mean, mask=cmask)
    tl.store(out_ptr + C + cols, var, mask=cmask)
    tl.store(out_ptr + 2 * C + cols, invstd, mask=cmask)
    tl.store(out_ptr + 3 * C + cols, scale, mask=cmask)
    tl.store(out_ptr + 4 * C + cols, shift, mask=cmask)
    if HAS_RUNNING:  # torch.nn.BatchNorm: the unbiased variance goes into running_var
        rm = tl.load(rmean_ptr + cols, mask=cmask).to(ACC)
        rv = tl.load(rvar_ptr + cols, mask=cmask).to(ACC)
        tl.store(rmean_ptr + cols, rm + momentum * (mean - rm), mask=cmask)
        tl.store(rvar_ptr + cols, rv + momentum * (m2 / (n - 1.0) - rv), mask=cmask)


@triton.jit
def _apply_kernel(y_ptr, res_ptr, z_ptr, scale_ptr, shift_ptr, R, C, S, s_n, s_c, s_s,
                  negative_slope, HAS_RES: tl.constexpr, ACT: tl.constexpr, ACC: tl.constexpr,
                  BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    offs, mask, cols, cmask = _tile(tl.program_id(0) * BLOCK_R, tl.program_id(1) * BLOCK_C,
                                    R, C, S, s_n, s_c, s_s, BLOCK_R, BLOCK_C)
    scale = tl.load(scale_ptr + cols, mask=cmask, other=0.0)
    shift = tl.load(shift_ptr + cols, mask=cmask, other=0.0)
    u = tl.load(y_ptr + offs, mask=mask, other=0.0).to(ACC) * scale[None, :] + shift[None, :]
    if HAS_RES:
        u += tl.load(res_ptr + offs, mask=mask, other=0.0).to(ACC)
    z = activation(u, ACT, negative_slope)
    tl.store(z_ptr + offs, z.to(z_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _activation_grad(dz, z, y_ptr, res_ptr, offs, mask, scale, shift, negative_slope,
                     HAS_RES: tl.constexpr, ACT: tl.constexpr, ACC: tl.constexpr):
    """``act'(u)·dz``; from the output ``z`` where it determines the derivative, else from
    the pre-activation ``u = y·scale + shift (+ residual)``, recomputed."""
    if ACT == 0:
        du = dz
    elif ACT == 1:  # relu
        du = tl.where(z > 0, dz, 0.0)
    elif ACT == 2:  # relu6
        du = tl.where((z > 0) & (z < 6.0), dz, 0.0)
    elif ACT == 7:  # sigmoid
        du = dz * z * (1.0 - z)
    elif ACT == 8:  # tanh
        du = dz * (1.0 - z * z)
    else:
        u = tl.load(y_ptr + offs, mask=mask, other=0.0).to(ACC) * scale[None, :] \
            + shift[None, :]
        if HAS_RES:
            u += tl.load(res_ptr + offs, mask=mask, other=0.0).to(ACC)
        if ACT == 3:  # leaky_relu
            du = tl.where(u > 0, dz, dz * negative_slope)
        elif ACT == 4:  # silu
            sg = tl.sigmoid(u)
            du = dz * sg * (1.0 + u * (1.0 - sg))
        elif ACT == 5:  # gelu (erf); constants in ACC (a bare literal is float32)
            cdf = 0.5 * (1.0 + tl.math.erf(u * tl.full((), 0.7071067811865476, ACC)))
            du = dz * (cdf + u * tl.full((), 0.3989422804014327, ACC) * tl.exp(-0.5 * u * u))
        elif ACT == 6:  # gelu_tanh
            k = tl.full((), 0.7978845608028654, ACC)
            kappa = tl.full((), 0.044715, ACC)
            th = 2.0 * tl.sigmoid(2.0 * k * (u + kappa * u * u * u)) - 1.0
            du = dz * (0.5 * (1.0 + th)
                       + 0.5 * u * (1.0 - th * th) * k * (1.0 + 3.0 * kappa * u * u))
        else:  # hardswish, as torch's hardswish_backward
            du = dz * tl.where(u < -3.0, 0.0, tl.where(u <= 3.0, u / 3.0 + 0.5, 1.0))
    return du


@triton.jit
def _backward_partials_kernel(dz_ptr, z_ptr, y_ptr, res_ptr, mean_ptr, invstd_ptr,
                              scale_ptr, shift_ptr, sums_ptr, T, R, C, S, s_n, s_c, s_s,
                              negative_slope, TILES, HAS_RES: tl.constexpr,
                              ACT: tl.constexpr, ACC: tl.constexpr, BLOCK_R: tl.constexpr,
                              BLOCK_C: tl.constexpr):
    # sums of du and du·x̂ over rows [t·TILES·BLOCK_R, (t+1)·TILES·BLOCK_R)
    t = tl.program_id(0)
    c0 = tl.program_id(1) * BLOCK_C
    cols = c0 + tl.arange(0, BLOCK_C)
    cmask = cols < C
    scale = tl.load(scale_ptr + cols, mask=cmask, other=0.0)
    shift = tl.load(shift_ptr + cols, mask=cmask, other=0.0)
    mean = tl.load(mean_ptr + cols, mask=cmask, other=0.0)
    invstd = tl.load(invstd_ptr + cols, mask=cmask, other=0.0)
    sum_du = tl.zeros([BLOCK_C], ACC)
    sum_du_xhat = tl.zeros([BLOCK_C], ACC)
    for i in range(TILES):
        offs, mask, cols, cmask = _tile((t * TILES + i) * BLOCK_R, c0, R, C, S, s_n, s_c,
                                        s_s, BLOCK_R, BLOCK_C)
        dz = tl.load(dz_ptr + offs, mask=mask, other=0.0).to(ACC)
        z = tl.load(z_ptr + offs, mask=mask, other=0.0).to(ACC)
        du = _activation_grad(dz, z, y_ptr, res_ptr, offs, mask, scale, shift,
                              negative_slope, HAS_RES, ACT, ACC)
        du = tl.where(mask, du, 0.0)
        xhat = (tl.load(y_ptr + offs, mask=mask, other=0.0).to(ACC) - mean[None, :]) \
            * invstd[None, :]
        sum_du += tl.sum(du, axis=0)
        sum_du_xhat += tl.sum(du * xhat, axis=0)
    tl.store(sums_ptr + t * C + cols, sum_du, mask=cmask)
    tl.store(sums_ptr + (T + t) * C + cols, sum_du_xhat, mask=cmask)


@triton.jit
def _backward_apply_kernel(dz_ptr, z_ptr, y_ptr, res_ptr, mean_ptr, invstd_ptr, scale_ptr,
                           shift_ptr, sums_ptr, dy_ptr, dres_ptr, R, C, S, s_n, s_c, s_s,
                           count, negative_slope, HAS_RES: tl.constexpr, ACT: tl.constexpr,
                           ACC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    offs, mask, cols, cmask = _tile(tl.program_id(0) * BLOCK_R, tl.program_id(1) * BLOCK_C,
                                    R, C, S, s_n, s_c, s_s, BLOCK_R, BLOCK_C)
    scale = tl.load(scale_ptr + cols, mask=cmask, other=0.0)
    shift = tl.load(shift_ptr + cols, mask=cmask, other=0.0)
    dz = tl.load(dz_ptr + offs, mask=mask, other=0.0).to(ACC)
    z = tl.load(z_ptr + offs, mask=mask, other=0.0).to(ACC)
    du = _activation_grad(dz, z, y_ptr, res_ptr, offs, mask, scale, shift, negative_slope,
                          HAS_RES, ACT, ACC)
    mean = tl.load(mean_ptr + cols, mask=cmask, other=0.0)
    invstd = tl.load(invstd_ptr + cols, mask=cmask, other=0.0)
    mean_du = tl.load(sums_ptr + cols, mask=cmask, other=0.0) / count
    mean_du_xhat = tl.load(sums_ptr + C + cols, mask=cmask, other=0.0) / count
    xhat = (tl.load(y_ptr + offs, mask=mask, other=0.0).to(ACC) - mean[None, :]) \
        * invstd[None, :]
    dy = scale[None, :] * (du - mean_du[None, :] - xhat * mean_du_xhat[None, :])
    tl.store(dy_ptr + offs, dy.to(dy_ptr.dtype.element_ty), mask=mask)
    if HAS_RES:
        tl.store(dres_ptr + offs, du.to(dres_ptr.dtype.element_ty), mask=mask)


def _or(t: torch.Tensor | None, dummy: torch.Tensor) -> torch.Tensor:
    return dummy if t is None else t


def partials(tiles: int) -> tuple[int, int]:
    """(row programs, tiles each) of a partial pass over ``tiles`` row tiles: at most
    ``PARTIALS`` programs, from the row count alone (deterministic on every GPU)."""
    each = cdiv(tiles, PARTIALS)
    return cdiv(tiles, each), each


class Finalize(NamedTuple):
    """What the statistics' finalize does beyond mean and variance: γ, β (scale and shift)
    and the running statistics updated in place, with ``eps`` and ``momentum``."""

    has_gamma: bool
    has_beta: bool
    has_running: bool
    eps: float
    momentum: float


#: the finalize of statistics alone (no γ, β or running statistics): a process group's
#: local pass, whose (mean, variance) are combined over the ranks before anything else
STATS_ONLY = Finalize(False, False, False, 1.0, 0.0)


class Passes:
    """The training passes of one batch norm + activation (a plan): for outputs ``y`` of
    one shape, strides, dtype and device, with or without a residual, one activation and
    one :class:`Finalize`. Grids, geometry and constexprs are worked out once, here, and
    each launch is prepared at its first call (as a convolution plan's forward launch is);
    later calls pass their tensors only. The tensors of a call must match what the plan was
    made for (:func:`passes` finds it by all of that)."""

    def __init__(self, y: torch.Tensor, has_residual: bool, activation: str,
                 negative_slope: float, finalize: Finalize):
        self.channels, self.device = y.shape[1], y.device
        self.acc = accumulate_dtype(y.dtype)
        acc = _acc(self.acc)
        flags = dict(HAS_RES=has_residual, ACT=ACTIVATIONS.index(activation), ACC=acc)
        slope = float(negative_slope)
        n, c, s, *strides = _view(y)
        r = n * s
        geo = (r, c, s, *strides)

        def grid(name):
            tile = PASS_TILES[name]
            return tile, cdiv(r, tile.block_r), cdiv(c, tile.block_c)

        tile, tiles, cb = grid("stats")
        self.stats_programs, each = partials(tiles)
        self.stats = Fixed(_stats_partials_kernel, (self.stats_programs, cb), (*geo, each),
                           dict(ACC=acc, BLOCK_R=tile.block_r, BLOCK_C=tile.block_c,
                                num_warps=tile.num_warps))
        self.finalize = Fixed(
            _stats_finalize_kernel, (cb,),
            (self.stats_programs, r, each * tile.block_r, float(r), c, float(finalize.eps),
             float(finalize.momentum)),
            dict(HAS_GAMMA=finalize.has_gamma, HAS_BETA=finalize.has_beta,
                 HAS_RUNNING=finalize.has_running, ACC=acc, BLOCK_T=BLOCK_T,
                 BLOCK_C=tile.block_c))
        tile, t, cb = grid("apply")
        self.apply_pass = Fixed(_apply_kernel, (t, cb), (*geo, slope),
                                dict(flags, BLOCK_R=tile.block_r, BLOCK_C=tile.block_c,
                                     num_warps=tile.num_warps))
        tile, tiles, cb = grid("backward_sums")
        self.sums_programs, each = partials(tiles)
        self.sums = Fixed(_backward_partials_kernel, (self.sums_programs, cb),
                          (self.sums_programs, *geo, slope, each),
                          dict(flags, BLOCK_R=tile.block_r, BLOCK_C=tile.block_c,
                               num_warps=tile.num_warps))
        tile, t, cb = grid("backward_apply")
        self._apply_back = (_backward_apply_kernel, (t, cb), geo, slope,
                            dict(flags, BLOCK_R=tile.block_r, BLOCK_C=tile.block_c,
                                 num_warps=tile.num_warps))
        self.back, self.back_count = None, None

    @serialized
    def forward_stats(self, y, gamma, beta, running_mean, running_var) -> tuple:
        """(mean, biased var, invstd, scale, shift) per channel, in float32 (float64 for a
        float64 ``y``); updates the running statistics in place (the finalize's flags)."""
        c = self.channels
        part = torch.empty((2, self.stats_programs, c), device=self.device, dtype=self.acc)
        self.stats(y, part)
        out = torch.empty((5, c), device=self.device, dtype=self.acc)
        dummy = part  # never read: the matching HAS_* flag is False
        self.finalize(part, _or(gamma, dummy), _or(beta, dummy), out,
                      _or(running_mean, dummy), _or(running_var, dummy))
        return out.unbind()

    @serialized
    def apply(self, y, residual, scale, shift) -> torch.Tensor:
        """``act(y·scale + shift (+ residual))`` in ``y``'s dtype and layout."""
        z = torch.empty_like(y)
        self.apply_pass(y, _or(residual, y), z, scale, shift)
        return z

    @serialized
    def backward_sums(self, dz, z, y, residual, stats) -> torch.Tensor:
        """``[Σ du, Σ du·x̂]`` per channel on this rank, shape (2, C); ``stats``: the
        forward's (mean, invstd, scale, shift)."""
        part = torch.empty((2, self.sums_programs, self.channels), device=self.device,
                           dtype=self.acc)
        self.sums(dz, z, y, _or(residual, y), *stats, part)
        return part.sum(1)

    @serialized
    def backward_apply(self, dz, z, y, residual, stats, sums, count: int) -> tuple:
        """(dy, d residual or None) given the channel sums over every rank (``count``
        values per channel over them); ``stats``: the forward's (mean, invstd, scale,
        shift)."""
        if self.back_count != count:  # a process group's count may change between calls
            kernel, grid, geo, slope, meta = self._apply_back
            self.back = Fixed(kernel, grid, (*geo, float(count), slope), meta)
            self.back_count = count
        dy = torch.empty_like(y)
        dres = torch.empty_like(residual) if residual is not None else None
        self.back(dz, z, y, _or(residual, y), *stats, sums, dy, _or(dres, dy))
        return dy, dres


#: (shape, strides, dtypes, device, activation, Finalize) -> Passes: every plan made
#: (``passes``), least recently made first out past ``PASSES_MAX``
_PASSES: dict[tuple, Passes] = {}
PASSES_MAX = 256


def passes(y, residual, gamma, beta, running_mean, running_var, activation: str,
           negative_slope: float, finalize: Finalize) -> Passes:
    """The plan of these operands, made at their first sight. Its key holds everything a
    prepared launch fixes: ``y``'s shape, strides, dtype and device, the dtypes of the
    residual (laid out like ``y``), γ, β and the running statistics, the activation and
    the finalize."""
    key = (y.shape, y.stride(), y.dtype, y.device, _dtype(residual), _dtype(gamma),
           _dtype(beta), _dtype(running_mean), _dtype(running_var), activation,
           negative_slope, finalize)
    plan = _PASSES.get(key)
    if plan is None:
        plan = Passes(y, residual is not None, activation, negative_slope, finalize)
        if len(_PASSES) >= PASSES_MAX:
            _PASSES.pop(next(iter(_PASSES)))
        _PASSES[key] = plan
    return plan


def _dtype(t: torch.Tensor | None):
    return None if t is None else t.dtype


def clear() -> None:
    """Forget every plan (tests; after changing ``PASS_TILES``)."""
    _PASSES.clear()


# ------------------------------------------------ one call each, no plan kept (tests, sweeps)
def forward_stats(y, gamma, beta, eps, running_mean, running_var, momentum):
    """(mean, biased var, invstd, scale, shift) per channel in ``y``'s accumulation dtype
    (``precision.accumulate_dtype``); updates the running statistics in place when given
    (unbiased variance, ``momentum`` weight)."""
    finalize = Finalize(gamma is not None, beta is not None, running_mean is not None,
                        float(eps), float(momentum))
    return Passes(y, False, "none", 0.0, finalize).forward_stats(y, gamma, beta, running_mean,
                                                                 running_var)


def apply(y, residual, scale, shift, activation, negative_slope):
    """``act(y·scale + shift (+ residual))`` in ``y``'s dtype and layout."""
    return Passes(y, residual is not None, activation, negative_slope, STATS_ONLY).apply(
        y, residual, scale, shift)


def backward_sums(dz, z, y, residual, stats, activation, negative_slope) -> torch.Tensor:
    """``[Σ du, Σ du·x̂]`` per channel on this rank, shape (2, C); ``stats``: the forward's
    (mean, invstd, scale, shift)."""
    return Passes(y, residual is not None, activation, negative_slope,
                  STATS_ONLY).backward_sums(dz, z, y, residual, stats)


def backward_apply(dz, z, y, residual, stats, sums, count, activation, negative_slope):
    """(dy, d residual or None) given the channel sums over every rank; ``stats``: the
    forward's (mean, invstd, scale, shift)."""
    return Passes(y, residual is not None, activation, negative_slope,
                  STATS_ONLY).backward_apply(dz, z, y, residual, stats, sums, count)
