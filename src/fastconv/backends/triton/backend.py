"""The Triton backend: implicit-GEMM kernels with a fused epilogue, and direct kernels for
depthwise convolutions (depthwise.py: groups == input channels, not transposed).

On the GPU it needs compute capability 8.0 (bf16 and TF32 tensor cores). On the CPU it runs
only under the Triton interpreter (``TRITON_INTERPRET=1`` set before the kernels are first
imported), which is how the CPU tests exercise the same kernel code.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys

import torch

from ...problem import ConvProblem
from ..base import Backend
from .binds import (
    DIRECT_COLUMNS_MAX,
    DIRECT_GROUP_MAX,
    bind,
    direct_depthwise,
    direct_grouped,
    pairs_problem,
    roll_problem,
)
from .configs import (
    SMEM_LIMIT,
    TileConfig,
    dgrad_candidates,
    fprop_candidates,
    interpreter_config,
    pack_candidates,
    rows_candidates,
    tap_rows_fit,
    tap_run,
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
        """GEMM tiles ranked by cost.py's model, the ``keep`` fastest expected kept; a
        depthwise convolution's direct tiles (not modelled) always kept, a grouped one's
        never: exhaustive tuning never chose them for any of the 130 grouped problems of the
        H100 and H200 databases, and at batch 256 they ran 32-218x aten's time (resnext50's
        4-channel groups, H200, 325ed47), so under a budget they cost their background
        compiles and first readings for nothing. Exhaustive tuning still times them."""
        from .cost import prune
        from .depthwise import DwConfig

        kept, pruned = prune(problem, op, configs, keep)
        if direct_depthwise(problem):
            return kept, pruned
        return ([c for c in kept if not isinstance(c, DwConfig)],
                pruned + [c for c in kept if isinstance(c, DwConfig)])

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
        if direct_depthwise(problem) and problem.kernel[-1] > DIRECT_COLUMNS_MAX:
            reasons.append(f"a depthwise kernel row of {problem.kernel[-1]} taps: the direct "
                           f"kernels unroll a row at compile time, at most "
                           f"{DIRECT_COLUMNS_MAX} taps (minutes to compile past that)")
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

        if direct_depthwise(problem):
            return direct(problem.layout == "nhwc", problem.device == "cuda",
                          pairs=op == "fprop" and pairs_problem(problem),
                          plane=problem.rank == 2, narrow=problem.out_size[-1] < 64,
                          roll=roll_problem(problem, op), wgrad=op == "wgrad")
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
        if direct_grouped(problem):  # after the GEMM tiles: timed, or pinned, never the
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
        from .common import serialized

        if not _interpreted():
            compiles.driver_ready()
        return serialized(bind(problem, config or cls.candidates(problem, op)[0], op))

    @classmethod
    def forward(cls, problem, config, input, weight, bias, *, scale, shift, residual, out):
        return cls.bind(problem, config)(input, weight, bias, scale, shift, residual, out)


def _pow2(value, lo: int, hi: int) -> bool:
    return type(value) is int and lo <= value <= hi and value & (value - 1) == 0


def _field_errors(config, rules: dict) -> list[str]:
    """``rules``: field -> (test, what is allowed)."""
    return [f"{name} = {getattr(config, name)!r}: allowed {allowed}"
            for name, (test, allowed) in rules.items() if not test(getattr(config, name))]


_SPLIT_MAX = {"fprop": 16, "wgrad": 128}  # the candidates' largest splits: 6 and 128
_BOOL = (lambda v: type(v) is bool, "True or False")
_WARPS = (lambda v: _pow2(v, 1, 16), "a power of two in [1, 16]")


def _tile_errors(problem: ConvProblem, config: TileConfig, op: str) -> list[str]:
    if direct_depthwise(problem):
        return ["a depthwise convolution runs direct tiles (DwConfig), not GEMM tiles"]
    split_max = 1 if config.rows or (op == "fprop" and problem.transposed) \
        else _SPLIT_MAX.get(op, 1)
    block_k_max = 256 if config.tap_rows is True and op == "wgrad" else 128  # pixels per step
    errors = _field_errors(config, {
        "block_m": (lambda v: _pow2(v, 16, 256), "a power of two in [16, 256]"),
        "block_n": (lambda v: _pow2(v, 16, 256), "a power of two in [16, 256]"),
        "block_k": (lambda v: _pow2(v, 16, block_k_max), f"a power of two in [16, {block_k_max}]"),
        "num_warps": _WARPS,
        "num_stages": (lambda v: type(v) is int and 1 <= v <= 8, "an int in [1, 8]"),
        "flat_k": _BOOL, "rows": _BOOL, "tap_rows": _BOOL,
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
    if problem.device == "cuda" and smem > SMEM_LIMIT:
        errors.append(f"the tile's pipeline needs {smem} bytes of shared memory "
                      f"(at most {SMEM_LIMIT})")
    if config.flat_k and (op != "fprop" or problem.transposed):
        errors.append("flat_k: only the forward of a non-transposed convolution")
    if config.tap_rows:
        run = tap_run(problem)
        fits = (op == "fprop" and config.flat_k and config.split_k == 1
                and config.block_k >= run) or \
            (op == "wgrad" and not config.flat_k and config.block_n >= run)
        if not (fits and tap_rows_fit(problem) and not config.rows
                and config.pack_groups == 1):
            errors.append(f"tap_rows: only the forward (a flat_k tile, block_k >= {run}, no "
                          f"split-K) or the weight gradient (block_n >= {run}) of a "
                          f"convolution with 2-15 channels per group and 16-64 kernel-row "
                          f"elements")
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
    if config.roll and not roll_problem(problem, op):
        errors.append("roll: only the forward of a channels-last depthwise convolution with "
                      "unit row dilation and at most 7 output rows per input row, its "
                      "data gradient at stride 1 with one output channel per input, and its "
                      "weight gradient at row stride 1 or 2 for kernels of at most 7 rows and 8 "
                      "columns")
    if config.roll and (config.pairs or config.plane):
        errors.append("roll: not with pairs or plane")
    if config.block_a * config.block_b > 8192:
        errors.append(f"a {config.block_a}x{config.block_b} tile: at most 8192 elements")
    if not (direct_depthwise(problem) or direct_grouped(problem)):
        errors.append("direct tiles run depthwise convolutions and groups of at most "
                      f"{DIRECT_GROUP_MAX} channels, not transposed, with kernel rows of "
                      f"at most {DIRECT_COLUMNS_MAX} taps")
    if config.plane and (problem.rank != 2 or problem.layout != "nchw"):
        errors.append("plane: only channels-first conv2d")
    if config.pairs and (op != "fprop" or problem.layout != "nchw"
                         or problem.dtype not in (torch.float16, torch.bfloat16)):
        errors.append("pairs: only the forward of a channels-first 16-bit convolution")
    return errors
