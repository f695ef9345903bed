"""Training-mode batch normalisation + activation on a convolution's output, with an
optional residual, synchronised statistics across a process group, and its backward.

    z = act(γ·(y − μ)·σ⁻¹ + β + residual),   μ, σ² = mean and biased variance of y per channel

Where the Triton kernels can run (a GPU of compute capability 8.0, or the interpreter on the
CPU) every pass is one of backends/triton/bnstats.py's: per-tile partial statistics and a
deterministic finalize that also updates the running statistics, then one fused
normalise + activation (+ residual) pass; the backward is one reduction pass and one apply
pass. Elsewhere the same maths runs as torch operations. Eager calls outside a process group
take torch's own ``batch_norm`` and activation instead (:func:`bn_act`, ``FUSED_IN_EAGER``):
their host cost is lower than the fused passes' GPU saving. Statistics are computed in float32
for every floating dtype but float64 (as torch's batch norm does for half inputs); under a
process group they are
combined in rank order from every rank's (count, mean, M2) — Chan's parallel formula,
deterministic, exact in the counts (ranks may hold different batch sizes). The backward is
the closed form torch's ``batch_norm_backward`` uses; under a group its two channel sums are
all-reduced for the input gradient while γ's and β's gradients stay local (DDP reduces them),
as ``torch.nn.SyncBatchNorm`` does.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from .epilogue import activate, activation_grad, derivative_from_output
from .errors import ConvError
from .precision import accumulate_dtype
from .spec import Norm

# Triton is a dependency on Linux; elsewhere the torch operations below do the work. Neither
# Triton nor the kernels are imported here: a command may still choose the interpreter
# (TRITON_INTERPRET) after ``import fastconv``, and Triton decides at its own import.
if importlib.util.find_spec("triton") is not None:
    from . import bn_ops
else:  # pragma: no cover
    bn_ops = None


def _dims(y: Tensor) -> list[int]:
    return [0, *range(2, y.dim())]


def _channel(v: Tensor, y: Tensor) -> Tensor:
    return v.view(1, -1, *([1] * (y.dim() - 2)))


#: Whether training-mode batch norm takes the fused passes in eager calls too. By default
#: an eager call outside a process group runs torch's own ``batch_norm`` and activation
#: (their autograd is C++): the fused passes save one round trip of the activation through
#: GPU memory, microseconds on a ResNet layer, and cost hundreds of microseconds more of
#: host time (benchmarks/NOTES.md, "Host cost per call"), so they pay only where host time
#: is free: under CUDA-graph capture (``optimize(cuda_graph=True)``) and with synchronised
#: statistics. Under torch.compile torch's batch norm is traced too: Inductor fuses it with
#: the activation and the convolution backward's neighbours (5 unfused passes per layer cost
#: timm resnet50's compiled training step 4.8 ms of kernels, benchmarks/NOTES.md). Tests set
#: it to run the kernels eagerly.
FUSED_IN_EAGER = False

_FUSED_HERE: contextvars.ContextVar[bool] = contextvars.ContextVar("fused_bn", default=False)


@contextlib.contextmanager
def fused_passes():
    """The fused passes for the calls inside (a training graph's warm-up runs what its
    capture will run: the kernels compile and load before the capture)."""
    token = _FUSED_HERE.set(True)
    try:
        yield
    finally:
        _FUSED_HERE.reset(token)


def bn_act(y: Tensor, norm: Norm, residual: Tensor | None, activation: str,
           negative_slope: float, group) -> Tensor:
    """``act(batch_norm(y) + residual)`` with batch statistics (``norm``'s running
    statistics updated in place when given): torch's operations in eager and compiled
    calls, else :class:`BNActFunction` (see :data:`FUSED_IN_EAGER`)."""
    gamma, beta, running_mean, running_var, momentum, eps = norm
    # (torch.compile's trace takes torch's batch norm, which Inductor fuses with its
    # neighbours, and cannot trace a ContextVar's get)
    if group is None and not FUSED_IN_EAGER:
        if torch.compiler.is_compiling():
            if _native(y, True, gamma, beta, running_mean, running_var):
                _check_count(y.numel() // y.shape[1], y)
                z = F.batch_norm(y, running_mean, running_var, gamma, beta, True, momentum,
                                 eps)
                return activate(z if residual is None else z + residual, activation,
                                negative_slope)
        elif takes_torch_ops(y, gamma, beta, running_mean, running_var):
            _check_count(y.numel() // y.shape[1], y)
            # F.batch_norm's own op without its Python checks (done above)
            z = torch.batch_norm(y, gamma, beta, running_mean, running_var, True, momentum,
                                 eps, torch._C._get_cudnn_enabled())
            return finish_bn_act(z, residual, activation, negative_slope)
    return BNActFunction.apply(y, gamma, beta, residual, running_mean, running_var,
                               (momentum, eps, activation, negative_slope, group))


def fused_here() -> bool:
    """Whether eager calls here take the fused passes (:data:`FUSED_IN_EAGER`,
    :func:`fused_passes`)."""
    return FUSED_IN_EAGER or _FUSED_HERE.get()


def takes_torch_ops(y: Tensor, gamma: Tensor | None, beta: Tensor | None,
                    running_mean: Tensor | None, running_var: Tensor | None) -> bool:
    """Whether an eager :func:`bn_act` call outside a process group runs torch's batch norm
    and :func:`finish_bn_act` (not the fused passes)."""
    return not fused_here() and _native(y, False, gamma, beta, running_mean, running_var)


def finish_bn_act(z: Tensor, residual: Tensor | None, activation: str,
                  negative_slope: float) -> Tensor:
    """``act(z + residual)`` on batch norm's fresh output ``z`` as torch's eager models
    compute it: the add and the activation in place (batch norm's backward reads its input,
    not its output)."""
    if residual is not None:
        z = z.add_(residual) if residual.dtype == z.dtype and residual.shape == z.shape \
            else z + residual
    return activate(z, activation, negative_slope, inplace=True)


def _native(y: Tensor, compiling: bool, *params: Tensor | None) -> bool:
    """A call outside CUDA-graph capture (eager or traced by torch.compile) whose parameters
    torch's batch_norm takes (its dtype, or float32 ones for a half-precision input)."""
    if not compiling and y.is_cuda and torch.cuda.is_current_stream_capturing():
        return False
    half = y.dtype is torch.float16 or y.dtype is torch.bfloat16
    first = None
    for p in params:
        if p is not None:
            if first is None:
                first = p.dtype
                if not (first is y.dtype or (half and first is torch.float32)):
                    return False
            elif p.dtype is not first:
                return False
    return True


def _check_count(count: int, y: Tensor) -> None:
    if count <= 1:
        raise ConvError(f"input: batch normalisation in training needs more than 1 value "
                        f"per channel, got {count} (input shape {tuple(y.shape)})")


def _check_channels(y: Tensor, *per_channel: Tensor | None) -> None:
    """Each given γ, β and running statistic holds one value per channel of ``y`` (the
    kernels index them by channel; a BatchNorm of another size would be read past its
    end)."""
    c = y.shape[1]
    for name, t in zip(("weight", "bias", "running_mean", "running_var"), per_channel):
        if t is not None and t.shape != (c,):
            raise ConvError(f"batch norm {name}: expected shape ({c},), one value per "
                            f"channel of the convolution's output {tuple(y.shape)}, got "
                            f"{tuple(t.shape)}")


class BNActFunction(torch.autograd.Function):
    """``(y, γ, β, residual) -> z`` in training mode; updates ``running_mean`` and
    ``running_var`` in place (when given) with weight ``momentum``. ``options``:
    ``(momentum, eps, activation, negative_slope, group)``."""

    @staticmethod
    def forward(ctx, y, gamma, beta, residual, running_mean, running_var, options):
        momentum, eps, activation, negative_slope, group = options
        _check_channels(y, gamma, beta, running_mean, running_var)
        count = y.numel() // y.shape[1]
        if group is None:
            _check_count(count, y)
        acc = accumulate_dtype(y.dtype)
        if residual is not None and residual.stride() != y.stride():
            residual = torch.empty_like(y).copy_(residual)  # the kernels index both alike
        fast = _triton(y)
        norm = Norm(gamma, beta, running_mean, running_var, momentum, eps)
        # the passes' plan, found once for the forward and the backward (None: the ops)
        plan = bn_ops.plan(y, residual, norm, activation, negative_slope, group is not None) \
            if fast else None
        if fast and group is None:
            mean, _, invstd, scale, shift = bn_ops.forward_stats(plan, y, norm)
        else:
            if fast:
                mean, var, *_ = bn_ops.forward_stats(plan, y, _STATS_ONLY)
                count = y.numel() // y.shape[1]
            else:
                var, mean = torch.var_mean(y.to(acc), dim=_dims(y), unbiased=False)
            if group is not None:
                mean, var, count = _combine(mean, var, count, group)
                if count <= 1:
                    raise ConvError(f"input: batch normalisation in training needs more than "
                                    f"1 value per channel, got {count} over the group")
            invstd = torch.rsqrt(var + eps)
            scale = invstd if gamma is None else invstd * gamma.to(acc)
            shift = -mean * scale if beta is None else beta.to(acc) - mean * scale
            if running_mean is not None:
                with torch.no_grad():
                    running_mean.lerp_(mean.to(running_mean.dtype), momentum)
                    running_var.lerp_((var * (count / (count - 1))).to(running_var.dtype),
                                      momentum)
        if fast:
            z = bn_ops.apply(plan, y, residual, scale, shift, activation, negative_slope)
        else:
            u = y.to(acc) * _channel(scale, y) + _channel(shift, y)
            if residual is not None:
                u = u + residual.to(acc)
            z = activate(u, activation, negative_slope).to(y.dtype)
        # the output only where the derivative reads it: torch's BatchNorm saves no output,
        # so models change it in place (timm's `x += shortcut` after a norm)
        ctx.save_for_backward(y, z if derivative_from_output(activation, negative_slope)
                              else None, gamma, residual, mean, invstd, scale, shift)
        ctx.extra = (activation, negative_slope, group, count, fast,
                     None if beta is None else beta.dtype, plan)
        return z

    @staticmethod
    def backward(ctx, dz):
        y, z, gamma, residual, mean, invstd, scale, shift = ctx.saved_tensors
        activation, negative_slope, group, count, fast, beta_dtype, plan = ctx.extra
        if z is None:  # not read: the derivative needs nothing or recomputes the pre-activation
            z = y
        if fast:
            if dz.stride() != y.stride():
                dz = torch.empty_like(y).copy_(dz)
            if plan is None:  # a forward traced by torch.compile: the ops, or a plan now
                plan = bn_ops.plan(y, residual, _STATS_ONLY, activation, negative_slope, True)
            local = bn_ops.backward_sums(plan, dz, z, y, residual,
                                         [mean, invstd, scale, shift], activation,
                                         negative_slope)
        else:
            xhat = (y.to(mean.dtype) - _channel(mean, y)) * _channel(invstd, y)

            def pre_activation():
                u = y.to(mean.dtype) * _channel(scale, y) + _channel(shift, y)
                return u if residual is None else u + residual.to(mean.dtype)

            du = activation_grad(dz.to(mean.dtype), z.to(mean.dtype), activation,
                                 negative_slope, pre_activation)
            local = torch.stack([du.sum(_dims(y)), (du * xhat).sum(_dims(y))])
        sums = local
        if group is not None:  # the input gradient needs the sums over every rank; γ's and
            sums = local.clone()  # β's stay local, for DDP to reduce (as SyncBatchNorm)
            dist.all_reduce(sums, group=group)
        if fast:
            dy, dres = bn_ops.backward_apply(plan, dz, z, y, residual,
                                             [mean, invstd, scale, shift], sums, count,
                                             activation, negative_slope)
        else:
            sum_du, sum_du_xhat = sums
            dy = (_channel(scale, y) * (du - _channel(sum_du / count, y)
                                        - xhat * _channel(sum_du_xhat / count, y))).to(y.dtype)
            dres = du.to(residual.dtype) if residual is not None else None
        return (dy,
                None if gamma is None else local[1].to(gamma.dtype),
                None if beta_dtype is None else local[0].to(beta_dtype),
                dres, None, None, None)


#: a batch norm's statistics alone (no γ, β or running statistics): a process group's local
#: pass, whose mean and variance are combined over the ranks before anything else
_STATS_ONLY = Norm(None, None, None, None, 0.0, 1.0)


def _triton(y: Tensor) -> bool:
    if not USE_TRITON or bn_ops is None:
        return False
    kernels = bn_ops.kernels()
    return kernels.usable(y) and kernels.supports(y)


#: Whether the Triton kernels are used where they can run (tests compare both paths).
USE_TRITON = True


def _combine(mean: Tensor, var: Tensor, count: int, group) -> tuple[Tensor, Tensor, int]:
    """Every rank's (count, mean, M2) gathered and combined in rank order (Chan)."""
    world = dist.get_world_size(group)
    k = mean.numel()
    acc = mean.dtype
    mine = torch.cat([torch.full((1,), float(count), device=mean.device, dtype=acc), mean,
                      var * count])
    every = torch.empty(world * (2 * k + 1), device=mean.device, dtype=acc)
    dist.all_gather_into_tensor(every, mine, group=group)
    every = every.view(world, 2 * k + 1)
    counts, means, m2s = every[:, :1], every[:, 1:k + 1], every[:, k + 1:]
    total = counts.sum()
    mean = (counts * means).sum(0) / total
    m2 = (m2s + counts * (means - mean) ** 2).sum(0)
    return mean, m2 / total, int(total.item())


def fold(weight: Tensor, bias: Tensor | None, running_mean: Tensor, running_var: Tensor,
         gamma: Tensor | None, beta: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
    """Inference BatchNorm folded into a convolution's weight and bias:
    ``bn(conv(x, w, b)) = conv(x, w·s, (b − μ)·s + β)`` with ``s = γ/√(σ² + ε)`` per output
    channel. Computed in float32 (float64 for float64 weights), returned in the weight's
    dtype and memory format; differentiable."""
    acc = accumulate_dtype(weight.dtype)
    scale = torch.rsqrt(running_var.to(acc) + eps)
    if gamma is not None:
        scale = scale * gamma.to(acc)
    shift = -running_mean.to(acc) if bias is None else bias.to(acc) - running_mean.to(acc)
    shift = shift * scale
    if beta is not None:
        shift = shift + beta.to(acc)
    w = weight.to(acc) * scale.view(-1, *([1] * (weight.dim() - 1)))
    return w.to(weight.dtype), shift.to(weight.dtype)
