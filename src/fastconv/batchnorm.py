"""Training-mode batch normalisation + activation on a convolution's output, with an
optional residual, synchronised statistics across a process group, and its backward.

    z = act(γ·(y − μ)·σ⁻¹ + β + residual),   μ, σ² = mean and biased variance of y per channel

Statistics are computed in float32 for every floating dtype but float64 (as torch's batch
norm does for half inputs), per rank with ``torch.var_mean``; under a process group they are
combined in rank order from every rank's (count, mean, M2) — Chan's parallel formula,
deterministic, exact in the counts (ranks may hold different batch sizes). The backward is
the closed form torch's ``batch_norm_backward`` uses; under a group its two channel sums are
all-reduced for the input gradient while γ's and β's gradients stay local (DDP reduces them),
as ``torch.nn.SyncBatchNorm`` does.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from .epilogue import activate
from .errors import ConvError
from .ops import activation_grad
from .precision import accumulate_dtype


def _dims(y: Tensor) -> list[int]:
    return [0, *range(2, y.dim())]


def _channel(v: Tensor, y: Tensor) -> Tensor:
    return v.view(1, -1, *([1] * (y.dim() - 2)))


def batch_stats(y: Tensor, group=None) -> tuple[Tensor, Tensor, int]:
    """(mean, biased variance, count) per channel of ``y`` (float32), over the whole
    ``group`` when one is given."""
    count = y.numel() // y.shape[1]
    acc = accumulate_dtype(y.dtype)
    var, mean = torch.var_mean(y.to(acc), dim=_dims(y), unbiased=False)
    if group is None:
        return mean, var, count
    world = dist.get_world_size(group)
    k = y.shape[1]
    mine = torch.cat([torch.full((1,), float(count), device=y.device, dtype=acc), mean,
                      var * count])
    every = torch.empty(world * (2 * k + 1), device=y.device, dtype=acc)
    dist.all_gather_into_tensor(every, mine, group=group)
    every = every.view(world, 2 * k + 1)
    counts, means, m2s = every[:, :1], every[:, 1:k + 1], every[:, k + 1:]
    total = counts.sum()
    mean = (counts * means).sum(0) / total
    m2 = (m2s + counts * (means - mean) ** 2).sum(0)
    return mean, m2 / total, int(total.item())


class BNActFunction(torch.autograd.Function):
    """``(y, γ, β, residual) -> z`` in training mode; also returns the batch mean and the
    unbiased variance (not differentiable) for the running statistics."""

    @staticmethod
    def forward(ctx, y, gamma, beta, residual, eps, activation, negative_slope, group):
        mean, var, count = batch_stats(y, group)
        if count <= 1:
            raise ConvError(f"input: batch normalisation in training needs more than 1 value "
                            f"per channel, got {count} (input shape {tuple(y.shape)})")
        acc = mean.dtype
        invstd = torch.rsqrt(var + eps)
        scale = invstd if gamma is None else invstd * gamma.to(acc)
        shift = -mean * scale if beta is None else beta.to(acc) - mean * scale
        u = y.to(acc) * _channel(scale, y) + _channel(shift, y)
        if residual is not None:
            u = u + residual.to(acc)
        z = activate(u, activation, negative_slope).to(y.dtype)
        ctx.save_for_backward(y, z, gamma, beta, residual, mean, invstd)
        ctx.extra = (activation, negative_slope, group, count)
        var_unbiased = var * (count / (count - 1))
        ctx.mark_non_differentiable(mean, var_unbiased)
        return z, mean, var_unbiased

    @staticmethod
    def backward(ctx, dz, _dmean, _dvar):
        y, z, gamma, beta, residual, mean, invstd = ctx.saved_tensors
        activation, negative_slope, group, count = ctx.extra
        acc = mean.dtype
        xhat = (y.to(acc) - _channel(mean, y)) * _channel(invstd, y)

        def pre_activation():
            u = xhat if gamma is None else xhat * _channel(gamma.to(acc), y)
            u = u if beta is None else u + _channel(beta.to(acc), y)
            return u if residual is None else u + residual.to(acc)

        du = activation_grad(dz.to(acc), z.to(acc), activation, negative_slope,
                             pre_activation)
        local = torch.stack([du.sum(_dims(y)), (du * xhat).sum(_dims(y))])
        sums = local
        if group is not None:  # the input gradient needs the sums over every rank; γ's and
            sums = local.clone()  # β's stay local, for DDP to reduce (as SyncBatchNorm)
            dist.all_reduce(sums, group=group)
        sum_du, sum_du_xhat = sums
        g = invstd if gamma is None else invstd * gamma.to(acc)
        dy = _channel(g, y) * (du - _channel(sum_du / count, y)
                               - xhat * _channel(sum_du_xhat / count, y))
        return (dy.to(y.dtype),
                None if gamma is None else local[1].to(gamma.dtype),
                None if beta is None else local[0].to(beta.dtype),
                None if residual is None else du.to(residual.dtype),
                None, None, None, None)

