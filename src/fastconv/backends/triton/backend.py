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
from torch.utils.weak import WeakTensorKeyDictionary

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
    def bind(cls, problem: ConvProblem, config: FpropConfig | None):
        from .fprop import launch_fprop

        config = config or cls.candidates(problem)[0]
        two_d = problem.rank == 2
        pad = problem.pad_pre if two_d else (0, problem.pad_pre[0])
        bounds_post = any(problem.pad_post)
        stride = problem.stride if two_d else (1, problem.stride[0])
        dil = problem.dilation if two_d else (1, problem.dilation[0])
        precision = "tf32" if problem.precision == Precision.TF32 else "ieee"
        on_gpu = problem.device == "cuda"
        act, slope = problem.epilogue.act_code, problem.epilogue.negative_slope
        state = {}

        def run(input, weight, bias, scale, shift, residual, out):
            if out is None:
                out = problem.new_output()
            if on_gpu:
                # Channels-fastest operands load as wide, coalesced vectors: an NCHW input is
                # copied once per call, an NCHW weight once per version (cached).
                input, weight = channels_last(input), packed_weight(weight)
            x4, o4 = (input, out) if two_d else (input.unsqueeze(2), out.unsqueeze(2))
            r4 = residual if residual is None or two_d else residual.unsqueeze(2)
            w4 = weight if two_d else weight.unsqueeze(2)
            if "int64" not in state:  # depends on shapes and strides only: decide once
                state["int64"] = any(_max_offset(t) >= 2**31 - 1
                                     for t in (x4, w4, o4, r4) if t is not None)
            launch_fprop(x4, w4, o4, _contig(scale), _contig(shift), r4, stride=stride,
                         pad=pad, dilation=dil, groups=problem.groups, act_code=act,
                         negative_slope=slope, precision=precision, config=config,
                         int64=state["int64"], bounds_post=bounds_post)
            return out
        return run

    @classmethod
    def forward(cls, problem, config, input, weight, bias, *, scale, shift, residual, out):
        return cls.bind(problem, config)(input, weight, bias, scale, shift, residual, out)


_PACKED = WeakTensorKeyDictionary()  # weight -> (version, packed copy); dies with the weight


def _channels_fastest(t: torch.Tensor) -> bool:
    expect = 1
    for d in (1, *range(t.dim() - 1, 1, -1), 0):
        if t.shape[d] != 1 and t.stride(d) != expect:
            return False
        expect *= t.shape[d]
    return True


def channels_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` with channels (dimension 1) fastest, the rest in order: NHWC / NLC."""
    if _channels_fastest(t):
        return t
    perm = (0, *range(2, t.dim()), 1)
    inverse = (0, t.dim() - 1, *range(1, t.dim() - 1))
    return t.permute(perm).contiguous().permute(inverse)


def packed_weight(w: torch.Tensor) -> torch.Tensor:
    """``w`` with its input channels fastest, cached per weight tensor and *version*: an
    in-place update (an optimizer step) bumps ``w._version`` and the next call repacks."""
    if _channels_fastest(w):
        return w
    hit = _PACKED.get(w)
    if hit is not None and hit[0] == w._version:
        return hit[1]
    packed = channels_last(w)
    _PACKED[w] = (w._version, packed)
    return packed


def _contig(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None else t.contiguous()


def _max_offset(t: torch.Tensor) -> int:
    return sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))
