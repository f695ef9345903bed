"""fastconv's convolutions as torch custom ops, with their autograd formulas.

Three ops, each with a fake (meta) implementation so that ``torch.compile(fullgraph=True)``
traces them as single nodes and CUDA graphs capture them:

* ``fastconv::conv`` — convolution or transposed convolution with the fused epilogue
  ``y = act(scale·(conv + bias) + shift + residual)``; differentiable in every tensor;
* ``fastconv::conv_input_grad`` / ``fastconv::conv_weight_grad`` — the data and weight
  gradients of a (non-transposed) convolution, dispatched like the forward (Triton dgrad and
  wgrad kernels or aten, whichever dispatch picks).

Backward of ``y`` with ``z`` the pre-activation and ``c = conv + bias``:
``dz = act'(z)·dy`` (from ``y`` itself for relu, relu6, leaky_relu, sigmoid and tanh;
other activations recompute ``z`` with one more forward), ``d residual = dz``,
``d shift = Σ dz``, ``d scale = Σ dz·c`` (recomputes ``c``), ``dc = scale·dz``,
``d bias = Σ dc``, ``dx = dgrad(dc)``, ``dw = wgrad(dc)``. A transposed convolution's data
gradient is the forward convolution of ``dc`` and its weight gradient the wgrad of that
convolution with ``x`` in the role of the output gradient.

The ops run their operands as buffers of the compiled graph (``context.transient_operands``):
Inductor reuses a buffer for another value without moving its version counter, so a weight
derived from an operand (a packed copy) is made afresh at each call, never kept by the
operand's identity (a compiled model's first call, after an eager copy of it had packed
weights of the same shapes, ran on another layer's packed weight).

The ops' arguments are flat, as torch.library's schemas are: ``spec.OpArgs`` names the
non-tensor ones in order, and the implementations take them as such.

No ``from __future__ import annotations`` here: torch.library reads the annotations.
"""


import torch
from torch import Tensor

from .context import transient_operands
from .epilogue import Epilogue
from .plans import backward_formula, conv_impl, run_grad, setup_context
from .problem import ConvProblem, empty_in_layout, layout_of
from .spec import GradArgs, OpArgs


def _conv_op(input: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor | None,
             shift: Tensor | None, residual: Tensor | None, *args) -> Tensor:
    """``args``: the schema's other arguments (:class:`~fastconv.spec.OpArgs`' fields)."""
    with transient_operands():
        y = conv_impl(input, weight, bias, scale, shift, residual, *args)
    if layout_of(y) != layout_of(input):  # keep the layout the fake implementation promises
        y = empty_in_layout(y.shape, layout_of(input), y.dtype, y.device).copy_(y)
    return y


#: the op's schema: the six tensors, then OpArgs' fields in order (``SymInt``: sizes that
#: torch.compile may trace symbolically)
_CONV_SCHEMA = ("(Tensor input, Tensor weight, Tensor? bias, Tensor? scale, Tensor? shift, "
                "Tensor? residual, SymInt[] stride, SymInt[] pad_pre, SymInt[] pad_post, "
                "SymInt[] dilation, SymInt groups, bool transposed, SymInt[] output_padding, "
                "str activation, float negative_slope, str backend, str precision) -> Tensor")
conv = torch.library.custom_op("fastconv::conv", _conv_op, mutates_args=(),
                               schema=_CONV_SCHEMA)


@conv.register_fake
def _conv_fake(input, weight, bias, scale, shift, residual, *args):
    a = OpArgs(*args)
    epilogue = Epilogue(activation=a.activation, negative_slope=a.negative_slope,
                        has_scale=scale is not None,
                        has_shift=shift is not None or bias is not None,
                        has_residual=residual is not None)
    problem = ConvProblem.from_tensors(
        input, weight, bias, tuple(a.stride), tuple(zip(a.pad_pre, a.pad_post)),
        tuple(a.dilation), a.groups, rank=input.dim() - 2, transposed=a.transposed,
        output_padding=tuple(a.output_padding), precision=a.precision, epilogue=epilogue,
        residual=residual, scale=scale, shift=shift)
    return problem.new_output(input.device)


def input_grad_impl(grad_out: Tensor, input: Tensor, weight: Tensor, stride: list[int],
                    pad_pre: list[int], pad_post: list[int], dilation: list[int], groups: int,
                    backend: str, precision: str) -> Tensor:
    """The gradient of ``conv(input, weight)`` with respect to ``input`` (shape and layout
    of ``input``; its values are not read). The plan allocates the result itself: aten's
    convolution_backward has no ``out=``, and copying its result into a preallocated
    tensor cost a full pass over ``dx`` (0.70-0.94x torch's dgrad on the depthwise layers,
    benchmarks/NOTES.md); the copy is made only where the strides differ."""
    if input.numel() == 0:
        return torch.empty_like(input)
    with transient_operands():
        dx = run_grad("dgrad", grad_out, input, weight,
                      GradArgs(stride, pad_pre, pad_post, dilation, groups, backend, precision))
    return _with_strides_of(dx, input)  # the registered fake promises empty_like(input)


conv_input_grad = torch.library.custom_op("fastconv::conv_input_grad", input_grad_impl,
                                          mutates_args=())


@conv_input_grad.register_fake
def _input_grad_fake(grad_out, input, weight, *args):
    return torch.empty_like(input)


def weight_grad_impl(grad_out: Tensor, input: Tensor, weight: Tensor, stride: list[int],
                     pad_pre: list[int], pad_post: list[int], dilation: list[int], groups: int,
                     backend: str, precision: str) -> Tensor:
    """The gradient of ``conv(input, weight)`` with respect to ``weight`` (shape and layout
    of ``weight``; its values are not read). Deterministic with the Triton kernels. As
    ``input_grad_impl``, the plan allocates the result: copying aten's result into a
    preallocated tensor was one more kernel per call (0.92-0.98x torch's wgrad under CUDA
    graphs on the depthwise layers, benchmarks/NOTES.md)."""
    if grad_out.numel() == 0:
        return torch.zeros_like(weight)
    with transient_operands():
        dw = run_grad("wgrad", grad_out, input, weight,
                      GradArgs(stride, pad_pre, pad_post, dilation, groups, backend, precision))
    return _with_strides_of(dw, weight)


def _with_strides_of(t: Tensor, like: Tensor) -> Tensor:
    """``t`` (shaped as ``like``) with ``like``'s strides, as the ops' fakes promise: itself,
    a view where the strides differ only along dimensions of size 1 (the same addresses: a
    depthwise weight (K, 1, R, S) is both layouts), else a copy."""
    if t.stride() == like.stride():
        return t
    if all(a == b or n == 1 for a, b, n in zip(t.stride(), like.stride(), t.shape)):
        return t.as_strided(t.shape, like.stride())
    return torch.empty_like(like).copy_(t)


conv_weight_grad = torch.library.custom_op("fastconv::conv_weight_grad", weight_grad_impl,
                                           mutates_args=())


@conv_weight_grad.register_fake
def _weight_grad_fake(grad_out, input, weight, *args):
    return torch.empty_like(weight)


def _grads_through_ops(grad_out, input, weight, geometry: GradArgs, need_input: bool,
                       need_weight: bool):
    return (conv_input_grad(grad_out, input, weight, *geometry) if need_input else None,
            conv_weight_grad(grad_out, input, weight, *geometry) if need_weight else None)


def _backward(ctx, grad):
    return backward_formula(ctx, grad, conv, _grads_through_ops)


conv.register_autograd(_backward, setup_context=setup_context)


