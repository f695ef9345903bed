"""causal_conv1d's short-filter kernels (backends/triton/shortconv.py) as torch ops, with
their autograd formula, for torch.compile's graphs.

* ``fastconv::short_conv`` — the forward: ``act(bias + causal depthwise conv1d)`` with
  optional initial states and ``seq_idx`` (``seqconv.causal_conv1d``'s definition);
  differentiable in x, the initial states, weight and bias;
* ``fastconv::short_conv_backward`` — its gradients in one pass of the backward kernel.

In eager mode ``seqconv`` launches the kernels itself; while torch.compile traces it calls
:func:`short_conv`. On a GPU the ops are ``torch.library.triton_op``s: they launch the
kernels through ``wrap_triton``, so Inductor traces them and its generated code launches
the kernels itself (as ``custom_op``s, whose implementations run behind Python's dispatch,
an inference step of Mamba-130M's block took 0.085 ms more on an H200,
benchmarks/results/seqconv/2026-11-29-compile). Under Triton's interpreter (CPU tensors;
torch cannot trace it) the same implementations are ``custom_op``s (``*_interpreted``) with
registered fakes. The implementations are ``seqconv``'s
(:func:`~fastconv.seqconv.short_conv_run`, :func:`~fastconv.seqconv.short_conv_grads`):
where the kernels failed in the process they answer with torch operations.

No ``from __future__ import annotations`` here: torch.library reads the annotations.
"""

import torch
from torch import Tensor
from torch.library import wrap_triton


def short_conv(x, initial_states, weight, bias, silu: bool, seq_idx):
    """The forward op for x's device: a GPU's Triton op, else the interpreter's."""
    op = _short_conv if x.device.type == "cuda" else _short_conv_interpreted
    return op(x, initial_states, weight, bias, silu, seq_idx)


def _traced(kernel, grid: tuple, *args, **meta) -> None:
    """A kernel launch that torch.compile traces (``run`` of shortconv's functions)."""
    wrap_triton(kernel)[grid](*args, **meta)


def _launched(kernel, grid: tuple, *args, **meta) -> None:
    from .backends.triton.launch import launch

    launch(kernel, grid, *args, **meta)


@torch.library.triton_op("fastconv::short_conv", mutates_args=())
def _short_conv(x: Tensor, initial_states: Tensor | None, weight: Tensor,
                bias: Tensor | None, silu: bool, seq_idx: Tensor | None) -> Tensor:
    from .seqconv import short_conv_run

    return short_conv_run(x, initial_states, weight, bias, silu, seq_idx, _traced)


@torch.library.triton_op("fastconv::short_conv_backward", mutates_args=())
def _short_conv_backward(dy: Tensor, x: Tensor, initial_states: Tensor | None,
                         weight: Tensor, bias: Tensor | None, silu: bool, init_grad: bool,
                         seq_idx: Tensor | None) -> list[Tensor]:
    """``[dx, d weight]``, then ``d bias`` where there is a bias, ``d initial_states`` where
    ``init_grad``."""
    from .seqconv import short_conv_grads

    return short_conv_grads(dy, x, initial_states, weight, bias, silu, init_grad, seq_idx,
                            _traced)


@torch.library.custom_op("fastconv::short_conv_interpreted", mutates_args=())
def _short_conv_interpreted(x: Tensor, initial_states: Tensor | None, weight: Tensor,
                            bias: Tensor | None, silu: bool, seq_idx: Tensor | None) -> Tensor:
    from .seqconv import short_conv_run

    return short_conv_run(x, initial_states, weight, bias, silu, seq_idx, _launched)


@_short_conv_interpreted.register_fake
def _forward_fake(x, initial_states, weight, bias, silu, seq_idx):
    return torch.empty_like(x)


@torch.library.custom_op("fastconv::short_conv_backward_interpreted", mutates_args=())
def _short_conv_backward_interpreted(dy: Tensor, x: Tensor, initial_states: Tensor | None,
                                     weight: Tensor, bias: Tensor | None, silu: bool,
                                     init_grad: bool,
                                     seq_idx: Tensor | None) -> list[Tensor]:
    from .seqconv import short_conv_grads

    return short_conv_grads(dy, x, initial_states, weight, bias, silu, init_grad, seq_idx,
                            _launched)


@_short_conv_backward_interpreted.register_fake
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


def _gradients(backward_op):
    def backward(ctx, dy):
        x, initial_states, weight, bias, seq_idx = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grads = iter(backward_op(dy, x, initial_states, weight, bias, ctx.silu, needs[1],
                                 seq_idx))
        dx, dw = next(grads), next(grads)
        db = next(grads) if bias is not None else None
        dh = next(grads) if needs[1] else None
        return (dx if needs[0] else None, dh, dw if needs[2] else None,
                db if needs[3] else None, None, None)
    return backward


_short_conv.register_autograd(_gradients(_short_conv_backward), setup_context=_setup_context)
_short_conv_interpreted.register_autograd(_gradients(_short_conv_backward_interpreted),
                                          setup_context=_setup_context)
