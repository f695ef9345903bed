"""The dispatch settings in force for a call: mode, determinism, CUDA-graph costs.

A leaf module (it imports no other part of fastconv but its errors), so that backends read
the settings without importing dispatch. ``fastconv.dispatch`` re-exports the public names;
its docstring says how the settings are chosen.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os

from .errors import ConvError

MODES = ("heuristic", "benchmark", "pinned")


@dataclasses.dataclass(frozen=True)
class Settings:
    mode: str | None = None  # None: FASTCONV_DISPATCH, else by device
    deterministic: bool | None = None  # None: FASTCONV_DETERMINISTIC
    graph: bool | None = None  # None: False (eager costs: GPU + host time)


_UNSET = Settings()  # frozen: safe to share as the default
_TIMING: contextvars.ContextVar[bool] = contextvars.ContextVar("fastconv_timing", default=False)


def timing() -> bool:
    """True while benchmark dispatch runs candidates to time them (a backend can skip
    one-off work such as storing a plan that may not be chosen)."""
    return _TIMING.get()


@contextlib.contextmanager
def timing_candidates():
    """The block in which dispatch times candidates (:func:`timing` is True)."""
    token = _TIMING.set(True)
    try:
        yield
    finally:
        _TIMING.reset(token)

_TRANSIENT: contextvars.ContextVar[bool] = contextvars.ContextVar("fastconv_transient",
                                                                  default=False)


def transient() -> bool:
    """True while a graph compiled by torch.compile runs fastconv's ops: their operands may
    be buffers the graph reuses for other values (Inductor's buffer reuse) without moving
    their version counters, so nothing derived from an operand may be kept by its identity
    and version (a packed weight)."""
    return _TRANSIENT.get()


@contextlib.contextmanager
def transient_operands():
    """The block in which :func:`transient` is True (fastconv's custom ops)."""
    token = _TRANSIENT.set(True)
    try:
        yield
    finally:
        _TRANSIENT.reset(token)


_SETTINGS: contextvars.ContextVar[Settings] = contextvars.ContextVar("fastconv_dispatch",
                                                                     default=_UNSET)


@contextlib.contextmanager
def settings(mode: str | None = None, *, deterministic: bool | None = None,
             graph: bool | None = None):
    """Dispatch settings for the calls inside the ``with`` block (this thread / task)::

        with fastconv.dispatch.settings("pinned", deterministic=True):
            y = fastconv.conv2d(x, w)

    ``graph=True``: the calls are made for a CUDA graph (warm-up before a capture, and the
    capture): benchmark dispatch ranks candidates by GPU time alone.
    """
    if mode is not None and mode not in MODES:
        raise ConvError(f"mode: got {mode!r}; allowed: {', '.join(MODES)}")
    outer = _SETTINGS.get()
    token = _SETTINGS.set(Settings(mode if mode is not None else outer.mode,
                                   deterministic if deterministic is not None
                                   else outer.deterministic,
                                   graph if graph is not None else outer.graph))
    try:
        yield
    finally:
        _SETTINGS.reset(token)


def captured() -> Settings:
    """The settings in force (for :func:`restored` in another thread)."""
    return _SETTINGS.get()


@contextlib.contextmanager
def restored(saved: Settings):
    """Run with settings :func:`captured` elsewhere (the backward of a call, on autograd's
    device thread, takes its forward's settings)."""
    token = _SETTINGS.set(saved)
    try:
        yield
    finally:
        _SETTINGS.reset(token)


_ENV: tuple[str | None, bool, bool] | None = None  # FASTCONV_DISPATCH / _DETERMINISTIC


def reload_environment() -> None:
    """Read ``FASTCONV_DISPATCH`` and ``FASTCONV_DETERMINISTIC`` again at the next call.
    They are read once, not per call (two environment reads cost ~2 us of host time per
    call); ``fastconv.functional.clear_plans()`` also calls this. In a running program prefer
    :func:`settings`."""
    global _ENV
    _ENV = None


def _environment() -> tuple[str | None, bool, bool]:
    global _ENV
    if _ENV is None:
        env = os.environ.get("FASTCONV_DISPATCH") or None
        if env is not None and env not in MODES:
            raise ConvError(f"FASTCONV_DISPATCH: got {env!r}; allowed: {', '.join(MODES)}")
        det = os.environ.get("FASTCONV_DETERMINISTIC", "0").strip().lower() in ("1", "true",
                                                                               "yes", "on")
        _ENV = (env, det, False)
    return _ENV


def current() -> tuple[str | None, bool, bool]:
    """(mode set by context or environment or None, deterministic, graph) — part of plan
    keys."""
    s = _SETTINGS.get()
    if s is _UNSET:  # no settings() context: the environment's (read once)
        return _ENV if _ENV is not None else _environment()
    env_mode, env_det, _ = _environment()
    return (s.mode if s.mode is not None else env_mode,
            s.deterministic if s.deterministic is not None else env_det, bool(s.graph))
