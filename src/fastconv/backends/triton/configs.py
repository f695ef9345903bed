"""Tile configurations for the Triton convolution kernels.

Under the interpreter one small tile keeps the CPU tests fast (each program instance costs
numpy work, so fewer, larger-than-needed tiles would only add masked lanes). On the GPU the
candidates are the shapes that the Hopper sweep in benchmarks/NOTES.md found worth timing;
the first one is the heuristic's pick.
"""

from __future__ import annotations

import dataclasses

import torch

from ...problem import ConvProblem


@dataclasses.dataclass(frozen=True)
class FpropConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    flat_k: bool

    def name(self) -> str:
        return (f"m{self.block_m}n{self.block_n}k{self.block_k}w{self.num_warps}"
                f"s{self.num_stages}{'f' if self.flat_k else ''}")


def _flat_k(problem: ConvProblem) -> bool:
    """Walk the flattened (r, s, c) reduction when a group has too few channels for a tile."""
    return problem.c_per_group < 16


def interpreter_config(problem: ConvProblem) -> FpropConfig:
    return FpropConfig(32, 16, 16, 4, 1, _flat_k(problem))


def fprop_candidates(problem: ConvProblem) -> list[FpropConfig]:
    """GPU tile configurations for ``problem``, best guess first."""
    flat = _flat_k(problem)
    narrow = problem.k_per_group <= 32
    half = problem.dtype in (torch.float16, torch.bfloat16)
    bk = 64 if half else 32
    if flat:
        bn = 16 if narrow else 64
        return [FpropConfig(128, bn, 32, 4, 3, True), FpropConfig(64, bn, 32, 4, 3, True),
                FpropConfig(128, 2 * bn, 32, 8, 3, True)]
    if problem.c_per_group < bk:
        bk = 16 if problem.c_per_group < 32 else 32
    bn_big = 64 if problem.k_per_group <= 64 else 128
    m = problem.n
    for o in problem.out_size:
        m *= o
    cands = [
        FpropConfig(128, bn_big, bk, 8 if bn_big == 128 else 4, 3, False),
        FpropConfig(128, 64, bk, 4, 4, False),
        FpropConfig(64, 64, bk, 4, 4, False),
        FpropConfig(64, bn_big, bk, 4, 3, False),
        FpropConfig(128, bn_big, bk, 8, 4, False),
        FpropConfig(256, bn_big, bk, 8, 3, False),
    ]
    if m < 4096:  # few output pixels (late ResNet stages): small tiles to fill the SMs
        cands.insert(0, cands.pop(2))
    out, seen = [], set()
    for cfg in cands:
        if cfg not in seen:
            seen.add(cfg)
            out.append(cfg)
    return out
