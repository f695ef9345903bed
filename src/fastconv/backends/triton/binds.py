"""How a Triton configuration becomes the callable a plan runs: the kernels' launch
parameters per problem (:class:`_Binder`), prepared once per plan, and which kernel family
a problem's shape takes (direct depthwise, rolling rows, pair words, packed groups)."""

from __future__ import annotations

import dataclasses
import functools

import torch

from ...precision import Precision
from ...problem import ConvProblem, empty_in_layout, layout_of
from .configs import TileConfig
from .launchargs import NO_EPILOGUE, EpilogueArgs, Geometry
from .weights import (
    LastPacked,
    channels_last,
    diagonal_blocks,
    is_packed,
    packed_weight,
    roll_weight,
)


def direct_depthwise(problem: ConvProblem) -> bool:
    """Depthwise problems (any channel multiplier) run on depthwise.py's direct kernels."""
    return problem.depthwise and not problem.transposed


def roll_problem(problem: ConvProblem, op: str) -> bool:
    """Whether dw_roll.py's kernel can run ``op`` of a depthwise problem."""
    from . import dw_roll, dw_wgrad

    if not direct_depthwise(problem):
        return False
    two_d = problem.rank == 2
    geo = dict(channels_last=problem.layout == "nhwc", c_per_group=problem.c_per_group,
               kernel=problem.kernel if two_d else (1, *problem.kernel),
               stride=problem.stride if two_d else (1, *problem.stride),
               dilation=problem.dilation if two_d else (1, *problem.dilation))
    if op == "wgrad":
        return dw_wgrad.eligible(**geo)
    if op == "dgrad":
        return dw_roll.dgrad_eligible(multiplier=problem.k_per_group, **geo)
    return dw_roll.eligible(**geo)


def pairs_problem(problem: ConvProblem) -> bool:
    """Whether dw_pairs.py's forward can serve a depthwise problem given contiguous tensors:
    16-bit, channels-first, unit stride and even widths along the last dimension."""
    return (problem.dtype in (torch.float16, torch.bfloat16) and problem.layout == "nchw"
            and problem.stride[-1] == 1 and problem.in_size[-1] % 2 == 0
            and problem.out_size[-1] % 2 == 0)


#: Grouped convolutions with at most this many input and output channels per group also
#: get depthwise.py's direct kernels as candidates (issue 7: ResNeXt's 4-32 per group).
DIRECT_GROUP_MAX = 64
#: The direct kernels unroll a kernel row's taps at compile time: their compile time grows
#: about with the square of a row's length (the forward for sm_90a on a 2-core host: 2 s at
#: 16 taps, 36 s at 64). Past this many columns they are not offered: long_conv1d's timing
#: of its direct route at K = 1,024 left a background build running for hours, and the
#: bench's graph timing, which waits for every build, hung behind it (2026-11-29).
DIRECT_COLUMNS_MAX = 64


def direct_grouped(problem: ConvProblem) -> bool:
    return (problem.groups > 1 and not problem.transposed
            and problem.c_per_group <= DIRECT_GROUP_MAX
            and problem.k_per_group <= DIRECT_GROUP_MAX
            and problem.kernel[-1] <= DIRECT_COLUMNS_MAX)


def bind(problem: ConvProblem, config, op: str):
    if getattr(config, "pack_groups", 1) > 1:
        return _bind_packed_groups(problem, config, op)
    binder = _Binder(problem)
    if direct_depthwise(problem) or is_direct(config):
        return binder.bind_depthwise(config, op)
    if op == "dgrad":
        return binder.bind_dgrad(config)
    if op == "wgrad":
        return binder.bind_wgrad(config)
    if problem.transposed:
        return binder.bind_transposed(config)
    return binder.bind_fprop(config)


def _bind_packed_groups(problem: ConvProblem, config: TileConfig, op: str):
    """``problem`` run as ``groups / pack`` groups of ``pack`` times the channels, with the
    weight expanded to block-diagonal form (configs.pack_candidates): the forward and dgrad
    read the expanded weight, wgrad computes the expanded gradient and keeps its diagonal
    blocks."""
    pack, groups = config.pack_groups, problem.groups
    inner = bind(dataclasses.replace(problem, groups=groups // pack),
                  dataclasses.replace(config, pack_groups=1), op)
    if op == "dgrad":
        def run_dgrad(grad_out, weight, out):
            return inner(grad_out, packed_weight(weight, 0, groups, pack), out)
        return run_dgrad
    if op == "wgrad":
        def run_wgrad(grad_out, input, out):
            blocks = diagonal_blocks(inner(grad_out, input, None), groups, pack)
            if out is None:
                return blocks.contiguous()
            return out.copy_(blocks)
        return run_wgrad

    def run(input, weight, *rest):
        return inner(input, packed_weight(weight, 1, groups, pack), *rest)
    return run


def is_direct(config) -> bool:
    from .depthwise import DwConfig

    return isinstance(config, DwConfig)


class _Binder:
    """A problem's launch parameters in the kernels' 4-D terms (rank 1 runs as H = 1), and
    its runs per kernel family."""

    def __init__(self, problem: ConvProblem):
        self.problem = problem
        self.two_d = problem.rank == 2
        if self.two_d:
            self.geo = Geometry(problem.stride, problem.pad_pre, problem.dilation,
                                problem.groups)
        else:
            self.geo = Geometry((1, problem.stride[0]), (0, problem.pad_pre[0]),
                                (1, problem.dilation[0]), problem.groups)
        self.precision = "tf32" if problem.precision == Precision.TF32 else "ieee"
        self.on_gpu = problem.device == "cuda"
        self.int64: bool | None = None  # decided on the first call (shapes and strides only)

    def four_d(self, *tensors):
        return tuple(t if t is None or self.two_d else t.unsqueeze(2) for t in tensors)

    def needs_int64(self, *tensors) -> bool:
        if self.int64 is None:
            self.int64 = any(_max_offset(t) >= 2**31 - 1 for t in tensors if t is not None)
        return self.int64

    def run_wgrad(self, launch):
        """A depthwise weight gradient's run: ``launch(dy, x, dw, int64=...)`` on the 4-D
        views, into ``out`` or a new tensor of the weight's shape; the run it returns is
        kept for the plan's later calls (:class:`_Kept`)."""
        problem = self.problem
        kept = _Kept()

        def run_wgrad(grad_out, input, out):
            if out is None:
                out = torch.empty(problem.weight_shape(), dtype=problem.dtype,
                                  device=grad_out.device)
            tensors = self.four_d(grad_out, input, out)
            if not kept(tensors):
                kept.keep(tensors, launch(*tensors, int64=self.needs_int64(*tensors[:2])))
            return out
        return run_wgrad

    def bind_depthwise(self, config, op: str):
        from . import depthwise, dw_pairs

        problem = self.problem
        if config.roll:
            return self.bind_roll(config, op)
        geo = self.geo
        cl = problem.layout == "nhwc"
        if op == "dgrad":
            kept = _Kept()

            def run_dgrad(grad_out, weight, out):
                if out is None:
                    out = empty_in_layout(problem.input_shape(), layout_of(grad_out),
                                          grad_out.dtype, grad_out.device)
                tensors = self.four_d(grad_out, weight, out)
                if not kept(tensors):
                    kept.keep(tensors, depthwise.launch_dgrad(
                        *tensors, geo, channels_last=cl, config=config,
                        int64=self.needs_int64(*tensors)))
                return out
            return run_dgrad
        if op == "wgrad":
            return self.run_wgrad(functools.partial(depthwise.launch_wgrad, geo=geo,
                                                    channels_last=cl, config=config))
        act, slope = problem.epilogue.act_code, problem.epilogue.negative_slope
        # The plan's launch after its first call: a plan's calls differ only in the tensors'
        # addresses (their shapes, strides and dtypes are its key), so everything else is
        # reused; Prepared refuses a tensor of other address alignment (then decided again).
        prepared: list = []

        def run(input, weight, bias, scale, shift, residual, out):
            if out is None:
                out = problem.new_output(input.device)
            scale, shift = _contig(scale), _contig(shift)
            # (the prepared launch takes the tensors themselves: see bind_fprop)
            if prepared and prepared[0](input, weight, out, out if scale is None else scale,
                                        out if shift is None else shift,
                                        out if residual is None else residual):
                return out
            x4, w4, o4, r4 = self.four_d(input, weight, out, residual)
            launch = (dw_pairs.launch_fprop
                      if config.pairs and dw_pairs.eligible(x4, o4, r4, geo.stride[1])
                      else depthwise.launch_fprop)
            again = launch(x4, w4, o4, EpilogueArgs(scale, shift, r4, act, slope), geo,
                           channels_last=cl, config=config,
                           int64=self.needs_int64(x4, w4, o4, r4))
            prepared[:] = [] if again is None else [again]
            return out
        return run

    def bind_roll(self, config, op: str):
        """dw_roll.py's forward or data gradient, or dw_wgrad.py's weight gradient
        (``roll_problem``)."""
        from . import dw_roll, dw_wgrad

        problem = self.problem
        kernel = problem.kernel if self.two_d else (1, *problem.kernel)
        if op == "wgrad":
            return self.run_wgrad(functools.partial(dw_wgrad.launch_wgrad, geo=self.geo,
                                                    config=config))
        if op == "dgrad":
            kept = _Kept()

            def run_dgrad(grad_out, weight, out):
                if out is None:
                    out = empty_in_layout(problem.input_shape(), layout_of(grad_out),
                                          grad_out.dtype, grad_out.device)
                d4, o4 = self.four_d(grad_out, out)
                wp = roll_weight(weight, config.block_b)
                tensors = (d4, wp, o4, o4, o4, o4)  # (no scale, shift or residual: out)
                if not kept(tensors):
                    kept.keep(tensors, dw_roll.launch_dgrad(
                        d4, wp, o4, self.geo, kernel=kernel, config=config,
                        int64=self.needs_int64(d4, o4)))
                return out
            return run_dgrad
        act, slope = problem.epilogue.act_code, problem.epilogue.negative_slope
        prepared: list = []  # the plan's launch after its first call (as bind_depthwise's)

        def run(input, weight, bias, scale, shift, residual, out):
            if out is None:
                out = problem.new_output(input.device)
            x4, o4, r4 = self.four_d(input, out, residual)
            wp = roll_weight(weight, config.block_b)
            scale, shift = _contig(scale), _contig(shift)
            if prepared and prepared[0](x4, wp, o4, o4 if scale is None else scale,
                                        o4 if shift is None else shift,
                                        o4 if r4 is None else r4):
                return out
            again = dw_roll.launch_fprop(
                x4, wp, o4, EpilogueArgs(scale, shift, r4, act, slope), self.geo,
                kernel=kernel, config=config, int64=self.needs_int64(x4, o4, r4))
            prepared[:] = [] if again is None else [again]
            return out
        return run

    def bind_fprop(self, config):
        from .fprop import prepare_fprop

        problem = self.problem
        act, slope = problem.epilogue.act_code, problem.epilogue.negative_slope
        bounds_post = any(problem.pad_post)
        prepared: list = []  # the plan's launch after its first call (as bind_depthwise's)
        # whether the weight and the input come in the layout the kernel reads: fixed per
        # plan (its signature holds their strides), so tested at the first call only
        packed: list = []
        last_packed = LastPacked()

        def run(input, weight, bias, scale, shift, residual, out):
            if out is None:
                out = problem.new_output(input.device)
            if self.on_gpu:
                # Channels-fastest operands load as wide, coalesced vectors: an NCHW input is
                # copied once per call (not for row tiles, which read it as it is), an NCHW
                # weight once per version (cached).
                if not packed:
                    packed[:] = [is_packed(weight, 1), config.rows or is_packed(input, 1)]
                if not packed[0]:
                    weight = last_packed(weight)
                if not packed[1]:
                    input = channels_last(input)
            scale, shift = _contig(scale), _contig(shift)
            # (a prepared launch reads the tensors' addresses only: a rank-1 problem's 4-D
            # views, the same addresses, are made for the first launch alone)
            if prepared and prepared[0](input, weight, out, out if scale is None else scale,
                                        out if shift is None else shift,
                                        out if residual is None else residual, out):
                return out
            x4, w4, o4, r4 = self.four_d(input, weight, out, residual)
            again = prepare_fprop(x4, w4, o4, EpilogueArgs(scale, shift, r4, act, slope),
                                  self.geo, precision=self.precision, config=config,
                                  int64=self.needs_int64(x4, w4, o4, r4),
                                  bounds_post=bounds_post)
            prepared[:] = [] if again is None else [again]
            return out
        return run

    def bind_transposed(self, config):
        from .dgrad import prepare_dgrad

        problem = self.problem
        act, slope = problem.epilogue.act_code, problem.epilogue.negative_slope
        kept = _Kept()

        def run(input, weight, bias, scale, shift, residual, out):
            if out is None:
                out = problem.new_output(input.device)
            if self.on_gpu:
                input, weight = channels_last(input), packed_weight(weight, dim=0)
            x4, w4, o4, r4 = self.four_d(input, weight, out, residual)
            scale, shift = _contig(scale), _contig(shift)
            tensors = (x4, w4, o4, o4 if scale is None else scale,
                       o4 if shift is None else shift, o4 if r4 is None else r4)
            if not kept(tensors):
                kept.keep(tensors, prepare_dgrad(
                    x4, w4, o4, EpilogueArgs(scale, shift, r4, act, slope), self.geo,
                    precision=self.precision, config=config,
                    int64=self.needs_int64(x4, w4, o4, r4)))
            return out
        return run

    def bind_dgrad(self, config):
        from .dgrad import prepare_dgrad

        problem = self.problem
        kept = _Kept()

        def run(grad_out, weight, out):
            if out is None:
                out = empty_in_layout(problem.input_shape(), layout_of(grad_out),
                                      grad_out.dtype, grad_out.device)
            if self.on_gpu:
                grad_out, weight = channels_last(grad_out), packed_weight(weight, dim=0)
            d4, w4, o4 = self.four_d(grad_out, weight, out)
            tensors = (d4, w4, o4, o4, o4, o4)
            if not kept(tensors):
                kept.keep(tensors, prepare_dgrad(
                    d4, w4, o4, NO_EPILOGUE, self.geo, precision=self.precision,
                    config=config, int64=self.needs_int64(d4, w4, o4)))
            return out
        return run

    def bind_wgrad(self, config):
        from .wgrad import prepare_wgrad

        problem = self.problem
        kept = _Kept()

        def run(grad_out, input, out):
            if out is None:
                out = torch.empty(problem.weight_shape(), dtype=problem.dtype,
                                  device=grad_out.device)
            # Both operands are read along the pixel reduction. The input keeps its layout:
            # NCHW keeps the reduction contiguous, as TF32 tensor cores need (both operands
            # K-major), NHWC suits 16-bit types, which may be MN-major; dy follows it (a
            # mixed pair measured 2x slower in bf16).
            if self.on_gpu and layout_of(grad_out) != layout_of(input):
                grad_out = (channels_last(grad_out) if layout_of(input) == "nhwc"
                            else grad_out.contiguous())
            d4, x4, o4 = self.four_d(grad_out, input, out)
            if not kept((d4, x4, o4)):
                kept.keep((d4, x4, o4), prepare_wgrad(
                    d4, x4, o4, self.geo, precision=self.precision, config=config,
                    int64=self.needs_int64(d4, x4, o4)))
            return out
        return run


class _Kept:
    """A plan's prepared launch (``launch.Prepared``) with the strides of the operands it was
    made for: ``kept(tensors)`` launches it and returns True where the operands have those
    strides (a plan fixes their shapes and dtypes, not their layout: a gradient may come in
    either), else returns False, launching nothing; ``keep(tensors, prepared)`` after a full
    launch (``prepared`` None: the interpreter, split-K)."""

    __slots__ = ("strides", "prepared")

    def __init__(self):
        self.strides = self.prepared = None

    def __call__(self, tensors: tuple) -> bool:
        return self.prepared is not None \
            and tuple(t.stride() for t in tensors) == self.strides \
            and self.prepared(*tensors)

    def keep(self, tensors: tuple, prepared) -> None:
        self.strides = tuple(t.stride() for t in tensors)
        self.prepared = prepared


def _contig(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None else t.contiguous()


def _max_offset(t: torch.Tensor) -> int:
    return sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))

