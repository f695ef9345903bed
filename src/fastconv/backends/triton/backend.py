"""The Triton backend: implicit-GEMM kernels with a fused epilogue, and direct kernels for
depthwise convolutions (depthwise.py: groups == input channels, not transposed).

On the GPU it needs compute capability 8.0 (bf16 and TF32 tensor cores). On the CPU it runs
only under the Triton interpreter (``TRITON_INTERPRET=1`` set before the kernels are first
imported), which is how the CPU tests exercise the same kernel code.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import sys

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from ...context import transient
from ...precision import Precision
from ...problem import ConvProblem, empty_in_layout, layout_of
from ..base import Backend
from .configs import (
    TileConfig,
    dgrad_candidates,
    fprop_candidates,
    interpreter_config,
    pack_candidates,
    rows_candidates,
    wgrad_candidates,
)

_MAX_GROUPS = 65535  # the launch grid's second dimension


def _interpreted() -> bool:
    """Whether the kernels are (or, once imported, will be) interpreted on the CPU."""
    mod = sys.modules.get(__name__.rsplit(".", 1)[0] + ".fprop")
    if mod is not None:
        return mod.INTERPRETED
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


class TritonBackend(Backend):
    NAME = "triton"
    # float64 only under the interpreter: it lets the CPU tests gradcheck the kernels.
    SUPPORTED_DTYPES = frozenset({torch.float64, torch.float32, torch.float16, torch.bfloat16})
    MIN_CAPABILITY = (8, 0)
    IS_DETERMINISTIC = True
    SUPPORTS_TRANSPOSED = True

    @classmethod
    def available(cls) -> tuple[bool, str]:
        if importlib.util.find_spec("triton") is None:
            return False, "the triton package is not installed"
        if not torch.cuda.is_available() and not _interpreted():
            return False, "no GPU found and TRITON_INTERPRET=1 is not set"
        return True, ""

    BUILDS_AHEAD = True

    @classmethod
    def prune(cls, problem: ConvProblem, op: str, configs: list,
              keep: int) -> tuple[list, list]:
        """GEMM tiles ranked by cost.py's model, the ``keep`` fastest expected kept; direct
        tiles (not modelled) always kept."""
        from .cost import prune

        return prune(problem, op, configs, keep)

    @classmethod
    def compile_ahead(cls, run) -> list | None:
        """The kernels ``run()`` would compile, compiled by worker processes
        (``compiles.py``); None under the interpreter or with no workers."""
        from . import compiles

        if _interpreted():
            return None
        compiles.driver_ready()
        if compiles.workers() == 0:
            return None
        with compiles.collecting() as jobs:
            run()
        return jobs

    @classmethod
    def not_supported_reasons(cls, problem: ConvProblem) -> list[str]:
        reasons = super().not_supported_reasons(problem)
        interp = _interpreted()
        if problem.device == "cpu" and not interp:
            reasons.append("CPU tensors need the Triton interpreter (TRITON_INTERPRET=1)")
        if problem.device == "cuda" and interp:
            reasons.append("the kernels were imported under TRITON_INTERPRET=1 and run on "
                           "CPU tensors only")
        if problem.dtype == torch.float64 and not interp:
            reasons.append("float64 runs only under the Triton interpreter (for gradcheck)")
        if problem.groups > _MAX_GROUPS:
            reasons.append(f"groups {problem.groups} > {_MAX_GROUPS} (launch grid limit)")
        return reasons

    @classmethod
    def decode_config(cls, data):
        from .depthwise import DwConfig

        kinds = {"TileConfig": TileConfig, "DwConfig": DwConfig}
        if not isinstance(data, dict) or data.get("__dataclass__") not in kinds:
            raise ValueError(f"not a Triton tile configuration: {data!r}")
        return kinds[data["__dataclass__"]](**{k: v for k, v in data.items()
                                              if k != "__dataclass__"})

    @classmethod
    def config_errors(cls, problem: ConvProblem, config, op: str = "fprop") -> list[str]:
        """Types, ranges, powers of two and the candidate rules (which tiles suit which
        problems and operations): a stored or pinned tile outside them could compile
        forever, fault, or compute garbage."""
        from .depthwise import DwConfig

        if isinstance(config, TileConfig):
            return _tile_errors(problem, config, op)
        if isinstance(config, DwConfig):
            return _direct_errors(problem, config, op)
        return [f"not a Triton tile configuration: {config!r}"]

    @classmethod
    def candidates(cls, problem: ConvProblem, op: str = "fprop") -> list:
        from .depthwise import candidates as direct

        if _direct_depthwise(problem):
            return direct(problem.layout == "nhwc", problem.device == "cuda",
                          pairs=op == "fprop" and _pairs_problem(problem),
                          plane=problem.rank == 2, narrow=problem.out_size[-1] < 64,
                          roll=_roll_problem(problem, op), wgrad=op == "wgrad")
        if problem.device == "cpu":
            return [interpreter_config(problem, op)]
        if op == "dgrad" or (op == "fprop" and problem.transposed):
            tiles = dgrad_candidates(problem.conv_equivalent() if problem.transposed
                                     else problem)
        elif op == "wgrad":
            tiles = wgrad_candidates(problem)
        else:
            tiles = fprop_candidates(problem)
            tiles = tiles + rows_candidates(problem)
        tiles = tiles + pack_candidates(problem, op)
        if _direct_grouped(problem):  # after the GEMM tiles: timed, or pinned, never the
            tiles = tiles + direct(problem.layout == "nhwc", True)  # heuristic's pick
        return tiles

    @classmethod
    def warm_up(cls) -> None:
        """Start creating Triton's GPU driver in the background (``compiles.warm_driver``)
        where the backend can run on this machine's GPU; nothing on a CPU-only machine or
        under the interpreter."""
        if cls.available()[0] and torch.cuda.is_available() and not _interpreted():
            from . import compiles

            compiles.warm_driver()

    @classmethod
    def bind(cls, problem: ConvProblem, config, op: str = "fprop"):
        from . import compiles
        from .fprop import serialized

        if not _interpreted():
            compiles.driver_ready()
        return serialized(_bind(problem, config or cls.candidates(problem, op)[0], op))

    @classmethod
    def forward(cls, problem, config, input, weight, bias, *, scale, shift, residual, out):
        return cls.bind(problem, config)(input, weight, bias, scale, shift, residual, out)


def _bind(problem: ConvProblem, config, op: str):
    if getattr(config, "pack_groups", 1) > 1:
        return _bind_packed_groups(problem, config, op)
    geo = _Geometry(problem)
    if _direct_depthwise(problem) or _is_direct(config):
        return geo.bind_depthwise(config, op)
    if op == "dgrad":
        return geo.bind_dgrad(config)
    if op == "wgrad":
        return geo.bind_wgrad(config)
    if problem.transposed:
        return geo.bind_transposed(config)
    return geo.bind_fprop(config)


def _pow2(value, lo: int, hi: int) -> bool:
    return type(value) is int and lo <= value <= hi and value & (value - 1) == 0


def _field_errors(config, rules: dict) -> list[str]:
    """``rules``: field -> (test, what is allowed)."""
    return [f"{name} = {getattr(config, name)!r}: allowed {allowed}"
            for name, (test, allowed) in rules.items() if not test(getattr(config, name))]


#: Shared memory a GEMM tile's pipeline may ask for (the H100 has 227 KiB per block).
_SMEM_LIMIT = 200 * 1024
_SPLIT_MAX = {"fprop": 16, "wgrad": 128}  # the candidates' largest splits: 6 and 128
_BOOL = (lambda v: type(v) is bool, "True or False")
_WARPS = (lambda v: _pow2(v, 1, 16), "a power of two in [1, 16]")


def _tile_errors(problem: ConvProblem, config: TileConfig, op: str) -> list[str]:
    if _direct_depthwise(problem):
        return ["a depthwise convolution runs direct tiles (DwConfig), not GEMM tiles"]
    split_max = 1 if config.rows or (op == "fprop" and problem.transposed) \
        else _SPLIT_MAX.get(op, 1)
    errors = _field_errors(config, {
        "block_m": (lambda v: _pow2(v, 16, 256), "a power of two in [16, 256]"),
        "block_n": (lambda v: _pow2(v, 16, 256), "a power of two in [16, 256]"),
        "block_k": (lambda v: _pow2(v, 16, 128), "a power of two in [16, 128]"),
        "num_warps": _WARPS,
        "num_stages": (lambda v: type(v) is int and 1 <= v <= 8, "an int in [1, 8]"),
        "flat_k": _BOOL, "rows": _BOOL,
        "split_k": (lambda v: type(v) is int and 1 <= v <= split_max,
                    f"an int in [1, {split_max}] for this {op}"),
        "pack_groups": (lambda v: type(v) is int and v >= 1 and problem.groups % v == 0,
                        f"a divisor of groups = {problem.groups}"),
    })
    if errors:
        return errors
    if config.pack_groups > 1:
        if problem.transposed:
            return ["pack_groups > 1: not for transposed convolutions"]
        return _tile_errors(dataclasses.replace(problem,
                                                groups=problem.groups // config.pack_groups),
                            dataclasses.replace(config, pack_groups=1), op)
    item = 4 if problem.dtype in (torch.float32, torch.float64) else 2
    smem = (config.block_m + config.block_n) * config.block_k * item * config.num_stages
    if problem.device == "cuda" and smem > _SMEM_LIMIT:
        errors.append(f"the tile's pipeline needs {smem} bytes of shared memory "
                      f"(at most {_SMEM_LIMIT})")
    if config.flat_k and (op != "fprop" or problem.transposed):
        errors.append("flat_k: only the forward of a non-transposed convolution")
    if config.rows and (op != "fprop" or not rows_candidates(problem)):
        errors.append("rows: only the forward of a channels-first conv1d with 16 or more "
                      "channels per group")
    return errors


def _direct_errors(problem: ConvProblem, config, op: str) -> list[str]:
    errors = _field_errors(config, {
        "block_a": (lambda v: _pow2(v, 1, 1024), "a power of two in [1, 1024]"),
        "block_b": (lambda v: _pow2(v, 1, 1024), "a power of two in [1, 1024]"),
        "num_warps": _WARPS, "pairs": _BOOL, "plane": _BOOL,
        "roll": (lambda v: type(v) is int and 0 <= v <= 1024, "an int in [0, 1024]"),
    })
    if errors:
        return errors
    if config.roll and not _roll_problem(problem, op):
        errors.append("roll: only the forward of a channels-last depthwise convolution with "
                      "unit row dilation and at most 7 output rows per input row, its "
                      "data gradient at stride 1 with one output channel per input, and its "
                      "weight gradient at row stride 1 or 2 for kernels of at most 7 rows and 8 "
                      "columns")
    if config.roll and (config.pairs or config.plane):
        errors.append("roll: not with pairs or plane")
    if config.block_a * config.block_b > 8192:
        errors.append(f"a {config.block_a}x{config.block_b} tile: at most 8192 elements")
    if not (_direct_depthwise(problem) or _direct_grouped(problem)):
        errors.append("direct tiles run depthwise convolutions and groups of at most "
                      f"{_DIRECT_GROUP_MAX} channels, not transposed")
    if config.plane and (problem.rank != 2 or problem.layout != "nchw"):
        errors.append("plane: only channels-first conv2d")
    if config.pairs and (op != "fprop" or problem.layout != "nchw"
                         or problem.dtype not in (torch.float16, torch.bfloat16)):
        errors.append("pairs: only the forward of a channels-first 16-bit convolution")
    return errors


def _direct_depthwise(problem: ConvProblem) -> bool:
    """Depthwise problems (any channel multiplier) run on depthwise.py's direct kernels."""
    return problem.depthwise and not problem.transposed


def _roll_problem(problem: ConvProblem, op: str) -> bool:
    """Whether dw_roll.py's kernel can run ``op`` of a depthwise problem."""
    from . import dw_roll, dw_wgrad

    if not _direct_depthwise(problem):
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


def _pairs_problem(problem: ConvProblem) -> bool:
    """Whether dw_pairs.py's forward can serve a depthwise problem given contiguous tensors:
    16-bit, channels-first, unit stride and even widths along the last dimension."""
    return (problem.dtype in (torch.float16, torch.bfloat16) and problem.layout == "nchw"
            and problem.stride[-1] == 1 and problem.in_size[-1] % 2 == 0
            and problem.out_size[-1] % 2 == 0)


#: Grouped convolutions with at most this many input and output channels per group also
#: get depthwise.py's direct kernels as candidates (issue 7: ResNeXt's 4-32 per group).
_DIRECT_GROUP_MAX = 64


def _direct_grouped(problem: ConvProblem) -> bool:
    return (problem.groups > 1 and not problem.transposed
            and problem.c_per_group <= _DIRECT_GROUP_MAX
            and problem.k_per_group <= _DIRECT_GROUP_MAX)


def _bind_packed_groups(problem: ConvProblem, config: TileConfig, op: str):
    """``problem`` run as ``groups / pack`` groups of ``pack`` times the channels, with the
    weight expanded to block-diagonal form (configs.pack_candidates): the forward and dgrad
    read the expanded weight, wgrad computes the expanded gradient and keeps its diagonal
    blocks."""
    pack, groups = config.pack_groups, problem.groups
    inner = _bind(dataclasses.replace(problem, groups=groups // pack),
                  dataclasses.replace(config, pack_groups=1), op)
    if op == "dgrad":
        def run_dgrad(grad_out, weight, out):
            return inner(grad_out, packed_weight(weight, 0, groups, pack), out)
        return run_dgrad
    if op == "wgrad":
        def run_wgrad(grad_out, input, out):
            blocks = _diagonal_blocks(inner(grad_out, input, None), groups, pack)
            if out is None:
                return blocks.contiguous()
            return out.copy_(blocks)
        return run_wgrad

    def run(input, weight, *rest):
        return inner(input, packed_weight(weight, 1, groups, pack), *rest)
    return run


def _blocks_view(full: torch.Tensor, groups: int, pack: int) -> torch.Tensor:
    """The (groups/pack, pack, K/groups, pack, C/groups, *kernel) view of an expanded
    (K, pack·C/groups, *kernel) weight; its diagonal over dims 1 and 3 is the real weight."""
    k, wide = full.shape[:2]
    return full.unflatten(0, (groups // pack, pack, k // groups)).unflatten(
        3, (pack, wide // pack))


def _diagonal_blocks(full: torch.Tensor, groups: int, pack: int) -> torch.Tensor:
    """The (K, C/groups, *kernel) weight inside an expanded one (a view)."""
    diag = torch.diagonal(_blocks_view(full, groups, pack), dim1=1, dim2=3)
    return diag.movedim(-1, 1).flatten(0, 2)


def _expand_groups(w: torch.Tensor, groups: int, pack: int, dim: int) -> torch.Tensor:
    """``w`` (K, C/groups, *kernel) as the block-diagonal weight of ``groups / pack``
    groups, zeros between the blocks, dimension ``dim`` fastest in memory."""
    k, cg, *kernel = w.shape
    full = _pack(w.new_zeros(k, pack * cg, *kernel), dim)
    torch.diagonal(_blocks_view(full, groups, pack), dim1=1, dim2=3).copy_(
        w.unflatten(0, (groups // pack, pack, k // groups)).movedim(1, -1))
    return full


def _is_direct(config) -> bool:
    from .depthwise import DwConfig

    return isinstance(config, DwConfig)


class _Geometry:
    """A problem's launch parameters in the kernels' 4-D terms (rank 1 runs as H = 1)."""

    def __init__(self, problem: ConvProblem):
        self.problem = problem
        self.two_d = problem.rank == 2
        if self.two_d:
            self.pad, self.stride, self.dilation = \
                problem.pad_pre, problem.stride, problem.dilation
        else:
            self.pad = (0, problem.pad_pre[0])
            self.stride = (1, problem.stride[0])
            self.dilation = (1, problem.dilation[0])
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
        views, into ``out`` or a new tensor of the weight's shape."""
        problem = self.problem

        def run_wgrad(grad_out, input, out):
            if out is None:
                out = torch.empty(problem.weight_shape(), dtype=problem.dtype,
                                  device=grad_out.device)
            d4, x4, o4 = self.four_d(grad_out, input, out)
            launch(d4, x4, o4, int64=self.needs_int64(d4, x4))
            return out
        return run_wgrad

    def bind_depthwise(self, config, op: str):
        from . import depthwise, dw_pairs

        problem = self.problem
        if config.roll:
            return self.bind_roll(config, op)
        cl = problem.layout == "nhwc"
        geo = dict(stride=self.stride, pad=self.pad, dilation=self.dilation,
                   channels_last=cl, config=config)
        if op == "dgrad":
            def run_dgrad(grad_out, weight, out):
                if out is None:
                    out = empty_in_layout(problem.input_shape(), layout_of(grad_out),
                                          grad_out.dtype, grad_out.device)
                d4, w4, o4 = self.four_d(grad_out, weight, out)
                depthwise.launch_dgrad(d4, w4, o4, int64=self.needs_int64(d4, w4, o4), **geo)
                return out
            return run_dgrad
        if op == "wgrad":
            return self.run_wgrad(functools.partial(depthwise.launch_wgrad, **geo))
        act, slope = problem.epilogue.act_code, problem.epilogue.negative_slope
        # The plan's launch after its first call: a plan's calls differ only in the tensors'
        # addresses (their shapes, strides and dtypes are its key), so everything else is
        # reused; Prepared refuses a tensor of other address alignment (then decided again).
        prepared: list = []

        def run(input, weight, bias, scale, shift, residual, out):
            if out is None:
                out = problem.new_output(input.device)
            x4, w4, o4, r4 = self.four_d(input, weight, out, residual)
            scale, shift = _contig(scale), _contig(shift)
            if prepared and prepared[0](x4, w4, o4, o4 if scale is None else scale,
                                        o4 if shift is None else shift,
                                        o4 if r4 is None else r4):
                return out
            launch = (dw_pairs.launch_fprop
                      if config.pairs and dw_pairs.eligible(x4, o4, r4, self.stride[1])
                      else depthwise.launch_fprop)
            again = launch(x4, w4, o4, scale, shift, r4, act_code=act, negative_slope=slope,
                           int64=self.needs_int64(x4, w4, o4, r4), **geo)
            prepared[:] = [] if again is None else [again]
            return out
        return run

    def bind_roll(self, config, op: str):
        """dw_roll.py's forward or data gradient, or dw_wgrad.py's weight gradient
        (``_roll_problem``)."""
        from . import dw_roll, dw_wgrad

        problem = self.problem
        kernel = problem.kernel if self.two_d else (1, *problem.kernel)
        if op == "wgrad":
            return self.run_wgrad(functools.partial(
                dw_wgrad.launch_wgrad, stride=self.stride, pad=self.pad,
                dilation=self.dilation, config=config))
        if op == "dgrad":
            def run_dgrad(grad_out, weight, out):
                if out is None:
                    out = empty_in_layout(problem.input_shape(), layout_of(grad_out),
                                          grad_out.dtype, grad_out.device)
                d4, o4 = self.four_d(grad_out, out)
                dw_roll.launch_dgrad(d4, roll_weight(weight, config.block_b), o4,
                                     kernel=kernel, pad=self.pad, dilation=self.dilation,
                                     config=config, int64=self.needs_int64(d4, o4))
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
                x4, wp, o4, scale, shift, r4, kernel=kernel, stride=self.stride, pad=self.pad,
                dilation=self.dilation, act_code=act, negative_slope=slope, config=config,
                int64=self.needs_int64(x4, o4, r4))
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

        def run(input, weight, bias, scale, shift, residual, out):
            if out is None:
                out = problem.new_output(input.device)
            if self.on_gpu:
                # Channels-fastest operands load as wide, coalesced vectors: an NCHW input is
                # copied once per call (not for row tiles, which read it as it is), an NCHW
                # weight once per version (cached).
                if not packed:
                    packed[:] = [_is_packed(weight, 1), config.rows or _is_packed(input, 1)]
                if not packed[0]:
                    weight = packed_weight(weight)
                if not packed[1]:
                    input = channels_last(input)
            x4, w4, o4, r4 = self.four_d(input, weight, out, residual)
            scale, shift = _contig(scale), _contig(shift)
            if prepared and prepared[0](x4, w4, o4, o4 if scale is None else scale,
                                        o4 if shift is None else shift,
                                        o4 if r4 is None else r4, o4):
                return out
            again = prepare_fprop(x4, w4, o4, scale, shift, r4, stride=self.stride,
                                  pad=self.pad, dilation=self.dilation, groups=problem.groups,
                                  act_code=act, negative_slope=slope, precision=self.precision,
                                  config=config, int64=self.needs_int64(x4, w4, o4, r4),
                                  bounds_post=bounds_post)
            prepared[:] = [] if again is None else [again]
            return out
        return run

    def bind_transposed(self, config):
        from .dgrad import launch_dgrad

        problem = self.problem
        act, slope = problem.epilogue.act_code, problem.epilogue.negative_slope

        def run(input, weight, bias, scale, shift, residual, out):
            if out is None:
                out = problem.new_output(input.device)
            if self.on_gpu:
                input, weight = channels_last(input), packed_weight(weight, dim=0)
            x4, w4, o4, r4 = self.four_d(input, weight, out, residual)
            launch_dgrad(x4, w4, o4, _contig(scale), _contig(shift), r4, stride=self.stride,
                         pad=self.pad, dilation=self.dilation, groups=problem.groups,
                         act_code=act, negative_slope=slope, precision=self.precision,
                         config=config, int64=self.needs_int64(x4, w4, o4, r4))
            return out
        return run

    def bind_dgrad(self, config):
        from .dgrad import launch_dgrad

        problem = self.problem

        def run(grad_out, weight, out):
            if out is None:
                out = empty_in_layout(problem.input_shape(), layout_of(grad_out),
                                      grad_out.dtype, grad_out.device)
            if self.on_gpu:
                grad_out, weight = channels_last(grad_out), packed_weight(weight, dim=0)
            d4, w4, o4 = self.four_d(grad_out, weight, out)
            launch_dgrad(d4, w4, o4, None, None, None, stride=self.stride, pad=self.pad,
                         dilation=self.dilation, groups=problem.groups, act_code=0,
                         negative_slope=0.0, precision=self.precision, config=config,
                         int64=self.needs_int64(d4, w4, o4))
            return out
        return run

    def bind_wgrad(self, config):
        from .wgrad import launch_wgrad

        problem = self.problem

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
            launch_wgrad(d4, x4, o4, stride=self.stride, pad=self.pad, dilation=self.dilation,
                         groups=problem.groups, precision=self.precision, config=config,
                         int64=self.needs_int64(d4, x4, o4))
            return out
        return run


# weight -> {(fastest dim, groups, pack): (version, packed copy)}; dies with the weight
_PACKED = WeakTensorKeyDictionary()


def _order(t: torch.Tensor, dim: int) -> tuple[int, ...]:
    """Dimensions from slowest to fastest with ``dim`` moved last, the rest in order."""
    return (*(d for d in range(t.dim()) if d != dim), dim)


def _is_packed(t: torch.Tensor, dim: int) -> bool:
    expect = 1
    for d in reversed(_order(t, dim)):
        if t.shape[d] != 1 and t.stride(d) != expect:
            return False
        expect *= t.shape[d]
    return True


def _pack(t: torch.Tensor, dim: int) -> torch.Tensor:
    order = _order(t, dim)
    inverse = tuple(order.index(d) for d in range(t.dim()))
    return t.permute(order).contiguous().permute(inverse)


def channels_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` with channels (dimension 1) fastest, the rest in order: NHWC / NLC."""
    return t if _is_packed(t, 1) else _pack(t, 1)


def packed_weight(w: torch.Tensor, dim: int = 1, groups: int = 1,
                  pack: int = 1) -> torch.Tensor:
    """``w`` with dimension ``dim`` fastest — the reduction dimension of the GEMM that reads
    it: input channels for the forward, output channels (``dim=0``) for dgrad, which makes
    the tile K-major as TF32 tensor cores need; with ``pack > 1``, expanded to the
    block-diagonal weight of ``groups / pack`` groups first. Cached per weight tensor and
    *version*: an in-place update (an optimizer step) bumps ``w._version`` and the next call
    repacks. Not while a CUDA graph is captured: a replay does not run this check, so the
    graph packs the weight itself (a training graph replays after every optimizer step)."""
    if pack == 1 and _is_packed(w, dim):
        return w
    return _cached(w, (dim, groups, pack), lambda: _repack(w, dim, groups, pack))


def roll_weight(w: torch.Tensor, block_c: int) -> torch.Tensor:
    """A depthwise weight as dw_roll.py's kernel reads it (``dw_roll.pack_weight``, on the
    4-D view), cached as ``packed_weight``."""
    from .dw_roll import pack_weight

    return _cached(w, ("roll", block_c),
                   lambda: pack_weight(w if w.dim() == 4 else w.unsqueeze(2), block_c))


def _cached(w: torch.Tensor, key: tuple, make) -> torch.Tensor:
    """``make()``, a derived form of ``w``, cached per weight tensor and version (see
    ``packed_weight``); made afresh while a CUDA graph is captured and inside a compiled
    graph's op (``context.transient``: ``w`` may be a reused buffer)."""
    if transient() or (w.is_cuda and torch.cuda.is_current_stream_capturing()):
        return make()
    per_key = _PACKED.get(w)
    hit = per_key.get(key) if per_key is not None else None
    if hit is not None and hit[0] == w._version:
        return hit[1]
    derived = make()
    if per_key is None:
        per_key = _PACKED[w] = {}
    per_key[key] = (w._version, derived)
    return derived


def _repack(w: torch.Tensor, dim: int, groups: int, pack: int) -> torch.Tensor:
    return _expand_groups(w, groups, pack, dim) if pack > 1 else _pack(w, dim)


def _contig(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None else t.contiguous()


def _max_offset(t: torch.Tensor) -> int:
    return sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))
