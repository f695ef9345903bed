"""Timing convolutions on the GPU: providers, rotating inputs, CUDA events, medians.

Each (case, provider) is timed twice after a warm-up that includes any compilation and
autotuning: eagerly, the way triton.testing.do_bench does it (a CUDA event pair around every
call, no synchronisation between calls, the median of ``reps``; host overhead included when
the host is the bottleneck), and as replays of a CUDA graph of the same calls (GPU time
alone: ``graph_ms_p50``). torch.compile rows exclude compilation and report its duration
(``compile_s``, the first call). Small problems rotate over several
input sets whose total size exceeds the L2 cache, so the cache cannot flatter them. Inputs
are random normal values, never zeros.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ... import costs, dispatch, functional
from ...epilogue import Epilogue
from ...precision import DTYPE, Precision, relative_error
from ...problem import ConvProblem
from .suites import BenchCase
from .timers import (  # noqa: F401 (the bench's timers, re-exported for their users)
    GpuTimer,
    cuda_core_tflops,
    measure_ceilings,
    percentiles,
    restore_cudnn_flags,
    time_calls,
    time_graph,
    time_host,
    torch_cudnn_flags,
)

#: fwd: the forward; bwd: data + weight gradient of a saved forward (autograd); train:
#: forward + backward; dgrad / wgrad: one gradient alone, as a direct call (non-transposed
#: cases), to compare the kernels with cuDNN's.
MODES = ("fwd", "bwd", "train", "dgrad", "wgrad", "eval")

PROVIDERS = ("fastconv", "fastconv_triton", "fastconv_aten", "cudnn_fe", "torch",
             "torch_compile")
#: fastconv providers: the backend each one forces (cudnn_fe: the cuDNN frontend graphs
#: used directly, its fastest plan).
BACKEND_OF = {"fastconv": "auto", "fastconv_triton": "triton", "fastconv_aten": "aten",
              "cudnn_fe": "cudnn"}


def unavailable(provider: str) -> str:
    """Why ``provider`` cannot run here ("" if it can)."""
    if provider in BACKEND_OF and provider != "fastconv":
        from ... import backends

        ok, why = backends.get(BACKEND_OF[provider]).available()
        return "" if ok else why
    return ""


def _input_sets(case: BenchCase, precision: Precision, layout: str, mode: str,
                device: str = "cuda") -> list[dict]:
    dtype = DTYPE[precision]
    one = (case.n * case.c * math.prod(case.spatial) + math.prod(case.weight_shape())) * \
        torch.empty((), dtype=dtype).element_size()
    count = costs.rotation_count(one) if device == "cuda" else 1
    grad = mode in ("bwd", "train")
    channels_last = layout == "nhwc" and case.rank == 2
    sets = []
    for _ in range(count):
        x = torch.randn(case.n, case.c, *case.spatial, device=device).to(dtype)
        fan_in = math.prod(case.weight_shape()[1:])
        w = (torch.randn(case.weight_shape(), device=device) / fan_in**0.5).to(dtype)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
            w = w.contiguous(memory_format=torch.channels_last)
        b = torch.randn(case.k, device=device).to(dtype) if case.bias else None
        t = dict(x=x.requires_grad_(grad), w=w.requires_grad_(grad),
                 b=b.requires_grad_(grad) if b is not None else None, bn=None)
        wrt = [t["x"], t["w"], t["b"]]
        if case.bn:  # γ, β and running statistics, float32 as BatchNorm keeps them
            t["bn"] = dict(gamma=(torch.rand(case.k, device=device) + 0.5).requires_grad_(grad),
                           beta=torch.randn(case.k, device=device).requires_grad_(grad),
                           mean=torch.randn(case.k, device=device) / 10,
                           var=torch.rand(case.k, device=device) + 0.5,
                           training=mode != "eval")
            wrt += [t["bn"]["gamma"], t["bn"]["beta"]]
        t["wrt"] = tuple(v for v in wrt if v is not None)
        sets.append(t)
    shape = _problem(case, precision, mode, sets[0]).output_shape()
    for t in sets:  # the output gradient, in the layout autograd would give it
        g = torch.randn(shape, device=device).to(dtype)
        t["g"] = g.contiguous(memory_format=torch.channels_last) if channels_last else g
    return sets


def _problem(case: BenchCase, precision: Precision, mode: str, t: dict) -> ConvProblem:
    """The problem fastconv's forward solves on the input set ``t``: in eval a BatchNorm is
    folded into the weights and a bias; in training the convolution is bare."""
    epilogue, bias = Epilogue(activation=case.activation, has_shift=case.bias), t["b"]
    if case.bn:
        bias = torch.ones(case.k, device=t["x"].device).to(DTYPE[precision]) \
            if mode == "eval" else None
        epilogue = Epilogue(activation=case.activation, has_shift=True) if mode == "eval" \
            else Epilogue()
    return ConvProblem.from_tensors(
        t["x"], t["w"], bias, case.stride, case.padding_arg(), case.dilation, case.groups,
        rank=case.rank, transposed=case.transposed, output_padding=case.output_padding,
        precision=precision.value, epilogue=epilogue)


def _geometry(case: BenchCase) -> tuple:
    if case.transposed:
        return (case.stride, case.padding, case.output_padding, case.groups, case.dilation)
    return (case.stride, case.padding_arg(), case.dilation, case.groups)


def _torch_conv(case: BenchCase):
    """conv -> add bias -> activation (or conv -> batch_norm -> activation), as a PyTorch user
    writes it: ``f(x, w, b, bn)``."""
    if case.transposed:
        tconv = F.conv_transpose1d if case.rank == 1 else F.conv_transpose2d
    else:
        tconv = F.conv1d if case.rank == 1 else F.conv2d
    geo = _geometry(case)
    if case.causal:  # torch pads symmetrically only: pad the input itself
        geo = (case.stride, 0, case.dilation, case.groups)
    ep = Epilogue(activation=case.activation)

    def run(x, w, b, bn=None):
        if case.causal:
            x = F.pad(x, (case.dilation * (case.kernel[0] - 1), 0))
        y = tconv(x, w, None, *geo)
        if bn is not None:
            y = F.batch_norm(y, bn["mean"], bn["var"], bn["gamma"], bn["beta"], bn["training"])
            return ep.apply(y)
        if b is None and case.activation == "none":
            return y
        return ep.apply(y, shift=b)
    return run


def _forward(provider: str, case: BenchCase, precision: Precision, compiled: dict):
    """``f(x, w, b) -> y`` for ``provider``."""
    if provider == "torch":
        return _torch_conv(case)
    if provider == "torch_compile":  # one compiled function shared by every input set
        return compiled.setdefault("fn", torch.compile(_torch_conv(case), dynamic=False))
    if case.transposed:
        conv = functional.conv_transpose1d if case.rank == 1 else functional.conv_transpose2d
    else:
        conv = functional.conv1d if case.rank == 1 else functional.conv2d
    geo = _geometry(case)
    backend = BACKEND_OF[provider]
    if case.bn:
        fused = functional.conv_bn_act1d if case.rank == 1 else functional.conv_bn_act2d
        return lambda x, w, b, bn: fused(
            x, w, b, bn["mean"], bn["var"], bn["gamma"], bn["beta"], *geo,
            training=bn["training"], activation=case.activation, backend=backend,
            precision=precision.value)
    return lambda x, w, b, bn=None: conv(x, w, b, *geo, activation=case.activation,
                                         backend=backend, precision=precision.value)


def _eval_modules(provider: str, case: BenchCase, precision: Precision, t: dict,
                  compiled: dict) -> torch.nn.Module:
    """Inference as users run it (under ``torch.no_grad``): torch's ``Sequential(Conv,
    BatchNorm, activation)`` in eval mode (``torch``; ``torch_compile`` compiles the first
    set's once) or the fastconv ``ConvBNAct`` built from it, holding the input set's values
    (BatchNorm in float32, as the functional rows keep it)."""
    from ...nn import fused

    if case.transposed or case.causal or case.bias:
        raise ValueError(f"eval rows run Conv -> BatchNorm -> activation modules; "
                         f"{case.name} is not such a layer")
    conv = (torch.nn.Conv1d if case.rank == 1 else torch.nn.Conv2d)(
        case.c, case.k, case.kernel, case.stride, case.padding, case.dilation, case.groups,
        bias=False)
    bn = (torch.nn.BatchNorm1d if case.rank == 1 else torch.nn.BatchNorm2d)(case.k)
    seq = torch.nn.Sequential(conv, bn, fused._torch_activation(case.activation, 0.01))
    seq = seq.to(t["w"].device).eval()
    with torch.no_grad():
        conv.weight.data = t["w"].detach().clone()
        bn.weight.copy_(t["bn"]["gamma"])
        bn.bias.copy_(t["bn"]["beta"])
        bn.running_mean.copy_(t["bn"]["mean"])
        bn.running_var.copy_(t["bn"]["var"])
    if provider == "torch":
        return seq
    if provider == "torch_compile":
        compiled.setdefault("module", seq)  # the first set's values: compiled once
        return compiled.setdefault("fn", torch.compile(compiled["module"], dynamic=False))
    cls = fused.ConvBNAct1d if case.rank == 1 else fused.ConvBNAct2d
    module = cls.from_torch(seq, backend=BACKEND_OF[provider], precision=precision.value)
    if t["w"].dim() == 4 and t["w"].is_contiguous(memory_format=torch.channels_last):
        module = module.to(memory_format=torch.channels_last)
    return module


def _gradient(provider: str, case: BenchCase, precision: Precision, mode: str,
              compiled: dict):
    """``f(g, x, w) -> dx`` (mode dgrad) or ``-> dw`` (wgrad) for ``provider``."""
    from ... import ops

    if case.transposed or case.causal:
        raise ValueError(f"mode {mode} times a convolution's gradient with symmetric padding; "
                         f"{case.name} is {'transposed' if case.transposed else 'causal'} "
                         "(use bwd)")
    r = case.rank
    stride, pad, dil = [case.stride] * r, [case.padding] * r, [case.dilation] * r
    mask = [mode == "dgrad", mode == "wgrad", False]
    index = 0 if mode == "dgrad" else 1
    if provider in ("torch", "torch_compile"):
        def fn(g, x, w):
            return torch.ops.aten.convolution_backward(g, x, w, None, stride, pad, dil, False,
                                                       [0] * r, case.groups, mask)[index]
        if provider == "torch_compile":
            return compiled.setdefault("fn", torch.compile(fn, dynamic=False))
        return fn
    backend = BACKEND_OF[provider]
    # What a training step's backward runs (plans.ConvFunction), without the custom-op wrapper.
    op = ops.input_grad_impl if mode == "dgrad" else ops.weight_grad_impl
    return lambda g, x, w: op(g, x, w, stride, pad, pad, dil, case.groups, backend,
                              precision.value)


def _call(provider: str, case: BenchCase, precision: Precision, t: dict, mode: str,
          compiled: dict | None = None) -> Callable[[], object]:
    """The timed call: the forward (``fwd``), the backward of one saved forward with the
    same output gradient every time (``bwd``), forward + backward (``train``), or one
    gradient alone (``dgrad``, ``wgrad``)."""
    compiled = {} if compiled is None else compiled
    if mode in ("dgrad", "wgrad"):
        grad = _gradient(provider, case, precision, mode, compiled)
        return lambda: grad(t["g"], t["x"], t["w"])
    if mode == "eval" and case.bn:
        module = _eval_modules(provider, case, precision, t, compiled)

        def infer():
            with torch.no_grad():  # inference, as it is run
                return module(t["x"])
        return infer
    fwd = _forward(provider, case, precision, compiled)
    if mode in ("fwd", "eval"):
        return lambda: fwd(t["x"], t["w"], t["b"], t["bn"])
    if mode == "train":
        def step():
            y = fwd(t["x"], t["w"], t["b"], t["bn"])
            return (y, *torch.autograd.grad(y, t["wrt"], t["g"]))
        return step
    y = fwd(t["x"], t["w"], t["b"], t["bn"])
    return lambda: torch.autograd.grad(y, t["wrt"], t["g"], retain_graph=True)


def _memory(step: Callable[[], object], forward: Callable[[], object]) -> dict:
    """Peak memory of one training step above what was allocated before it (``peak_mb``)
    and the bytes the forward saves for backward (``saved_mb``: distinct storages caught by
    autograd's saved-tensor hooks, inputs and parameters included)."""
    out: dict = {}
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    out["peak_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            forward()
        out["saved_mb"] = sum(seen.values()) / 2**20
    except Exception as exc:  # a compiled forward may not accept the hooks
        out["saved_mb"] = None
        out["saved_note"] = f"{type(exc).__name__}: {exc}"[:120]
    return out


def _reference(case: BenchCase, t: dict, mode: str) -> tuple[torch.Tensor, ...]:
    """float64 results to compare against: the output, and for bwd/train the gradients."""
    grad = mode not in ("fwd", "eval")
    f64 = {k: v.detach().to(torch.float64).requires_grad_(grad)
           for k, v in t.items() if isinstance(v, torch.Tensor) and k != "g"}
    bn = None
    if t["bn"] is not None:  # copies: the reference's running-statistics update stays here
        bn = {k: (v.detach().to(torch.float64).requires_grad_(grad and k in ("gamma", "beta"))
                  if isinstance(v, torch.Tensor) else v) for k, v in t["bn"].items()}
    if mode in ("dgrad", "wgrad"):  # the bare convolution's gradient
        f64.pop("b", None)
        bn = None
        case = dataclasses.replace(case, bias=False, activation="none", bn=False)
    with torch.enable_grad():
        y = _torch_conv(case)(f64["x"], f64["w"], f64.get("b"), bn)
        if mode in ("fwd", "eval"):
            return (y.detach(),)
        wrt = tuple(f64[k] for k in ("x", "w", "b") if k in f64)
        if bn is not None:
            wrt += (bn["gamma"], bn["beta"])
        grads = torch.autograd.grad(y, wrt, t["g"].to(torch.float64))
    if mode == "dgrad":
        return grads[:1]
    if mode == "wgrad":
        return grads[1:2]
    return ((y.detach(), *grads) if mode == "train" else grads)


def _as_tuple(result) -> tuple[torch.Tensor, ...]:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _mode_cost(problem: ConvProblem, mode: str) -> tuple[int, int]:
    """(FLOP, minimum bytes) of ``mode``: the backward is a data and a weight gradient, each
    with the forward's FLOP, reading dy, x and w once and writing dx and dw once."""
    fwd_flops, fwd_bytes = problem.flops(), problem.min_bytes()
    item = torch.empty((), dtype=problem.dtype).element_size()
    x = math.prod(problem.input_shape())
    w = math.prod(problem.weight_shape())
    y = math.prod(problem.output_shape())
    bwd_bytes = item * (2 * x + 2 * w + y)
    if mode in ("fwd", "eval"):
        return fwd_flops, fwd_bytes
    if mode == "dgrad":  # read dy and w, write dx
        return fwd_flops, item * (y + w + x)
    if mode == "wgrad":  # read dy and x, write dw
        return fwd_flops, item * (y + x + w)
    if mode == "bwd":
        return 2 * fwd_flops, bwd_bytes
    return 3 * fwd_flops, fwd_bytes + bwd_bytes


def _choices(problem: ConvProblem, backend: str, mode: str) -> str:
    """What dispatch picked for each operation the mode ran (eagerly; ``graph:`` the choice
    for a CUDA graph where that differs)."""
    parts = []
    if mode in ("fwd", "train", "eval"):
        hit = dispatch.cached(problem, backend, grad=mode == "train")
        parts.append(hit.name() if hit else "?")
        with dispatch.settings(graph=True):
            graphed = dispatch.cached(problem, backend, grad=mode == "train")
        if graphed is not None and (hit is None or graphed.name() != hit.name()):
            parts.append(f"graph:{graphed.name()}")
    if mode == "train" and hit is not None and hit.backend == "aten" and hit.config is None:
        parts.append("backward=torch-autograd")  # a native plan (plans._native)
    elif mode not in ("fwd", "eval"):
        bare = dataclasses.replace(problem.conv_equivalent(), epilogue=Epilogue())
        dgrad_op = "fprop" if problem.transposed else "dgrad"
        ops = (("dgrad", dgrad_op), ("wgrad", "wgrad"))
        if mode in ("dgrad", "wgrad"):
            ops = tuple(o for o in ops if o[0] == mode)
        for label, op in ops:
            hit = dispatch.cached(bare, backend, op=op)
            # never dispatched: the forward ran on aten and torch's autograd did the backward
            parts.append(f"{label}={hit.name() if hit else 'torch-autograd'}")
            with dispatch.settings(graph=True):
                graphed = dispatch.cached(bare, backend, op=op)
            if graphed is not None and hit is not None and graphed.name() != hit.name():
                parts.append(f"graph:{label}={graphed.name()}")
    return " ".join(parts)


def run_case(case: BenchCase, providers: list[str], precision: Precision, layout: str,
             reps: int = 50, device: str = "cuda", timer=None, mode: str = "fwd",
             host: bool = False) -> list[dict]:
    """Rows (DESIGN.md §7) for one case and every provider, measured in this process.

    ``timer`` (default: :class:`GpuTimer` on the GPU, none on the CPU) has ``eager(fns, reps)``
    and ``graph(fns)``; without one the rows carry errors only, marked ``timing: "not
    measured"``. ``mode`` is one of ``MODES``; the error of bwd/train rows is the largest
    relative error of the output and the gradients. ``host``: also the host microseconds
    per call (:func:`time_host`; ``host_us_p50``, the median of its rounds, and the rounds in
    ``host_us``), measured on the CPU too.
    """
    if timer is None and device == "cuda":
        timer = GpuTimer()
    sets = _input_sets(case, precision, layout, mode, device)
    problem = _problem(case, precision, mode, sets[0])
    ref = _reference(case, sets[0], mode)
    flops, min_bytes = _mode_cost(problem, mode)
    rows = []
    cudnn_flags = torch_cudnn_flags(precision)
    try:
        ready = {}  # provider -> (row, its calls); the others' rows carry their error
        for provider in providers:
            row = dict(case=case.name, provider=provider, precision=precision.value,
                       mode=mode, layout=layout, flops=flops, min_bytes=min_bytes,
                       cuda_cores=problem.depthwise)
            rows.append(row)
            compiled: dict = {}
            try:
                fns = [_call(provider, case, precision, t, mode, compiled) for t in sets]
                start = time.perf_counter()
                first = fns[0]()  # compiles, autotunes or dispatches: kept out of the timing
                if provider == "torch_compile":
                    if device == "cuda":
                        torch.cuda.synchronize()
                    row["compile_s"] = time.perf_counter() - start
                row["rel_err"] = max(relative_error(a, b) for a, b in zip(_as_tuple(first), ref))
                diff = (_as_tuple(first)[0].detach().double() - ref[0]).abs()
                row["max_err"], row["mean_err"] = float(diff.max()), float(diff.mean())
            except Exception as exc:  # an unsupported provider is reported, not fatal
                row["error"] = f"{type(exc).__name__}: {exc}"
                continue
            ready[provider] = (row, fns, compiled)
        eager = timer.eager_rounds({p: v[1] for p, v in ready.items()}, reps) \
            if timer is not None and ready else {}
        for provider, (row, fns, compiled) in ready.items():
            try:
                if timer is not None:
                    p50, p20, p80 = percentiles(eager[provider])
                    # Autograd rows (bwd, train) are timed eagerly only: a backward replayed
                    # on a saved autograd graph cannot be captured, and a failed capture of a
                    # train step left the CUDA generator unusable for the next case (H200,
                    # torch 2.11). Direct calls (fwd, dgrad, wgrad) are also graph-timed.
                    graph = timer.graph(fns) if mode in ("fwd", "dgrad", "wgrad", "eval") \
                        else None
                    row.update(ms_p50=p50, ms_p20=p20, ms_p80=p80, tflops=flops / p50 / 1e9,
                               gbps=min_bytes / p50 / 1e6,
                               graph_ms_p50=statistics.median(graph) if graph else None)
                else:
                    row.update(ms_p50=None, ms_p20=None, ms_p80=None, tflops=None, gbps=None,
                               graph_ms_p50=None, timing="not measured (no GPU)")
                if host:
                    row["host_us"] = time_host(fns)
                    row["host_us_p50"] = statistics.median(row["host_us"])
                if mode == "train" and device == "cuda":
                    row.update(_memory(fns[0], _call(provider, case, precision, sets[0], "fwd",
                                                     compiled)))
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"
                continue
            if provider.startswith("fastconv"):
                backend = "auto" if provider == "fastconv" else provider.split("_", 1)[1]
                row["choice"] = _choices(problem, backend, mode)
    finally:
        restore_cudnn_flags(cudnn_flags)
    return rows
