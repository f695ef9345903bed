"""Functional convolutions with torch.nn.functional's signature and a fused epilogue.

``fastconv.conv2d(x, w, b, stride, padding, dilation, groups)`` computes what
``torch.nn.functional.conv2d`` computes, ``fastconv.conv_transpose2d`` what
``F.conv_transpose2d`` computes; the keyword-only arguments add the epilogue
``act(scale·(conv + bias) + shift + residual)``, an output buffer, a backend and a precision.

Paths: a call that needs no gradient, outside torch.compile, runs a cached plan directly
(the lowest host overhead). One that needs a gradient runs a plan dispatched for a call with
a backward (each candidate timed with its backward); if that is aten's plain configuration,
whose ops torch differentiates, torch's autograd does the backward (cuDNN), otherwise the
plan runs inside ``plans.ConvFunction``, whose backward runs the data and weight gradients
through dispatch (fastconv's Triton kernels or aten). Under torch.compile the call is the
``fastconv::conv`` custom op (ops.py), with the same autograd formula, which the compiler
traces as one node; a call there that needs a gradient on data other than float32 is
torch's own ops instead (``as_torch_ops``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from . import dispatch, plans
from . import dispatch as _dispatch  # the module, where an argument is called dispatch
from .backends.aten import _flat_pad
from .batchnorm import bn_act, fold
from .devices import elsewhere
from .epilogue import Epilogue
from .epilogue import apply as apply_epilogue
from .errors import ConvError, ConvTypeError, real_number
from .plans import clear_plans  # noqa: F401 (public here since the first release)
from .precision import resolve
from .problem import normalize_geometry
from .spec import ConvCall, Norm, OpArgs

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
    call = ConvCall(1, False, stride, padding, dilation, groups, 0, activation,
                    negative_slope, backend, precision)
    return _conv(call, input, weight, bias, residual, scale, shift, out, dispatch)


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
    call = ConvCall(2, False, stride, padding, dilation, groups, 0, activation,
                    negative_slope, backend, precision)
    return _conv(call, input, weight, bias, residual, scale, shift, out, dispatch)


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
    call = ConvCall(1, True, stride, padding, dilation, groups, output_padding, activation,
                    negative_slope, backend, precision)
    return _conv(call, input, weight, bias, residual, scale, shift, out, dispatch)


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
    call = ConvCall(2, True, stride, padding, dilation, groups, output_padding, activation,
                    negative_slope, backend, precision)
    return _conv(call, input, weight, bias, residual, scale, shift, out, dispatch)


def _conv(call: ConvCall, input, weight, bias, residual, scale, shift, out, mode):
    device = elsewhere(input)
    if device is not None:  # (its kernels, handles and timings are the current device's)
        with torch.cuda.device(device):
            return _conv(call, input, weight, bias, residual, scale, shift, out, mode)
    if mode is None:
        return _conv_impl(call, input, weight, bias, residual, scale, shift, out)
    with dispatch.settings(mode):
        return _conv_impl(call, input, weight, bias, residual, scale, shift, out)


def _conv_impl(call: ConvCall, input, weight, bias, residual, scale, shift, out):
    if not isinstance(input, torch.Tensor):
        raise ConvTypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
    # (the C-level "any autocast" test first: 0.1 us against 0.5 for the per-device one)
    if torch._C._is_any_autocast_enabled() and torch.is_autocast_enabled(input.device.type):
        input, weight, bias, residual = _autocast(input.device.type, input, weight, bias,
                                                  residual)
    unbatched = input.dim() == call.rank + 1
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
        if compiling and needs_grad and call.backend == "auto":
            result = as_torch_ops(call, input, weight, bias, residual, scale, shift)
            if result is not None:
                return result.squeeze(0) if unbatched else result
        plan = None if compiling else plans.forward_plan(
            call, input, weight, bias, residual, scale, shift, None, grad=needs_grad)
        if plan is not None and plan.native_grad:
            # The forward runs on torch's own differentiable ops: torch's autograd gives the
            # backward (cuDNN's dgrad and wgrad in one call) at torch's host cost.
            result = plan.run(input, weight, bias, scale, shift, residual, None)
        else:
            result = _through_op(plan, call, input, weight, bias, residual, scale, shift)
        if out_b is not None:
            out_b.copy_(result)
    else:
        result = plans.forward_plan(call, input, weight, bias, residual, scale, shift,
                                    out_b).run(input, weight, bias, scale, shift, residual,
                                               out_b)
    if out is not None:
        return out
    return result.squeeze(0) if unbatched else result


def as_torch_ops(call: ConvCall, input, weight, bias, residual, scale, shift):
    """Under torch.compile, a call as torch's own differentiable ops (what aten's native
    plan runs: the convolution, then the epilogue), which Inductor lowers, fuses and
    differentiates itself: every call that needs gradients, and the modules' calls unless
    ``fastconv.compile`` chose fastconv's op for CUDA graphs (``compiled_as_torch``). Torch's
    ops check the operands. None for
    float32 data (whether torch's ops compute in the call's precision depends on cuDNN's
    TF32 flag, which a traced function cannot read) and for what aten does not run
    (asymmetric padding of a transposed convolution): fastconv's op then. Measured: the
    ``fastconv::conv`` op and its gradient ops cost more host time per training step than
    their kernels gain (benchmarks/NOTES.md, compile(optimize(model)))."""
    if input.dtype == torch.float32 or not isinstance(weight, torch.Tensor) \
            or weight.dim() != call.rank + 2:
        return None
    resolve(call.precision, input.dtype)  # a precision the dtype cannot run is refused
    stride, pre, post, dilation, opad = normalize_geometry(
        call.rank, weight.shape[2:], call.stride, call.padding, call.dilation,
        call.output_padding, call.transposed)
    groups = call.groups
    if call.transposed:
        if pre != post:
            return None
        fn = F.conv_transpose1d if call.rank == 1 else F.conv_transpose2d
        y = fn(input, weight, bias, stride, pre, opad, groups, dilation)
    else:
        fn = F.conv1d if call.rank == 1 else F.conv2d
        if pre != post:
            input = F.pad(input, _flat_pad(pre, post))
        y = fn(input, weight, bias, stride, pre if pre == post else 0, dilation, groups)
    return apply_epilogue(y, scale, shift, residual, call.activation, call.negative_slope)


_GEOMETRY: dict[tuple, tuple] = {}  # normalised geometry of the autograd / compile path


def _autocast(device_type, *tensors):
    """Cast floating-point operands (not float64, as torch's autocast) to the autocast dtype;
    scale and shift stay as given, like BatchNorm's parameters."""
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if autocast_casts(t, dtype) else t for t in tensors)


def autocast_casts(t, dtype: torch.dtype) -> bool:
    """Whether autocast to ``dtype`` changes ``t``: a floating tensor of another dtype, not
    float64 (torch's rule)."""
    return (isinstance(t, torch.Tensor) and t.dtype is not dtype and t.is_floating_point()
            and t.dtype is not torch.float64)


def _through_op(plan, call: ConvCall, input, weight, bias, residual, scale, shift):
    """The autograd path: the ``fastconv::conv`` op under torch.compile, else
    ``plans.ConvFunction`` running ``plan`` (the forward dispatch chose for a call with a
    backward)."""
    from . import ops  # registers the custom ops on first use

    if not isinstance(weight, torch.Tensor):
        raise ConvTypeError(f"weight: expected a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != call.rank + 2:
        raise ConvError(f"weight: expected a {call.rank + 2}-D tensor for conv{call.rank}d, "
                        f"got shape {tuple(weight.shape)}")
    args = op_args(call, weight.shape[2:], input.dtype)
    if torch.compiler.is_compiling():
        return ops.conv(input, weight, bias, scale, shift, residual, *args)
    return plans.ConvFunction.apply(plan, input, weight, bias, scale, shift, residual, *args)


def op_args(call: ConvCall, kernel, dtype: torch.dtype) -> OpArgs:
    """The ``fastconv::conv`` op's (and ``plans.ConvFunction``'s) arguments after the
    tensors, for ``call`` with a weight of spatial shape ``kernel`` on ``dtype`` input."""
    try:  # (not while tracing: a traced lookup guards on the dict, whose growth recompiles)
        key = None if torch.compiler.is_compiling() else (call[:7], kernel, call.kinds())
        geometry = None if key is None else _GEOMETRY.get(key)
    except TypeError:  # unhashable (a list): normalise every time
        key, geometry = None, None
    if geometry is None:
        geometry = normalize_geometry(call.rank, kernel, call.stride, call.padding,
                                      call.dilation, call.output_padding, call.transposed)
        if key is not None and len(_GEOMETRY) < plans.PLANS_MAX:
            _GEOMETRY[key] = geometry
    stride, pre, post, dilation, opad = geometry
    return OpArgs(list(stride), list(pre), list(post), list(dilation), call.groups,
                  call.transposed, list(opad), call.activation,
                  real_number("negative_slope", call.negative_slope), call.backend,
                  resolve(call.precision, dtype).value)


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
    device = elsewhere(input)
    with _dispatch.settings(dispatch), \
            torch.cuda.device(device) if device is not None else contextlib.nullcontext():
        call = ConvCall(rank, transposed, stride, padding, dilation, groups, output_padding,
                        activation, negative_slope, backend, precision)
        problem = plans.forward_problem(call, input, weight, bias, residual, scale, shift,
                                        None)
        trial = plans.forward_trial(problem, input, weight, bias, scale, shift, residual, None)
        return _dispatch.explain(problem, backend, run=trial)



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
    call = ConvCall(1, False, stride, padding, dilation, groups, 0, activation,
                    negative_slope, backend, precision)
    norm = Norm(bn_weight, bn_bias, running_mean, running_var, momentum, eps)
    return _conv_bn_act(call, input, weight, bias, residual, norm, training, process_group)


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
    call = ConvCall(2, False, stride, padding, dilation, groups, 0, activation,
                    negative_slope, backend, precision)
    norm = Norm(bn_weight, bn_bias, running_mean, running_var, momentum, eps)
    return _conv_bn_act(call, input, weight, bias, residual, norm, training, process_group)


def _conv_bn_act(call: ConvCall, input, weight, bias, residual, norm: Norm, training: bool,
                 process_group):
    device = elsewhere(input)
    if device is not None:  # (its kernels run on the current device: fastconv.devices)
        with torch.cuda.device(device):
            return _conv_bn_act(call, input, weight, bias, residual, norm, training,
                                process_group)
    k = weight.shape[0] if isinstance(weight, torch.Tensor) and weight.dim() > 0 else None
    for name, t in (("running_mean", norm.running_mean), ("running_var", norm.running_var),
                    ("bn_weight", norm.weight), ("bn_bias", norm.bias)):
        if t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) != (k,)):
            raise ConvError(f"{name}: expected a tensor of shape ({k},) (one value per output "
                            f"channel), got {getattr(t, 'shape', type(t).__name__)}")
    if (norm.running_mean is None) != (norm.running_var is None):
        raise ConvError("running_mean, running_var: give both or neither")
    eps = real_number("eps", norm.eps, positive=True)
    momentum = real_number("momentum", norm.momentum)
    slope = real_number("negative_slope", call.negative_slope)
    Epilogue(activation=call.activation, negative_slope=slope)  # validates both
    # the convolution alone (named tuples built directly: _replace costs ~1 us a call)
    conv = ConvCall(*call[:7], "none", 0.01, call.backend, call.precision)
    if training or norm.running_mean is None:
        y = _conv(conv, input, weight, bias, None, None, None, None, None)
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
        update = training and norm.running_mean is not None  # (else no statistics updated)
        norm = Norm(norm.weight, norm.bias, norm.running_mean if update else None,
                    norm.running_var if update else None, momentum, eps)
        return bn_act(y, norm, residual, call.activation, slope, group)
    # Inference: BatchNorm folded into the weight and bias, one convolution with its epilogue
    if not isinstance(weight, torch.Tensor):  # conv names the argument and what it expects
        return _conv(conv, input, weight, bias, None, None, None, None, None)
    w, b = fold(weight, bias, norm.running_mean, norm.running_var, norm.weight, norm.bias,
                eps)
    return _conv(call, input, w, b, residual, None, None, None, None)


def _sync_group(process_group):
    """The group to synchronise statistics over, or None when there is nothing to sync."""
    import torch.distributed as dist

    if process_group is None or not dist.is_available() or not dist.is_initialized():
        return None
    return process_group if dist.get_world_size(process_group) > 1 else None
