"""Choosing a backend and a configuration for a problem.

Two modes for now (the full dispatcher, with a pinned mode, an on-disk cache and
``explain``, is its own issue):

* ``heuristic`` — no timing: rules pick the backend, the backend's first candidate is the
  configuration. The default on the CPU.
* ``benchmark`` — the first time a problem key is seen, every supported backend's
  candidates are timed on the call's own tensors (warm-up, CUDA events, median) and the
  fastest is kept in an in-memory cache. The default on the GPU. aten is always a
  candidate, so this mode is not slower than PyTorch except for timing noise.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Callable
from typing import Any

import torch

from . import backends
from .errors import ConvError, NotSupported
from .problem import ConvProblem

MODES = ("heuristic", "benchmark")
OPS = ("fprop", "dgrad", "wgrad")


@dataclasses.dataclass(frozen=True)
class Choice:
    backend: str
    config: Any
    ms: float | None = None  # measured time in benchmark mode

    def name(self) -> str:
        cfg = getattr(self.config, "name", None)
        return self.backend + (f":{cfg()}" if cfg else "")


_CACHE: dict[tuple[str, str, str], Choice] = {}


def default_mode(problem: ConvProblem) -> str:
    env = os.environ.get("FASTCONV_DISPATCH")
    if env:
        if env not in MODES:
            raise ConvError(f"FASTCONV_DISPATCH: got {env!r}; allowed: {', '.join(MODES)}")
        return env
    return "benchmark" if problem.device == "cuda" else "heuristic"


def supported(problem: ConvProblem) -> dict[str, list[str]]:
    """Every registered backend's reasons for refusing ``problem`` (empty list = supported)."""
    return {name: b.not_supported_reasons(problem) for name, b in backends.REGISTRY.items()}


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
    if backend != "auto":
        cls = backends.get(backend)
        reasons = cls.not_supported_reasons(problem)
        if reasons:
            raise NotSupported(backend, reasons)
        names = [backend]
    else:
        refusals = supported(problem)
        names = [n for n, r in refusals.items() if not r]
        if not names:  # cannot happen while aten is registered, but say why if it does
            detail = "; ".join(f"{n}: {', '.join(r)}" for n, r in refusals.items())
            raise NotSupported("auto", [f"no backend can run {problem.describe()}: {detail}"])
    key = (problem.key(), backend, mode, op)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    if mode == "benchmark" and run is not None and problem.device == "cuda" \
            and not torch.cuda.is_current_stream_capturing():
        choice = _benchmark(problem, names, run, op)
    else:
        name = _rule(problem, names, op)
        choice = Choice(name, backends.REGISTRY[name].candidates(problem, op)[0])
    _CACHE[key] = choice
    return choice


def cached(problem: ConvProblem, backend: str = "auto", mode: str | None = None,
           op: str = "fprop") -> Choice | None:
    """The choice already made for ``problem`` (``None`` if it was never dispatched)."""
    return _CACHE.get((problem.key(), backend, mode or default_mode(problem), op))


def _rule(problem: ConvProblem, names: list[str], op: str) -> str:
    """Heuristic backend pick: aten on the CPU (the interpreter is for tests), else Triton
    when it can fuse an epilogue that torch would run as separate kernels."""
    if len(names) == 1:
        return names[0]
    if op == "fprop" and problem.device == "cuda" and "triton" in names \
            and not problem.epilogue.is_identity and not problem.depthwise:
        return "triton"
    return "aten"


def _benchmark(problem: ConvProblem, names: list[str], run, op: str) -> Choice:
    best: Choice | None = None
    for name in names:
        cls = backends.REGISTRY[name]
        for config in cls.candidates(problem, op):
            try:
                ms = time_ms(lambda cls=cls, config=config: run(cls, config))
            except Exception:  # a config that cannot compile here (e.g. shared memory) is skipped
                continue
            if best is None or ms < best.ms:
                best = Choice(name, config, ms)
    if best is None:
        raise NotSupported("auto", [f"every candidate failed for {problem.describe()}"])
    return best


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


def clear_cache() -> None:
    """Forget every cached choice (tests, or after changing a global setting)."""
    _CACHE.clear()
