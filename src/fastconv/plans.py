"""Plans: a call's validated problem bound to the backend and configuration dispatch chose,
cached by the call's signature, and the runners that use them.

A forward call (``forward_plan``) is validated, turned into a :class:`ConvProblem` and
dispatched the first time its signature (shapes, strides, dtypes, devices, arguments, the
TF32 flag, the dispatch settings) is seen; later calls with the same signature reuse the
plan and only check what depends on the data pointers. ``run_grad``/``run_grads`` do the same
for the data and weight gradients. :class:`ConvFunction` runs a forward plan under eager
autograd, its backward through the gradient plans (``backward_formula``, shared with the
``fastconv::conv`` custom op of ops.py).

What one cached call costs on the host, top to bottom (nothing else runs):

* a module (``nn.Conv2d``, ``ConvBNAct2d``): its signature tuple (shapes, strides, dtypes,
  flags) compared with the one its kept plan was made for, then ``plan.run``;
* a functional call: the argument checks that need no lookup (autocast, grad mode), the
  signature tuple, one dict lookup in ``_PLANS``, then ``plan.run``;
* ``plan.run``: the backend's bound launcher (``Backend.bind``), made once per plan: for
  aten the torch call itself, for Triton the prepared kernel launch, for cuDNN the graph's
  execute on {tensor uid: tensor} with a pooled workspace; with bias folded into shift
  (``bound_forward``) for backends that take no bias.

Layering: functional (the public API) and ops (the custom ops) use this module; it uses
dispatch, the backends and the epilogue, never the modules above it (tests/test_layering.py
checks that no module imports another in a cycle).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import backends, costs, dispatch
from .backends import aten
from .backends.aten import conv_backward_both
from .epilogue import Epilogue, activation_grad, derivative_from_output, fold_bias
from .errors import ConvError, ConvTypeError
from .precision import Precision, accumulate_dtype
from .problem import ConvProblem
from .spec import ConvCall, GradArgs, OpArgs


class _Plan:
    """A validated problem bound to the backend and configuration that runs it."""

    __slots__ = ("problem", "run", "backend", "native_grad", "provisional", "until")

    def __init__(self, problem: ConvProblem, run, backend: str = "",
                 native_grad: bool = False, provisional: bool = False, until=None):
        self.problem = problem
        self.run = run
        self.backend = backend
        self.native_grad = native_grad  # run() is torch ops that torch's autograd differentiates
        # a stand-in while candidates compile (dispatch.Choice.provisional): kept while
        # until() is False, made again after (no until: not kept)
        self.provisional = provisional
        self.until = until

    def expired(self) -> bool:
        """Whether a provisional plan must be made again (its builds are done)."""
        return self.until is None or self.until()


def _fresh(plan: _Plan | None) -> _Plan | None:
    """``plan``, or None where it is a provisional plan whose builds are done."""
    return None if plan is not None and plan.provisional and plan.expired() else plan


_PLANS: dict[tuple, _Plan] = {}
PLANS_MAX = 1024


def clear_plans() -> None:
    """Forget every cached plan and read ``FASTCONV_DISPATCH`` / ``FASTCONV_DETERMINISTIC``
    again at the next call (tests; after changing them in a running process)."""
    _PLANS.clear()
    dispatch.reload_environment()


def _sig(t):
    if t is None:
        return None
    return (t.shape, t.stride(), t.dtype, t.device)


def cached_plans(graph: bool) -> list[tuple[str, bool, _Plan, tuple]]:
    """``(op, grad, plan, strides)`` of every cached plan made under CUDA-graph settings
    (``graph``) or eager ones: op "fprop", "dgrad" or "wgrad"; ``grad``, a forward whose
    backward follows; ``strides``, those of the operands the plan was made for (forward:
    input, weight, residual or None; dgrad: output gradient, weight; wgrad: output gradient,
    input). What ``fastconv bench --layer-check`` compares with torch's own choice."""
    out = []
    for sig, plan in list(_PLANS.items()):
        # (the settings, ``dispatch.current()``: a forward's sig ends with them and its
        # grad flag, a gradient's with them)
        fprop = sig[0] == "fprop"
        settings = sig[-2] if fprop else sig[-1]
        if settings[2] == graph:
            strides = (sig[4], sig[8], sig[12] and sig[12][1]) if fprop else \
                (sig[1][1], sig[2 if sig[0] == "wgrad" else 3][1])
            out.append((sig[0], fprop and sig[-1], plan, strides))
    return out


def _remember(sig, plan) -> None:
    if sig is None or (plan.provisional and plan.until is None):
        return
    if len(_PLANS) >= PLANS_MAX:
        _PLANS.pop(next(iter(_PLANS)))
    _PLANS[sig] = plan


def forward_plan(call: ConvCall, input, weight, bias, residual, scale, shift, out,
                 grad: bool = False) -> _Plan:
    """The cached plan of a forward call (validated and dispatched on first sight);
    ``grad``: a call whose backward follows (dispatch prices the backward of each
    candidate's path too)."""
    # Fast path: a call whose every validated property (shapes, strides, dtypes, devices,
    # arguments, global precision flag) was seen before reuses its plan; only the checks
    # that depend on the data pointers run again.
    try:
        # (the tensors' signatures inline: _sig's calls cost ~1 us per call in all)
        sig = ("fprop", call, call.kinds(),
               input.shape, input.stride(), input.dtype, input.device,
               weight.shape, weight.stride(), weight.dtype, weight.device,
               None if bias is None else _sig(bias),
               None if residual is None else _sig(residual),
               None if scale is None else _sig(scale), None if shift is None else _sig(shift),
               None if out is None else _sig(out),
               torch._C._get_cudnn_allow_tf32(), dispatch.current(), grad)
        plan = _PLANS.get(sig)
    except (TypeError, AttributeError):  # unhashable or non-tensor argument: full checks
        sig, plan = None, None
    if plan is not None and plan.provisional and plan.expired():  # (inline: the hot path)
        plan = None
    if plan is None:
        plan = _plan(call, input, weight, bias, residual, scale, shift, out, grad)
        _remember(sig, plan)
    elif out is not None:
        plan.problem._check_overlap(out, input, weight, bias, residual, scale, shift)
    return plan


def _plan(call: ConvCall, input, weight, bias, residual, scale, shift, out, grad) -> _Plan:
    problem = forward_problem(call, input, weight, bias, residual, scale, shift, out)
    if problem.n == 0:  # empty batch: empty output, nothing to launch
        return _Plan(problem, lambda *a: problem.new_output(input.device) if a[-1] is None
                     else a[-1])
    backend = call.backend
    if grad and backend == "auto" and _eager_native(problem):
        cls = backends.REGISTRY["aten"]
        return _Plan(problem, bound_forward(problem, cls, None), "aten", native_grad=True)
    trial = forward_trial(problem, input, weight, bias, scale, shift, residual, out, backend,
                          grad)
    choice = dispatch.choose(problem, backend, run=trial, grad=grad)
    # A native plan's gradients are torch's autograd's (cuDNN's dgrad and wgrad at torch's
    # host cost); the others' go through ConvFunction. With grad, dispatch timed each
    # candidate with its own backward.
    cls = backends.REGISTRY[choice.backend]
    return _Plan(problem, bound_forward(problem, cls, choice.config), choice.backend,
                 native_grad=_native(cls, choice.config, problem),
                 provisional=choice.provisional, until=choice.until)


def _eager_native(problem: ConvProblem) -> bool:
    """Whether an eager GPU call with autograd runs torch's own convolution (aten's native
    plan, cuDNN's searched algorithm, torch's autograd), untimed. In benchmark mode, outside
    CUDA-graph settings and deterministic mode, where aten runs the problem in its precision.

    Measured in whole training steps (benchmarks/NOTES.md, "Eager training"): the
    candidates a timing of one layer's forward + backward preferred (Triton forwards with
    fastconv's backward) made timm resnet50's and efficientnet_b0's eager steps slower than
    every layer on aten, on the GPU and on the host (the general autograd path's Python per
    call and per backward), in every run. CUDA-graph training (``settings(graph=True)``)
    still ranks every candidate by GPU time."""
    mode, det, graph = dispatch.current()
    if graph or det or problem.device != "cuda" or (mode or "benchmark") != "benchmark":
        return False
    return not backends.REGISTRY["aten"].not_supported_reasons(problem) \
        and _flags_match(problem)


def forward_problem(call: ConvCall, input, weight, bias, residual, scale, shift,
                    out) -> ConvProblem:
    """The validated problem of a forward call (ConvError naming any invalid argument)."""
    if not isinstance(call.backend, str):
        raise ConvTypeError(f"backend: expected a str, got {type(call.backend).__name__}")
    epilogue = Epilogue(activation=call.activation, negative_slope=call.negative_slope,
                        has_scale=scale is not None,
                        has_shift=shift is not None or bias is not None,
                        has_residual=residual is not None)
    return ConvProblem.from_tensors(
        input, weight, bias, call.stride, call.padding, call.dilation, call.groups,
        rank=call.rank, transposed=call.transposed, output_padding=call.output_padding,
        precision=call.precision, epilogue=epilogue, residual=residual, scale=scale,
        shift=shift, out=out)


def bound_forward(problem: ConvProblem, cls, config):
    """``cls``'s forward of ``problem``, with bias folded into shift for backends that do
    not take it."""
    run = cls.bind(problem, config)
    if cls.TAKES_BIAS:
        return run

    def run_folded(input, weight, bias, scale, shift, residual, out):
        scale, shift = fold_bias(bias, scale, shift)
        return run(input, weight, None, scale, shift, residual, out)
    return run_folded


class _Sets:
    """The operand sets dispatch's trials run on: set 0 is the call's own tensors, the
    others (made at first use) detached copies of them, so that graph timing can rotate over
    more bytes than the L2 cache holds (``costs.time_graph_cost``). ``scratch(k)``: the
    buffers set k writes into (a tuple). ``count``: how many sets a rotation uses."""

    def __init__(self, own: tuple, scratch, scratch_bytes: int):
        self.own, self.scratch, self.sets = own, scratch, []
        self.count = costs.rotation_count(scratch_bytes + sum(
            t.numel() * t.element_size() for t in own if isinstance(t, torch.Tensor)))

    def __getitem__(self, k: int) -> tuple:
        while len(self.sets) <= k:
            i = len(self.sets)
            src = self.own if i == 0 else tuple(
                copy_alike(t).requires_grad_(t.requires_grad)
                if isinstance(t, torch.Tensor) else t for t in self.own)
            self.sets.append(src + self.scratch(i))
        return self.sets[k]


def copy_alike(t: torch.Tensor) -> torch.Tensor:
    """A detached copy of ``t`` with its strides, gaps included. A plan's prepared launch
    keeps the strides of its first call's tensors (``launch.Prepared``), so an operand set
    must have the call's: ``clone`` of a non-dense view (a projection's output split in
    two, as Mamba's blocks pass it to their convolution) is dense, and a depthwise kernel
    prepared for the view read past the copy's end (an illegal memory access on an H200)."""
    if t.numel() == 0:
        return t.detach().clone()
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.detach().as_strided((span,), (1,)).clone().as_strided(t.shape, t.stride())


def _like(out: torch.Tensor | None):
    """An operand set's scratch: ``out`` for set 0, a buffer with its strides for the
    others (None: each call allocates its output, as the call being planned does)."""
    return lambda k: (out if k == 0 or out is None else copy_alike(out),)


def _output_bytes(problem: ConvProblem) -> int:
    return math.prod(problem.output_shape()) * problem.dtype.itemsize


def _binder(bind):
    """``bind(cls, config)``, made once per candidate, so that its timed calls cost what its
    plan's calls will (a plan binds once: binding per timed call put the bind and a Triton
    plan's first, unprepared launch into every call's host time)."""
    bound: dict = {}

    def get(cls, config):
        try:
            run = bound.get((cls, config))
        except TypeError:  # an unhashable configuration: bound per call
            return bind(cls, config)
        if run is None:
            run = bound[(cls, config)] = bind(cls, config)
        return run
    return get


def _rotating(trial, sets: _Sets):
    """``trial`` (``run(cls, config, k=0)``) with its ``operand_sets``, which dispatch's
    graph timing rotates over."""
    trial.operand_sets = sets
    return trial


def forward_trial(problem, input, weight, bias, scale, shift, residual, out, backend="auto",
                  grad=False):
    """Dispatch's ``run(cls, config, k=0)``: one candidate on the call's own tensors (k = 0)
    or on copies of them (operand set k). With ``grad`` the candidate runs as a call that
    needs gradients runs it, forward and backward through autograd (``torch.autograd.grad``
    of detached copies of the operands): torch's autograd for a native plan,
    ``ConvFunction`` for the others, so that each carries the host and GPU cost of its own
    backward, the autograd engine's included."""
    if grad:
        return _grad_trial(problem, (input, weight, bias, scale, shift, residual), backend)
    # the output as the call gives it: into ``out`` or allocated by the candidate (a scratch
    # buffer in every trial charged aten's bound call an output copy its plan never makes)
    sets = _Sets((input, weight, bias, scale, shift, residual), _like(out),
                 _output_bytes(problem))
    bound = _binder(lambda cls, config: bound_forward(problem, cls, config))

    def trial(cls, config, k=0):
        bound(cls, config)(*sets[k])
    return _rotating(trial, sets)


def _grad_trial(problem: ConvProblem, operands: tuple, backend: str):
    leaves = tuple(t.detach().requires_grad_(t.requires_grad)
                   if isinstance(t, torch.Tensor) else t for t in operands)
    geometry = OpArgs(list(problem.stride), list(problem.pad_pre), list(problem.pad_post),
                      list(problem.dilation), problem.groups, problem.transposed,
                      list(problem.output_padding), problem.epilogue.activation,
                      problem.epilogue.negative_slope, backend, problem.precision.value)
    # each set: the leaves and the output gradient (random, the output's layout)
    sets = _Sets(leaves, lambda k: (problem.new_output(operands[0].device).normal_(),),
                 _output_bytes(problem))

    plans = _binder(lambda cls, config: _Plan(problem, bound_forward(problem, cls, config),
                                              cls.NAME, native_grad=_native(cls, config, problem)))

    def trial(cls, config, k=0):
        *xs, grad_out = sets[k]
        wrt = [t for t in xs if isinstance(t, torch.Tensor) and t.requires_grad]
        plan = plans(cls, config)
        with torch.enable_grad():
            y = plan.run(*xs, None) if plan.native_grad else \
                ConvFunction.apply(plan, *xs, *geometry)
            torch.autograd.grad(y, wrt, grad_out)
    return _rotating(trial, sets)


def _native(cls, config, problem: ConvProblem) -> bool:
    """Whether a plan of ``cls`` and ``config`` runs on torch's differentiable ops, so that
    torch's autograd gives its backward. aten's plain configuration is F.conv + torch
    epilogue ops, with cuDNN's heuristic plan too (its fused cuDNN relu is not); for
    float32, torch's backward must compute in the problem's precision (``_flags_match``)."""
    return cls.NAME == "aten" and config in (None, aten.PROVISIONAL) and _flags_match(problem)


def _flags_match(problem: ConvProblem) -> bool:
    """Whether torch's own backward would compute in ``problem``'s precision: for float32 on
    the GPU that follows cuDNN's TF32 switch as it stands now (torch reads it again when the
    backward runs), so a strict-fp32 forward under torch's default ``allow_tf32=True`` must
    keep the gradients on fastconv's path. Not on the CPU: cuDNN's switch does not apply
    there, and fastconv's own CPU backward runs torch's convolutions too."""
    if problem.dtype != torch.float32 or problem.device != "cuda":
        return True
    return (problem.precision == Precision.TF32) == torch.backends.cudnn.allow_tf32


def run_grad(op: str, grad_out, input, weight, geometry: GradArgs, out=None):
    """``op`` ("dgrad" or "wgrad") of the convolution of ``input`` with ``weight`` (no
    epilogue; geometry already normalised), written into ``out`` (allocated if None)."""
    plan = _grad_plan(op, grad_out, input, weight, geometry, out)
    return plan.run(grad_out, input if op == "wgrad" else weight, out)


def run_grads(grad_out, input, weight, geometry: GradArgs, need_input: bool,
              need_weight: bool):
    """``(dx, dw)`` (None where not needed) of the convolution of ``input`` with ``weight``.
    When dispatch picked aten for both, one convolution_backward call computes them."""
    dgrad = _grad_plan("dgrad", grad_out, input, weight, geometry) if need_input else None
    wgrad = _grad_plan("wgrad", grad_out, input, weight, geometry) if need_weight else None
    if dgrad is not None and wgrad is not None and dgrad.backend == wgrad.backend == "aten" \
            and dgrad.problem.pad_pre == dgrad.problem.pad_post:
        return conv_backward_both(dgrad.problem, grad_out, input, weight)
    return (dgrad.run(grad_out, weight, None) if dgrad is not None else None,
            wgrad.run(grad_out, input, None) if wgrad is not None else None)


def _grad_plan(op: str, grad_out, input, weight, geometry: GradArgs, out=None) -> _Plan:
    stride, pad_pre, pad_post, dilation, groups, backend, precision = geometry
    sig = (op, _sig(grad_out), _sig(input), _sig(weight), _sig(out), tuple(stride),
           tuple(pad_pre), tuple(pad_post), tuple(dilation), groups, backend, precision,
           dispatch.current())
    plan = _fresh(_PLANS.get(sig))
    if plan is None:
        rank = input.dim() - 2
        problem = ConvProblem.from_tensors(
            input, weight, None, tuple(stride), tuple(zip(pad_pre, pad_post)), tuple(dilation),
            groups, rank=rank, precision=precision)
        if tuple(grad_out.shape) != problem.output_shape():
            raise ConvError(f"grad_output: expected shape {problem.output_shape()}, got "
                            f"{tuple(grad_out.shape)}")
        sets = _Sets((grad_out, weight if op == "dgrad" else input), _like(out),
                     (weight if op == "wgrad" else input).numel() * problem.dtype.itemsize)
        bound = _binder(lambda cls, config: cls.bind(problem, config, op))

        def trial(cls, config, k=0):
            bound(cls, config)(*sets[k])

        choice = dispatch.choose(problem, backend, run=_rotating(trial, sets), op=op)
        plan = _Plan(problem, backends.REGISTRY[choice.backend].bind(problem, choice.config, op),
                     choice.backend, provisional=choice.provisional, until=choice.until)
        _remember(sig, plan)
    return plan


# ---------------------------------------------------------------------- eager autograd
def setup_context(ctx, inputs, output):
    """What the backward of ``fastconv::conv`` (and :class:`ConvFunction`) keeps."""
    # The output only where the activation's derivative is read from it: saving it always
    # made a later in-place op on it (an SE block's SiLU(inplace=True)) fail the backward.
    activation, slope = inputs[13], inputs[14]
    ctx.save_for_backward(*inputs[:6], output if derivative_from_output(activation, slope)
                          else None)
    ctx.args = inputs[6:]


def conv_impl(input, weight, bias, scale, shift, residual, *args):
    """``fastconv::conv`` without the op's layout guarantee (eager autograd uses it);
    ``args``: the op's other arguments (:class:`~fastconv.spec.OpArgs`' fields)."""
    a = OpArgs(*args)
    call = ConvCall(input.dim() - 2, a.transposed, tuple(a.stride),
                    tuple(zip(a.pad_pre, a.pad_post)), tuple(a.dilation), a.groups,
                    tuple(a.output_padding), a.activation, a.negative_slope, a.backend,
                    a.precision)
    return forward_plan(call, input, weight, bias, residual, scale, shift, None).run(
        input, weight, bias, scale, shift, residual, None)


class ConvFunction(torch.autograd.Function):
    """The same forward and backward as the ``fastconv::conv`` op, for eager autograd
    without the custom-op machinery (measured: about 0.6 ms of host time per training step
    of one convolution went into torch.library's dispatch wrappers). Under torch.compile the
    functional API uses the op, which the compiler can trace.

    ``apply(plan, *op_args)``: ``plan`` is the forward plan dispatch chose for the call
    (``forward_plan(..., grad=True)``), run as it is; the other arguments are
    ``fastconv::conv``'s."""

    @staticmethod
    def forward(ctx, plan, *args):
        y = plan.run(*args[:6], None)  # input, weight, bias, scale, shift, residual, out
        setup_context(ctx, args, y)
        ctx.settings = dispatch.captured()
        return y

    @staticmethod
    def backward(ctx, grad):
        # the dispatch settings of the forward call (a CUDA backward runs on autograd's
        # device thread, which does not see the caller's settings() context)
        with dispatch.restored(ctx.settings):
            return (None,) + backward_formula(ctx, grad, conv_impl, run_grads,
                                              ctx.needs_input_grad[1:])


def backward_formula(ctx, grad, conv, conv_grads, need=None):
    """The gradients of every ``fastconv::conv`` input (see the module docstring), with the
    convolutions run by the given callables — the ops (traceable) or their implementations:
    ``conv`` as ``fastconv::conv`` and ``conv_grads(dy, x, w, geometry: GradArgs,
    need_input, need_weight) -> (dx, dw)``. ``need``: which of the op's inputs need a
    gradient (default ``ctx.needs_input_grad``)."""
    input, weight, bias, scale, shift, residual, y = ctx.saved_tensors
    args = OpArgs(*ctx.args)
    need = ctx.needs_input_grad if need is None else need
    bare = args._replace(activation="none")  # the convolution without its activation

    def pre_activation():
        return conv(input, weight, bias, scale, shift, residual, *bare)

    dz = activation_grad(grad, y, args.activation, args.negative_slope, pre_activation)
    dims = [0, *range(2, dz.dim())]
    view = (1, -1) + (1,) * (dz.dim() - 2)
    g_residual = dz if need[5] else None
    acc = accumulate_dtype(dz.dtype)  # per-channel sums
    g_shift = dz.sum(dims, dtype=acc).to(shift.dtype) if need[4] else None
    g_scale = None
    if need[3]:
        c = conv(input, weight, bias, None, None, None, *bare)
        g_scale = (dz.to(acc) * c.to(acc)).sum(dims).to(scale.dtype)
    dc = dz if scale is None else dz * scale.to(dz.dtype).view(view)
    g_bias = dc.sum(dims, dtype=acc).to(bias.dtype) if need[2] else None
    g_input = g_weight = None
    stride, pre, dilation = args.stride, args.pad_pre, args.dilation
    if args.transposed:
        if need[0]:
            forward = bare._replace(pad_post=pre, transposed=False,
                                    output_padding=[0] * len(stride))
            g_input = conv(dc, weight, None, None, None, None, *forward)
            g_input = g_input[(slice(None), slice(None),
                               *(slice(0, n) for n in input.shape[2:]))]
        if need[1]:
            # The convolution of dc can be longer than x when output_padding >= stride
            # (possible with dilation > stride): x gets zero rows to match.
            conv_len = [(o + 2 * p - d * (k - 1) - 1) // s + 1 for o, p, d, k, s in
                        zip(dc.shape[2:], pre, dilation, weight.shape[2:], stride)]
            extra = [a - b for a, b in zip(conv_len, input.shape[2:])]
            x = input
            if any(extra):
                x = F.pad(input, [v for e in reversed(extra) for v in (0, e)])
            _, g_weight = conv_grads(x, dc, weight, args.grads()._replace(pad_post=pre),
                                     False, True)
    elif need[0] or need[1]:
        g_input, g_weight = conv_grads(dc, input, weight, args.grads(), need[0], need[1])
    return (g_input, g_weight, g_bias, g_scale, g_shift, g_residual) + (None,) * len(ctx.args)
