"""``fastconv bench --suite models --layer-check``: every convolution a CUDA-graph step of
an optimized model runs, against torch's own choice for the same call, in graph time.

Per case, precision and mode: the model goes through ``optimize(..., cuda_graph=True)`` and
runs a step (``train``: forward, backward and the SGD step; ``eval``: a forward); the
kernels it left building finish, and it runs again, so every choice is the final one. Each
plan that step made under CUDA-graph settings (forwards with their fused epilogue, data
and weight gradients: ``plans.cached_plans``) is then run alone, on random operands of
the call's shapes, strides and dtype (the strides of the step's own operands: cuDNN
reads those of size-1 dimensions too, and mobilenet_v3's squeeze-excite gradients ran 1.6x
slower on the step's mixed strides than on the layout's), two ways. (Left out: provisional
stand-ins whose builds are done, which the next lookup replaces and the graph's capture
did; a row ``stale_plans`` counts them.)

* **fastconv**: the plan the model runs (its backend and configuration);
* **torch**: aten's plan of the same problem: ``F.conv`` with cuDNN's searched algorithm
  (cudnn.benchmark, as the models suite runs torch), and torch's own ops for a fused
  epilogue (bias, folded BatchNorm, residual, activation): what torch runs for that call.

A training step's forwards are chosen with their backward (dispatch times each candidate
through autograd): their rows (op ``layer``) time the forward and backward together,
fastconv's through its functional call under the same settings (the model's choices for
the forward, data and weight gradients) and torch's through autograd on aten's ops; the
step's data- and weight-gradient plans also get rows of their own.

Each is captured ``CALLS`` times in a CUDA graph, twice: on the same operands every call
(``same``: what stays in the L2 cache stays, as a layer's input just written by the layer
before it) and rotating over operand copies larger than the L2 cache (``cold``: how
dispatch times a candidate). The graphs are replayed alternately, ``ROUNDS`` times; each
row has the median GPU time per call and ``ratio = torch / fastconv`` for both (≥ 1:
fastconv's choice as fast or faster). A choice of aten itself gives the same kernels and a
ratio of 1 up to noise.

The check of issue 54: every row ≥ 0.98 (``BAR``).
"""

from __future__ import annotations

import dataclasses
import json
import statistics

import torch

from ... import backends, dispatch, plans
from ...costs import generator_released_on_failure, rotation_count
from ...epilogue import Epilogue
from ...precision import Precision
from ...problem import ConvProblem, layout_strides
from .timers import restore_cudnn_flags, torch_cudnn_flags

#: graph calls per replay, replays per provider (alternating), and the check's bar
CALLS, ROUNDS, BAR = 16, 15, 0.98


def operands(problem: ConvProblem, op: str, device, strides: tuple | None = None) -> tuple:
    """Random operands of ``problem``'s ``op`` as its plan's ``run`` takes them: forward
    ``(input, weight, bias, scale, shift, residual, out)``, dgrad ``(grad_out, weight,
    out)``, wgrad ``(grad_out, input, out)``; in the problem's dtype, with ``strides``
    (``plans.cached_plans``': those of the step's own operands; cuDNN reads the strides of
    size-1 dimensions too, so the problem's layout is not enough) or the layout's."""
    given = iter(strides or ())

    def rand(shape):
        stride = next(given, None)
        if stride is None or any(st == 0 and n > 1 for n, st in zip(shape, stride)):
            stride = layout_strides(shape, problem.layout)  # (an expanded operand: dense)
        t = torch.empty_strided(shape, stride, dtype=problem.dtype, device=device)
        return t.normal_()

    def vec():
        return torch.randn(problem.k, dtype=problem.dtype, device=device)

    # (each operand made in ``strides``' order: a tuple's items are made left to right)
    if op == "dgrad":
        return rand(problem.output_shape()), rand(problem.weight_shape()), None
    if op == "wgrad":
        return rand(problem.output_shape()), rand(problem.input_shape()), None
    ep = problem.epilogue
    input = rand(problem.input_shape())
    weight = rand(problem.weight_shape())
    residual = rand(problem.output_shape()) if ep.has_residual else None
    return (input, weight, vec() if ep.has_shift else None, vec() if ep.has_scale else None,
            None, residual, None)


def torch_run(problem: ConvProblem, op: str):
    """aten's plan of ``problem``'s ``op``: the torch ops torch itself runs for the call."""
    cls = backends.REGISTRY["aten"]
    if op == "fprop":
        return plans.bound_forward(problem, cls, None)
    return cls.bind(problem, None, op)


def layer_runs(problem: ConvProblem, need_input: bool) -> tuple:
    """(fastconv's, torch's) forward + backward of a training layer's convolution (a
    forward chosen with its backward, ``grad``) through autograd, each
    ``run(input, weight, bias, scale, shift, residual, grad_out)`` giving the gradients of
    the input (where ``need_input``), weight and bias: fastconv's functional call (the
    model's choices: the same problem under the same settings) and aten's torch ops."""
    from ... import functional

    if problem.transposed:
        raise ValueError("a transposed convolution's layer is not measured")
    conv = functional.conv2d if problem.rank == 2 else functional.conv1d
    ep = problem.epilogue
    padding = tuple(zip(problem.pad_pre, problem.pad_post))
    ref = torch_run(problem, "fprop")

    def grads(y, input, weight, bias, grad_out):
        wrt = [t for t in (input if need_input else None, weight, bias) if t is not None]
        return torch.autograd.grad(y, wrt, grad_out)

    def fast(input, weight, bias, scale, shift, residual, grad_out):
        y = conv(input, weight, bias, problem.stride, padding, problem.dilation,
                 problem.groups, activation=ep.activation, negative_slope=ep.negative_slope,
                 residual=residual, scale=scale, shift=shift)
        return grads(y, input, weight, bias, grad_out)

    def slow(input, weight, bias, scale, shift, residual, grad_out):
        return grads(ref(input, weight, bias, scale, shift, residual, None), input, weight,
                     bias, grad_out)
    return fast, slow


def layer_operands(problem: ConvProblem, need_input: bool, device,
                   strides: tuple | None = None) -> tuple:
    """The forward's operands (``operands``), those autograd differentiates marked so, and
    a random output gradient in place of ``out``."""
    args = list(operands(problem, "fprop", device, strides))
    args[0].requires_grad_(need_input)
    args[1].requires_grad_(True)
    if args[2] is not None:
        args[2].requires_grad_(True)
    shape = problem.output_shape()
    grad_out = torch.empty_strided(shape, layout_strides(shape, problem.layout),
                                   dtype=problem.dtype, device=device).normal_()
    return (*args[:6], grad_out)


def graph_of(run, sets: list[tuple], calls: int = CALLS) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` calls of ``run`` cycling through the operand ``sets``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for args in sets:  # warm-up (cuDNN's search, lazy state) outside the capture
            run(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with generator_released_on_failure(), torch.cuda.graph(graph):
        for i in range(calls):
            run(*sets[i % len(sets)])
    graph.replay()
    return graph


def replay_alternately(graphs: dict, rounds: int = ROUNDS, calls: int = CALLS) -> dict:
    """Median GPU ms per call of each graph, the graphs replayed in turn ``rounds`` times;
    each timed replay follows an untimed one of the same graph, so that it finds the L2
    cache as its own calls leave it, not as the graph before it did (timed straight after
    another, the "same operands" graph of a small layer found its operands evicted by the
    rotated graph before it, or left warm by the other provider's graph on the same ones:
    aten against itself measured 0.92-0.97)."""
    times: dict = {name: [] for name in graphs}
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, graph in graphs.items():
            graph.replay()
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            begin.record()
            graph.replay()
            end.record()
            end.synchronize()
            times[name].append(begin.elapsed_time(end) / calls)
    return {name: statistics.median(t) for name, t in times.items()}


def measure(op: str, plan, device, need_input: bool | None = None,
            strides: tuple | None = None) -> dict:
    """One row's timings, fastconv's and torch's, on the same and on rotated operands
    (with the step's ``strides``): of ``plan`` and aten's plan of its problem; with
    ``need_input`` given (op "layer"), of the forward + backward through autograd
    (``layer_runs``)."""
    problem = plan.problem
    if need_input is None:
        fast, ref = plan.run, torch_run(problem, op)

        def make():
            return operands(problem, op, device, strides)
    else:
        fast, ref = layer_runs(problem, need_input)

        def make():
            return layer_operands(problem, need_input, device, strides)
    same = [make()]
    nbytes = sum(t.numel() * t.element_size() for t in same[0] if t is not None)
    cold = same + [make() for _ in range(rotation_count(nbytes) - 1)]
    with dispatch.settings(graph=True):
        graphs = {("fastconv", "same"): graph_of(fast, same),
                  ("torch", "same"): graph_of(ref, same),
                  ("fastconv", "cold"): graph_of(fast, cold),
                  ("torch", "cold"): graph_of(ref, cold)}
    ms = replay_alternately(graphs)
    row = {}
    for regime in ("same", "cold"):
        fast, slow = ms[("fastconv", regime)], ms[("torch", regime)]
        row.update({f"fastconv_ms_{regime}": fast, f"torch_ms_{regime}": slow,
                    f"ratio_{regime}": slow / fast})
    row["rotated_sets"] = len(cold)
    return row


def run_case(case, precision: Precision, mode: str, device: str,
             echo: bool = False) -> list[dict]:
    """One row per distinct (op, problem) of the case's CUDA-graph step (see the module's
    docstring); without a GPU, the rows list the plans, untimed."""
    from .models import BUILDERS, model_input, no_dropout, provider_call

    torch.manual_seed(0)
    model = BUILDERS[case.model]().to(device).train(mode == "train")
    x = model_input(case.model, case.batch, case.size, device)
    flags = torch_cudnn_flags(precision)
    base = dict(table="layer-check", case=case.name, mode=mode, precision=precision.value,
                batch=case.batch, size=case.size)
    rows = []
    try:
        plans.clear_plans()  # this case's plans only
        provider = "fastconv_cuda_graph" if device == "cuda" else "fastconv"
        fn, net = provider_call(provider, model, x, precision, mode)
        with no_dropout(net):
            fn()
            dispatch.finish_builds(upgrades=True)
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
        made = plans.cached_plans(graph=device == "cuda")
        # the input gradients the step computed (a first layer's input needs none)
        dgrads = {p.problem for op, _, p, _ in made if op == "dgrad"}
        seen = set()
        stale = 0
        for op, grad, plan, strides in made:
            if plan.provisional and plan.expired():  # a stand-in the next lookup replaces
                stale += 1
                continue
            need_input = None
            if grad:  # the forward was chosen with its backward: timed with it
                op = "layer"
                need_input = dataclasses.replace(plan.problem, epilogue=Epilogue()) in dgrads
            key = (op, plan.problem, strides)
            if key in seen:
                continue
            seen.add(key)
            row = dict(base, op=op, problem=plan.problem.describe(),
                       epilogue=plan.problem.epilogue.signature(), choice=plan.backend,
                       provisional=plan.provisional, gflop=plan.problem.flops() / 1e9,
                       operand_strides=str(strides))
            rows.append(row)
            try:
                if device == "cuda":
                    row.update(measure(op, plan, device, need_input, strides))
                else:
                    row["timing"] = "not measured (no GPU)"
            except Exception as exc:  # reported, not fatal
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            if echo:
                print(json.dumps(row), flush=True)
        if stale:
            rows.append(dict(base, stale_plans=stale))
    except Exception as exc:
        rows.append(dict(base, error=f"{type(exc).__name__}: {str(exc)[:300]}"))
    finally:
        restore_cudnn_flags(flags)
    return rows


def table(rows: list[dict]) -> str:
    """The rows as text, slowest ratio first, then one summary line per case and mode."""
    lines = [f"{'case':22}{'mode':6}{'op':6}{'choice':8}{'torch ms':>10}{'fc ms':>9}"
             f"{'same':>7}{'cold':>7}  problem"]
    timed = [r for r in rows if "ratio_same" in r]
    for r in sorted(timed, key=lambda r: r["ratio_same"]):
        lines.append(f"{r['case'][:21]:22}{r['mode']:6}{r['op']:6}{r['choice'][:7]:8}"
                     f"{r['torch_ms_same']:10.4f}{r['fastconv_ms_same']:9.4f}"
                     f"{r['ratio_same']:7.3f}{r['ratio_cold']:7.3f}  {r['problem'][:90]}")
    for r in rows:
        if "stale_plans" in r:
            lines.append(f"{r['case']} {r['mode']}: {r['stale_plans']} provisional plans "
                         f"replaced at their next lookup, not timed")
        if "error" in r:
            lines.append(f"{r['case'][:21]:22}{r['mode']:6}{r.get('op', '-'):6}"
                         f"{r.get('choice', '-')[:7]:8}{r['error']}")
    untimed: dict = {}
    for r in rows:
        if "timing" in r:
            untimed.setdefault((r["case"], r["mode"], r["timing"]), []).append(r)
    for (case, mode, why), got in untimed.items():
        lines.append(f"{case} {mode}: {len(got)} convolutions listed, {why}")
    groups: dict = {}
    for r in timed:
        groups.setdefault((r["case"], r["mode"]), []).append(r)
    for (case, mode), got in groups.items():
        below = [r for r in got if r["ratio_same"] < BAR]
        worst = min(r["ratio_same"] for r in got), min(r["ratio_cold"] for r in got)
        lines.append(f"{case} {mode}: {len(got)} convolutions; worst {worst[0]:.3f} (same "
                     f"operands), {worst[1]:.3f} (rotated); "
                     f"{len(below)} below {BAR}; "
                     f"non-aten choices {sum(r['choice'] != 'aten' for r in got)}")
    return "\n".join(lines)
