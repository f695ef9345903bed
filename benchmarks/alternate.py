"""Rows timed in one process, one call of each per round (the device synchronised around
each call), so that the host's drift between rounds hits every row alike: medians per row and
medians of each round's ratios. Cross-process ratios of an eager training step spread ±10 %
on the GPU host (benchmarks/NOTES.md, issue 22); these resolve a few percent."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator

import torch


def header(script: str) -> str:
    """What a log of these rows was measured on: GPU, versions, the commit."""
    from fastconv.tools.bench import report

    env = report.environment({}, script)
    return (f"{script}: {env['gpu']}, torch {env['torch']}, triton {env['triton']}, "
            f"cuDNN {env['cudnn']}, fastconv {env['git_sha']}")


def training_steps(script: str, names: Iterable[str], rounds: int, precision) -> Iterator:
    """The header lines, then per models-bench case name: ``(name, torch's model, input,
    torch's training step, fastconv's step, the optimized model)``, the models bench's
    steps (forward, backward, SGD) on the GPU."""
    from fastconv.tools.bench import models

    print(header(script))
    print(precision.value, f"{rounds} rounds; ms per training step (median), ratios: median "
          "of each round's")
    cases = {c.name: c for c in models.CASES}
    for name in names:
        case = cases[name]
        torch.manual_seed(0)
        net = models.BUILDERS[case.model]().cuda().train()
        x = torch.randn(case.batch, 3, case.size, case.size, device="cuda")
        torch_step, _ = models.provider_call("torch", net, x, precision, "train")
        fc_step, fc_net = models.provider_call("fastconv", net, x, precision, "train")
        yield name, net, x, torch_step, fc_step, fc_net


def alternate(rows: dict[str, tuple[Callable[[], object], Callable[[], None]]], rounds: int,
              sync: Callable[[], None], warmup: int = 3) -> dict[str, list[float]]:
    """``rows``: name -> (call, set-up run before each of its calls, untimed). Milliseconds
    per call, ``rounds`` per row after ``warmup`` untimed rounds."""
    times: dict[str, list[float]] = {k: [] for k in rows}
    for r in range(rounds + warmup):
        for key, (fn, before) in rows.items():
            before()
            sync()
            start = time.perf_counter()
            fn()
            sync()
            if r >= warmup:
                times[key].append((time.perf_counter() - start) * 1e3)
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in times.items()}


def ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of ``a``'s time over ``b``'s in the same round."""
    return statistics.median(x / y for x, y in zip(times[a], times[b]))
