"""Where choices are kept: the cache (memory, the user's disk store, the shipped tuning
database), its keys, and the codec between a :class:`Choice` and a stored entry. Entries come
from files anyone may have written, so each is validated when it is read (:func:`decode`)."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

from .. import backends, plancache
from ..problem import ConvProblem
from . import budget


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
        return self.backend + config_suffix(self.config)


def config_suffix(config) -> str:
    if config is None:
        return ""
    cfg = getattr(config, "name", None)
    return f":{cfg()}" if callable(cfg) else f":{config}"


#: The choices: memory LRU, the user's disk store, the shipped tuning database.
CACHE = plancache.PlanCache(database=True)


def cache_key(problem: ConvProblem, backend: str, mode: str, op: str, det: bool,
              cost: str = "") -> str:
    key = f"{problem.key()}|{op}|{backend}|{mode}|{'det' if det else 'any'}"
    return f"{key}|{cost}" if mode == "benchmark" else key


def cost_name(graph: bool, grad: bool) -> str:
    """What benchmark mode ranks by: GPU time for a CUDA graph, GPU + host time eagerly;
    ``+grad``: a forward whose backward follows (timed with it)."""
    return ("graph" if graph else "eager") + ("+grad" if grad else "")


def decode(entry: Any, problem: ConvProblem, op: str, names: list[str],
           key: str | None = None) -> Choice | None:
    """A stored entry as a Choice for ``problem``, or None. Entries come from a file anyone
    may have written: the backend must be one of ``names`` (available and supporting the
    problem) and its configuration must pass the backend's ``config_errors``. With ``key``
    a refused entry is dropped from the memory cache with a warning (the caller decides
    again)."""
    try:
        name = entry["backend"]
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


def encode(choice: Choice, partial: bool = False) -> dict:
    cls = backends.REGISTRY[choice.backend]
    entry = {"backend": choice.backend, "config": cls.encode_config(choice.config),
             "ms": choice.ms, "gpu_ms": choice.gpu_ms, "host_ms": choice.host_ms,
             "graph_ms": choice.graph_ms}
    if partial:  # some candidates left untimed by the tuning budget
        entry["partial"] = True
    return entry


def usable(hit: dict | None) -> bool:
    """Whether a stored entry answers now: exhaustive tuning times a problem tuned within a
    budget (or taken from the tuning database) again."""
    return hit is not None and not (budget.TUNING.exhaustive and hit.get("partial"))
