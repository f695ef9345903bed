"""Timing the candidates of a problem: in order of promise, within the tuning budget, each
on the call's own tensors (GPU and host time per call) and replayed from a CUDA graph over
operand copies larger than the L2 cache (graph time); the few cheapest host times measured
again, interleaved. Candidates that build in the background are timed as their builds
finish; those left building are timed later (``upgrades``)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import sys
import time
from typing import Any

import torch

from .. import backends
from ..context import timing_candidates
from ..costs import (  # (tests replace them here)
    time_costs,
    time_graph_cost,
    time_host_cost,
    time_probe,
)
from ..problem import ConvProblem
from . import budget, policy, priors, store


@dataclasses.dataclass
class Row:
    """One candidate as explain() shows it."""
    backend: str
    config: Any = None
    gpu_ms: float | None = None  # GPU time per call, back to back on the call's tensors
    host_ms: float | None = None  # host time per call
    note: str = ""  # refusal or failure reason; for a timed row, a remark (``time_row``)
    chosen: bool = False
    graph_ms: float | None = None  # GPU time per call from a CUDA graph on rotated operands
    # left untimed by the budget, its background build started: timed once built
    builds: list | None = dataclasses.field(default=None, repr=False, compare=False)
    # the choice of a problem met after the process's budget was spent, run untimed (timed
    # with the candidates left building once they are built)
    assumed: bool = False
    prior: str = ""  # why it was run first (``priors``), if it was
    once: bool = False  # timed by its first reading alone: it cannot win (``time_row``)

    def name(self) -> str:
        return self.backend + store.config_suffix(self.config)

    @property
    def timed(self) -> bool:
        return self.gpu_ms is not None

    def cost(self, graph: bool) -> float:
        """Graph-replayed GPU time (on operands that come from memory, not a warm L2 cache)
        where it was measured, plus the host time for an eager call."""
        gpu = self.graph_ms if self.graph_ms is not None else self.gpu_ms
        return gpu if graph else gpu + self.host_ms


def benchmark(problem: ConvProblem, names: list[str], run, op: str,
              key: str | None = None) -> list[Row]:
    """Every candidate's row (:func:`_time_candidates`); ``key``, the problem's cache key,
    finds the tuning database's nearest problem (``priors``)."""
    with timing_candidates():
        pri = priors.prior(problem, names, op, key) if key is not None else None
        return _time_candidates(problem, names, run, op, pri)


def _time_candidates(problem: ConvProblem, names: list[str], run, op: str,
                     pri: priors.Prior | None = None) -> list[Row]:
    """Every candidate's row, timed in order of promise (aten, the prior's backend with the
    prior first, the heuristic's pick, then the rest) until the tuning budget is spent
    (``budget.TUNING``); the rows left are marked, not timed. A strong prior is waited for
    (``PRIOR_WAIT_S``) and timed, past the budget too. A backend's candidates are listed only
    when its turn comes, inside the budget: listing cuDNN's plans builds graphs and queries
    its heuristics (seconds for some problems)."""
    tuning = budget.TUNING
    first = policy.rule(problem, names, op)
    lead = pri.backend if pri is not None else first
    order = sorted(names, key=lambda n: (n != "aten", n != lead, n != first))  # (stable)
    rows: list[Row] = []
    progress = _Progress(problem, op)
    start = clock()
    # past the process's budget nothing is timed now: aten runs (``Row.assumed``), and the
    # candidates building in the background are timed with it once built (timing it alone
    # chose nothing and cost a first call ~0.1-0.4 s per problem); a strong prior is timed
    # against aten at once
    strong = pri is not None and pri.strong
    starved = tuning.spent_s >= tuning.per_process_s and order[0] == "aten" and not strong

    def spent_all() -> bool:
        spent = clock() - start
        return (starved or any(r.timed for r in rows)) and (
            spent >= tuning.per_problem_s or tuning.spent_s + spent >= tuning.per_process_s)

    skipped = f"{BUDGET_NOTE} ({tuning.describe()})"
    for b, name in enumerate(order):
        cls = backends.REGISTRY[name]
        if spent_all() and not cls.BUILDS_AHEAD and not (starved and name == "aten"):
            rows.append(Row(name, note=f"{skipped}; candidates not listed"))
            continue
        try:
            configs = cls.candidates(problem, op)
        except Exception as exc:  # e.g. a cuDNN graph that does not build here
            rows.append(Row(name, None, None, f"no candidates: {short(exc)}"))
            continue
        pruned = []
        if tuning.candidates is not None:
            configs, pruned = cls.prune(problem, op, configs, tuning.candidates)
        if pri is not None and name == pri.backend:  # first, whatever the cost model says
            configs = [pri.config] + [c for c in configs if c != pri.config]
            pruned = [c for c in pruned if c != pri.config]
        ahead = _compile_ahead(cls, configs, run)
        for i, config in enumerate(configs):
            is_prior = pri is not None and name == pri.backend and i == 0
            if not spent_all():
                progress.show(name + store.config_suffix(config), len(configs) - i - 1,
                              order[b + 1:], clock() - start)
            if is_prior and pri.strong:
                built = _wait_prior(ahead[i])
            else:
                built = not spent_all() and _wait_built(ahead[i], start,
                                                        any(r.timed for r in rows))
            if not built:
                rows += [Row(name, c, note=skipped, builds=a)
                         for c, a in zip(configs[i:], ahead[i:])]
                if starved and name == "aten" and i == 0:
                    rows[-len(configs)].assumed = True
                    rows[-len(configs)].note += ("; runs untimed (timed beside the builds "
                                                 "once done)")
                break
            rows.append(Row(name, config, prior=pri.describe() if is_prior else ""))
            time_row(rows[-1], run, rows)
        rows += [Row(name, c, note=f"{PRUNED_NOTE} ({tuning.describe()})") for c in pruned]
    confirm_against_aten(rows, run)
    _refine_host(rows, run)
    tuning.spent_s += clock() - start
    progress.done()
    return rows


def _compile_ahead(cls, configs: list, run) -> list[list | None]:
    """Every configuration's background build started at once (None: builds inline)."""
    ahead = []
    for config in configs:
        try:
            ahead.append(cls.compile_ahead(lambda config=config: run(cls, config)))
        except Exception:  # timing it reports the failure
            ahead.append(None)
    return ahead


#: Seconds a budgeted timing waits for a candidate's background build once another
#: candidate was timed. A build not done by then is timed once it is (``upgrades.upgrade``).
#: On a cold Triton cache a tile compiles for seconds: waiting out the problem's whole
#: budget for it left the backends after it (cuDNN's plans) unlisted; with the short wait
#: they are timed in that budget instead (first calls unchanged, CUDA-graph time equal or
#: 1 % better).
BUILD_WAIT_S = 0.25


#: Seconds this process's calls spent waiting for background builds (``wait_builds``: a
#: budgeted timing's short wait, a strong prior's, a CUDA-graph capture's): the bench reads
#: it around a first call to say how much of it was waiting rather than timing.
WAITED = {"builds_s": 0.0}


def wait_builds(jobs: list, timeout: float | None = None) -> bool:
    """``concurrent.futures.wait`` for background builds, its time counted in ``WAITED``;
    True if every job finished."""
    start = time.perf_counter()
    try:
        return not concurrent.futures.wait(jobs, timeout=timeout).not_done
    finally:
        WAITED["builds_s"] += time.perf_counter() - start


def _wait_built(jobs: list | None, start: float, bounded: bool) -> bool:
    """Wait for a candidate's background build, within the problem's budget and
    ``BUILD_WAIT_S`` (exhaustive tuning: without limit) where ``bounded`` (some candidate
    was timed already); False if that ran out first."""
    if not jobs:
        return True
    if not bounded:
        return wait_builds(jobs)
    tuning = budget.TUNING
    left = min(tuning.per_problem_s - (clock() - start),
               tuning.per_process_s - tuning.spent_s - (clock() - start),
               float("inf") if tuning.exhaustive else BUILD_WAIT_S)
    return wait_builds(jobs, None if math.isinf(left) else max(0.0, left))


#: Seconds a strong prior's build is waited for (a Triton kernel compiles in 1-3 s on a cold
#: cache); one not built by then is timed once it is, as any other.
PRIOR_WAIT_S = 10.0


def _wait_prior(jobs: list | None) -> bool:
    return not jobs or wait_builds(jobs, PRIOR_WAIT_S)


#: A candidate whose first reading (``costs.time_probe``) is more than this many times the
#: best timed so far for its problem, in GPU time and in GPU + host time, is not timed in
#: full: it cannot win either ranking. Timing a slow candidate in full costs ~75 of its calls
#: (tv regnet_y_1_6gf at batch 256: candidates timed 10-40 s apart while a process upgraded
#: its choices, the model's steady state not reached in 530 s; H200, 2026-11-28).
SLOW_FACTOR = 3.0
#: ... and whose first reading is at least this many ms per call: a faster one is timed in
#: full in well under a second, and the few calls of a first reading are noisier
SLOW_MIN_MS = 0.5


def time_row(row: Row, run, rivals: list[Row] = ()) -> None:
    """``row``'s GPU and host time per call (``costs.time_costs``), then its graph time
    (:func:`time_graphed`); a candidate that fails leaves the reason in its note. Where
    ``rivals`` (the problem's rows) holds timed rows, a first reading comes first, and a
    candidate it shows cannot win (``SLOW_FACTOR``) keeps that reading, said in its note,
    and no graph time (the graph ranking leaves it out)."""
    cls = backends.REGISTRY[row.backend]

    def call():
        return run(cls, row.config)
    timed = [r for r in rivals if r.timed and r is not row]
    try:
        if timed:
            gpu, host = time_probe(call)
            best_gpu = min(r.gpu_ms for r in timed)
            best = min(r.gpu_ms + r.host_ms for r in timed)
            if gpu >= SLOW_MIN_MS and gpu > SLOW_FACTOR * best_gpu \
                    and gpu + host > SLOW_FACTOR * best:
                row.gpu_ms, row.host_ms, row.graph_ms, row.once = gpu, host, None, True
                row.note = (f"timed once: {gpu / best_gpu:.1f}x the best GPU time so far, "
                            f"cannot win")
                return
        row.gpu_ms, row.host_ms, row.once = *time_costs(call), False
    except torch.OutOfMemoryError as exc:
        torch.cuda.empty_cache()
        row.note = f"out of memory: {short(exc)}"
    except Exception as exc:  # cannot compile here, workspace over the cap, ...
        row.note = short(exc)
    else:
        time_graphed(row, run, cls, row.config)


def time_graphed(row: Row, run, cls, config) -> None:
    """``row.graph_ms`` where ``run`` can rotate over operand sets (``run(cls, config, k)``
    runs on set k of ``run.operand_sets.count``); a candidate that cannot be captured keeps
    its eager GPU time for the eager ranking, with the reason in its note, and is left out
    of the CUDA-graph ranking (``policy.best``)."""
    sets = getattr(run, "operand_sets", None)
    if sets is None:
        return
    try:
        row.graph_ms = time_graph_cost(lambda k: run(cls, config, k), sets.count, row.gpu_ms)
    except torch.OutOfMemoryError as exc:
        torch.cuda.empty_cache()
        row.note = f"graph timing: out of memory: {short(exc)}"
    except Exception as exc:
        row.note = f"graph timing: {short(exc)}"


clock = time.monotonic  # (tests replace it)
BUDGET_NOTE = "not timed: tuning budget spent"
PRUNED_NOTE = "not timed: pruned by the cost model"


def untimed(rows: list[Row]) -> bool:
    """Whether the budget left candidates untimed (the choice is then stored partial)."""
    return any(r.note.startswith((BUDGET_NOTE, PRUNED_NOTE)) for r in rows)


#: Seconds of tuning one problem after which a progress line appears on a terminal.
PROGRESS_AFTER_S = 2.0


class _Progress:
    """A progress line on stderr (a terminal only; ``FASTCONV_PROGRESS=0`` turns it off)
    once one problem's tuning has run ``PROGRESS_AFTER_S``: the problem, the candidate being
    timed, how many of its backend's are left and the backends still to come."""

    def __init__(self, problem: ConvProblem, op: str):
        self.what = f"{op} of {problem.describe()}"
        self.shown = False
        self.on = os.environ.get("FASTCONV_PROGRESS", "1").strip().lower() not in (
            "0", "off", "false", "no") and sys.stderr.isatty()

    def show(self, name: str, left: int, later: list[str], spent: float) -> None:
        if self.on and spent >= PROGRESS_AFTER_S:
            self.shown = True
            then = f", then {', '.join(later)}" if later else ""
            sys.stderr.write(f"\rfastconv: tuning {self.what}: {name} ({left} more of its "
                             f"backend{then}; {spent:.0f} s)\x1b[K")
            sys.stderr.flush()

    def done(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


def short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def confirm_against_aten(rows: list[Row], run) -> None:
    """Where a candidate's GPU time beats aten's (a CUDA graph would run it), that candidate
    and aten are timed once more, each keeping its least GPU, graph and host times. In a
    model's first training step on an H200 aten's timing of a layer now and then read 1.7x
    its time in other runs and alone (efficientnet_b0's weight gradient 480→112 at 14²:
    16.2 µs against 8.7-9.5), and a Triton tile slower than aten was chosen: in each of
    four runs one layer at 0.74-0.83x torch's choice (cause not found: not the operands'
    layout, not CPU load on the graph timing). A second timing of the two corrects a
    one-off reading (not one that lasts, such as a slower cuDNN algorithm found by torch's
    search); the cost is two timings where aten loses."""
    timed = [r for r in rows if r.timed]
    aten = next((r for r in timed if r.backend == "aten"), None)
    if aten is None:
        return
    best = min(timed, key=lambda r: r.cost(True))
    if best is aten:
        return
    for r in (aten, best):
        again = Row(r.backend, r.config)
        time_row(again, run)
        if not again.timed:
            continue
        r.gpu_ms = min(r.gpu_ms, again.gpu_ms)
        r.host_ms = min(r.host_ms, again.host_ms)
        if r.graph_ms is not None and again.graph_ms is not None:
            r.graph_ms = min(r.graph_ms, again.graph_ms)


def _refine_host(rows: list[Row], run, top: int = 4, rounds: int = 3) -> None:
    """The host times of the ``top`` candidates of least eager cost measured again,
    interleaved over ``rounds``; each keeps its least. A candidate's own timing runs in one
    stretch, and the first one timed for a problem (aten) measured up to 2-4x its host time
    when timed again later: interleaving compares them under the same conditions."""
    best = sorted((r for r in rows if r.timed and not r.once),
                  key=lambda r: r.cost(False))[:top]
    if len(best) < 2:
        return
    for _ in range(rounds):
        for r in best:
            cls = backends.REGISTRY[r.backend]
            try:
                host = time_host_cost(lambda cls=cls, config=r.config: run(cls, config),
                                      r.host_ms)
            except Exception:  # timed once already; keep that
                continue
            r.host_ms = min(r.host_ms, host)
