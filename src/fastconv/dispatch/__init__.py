"""Choosing a backend and a configuration for a problem.

Modes (``settings(mode)``, ``FASTCONV_DISPATCH``, or benchmark on a GPU, heuristic on the
CPU):

* ``heuristic``: no timing; rules pick the backend (``policy.rule``) and its first
  candidate.
* ``benchmark``: the first time a problem key is seen, the supported candidates (aten, Triton
  tiles, cuDNN plans) are timed on the call's own tensors (``timing``): GPU and host time per
  call, and GPU time replayed from a CUDA graph over operand copies larger than the L2 cache.
  Eager calls take the least GPU + host cost, calls made for a CUDA graph
  (``settings(graph=True)``) the least GPU cost; both choices are stored from one timing.
  aten is always a candidate, so this mode is not slower than PyTorch except for timing
  noise. Timing runs in order of promise within the tuning budget (``budget``): a backend's
  candidates are pruned by its cost model, Triton tiles compile in worker processes, and
  candidates left building are timed once built (``upgrades``), their best stored then. A
  candidate whose first reading (two calls) shows it cannot win is not timed further.
* ``pinned``: what ``pin()`` fixed for a problem (the heuristic's choice otherwise).

``deterministic=True`` (``FASTCONV_DETERMINISTIC=1``) keeps only candidates that give
bitwise-repeatable results. Choices live in ``store.CACHE``: a memory LRU, the user's disk
store (a new process skips the timing) and the shipped tuning database (``adopt``: its
kernels build in the background while aten runs). ``explain`` shows every candidate with its
refusal or time. Thread-safe: concurrent first calls of one key time it once.

The package: ``choices`` (choose, pin, cached, clear), ``policy`` (rules without timing),
``timing``, ``budget``, ``upgrades`` (choices waiting on builds), ``store`` (cache, keys,
codec), ``explanation``.
"""

from __future__ import annotations

from ..context import (  # noqa: F401 (the settings' public names, re-exported)
    MODES,
    Settings,
    captured,
    current,
    reload_environment,
    restored,
    settings,
)
from . import budget, choices, explanation, policy, store, timing, upgrades  # noqa: F401
from .budget import DEFAULT_BUDGET, TuningBudget, parse_budget, tuning_budget  # noqa: F401
from .choices import OPS, cached, choose, clear, pin  # noqa: F401
from .explanation import Explanation, explain  # noqa: F401
from .policy import default_mode, supported  # noqa: F401
from .store import Choice  # noqa: F401
from .timing import BUDGET_NOTE, PRUNED_NOTE, Row  # noqa: F401
from .upgrades import building, finish_builds  # noqa: F401


def __getattr__(name: str):
    """``TUNING`` (the process's budget, ``budget.TUNING``) and ``CACHE`` (the choices,
    ``store.CACHE``), read where they live now: ``tuning_budget`` replaces the budget."""
    if name == "TUNING":
        return budget.TUNING
    if name == "CACHE":
        return store.CACHE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
