"""Fill the plan cache ahead of time: exhaustive tuning of every convolution of a model, a
bench suite or a list of shapes, so that later processes start from tuned choices
(``fastconv tune``).

Each convolution is dispatched once, as a call would dispatch it (the same problem keys:
eager and CUDA-graph rankings from one timing; with ``train`` the forward priced with its
backward, and the backward's data and weight gradients; the calls are made as for a CUDA
graph, since an eager call with autograd runs torch's convolution untimed), with the tuning
budget lifted for the duration. The choices land in the user's plan cache
(``FASTCONV_CACHE_DIR``); ``fastconv plans --export`` moves them to other machines of the
same environment.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import time
from collections.abc import Callable

import torch

from .. import dispatch
from ..errors import ConvError
from ..precision import Precision, parse


def tune_model(model: torch.nn.Module | str, batch: int = 32, size: int = 224,
               precision: str = "bf16", train: bool = False, progress: bool = False) -> dict:
    """Tune every convolution of ``model`` (a module, or a name :func:`build` knows) as
    ``fastconv.optimize`` runs it on a ``(batch, 3, size, size)`` input (``(batch, size,
    d_model)`` for a sequence model of the bench's) in ``precision``
    (channels-last for 16-bit), for inference, or with ``train`` for a training step.
    ``progress``: a bar on stderr, a step per convolution layer. Returns what was done."""
    from ..optimize import optimize

    prec = parse(precision)
    net = build(model) if isinstance(model, str) else model
    if not isinstance(net, torch.nn.Module):
        raise ConvError(f"model: expected a torch.nn.Module or a model name, got "
                        f"{type(model).__name__}")
    half = prec in (Precision.BF16, Precision.FP16)
    from .bench.models import model_input

    x = model_input(model if isinstance(model, str) else "", batch, size, "cuda")
    if half and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    net = net.cuda().train(train)
    opt = optimize(net, "training" if train else "inference", prec.value, channels_last=half)

    layers = [(name, m) for name, m in opt.named_modules()
              if isinstance(m, torch.nn.modules.conv._ConvNd)]

    def step():
        with _bar(len(layers) + (1 if train else 0), "tune", progress) as advance:
            hooks = [m.register_forward_pre_hook(lambda m, args, name=name: advance(name))
                     for name, m in layers] if advance is not None else []
            try:
                if train:
                    out = opt(x)
                    out = out["out"] if isinstance(out, dict) else out
                    if advance is not None:
                        advance("backward")
                    out.float().sum().backward()
                else:
                    with torch.no_grad():
                        opt(x)
            finally:
                for h in hooks:
                    h.remove()
    return _exhaustively(step, what=f"{model if isinstance(model, str) else type(model).__name__}"
                         f" b{batch} {size}x{size} {prec.value}"
                         f" {'training' if train else 'inference'}")


def tune_suite(suite: str, precision: str = "bf16", modes: tuple[str, ...] = ("fwd",),
               progress: bool = False) -> dict:
    """Tune every case of a bench suite (``fastconv bench --list``) in ``precision`` for
    ``modes`` (``fwd``, ``train``, ``eval``, ``dgrad``, ``wgrad``, ``bwd``), through the calls
    the bench times for provider ``fastconv``."""
    from .bench import suites

    return tune_cases(suites.get(suite), precision, modes, f"suite {suite}", progress)


def tune_cases(cases, precision: str = "bf16", modes: tuple[str, ...] = ("fwd",),
               what: str = "cases", progress: bool = False) -> dict:
    """Tune bench cases (``bench.suites.BenchCase``, e.g. from :func:`parse_shape`) for
    ``modes``; ``progress``: a bar on stderr, a step per case and mode."""
    from .bench import runner

    prec = parse(precision)
    layout = "nhwc" if prec in (Precision.BF16, Precision.FP16) else "nchw"
    for mode in modes:
        if mode not in runner.MODES:
            raise ConvError(f"modes: got {mode!r}; allowed: {', '.join(runner.MODES)}")
    runs = [(case, mode) for case in cases for mode in modes if mode != "eval" or case.bn]

    def step():
        with _bar(len(runs), "tune", progress) as advance:
            for case, mode in runs:
                if advance is not None:
                    advance(f"{case.name} {mode}")
                t = runner._input_sets(case, prec, layout, mode)[0]
                runner._call("fastconv", case, prec, t, mode)()
    return _exhaustively(step, what=f"{what} {prec.value} {','.join(modes)}")


#: ``parse_shape``'s options: their types and the BenchCase fields they set
_OPTIONS = {"stride": int, "padding": int, "dilation": int, "groups": int, "bias": bool,
            "activation": str, "transposed": bool, "output_padding": int, "bn": bool,
            "causal": bool}


def parse_shape(spec: str):
    """A convolution from ``INPUT:WEIGHT[:key=value...]``: the input's and the weight's shapes
    as ``x``-separated sizes (``32x64x56x56:128x64x3x3:stride=2:padding=1``; rank 1 with
    three sizes each), the weight laid out as torch's (``(C_out, C_in / groups, *kernel)``;
    transposed: ``(C_in, C_out / groups, *kernel)``), and options named as
    ``torch.nn.functional.conv2d``'s arguments (integers, the same on every side) or
    ``bias``, ``transposed``, ``bn``, ``causal`` (0 or 1), ``activation`` (a name as
    ``fastconv.conv2d`` takes it) and ``output_padding``. Checked as a call would be."""
    from ..epilogue import Epilogue
    from ..problem import ConvProblem
    from .bench.suites import BenchCase

    parts = spec.strip().split(":") if isinstance(spec, str) else []
    if len(parts) < 2:
        raise ConvError(f"shape: got {spec!r}; expected INPUT:WEIGHT[:key=value...], e.g. "
                        f"32x64x56x56:128x64x3x3:stride=2:padding=1")
    x_shape, w_shape = (_sizes(spec, p) for p in parts[:2])
    if len(x_shape) not in (3, 4) or len(w_shape) != len(x_shape):
        raise ConvError(f"shape: got {spec!r}; the input and the weight need 3 sizes each "
                        f"(conv1d) or 4 (conv2d)")
    options = {}
    for part in parts[2:]:
        key, _, value = part.partition("=")
        kind = _OPTIONS.get(key)
        if kind is None or not value:
            raise ConvError(f"shape: got option {part!r} in {spec!r}; allowed: "
                            f"{', '.join(k + '=' for k in _OPTIONS)}")
        if kind is str:
            options[key] = value
        else:
            try:
                number = int(value)
            except ValueError:
                number = -1
            if number < 0 or (kind is bool and number > 1):
                raise ConvError(f"shape: got {part!r} in {spec!r}; {key} takes "
                                + ("0 or 1" if kind is bool else "an integer >= 0"))
            options[key] = bool(number) if kind is bool else number
    groups = options.get("groups", 1)
    if groups < 1:
        raise ConvError(f"shape: got groups={groups} in {spec!r}; groups must be >= 1")
    transposed = options.get("transposed", False)
    c, k = x_shape[1], (w_shape[1] * groups if transposed else w_shape[0])
    case = BenchCase(spec.strip(), x_shape[0], c, k, tuple(x_shape[2:]), tuple(w_shape[2:]),
                     **options)
    if case.weight_shape() != tuple(w_shape):
        raise ConvError(f"shape: got {spec!r}; with {c} input channels and groups={groups} "
                        f"the weight must be {'x'.join(map(str, case.weight_shape()))}")
    meta = {"device": "meta"}
    try:
        ConvProblem.from_tensors(
            torch.empty(x_shape, **meta), torch.empty(w_shape, **meta),
            torch.empty(k, **meta) if case.bias else None, case.stride, case.padding_arg(),
            case.dilation, groups, rank=case.rank, transposed=transposed,
            output_padding=case.output_padding, epilogue=Epilogue(activation=case.activation))
    except ConvError as exc:
        raise ConvError(f"shape: {spec!r}: {exc}") from None
    return case


def _sizes(spec: str, part: str) -> list[int]:
    try:
        sizes = [int(v) for v in part.split("x")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise ConvError(f"shape: got {part!r} in {spec!r}; expected sizes >= 1 joined by "
                        f"'x', e.g. 32x64x56x56")
    return sizes


def read_shapes(path: str) -> list[str]:
    """The shape specs in a file, one a line (blank lines and ``#`` comments skipped)."""
    with open(path, encoding="utf-8") as f:
        return [line.split("#", 1)[0].strip() for line in f
                if line.split("#", 1)[0].strip()]


def build(name: str) -> torch.nn.Module:
    """A model with random weights: a models-suite name (``timm_resnet50``,
    ``tv_convnext_tiny``, ``resnet50``, ``deeplabv3_r50``, ...), ``timm:<name>`` or
    ``torchvision:<name>``, or a Python entry point: ``package.module:function`` or
    ``path/to/file.py:function``, a function called without arguments that returns the
    model."""
    from .bench import models

    if name.startswith("timm:"):
        return models._timm(name[5:])()
    if name.startswith("torchvision:"):
        return models._torchvision(name[12:])()
    if ":" in name:
        return _entry_point(name)
    builder = models.BUILDERS.get(name)
    if builder is None:
        raise ConvError(f"model: got {name!r}; expected one of {', '.join(models.BUILDERS)}, "
                        f"timm:<name> / torchvision:<name>, or an entry point "
                        f"package.module:function / file.py:function")
    return builder()


def _entry_point(name: str) -> torch.nn.Module:
    """The model ``module:function`` (a module name or a ``.py`` file's path) returns."""
    where, _, function = name.rpartition(":")
    try:
        if where.endswith(".py"):
            if not os.path.isfile(where):
                raise FileNotFoundError(f"no file {where}")
            spec = importlib.util.spec_from_file_location(
                os.path.splitext(os.path.basename(where))[0], where)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except Exception as exc:
        raise ConvError(f"model: cannot load {where!r} of entry point {name!r} "
                        f"({type(exc).__name__}: {exc})") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ConvError(f"model: {where!r} has no function {function!r} (entry point "
                        f"{name!r})")
    model = fn()
    if not isinstance(model, torch.nn.Module):
        raise ConvError(f"model: entry point {name!r} returned a {type(model).__name__}, "
                        f"not a torch.nn.Module")
    return model


def _bar(total: int, what: str, on: bool):
    """A progress bar (its ``advance``) where ``on``, else a block that gives None."""
    if not on:
        return contextlib.nullcontext()
    from .progress import Bar

    return Bar(total, what)


def _exhaustively(step: Callable[[], None], what: str) -> dict:
    """``step()`` once with the tuning budget lifted (restored after), in benchmark mode;
    the number of choices it added to the cache and the seconds it took."""
    if not torch.cuda.is_available():
        raise ConvError("tuning times candidates on a CUDA GPU; no GPU found here")
    before, old = len(dispatch.CACHE), dispatch.TUNING
    dispatch.tuning_budget()
    start = time.perf_counter()
    try:
        # as for a CUDA graph: an eager call with autograd would run torch's convolution
        # untimed (plans._eager_native); one timing stores both rankings either way
        with dispatch.settings("benchmark", graph=True):
            step()
        torch.cuda.synchronize()
    finally:
        dispatch.budget.TUNING = old
    return {"what": what, "choices": len(dispatch.CACHE) - before,
            "seconds": time.perf_counter() - start, "cache": dispatch.CACHE.path()}
