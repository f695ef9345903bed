"""The backend interface: capabilities as data, refusals as readable reasons."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import plancache
from ..problem import ConvProblem


class Backend:
    """One way to run a convolution.

    Subclasses fill in the capability attributes and implement ``forward``. Every refusal is
    a sentence in ``not_supported_reasons``; dispatch and error messages show them as they are.
    """

    NAME: str = ""
    SUPPORTED_DTYPES: frozenset[torch.dtype] = frozenset()
    SUPPORTED_RANKS: frozenset[int] = frozenset({1, 2})
    SUPPORTED_DEVICES: frozenset[str] = frozenset({"cpu", "cuda"})
    SUPPORTS_GROUPS: bool = True
    SUPPORTS_DILATION: bool = True
    SUPPORTS_TRANSPOSED: bool = False
    MIN_CAPABILITY: tuple[int, int] = (0, 0)
    IS_DETERMINISTIC: bool = True
    TAKES_BIAS: bool = False

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """(usable at all in this process, why not)."""
        return True, ""

    @classmethod
    def not_supported_reasons(cls, problem: ConvProblem) -> list[str]:
        """Every reason this backend cannot run ``problem``; empty when it can."""
        reasons = []
        ok, why = cls.available()
        if not ok:
            reasons.append(f"{cls.NAME} is unavailable: {why}")
        if problem.dtype not in cls.SUPPORTED_DTYPES:
            reasons.append(f"dtype {problem.dtype} not supported (supported: "
                           f"{', '.join(sorted(map(str, cls.SUPPORTED_DTYPES)))})")
        if problem.rank not in cls.SUPPORTED_RANKS:
            reasons.append(f"rank {problem.rank} not supported")
        if problem.device not in cls.SUPPORTED_DEVICES:
            reasons.append(f"device {problem.device!r} not supported")
        if problem.groups > 1 and not cls.SUPPORTS_GROUPS:
            reasons.append("groups > 1 not supported")
        if any(d != 1 for d in problem.dilation) and not cls.SUPPORTS_DILATION:
            reasons.append("dilation > 1 not supported")
        if problem.transposed and not cls.SUPPORTS_TRANSPOSED:
            reasons.append("transposed convolution not supported")
        if problem.device == "cuda" and cls.MIN_CAPABILITY > (0, 0) and torch.cuda.is_available():
            cap = torch.cuda.get_device_capability()
            if cap < cls.MIN_CAPABILITY:
                reasons.append(f"needs compute capability >= {cls.MIN_CAPABILITY}, GPU has {cap}")
        return reasons

    @classmethod
    def nondeterminism_reasons(cls, problem: ConvProblem) -> list[str]:
        """Why two runs of ``problem`` might not give the same bits (empty: they do)."""
        return [] if cls.IS_DETERMINISTIC else [f"{cls.NAME} is not deterministic"]

    @classmethod
    def encode_config(cls, config: Any) -> Any:
        """``config`` as JSON, for the on-disk plan cache."""
        return plancache.encode(config)

    @classmethod
    def decode_config(cls, data: Any) -> Any:
        """The configuration ``encode_config`` stored (raise if it is not one of ours)."""
        return data

    @classmethod
    def config_errors(cls, problem: ConvProblem, config: Any, op: str = "fprop") -> list[str]:
        """Why ``config`` cannot run ``op`` of ``problem`` (empty: it can). Configurations
        read from a plan-cache file or given to ``dispatch.pin`` are untrusted input: dispatch
        runs none that this refuses. By default only the backend's own candidates pass."""
        if config in cls.candidates(problem, op):
            return []
        return [f"{config!r} is not one of {cls.NAME}'s configurations for this {op}"]

    @classmethod
    def candidates(cls, problem: ConvProblem, op: str = "fprop") -> list[Any]:
        """The configurations worth trying for ``op`` of ``problem`` (first = the
        heuristic's pick)."""
        return [None]

    @classmethod
    def prune(cls, problem: ConvProblem, op: str, configs: list,
              keep: int) -> tuple[list, list]:
        """``(kept, pruned)``: the candidates worth compiling and timing, most promising
        first, at most ``keep`` of those a cost model can rank (dispatch's tuning budget),
        and the ones it left out. Without a model: every candidate kept, in its order."""
        return configs, []

    #: Whether ``compile_ahead`` builds in the background (cheap to start): dispatch then
    #: starts a problem's builds even after the tuning budget is spent, to time them once
    #: built (``dispatch`` module docstring).
    BUILDS_AHEAD = False

    @classmethod
    def compile_ahead(cls, run: Callable[[], object]) -> list | None:
        """Start building, in the background, what ``run()`` (one call of a configuration)
        would build on its first call; returns the futures of that work (empty: nothing
        left to build), or None where this backend builds nothing ahead (the default).
        ``run()`` is called, and its results are not meaningful."""
        return None

    @classmethod
    def bind(cls, problem: ConvProblem, config: Any,
             op: str = "fprop") -> Callable[..., torch.Tensor]:
        """A callable for this problem, operation and configuration. The functional API
        caches it per call signature, so a backend can precompute launch parameters here.

        * ``op="fprop"``: ``(input, weight, bias, scale, shift, residual, out) -> output``,
          the problem's own computation (a transposed convolution if ``problem.transposed``);
        * ``op="dgrad"``: ``(grad_out, weight, out) -> grad_input`` and
        * ``op="wgrad"``: ``(grad_out, input, out) -> grad_weight`` of a non-transposed
          ``problem``, without epilogue. ``out=None`` allocates.
        """
        if op != "fprop":
            raise NotImplementedError(f"{cls.NAME} has no {op}")

        def run(input, weight, bias, scale, shift, residual, out):
            return cls.forward(problem, config, input, weight, bias, scale=scale, shift=shift,
                               residual=residual, out=out)
        return run

    @classmethod
    def forward(cls, problem: ConvProblem, config: Any, input: torch.Tensor,
                weight: torch.Tensor, bias: torch.Tensor | None, *,
                scale: torch.Tensor | None, shift: torch.Tensor | None,
                residual: torch.Tensor | None, out: torch.Tensor | None) -> torch.Tensor:
        """Compute the convolution with its epilogue and return it (in ``out`` if given).

        ``bias`` is passed only to backends whose ``TAKES_BIAS`` is true; the others get it
        as ``shift`` (folded with ``scale``/``shift`` when those are given too).
        """
        raise NotImplementedError
