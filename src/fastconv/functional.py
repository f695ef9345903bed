"""Functional convolutions with torch.nn.functional's signature and a fused epilogue.

``fastconv.conv2d(x, w, b, stride, padding, dilation, groups)`` computes what
``torch.nn.functional.conv2d`` computes; the keyword-only arguments add the epilogue
``act(scale·(conv + bias) + shift + residual)``, an output buffer, a backend and a precision.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import backends, dispatch
from .epilogue import Epilogue, fold_bias
from .errors import ConvError, ConvTypeError, NotSupported
from .problem import ConvProblem

_IntOrTuple = int | Sequence[int]


def conv1d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           stride: _IntOrTuple = 1, padding: _IntOrTuple | str = 0, dilation: _IntOrTuple = 1,
           groups: int = 1, *, activation: str = "none", negative_slope: float = 0.01,
           residual: torch.Tensor | None = None, scale: torch.Tensor | None = None,
           shift: torch.Tensor | None = None, out: torch.Tensor | None = None,
           backend: str = "auto", precision: str | None = None) -> torch.Tensor:
    """1-D convolution over an input of shape ``(N, C, L)`` or ``(C, L)``.

    Same as :func:`conv2d` with one spatial dimension:
    ``L_out = (L + pad_pre + pad_post − dilation·(kernel − 1) − 1) // stride + 1``.
    """
    return _conv(1, input, weight, bias, stride, padding, dilation, groups, activation,
                 negative_slope, residual, scale, shift, out, backend, precision)


def conv2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           stride: _IntOrTuple = 1, padding: _IntOrTuple | str = 0, dilation: _IntOrTuple = 1,
           groups: int = 1, *, activation: str = "none", negative_slope: float = 0.01,
           residual: torch.Tensor | None = None, scale: torch.Tensor | None = None,
           shift: torch.Tensor | None = None, out: torch.Tensor | None = None,
           backend: str = "auto", precision: str | None = None) -> torch.Tensor:
    """2-D convolution with an optional fused epilogue.

    Args:
        input: ``(N, C, H, W)`` or unbatched ``(C, H, W)``; NCHW or channels_last.
        weight: ``(K, C / groups, R, S)``.
        bias: optional ``(K,)``.
        stride, dilation: int or ``(h, w)``; positive.
        padding: int, ``(h, w)``, per-dimension ``((pre, post), (pre, post))``, ``"same"``
            (stride 1 only; the odd pixel goes after, as in torch) or ``"valid"``.
        groups: divides both C and K.
        activation: one of ``epilogue.ACTIVATIONS``; ``negative_slope`` is leaky_relu's.
        residual: tensor of the output's shape added before the activation.
        scale, shift: per-output-channel ``(K,)`` affine, e.g. a folded BatchNorm.
        out: write the result here (it must not overlap any input).
        backend: ``"auto"``, ``"triton"`` or ``"aten"``.
        precision: ``"ieee"``, ``"tf32"`` (fp32 data), ``"fp16"``, ``"bf16"`` or ``None``
            (follow torch: tf32 when ``torch.backends.cudnn.allow_tf32``).

    Returns:
        ``act(scale·(conv(input, weight) + bias) + shift + residual)`` of shape
        ``(N, K, H_out, W_out)`` with
        ``H_out = (H + pad_pre + pad_post − dilation·(R − 1) − 1) // stride + 1``.

    Raises:
        ConvError: any invalid argument (the message names it, the value and what is allowed).
        NotSupported: a forced ``backend`` cannot run this problem (every reason listed).
    """
    return _conv(2, input, weight, bias, stride, padding, dilation, groups, activation,
                 negative_slope, residual, scale, shift, out, backend, precision)


def _conv(rank, input, weight, bias, stride, padding, dilation, groups, activation,
          negative_slope, residual, scale, shift, out, backend, precision):
    if not isinstance(input, torch.Tensor):
        raise ConvTypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
    unbatched = input.dim() == rank + 1
    if unbatched:
        input = input.unsqueeze(0)
        residual = residual.unsqueeze(0) if isinstance(residual, torch.Tensor) else residual
        out_b = out.unsqueeze(0) if isinstance(out, torch.Tensor) else out
    else:
        out_b = out
    needs_grad = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad
        for t in (input, weight, bias, scale, shift, residual))
    # Fast path: a call whose every validated property (shapes, strides, dtypes, devices,
    # arguments, global precision flag) was seen before reuses its plan; only the checks
    # that depend on the data pointers run again.
    try:
        sig = (rank, _sig(input), _sig(weight), _sig(bias), _sig(residual), _sig(scale),
               _sig(shift), _sig(out_b), stride, padding, dilation, groups, activation,
               negative_slope, backend, precision, needs_grad, torch.backends.cudnn.allow_tf32)
        plan = _PLANS.get(sig)
    except (TypeError, AttributeError):  # unhashable or non-tensor argument: full checks
        sig, plan = None, None
    if plan is None:
        plan = _plan(rank, input, weight, bias, stride, padding, dilation, groups, activation,
                     negative_slope, residual, scale, shift, out_b, backend, precision,
                     needs_grad)
        if sig is not None:
            if len(_PLANS) >= _PLANS_MAX:
                _PLANS.pop(next(iter(_PLANS)))
            _PLANS[sig] = plan
    elif out_b is not None:
        plan.problem._check_overlap(out_b, input, bias, residual, scale, shift)
    result = plan.run(input, weight, bias, scale, shift, residual, out_b)
    if out is not None:
        return out
    return result.squeeze(0) if unbatched else result


def _sig(t):
    if t is None:
        return None
    return (t.shape, t.stride(), t.dtype, t.device)


class _Plan:
    """A validated problem bound to the backend and configuration that runs it."""

    __slots__ = ("problem", "run")

    def __init__(self, problem: ConvProblem, run):
        self.problem = problem
        self.run = run


_PLANS: dict[tuple, _Plan] = {}
_PLANS_MAX = 1024


def clear_plans() -> None:
    """Forget every cached plan (tests; after changing FASTCONV_DISPATCH in-process)."""
    _PLANS.clear()


def _plan(rank, input, weight, bias, stride, padding, dilation, groups, activation,
          negative_slope, residual, scale, shift, out, backend, precision, needs_grad):
    if not isinstance(backend, str):
        raise ConvTypeError(f"backend: expected a str, got {type(backend).__name__}")
    epilogue = Epilogue(activation=activation, negative_slope=float(negative_slope),
                        has_scale=scale is not None,
                        has_shift=shift is not None or bias is not None,
                        has_residual=residual is not None)
    problem = ConvProblem.from_tensors(
        input, weight, bias, stride, padding, dilation, groups, rank=rank, precision=precision,
        epilogue=epilogue, residual=residual, scale=scale, shift=shift, out=out)
    if needs_grad:
        if out is not None:
            raise ConvError("out: cannot be used when an input requires grad (as in torch, "
                            "out= does not support automatic differentiation)")
        if backend not in ("auto", "aten"):
            raise NotSupported(backend, [
                "an input requires grad and this backend has no backward yet; use "
                "backend='aten' or torch.no_grad()"])
        backend = "aten"
    if problem.n == 0:  # empty batch: empty output, nothing to launch
        return _Plan(problem, lambda *a: problem.new_output() if a[-1] is None else a[-1])

    def bound(cls, config):
        run = cls.bind(problem, config)
        if cls.TAKES_BIAS:
            return run

        def run_folded(input, weight, bias, scale, shift, residual, out):
            scale, shift = fold_bias(bias, scale, shift)
            return run(input, weight, None, scale, shift, residual, out)
        return run_folded

    scratch: list[torch.Tensor] = []  # allocated only if dispatch times candidates

    def trial(cls, config):
        if not scratch:
            scratch.append(out if out is not None else problem.new_output())
        bound(cls, config)(input, weight, bias, scale, shift, residual, scratch[0])

    choice = dispatch.choose(problem, backend, run=trial)
    return _Plan(problem, bound(backends.REGISTRY[choice.backend], choice.config))
