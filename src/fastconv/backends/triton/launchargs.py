"""The two argument bundles every convolution launcher takes (:class:`Geometry`,
:class:`EpilogueArgs`). Plain named tuples, importable without Triton: ``binds`` (imported
with fastconv) builds them, while the kernel modules, which fix Triton's interpreter mode
when imported, load at a plan's first launch."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Geometry(NamedTuple):
    """A convolution in the launchers' 4-D terms (rank 1 runs as H = 1): stride, padding
    before each spatial dimension and dilation, each an (h, w) pair, and groups (the
    depthwise launchers read the groups from the weight's shape)."""

    stride: tuple[int, int]
    pad: tuple[int, int]
    dilation: tuple[int, int]
    groups: int = 1


class EpilogueArgs(NamedTuple):
    """A launch's epilogue ``act(scale·acc + shift + residual)``: per-output-channel scale
    and shift and a residual (a 4-D view shaped as the output), each None where absent;
    ``act_code`` indexes ``epilogue.ACTIVATIONS``."""

    scale: torch.Tensor | None = None
    shift: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    act_code: int = 0
    negative_slope: float = 0.0


#: a launch without an epilogue (gradients)
NO_EPILOGUE = EpilogueArgs()
