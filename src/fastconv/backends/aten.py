"""The aten backend: torch.nn.functional (cuDNN on the GPU) plus the epilogue in torch.

Always available, on every device and dtype: the CPU path, the fallback, and the reference
every other backend is compared with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..precision import Precision
from ..problem import ConvProblem
from .base import Backend


class AtenBackend(Backend):
    NAME = "aten"
    SUPPORTED_DTYPES = frozenset({torch.float64, torch.float32, torch.float16, torch.bfloat16})
    SUPPORTS_TRANSPOSED = True
    IS_DETERMINISTIC = False  # cuDNN may pick non-deterministic algorithms
    TAKES_BIAS = True  # and scale/shift as given, so autograd flows through every operand

    @classmethod
    def not_supported_reasons(cls, problem):
        reasons = super().not_supported_reasons(problem)
        if problem.transposed and problem.pad_pre != problem.pad_post:
            reasons.append("asymmetric padding of a transposed convolution")
        return reasons

    @classmethod
    def candidates(cls, problem):
        cands = [None]
        if _cudnn_fusable(problem):
            cands.append(CUDNN_RELU)
        return cands

    @classmethod
    def bind(cls, problem, config):
        if config == CUDNN_RELU:
            return _bind_cudnn_relu(problem)
        epilogue = None if problem.epilogue.is_identity else problem.epilogue

        def run(input, weight, bias, scale, shift, residual, out):
            y = conv_aten(problem, input, weight, bias)
            if epilogue is not None:
                y = epilogue.apply(y, scale, shift, residual)
            return y if out is None else out.copy_(y)
        return run

    @classmethod
    def forward(cls, problem, config, input, weight, bias, *, scale, shift, residual, out):
        return cls.bind(problem, config)(input, weight, bias, scale, shift, residual, out)


class _Named(str):
    def name(self) -> str:
        return str(self)


#: Configuration of the aten backend that runs cuDNN's fused convolution + bias (+ residual)
#: + ReLU through torch.cudnn_convolution_relu / torch.cudnn_convolution_add_relu: one
#: cuDNN kernel instead of three.
CUDNN_RELU = _Named("cudnn_relu")


def _cudnn_fusable(problem: ConvProblem) -> bool:
    ep = problem.epilogue
    return (problem.device == "cuda" and problem.rank == 2 and not problem.transposed
            and ep.activation == "relu" and not ep.has_scale
            and problem.pad_pre == problem.pad_post
            and problem.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and hasattr(torch, "cudnn_convolution_add_relu"))


def _bind_cudnn_relu(problem: ConvProblem):
    geo = (problem.stride, problem.pad_pre, problem.dilation, problem.groups)
    allow_tf32 = problem.precision == Precision.TF32

    def run(input, weight, bias, scale, shift, residual, out):
        if shift is not None:
            bias = shift if bias is None else bias.float() + shift.float()
        if bias is not None:
            bias = bias.to(input.dtype)
        saved = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = allow_tf32
        try:
            if residual is None:
                y = torch.cudnn_convolution_relu(input, weight, bias, *geo)
            else:
                y = torch.cudnn_convolution_add_relu(input, weight, residual, 1.0, bias, *geo)
        finally:
            torch.backends.cudnn.allow_tf32 = saved
        return y if out is None else out.copy_(y)
    return run


def conv_aten(problem: ConvProblem, input: torch.Tensor, weight: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
    """The bare convolution of ``problem`` through torch, honouring its precision."""
    symmetric = problem.pad_pre == problem.pad_post
    if not symmetric and not problem.transposed:
        # torch takes only symmetric padding: pad explicitly (F.pad wants last dim first).
        flat = []
        for a, b in reversed(list(zip(problem.pad_pre, problem.pad_post))):
            flat += [a, b]
        input = F.pad(input, flat)
        padding = 0
    else:
        padding = problem.pad_pre
    allow_tf32 = problem.precision == Precision.TF32
    saved = torch.backends.cudnn.allow_tf32
    if saved != allow_tf32:  # cuDNN's TF32 switch, for this call only
        torch.backends.cudnn.allow_tf32 = allow_tf32
    try:
        if problem.transposed:
            fn = F.conv_transpose1d if problem.rank == 1 else F.conv_transpose2d
            return fn(input, weight, bias, problem.stride, padding, problem.output_padding,
                      problem.groups, problem.dilation)
        fn = F.conv1d if problem.rank == 1 else F.conv2d
        return fn(input, weight, bias, problem.stride, padding, problem.dilation, problem.groups)
    finally:
        if saved != allow_tf32:
            torch.backends.cudnn.allow_tf32 = saved
