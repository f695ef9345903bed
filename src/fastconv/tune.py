"""Fill the plan cache ahead of time: exhaustive tuning of every convolution of a model or a
bench suite, so that later processes start from tuned choices (``fastconv tune``).

Each convolution is dispatched once, as a call would dispatch it (the same problem keys:
eager and CUDA-graph rankings from one timing; with ``train`` the forward priced with its
backward, and the backward's data and weight gradients), with the tuning budget lifted for
the duration. The choices land in the user's plan cache (``FASTCONV_CACHE_DIR``); ``fastconv
plans --export`` moves them to other machines of the same environment.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from . import dispatch
from .errors import ConvError
from .precision import Precision, parse


def tune_model(model: torch.nn.Module | str, batch: int = 32, size: int = 224,
               precision: str = "bf16", train: bool = False) -> dict:
    """Tune every convolution of ``model`` (a module, or a models-suite name: ``timm_resnet50``,
    ``tv_convnext_tiny``, ``resnet50``, ``deeplabv3_r50``; a ``timm:<name>`` or
    ``torchvision:<name>`` builds that model) as ``fastconv.optimize`` runs it on a
    ``(batch, 3, size, size)`` input in ``precision`` (channels-last for 16-bit), for
    inference, or with ``train`` for a training step. Returns what was done."""
    from .optimize import optimize

    prec = parse(precision)
    net = build(model) if isinstance(model, str) else model
    if not isinstance(net, torch.nn.Module):
        raise ConvError(f"model: expected a torch.nn.Module or a model name, got "
                        f"{type(model).__name__}")
    half = prec in (Precision.BF16, Precision.FP16)
    x = torch.randn(batch, 3, size, size, device="cuda")
    if half:
        x = x.contiguous(memory_format=torch.channels_last)
    net = net.cuda().train(train)
    opt = optimize(net, "training" if train else "inference", prec.value, channels_last=half)

    def step():
        if train:
            out = opt(x)
            out = out["out"] if isinstance(out, dict) else out
            out.float().sum().backward()
        else:
            with torch.no_grad():
                opt(x)
    return _exhaustively(step, what=f"{model if isinstance(model, str) else type(model).__name__}"
                         f" b{batch} {size}x{size} {prec.value}"
                         f" {'training' if train else 'inference'}")


def tune_suite(suite: str, precision: str = "bf16", modes: tuple[str, ...] = ("fwd",)) -> dict:
    """Tune every case of a bench suite (``fastconv bench --list``) in ``precision`` for
    ``modes`` (``fwd``, ``train``, ``eval``, ``dgrad``, ``wgrad``, ``bwd``), through the calls
    the bench times for provider ``fastconv``."""
    from .bench import runner, suites

    prec = parse(precision)
    layout = "nhwc" if prec in (Precision.BF16, Precision.FP16) else "nchw"
    calls = []
    for case in suites.get(suite):
        for mode in modes:
            if mode not in runner.MODES:
                raise ConvError(f"modes: got {mode!r}; allowed: {', '.join(runner.MODES)}")
            if mode == "eval" and not case.bn:
                continue
            t = runner._input_sets(case, prec, layout, mode)[0]
            calls.append(runner._call("fastconv", case, prec, t, mode))

    def step():
        for call in calls:
            call()
    return _exhaustively(step, what=f"suite {suite} {prec.value} {','.join(modes)}")


def build(name: str) -> torch.nn.Module:
    """A model by name (see :func:`tune_model`), with random weights."""
    from .bench import models

    if name.startswith("timm:"):
        return models._timm(name[5:])()
    if name.startswith("torchvision:"):
        return models._torchvision(name[12:])()
    builder = models.BUILDERS.get(name)
    if builder is None:
        raise ConvError(f"model: got {name!r}; expected one of {', '.join(models.BUILDERS)}, "
                        f"or timm:<name> / torchvision:<name>")
    return builder()


def _exhaustively(step: Callable[[], None], what: str) -> dict:
    """``step()`` once with the tuning budget lifted (restored after), in benchmark mode;
    the number of choices it added to the cache and the seconds it took."""
    if not torch.cuda.is_available():
        raise ConvError("tuning times candidates on a CUDA GPU; no GPU found here")
    before, old = len(dispatch.CACHE), dispatch.TUNING
    dispatch.tuning_budget()
    start = time.perf_counter()
    try:
        with dispatch.settings("benchmark"):
            step()
        torch.cuda.synchronize()
    finally:
        dispatch.TUNING = old
    return {"what": what, "choices": len(dispatch.CACHE) - before,
            "seconds": time.perf_counter() - start, "cache": dispatch.CACHE.path()}
