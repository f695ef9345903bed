"""``explain``: every backend and candidate of a problem, with its refusal or its time, and
the choice; changes no cache."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .. import backends
from ..context import current
from ..problem import ConvProblem
from . import choices, policy, store, timing, upgrades
from .store import Choice
from .timing import Row


@dataclasses.dataclass
class Explanation:
    """What :func:`explain` found; prints as a table."""
    problem: ConvProblem
    mode: str
    op: str
    rows: list[Row]
    choice: Choice
    graph: bool = False  # ranked by GPU time (a CUDA graph) instead of GPU + host time
    # the choice calls get now is a stand-in: candidates are still building (``upgrades``)
    provisional: bool = False

    def __str__(self) -> str:
        ranked = "GPU time (CUDA graph)" if self.graph else "GPU + host time (eager)"
        pending = " (provisional: candidates still building; timed once built)" \
            if self.provisional else ""
        lines = [f"{self.op} of {self.problem.describe()}",
                 f"mode {self.mode}; ranked by {ranked}; choice: {self.choice.name()}"
                 + pending]
        width = max(len(r.name()) for r in self.rows)
        for r in self.rows:
            mark = "*" if r.chosen else " "
            graphed = "" if r.graph_ms is None else f"  graph {r.graph_ms * 1000:8.1f} us"
            what = (f"gpu {r.gpu_ms * 1000:8.1f} us  host {r.host_ms * 1000:8.1f} us{graphed}"
                    + (f"  ({r.note})" if r.note else "") if r.timed else (r.note or "not timed"))
            what += f"  [{r.prior}]" if r.prior else ""
            lines.append(f" {mark} {r.name():<{width}}  {what}")
        return "\n".join(lines)


def explain(problem: ConvProblem, backend: str = "auto", *, mode: str | None = None,
            op: str = "fprop", run: Callable | None = None) -> Explanation:
    """Every backend and candidate for ``problem``: why it cannot run, or its time (when
    ``mode`` is benchmark and ``run`` executes a candidate), and the choice. Does not
    change the cache."""
    mode = mode or policy.default_mode(problem)
    _, det, graph = current()
    refusals = policy.supported(problem, det) if backend == "auto" else \
        {backend: backends.get(backend).not_supported_reasons(problem)}
    names = [n for n, r in refusals.items() if not r]
    rows: list[Row] = []
    key = store.cache_key(problem, backend, mode, op, det, store.cost_name(graph, False))
    if mode == "benchmark" and run is not None and problem.device == "cuda" and names:
        rows = timing.benchmark(problem, names, run, op, key)
    else:
        for n in names:
            try:
                rows += [Row(n, c, note="not timed") for c in
                         backends.REGISTRY[n].candidates(problem, op)]
            except Exception as exc:
                rows.append(Row(n, note=f"no candidates: {timing.short(exc)}"))
    rows += [Row(n, note="; ".join(r)) for n, r in refusals.items() if r]
    hit = store.CACHE.get(key)
    choice = store.decode(hit, problem, op, names) if hit is not None else None
    if choice is None:
        if any(r.timed for r in rows):
            choice = policy.best(rows, graph)
        elif names:
            choice, _ = choices.decide(problem, backend,
                                       mode if mode != "benchmark" else "heuristic", op, det,
                                       None)
        else:
            choice = Choice("none", None)
    for r in rows:
        r.chosen = r.backend == choice.backend and r.config == choice.config
    if graph:
        graphed = [r for r in rows if r.timed and r.graph_ms is not None]
        for r in policy.warm_losers(graphed or rows):
            r.note = "; ".join(filter(None, (r.note, "slower than aten on warm operands: "
                                             "not taken for a CUDA graph")))
    return Explanation(problem, mode, op, rows, choice, graph,
                       provisional=key in upgrades.UPGRADES)
