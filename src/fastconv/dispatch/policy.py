"""The rules of choosing that need no timing: which backends may run a problem, the
heuristic's pick, the mode by default, and the best of timed candidates."""

from __future__ import annotations

import torch

from .. import backends
from ..context import current
from ..errors import NotSupported
from ..problem import ConvProblem
from .store import Choice


def default_mode(problem: ConvProblem) -> str:
    """The mode of the settings or environment, else benchmark on a GPU, heuristic on the
    CPU."""
    mode = current()[0]
    return mode or ("benchmark" if problem.device == "cuda" else "heuristic")


def supported(problem: ConvProblem, deterministic: bool = False) -> dict[str, list[str]]:
    """Every registered backend's reasons for refusing ``problem`` (empty list = supported)."""
    out = {}
    for name, cls in backends.REGISTRY.items():
        reasons = cls.not_supported_reasons(problem)
        if deterministic and not reasons:
            reasons = cls.nondeterminism_reasons(problem)
        out[name] = reasons
    return out


def backend_names(problem: ConvProblem, backend: str, det: bool) -> list[str]:
    """The backends that may run ``problem`` (``backend`` itself, or every supporting one
    for "auto"); NotSupported with every reason when none may."""
    if backend != "auto":
        cls = backends.get(backend)
        reasons = cls.not_supported_reasons(problem)
        if det and not reasons:
            reasons = cls.nondeterminism_reasons(problem)
        if reasons:
            raise NotSupported(backend, reasons)
        return [backend]
    refusals = supported(problem, det)
    names = [n for n, r in refusals.items() if not r]
    if not names:
        detail = "; ".join(f"{n}: {', '.join(r)}" for n, r in refusals.items())
        raise NotSupported("auto", [f"no backend can run {problem.describe()}: {detail}"])
    return names


def rule(problem: ConvProblem, names: list[str], op: str) -> str:
    """Heuristic backend pick: aten on the CPU (the interpreter is for tests), else Triton
    when it can fuse an epilogue that torch would run as separate kernels."""
    if len(names) == 1:
        return names[0]
    if op == "fprop" and problem.device == "cuda" and "triton" in names \
            and not problem.epilogue.is_identity and not problem.depthwise:
        return "triton"
    return "aten" if "aten" in names else names[0]


#: A CUDA graph's ranking takes a candidate over aten only where its GPU time on the call's
#: own operands (back to back: what stays in the L2 cache stays) is at most this fraction
#: above aten's, whatever its graph time on rotated operands says (``best``).
WARM_TOLERANCE = 0.02


def best(rows: list, graph: bool) -> Choice:
    """The timed row of least cost: GPU time for a CUDA graph, GPU + host time eagerly. A
    CUDA graph takes only a candidate that was captured where any was: one whose capture
    failed could fail the user's capture too, and its eager GPU time (operands warm in L2)
    is no measure against the others' graph times.

    In a CUDA graph a layer's input was often just written by the layer before it, so it
    may be read from the L2 cache, or not: the graph time (operands rotated past the L2)
    and the GPU time on the call's own operands bound the two cases, and a candidate must
    not lose to aten, torch's own choice, in either (``WARM_TOLERANCE``). The layer check
    on an H100 (results/dispatch/2026-12-07-h100-layers) found Triton tiles chosen by graph
    time that lost on the same operands: efficientnet_b0's 1x1 240→40 at 28² (1.067x aten
    rotated, 0.947x same), its training dgrad of 32→16 at 112² (0.936x and 0.845x)."""
    timed = [r for r in rows if r.timed]
    if not timed:  # a problem past the process's budget: its first candidate, untimed
        first = next(r for r in rows if r.assumed)
        return Choice(first.backend, first.config)
    if graph:
        timed = [r for r in timed if r.graph_ms is not None] or timed
        losers = {id(r) for r in warm_losers(timed)}
        timed = [r for r in timed if id(r) not in losers]
    top = min(timed, key=lambda r: r.cost(graph))
    return Choice(top.backend, top.config, top.cost(graph), top.gpu_ms, top.host_ms,
                  top.graph_ms)


def warm_losers(rows: list) -> list:
    """The timed rows other than aten's whose GPU time on the call's own operands is more
    than ``WARM_TOLERANCE`` above aten's best (none without a timed aten row)."""
    warm = min((r.gpu_ms for r in rows if r.timed and r.backend == "aten"), default=None)
    if warm is None:
        return []
    return [r for r in rows if r.timed and r.backend != "aten"
            and r.gpu_ms > warm * (1 + WARM_TOLERANCE)]


def capturing() -> bool:
    """Inside a CUDA-graph capture nothing may be timed (or synchronised)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
