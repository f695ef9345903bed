"""The training BatchNorm passes of backends/triton/bnstats.py as torch custom ops.

``BNActFunction`` (batchnorm.py) calls the functions at the end. In eager mode they run the
call's plan (``bnstats.Passes``: grids and arguments worked out once, launches prepared at
their first call), found once per call by :func:`plan` and kept for the backward: a custom
op's dispatch costs tens of microseconds of host time (37 us measured on a 2-core CPU). While
``torch.compile`` traces they call the ops, so that each pass is one opaque node (the fake
implementations give its shapes) instead of Triton's launch code.

No ``from __future__ import annotations`` here: torch.library reads the annotations.
"""

import torch
from torch import Tensor

from .precision import accumulate_dtype
from .spec import Norm

_BNSTATS = None


def kernels():
    """backends/triton/bnstats.py, imported at its first use, never at ``import fastconv``:
    its kernels are decorated then, compiled or interpreted as TRITON_INTERPRET says at that
    moment (``fastconv check`` on a machine without a GPU sets it after the import)."""
    global _BNSTATS
    if _BNSTATS is None:
        from .backends.triton import bnstats

        _BNSTATS = bnstats
    return _BNSTATS


def _plan(y, residual, gamma, beta, running_mean, running_var, activation, negative_slope,
          eps=1.0, momentum=0.0):
    """The op's plan: the finalize that the given statistics ask for."""
    k = kernels()
    return k.passes(y, residual, gamma, beta, running_mean, running_var, activation,
                    negative_slope, k.Finalize(gamma is not None, beta is not None,
                                               running_mean is not None, eps, momentum))


def _forward_stats(y: Tensor, gamma: Tensor | None, beta: Tensor | None, eps: float,
                   running_mean: Tensor | None, running_var: Tensor | None,
                   momentum: float) -> Tensor:
    plan = _plan(y, None, gamma, beta, running_mean, running_var, "none", 0.0, eps, momentum)
    return torch.stack(plan.forward_stats(y, gamma, beta, running_mean, running_var))


_forward_stats_op = torch.library.custom_op(
    "fastconv::bn_forward_stats", _forward_stats, mutates_args=("running_mean", "running_var"))


@_forward_stats_op.register_fake
def _forward_stats_fake(y, gamma, beta, eps, running_mean, running_var, momentum):
    return y.new_empty((5, y.shape[1]), dtype=accumulate_dtype(y.dtype))


def _apply(y: Tensor, residual: Tensor | None, scale: Tensor, shift: Tensor, activation: str,
           negative_slope: float) -> Tensor:
    return _plan(y, residual, None, None, None, None, activation, negative_slope).apply(
        y, residual, scale, shift)


_apply_op = torch.library.custom_op(
    "fastconv::bn_apply", _apply, mutates_args=())


@_apply_op.register_fake
def _apply_fake(y, residual, scale, shift, activation, negative_slope):
    return torch.empty_like(y)


def _backward_sums(dz: Tensor, z: Tensor, y: Tensor, residual: Tensor | None,
                   stats: list[Tensor], activation: str, negative_slope: float) -> Tensor:
    return _plan(y, residual, None, None, None, None, activation, negative_slope
                 ).backward_sums(dz, z, y, residual, stats)


_backward_sums_op = torch.library.custom_op(
    "fastconv::bn_backward_sums", _backward_sums, mutates_args=())


@_backward_sums_op.register_fake
def _backward_sums_fake(dz, z, y, residual, stats, activation, negative_slope):
    return stats[0].new_empty((2, y.shape[1]))


def _backward_apply(dz: Tensor, z: Tensor, y: Tensor, residual: Tensor | None,
                    stats: list[Tensor], sums: Tensor, count: int, activation: str,
                    negative_slope: float) -> list[Tensor]:
    """[dy] or [dy, d residual]."""
    dy, dres = _plan(y, residual, None, None, None, None, activation, negative_slope
                     ).backward_apply(dz, z, y, residual, stats, sums, count)
    return [dy] if dres is None else [dy, dres]


_backward_apply_op = torch.library.custom_op(
    "fastconv::bn_backward_apply", _backward_apply, mutates_args=())


@_backward_apply_op.register_fake
def _backward_apply_fake(dz, z, y, residual, stats, sums, count, activation, negative_slope):
    out = [torch.empty_like(y)]
    return out if residual is None else out + [torch.empty_like(residual)]


# ------------------------------------------------------------- what BNActFunction calls
def plan(y, residual, norm: Norm, activation: str, negative_slope: float, sync: bool):
    """The eager plan of a call's passes (``bnstats.Passes``), or None while torch.compile
    traces (the ops run then). ``sync``: statistics combined over a process group, so the
    kernels' finalize computes the local mean and variance alone."""
    if torch.compiler.is_compiling():
        return None
    if sync:  # (the finalize of statistics alone: bnstats.STATS_ONLY)
        return _plan(y, residual, None, None, None, None, activation, float(negative_slope))
    return _plan(y, residual, *norm[:4], activation, float(negative_slope), float(norm.eps),
                 float(norm.momentum))


def forward_stats(plan, y, norm: Norm) -> tuple:
    """(mean, biased var, invstd, scale, shift) through ``plan`` (:func:`plan`), or the op;
    ``norm``'s running statistics updated in place when given."""
    if plan is not None:
        return plan.forward_stats(y, norm.weight, norm.bias, norm.running_mean,
                                  norm.running_var)
    return _forward_stats_op(y, norm.weight, norm.bias, norm.eps, norm.running_mean,
                             norm.running_var, norm.momentum).unbind()


def apply(plan, y, residual, scale, shift, activation, negative_slope):
    """``act(y·scale + shift (+ residual))``."""
    if plan is not None:
        return plan.apply(y, residual, scale, shift)
    return _apply_op(y, residual, scale, shift, activation, negative_slope)


def backward_sums(plan, dz, z, y, residual, stats, activation, negative_slope):
    """``[Σ du, Σ du·x̂]`` (2, C); ``stats`` is (mean, invstd, scale, shift)."""
    if plan is not None:
        return plan.backward_sums(dz, z, y, residual, stats)
    return _backward_sums_op(dz, z, y, residual, list(stats), activation, negative_slope)


def backward_apply(plan, dz, z, y, residual, stats, sums, count, activation, negative_slope):
    """(dy, d residual or None)."""
    if plan is not None:
        return plan.backward_apply(dz, z, y, residual, stats, sums, count)
    dy, *dres = _backward_apply_op(dz, z, y, residual, list(stats), sums, count, activation,
                                   negative_slope)
    return dy, (dres[0] if dres else None)
