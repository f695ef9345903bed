"""causal_conv1d's short-filter kernels (backends/triton/shortconv.py) as torch custom ops,
with their autograd formula, for torch.compile's graphs.

* ``fastconv::short_conv`` — the forward: ``act(bias + causal depthwise conv1d)`` with
  optional initial states and ``seq_idx`` (``seqconv.causal_conv1d``'s definition);
  differentiable in x, the initial states, weight and bias;
* ``fastconv::short_conv_backward`` — its gradients in one pass of the backward kernel.

In eager mode ``seqconv`` launches the kernels itself (a custom op's dispatch costs tens of
microseconds of host time); while torch.compile traces it calls ``short_conv``, so that the
compiled graph runs the kernels as one opaque node each way (the fakes give the shapes and
strides) instead of torch's padded convolution. The implementations are ``seqconv``'s
(:func:`~fastconv.seqconv.short_conv_run`, :func:`~fastconv.seqconv.short_conv_grads`),
installed by it at its import (:func:`implement`: this module sits below it): they answer
with torch operations where the kernels failed in the process.

No ``from __future__ import annotations`` here: torch.library reads the annotations.
"""

import torch
from torch import Tensor

#: the ops' implementations, "forward" and "gradients" (:func:`implement`)
IMPLEMENTATION: dict = {}


def implement(forward, gradients) -> None:
    """Install the ops' implementations: ``forward(x, initial_states, weight, bias, silu,
    seq_idx)`` and ``gradients(dy, x, initial_states, weight, bias, silu, init_grad,
    seq_idx)`` (the lists :func:`_backward_op` returns)."""
    IMPLEMENTATION.update(forward=forward, gradients=gradients)


def _forward(x: Tensor, initial_states: Tensor | None, weight: Tensor, bias: Tensor | None,
             silu: bool, seq_idx: Tensor | None) -> Tensor:
    return IMPLEMENTATION["forward"](x, initial_states, weight, bias, silu, seq_idx)


short_conv = torch.library.custom_op("fastconv::short_conv", _forward, mutates_args=())


@short_conv.register_fake
def _forward_fake(x, initial_states, weight, bias, silu, seq_idx):
    return torch.empty_like(x)


def _backward_op(dy: Tensor, x: Tensor, initial_states: Tensor | None, weight: Tensor,
                 bias: Tensor | None, silu: bool, init_grad: bool,
                 seq_idx: Tensor | None) -> list[Tensor]:
    """``[dx, d weight]``, then ``d bias`` where there is a bias, ``d initial_states`` where
    ``init_grad``."""
    return IMPLEMENTATION["gradients"](dy, x, initial_states, weight, bias, silu, init_grad,
                                       seq_idx)


short_conv_backward = torch.library.custom_op("fastconv::short_conv_backward", _backward_op,
                                              mutates_args=())


@short_conv_backward.register_fake
def _backward_fake(dy, x, initial_states, weight, bias, silu, init_grad, seq_idx):
    grads = [torch.empty_like(x), weight.new_empty(weight.shape)]
    if bias is not None:
        grads.append(bias.new_empty(bias.shape))
    if init_grad:
        grads.append(x.new_empty(initial_states.shape))
    return grads


def _setup_context(ctx, inputs, output):
    x, initial_states, weight, bias, silu, seq_idx = inputs
    ctx.save_for_backward(x, initial_states, weight, bias, seq_idx)
    ctx.silu = silu


def _backward(ctx, dy):
    x, initial_states, weight, bias, seq_idx = ctx.saved_tensors
    needs = ctx.needs_input_grad
    grads = iter(short_conv_backward(dy, x, initial_states, weight, bias, ctx.silu, needs[1],
                                     seq_idx))
    dx, dw = next(grads), next(grads)
    db = next(grads) if bias is not None else None
    dh = next(grads) if needs[1] else None
    return (dx if needs[0] else None, dh, dw if needs[2] else None,
            db if needs[3] else None, None, None)


short_conv.register_autograd(_backward, setup_context=_setup_context)
