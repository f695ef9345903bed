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
    if not isinstance(backend, str):
        raise ConvTypeError(f"backend: expected a str, got {type(backend).__name__}")
    unbatched = input.dim() == rank + 1
    if unbatched:
        input = input.unsqueeze(0)
        residual = residual.unsqueeze(0) if isinstance(residual, torch.Tensor) else residual
        out_b = out.unsqueeze(0) if isinstance(out, torch.Tensor) else out
    else:
        out_b = out
    epilogue = Epilogue(activation=activation, negative_slope=float(negative_slope),
                        has_scale=scale is not None,
                        has_shift=shift is not None or bias is not None,
                        has_residual=residual is not None)
    problem = ConvProblem.from_tensors(
        input, weight, bias, stride, padding, dilation, groups, rank=rank, precision=precision,
        epilogue=epilogue, residual=residual, scale=scale, shift=shift, out=out_b)
    result = _run(problem, backend, input, weight, bias, scale, shift, residual, out_b)
    if out is not None:
        return out
    return result.squeeze(0) if unbatched else result


def _run(problem: ConvProblem, backend: str, input, weight, bias, scale, shift, residual, out):
    needs_grad = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad
        for t in (input, weight, bias, scale, shift, residual))
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
        empty = problem.new_output()
        return empty if out is None else out
    folded = fold_bias(bias, scale, shift)

    def run(cls, config, dest=out):
        if cls.TAKES_BIAS:
            return cls.forward(problem, config, input, weight, bias, scale=scale, shift=shift,
                               residual=residual, out=dest)
        return cls.forward(problem, config, input, weight, None, scale=folded[0],
                           shift=folded[1], residual=residual, out=dest)

    scratch: list[torch.Tensor] = []  # allocated only if dispatch times candidates

    def trial(cls, config):
        if not scratch:
            scratch.append(out if out is not None else problem.new_output())
        run(cls, config, scratch[0])

    choice = dispatch.choose(problem, backend, run=trial)
    return run(backends.REGISTRY[choice.backend], choice.config)
