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

No ``from __future__ import annotations`` here: torch.library reads the annotations.
"""


import torch
import torch.nn.functional as F
from torch import Tensor

from . import dispatch, functional
from .epilogue import Epilogue
from .precision import accumulate_dtype
from .problem import ConvProblem, empty_in_layout, layout_of


def conv_impl(input, weight, bias, scale, shift, residual, stride, pad_pre, pad_post,
              dilation, groups, transposed, output_padding, activation, negative_slope,
              backend, precision):
    """``fastconv::conv`` without the op's layout guarantee (eager autograd uses it)."""
    return functional.run_forward(
        input.dim() - 2, transposed, input, weight, bias, tuple(stride),
        tuple(zip(pad_pre, pad_post)), tuple(dilation), groups, tuple(output_padding),
        activation, negative_slope, residual, scale, shift, None, backend, precision)


def _conv_op(input: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor | None,
             shift: Tensor | None, residual: Tensor | None, stride: list[int],
             pad_pre: list[int], pad_post: list[int], dilation: list[int], groups: int,
             transposed: bool, output_padding: list[int], activation: str,
             negative_slope: float, backend: str, precision: str) -> Tensor:
    y = conv_impl(input, weight, bias, scale, shift, residual, stride, pad_pre, pad_post,
                  dilation, groups, transposed, output_padding, activation, negative_slope,
                  backend, precision)
    if layout_of(y) != layout_of(input):  # keep the layout the fake implementation promises
        y = empty_in_layout(y.shape, layout_of(input), y.dtype, y.device).copy_(y)
    return y


conv = torch.library.custom_op("fastconv::conv", _conv_op, mutates_args=())


@conv.register_fake
def _conv_fake(input, weight, bias, scale, shift, residual, stride, pad_pre, pad_post,
               dilation, groups, transposed, output_padding, activation, negative_slope,
               backend, precision):
    epilogue = Epilogue(activation=activation, negative_slope=negative_slope,
                        has_scale=scale is not None,
                        has_shift=shift is not None or bias is not None,
                        has_residual=residual is not None)
    problem = ConvProblem.from_tensors(
        input, weight, bias, tuple(stride), tuple(zip(pad_pre, pad_post)), tuple(dilation),
        groups, rank=input.dim() - 2, transposed=transposed,
        output_padding=tuple(output_padding), precision=precision, epilogue=epilogue,
        residual=residual, scale=scale, shift=shift)
    return problem.new_output(input.device)


def input_grad_impl(grad_out: Tensor, input: Tensor, weight: Tensor, stride: list[int],
                    pad_pre: list[int], pad_post: list[int], dilation: list[int], groups: int,
                    backend: str, precision: str) -> Tensor:
    """The gradient of ``conv(input, weight)`` with respect to ``input`` (shape and layout
    of ``input``; its values are not read)."""
    out = torch.empty_like(input)
    if out.numel() == 0:
        return out
    return functional.run_grad("dgrad", grad_out, input, weight, stride, pad_pre, pad_post,
                               dilation, groups, backend, precision, out)


conv_input_grad = torch.library.custom_op("fastconv::conv_input_grad", input_grad_impl,
                                          mutates_args=())


@conv_input_grad.register_fake
def _input_grad_fake(grad_out, input, weight, *args):
    return torch.empty_like(input)


def weight_grad_impl(grad_out: Tensor, input: Tensor, weight: Tensor, stride: list[int],
                     pad_pre: list[int], pad_post: list[int], dilation: list[int], groups: int,
                     backend: str, precision: str) -> Tensor:
    """The gradient of ``conv(input, weight)`` with respect to ``weight`` (shape and layout
    of ``weight``; its values are not read). Deterministic with the Triton kernels."""
    out = torch.empty_like(weight)
    if grad_out.numel() == 0:
        return out.zero_()
    return functional.run_grad("wgrad", grad_out, input, weight, stride, pad_pre, pad_post,
                               dilation, groups, backend, precision, out)


conv_weight_grad = torch.library.custom_op("fastconv::conv_weight_grad", weight_grad_impl,
                                           mutates_args=())


@conv_weight_grad.register_fake
def _weight_grad_fake(grad_out, input, weight, *args):
    return torch.empty_like(weight)


def _setup_context(ctx, inputs, output):
    # The output only where the activation's derivative is read from it: saving it always
    # made a later in-place op on it (an SE block's SiLU(inplace=True)) fail the backward.
    activation, slope = inputs[13], inputs[14]
    ctx.save_for_backward(*inputs[:6], output if derivative_from_output(activation, slope)
                          else None)
    ctx.args = inputs[6:]


def derivative_from_output(activation: str, negative_slope: float) -> bool:
    """Whether ``activation_grad`` reads the output (else it recomputes the pre-activation,
    or needs nothing: no activation)."""
    return activation in ("relu", "relu6", "sigmoid", "tanh") or (
        activation == "leaky_relu" and negative_slope > 0)


def _grads_through_ops(grad_out, input, weight, stride, pre, post, dilation, groups, backend,
                       precision, need_input, need_weight):
    geo = (stride, pre, post, dilation, groups, backend, precision)
    return (conv_input_grad(grad_out, input, weight, *geo) if need_input else None,
            conv_weight_grad(grad_out, input, weight, *geo) if need_weight else None)


def _backward(ctx, grad):
    return backward_formula(ctx, grad, conv, _grads_through_ops)


class ConvFunction(torch.autograd.Function):
    """The same forward and backward as the ``fastconv::conv`` op, for eager autograd
    without the custom-op machinery (measured: about 0.6 ms of host time per training step
    of one convolution went into torch.library's dispatch wrappers). Under torch.compile the
    functional API uses the op, which the compiler can trace.

    ``apply(plan, *op_args)``: ``plan`` is the forward plan dispatch chose for the call
    (``functional.forward_plan(..., grad=True)``), run as it is; the other arguments are
    ``fastconv::conv``'s."""

    @staticmethod
    def forward(ctx, plan, *args):
        y = plan.run(*args[:6], None)  # input, weight, bias, scale, shift, residual, out
        _setup_context(ctx, args, y)
        ctx.settings = dispatch.captured()
        return y

    @staticmethod
    def backward(ctx, grad):
        # the dispatch settings of the forward call (a CUDA backward runs on autograd's
        # device thread, which does not see the caller's settings() context)
        with dispatch.restored(ctx.settings):
            return (None,) + backward_formula(ctx, grad, conv_impl, functional.run_grads,
                                              ctx.needs_input_grad[1:])


def backward_formula(ctx, grad, conv, conv_grads, need=None):
    """The gradients of every ``fastconv::conv`` input (see the module docstring), with the
    convolutions run by the given callables — the ops (traceable) or their implementations:
    ``conv`` as ``fastconv::conv`` and ``conv_grads(dy, x, w, stride, pad_pre, pad_post,
    dilation, groups, backend, precision, need_input, need_weight) -> (dx, dw)``. ``need``:
    which of the op's inputs need a gradient (default ``ctx.needs_input_grad``)."""
    input, weight, bias, scale, shift, residual, y = ctx.saved_tensors
    (stride, pre, post, dilation, groups, transposed, opad, activation, slope, backend,
     precision) = ctx.args
    need = ctx.needs_input_grad if need is None else need
    geo = (stride, pre, post, dilation, groups, transposed, opad)

    def pre_activation():
        return conv(input, weight, bias, scale, shift, residual, *geo, "none", slope, backend,
                    precision)

    dz = activation_grad(grad, y, activation, slope, pre_activation)
    dims = [0, *range(2, dz.dim())]
    view = (1, -1) + (1,) * (dz.dim() - 2)
    g_residual = dz if need[5] else None
    acc = accumulate_dtype(dz.dtype)  # per-channel sums
    g_shift = dz.sum(dims, dtype=acc).to(shift.dtype) if need[4] else None
    g_scale = None
    if need[3]:
        c = conv(input, weight, bias, None, None, None, *geo, "none", slope, backend, precision)
        g_scale = (dz.to(acc) * c.to(acc)).sum(dims).to(scale.dtype)
    dc = dz if scale is None else dz * scale.to(dz.dtype).view(view)
    g_bias = dc.sum(dims, dtype=acc).to(bias.dtype) if need[2] else None
    g_input = g_weight = None
    if transposed:
        if need[0]:
            g_input = conv(dc, weight, None, None, None, None, stride, pre, pre, dilation,
                           groups, False, [0] * len(stride), "none", slope, backend, precision)
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
            _, g_weight = conv_grads(x, dc, weight, stride, pre, pre, dilation, groups,
                                     backend, precision, False, True)
    elif need[0] or need[1]:
        g_input, g_weight = conv_grads(dc, input, weight, stride, pre, post, dilation, groups,
                                       backend, precision, need[0], need[1])
    return (g_input, g_weight, g_bias, g_scale, g_shift, g_residual) + (None,) * len(ctx.args)


conv.register_autograd(_backward, setup_context=_setup_context)


def activation_grad(grad: Tensor, y: Tensor, activation: str, negative_slope: float,
                    pre_activation) -> Tensor:
    """``act'(z)·grad`` given the output ``y``; ``pre_activation()`` recomputes ``z`` for
    the activations whose derivative ``y`` does not determine."""
    aten = torch.ops.aten
    if activation == "none":
        return grad
    if activation == "relu":
        return aten.threshold_backward(grad, y, 0)
    if activation == "relu6":  # 0 < y < 6 exactly where 0 < z < 6
        return aten.hardtanh_backward(grad, y, 0.0, 6.0)
    if activation == "leaky_relu" and negative_slope > 0:  # y > 0 exactly where z > 0
        return aten.leaky_relu_backward(grad, y, negative_slope, False)
    if activation == "sigmoid":
        return aten.sigmoid_backward(grad, y)
    if activation == "tanh":
        return aten.tanh_backward(grad, y)
    z = pre_activation()  # (the cases above are derivative_from_output's)
    if activation == "leaky_relu":
        return aten.leaky_relu_backward(grad, z, negative_slope, False)
    if activation == "silu":
        return aten.silu_backward(grad, z)
    if activation in ("gelu", "gelu_tanh"):
        return aten.gelu_backward(grad, z, approximate="tanh" if activation == "gelu_tanh"
                                  else "none")
    if activation == "hardswish":
        return aten.hardswish_backward(grad, z)
    raise AssertionError(f"no derivative for activation {activation!r}")
