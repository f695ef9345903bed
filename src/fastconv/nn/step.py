"""One eager training forward's host work done in batches: the optimized model's convolution
parameters cast to the autocast dtype by one multi-tensor copy (one autograd node, where
torch's autocast makes one cast and one node per layer, and one cast back per layer in the
backward), and its BatchNorms' ``num_batches_tracked`` incremented by one op after the
forward (where each BatchNorm increments its own).

``optimize``'s model opens a :func:`training_step` around each eager training forward; the
modules of this package read it with :func:`current`. The values are those of the per-layer
work: the same rounding of the same weights, the same counts. What moves is when the work
happens: every weight gradient reaches its parameter when the cast node runs, once the
whole backward has reached it (so the step is not batched under ``torch.distributed``,
whose gradient buckets start as each layer's gradient is ready), and a counter moves at the
end of the forward (a hook reading it mid-forward sees the count before the step).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator

import torch
from torch import Tensor


class Step:
    """What one forward's layers share: ``casts`` (id of a parameter -> (its cast to
    ``dtype``, the parameter's version when cast)) and the counters to increment when the
    forward ends (id -> [tensor, count])."""

    __slots__ = ("casts", "dtype", "counters")

    def __init__(self, casts: dict[int, tuple[Tensor, int]], dtype: torch.dtype | None):
        self.casts = casts
        self.dtype = dtype
        self.counters: dict[int, list] = {}

    def cast(self, t: Tensor, dtype: torch.dtype) -> Tensor:
        """``t`` cast to ``dtype`` by this step, else ``t`` itself: autocast then casts it
        as usual (a tensor the step did not cast, another autocast dtype inside the
        forward, or a parameter changed in place since the step cast it, e.g. by a
        forward pre-hook)."""
        hit = self.casts.get(id(t))
        if hit is None or dtype is not self.dtype or hit[1] != t._version:
            return t
        return hit[0]

    def count(self, tracked: Tensor) -> None:
        """``tracked += 1`` when the forward ends."""
        hit = self.counters.get(id(tracked))
        if hit is None:
            self.counters[id(tracked)] = [tracked, 1]
        else:
            hit[1] += 1


_STEP: contextvars.ContextVar[Step | None] = contextvars.ContextVar("fastconv_step",
                                                                      default=None)


def current() -> Step | None:
    """The training step open around this forward, if any (never inside torch.compile's
    trace, which opens none and cannot trace a ContextVar's get)."""
    if torch.compiler.is_compiling():
        return None
    return _STEP.get()


class _Cast(torch.autograd.Function):
    """``tensors`` (one dtype) cast to ``dtype`` by one multi-tensor copy; the backward is
    the same cast of the gradients back (itself differentiable)."""

    @staticmethod
    def forward(ctx, dtype: torch.dtype, *tensors: Tensor):
        ctx.set_materialize_grads(False)  # a layer not called this step: no zeros made
        ctx.source = tensors[0].dtype
        out = [torch.empty_like(t, dtype=dtype) for t in tensors]
        torch._foreach_copy_(out, list(tensors))
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        present = [i for i, g in enumerate(grads) if g is not None]
        result = [None] * len(grads)
        if present:
            for i, g in zip(present, _Cast.apply(ctx.source, *[grads[i] for i in present])):
                result[i] = g
        return (None, *result)


def _casts(params: Iterable[Tensor], dtype: torch.dtype) -> dict[int, tuple[Tensor, int]]:
    """id of each parameter autocast would cast (float32 ones requiring a gradient; each
    once) -> (its cast to ``dtype``, a half-precision autocast dtype, made by one
    :class:`_Cast`; its version)."""
    todo = {}
    for p in params:
        if p.requires_grad and p.dtype is torch.float32:
            todo[id(p)] = p
    if not todo:
        return {}
    return {key: (c, p._version) for (key, p), c in
            zip(todo.items(), _Cast.apply(dtype, *todo.values()))}


def batches_casts() -> bool:
    """Whether a training step may batch the casts: not under ``torch.distributed`` (its
    gradient buckets start as each layer's gradient is ready)."""
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def training_step(params: Iterable[Tensor], dtype: torch.dtype | None) -> Iterator[Step]:
    """Opens a :class:`Step` for one forward: ``params`` cast to ``dtype`` (the autocast
    dtype; None: nothing cast), and the counters the layers deferred incremented when the
    forward ends, also when it raises (torch's layers increment before they compute)."""
    casts = _casts(params, dtype) if dtype is not None and dtype is not torch.float32 \
        and batches_casts() else {}
    step = Step(casts, dtype)
    token = _STEP.set(step)
    try:
        yield step
    finally:
        _STEP.reset(token)
        if step.counters:
            held = list(step.counters.values())
            with torch.no_grad():
                if all(n == 1 for _, n in held):
                    torch._foreach_add_([t for t, _ in held], 1)
                else:
                    torch._foreach_add_([t for t, _ in held], [n for _, n in held])
