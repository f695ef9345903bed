"""The training BatchNorm passes of backends/triton/bnstats.py as torch custom ops.

``BNActFunction`` (batchnorm.py) calls the functions at the end, which run the launchers
directly in eager mode (a custom op's dispatch costs tens of microseconds of host time: 37 us
measured on a 2-core CPU) and, while ``torch.compile`` traces, the ops, so that each pass is
one opaque node (the fake implementations give its shapes) instead of Triton's launch code.

No ``from __future__ import annotations`` here: torch.library reads the annotations.
"""

import torch
from torch import Tensor

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


def _forward_stats(y: Tensor, acc: torch.dtype, gamma: Tensor | None, beta: Tensor | None,
                   eps: float, running_mean: Tensor | None, running_var: Tensor | None,
                   momentum: float) -> Tensor:
    return torch.stack(kernels().forward_stats(y, acc, gamma, beta, eps, running_mean,
                                               running_var, momentum))


_forward_stats_op = torch.library.custom_op(
    "fastconv::bn_forward_stats", _forward_stats, mutates_args=("running_mean", "running_var"))


@_forward_stats_op.register_fake
def _forward_stats_fake(y, acc, gamma, beta, eps, running_mean, running_var, momentum):
    return y.new_empty((5, y.shape[1]), dtype=acc)


def _apply(y: Tensor, residual: Tensor | None, scale: Tensor, shift: Tensor, activation: str,
           negative_slope: float) -> Tensor:
    return kernels().apply(y, residual, scale, shift, activation, negative_slope)


_apply_op = torch.library.custom_op(
    "fastconv::bn_apply", _apply, mutates_args=())


@_apply_op.register_fake
def _apply_fake(y, residual, scale, shift, activation, negative_slope):
    return torch.empty_like(y)


def _backward_sums(dz: Tensor, z: Tensor, y: Tensor, residual: Tensor | None,
                   stats: list[Tensor], activation: str, negative_slope: float) -> Tensor:
    return kernels().backward_sums(dz, z, y, residual, stats, activation, negative_slope)


_backward_sums_op = torch.library.custom_op(
    "fastconv::bn_backward_sums", _backward_sums, mutates_args=())


@_backward_sums_op.register_fake
def _backward_sums_fake(dz, z, y, residual, stats, activation, negative_slope):
    return stats[0].new_empty((2, y.shape[1]))


def _backward_apply(dz: Tensor, z: Tensor, y: Tensor, residual: Tensor | None,
                    stats: list[Tensor], sums: Tensor, count: int, activation: str,
                    negative_slope: float) -> list[Tensor]:
    """[dy] or [dy, d residual]."""
    dy, dres = kernels().backward_apply(dz, z, y, residual, stats, sums, count, activation,
                                        negative_slope)
    return [dy] if dres is None else [dy, dres]


_backward_apply_op = torch.library.custom_op(
    "fastconv::bn_backward_apply", _backward_apply, mutates_args=())


@_backward_apply_op.register_fake
def _backward_apply_fake(dz, z, y, residual, stats, sums, count, activation, negative_slope):
    out = [torch.empty_like(y)]
    return out if residual is None else out + [torch.empty_like(residual)]


# ------------------------------------------------------- what BNActFunction calls (bnstats')
def forward_stats(y, acc, gamma, beta, eps, running_mean, running_var, momentum):
    """(mean, biased var, invstd, scale, shift): bnstats.forward_stats."""
    if torch.compiler.is_compiling():
        return tuple(_forward_stats_op(y, acc, gamma, beta, eps, running_mean, running_var,
                                       momentum).unbind())
    return kernels().forward_stats(y, acc, gamma, beta, eps, running_mean, running_var,
                                   momentum)


def apply(y, residual, scale, shift, activation, negative_slope):
    op = _apply_op if torch.compiler.is_compiling() else kernels().apply
    return op(y, residual, scale, shift, activation, negative_slope)


def backward_sums(dz, z, y, residual, stats, activation, negative_slope):
    """``[Σ du, Σ du·x̂]`` (2, C): bnstats.backward_sums; ``stats`` is (mean, invstd, scale,
    shift)."""
    op = _backward_sums_op if torch.compiler.is_compiling() else kernels().backward_sums
    return op(dz, z, y, residual, stats, activation, negative_slope)


def backward_apply(dz, z, y, residual, stats, sums, count, activation, negative_slope):
    """(dy, d residual or None): bnstats.backward_apply."""
    if not torch.compiler.is_compiling():
        return kernels().backward_apply(dz, z, y, residual, stats, sums, count, activation,
                                        negative_slope)
    dy, *dres = _backward_apply_op(dz, z, y, residual, list(stats), sums, count, activation,
                                   negative_slope)
    return dy, (dres[0] if dres else None)
