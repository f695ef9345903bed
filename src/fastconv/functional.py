"""Functional convolutions with torch.nn.functional's signature and a fused epilogue.

``fastconv.conv2d(x, w, b, stride, padding, dilation, groups)`` computes what
``torch.nn.functional.conv2d`` computes, ``fastconv.conv_transpose2d`` what
``F.conv_transpose2d`` computes; the keyword-only arguments add the epilogue
``act(scale·(conv + bias) + shift + residual)``, an output buffer, a backend and a precision.

Paths: a call that needs no gradient, outside torch.compile, runs a cached plan directly
(the lowest host overhead). One that needs a gradient runs a plan dispatched for a call with
a backward (each candidate timed with its backward); if that is aten's plain configuration,
whose ops torch differentiates, torch's autograd does the backward (cuDNN), otherwise the
plan runs inside ``ops.ConvFunction``, whose backward runs the data and weight gradients
through dispatch (fastconv's Triton kernels or aten). Under torch.compile the call is the
``fastconv::conv`` custom op (ops.py), with the same autograd formula, which the compiler
traces as one node; a call there that needs a gradient on data other than float32 is
torch's own ops instead (``_traced_with_grad``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from . import backends, dispatch
from . import dispatch as _dispatch  # the module, where an argument is called dispatch
from .backends.aten import _flat_pad, conv_backward_both
from .epilogue import Epilogue, fold_bias
from .epilogue import apply as apply_epilogue
from .errors import ConvError, ConvTypeError, real_number
from .precision import Precision, resolve
from .problem import ConvProblem, normalize_geometry

_IntOrTuple = int | Sequence[int]


def conv1d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           stride: _IntOrTuple = 1, padding: _IntOrTuple | str = 0, dilation: _IntOrTuple = 1,
           groups: int = 1, *, activation: str = "none", negative_slope: float = 0.01,
           residual: torch.Tensor | None = None, scale: torch.Tensor | None = None,
           shift: torch.Tensor | None = None, out: torch.Tensor | None = None,
           backend: str = "auto", precision: str | None = None,
           dispatch: str | None = None) -> torch.Tensor:
    """1-D convolution over an input of shape ``(N, C, L)`` or ``(C, L)``.

    Same as :func:`conv2d` with one spatial dimension:
    ``L_out = (L + pad_pre + pad_post − dilation·(kernel − 1) − 1) // stride + 1``.
    """
    return _conv(1, False, input, weight, bias, stride, padding, dilation, groups, 0,
                 activation, negative_slope, residual, scale, shift, out, backend, precision,
                 dispatch)


def conv2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           stride: _IntOrTuple = 1, padding: _IntOrTuple | str = 0, dilation: _IntOrTuple = 1,
           groups: int = 1, *, activation: str = "none", negative_slope: float = 0.01,
           residual: torch.Tensor | None = None, scale: torch.Tensor | None = None,
           shift: torch.Tensor | None = None, out: torch.Tensor | None = None,
           backend: str = "auto", precision: str | None = None,
           dispatch: str | None = None) -> torch.Tensor:
    """2-D convolution with an optional fused epilogue.

    Args:
        input: ``(N, C, H, W)`` or unbatched ``(C, H, W)``; NCHW or channels_last.
        weight: ``(K, C / groups, R, S)``.
        bias: optional ``(K,)``.
        stride, dilation: int or ``(h, w)``; positive.
        padding: int, ``(h, w)``, per-dimension ``((pre, post), (pre, post))``, ``"same"``
            (stride 1 only; the odd pixel goes after, as in torch) or ``"valid"``.
        groups: divides both C and K.
        activation: one of ``epilogue.ACTIVATIONS``; ``negative_slope`` is leaky_relu's.
        residual: tensor of the output's shape added before the activation.
        scale, shift: per-output-channel ``(K,)`` affine, e.g. a folded BatchNorm.
        out: write the result here (it must not overlap any input).
        backend: ``"auto"`` or a registered backend: ``"aten"``, ``"triton"``, ``"cudnn"``.
        dispatch: how ``"auto"`` chooses for this call: ``"heuristic"``, ``"benchmark"``
            or ``"pinned"`` (default: ``fastconv.dispatch.settings`` / ``FASTCONV_DISPATCH``
            / benchmark on a GPU, heuristic on the CPU).
        precision: ``"ieee"``, ``"tf32"`` (fp32 data), ``"fp16"``, ``"bf16"`` or ``None``
            (follow torch: tf32 when ``torch.backends.cudnn.allow_tf32``).

    Returns:
        ``act(scale·(conv(input, weight) + bias) + shift + residual)`` of shape
        ``(N, K, H_out, W_out)`` with
        ``H_out = (H + pad_pre + pad_post − dilation·(R − 1) − 1) // stride + 1``.

    Raises:
        ConvError: any invalid argument (the message names it, the value and what is allowed).
        NotSupported: a forced ``backend`` cannot run this problem (every reason listed).
    """
    return _conv(2, False, input, weight, bias, stride, padding, dilation, groups, 0,
                 activation, negative_slope, residual, scale, shift, out, backend, precision,
                 dispatch)


def conv_transpose1d(input: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None = None, stride: _IntOrTuple = 1,
                     padding: _IntOrTuple = 0, output_padding: _IntOrTuple = 0, groups: int = 1,
                     dilation: _IntOrTuple = 1, *, activation: str = "none",
                     negative_slope: float = 0.01, residual: torch.Tensor | None = None,
                     scale: torch.Tensor | None = None, shift: torch.Tensor | None = None,
                     out: torch.Tensor | None = None, backend: str = "auto",
                     precision: str | None = None, dispatch: str | None = None
                     ) -> torch.Tensor:
    """1-D transposed convolution over ``(N, C_in, L)`` or ``(C_in, L)``; see
    :func:`conv_transpose2d`."""
    return _conv(1, True, input, weight, bias, stride, padding, dilation, groups,
                 output_padding, activation, negative_slope, residual, scale, shift, out,
                 backend, precision, dispatch)


def conv_transpose2d(input: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None = None, stride: _IntOrTuple = 1,
                     padding: _IntOrTuple = 0, output_padding: _IntOrTuple = 0, groups: int = 1,
                     dilation: _IntOrTuple = 1, *, activation: str = "none",
                     negative_slope: float = 0.01, residual: torch.Tensor | None = None,
                     scale: torch.Tensor | None = None, shift: torch.Tensor | None = None,
                     out: torch.Tensor | None = None, backend: str = "auto",
                     precision: str | None = None, dispatch: str | None = None
                     ) -> torch.Tensor:
    """2-D transposed convolution ("deconvolution") with an optional fused epilogue.

    The positional arguments are ``torch.nn.functional.conv_transpose2d``'s, in its order.

    Args:
        input: ``(N, C_in, H, W)`` or unbatched ``(C_in, H, W)``.
        weight: ``(C_in, C_out / groups, R, S)``: ``C_in`` must equal ``weight.shape[0]``
            and the output has ``weight.shape[1] * groups`` channels.
        output_padding: extra size added after each output dimension; each value smaller
            than the stride or the dilation of that dimension.
        out: write the result here (the transposed counterpart of ``conv2d``'s ``out=``).
        The other arguments are as in :func:`conv2d`.

    Returns:
        ``(N, C_out, H_out, W_out)`` with
        ``H_out = (H − 1)·stride − 2·padding + dilation·(R − 1) + output_padding + 1``.
    """
    return _conv(2, True, input, weight, bias, stride, padding, dilation, groups,
                 output_padding, activation, negative_slope, residual, scale, shift, out,
                 backend, precision, dispatch)


def _conv(rank, transposed, input, weight, bias, stride, padding, dilation, groups,
          output_padding, activation, negative_slope, residual, scale, shift, out, backend,
          precision, mode):
    args = (rank, transposed, input, weight, bias, stride, padding, dilation, groups,
            output_padding, activation, negative_slope, residual, scale, shift, out, backend,
            precision)
    if mode is None:
        return _conv_impl(*args)
    with dispatch.settings(mode):
        return _conv_impl(*args)


def _conv_impl(rank, transposed, input, weight, bias, stride, padding, dilation, groups,
               output_padding, activation, negative_slope, residual, scale, shift, out,
               backend, precision):
    if not isinstance(input, torch.Tensor):
        raise ConvTypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
    # (the C-level "any autocast" test first: 0.1 us against 0.5 for the per-device one)
    if torch._C._is_any_autocast_enabled() and torch.is_autocast_enabled(input.device.type):
        input, weight, bias, residual = _autocast(input.device.type, input, weight, bias,
                                                  residual)
    unbatched = input.dim() == rank + 1
    if unbatched:
        input = input.unsqueeze(0)
        residual = residual.unsqueeze(0) if isinstance(residual, torch.Tensor) else residual
        out_b = out.unsqueeze(0) if isinstance(out, torch.Tensor) else out
    else:
        out_b = out
    needs_grad = torch.is_grad_enabled() and (  # (no generator: this runs every call)
        input.requires_grad or getattr(weight, "requires_grad", False)
        or getattr(bias, "requires_grad", False) or getattr(scale, "requires_grad", False)
        or getattr(shift, "requires_grad", False) or getattr(residual, "requires_grad", False))
    if out is not None and isinstance(out, torch.Tensor) and out.requires_grad \
            and torch.is_grad_enabled():
        raise ConvError("out: requires grad; writing a convolution into it in place would "
                        "bypass autograd (torch refuses it too; use torch.no_grad() or an out "
                        "that does not require grad)")
    compiling = torch.compiler.is_compiling()
    if needs_grad or compiling:
        if needs_grad and out is not None:
            raise ConvError("out: cannot be used when an input requires grad (as in torch, "
                            "out= does not support automatic differentiation)")
        if compiling and needs_grad and backend == "auto":
            result = _traced_with_grad(rank, transposed, input, weight, bias, stride, padding,
                                       dilation, groups, output_padding, activation,
                                       negative_slope, residual, scale, shift, precision)
            if result is not None:
                return result.squeeze(0) if unbatched else result
        plan = None if compiling else forward_plan(
            rank, transposed, input, weight, bias, stride, padding, dilation, groups,
            output_padding, activation, negative_slope, residual, scale, shift, None, backend,
            precision, grad=needs_grad)
        if plan is not None and plan.native_grad:
            # The forward runs on torch's own differentiable ops: torch's autograd gives the
            # backward (cuDNN's dgrad and wgrad in one call) at torch's host cost.
            result = plan.run(input, weight, bias, scale, shift, residual, None)
        else:
            result = _through_op(plan, rank, transposed, input, weight, bias, stride, padding,
                                 dilation, groups, output_padding, activation, negative_slope,
                                 residual, scale, shift, backend, precision)
        if out_b is not None:
            out_b.copy_(result)
    else:
        result = forward_plan(rank, transposed, input, weight, bias, stride, padding, dilation,
                              groups, output_padding, activation, negative_slope, residual,
                              scale, shift, out_b, backend, precision).run(
            input, weight, bias, scale, shift, residual, out_b)
    if out is not None:
        return out
    return result.squeeze(0) if unbatched else result


def _traced_with_grad(rank, transposed, input, weight, bias, stride, padding, dilation,
                      groups, output_padding, activation, negative_slope, residual, scale,
                      shift, precision):
    """Under torch.compile, a call that needs gradients as torch's own differentiable ops
    (what aten's native plan runs: the convolution, then the epilogue), which Inductor
    lowers, fuses and differentiates itself; torch's ops check the operands. None for
    float32 data (whether torch's ops compute in the call's precision depends on cuDNN's
    TF32 flag, which a traced function cannot read) and for what aten does not run
    (asymmetric padding of a transposed convolution): fastconv's op then. Measured: the
    ``fastconv::conv`` op and its gradient ops cost more host time per training step than
    their kernels gain (benchmarks/NOTES.md, compile(optimize(model)))."""
    if input.dtype == torch.float32 or not isinstance(weight, torch.Tensor) \
            or weight.dim() != rank + 2:
        return None
    resolve(precision, input.dtype)  # a precision the dtype cannot run is refused
    stride, pre, post, dilation, opad = normalize_geometry(
        rank, weight.shape[2:], stride, padding, dilation, output_padding, transposed)
    if transposed:
        if pre != post:
            return None
        fn = F.conv_transpose1d if rank == 1 else F.conv_transpose2d
        y = fn(input, weight, bias, stride, pre, opad, groups, dilation)
    else:
        fn = F.conv1d if rank == 1 else F.conv2d
        if pre != post:
            input = F.pad(input, _flat_pad(pre, post))
        y = fn(input, weight, bias, stride, pre if pre == post else 0, dilation, groups)
    return apply_epilogue(y, scale, shift, residual, activation, negative_slope)


def _autocast(device_type, *tensors):
    """Cast floating-point operands (not float64, as torch's autocast) to the autocast dtype;
    scale and shift stay as given, like BatchNorm's parameters."""
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if autocast_casts(t, dtype) else t for t in tensors)


def autocast_casts(t, dtype: torch.dtype) -> bool:
    """Whether autocast to ``dtype`` changes ``t``: a floating tensor of another dtype, not
    float64 (torch's rule)."""
    return (isinstance(t, torch.Tensor) and t.is_floating_point()
            and t.dtype not in (torch.float64, dtype))


def _through_op(plan, rank, transposed, input, weight, bias, stride, padding, dilation,
                groups, output_padding, activation, negative_slope, residual, scale, shift,
                backend, precision):
    """The autograd path: the ``fastconv::conv`` op under torch.compile, else
    ``ops.ConvFunction`` running ``plan`` (the forward dispatch chose for a call with a
    backward)."""
    from . import ops  # registers the custom ops on first use

    if not isinstance(weight, torch.Tensor):
        raise ConvTypeError(f"weight: expected a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != rank + 2:
        raise ConvError(f"weight: expected a {rank + 2}-D tensor for conv{rank}d, got shape "
                        f"{tuple(weight.shape)}")
    try:
        key = (rank, weight.shape[2:], stride, padding, dilation, output_padding, transposed,
               _kinds(stride, padding, dilation, output_padding))
        geometry = _GEOMETRY.get(key)
    except TypeError:  # unhashable (a list): normalise every time
        key, geometry = None, None
    if geometry is None:
        geometry = normalize_geometry(rank, weight.shape[2:], stride, padding, dilation,
                                      output_padding, transposed)
        if key is not None and len(_GEOMETRY) < _PLANS_MAX:
            _GEOMETRY[key] = geometry
    stride, pre, post, dilation, opad = geometry
    prec = resolve(precision, input.dtype).value
    args = (input, weight, bias, scale, shift, residual, list(stride), list(pre), list(post),
            list(dilation), groups, transposed, list(opad), activation,
            real_number("negative_slope", negative_slope),
            backend, prec)
    if torch.compiler.is_compiling():
        return ops.conv(*args)
    return ops.ConvFunction.apply(plan, *args)


def run_forward(rank, transposed, input, weight, bias, stride, padding, dilation, groups,
                output_padding, activation, negative_slope, residual, scale, shift, out,
                backend, precision):
    """The convolution of batched operands through a cached plan, no autograd."""
    plan = forward_plan(rank, transposed, input, weight, bias, stride, padding, dilation,
                        groups, output_padding, activation, negative_slope, residual, scale,
                        shift, out, backend, precision)
    return plan.run(input, weight, bias, scale, shift, residual, out)


def forward_plan(rank, transposed, input, weight, bias, stride, padding, dilation, groups,
                 output_padding, activation, negative_slope, residual, scale, shift, out,
                 backend, precision, grad: bool = False) -> _Plan:
    """The cached plan of a forward call (validated and dispatched on first sight);
    ``grad``: a call whose backward follows (dispatch prices the backward of each
    candidate's path too)."""
    # Fast path: a call whose every validated property (shapes, strides, dtypes, devices,
    # arguments, global precision flag) was seen before reuses its plan; only the checks
    # that depend on the data pointers run again.
    try:
        # (the tensors' signatures inline: _sig's calls cost ~1 us per call in all)
        sig = ("fprop", rank, transposed,
               input.shape, input.stride(), input.dtype, input.device,
               weight.shape, weight.stride(), weight.dtype, weight.device,
               None if bias is None else _sig(bias),
               None if residual is None else _sig(residual),
               None if scale is None else _sig(scale), None if shift is None else _sig(shift),
               None if out is None else _sig(out), stride, padding, dilation, groups,
               output_padding, activation, negative_slope, backend, precision,
               torch._C._get_cudnn_allow_tf32(), dispatch.current(), grad,
               _kinds(stride, padding, dilation, groups, output_padding, slope=negative_slope))
        plan = _PLANS.get(sig)
    except (TypeError, AttributeError):  # unhashable or non-tensor argument: full checks
        sig, plan = None, None
    if plan is None:
        plan = _plan(rank, transposed, input, weight, bias, stride, padding, dilation, groups,
                     output_padding, activation, negative_slope, residual, scale, shift, out,
                     backend, precision, grad)
        _remember(sig, plan)
    elif out is not None:
        plan.problem._check_overlap(out, input, weight, bias, residual, scale, shift)
    return plan


def run_grad(op, grad_out, input, weight, stride, pad_pre, pad_post, dilation, groups,
             backend, precision, out=None):
    """``op`` ("dgrad" or "wgrad") of the convolution of ``input`` with ``weight`` (no
    epilogue; geometry already normalised), written into ``out`` (allocated if None)."""
    plan = _grad_plan(op, grad_out, input, weight, stride, pad_pre, pad_post, dilation, groups,
                      backend, precision, out)
    return plan.run(grad_out, input if op == "wgrad" else weight, out)


def run_grads(grad_out, input, weight, stride, pad_pre, pad_post, dilation, groups, backend,
              precision, need_input, need_weight):
    """``(dx, dw)`` (None where not needed) of the convolution of ``input`` with ``weight``.
    When dispatch picked aten for both, one convolution_backward call computes them."""
    geo = (stride, pad_pre, pad_post, dilation, groups, backend, precision)
    dgrad = _grad_plan("dgrad", grad_out, input, weight, *geo) if need_input else None
    wgrad = _grad_plan("wgrad", grad_out, input, weight, *geo) if need_weight else None
    if dgrad is not None and wgrad is not None and dgrad.backend == wgrad.backend == "aten" \
            and dgrad.problem.pad_pre == dgrad.problem.pad_post:
        return conv_backward_both(dgrad.problem, grad_out, input, weight)
    return (dgrad.run(grad_out, weight, None) if dgrad is not None else None,
            wgrad.run(grad_out, input, None) if wgrad is not None else None)


def _grad_plan(op, grad_out, input, weight, stride, pad_pre, pad_post, dilation, groups,
               backend, precision, out=None) -> _Plan:
    sig = (op, _sig(grad_out), _sig(input), _sig(weight), _sig(out), tuple(stride),
           tuple(pad_pre), tuple(pad_post), tuple(dilation), groups, backend, precision,
           dispatch.current())
    plan = _PLANS.get(sig)
    if plan is None:
        rank = input.dim() - 2
        problem = ConvProblem.from_tensors(
            input, weight, None, tuple(stride), tuple(zip(pad_pre, pad_post)), tuple(dilation),
            groups, rank=rank, precision=precision)
        if tuple(grad_out.shape) != problem.output_shape():
            raise ConvError(f"grad_output: expected shape {problem.output_shape()}, got "
                            f"{tuple(grad_out.shape)}")
        second = weight if op == "dgrad" else input

        def trial(cls, config):
            cls.bind(problem, config, op)(grad_out, second, out)

        choice = dispatch.choose(problem, backend, run=trial, op=op)
        plan = _Plan(problem, backends.REGISTRY[choice.backend].bind(problem, choice.config, op),
                     choice.backend)
        _remember(sig, plan)
    return plan


def _remember(sig, plan) -> None:
    if sig is None:
        return
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.pop(next(iter(_PLANS)))
    _PLANS[sig] = plan


def _kinds(*geometry, slope: object = 0.0) -> tuple | None:
    """What a cache key needs besides the values themselves: True == 1 and 1.0 == 1, but a
    bool or float stride must be refused, not served an int's plan. None (the common case,
    checked with the least work) when each ``geometry`` value is an int, a str or a tuple of
    ints and ``slope`` an int or a float; else the types, one level into tuples."""
    for v in geometry:
        t = type(v)
        if t is tuple:
            for e in v:
                if type(e) is not int:
                    return _types(*geometry, slope)
        elif t is not int and t is not str:
            return _types(*geometry, slope)
    if type(slope) is not float and type(slope) is not int:
        return _types(*geometry, slope)
    return None


def _types(*values) -> tuple:
    return tuple(tuple(map(type, v)) if type(v) is tuple else type(v) for v in values)


def _sig(t):
    if t is None:
        return None
    return (t.shape, t.stride(), t.dtype, t.device)


class _Plan:
    """A validated problem bound to the backend and configuration that runs it."""

    __slots__ = ("problem", "run", "backend", "native_grad")

    def __init__(self, problem: ConvProblem, run, backend: str = "",
                 native_grad: bool = False):
        self.problem = problem
        self.run = run
        self.backend = backend
        self.native_grad = native_grad  # run() is torch ops that torch's autograd differentiates


_PLANS: dict[tuple, _Plan] = {}
_GEOMETRY: dict[tuple, tuple] = {}  # normalised geometry of the autograd / compile path
_PLANS_MAX = 1024


def clear_plans() -> None:
    """Forget every cached plan and read ``FASTCONV_DISPATCH`` / ``FASTCONV_DETERMINISTIC``
    again at the next call (tests; after changing them in a running process)."""
    _PLANS.clear()
    dispatch.reload_environment()


def _forward_problem(rank, transposed, input, weight, bias, stride, padding, dilation, groups,
                     output_padding, activation, negative_slope, residual, scale, shift, out,
                     backend, precision) -> ConvProblem:
    if not isinstance(backend, str):
        raise ConvTypeError(f"backend: expected a str, got {type(backend).__name__}")
    epilogue = Epilogue(activation=activation, negative_slope=negative_slope,
                        has_scale=scale is not None,
                        has_shift=shift is not None or bias is not None,
                        has_residual=residual is not None)
    return ConvProblem.from_tensors(
        input, weight, bias, stride, padding, dilation, groups, rank=rank,
        transposed=transposed, output_padding=output_padding, precision=precision,
        epilogue=epilogue, residual=residual, scale=scale, shift=shift, out=out)


def _bound(problem: ConvProblem, cls, config):
    """``cls``'s forward of ``problem``, with bias folded into shift for backends that do
    not take it."""
    run = cls.bind(problem, config)
    if cls.TAKES_BIAS:
        return run

    def run_folded(input, weight, bias, scale, shift, residual, out):
        scale, shift = fold_bias(bias, scale, shift)
        return run(input, weight, None, scale, shift, residual, out)
    return run_folded


def _trial(problem, input, weight, bias, scale, shift, residual, out, backend="auto",
           grad=False):
    """Dispatch's ``run(cls, config)``: one candidate on the call's own tensors. With
    ``grad`` the candidate runs as a call that needs gradients runs it, forward and backward
    through autograd (``torch.autograd.grad`` of detached copies of the operands): torch's
    autograd for a native plan, ``ops.ConvFunction`` for the others, so that each carries
    the host and GPU cost of its own backward, the autograd engine's included."""
    if grad:
        return _grad_trial(problem, (input, weight, bias, scale, shift, residual), backend)
    scratch: list[torch.Tensor] = []  # allocated only if dispatch times candidates

    def trial(cls, config):
        if not scratch:
            scratch.append(out if out is not None else problem.new_output(input.device))
        _bound(problem, cls, config)(input, weight, bias, scale, shift, residual, scratch[0])
    return trial


def _grad_trial(problem: ConvProblem, operands: tuple, backend: str):
    from . import ops

    leaves = tuple(t.detach().requires_grad_(t.requires_grad)
                   if isinstance(t, torch.Tensor) else t for t in operands)
    wrt = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
    geometry = (list(problem.stride), list(problem.pad_pre), list(problem.pad_post),
                list(problem.dilation), problem.groups, problem.transposed,
                list(problem.output_padding), problem.epilogue.activation,
                problem.epilogue.negative_slope, backend, problem.precision.value)
    scratch: list[torch.Tensor] = []  # the output gradient (random, the output's layout)

    def trial(cls, config):
        if not scratch:
            scratch.append(problem.new_output(operands[0].device).normal_())
        plan = _Plan(problem, _bound(problem, cls, config), cls.NAME,
                     native_grad=_native(cls, config, problem))
        with torch.enable_grad():
            y = plan.run(*leaves, None) if plan.native_grad else \
                ops.ConvFunction.apply(plan, *leaves, *geometry)
            torch.autograd.grad(y, wrt, scratch[0])
    return trial


def _native(cls, config, problem: ConvProblem) -> bool:
    """Whether a plan of ``cls`` and ``config`` runs on torch's differentiable ops, so that
    torch's autograd gives its backward. aten's plain configuration is F.conv + torch
    epilogue ops (its fused cuDNN relu is not); for float32, torch's backward must compute
    in the problem's precision (``_flags_match``)."""
    return cls.NAME == "aten" and config is None and _flags_match(problem)


def _plan(rank, transposed, input, weight, bias, stride, padding, dilation, groups,
          output_padding, activation, negative_slope, residual, scale, shift, out, backend,
          precision, grad=False):
    problem = _forward_problem(rank, transposed, input, weight, bias, stride, padding,
                               dilation, groups, output_padding, activation, negative_slope,
                               residual, scale, shift, out, backend, precision)
    if problem.n == 0:  # empty batch: empty output, nothing to launch
        return _Plan(problem, lambda *a: problem.new_output(input.device) if a[-1] is None
                     else a[-1])
    trial = _trial(problem, input, weight, bias, scale, shift, residual, out, backend, grad)
    choice = dispatch.choose(problem, backend, run=trial, grad=grad)
    # A native plan's gradients are torch's autograd's (cuDNN's dgrad and wgrad at torch's
    # host cost); the others' go through ops.ConvFunction. With grad, dispatch timed each
    # candidate with its own backward.
    cls = backends.REGISTRY[choice.backend]
    return _Plan(problem, _bound(problem, cls, choice.config), choice.backend,
                 native_grad=_native(cls, choice.config, problem))


def explain(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
            stride: _IntOrTuple = 1, padding: _IntOrTuple | str = 0,
            dilation: _IntOrTuple = 1, groups: int = 1, *, transposed: bool = False,
            output_padding: _IntOrTuple = 0, activation: str = "none",
            negative_slope: float = 0.01, residual: torch.Tensor | None = None,
            scale: torch.Tensor | None = None, shift: torch.Tensor | None = None,
            backend: str = "auto", precision: str | None = None,
            dispatch: str | None = None) -> _dispatch.Explanation:
    """What dispatch sees for this call (the arguments of :func:`conv2d`, or of
    :func:`conv_transpose2d` with ``transposed=True``; rank from ``input``): every backend
    and configuration with its refusal reasons or, in benchmark mode on a GPU, its time,
    and the choice. Prints as a table; changes no cache."""
    rank = input.dim() - 2 if isinstance(input, torch.Tensor) else 0
    if rank not in (1, 2):
        raise ConvError(f"input: expected a batched 1-D or 2-D input (3 or 4 dimensions), "
                        f"got {getattr(input, 'shape', type(input).__name__)}")
    with _dispatch.settings(dispatch):
        problem = _forward_problem(rank, transposed, input, weight, bias, stride, padding,
                                   dilation, groups, output_padding, activation,
                                   negative_slope, residual, scale, shift, None, backend,
                                   precision)
        trial = _trial(problem, input, weight, bias, scale, shift, residual, None)
        return _dispatch.explain(problem, backend, run=trial)


def _flags_match(problem: ConvProblem) -> bool:
    """Whether torch's own backward would compute in ``problem``'s precision: for float32
    that follows cuDNN's TF32 switch as it stands now (torch reads it again when the backward
    runs), so a strict-fp32 forward under torch's default ``allow_tf32=True`` must keep the
    gradients on fastconv's path."""
    if problem.dtype != torch.float32:
        return True
    return (problem.precision == Precision.TF32) == torch.backends.cudnn.allow_tf32


def conv_bn_act1d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  running_mean: torch.Tensor | None = None,
                  running_var: torch.Tensor | None = None,
                  bn_weight: torch.Tensor | None = None, bn_bias: torch.Tensor | None = None,
                  stride: _IntOrTuple = 1, padding: _IntOrTuple | str = 0,
                  dilation: _IntOrTuple = 1, groups: int = 1, *, training: bool = False,
                  momentum: float = 0.1, eps: float = 1e-5, activation: str = "relu",
                  negative_slope: float = 0.01, residual: torch.Tensor | None = None,
                  process_group=None, backend: str = "auto",
                  precision: str | None = None) -> torch.Tensor:
    """:func:`conv_bn_act2d` over ``(N, C, L)`` inputs."""
    return _conv_bn_act(conv1d, input, weight, bias, running_mean, running_var, bn_weight,
                        bn_bias, stride, padding, dilation, groups, training, momentum, eps,
                        activation, negative_slope, residual, process_group, backend,
                        precision)


def conv_bn_act2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  running_mean: torch.Tensor | None = None,
                  running_var: torch.Tensor | None = None,
                  bn_weight: torch.Tensor | None = None, bn_bias: torch.Tensor | None = None,
                  stride: _IntOrTuple = 1, padding: _IntOrTuple | str = 0,
                  dilation: _IntOrTuple = 1, groups: int = 1, *, training: bool = False,
                  momentum: float = 0.1, eps: float = 1e-5, activation: str = "relu",
                  negative_slope: float = 0.01, residual: torch.Tensor | None = None,
                  process_group=None, backend: str = "auto",
                  precision: str | None = None) -> torch.Tensor:
    """``act(batch_norm(conv2d(input, weight, bias)) + residual)`` in one call.

    The convolution arguments are :func:`conv2d`'s; the batch-norm ones are
    ``torch.nn.functional.batch_norm``'s (``bn_weight``/``bn_bias`` are γ/β, ``momentum`` the
    factor of the running-statistics update, which happens in place when ``training``).

    * ``training`` (or no running statistics): normalised with the batch statistics of the
      convolution output (float32), over every rank of ``process_group`` when one is given
      (as ``torch.nn.SyncBatchNorm``); the backward gives every gradient (input, weight,
      conv bias, γ, β, residual). Eager calls without a group normalise with torch's own
      ``batch_norm`` (less host time); under CUDA-graph capture and torch.compile the
      normalisation, activation and residual are fused passes (batchnorm.FUSED_IN_EAGER).
    * otherwise: the running statistics folded into a per-channel scale and shift of the
      convolution's fused epilogue — one convolution kernel.
    """
    return _conv_bn_act(conv2d, input, weight, bias, running_mean, running_var, bn_weight,
                        bn_bias, stride, padding, dilation, groups, training, momentum, eps,
                        activation, negative_slope, residual, process_group, backend,
                        precision)


def _conv_bn_act(conv, input, weight, bias, running_mean, running_var, bn_weight, bn_bias,
                 stride, padding, dilation, groups, training, momentum, eps, activation,
                 negative_slope, residual, process_group, backend, precision):
    from .batchnorm import bn_act

    k = weight.shape[0] if isinstance(weight, torch.Tensor) and weight.dim() > 0 else None
    for name, t in (("running_mean", running_mean), ("running_var", running_var),
                    ("bn_weight", bn_weight), ("bn_bias", bn_bias)):
        if t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) != (k,)):
            raise ConvError(f"{name}: expected a tensor of shape ({k},) (one value per output "
                            f"channel), got {getattr(t, 'shape', type(t).__name__)}")
    if (running_mean is None) != (running_var is None):
        raise ConvError("running_mean, running_var: give both or neither")
    eps = real_number("eps", eps, positive=True)
    momentum = real_number("momentum", momentum)
    negative_slope = real_number("negative_slope", negative_slope)
    Epilogue(activation=activation, negative_slope=negative_slope)  # validates both
    if training or running_mean is None:
        y = conv(input, weight, bias, stride, padding, dilation, groups, backend=backend,
                 precision=precision)
        if residual is not None:  # the checks the fused inference epilogue makes
            if not isinstance(residual, torch.Tensor):
                raise ConvTypeError(f"residual: expected a torch.Tensor or None, got "
                                    f"{type(residual).__name__}")
            if residual.shape != y.shape or residual.dtype != y.dtype \
                    or residual.device != y.device:
                raise ConvError(f"residual: expected shape {tuple(y.shape)}, dtype {y.dtype} "
                                f"on {y.device} (the output's), got {tuple(residual.shape)}, "
                                f"{residual.dtype} on {residual.device}")
        group = _sync_group(process_group) if training else None
        update = training and running_mean is not None
        return bn_act(y, bn_weight, bn_bias, residual, running_mean if update else None,
                      running_var if update else None, momentum, eps, activation,
                      negative_slope, group)
    # Inference: BatchNorm folded into the weight and bias, one convolution with its epilogue
    from .batchnorm import fold

    if not isinstance(weight, torch.Tensor):  # conv names the argument and what it expects
        return conv(input, weight, bias, stride, padding, dilation, groups, backend=backend)
    w, b = fold(weight, bias, running_mean, running_var, bn_weight, bn_bias, eps)
    return conv(input, w, b, stride, padding, dilation, groups, activation=activation,
                negative_slope=negative_slope, residual=residual, backend=backend,
                precision=precision)


def _sync_group(process_group):
    """The group to synchronise statistics over, or None when there is nothing to sync."""
    import torch.distributed as dist

    if process_group is None or not dist.is_available() or not dist.is_initialized():
        return None
    return process_group if dist.get_world_size(process_group) > 1 else None
