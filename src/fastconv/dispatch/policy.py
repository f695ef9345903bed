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


def best(rows: list, graph: bool) -> Choice:
    """The timed row of least cost: GPU time for a CUDA graph, GPU + host time eagerly. A
    CUDA graph takes only a candidate that was captured where any was: one whose capture
    failed could fail the user's capture too, and its eager GPU time (operands warm in L2)
    is no measure against the others' graph times."""
    timed = [r for r in rows if r.timed]
    if not timed:  # a problem past the process's budget: its first candidate, untimed
        first = next(r for r in rows if r.assumed)
        return Choice(first.backend, first.config)
    if graph:
        timed = [r for r in timed if r.graph_ms is not None] or timed
    top = min(timed, key=lambda r: r.cost(graph))
    return Choice(top.backend, top.config, top.cost(graph), top.gpu_ms, top.host_ms,
                  top.graph_ms)


def capturing() -> bool:
    """Inside a CUDA-graph capture nothing may be timed (or synchronised)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
