"""Choices that wait on background builds: a tuning-database choice whose kernels still
compile (``adopt``: aten runs meanwhile), and a problem whose budget-cut timing left
candidates building (:class:`Upgrade`: the best timed runs meanwhile, and the first call
after every build is done times them and stores the final choice)."""

from __future__ import annotations

import dataclasses
import threading
import warnings
from collections.abc import Callable

from .. import backends
from ..backends import aten
from ..problem import ConvProblem
from . import budget, policy, store, timing
from .store import Choice


@dataclasses.dataclass
class Upgrade:
    """A problem's timed rows whose untimed candidates are building in the background
    (``Row.builds``), and the cache keys of its two rankings."""
    rows: list
    keys: list
    op: str
    done: bool = False

    def built(self) -> bool:
        """Whether every build has finished (cheap once true)."""
        if not self.done:
            self.done = all(j.done() for r in self.rows if r.builds for j in r.builds)
        return self.done

    def ready(self) -> bool:
        """Whether some candidate's build has finished and it waits to be timed, or every
        build is done (a provisional plan's ``until``: true for good once the final choice
        is made, so that a stand-in kept under another signature than the call that
        finished the upgrade asks again instead of running for good)."""
        return self.done or any(all(j.done() for j in r.builds) for r in self.rows
                                if r.builds)

    def stand_in(self, graph: bool) -> Choice:
        """The provisional choice while the builds run: the best timed row. A problem met
        after the process's budget was spent has none: aten, untimed, which for a forward
        runs cuDNN's heuristic plan (``aten.PROVISIONAL``, as a database choice still
        compiling does). cudnn.benchmark's search would cost each new shape tens to hundreds
        of milliseconds for a plan used only until the builds are done (~4 s of
        efficientnet_b0's first call without a database); the upgrade times aten with the
        search, beside the built candidates."""
        best = policy.best(self.rows, graph)
        if self.op == "fprop" and best.backend == "aten" and best.config is None \
                and not any(r.timed for r in self.rows):
            best = dataclasses.replace(best, config=aten.PROVISIONAL)
        return dataclasses.replace(best, provisional=True, until=self.ready)


#: cache key -> the problem's pending upgrade (both rankings' keys share one)
UPGRADES: dict[str, Upgrade] = {}


def upgrade(key: str, graph: bool, run) -> Choice:
    """The choice for a problem whose budget-cut timing left candidates building: while
    nothing can be timed (no ``run``, a CUDA-graph capture, no build finished since), the
    best timed so far, provisional (plans keep it until another build is done, then come
    back here). Candidates whose builds are done are timed as they finish (milliseconds:
    their kernels are in the cache), with aten where it ran untimed, and the best so far
    runs, still provisional; once all are built, the candidates timed before that could
    still win (``RETIME_FACTOR``) are timed again in the same conditions (the first call's
    were taken amid the process's start-up), the two rankings are stored (on disk) and the
    best is returned for good."""
    up = UPGRADES[key]
    if run is None or policy.capturing() or not up.ready():
        return up.stand_in(graph)
    with key_lock(key):
        if UPGRADES.get(key) is not up:  # another thread finished it
            return policy.best(up.rows, graph)
        final = up.built()
        done = [r for r in up.rows if r.builds and all(j.done() for j in r.builds)]
        again = [r for r in up.rows if r.assumed and not r.timed]
        if final:
            again += contenders(up.rows)
        for r in again + done:
            failed = next((j.exception() for j in r.builds or () if j.exception()), None)
            r.builds, r.note = None, ""
            if failed is not None:  # timing it would compile it here: seconds
                r.note = f"background build failed: {timing.short(failed)}"
                continue
            timing.time_row(r, run, up.rows)
        if not final:
            return up.stand_in(graph)
        timing.confirm_against_aten(up.rows, run)
        # stored on disk even where backends that build nothing ahead were not listed
        # (a starved problem's): every candidate that builds ahead has been timed
        untimed = timing.untimed(up.rows)
        for g, k in zip((False, True), up.keys):
            store.CACHE.put(k, store.encode(policy.best(up.rows, g), partial=untimed),
                            persist=True)
            UPGRADES.pop(k, None)
    return policy.best(up.rows, graph)


#: Rows timed before an upgrade's final timing whose cost is more than this multiple of the
#: best row's in both rankings keep their first timing: start-up noise does not move a
#: candidate that far (re-timing every row made 110 upgrades ~70 s of a batch-256 training
#: model's first call, H200 2026-11-29).
RETIME_FACTOR = 1.5


def contenders(rows: list) -> list:
    """The timed rows within ``RETIME_FACTOR`` of the best, in the eager or the CUDA-graph
    ranking."""
    timed = [r for r in rows if r.timed]
    near = []
    for graph in (False, True):
        ranked = [r for r in timed if not graph or r.graph_ms is not None] or timed
        least = min((r.cost(graph) for r in ranked), default=None)
        near += [r for r in ranked if r.cost(graph) <= RETIME_FACTOR * least
                 and not any(r is n for n in near)]
    return near


def adopt(choice: Choice, hit: dict, key: str, problem: ConvProblem, mode: str, op: str,
          run, names: list[str]) -> Choice | None:
    """A tuning-database choice, first used: run once now (a cuDNN plan builds: seconds for
    some) and charged to the tuning budget, so that a first call stays bounded. A Triton
    choice's kernels are compiled by background workers first (``compile_ahead``): until
    they are, aten runs the call (a provisional choice, not stored): past the process's
    budget too, since the builds cost the call nothing. None once the process's budget is
    spent and it needs a backend that builds at the call (cuDNN: the caller decides as for
    a new problem), or where it fails to run."""
    if mode == "benchmark" and run is not None and problem.device == "cuda" \
            and not policy.capturing():
        tuning = budget.TUNING
        cls = backends.REGISTRY[choice.backend]
        if choice.backend != "aten" and not cls.BUILDS_AHEAD \
                and tuning.spent_s >= tuning.per_process_s:
            return None
        start = timing.clock()
        try:
            if "aten" in names and not ahead_built(key, cls, lambda: run(cls, choice.config)):
                jobs = AHEAD[key]
                # (cuDNN's heuristic plan: a benchmark search would cost more than the
                # seconds this plan runs for)
                return Choice("aten", aten.PROVISIONAL if op == "fprop" else None,
                              provisional=True, until=lambda: all(j.done() for j in jobs))
            run(cls, choice.config)
        except Exception:
            return None
        finally:
            tuning.spent_s += timing.clock() - start
    store.CACHE.put(key, {k: v for k, v in hit.items() if k != "source"}, persist=False)
    return choice


def missing_here(hit: dict) -> bool:
    """Whether a tuning-database entry names a backend that this process cannot use at all
    (``Backend.available``: e.g. the cuDNN frontend, an optional extra, not installed). The
    database was measured with every backend; such a problem is decided as a new one, with
    one warning per backend rather than one per problem."""
    name = hit.get("backend")
    cls = backends.REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        return False  # (``store.decode`` reports it)
    ok, why = cls.available()
    if not ok and cls.NAME not in WARNED_MISSING:
        WARNED_MISSING.add(cls.NAME)
        warnings.warn(f"fastconv: the tuning database's choices for backend {cls.NAME!r} are "
                      f"not used here ({why}): those problems are tuned as new ones",
                      RuntimeWarning, stacklevel=4)
    return not ok


#: backends whose database choices were skipped with a warning (``missing_here``)
WARNED_MISSING: set[str] = set()


#: cache key -> the futures of the background builds its stored choice needs
AHEAD: dict[str, list] = {}


def ahead_built(key: str, cls, run: Callable[[], object]) -> bool:
    """Whether what ``run`` needs is built (or builds inline: no background build, or one
    that failed, which ``run`` then reports); starts the build on first sight."""
    jobs = AHEAD.get(key)
    if jobs is None:
        jobs = cls.compile_ahead(run)
        if jobs is None:
            return True
        AHEAD[key] = jobs
    return all(j.done() for j in jobs)


def finish_builds(timeout: float | None = None, *, upgrades: bool = False) -> bool:
    """Wait for the background builds that stored choices wait on (a CUDA-graph capture
    calls this first: a choice still provisional would be captured as aten for good);
    with ``upgrades``, also for the candidates a budget-cut timing left building (a
    process without a database entry compiles them for tens of seconds after its first
    call; the choices they upgrade are timed at the next call of each problem, so a
    steady state is measured after this). False if ``timeout`` seconds passed first."""
    jobs = [j for js in list(AHEAD.values()) for j in js if not j.done()]
    if upgrades:
        jobs += [j for up in list(UPGRADES.values()) for r in up.rows if r.builds
                 for j in r.builds if not j.done()]
    return timing.wait_builds(jobs, timeout)


def building() -> bool:
    """Whether any background build that a choice waits on still runs: a stored choice's,
    or a candidate a budget-cut timing left building (its problem's choice is upgraded at
    the problem's next call once all are built). A CUDA graph captured while this holds
    ran those problems' provisional choices."""
    return any(not j.done() for js in list(AHEAD.values()) for j in js) \
        or any(not up.built() for up in list(UPGRADES.values()))


_KEY_LOCKS: dict[str, threading.Lock] = {}
_KEY_LOCKS_GUARD = threading.Lock()


def key_lock(key: str) -> threading.Lock:
    """The lock of one cache key: concurrent first calls of a problem time it once."""
    with _KEY_LOCKS_GUARD:
        lock = _KEY_LOCKS.get(key)
        if lock is None:
            lock = _KEY_LOCKS[key] = threading.Lock()
        return lock
