"""Issue 21's shipped tuning database: each GPU's file holds a choice (the eager and the
CUDA-graph one) for every layer of the tuned bench suites and of the issue's seven models,
under the keys those calls look up. A gap not listed in ``KNOWN_GAPS`` fails; so does a
listed gap that has been filled, so that the list stays true."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

import fastconv
from fastconv import dispatch, plancache
from fastconv.precision import Precision
from fastconv.problem import ConvProblem
from fastconv.tools.bench import runner, suites

FILES = sorted(f for f in os.listdir(plancache.DATABASE_DIR) if f.endswith(".json"))
PRECISIONS = (Precision.BF16, Precision.FP16, Precision.TF32)

#: suite layers a database does not hold yet: (file, suite, precision, mode) -> the cases
#: left out (None: all of them)
KNOWN_GAPS: dict[tuple[str, str, str, str], set[str] | None] = {}

#: the models of issue 21's first-call targets, at the models suite's batch and size
MODELS = (("timm_resnet50", 32, 224), ("resnet50", 64, 224),
          ("timm_mobilenetv3_large_100", 32, 224), ("timm_efficientnet_b0", 32, 224),
          ("timm_convnext_tiny", 32, 224), ("timm_resnext50_32x4d", 32, 224),
          ("deeplabv3_r50", 8, 512))


def _entries(name: str) -> dict:
    with open(os.path.join(plancache.DATABASE_DIR, name), encoding="utf-8") as f:
        return json.load(f)["entries"]


def _held(entries: dict, problem: ConvProblem, op: str = "fprop",
          layouts: tuple[str, ...] = ()) -> bool:
    """Whether the database holds both benchmark-mode choices of ``problem`` on a GPU (in its
    layout or one of ``layouts``)."""
    return any(all(dispatch.store.cache_key(dataclasses.replace(problem, device="cuda", layout=lay),
                                       "auto", "benchmark", op, False, cost) in entries
                   for cost in ("eager", "graph"))
               for lay in (problem.layout, *layouts))


@pytest.mark.parametrize("name", FILES)
def test_every_layer_of_the_tuned_suites(name):
    """The resnet50, depthwise and seed002_conv1d suites, forward and both gradients, in
    bf16, fp16 and tf32, as ``fastconv tune --suite`` calls them."""
    entries = _entries(name)
    missing = {}
    for suite in ("resnet50", "depthwise", "seed002_conv1d"):
        for precision in PRECISIONS:
            layout = "nchw" if precision == Precision.TF32 else "nhwc"  # as tune_cases
            for mode, op in (("fwd", "fprop"), ("dgrad", "dgrad"), ("wgrad", "wgrad")):
                for case in suites.get(suite):
                    t = runner._input_sets(case, precision, layout, mode, device="meta")[0]
                    if not _held(entries, runner._problem(case, precision, mode, t), op):
                        missing.setdefault((name, suite, precision.value, mode),
                                           set()).add(case.name)
    every = {k: {c.name for c in suites.get(k[1])} for k in KNOWN_GAPS}
    assert missing == {k: every[k] if v is None else v for k, v in KNOWN_GAPS.items()
                       if k[0] == name}


def _model_problems(key: str, precision: Precision, monkeypatch) -> list[ConvProblem]:
    """The convolutions ``optimize(model)`` solves in inference: one batch-1 forward on the
    CPU, every problem whose key is asked for recorded."""
    from fastconv.tools.bench import models

    if key.startswith("timm_"):
        pytest.importorskip("timm")
    seen = {}
    real = ConvProblem.key

    def key_of(problem):
        k = real(problem)
        seen[k] = problem
        return k
    half = precision != Precision.TF32
    torch.manual_seed(0)
    net = fastconv.optimize(models.BUILDERS[key]().eval(), "inference", precision.value,
                            channels_last=half)
    x = torch.randn(1, 3, *dict((m, (s, s)) for m, _, s in MODELS)[key])
    monkeypatch.setattr(ConvProblem, "key", key_of)
    with torch.no_grad():
        net(x.contiguous(memory_format=torch.channels_last) if half else x)
    monkeypatch.undo()
    return list(seen.values())


@pytest.mark.parametrize("key", [m for m, _, _ in MODELS])
@pytest.mark.slow_after(2)
def test_every_inference_layer_of_the_first_call_models(key, monkeypatch):
    """Every convolution of the model under ``optimize(model, "inference", precision)`` at
    the models suite's batch and size, in bf16, fp16 and tf32 (the fp16 problems are the
    bf16 ones in fp16: the CPU's fp16 convolutions are slow). A half-precision layer is held
    in either layout: the CPU lays out DeepLab's ASPP concatenation (a channels-last
    tensor beside the upsampled 1x1 pooling branch) as NCHW, and the GPU's fp16 tuning runs
    met it channels-last."""
    pytest.importorskip("torchvision")
    batch = {m: b for m, b, _ in MODELS}[key]
    files = {name: _entries(name) for name in FILES}
    problems = []
    for precision in (Precision.BF16, Precision.TF32):
        found = [dataclasses.replace(p, n=batch)
                 for p in _model_problems(key, precision, monkeypatch)]
        assert found
        problems += found
        if precision == Precision.BF16:
            problems += [dataclasses.replace(p, dtype=torch.float16, precision=Precision.FP16)
                         for p in found]
    for name, entries in files.items():
        missing = [p.key() for p in problems
                   if not _held(entries, p, layouts=("nchw", "nhwc") if p.dtype != torch.float32
                                else ())]
        assert not missing, (name, missing)
