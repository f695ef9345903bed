"""Choosing: the cached choice of a problem, else a new one (pinned, the heuristic's, or
timed in benchmark mode), both rankings stored from one timing; pins; clearing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import backends
from ..context import MODES, current
from ..errors import ConvError, NotSupported
from ..problem import ConvProblem
from . import budget, policy, store, timing, upgrades
from .store import Choice
from .timing import Row

OPS = ("fprop", "dgrad", "wgrad")


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
    store.CACHE.put(store.cache_key(problem, "auto", "pinned", op, det), store.encode(choice),
                    persist=True)


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
    mode = mode or policy.default_mode(problem)
    if mode not in MODES:
        raise ConvError(f"mode: got {mode!r}; allowed: {', '.join(MODES)}")
    # (a capture made without settings(graph=True) finds the choice its eager warm-up stored)
    _, det, graph = current()
    key = store.cache_key(problem, backend, mode, op, det, store.cost_name(graph, grad))
    if key in upgrades.UPGRADES:
        return upgrades.upgrade(key, graph, run)
    hit = store.CACHE.get(key)
    if store.usable(hit) and "source" not in hit:
        choice = store.decode(hit, problem, op, policy.backend_names(problem, backend, det),
                              key)
        if choice is not None:
            return choice
    with upgrades.key_lock(key):
        hit = store.CACHE.get(key)  # another thread may have decided while we waited
        names = policy.backend_names(problem, backend, det)
        if store.usable(hit) and "source" in hit and upgrades.missing_here(hit):
            store.CACHE.discard(key)
            hit = None
        choice = store.decode(hit, problem, op, names, key) if store.usable(hit) else None
        if choice is not None and "source" in hit:
            choice = upgrades.adopt(choice, hit, key, problem, mode, op, run, names)
        if choice is None:
            tuning = budget.TUNING  # (spent before this problem's timing)
            starved = tuning.spent_s >= tuning.per_process_s
            choice, rows = decide(problem, backend, mode, op, det, run, key)
            if rows is None:
                store.CACHE.put(key, store.encode(choice), persist=False)
            else:  # one timing, both rankings stored (see the module docstring)
                untimed = timing.untimed(rows)
                keys = [store.cache_key(problem, backend, mode, op, det,
                                        store.cost_name(g, grad)) for g in (False, True)]
                for g in (False, True):
                    best = policy.best(rows, g)
                    store.CACHE.put(keys[g], store.encode(best, partial=untimed),
                                    persist=not (untimed and starved))
                    if g == graph:
                        choice = best
                if any(r.builds for r in rows):  # timed later, once built (upgrades.upgrade)
                    upgrade = upgrades.Upgrade(rows, keys, op)
                    for k in keys:
                        upgrades.UPGRADES[k] = upgrade
                    choice = upgrade.stand_in(graph)
    return choice


def decide(problem, backend, mode, op, det, run,
           key: str | None = None) -> tuple[Choice | None, list[Row] | None]:
    """A choice without timing, or (None, the timed rows) in benchmark mode (``key``: the
    problem's cache key, for the tuning database's nearest problem)."""
    names = policy.backend_names(problem, backend, det)
    if mode == "pinned" and backend == "auto":
        pin_key = store.cache_key(problem, "auto", "pinned", op, det)
        pinned = store.CACHE.get(pin_key)
        choice = store.decode(pinned, problem, op, names, pin_key) if pinned is not None \
            else None
        if choice is not None:
            return choice, None
    if mode == "benchmark" and run is not None and problem.device == "cuda" \
            and not policy.capturing():
        rows = timing.benchmark(problem, names, run, op, key)
        if not any(r.timed or r.assumed for r in rows):
            raise NotSupported(backend, [f"every candidate failed for {problem.describe()}: "
                                         + "; ".join(f"{r.name()}: {r.note}" for r in rows)])
        return None, rows
    name = policy.rule(problem, names, op)
    return Choice(name, backends.REGISTRY[name].candidates(problem, op)[0]), None


def cached(problem: ConvProblem, backend: str = "auto", mode: str | None = None,
           op: str = "fprop", grad: bool = False) -> Choice | None:
    """The choice already made for ``problem`` (``None`` if it was never dispatched) under
    the current settings."""
    _, det, graph = current()
    hit = store.CACHE.get(store.cache_key(problem, backend, mode or policy.default_mode(problem),
                                          op, det, store.cost_name(graph, grad)))
    if hit is None:
        return None
    return store.decode(hit, problem, op, [n for n, r in policy.supported(problem).items()
                                           if not r])


def clear() -> None:
    """Forget every choice, and the upgrades waiting on background builds (memory only;
    ``plancache`` clears the disk store)."""
    store.CACHE.clear()
    upgrades.UPGRADES.clear()
