"""The Triton backend: implicit-GEMM kernels with a fused epilogue.

On the GPU it needs compute capability 8.0 (bf16 and TF32 tensor cores). On the CPU it runs
only under the Triton interpreter (``TRITON_INTERPRET=1`` set before the kernels are first
imported), which is how the CPU tests exercise the same kernel code.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

from ...precision import Precision
from ...problem import ConvProblem
from ..base import Backend
from .configs import FpropConfig, fprop_candidates, interpreter_config

_MAX_GROUPS = 65535  # the launch grid's second dimension


def _interpreted() -> bool:
    """Whether the kernels are (or, once imported, will be) interpreted on the CPU."""
    mod = sys.modules.get(__name__.rsplit(".", 1)[0] + ".fprop")
    if mod is not None:
        return mod.INTERPRETED
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


class TritonBackend(Backend):
    NAME = "triton"
    SUPPORTED_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})
    MIN_CAPABILITY = (8, 0)
    IS_DETERMINISTIC = True

    @classmethod
    def available(cls) -> tuple[bool, str]:
        if importlib.util.find_spec("triton") is None:
            return False, "the triton package is not installed"
        if not torch.cuda.is_available() and not _interpreted():
            return False, "no GPU found and TRITON_INTERPRET=1 is not set"
        return True, ""

    @classmethod
    def not_supported_reasons(cls, problem: ConvProblem) -> list[str]:
        reasons = super().not_supported_reasons(problem)
        interp = _interpreted()
        if problem.device == "cpu" and not interp:
            reasons.append("CPU tensors need the Triton interpreter (TRITON_INTERPRET=1)")
        if problem.device == "cuda" and interp:
            reasons.append("the kernels were imported under TRITON_INTERPRET=1 and run on "
                           "CPU tensors only")
        if problem.groups > _MAX_GROUPS:
            reasons.append(f"groups {problem.groups} > {_MAX_GROUPS} (launch grid limit)")
        return reasons

    @classmethod
    def candidates(cls, problem: ConvProblem) -> list[FpropConfig]:
        if problem.device == "cpu":
            return [interpreter_config(problem)]
        return fprop_candidates(problem)

    @classmethod
    def forward(cls, problem, config, input, weight, bias, *, scale, shift, residual, out):
        from .fprop import launch_fprop

        if config is None:
            config = cls.candidates(problem)[0]
        if out is None:
            out = problem.new_output()
        x4, w4, o4, r4 = (_as4d(t, problem) for t in (input, weight, out, residual))
        if problem.device == "cuda":
            # NHWC operands load as wide, coalesced vectors along the channels; an NCHW input
            # is copied once (one pass over x) rather than gathered with stride H·W.
            x4 = x4.contiguous(memory_format=torch.channels_last)
            w4 = w4.contiguous(memory_format=torch.channels_last)
        pad = problem.pad_pre if problem.rank == 2 else (0, problem.pad_pre[0])
        stride = problem.stride if problem.rank == 2 else (1, problem.stride[0])
        dil = problem.dilation if problem.rank == 2 else (1, problem.dilation[0])
        precision = "tf32" if problem.precision == Precision.TF32 else "ieee"
        int64 = any(_max_offset(t) >= 2**31 - 1 for t in (x4, w4, o4, r4) if t is not None)
        launch_fprop(x4, w4, o4, scale, shift, r4, stride=stride, pad=pad, dilation=dil,
                     groups=problem.groups, act_code=problem.epilogue.act_code,
                     negative_slope=problem.epilogue.negative_slope, precision=precision,
                     config=config, int64=int64)
        return out


def _as4d(t: torch.Tensor | None, problem: ConvProblem) -> torch.Tensor | None:
    if t is None or problem.rank == 2:
        return t
    return t.unsqueeze(2)


def _max_offset(t: torch.Tensor) -> int:
    return sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))
