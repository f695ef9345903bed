"""Choosing a backend and a configuration for a problem.

Modes:

* ``heuristic`` — no timing: rules pick the backend, the backend's first candidate is the
  configuration. The default on the CPU.
* ``benchmark`` — the first time a problem key is seen, every supported backend's
  candidates (aten, each Triton tile, each cuDNN plan) are timed on the call's own tensors
  (warm-up, CUDA events, median) and the fastest is kept. The default on the GPU. aten is
  always a candidate, so this mode is not slower than PyTorch except for timing noise. A
  candidate that fails to build, needs more workspace than the cap or runs out of memory is
  skipped and its reason recorded.
* ``pinned`` — what ``pin()`` fixed for a problem; nothing is timed (problems never pinned
  take the heuristic's choice).

The mode comes from, in order: ``dispatch=`` of a call, the innermost ``settings(...)``
context, ``FASTCONV_DISPATCH``, the default above. ``deterministic=True`` (or
``FASTCONV_DETERMINISTIC=1``) keeps only candidates that give bitwise-repeatable results.

Choices live in ``plancache.PlanCache`` (memory LRU; benchmark choices and pins also on disk,
so a new process skips the timing). Thread-safe: concurrent first calls of one key time it
once and share one entry.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import statistics
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from . import backends, plancache
from .errors import ConvError, NotSupported
from .problem import ConvProblem

MODES = ("heuristic", "benchmark", "pinned")
OPS = ("fprop", "dgrad", "wgrad")


@dataclasses.dataclass(frozen=True)
class Choice:
    backend: str
    config: Any
    ms: float | None = None  # measured time in benchmark mode

    def name(self) -> str:
        return self.backend + _config_suffix(self.config)


def _config_suffix(config) -> str:
    if config is None:
        return ""
    cfg = getattr(config, "name", None)
    return f":{cfg()}" if callable(cfg) else f":{config}"


@dataclasses.dataclass(frozen=True)
class Settings:
    mode: str | None = None  # None: FASTCONV_DISPATCH, else by device
    deterministic: bool | None = None  # None: FASTCONV_DETERMINISTIC


_UNSET = Settings()  # frozen: safe to share as the default
_TIMING: contextvars.ContextVar[bool] = contextvars.ContextVar("fastconv_timing", default=False)


def timing() -> bool:
    """True while benchmark dispatch runs candidates to time them (a backend can skip
    one-off work such as storing a plan that may not be chosen)."""
    return _TIMING.get()
_SETTINGS: contextvars.ContextVar[Settings] = contextvars.ContextVar("fastconv_dispatch",
                                                                     default=_UNSET)


@contextlib.contextmanager
def settings(mode: str | None = None, *, deterministic: bool | None = None):
    """Dispatch settings for the calls inside the ``with`` block (this thread / task)::

        with fastconv.dispatch.settings("pinned", deterministic=True):
            y = fastconv.conv2d(x, w)
    """
    if mode is not None and mode not in MODES:
        raise ConvError(f"mode: got {mode!r}; allowed: {', '.join(MODES)}")
    outer = _SETTINGS.get()
    token = _SETTINGS.set(Settings(mode if mode is not None else outer.mode,
                                   deterministic if deterministic is not None
                                   else outer.deterministic))
    try:
        yield
    finally:
        _SETTINGS.reset(token)


_ENV: tuple[str | None, bool] | None = None  # FASTCONV_DISPATCH / _DETERMINISTIC, as read


def reload_environment() -> None:
    """Read ``FASTCONV_DISPATCH`` and ``FASTCONV_DETERMINISTIC`` again at the next call.
    They are read once, not per call (two environment reads cost ~2 us of host time per
    call); ``fastconv.functional.clear_plans()`` also calls this. In a running program prefer
    :func:`settings`."""
    global _ENV
    _ENV = None


def _environment() -> tuple[str | None, bool]:
    global _ENV
    if _ENV is None:
        env = os.environ.get("FASTCONV_DISPATCH") or None
        if env is not None and env not in MODES:
            raise ConvError(f"FASTCONV_DISPATCH: got {env!r}; allowed: {', '.join(MODES)}")
        det = os.environ.get("FASTCONV_DETERMINISTIC", "0").strip().lower() in ("1", "true",
                                                                               "yes", "on")
        _ENV = (env, det)
    return _ENV


def current() -> tuple[str | None, bool]:
    """(mode set by context or environment or None, deterministic) — part of plan keys."""
    s = _SETTINGS.get()
    if s is _UNSET:  # no settings() context: the environment's (read once)
        return _ENV if _ENV is not None else _environment()
    env_mode, env_det = _environment()
    return (s.mode if s.mode is not None else env_mode,
            s.deterministic if s.deterministic is not None else env_det)


def default_mode(problem: ConvProblem) -> str:
    mode, _ = current()
    return mode or ("benchmark" if problem.device == "cuda" else "heuristic")


# --------------------------------------------------------------------------------- cache
CACHE = plancache.PlanCache()
_KEY_LOCKS: dict[str, threading.Lock] = {}
_KEY_LOCKS_GUARD = threading.Lock()


def _cache_key(problem: ConvProblem, backend: str, mode: str, op: str, det: bool) -> str:
    return f"{problem.key()}|{op}|{backend}|{mode}|{'det' if det else 'any'}"


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
        ms = entry.get("ms")
        return Choice(name, config, float(ms) if isinstance(ms, (int, float)) else None)
    except Exception as exc:
        if key is not None:
            CACHE.discard(key)
            warnings.warn(f"fastconv: ignoring the stored plan for {problem.describe()} "
                          f"({op}): {type(exc).__name__}: {exc}; deciding again",
                          RuntimeWarning, stacklevel=4)
        return None


def _entry(choice: Choice) -> dict:
    cls = backends.REGISTRY[choice.backend]
    return {"backend": choice.backend, "config": cls.encode_config(choice.config),
            "ms": choice.ms}


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
    _, det = current()
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
           mode: str | None = None, op: str = "fprop") -> Choice:
    """The backend and configuration to run ``op`` of ``problem`` with.

    ``run(backend_cls, config)`` executes one candidate on the call's tensors; benchmark mode
    needs it and falls back to the heuristic without it. ``op`` is one of ``OPS``: the
    problem's own computation or the data / weight gradient of a (non-transposed) problem.
    """
    mode = mode or default_mode(problem)
    if mode not in MODES:
        raise ConvError(f"mode: got {mode!r}; allowed: {', '.join(MODES)}")
    _, det = current()
    key = _cache_key(problem, backend, mode, op, det)
    hit = CACHE.get(key)
    if hit is not None:
        choice = _decode(hit, problem, op, _names(problem, backend, det), key)
        if choice is not None:
            return choice
    with _key_lock(key):
        hit = CACHE.get(key)  # another thread may have decided while we waited
        choice = _decode(hit, problem, op, _names(problem, backend, det), key) \
            if hit is not None else None
        if choice is None:
            choice, persist = _decide(problem, backend, mode, op, det, run)
            CACHE.put(key, _entry(choice), persist=persist)
    return choice


def _key_lock(key: str) -> threading.Lock:
    with _KEY_LOCKS_GUARD:
        lock = _KEY_LOCKS.get(key)
        if lock is None:
            lock = _KEY_LOCKS[key] = threading.Lock()
        return lock


def _decide(problem, backend, mode, op, det, run) -> tuple[Choice, bool]:
    names = _names(problem, backend, det)
    if mode == "pinned" and backend == "auto":
        pin_key = _cache_key(problem, "auto", "pinned", op, det)
        pinned = CACHE.get(pin_key)
        choice = _decode(pinned, problem, op, names, pin_key) if pinned is not None else None
        if choice is not None:
            return choice, False
    if mode == "benchmark" and run is not None and problem.device == "cuda" \
            and not _capturing():
        rows = _benchmark(problem, names, run, op)
        timed = [r for r in rows if r.ms is not None]
        if not timed:
            raise NotSupported(backend, [f"every candidate failed for {problem.describe()}: "
                                         + "; ".join(f"{r.name()}: {r.note}" for r in rows)])
        best = min(timed, key=lambda r: r.ms)
        return Choice(best.backend, best.config, best.ms), True
    name = _rule(problem, names, op)
    return Choice(name, backends.REGISTRY[name].candidates(problem, op)[0]), False


def _capturing() -> bool:
    """Inside a CUDA-graph capture nothing may be timed (or synchronised)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def cached(problem: ConvProblem, backend: str = "auto", mode: str | None = None,
           op: str = "fprop") -> Choice | None:
    """The choice already made for ``problem`` (``None`` if it was never dispatched)."""
    _, det = current()
    hit = CACHE.get(_cache_key(problem, backend, mode or default_mode(problem), op, det))
    return _decode(hit, problem, op) if hit is not None else None


def clear() -> None:
    """Forget every choice (memory only; ``plancache`` clears the disk store)."""
    CACHE.clear()


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
    ms: float | None = None
    note: str = ""  # refusal or failure reason; empty when timed
    chosen: bool = False

    def name(self) -> str:
        return self.backend + _config_suffix(self.config)


def _benchmark(problem: ConvProblem, names: list[str], run, op: str) -> list[Row]:
    token = _TIMING.set(True)
    try:
        return _time_candidates(problem, names, run, op)
    finally:
        _TIMING.reset(token)


def _time_candidates(problem: ConvProblem, names: list[str], run, op: str) -> list[Row]:
    rows = []
    for name in names:
        cls = backends.REGISTRY[name]
        try:
            configs = cls.candidates(problem, op)
        except Exception as exc:  # e.g. a cuDNN graph that does not build here
            rows.append(Row(name, None, None, f"no candidates: {_short(exc)}"))
            continue
        for config in configs:
            try:
                ms = time_ms(lambda cls=cls, config=config: run(cls, config))
            except torch.OutOfMemoryError as exc:
                torch.cuda.empty_cache()
                rows.append(Row(name, config, None, f"out of memory: {_short(exc)}"))
            except Exception as exc:  # cannot compile here, workspace over the cap, ...
                rows.append(Row(name, config, None, _short(exc)))
            else:
                rows.append(Row(name, config, ms))
    return rows


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def time_ms(fn: Callable[[], None], warmup: int = 3, batches: int = 5,
            per_batch: int = 8) -> float:
    """Milliseconds per call of ``fn``: the median over ``batches`` of ``per_batch``
    back-to-back calls between one CUDA event pair (batching keeps launch gaps and event
    jitter from deciding between candidates that differ by a few microseconds)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(batches):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(per_batch):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / per_batch)
    return statistics.median(times)


# ------------------------------------------------------------------------------- explain
@dataclasses.dataclass
class Explanation:
    problem: ConvProblem
    mode: str
    op: str
    rows: list[Row]
    choice: Choice

    def __str__(self) -> str:
        lines = [f"{self.op} of {self.problem.describe()} [{self.problem.key()}]",
                 f"mode {self.mode}; choice: {self.choice.name()}"]
        width = max(len(r.name()) for r in self.rows)
        for r in self.rows:
            mark = "*" if r.chosen else " "
            what = f"{r.ms * 1000:9.1f} us" if r.ms is not None else (r.note or "not timed")
            lines.append(f" {mark} {r.name():<{width}}  {what}")
        return "\n".join(lines)


def explain(problem: ConvProblem, backend: str = "auto", *, mode: str | None = None,
            op: str = "fprop", run: Callable | None = None) -> Explanation:
    """Every backend and candidate for ``problem``: why it cannot run, or its time (when
    ``mode`` is benchmark and ``run`` executes a candidate), and the choice. Does not
    change the cache."""
    mode = mode or default_mode(problem)
    _, det = current()
    refusals = supported(problem, det) if backend == "auto" else \
        {backend: backends.get(backend).not_supported_reasons(problem)}
    names = [n for n, r in refusals.items() if not r]
    rows: list[Row] = []
    if mode == "benchmark" and run is not None and problem.device == "cuda" and names:
        rows = _benchmark(problem, names, run, op)
    else:
        for n in names:
            try:
                rows += [Row(n, c, None, "not timed") for c in
                         backends.REGISTRY[n].candidates(problem, op)]
            except Exception as exc:
                rows.append(Row(n, None, None, f"no candidates: {_short(exc)}"))
    rows += [Row(n, None, None, "; ".join(r)) for n, r in refusals.items() if r]
    hit = CACHE.get(_cache_key(problem, backend, mode, op, det))
    choice = _decode(hit, problem, op, names) if hit is not None else None
    if choice is None:
        timed = [r for r in rows if r.ms is not None]
        if timed:
            best = min(timed, key=lambda r: r.ms)
            choice = Choice(best.backend, best.config, best.ms)
        elif names:
            choice, _ = _decide(problem, backend, mode if mode != "benchmark" else "heuristic",
                                op, det, None)
        else:
            choice = Choice("none", None)
    for r in rows:
        r.chosen = r.backend == choice.backend and r.config == choice.config
    return Explanation(problem, mode, op, rows, choice)
