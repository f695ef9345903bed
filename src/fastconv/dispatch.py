"""Choosing a backend and a configuration for a problem.

Modes:

* ``heuristic`` — no timing: rules pick the backend, the backend's first candidate is the
  configuration. The default on the CPU.
* ``benchmark`` — the first time a problem key is seen, every supported backend's candidates
  (aten, each Triton tile, each cuDNN plan) are timed on the call's own tensors: its host
  time per call and its GPU time (``time_costs``, back to back), then its GPU time replayed
  from a CUDA graph that rotates over copies of the operands larger than the L2 cache
  together (``time_graph_cost``; back-to-back calls on one input flatter a tile that
  re-reads it from L2). The GPU cost is the graph time where it was measured. The host times
  of the few cheapest are then measured again, interleaved (``_refine_host``). Eager calls
  take the candidate with the least GPU + host cost (a candidate whose GPU gain is smaller
  than its extra host cost loses: in eager mode the host's work is on the critical path
  whenever the GPU waits for it); calls made for a CUDA graph (``settings(graph=True)``,
  which ``optimize(cuda_graph=True)`` and the bench's graph timings set) take the least GPU
  cost, as replays cost no host time. Both choices are stored from one timing. The default
  on the GPU. aten is always a candidate, so this mode is not slower than PyTorch except for
  timing noise. A candidate that fails to build, needs more workspace than the cap or runs
  out of memory is skipped and its reason recorded. Candidates are timed in order of promise
  (aten, which needs no compilation, then the heuristic's pick, then the rest) within a
  tuning budget (``tuning_budget(per_problem_s, per_process_s, candidates)`` or
  ``FASTCONV_TUNE_BUDGET``; default ``DEFAULT_BUDGET``: a first call never waits minutes for
  exhaustive tuning; ``"exhaustive"`` times every candidate). The budget's ``candidates``
  bounds how many of a backend's candidates are compiled and timed at all: those its cost
  model expects fastest (``Backend.prune``), in that order; the rest are never built. A
  choice the per-problem budget or the pruning cut short is stored on disk marked partial (a
  later process uses it; exhaustive tuning redoes it); one made after the per-process budget
  was spent (nothing timed: aten runs, on cuDNN's heuristic plan for a forward while
  candidates build, and is timed with its searched plan beside them once they are built)
  stays in memory, so a later process tunes it with its own budget. Tuning one problem for
  more than ``PROGRESS_AFTER_S`` shows a progress line on a terminal
  (``FASTCONV_PROGRESS=0``: none). Triton candidates are compiled ahead, all of a problem's
  at once, by worker processes
  (``Backend.compile_ahead``; ``FASTCONV_COMPILE_WORKERS``), and timed as their compiles
  finish. Those the budget leaves untimed keep building (a backend that builds in the
  background, ``BUILDS_AHEAD``, starts its builds even when the budget was spent before its
  turn): until they are built the best candidate timed runs, as a provisional choice; the
  first call after they are all built times them (milliseconds) and stores the final choice,
  on disk too. So a process without a tuning-database entry reaches the tuned choice (among
  the candidates kept) within seconds to minutes of background compilation, not at once.
* ``pinned`` — what ``pin()`` fixed for a problem; nothing is timed (problems never pinned
  take the heuristic's choice).

The mode comes from, in order: ``dispatch=`` of a call, the innermost ``settings(...)``
context (this thread's; the backward of a fastconv call takes its forward's settings, though
a CUDA backward runs on torch's autograd device threads), ``FASTCONV_DISPATCH``, the
default above. ``deterministic=True`` (or ``FASTCONV_DETERMINISTIC=1``) keeps only
candidates that give bitwise-repeatable results.

Choices live in ``plancache.PlanCache`` (memory LRU; benchmark choices and pins also on disk,
so a new process skips the timing). Thread-safe: concurrent first calls of one key time it
once and share one entry.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from . import backends, plancache
from .backends import aten
from .context import (  # noqa: F401 (the settings' public names, re-exported)
    MODES,
    Settings,
    captured,
    current,
    reload_environment,
    restored,
    settings,
    timing,
    timing_candidates,
)
from .costs import time_costs, time_graph_cost, time_host_cost  # (tests replace them here)
from .errors import ConvError, NotSupported
from .problem import ConvProblem

OPS = ("fprop", "dgrad", "wgrad")


@dataclasses.dataclass(frozen=True)
class Choice:
    backend: str
    config: Any
    ms: float | None = None  # the cost it was chosen by (benchmark mode), milliseconds
    gpu_ms: float | None = None  # its GPU time per call
    host_ms: float | None = None  # its host time per call
    graph_ms: float | None = None  # its GPU time per call replayed from a CUDA graph
    # a stand-in while candidates compile in the background (aten for a stored choice, the
    # best timed for a problem whose budget-cut timing left builds running): a caller may
    # keep it only while ``until()`` is False and asks again once it is True (no ``until``:
    # at the next call)
    provisional: bool = False
    until: Callable[[], bool] | None = dataclasses.field(default=None, compare=False,
                                                         repr=False)

    def name(self) -> str:
        return self.backend + _config_suffix(self.config)


def _config_suffix(config) -> str:
    if config is None:
        return ""
    cfg = getattr(config, "name", None)
    return f":{cfg()}" if callable(cfg) else f":{config}"


def default_mode(problem: ConvProblem) -> str:
    mode = current()[0]
    return mode or ("benchmark" if problem.device == "cuda" else "heuristic")


# --------------------------------------------------------------------------------- cache
CACHE = plancache.PlanCache(database=True)
_KEY_LOCKS: dict[str, threading.Lock] = {}
_KEY_LOCKS_GUARD = threading.Lock()


def _cache_key(problem: ConvProblem, backend: str, mode: str, op: str, det: bool,
               cost: str = "") -> str:
    key = f"{problem.key()}|{op}|{backend}|{mode}|{'det' if det else 'any'}"
    return f"{key}|{cost}" if mode == "benchmark" else key


def _cost(graph: bool, grad: bool) -> str:
    """What benchmark mode ranks by: GPU time for a CUDA graph, GPU + host time eagerly;
    ``+grad``: a forward whose backward follows (timed with it)."""
    return ("graph" if graph else "eager") + ("+grad" if grad else "")


def _decode(entry: Any, problem: ConvProblem, op: str, names: list[str] | None = None,
            key: str | None = None) -> Choice | None:
    """A stored entry as a Choice for ``problem``, or None. Entries come from a file anyone
    may have written: the backend must be one of ``names`` (available and supporting the
    problem; by default every backend that does) and its configuration must pass the
    backend's ``config_errors``. With ``key`` a refused entry is dropped from the memory
    cache with a warning (the caller decides again)."""
    try:
        name = entry["backend"]
        if names is None:
            names = [n for n, r in supported(problem).items() if not r]
        if name not in names:
            raise ValueError(f"backend {name!r} cannot run it here")
        cls = backends.REGISTRY[name]
        config = cls.decode_config(entry.get("config"))
        errors = cls.config_errors(problem, config, op)
        if errors:
            raise ValueError("; ".join(errors))
        return Choice(name, config, *(_float(entry.get(k))
                                      for k in ("ms", "gpu_ms", "host_ms", "graph_ms")))
    except Exception as exc:
        if key is not None:
            CACHE.discard(key)
            warnings.warn(f"fastconv: ignoring the stored plan for {problem.describe()} "
                          f"({op}): {type(exc).__name__}: {exc}; deciding again",
                          RuntimeWarning, stacklevel=4)
        return None


def _float(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _entry(choice: Choice, partial: bool = False) -> dict:
    cls = backends.REGISTRY[choice.backend]
    entry = {"backend": choice.backend, "config": cls.encode_config(choice.config),
             "ms": choice.ms, "gpu_ms": choice.gpu_ms, "host_ms": choice.host_ms,
             "graph_ms": choice.graph_ms}
    if partial:  # some candidates left untimed by the tuning budget
        entry["partial"] = True
    return entry


def pin(problem: ConvProblem, backend: str, config: Any = None, *, op: str = "fprop") -> None:
    """Fix the backend (and configuration; None = its first candidate) that ``pinned``
    mode uses for ``problem``. Checked now: a backend that cannot run it raises
    NotSupported. Stored on disk with the benchmark choices. Pin before a process first
    calls the problem, or call ``fastconv.functional.clear_plans()`` after: calls reuse the
    plan bound at their first sight."""
    cls = backends.get(backend)
    reasons = cls.not_supported_reasons(problem)
    if reasons:
        raise NotSupported(backend, reasons)
    if config is None:
        config = cls.candidates(problem, op)[0]
    errors = cls.config_errors(problem, config, op)
    if errors:
        raise ConvError(f"config: got {config!r} for backend {backend!r}: "
                        + "; ".join(errors))
    det = current()[1]
    choice = Choice(backend, config)
    CACHE.put(_cache_key(problem, "auto", "pinned", op, det), _entry(choice), persist=True)


# ------------------------------------------------------------------------------- choosing
def supported(problem: ConvProblem, deterministic: bool = False) -> dict[str, list[str]]:
    """Every registered backend's reasons for refusing ``problem`` (empty list = supported)."""
    out = {}
    for name, cls in backends.REGISTRY.items():
        reasons = cls.not_supported_reasons(problem)
        if deterministic and not reasons:
            reasons = cls.nondeterminism_reasons(problem)
        out[name] = reasons
    return out


def _names(problem: ConvProblem, backend: str, det: bool) -> list[str]:
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


def choose(problem: ConvProblem, backend: str = "auto", *,
           run: Callable[[type[backends.Backend], Any], None] | None = None,
           mode: str | None = None, op: str = "fprop", grad: bool = False) -> Choice:
    """The backend and configuration to run ``op`` of ``problem`` with.

    ``run(backend_cls, config)`` executes one candidate on the call's tensors; benchmark mode
    needs it and falls back to the heuristic without it. ``op`` is one of ``OPS``: the
    problem's own computation or the data / weight gradient of a (non-transposed) problem.
    ``grad``: the forward of a call whose backward follows (``run`` runs both), a choice of
    its own. In benchmark mode the eager and the CUDA-graph choice (see the module
    docstring) are both stored; the current settings say which one is returned.
    """
    mode = mode or default_mode(problem)
    if mode not in MODES:
        raise ConvError(f"mode: got {mode!r}; allowed: {', '.join(MODES)}")
    # (a capture made without settings(graph=True) finds the choice its eager warm-up stored)
    _, det, graph = current()
    key = _cache_key(problem, backend, mode, op, det, _cost(graph, grad))
    if key in _UPGRADES:
        return _upgrade(key, graph, run)
    hit = CACHE.get(key)
    if _usable(hit) and "source" not in hit:
        choice = _decode(hit, problem, op, _names(problem, backend, det), key)
        if choice is not None:
            return choice
    with _key_lock(key):
        hit = CACHE.get(key)  # another thread may have decided while we waited
        names = _names(problem, backend, det)
        if _usable(hit) and "source" in hit and _missing_here(hit):
            CACHE.discard(key)
            hit = None
        choice = _decode(hit, problem, op, names, key) if _usable(hit) else None
        if choice is not None and "source" in hit:
            choice = _adopt(choice, hit, key, problem, mode, op, run, names)
        if choice is None:
            starved = TUNING.spent_s >= TUNING.per_process_s  # before this problem's timing
            choice, rows = _decide(problem, backend, mode, op, det, run)
            if rows is None:
                CACHE.put(key, _entry(choice), persist=False)
            else:  # one timing, both rankings stored (see the module docstring)
                untimed = _untimed(rows)
                keys = [_cache_key(problem, backend, mode, op, det, _cost(g, grad))
                        for g in (False, True)]
                for g in (False, True):
                    best = _best(rows, g)
                    CACHE.put(keys[g], _entry(best, partial=untimed),
                              persist=not (untimed and starved))
                    if g == graph:
                        choice = best
                if any(r.builds for r in rows):  # timed later, once built (_upgrade)
                    upgrade = _Upgrade(rows, keys, op)
                    for k in keys:
                        _UPGRADES[k] = upgrade
                    choice = upgrade.stand_in(graph)
    return choice


@dataclasses.dataclass
class _Upgrade:
    """A problem's timed rows whose untimed candidates are building in the background
    (``Row.builds``), and the cache keys of its two rankings."""
    rows: list
    keys: list
    op: str
    done: bool = False

    def built(self) -> bool:
        """Whether every build has finished (a provisional plan's ``until``: cheap once
        true)."""
        if not self.done:
            self.done = all(j.done() for r in self.rows if r.builds for j in r.builds)
        return self.done

    def stand_in(self, graph: bool) -> Choice:
        """The provisional choice while the builds run: the best timed row. A problem met
        after the process's budget was spent has none: aten, untimed, which for a forward
        runs cuDNN's heuristic plan (``aten.PROVISIONAL``, as a database choice still
        compiling does). cudnn.benchmark's search would cost each new shape tens to hundreds
        of milliseconds for a plan used only until the builds are done (~4 s of
        efficientnet_b0's first call without a database: benchmarks/NOTES.md, "Session
        17"); the upgrade times aten with the search, beside the built candidates."""
        best = _best(self.rows, graph)
        if self.op == "fprop" and best.backend == "aten" and best.config is None \
                and not any(r.timed for r in self.rows):
            best = dataclasses.replace(best, config=aten.PROVISIONAL)
        return dataclasses.replace(best, provisional=True, until=self.built)


#: cache key -> the problem's pending upgrade (both rankings' keys share one)
_UPGRADES: dict[str, _Upgrade] = {}


def _upgrade(key: str, graph: bool, run) -> Choice:
    """The choice for a problem whose budget-cut timing left candidates building: while any
    build runs (or nothing can be timed now: no ``run``, a CUDA-graph capture), the best
    timed so far, provisional (plans keep it until its builds are done, then come back
    here); once all are built, those candidates are timed (milliseconds: their kernels are
    in the cache), with those timed before, the two rankings stored again (on disk), and
    the best returned for good."""
    up = _UPGRADES[key]
    waiting = [r for r in up.rows if r.builds]
    if run is None or _capturing() or not up.built():
        return up.stand_in(graph)
    with _key_lock(key):
        if _UPGRADES.get(key) is up:
            # the candidates timed at the first call are timed again beside the new ones, in
            # the same conditions (the first call's were taken amid the process's start-up)
            for r in [r for r in up.rows if r.timed or r.assumed] + waiting:
                failed = next((j.exception() for j in r.builds or () if j.exception()), None)
                r.builds, r.note = None, ""
                if failed is not None:  # timing it would compile it here: seconds
                    r.note = f"background build failed: {_short(failed)}"
                    continue
                cls = backends.REGISTRY[r.backend]
                try:
                    r.gpu_ms, r.host_ms = time_costs(
                        lambda cls=cls, config=r.config: run(cls, config))
                except torch.OutOfMemoryError as exc:
                    torch.cuda.empty_cache()
                    r.note = f"out of memory: {_short(exc)}"
                except Exception as exc:
                    r.note = _short(exc)
                else:
                    _time_graphed(r, run, cls, r.config)
            # stored on disk even where backends that build nothing ahead were not listed
            # (a starved problem's): every candidate that builds ahead has been timed
            untimed = _untimed(up.rows)
            for g, k in zip((False, True), up.keys):
                CACHE.put(k, _entry(_best(up.rows, g), partial=untimed), persist=True)
                _UPGRADES.pop(k, None)
    return _best(up.rows, graph)


def _usable(hit: dict | None) -> bool:
    """Whether a stored entry answers now: exhaustive tuning times a problem tuned within a
    budget (or taken from the tuning database) again."""
    return hit is not None and not (TUNING.exhaustive and hit.get("partial"))


def _adopt(choice: Choice, hit: dict, key: str, problem: ConvProblem, mode: str, op: str,
           run, names: list[str]) -> Choice | None:
    """A tuning-database choice, first used: run once now (a cuDNN plan builds: seconds for
    some) and charged to the tuning budget, so that a first call stays bounded. A Triton
    choice's kernels are compiled by background workers first (``compile_ahead``): until
    they are, aten runs the call (a provisional choice, not stored). None once the process's
    budget is spent and it needs more than aten (the caller decides as for a new problem),
    or where it fails to run."""
    if mode == "benchmark" and run is not None and problem.device == "cuda" \
            and not _capturing():
        if choice.backend != "aten" and TUNING.spent_s >= TUNING.per_process_s:
            return None
        cls = backends.REGISTRY[choice.backend]
        start = _clock()
        try:
            if "aten" in names and not _built(key, cls, lambda: run(cls, choice.config)):
                jobs = _AHEAD[key]
                # (cuDNN's heuristic plan: a benchmark search would cost more than the
                # seconds this plan runs for)
                return Choice("aten", aten.PROVISIONAL if op == "fprop" else None,
                              provisional=True, until=lambda: all(j.done() for j in jobs))
            run(cls, choice.config)
        except Exception:
            return None
        finally:
            TUNING.spent_s += _clock() - start
    CACHE.put(key, {k: v for k, v in hit.items() if k != "source"}, persist=False)
    return choice


def _missing_here(hit: dict) -> bool:
    """Whether a tuning-database entry names a backend that this process cannot use at all
    (``Backend.available``: e.g. the cuDNN frontend, an optional extra, not installed). The
    database was measured with every backend; such a problem is decided as a new one, with
    one warning per backend rather than one per problem."""
    name = hit.get("backend")
    cls = backends.REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        return False  # (``_decode`` reports it)
    ok, why = cls.available()
    if not ok and cls.NAME not in _WARNED_MISSING:
        _WARNED_MISSING.add(cls.NAME)
        warnings.warn(f"fastconv: the tuning database's choices for backend {cls.NAME!r} are "
                      f"not used here ({why}): those problems are tuned as new ones",
                      RuntimeWarning, stacklevel=4)
    return not ok


#: backends whose database choices were skipped with a warning (``_missing_here``)
_WARNED_MISSING: set[str] = set()


#: cache key -> the futures of the background builds its stored choice needs
_AHEAD: dict[str, list] = {}


def _built(key: str, cls, run: Callable[[], object]) -> bool:
    """Whether what ``run`` needs is built (or builds inline: no background build, or one
    that failed, which ``run`` then reports); starts the build on first sight."""
    jobs = _AHEAD.get(key)
    if jobs is None:
        jobs = cls.compile_ahead(run)
        if jobs is None:
            return True
        _AHEAD[key] = jobs
    return all(j.done() for j in jobs)


def finish_builds(timeout: float | None = None, *, upgrades: bool = False) -> bool:
    """Wait for the background builds that stored choices wait on (a CUDA-graph capture
    calls this first: a choice still provisional would be captured as aten for good);
    with ``upgrades``, also for the candidates a budget-cut timing left building (a
    process without a database entry compiles them for tens of seconds after its first
    call; the choices they upgrade are timed at the next call of each problem, so a
    steady state is measured after this). False if ``timeout`` seconds passed first."""
    jobs = [j for js in list(_AHEAD.values()) for j in js if not j.done()]
    if upgrades:
        jobs += [j for up in list(_UPGRADES.values()) for r in up.rows if r.builds
                 for j in r.builds if not j.done()]
    return not concurrent.futures.wait(jobs, timeout=timeout).not_done


def building() -> bool:
    """Whether any background build that a choice waits on still runs: a stored choice's,
    or a candidate a budget-cut timing left building (its problem's choice is upgraded at
    the problem's next call once all are built). A CUDA graph captured while this holds
    ran those problems' provisional choices."""
    return any(not j.done() for js in list(_AHEAD.values()) for j in js) \
        or any(not up.built() for up in list(_UPGRADES.values()))


def _key_lock(key: str) -> threading.Lock:
    with _KEY_LOCKS_GUARD:
        lock = _KEY_LOCKS.get(key)
        if lock is None:
            lock = _KEY_LOCKS[key] = threading.Lock()
        return lock


def _decide(problem, backend, mode, op, det, run) -> tuple[Choice, list[Row] | None]:
    """A choice without timing, or (None, the timed rows) in benchmark mode."""
    names = _names(problem, backend, det)
    if mode == "pinned" and backend == "auto":
        pin_key = _cache_key(problem, "auto", "pinned", op, det)
        pinned = CACHE.get(pin_key)
        choice = _decode(pinned, problem, op, names, pin_key) if pinned is not None else None
        if choice is not None:
            return choice, None
    if mode == "benchmark" and run is not None and problem.device == "cuda" \
            and not _capturing():
        rows = _benchmark(problem, names, run, op)
        if not any(r.timed or r.assumed for r in rows):
            raise NotSupported(backend, [f"every candidate failed for {problem.describe()}: "
                                         + "; ".join(f"{r.name()}: {r.note}" for r in rows)])
        return None, rows
    name = _rule(problem, names, op)
    return Choice(name, backends.REGISTRY[name].candidates(problem, op)[0]), None


def _best(rows: list[Row], graph: bool) -> Choice:
    """The timed row of least cost: GPU time for a CUDA graph, GPU + host time eagerly. A
    CUDA graph takes only a candidate that was captured where any was: one whose capture
    failed could fail the user's capture too, and its eager GPU time (operands warm in L2)
    is no measure against the others' graph times."""
    timed = [r for r in rows if r.timed]
    if not timed:  # a problem past the process's budget: its first candidate, untimed
        best = next(r for r in rows if r.assumed)
        return Choice(best.backend, best.config)
    if graph:
        timed = [r for r in timed if r.graph_ms is not None] or timed
    best = min(timed, key=lambda r: r.cost(graph))
    return Choice(best.backend, best.config, best.cost(graph), best.gpu_ms, best.host_ms,
                  best.graph_ms)


def _capturing() -> bool:
    """Inside a CUDA-graph capture nothing may be timed (or synchronised)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def cached(problem: ConvProblem, backend: str = "auto", mode: str | None = None,
           op: str = "fprop", grad: bool = False) -> Choice | None:
    """The choice already made for ``problem`` (``None`` if it was never dispatched) under
    the current settings."""
    _, det, graph = current()
    hit = CACHE.get(_cache_key(problem, backend, mode or default_mode(problem), op, det,
                               _cost(graph, grad)))
    return _decode(hit, problem, op) if hit is not None else None


def clear() -> None:
    """Forget every choice, and the upgrades waiting on background builds (memory only;
    ``plancache`` clears the disk store)."""
    CACHE.clear()
    _UPGRADES.clear()


def _rule(problem: ConvProblem, names: list[str], op: str) -> str:
    """Heuristic backend pick: aten on the CPU (the interpreter is for tests), else Triton
    when it can fuse an epilogue that torch would run as separate kernels."""
    if len(names) == 1:
        return names[0]
    if op == "fprop" and problem.device == "cuda" and "triton" in names \
            and not problem.epilogue.is_identity and not problem.depthwise:
        return "triton"
    return "aten" if "aten" in names else names[0]


# ----------------------------------------------------------------------------- benchmark
@dataclasses.dataclass
class Row:
    """One candidate as explain() shows it."""
    backend: str
    config: Any = None
    gpu_ms: float | None = None  # GPU time per call, back to back on the call's tensors
    host_ms: float | None = None  # host time per call
    note: str = ""  # refusal or failure reason; empty when timed
    chosen: bool = False
    graph_ms: float | None = None  # GPU time per call from a CUDA graph on rotated operands
    # left untimed by the budget, its background build started: timed once built
    builds: list | None = dataclasses.field(default=None, repr=False, compare=False)
    # the choice of a problem met after the process's budget was spent, run untimed (timed
    # with the candidates left building once they are built)
    assumed: bool = False

    def name(self) -> str:
        return self.backend + _config_suffix(self.config)

    @property
    def timed(self) -> bool:
        return self.gpu_ms is not None

    def cost(self, graph: bool) -> float:
        """Graph-replayed GPU time (on operands that come from memory, not a warm L2 cache)
        where it was measured, plus the host time for an eager call."""
        gpu = self.graph_ms if self.graph_ms is not None else self.gpu_ms
        return gpu if graph else gpu + self.host_ms


def _benchmark(problem: ConvProblem, names: list[str], run, op: str) -> list[Row]:
    with timing_candidates():
        return _time_candidates(problem, names, run, op)


def _time_candidates(problem: ConvProblem, names: list[str], run, op: str) -> list[Row]:
    """Every candidate's row, timed in order of promise (aten, the heuristic's pick, then
    the rest) until the tuning budget is spent (``tuning_budget``); the rows left are
    marked, not timed. A backend's candidates are listed only when its turn comes, inside
    the budget: listing cuDNN's plans builds graphs and queries its heuristics (seconds for
    some problems)."""
    first = _rule(problem, names, op)
    order = sorted(names, key=lambda n: (n != "aten", n != first))  # (stable after)
    rows: list[Row] = []
    progress = _Progress(problem, op)
    start = _clock()
    # past the process's budget nothing is timed now: aten runs (``Row.assumed``), and the
    # candidates building in the background are timed with it once built (timing it alone
    # chose nothing and cost a first call ~0.1-0.4 s per problem)
    starved = TUNING.spent_s >= TUNING.per_process_s and order[0] == "aten"

    def spent_all() -> bool:
        spent = _clock() - start
        return (starved or any(r.timed for r in rows)) and (
            spent >= TUNING.per_problem_s or TUNING.spent_s + spent >= TUNING.per_process_s)

    skipped = f"{BUDGET_NOTE} ({TUNING.describe()})"
    for b, name in enumerate(order):
        cls = backends.REGISTRY[name]
        if spent_all() and not cls.BUILDS_AHEAD and not (starved and name == "aten"):
            rows.append(Row(name, note=f"{skipped}; candidates not listed"))
            continue
        try:
            configs = cls.candidates(problem, op)
        except Exception as exc:  # e.g. a cuDNN graph that does not build here
            rows.append(Row(name, None, None, f"no candidates: {_short(exc)}"))
            continue
        pruned = []
        if TUNING.candidates is not None:
            configs, pruned = cls.prune(problem, op, configs, TUNING.candidates)
        ahead = _compile_ahead(cls, configs, run)
        for i, config in enumerate(configs):
            if not spent_all():
                progress.show(name + _config_suffix(config), len(configs) - i - 1,
                              order[b + 1:], _clock() - start)
            if spent_all() or not _wait_built(ahead[i], start, any(r.timed for r in rows)):
                rows += [Row(name, c, note=skipped, builds=a)
                         for c, a in zip(configs[i:], ahead[i:])]
                if starved and name == "aten" and i == 0:
                    rows[-len(configs)].assumed = True
                    rows[-len(configs)].note += "; runs untimed (timed beside the builds once done)"
                break
            try:
                gpu, host = time_costs(lambda cls=cls, config=config: run(cls, config))
            except torch.OutOfMemoryError as exc:
                torch.cuda.empty_cache()
                rows.append(Row(name, config, note=f"out of memory: {_short(exc)}"))
            except Exception as exc:  # cannot compile here, workspace over the cap, ...
                rows.append(Row(name, config, note=_short(exc)))
            else:
                rows.append(Row(name, config, gpu, host))
                _time_graphed(rows[-1], run, cls, config)
        rows += [Row(name, c, note=f"{PRUNED_NOTE} ({TUNING.describe()})") for c in pruned]
    _refine_host(rows, run)
    TUNING.spent_s += _clock() - start
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
#: candidate was timed. A build not done by then is timed once it is (``_upgrade``). On a
#: cold Triton cache a tile compiles for seconds: waiting out the problem's whole budget for
#: it left the backends after it (cuDNN's plans) unlisted; with the short wait they are
#: timed in that budget instead (first calls unchanged, CUDA-graph time equal or 1 % better:
#: benchmarks/NOTES.md, session 11).
BUILD_WAIT_S = 0.25


def _wait_built(jobs: list | None, start: float, bounded: bool) -> bool:
    """Wait for a candidate's background build, within the problem's budget and
    ``BUILD_WAIT_S`` (exhaustive tuning: without limit) where ``bounded`` (some candidate
    was timed already); False if that ran out first."""
    if not jobs:
        return True
    if not bounded:
        concurrent.futures.wait(jobs)
        return True
    left = min(TUNING.per_problem_s - (_clock() - start),
               TUNING.per_process_s - TUNING.spent_s - (_clock() - start),
               float("inf") if TUNING.exhaustive else BUILD_WAIT_S)
    timeout = None if math.isinf(left) else max(0.0, left)
    return not concurrent.futures.wait(jobs, timeout=timeout).not_done


def _time_graphed(row: Row, run, cls, config) -> None:
    """``row.graph_ms`` where ``run`` can rotate over operand sets (``run(cls, config, k)``
    runs on set k of ``run.operand_sets.count``); a candidate that cannot be captured keeps
    its eager GPU time for the eager ranking, with the reason in its note, and is left out
    of the CUDA-graph ranking (``_best``)."""
    sets = getattr(run, "operand_sets", None)
    if sets is None:
        return
    try:
        row.graph_ms = time_graph_cost(lambda k: run(cls, config, k), sets.count, row.gpu_ms)
    except torch.OutOfMemoryError as exc:
        torch.cuda.empty_cache()
        row.note = f"graph timing: out of memory: {_short(exc)}"
    except Exception as exc:
        row.note = f"graph timing: {_short(exc)}"


_clock = time.monotonic  # (tests replace it)
BUDGET_NOTE = "not timed: tuning budget spent"
PRUNED_NOTE = "not timed: pruned by the cost model"


def _untimed(rows: list[Row]) -> bool:
    """Whether the budget left candidates untimed (the choice is then stored partial)."""
    return any(r.note.startswith((BUDGET_NOTE, PRUNED_NOTE)) for r in rows)


@dataclasses.dataclass
class TuningBudget:
    """Seconds benchmark dispatch may spend timing the candidates of one problem, and of
    every problem in this process (``spent_s`` counts the latter), and how many of a
    backend's candidates it compiles and times at all (``candidates``: the ones its cost
    model expects fastest; None: every one). Each problem times at least its most promising
    candidate. No arguments: no limit (exhaustive)."""
    per_problem_s: float = float("inf")
    per_process_s: float = float("inf")
    candidates: int | None = None
    spent_s: float = 0.0

    def describe(self) -> str:
        return (f"{self.per_problem_s:g} s per problem, {self.per_process_s:g} s per process"
                + (f", {self.candidates} candidates per backend" if self.candidates else ""))

    @property
    def exhaustive(self) -> bool:
        return self.per_problem_s == self.per_process_s == float("inf") \
            and self.candidates is None


#: The tuning budget when neither ``tuning_budget`` nor ``FASTCONV_TUNE_BUDGET`` sets one:
#: (seconds per problem, seconds per process, candidates per backend). Timing aten costs
#: milliseconds; a Triton or cuDNN candidate seconds of compilation the first time, so a new
#: problem times aten and about one more candidate, and a process spends at most ~4 s (plus
#: the last candidate started) before every further new problem takes its first candidate,
#: aten, timed beside its Triton candidates once they are built. 8 s until session 12: on
#: the H200 without a database, 4 s gave timm mobilenetv3 / efficientnet_b0 first calls of
#: 9.1 / 9.4 s against 10.3-10.8 s with 6 s and 10.4-11.2 s with 8 s, at a CUDA-graph time
#: 2-3 % longer in that first process (later processes tune what it left); with the
#: shipped database first calls and graph times were equal at 4 and 6 s (benchmarks/NOTES.md,
#: "Session 12"). Of a problem's Triton tiles the 6 that the cost model expects fastest are
#: built (on the shipped H100 database's problems: 98 % of the exhaustive winners among
#: them, 69 % of the compiles; benchmarks/cost_model_recall.py).
DEFAULT_BUDGET = (1.0, 4.0, 6)


def parse_budget(text: str, what: str = "FASTCONV_TUNE_BUDGET") -> TuningBudget:
    """A budget from text: ``"exhaustive"``,
    ``"<s per problem>[,<s per process>[,<candidates per backend>]]"``, or empty for
    ``DEFAULT_BUDGET``; ``what`` names the setting in the error."""
    text = text.strip().lower()
    if text == "":
        return TuningBudget(*DEFAULT_BUDGET)
    if text in ("exhaustive", "inf", "none"):
        return TuningBudget()
    values = text.split(",")
    try:
        seconds = [float(v) for v in values[:2]]
        candidates = [int(v) for v in values[2:]]
        if not 1 <= len(values) <= 3 or any(not v > 0 for v in seconds + candidates):
            raise ValueError
    except ValueError:
        raise ConvError(f"{what}: got {text!r}; expected 'exhaustive' or '<seconds per "
                        f"problem>[,<seconds per process>[,<candidates per backend>]]', "
                        f"positive") from None
    return TuningBudget(*seconds, *candidates) if len(seconds) == 2 \
        else TuningBudget(seconds[0])


class _Unreadable:
    """The budget while ``FASTCONV_TUNE_BUDGET`` cannot be read: importing fastconv works,
    and the first use of the budget raises the error that names the variable."""

    def __init__(self, error: ConvError):
        self.error = error

    def __getattr__(self, name):
        raise self.error


def _budget_from_environment() -> TuningBudget | _Unreadable:
    try:
        return parse_budget(os.environ.get("FASTCONV_TUNE_BUDGET", ""))
    except ConvError as exc:
        return _Unreadable(exc)


TUNING = _budget_from_environment()


def tuning_budget(per_problem_s: float = float("inf"),
                  per_process_s: float = float("inf"),
                  candidates: int | None = None) -> TuningBudget:
    """Bound benchmark dispatch's timing: at most ``per_problem_s`` seconds per problem
    (after its most promising candidate) and ``per_process_s`` in all (counted from this
    call), and at most ``candidates`` of a backend's candidates compiled and timed, those
    its cost model expects fastest; see the module docstring for what is stored. No
    arguments: exhaustive. The default is ``DEFAULT_BUDGET`` (or ``FASTCONV_TUNE_BUDGET``)."""
    global TUNING
    for name, value in (("per_problem_s", per_problem_s), ("per_process_s", per_process_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConvError(f"{name}: got {value!r}; expected a positive number of seconds")
    if candidates is not None and (type(candidates) is not int or candidates < 1):
        raise ConvError(f"candidates: got {candidates!r}; expected None (every candidate) "
                        f"or an int >= 1")
    TUNING = TuningBudget(float(per_problem_s), float(per_process_s), candidates)
    return TUNING


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


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def _refine_host(rows: list[Row], run, top: int = 4, rounds: int = 3) -> None:
    """The host times of the ``top`` candidates of least eager cost measured again,
    interleaved over ``rounds``; each keeps its least. A candidate's own timing runs in one
    stretch, and the first one timed for a problem (aten) measured up to 2-4x its host time
    when timed again later (explain logs of issue 20, session 5): interleaving compares
    them under the same conditions."""
    best = sorted((r for r in rows if r.timed), key=lambda r: r.cost(False))[:top]
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


# ------------------------------------------------------------------------------- explain
@dataclasses.dataclass
class Explanation:
    problem: ConvProblem
    mode: str
    op: str
    rows: list[Row]
    choice: Choice
    graph: bool = False  # ranked by GPU time (a CUDA graph) instead of GPU + host time

    def __str__(self) -> str:
        ranked = "GPU time (CUDA graph)" if self.graph else "GPU + host time (eager)"
        lines = [f"{self.op} of {self.problem.describe()} [{self.problem.key()}]",
                 f"mode {self.mode}; ranked by {ranked}; choice: {self.choice.name()}"]
        width = max(len(r.name()) for r in self.rows)
        for r in self.rows:
            mark = "*" if r.chosen else " "
            graphed = "" if r.graph_ms is None else f"  graph {r.graph_ms * 1000:8.1f} us"
            what = (f"gpu {r.gpu_ms * 1000:8.1f} us  host {r.host_ms * 1000:8.1f} us{graphed}"
                    + (f"  ({r.note})" if r.note else "") if r.timed else (r.note or "not timed"))
            lines.append(f" {mark} {r.name():<{width}}  {what}")
        return "\n".join(lines)


def explain(problem: ConvProblem, backend: str = "auto", *, mode: str | None = None,
            op: str = "fprop", run: Callable | None = None) -> Explanation:
    """Every backend and candidate for ``problem``: why it cannot run, or its time (when
    ``mode`` is benchmark and ``run`` executes a candidate), and the choice. Does not
    change the cache."""
    mode = mode or default_mode(problem)
    _, det, graph = current()
    refusals = supported(problem, det) if backend == "auto" else \
        {backend: backends.get(backend).not_supported_reasons(problem)}
    names = [n for n, r in refusals.items() if not r]
    rows: list[Row] = []
    if mode == "benchmark" and run is not None and problem.device == "cuda" and names:
        rows = _benchmark(problem, names, run, op)
    else:
        for n in names:
            try:
                rows += [Row(n, c, note="not timed") for c in
                         backends.REGISTRY[n].candidates(problem, op)]
            except Exception as exc:
                rows.append(Row(n, note=f"no candidates: {_short(exc)}"))
    rows += [Row(n, note="; ".join(r)) for n, r in refusals.items() if r]
    hit = CACHE.get(_cache_key(problem, backend, mode, op, det, _cost(graph, False)))
    choice = _decode(hit, problem, op, names) if hit is not None else None
    if choice is None:
        if any(r.timed for r in rows):
            choice = _best(rows, graph)
        elif names:
            choice, _ = _decide(problem, backend, mode if mode != "benchmark" else "heuristic",
                                op, det, None)
        else:
            choice = Choice("none", None)
    for r in rows:
        r.chosen = r.backend == choice.backend and r.config == choice.config
    return Explanation(problem, mode, op, rows, choice, graph)
