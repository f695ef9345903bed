"""Weights in the layout a kernel reads (channels fastest, a dgrad's output channels
fastest, a packed group's block-diagonal form, a rolling-row kernel's channel blocks),
cached per weight tensor and version."""

from __future__ import annotations

import weakref

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from ...context import transient

# weight -> {(fastest dim, groups, pack): (version, packed copy)}; dies with the weight
_PACKED = WeakTensorKeyDictionary()


def _order(t: torch.Tensor, dim: int) -> tuple[int, ...]:
    """Dimensions from slowest to fastest with ``dim`` moved last, the rest in order."""
    return (*(d for d in range(t.dim()) if d != dim), dim)


def is_packed(t: torch.Tensor, dim: int) -> bool:
    expect = 1
    for d in reversed(_order(t, dim)):
        if t.shape[d] != 1 and t.stride(d) != expect:
            return False
        expect *= t.shape[d]
    return True


def _pack(t: torch.Tensor, dim: int) -> torch.Tensor:
    order = _order(t, dim)
    inverse = tuple(order.index(d) for d in range(t.dim()))
    return t.permute(order).contiguous().permute(inverse)


def channels_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` with channels (dimension 1) fastest, the rest in order: NHWC / NLC."""
    return t if is_packed(t, 1) else _pack(t, 1)


def packed_weight(w: torch.Tensor, dim: int = 1, groups: int = 1,
                  pack: int = 1) -> torch.Tensor:
    """``w`` with dimension ``dim`` fastest — the reduction dimension of the GEMM that reads
    it: input channels for the forward, output channels (``dim=0``) for dgrad, which makes
    the tile K-major as TF32 tensor cores need; with ``pack > 1``, expanded to the
    block-diagonal weight of ``groups / pack`` groups first. Cached per weight tensor and
    *version*: an in-place update (an optimizer step) bumps ``w._version`` and the next call
    repacks. Not while a CUDA graph is captured: a replay does not run this check, so the
    graph packs the weight itself (a training graph replays after every optimizer step)."""
    if pack == 1 and is_packed(w, dim):
        return w
    return _cached(w, (dim, groups, pack), lambda: _repack(w, dim, groups, pack))


class LastPacked:
    """``packed_weight(w)`` for one plan's calls, the last weight's result kept beside the
    plan (a weak reference to the weight and its version): a layer's calls between two
    optimizer steps skip the shared cache's lookup (a weak-keyed dictionary: a few
    microseconds of host time per call). Made afresh where ``packed_weight`` would be
    (a capture, a compiled graph's op). Keeps the last packed copy alive while the plan
    lives."""

    __slots__ = ("ref", "version", "packed", "dim")

    def __init__(self, dim: int = 1):
        self.ref, self.version, self.packed, self.dim = None, -1, None, dim

    def __call__(self, w: torch.Tensor) -> torch.Tensor:
        kept = not transient() \
            and not (w.is_cuda and torch._C._cuda_isCurrentStreamCapturing())
        ref = self.ref
        if kept and ref is not None and ref() is w and w._version == self.version:
            return self.packed
        packed = packed_weight(w, self.dim)
        if kept:
            self.ref, self.version, self.packed = weakref.ref(w), w._version, packed
        return packed


def roll_weight(w: torch.Tensor, block_c: int) -> torch.Tensor:
    """A depthwise weight as dw_roll.py's kernel reads it (``dw_roll.pack_weight``, on the
    4-D view), cached as ``packed_weight``."""
    from .dw_roll import pack_weight

    return _cached(w, ("roll", block_c),
                   lambda: pack_weight(w if w.dim() == 4 else w.unsqueeze(2), block_c))


def _cached(w: torch.Tensor, key: tuple, make) -> torch.Tensor:
    """``make()``, a derived form of ``w``, cached per weight tensor and version (see
    ``packed_weight``); made afresh while a CUDA graph is captured and inside a compiled
    graph's op (``context.transient``: ``w`` may be a reused buffer)."""
    if transient() or (w.is_cuda and torch.cuda.is_current_stream_capturing()):
        return make()
    per_key = _PACKED.get(w)
    hit = per_key.get(key) if per_key is not None else None
    if hit is not None and hit[0] == w._version:
        return hit[1]
    derived = make()
    if per_key is None:
        per_key = _PACKED[w] = {}
    per_key[key] = (w._version, derived)
    return derived


def _repack(w: torch.Tensor, dim: int, groups: int, pack: int) -> torch.Tensor:
    return expand_groups(w, groups, pack, dim) if pack > 1 else _pack(w, dim)


def _blocks_view(full: torch.Tensor, groups: int, pack: int) -> torch.Tensor:
    """The (groups/pack, pack, K/groups, pack, C/groups, *kernel) view of an expanded
    (K, pack·C/groups, *kernel) weight; its diagonal over dims 1 and 3 is the real weight."""
    k, wide = full.shape[:2]
    return full.unflatten(0, (groups // pack, pack, k // groups)).unflatten(
        3, (pack, wide // pack))


def diagonal_blocks(full: torch.Tensor, groups: int, pack: int) -> torch.Tensor:
    """The (K, C/groups, *kernel) weight inside an expanded one (a view)."""
    diag = torch.diagonal(_blocks_view(full, groups, pack), dim1=1, dim2=3)
    return diag.movedim(-1, 1).flatten(0, 2)


def expand_groups(w: torch.Tensor, groups: int, pack: int, dim: int) -> torch.Tensor:
    """``w`` (K, C/groups, *kernel) as the block-diagonal weight of ``groups / pack``
    groups, zeros between the blocks, dimension ``dim`` fastest in memory."""
    k, cg, *kernel = w.shape
    full = _pack(w.new_zeros(k, pack * cg, *kernel), dim)
    torch.diagonal(_blocks_view(full, groups, pack), dim1=1, dim2=3).copy_(
        w.unflatten(0, (groups // pack, pack, k // groups)).movedim(1, -1))
    return full
