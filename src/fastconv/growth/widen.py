"""Widening one layer and one producer-consumer pair, keeping what they compute (the
package docstring says how); the ``Widening`` plan of where old channels go."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd

from ..errors import ConvError

INITS = ("zero", "net2net")


@dataclasses.dataclass
class Widening:
    """Where the ``old`` channels of a dimension go among ``new`` and, for net2net, which
    old channel each new position copies. Channels stay in their block (group)."""
    old: int
    new: int
    blocks: int
    old_pos: Tensor  # (old,) the new position of each old channel
    source: Tensor | None  # (new,) the old channel each position copies (net2net), else None

    @property
    def fresh(self) -> Tensor:
        """Positions that hold no old channel."""
        mask = torch.ones(self.new, dtype=torch.bool)
        mask[self.old_pos] = False
        return mask.nonzero().flatten()

    @staticmethod
    def plan(old: int, new: int, blocks: int = 1, init: str = "zero",
             generator: torch.Generator | None = None) -> Widening:
        if init not in INITS:
            raise ConvError(f"init: got {init!r}; allowed: {', '.join(map(repr, INITS))}")
        if not isinstance(new, int) or new < old:
            raise ConvError(f"new width: got {new!r}; expected an int >= the current {old}")
        if old % blocks or new % blocks:
            raise ConvError(f"new width: got {new}; it must be a multiple of {blocks} (the "
                            f"groups of the layers it connects; current width {old})")
        ob, nb = old // blocks, new // blocks
        c = torch.arange(old)
        old_pos = c // ob * nb + c % ob
        source = None
        if init == "net2net":
            source = torch.empty(new, dtype=torch.long)
            source[old_pos] = c
            for b in range(blocks):
                picks = torch.randint(b * ob, (b + 1) * ob, (nb - ob,), generator=generator)
                source[b * nb + ob:(b + 1) * nb] = picks
        return Widening(old, new, blocks, old_pos, source)

    def within(self, offset: int, total: int) -> Widening:
        """This widening of channels ``offset .. offset + old`` of a ``total``-channel
        tensor (a concatenation): the channels after them move up by the growth."""
        grow = self.new - self.old
        before, after = torch.arange(offset), torch.arange(offset + self.old, total)
        old_pos = torch.cat([before, self.old_pos + offset, after + grow])
        source = None if self.source is None else torch.cat(
            [before, self.source + offset, after])
        return Widening(total, total + grow, 1, old_pos, source)

    def counts(self) -> Tensor:
        """How many positions copy each old channel (net2net)."""
        return torch.bincount(self.source, minlength=self.old)


# ----------------------------------------------------------------------------- tensors
def _place(t: Tensor, w: Widening, axis: int, groups: int = 1) -> Tensor:
    """``t`` widened along ``axis`` (global when it spans all groups, ``groups`` > 1 when it
    is the within-group axis of a grouped weight): old values at their new positions, zeros
    elsewhere."""
    if axis == 0:
        out = t.new_zeros((w.new, *t.shape[1:]))
        out[w.old_pos.to(t.device)] = t
        return out
    a = t.shape[0]
    b_old, b_new = w.old // groups, w.new // groups
    out = t.new_zeros((a, b_new, *t.shape[2:]))
    tg, og = t.reshape(groups, a // groups, b_old, *t.shape[2:]), out.view(
        groups, a // groups, b_new, *t.shape[2:])
    local = (w.old_pos.view(groups, b_old) - torch.arange(groups).view(-1, 1) * b_new)
    for g in range(groups):
        og[g][:, local[g].to(t.device)] = tg[g]
    return out


def _gather(t: Tensor, w: Widening, axis: int, groups: int = 1) -> Tensor:
    """``t`` widened along ``axis`` with every position copying ``w.source``'s channel."""
    src = w.source
    if axis == 0:
        return t.index_select(0, src.to(t.device))
    a = t.shape[0]
    b_old, b_new = w.old // groups, w.new // groups
    local = src.view(groups, b_new) - torch.arange(groups).view(-1, 1) * b_old
    tg = t.reshape(groups, a // groups, b_old, *t.shape[2:])
    return torch.stack([tg[g].index_select(1, local[g].to(t.device)) for g in range(groups)]
                       ).view(a, b_new, *t.shape[2:])


def _channel_view(v: Tensor, axis: int, ndim: int) -> Tensor:
    shape = [1] * ndim
    shape[axis] = -1
    return v.view(shape)


# ----------------------------------------------------------------------------- modules
#: parameter or buffer name in a widened module -> (original tensor, carry): ``carry(state)``
#: places an optimizer-state tensor of the original's shape at the new positions (zeros in
#: new slices); composed when a module is widened twice.
Carries = dict[str, tuple[Tensor, Callable[[Tensor], Tensor]]]


def _check_conv(conv, what: str) -> None:
    if not isinstance(conv, _ConvNd):
        raise ConvError(f"{what}: expected a convolution module (torch.nn or fastconv Conv*, "
                        f"ConvTranspose*, ConvBNAct*), got {type(conv).__name__}")


def _copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` holding its very parameters and buffers: the widening replaces
    those it widens, and every other one (a consumer's bias) stays the tensor that an
    optimizer and any tied layer hold. (The public ``widen_*`` functions return copies:
    they widen a deep copy of what they are given.)"""
    shared = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return copy.deepcopy(module, shared)


def _out_axis(conv) -> int:
    return 1 if conv.transposed else 0


def _set(module: nn.Module, name: str, value: Tensor, like: Tensor | None,
         carries: Carries, carry: Callable[[Tensor], Tensor], prefix: str) -> None:
    """Install ``value`` as parameter/buffer ``name`` (in ``like``'s memory format) and
    record how optimizer state follows it."""
    if like is not None and like.dim() == 4 and not like.is_contiguous() \
            and like.is_contiguous(memory_format=torch.channels_last):
        value = value.contiguous(memory_format=torch.channels_last)
    if isinstance(like, nn.Parameter):
        setattr(module, name, nn.Parameter(value, requires_grad=like.requires_grad))
    else:
        module._buffers[name] = value
    key = prefix + name
    if key in carries:  # widened before in this step: compose the two placements
        origin, first = carries[key]
        carries[key] = (origin, lambda s, first=first: carry(first(s)))
    else:
        carries[key] = (like, carry)


def _widen_conv_out(conv, w: Widening, init: str, noise: float, generator,
                    carries: Carries, prefix: str = ""):
    _check_conv(conv, "conv")
    axis, groups = _out_axis(conv), conv.groups
    new = _copy(conv)
    weight = conv.weight.detach()
    if init == "net2net":
        nw = _gather(weight, w, axis, groups)
    else:
        nw = _place(weight, w, axis, groups)
        fresh_init = torch.empty_like(nw)
        nn.init.kaiming_uniform_(fresh_init, a=math.sqrt(5))  # torch's Conv init
        idx = w.fresh.to(nw.device)
        if axis == 0:
            nw[idx] = fresh_init[idx]
        else:
            fresh_local = idx.view(groups, -1) - torch.arange(groups, device=nw.device).view(
                -1, 1) * (w.new // groups)
            for g in range(groups):
                rows = slice(g * nw.shape[0] // groups, (g + 1) * nw.shape[0] // groups)
                nw[rows][:, fresh_local[g]] = fresh_init[rows][:, fresh_local[g]]
    if noise:
        std = float(weight.float().std()) if weight.numel() > 1 else 1.0
        fresh = torch.zeros(w.new, dtype=nw.dtype, device=nw.device)
        fresh[w.fresh.to(nw.device)] = 1
        if axis == 0:
            mask = _channel_view(fresh, 0, nw.dim())
        else:  # element (a, j) of a grouped weight holds channel group(a)·(new/g) + j
            a, b = nw.shape[:2]
            mask = fresh.view(groups, 1, b).expand(groups, a // groups, b).reshape(
                a, b, *([1] * (nw.dim() - 2)))
        bump = torch.randn(nw.shape, generator=generator, dtype=torch.float32).to(nw)
        nw = nw + noise * std * bump * mask
    _set(new, "weight", nw, conv.weight, carries,
         lambda s: _place(s, w, axis, groups), prefix)
    if conv.bias is not None:
        b = conv.bias.detach()
        if init == "net2net":
            nb = b.index_select(0, w.source.to(b.device))
        else:
            nb = _place(b, w, 0)
            fan_in = nn.init._calculate_fan_in_and_fan_out(nw)[0]
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            idx = w.fresh.to(b.device)
            nb[idx] = torch.empty(len(idx), dtype=nb.dtype, device=nb.device).uniform_(
                -bound, bound)
        _set(new, "bias", nb, conv.bias, carries, lambda s: _place(s, w, 0), prefix)
    new.out_channels = w.new
    bn = getattr(conv, "bn", None)
    if isinstance(bn, _BatchNorm):  # a fused ConvBNAct: its BatchNorm grows with it
        new.bn = _widen_batchnorm(bn, w, carries, prefix + "bn.")
    return new


def _widen_in(module, w: Widening, init: str, carries: Carries, prefix: str = ""):
    """A consumer taking ``w.new`` channels: a convolution, or a Linear reading them as
    features (after global pooling and flatten)."""
    if isinstance(module, nn.Linear):
        new = _widen_conv_in(module, w, init, carries, prefix, axis=1, groups=1)
        new.in_features = w.new
        return new
    return _widen_conv_in(module, w, init, carries, prefix)


def _widen_depthwise(conv, w: Widening, init: str, noise: float, generator,
                     carries: Carries):
    """A depthwise convolution between a producer and its consumers widened with them: one
    filter per channel (new ones as a producer's new filters), groups = channels."""
    new = _widen_conv_out(conv, w, init, noise, generator, carries)
    new.in_channels = new.groups = w.new
    return new


def _widen_conv_in(conv, w: Widening, init: str, carries: Carries, prefix: str = "",
                   axis: int | None = None, groups: int | None = None):
    if axis is None:
        _check_conv(conv, "conv")
        axis = 0 if conv.transposed else 1  # the input-channel axis of the weight
        groups = conv.groups
    new = _copy(conv)
    weight = conv.weight.detach()
    if init == "net2net":
        share = (1.0 / w.counts().to(weight.device, weight.dtype)).index_select(
            0, w.source.to(weight.device))  # each copy takes an equal part of its source
        nw = _gather(weight, w, axis, groups)
        if axis == 0:
            nw = nw * _channel_view(share, 0, nw.dim())
        else:
            b_new = w.new // groups
            per = share.view(groups, b_new)
            nw = (nw.view(groups, -1, b_new, *nw.shape[2:])
                  * per.view(groups, 1, b_new, *([1] * (nw.dim() - 2)))).view(nw.shape)
    else:
        nw = _place(weight, w, axis, groups)
    _set(new, "weight", nw, conv.weight, carries,
         lambda s: _place(s, w, axis, groups), prefix)
    if isinstance(new, _ConvNd):
        new.in_channels = w.new
    return new


def _widen_batchnorm(bn, w: Widening, carries: Carries, prefix: str = ""):
    if not isinstance(bn, _BatchNorm):
        raise ConvError(f"bn: expected a BatchNorm module, got {type(bn).__name__}")
    new = _copy(bn)
    fresh_values = {"weight": 1.0, "bias": 0.0, "running_mean": 0.0, "running_var": 1.0}
    for name, fill in fresh_values.items():
        t = getattr(bn, name)
        if t is None:
            continue
        t = t.detach()
        if w.source is not None:
            nt = t.index_select(0, w.source.to(t.device))
        else:
            nt = _place(t, w, 0)
            nt[w.fresh.to(t.device)] = fill
        _set(new, name, nt, getattr(bn, name), carries, lambda s: _place(s, w, 0), prefix)
    new.num_features = w.new
    return new


def widen_conv_out(conv, new_out: int, init: str = "zero", noise: float = 0.0, *,
                   widening: Widening | None = None,
                   generator: torch.Generator | None = None):
    """A copy of ``conv`` with ``new_out`` output channels (its BatchNorm too, for a fused
    ConvBNAct). The old filters are unchanged; see the module docstring for ``init``."""
    _check_conv(conv, "conv")
    w = widening or Widening.plan(conv.out_channels, new_out, conv.groups, init, generator)
    return _widen_conv_out(copy.deepcopy(conv), w, init, noise, generator, {})


def widen_conv_in(conv, new_in: int, init: str = "zero", *, widening: Widening | None = None,
                  generator: torch.Generator | None = None):
    """A copy of ``conv`` taking ``new_in`` input channels: zero weights from the new ones
    (``"zero"``), or, for ``"net2net"`` with the producer's ``widening``, every copied
    channel's weights shared among its copies."""
    _check_conv(conv, "conv")
    w = widening or Widening.plan(conv.in_channels, new_in, conv.groups, init, generator)
    if init == "net2net" and w.source is None:
        raise ConvError("widening: net2net needs the producer's widening (its source map)")
    return _widen_conv_in(copy.deepcopy(conv), w, init, {})


def widen_batchnorm(bn, new_features: int, *, widening: Widening | None = None):
    """A copy of ``bn`` with ``new_features`` channels: old statistics, parameters, eps,
    momentum and num_batches_tracked kept; new channels the identity (or copies, given a
    net2net ``widening``)."""
    if not isinstance(bn, _BatchNorm):
        raise ConvError(f"bn: expected a BatchNorm module, got {type(bn).__name__}")
    w = widening or Widening.plan(bn.num_features, new_features)
    return _widen_batchnorm(copy.deepcopy(bn), w, {})


def _blocks(producer, consumer) -> int:
    """Channel blocks that keep both layers' groups: lcm of their groups (each group of
    either layer is a run of whole blocks, before and after growth)."""
    gp, gc = producer.groups, getattr(consumer, "groups", 1)
    blocks = math.lcm(gp, gc)
    if producer.out_channels % blocks:
        raise ConvError(f"groups: the producer has {gp} and the consumer {gc}; their "
                        f"{producer.out_channels} channels do not split into {blocks} "
                        f"blocks, so they cannot grow inside their groups")
    return blocks


def widen_pair(producer, consumer, new_width: int, bn=None, init: str = "zero",
               noise: float = 0.0, generator: torch.Generator | None = None):
    """``(producer, consumer, bn)`` widened together to ``new_width`` channels between
    them, computing what they did (exactly when ``noise`` is 0). Copies; the originals are
    untouched."""
    _check_conv(producer, "producer")
    _check_conv(consumer, "consumer")
    _pair_sizes(producer, consumer, bn)
    w = Widening.plan(producer.out_channels, new_width, _blocks(producer, consumer), init,
                      generator)
    carries: Carries = {}
    # one copy of the three: tensors they share stay shared
    producer, consumer, bn = copy.deepcopy((producer, consumer, bn))
    p = _widen_conv_out(producer, w, init, noise, generator, carries)
    c = _widen_conv_in(consumer, w, init, carries)
    b = _widen_batchnorm(bn, w, carries) if bn is not None else None
    return p, c, b


def _pair_sizes(producer, consumer, bn) -> None:
    taken = None if consumer is None else getattr(consumer, "in_channels",
                                                   getattr(consumer, "in_features", None))
    if consumer is not None and producer.out_channels != taken:
        raise ConvError(f"consumer: takes {taken} channels but the producer gives "
                        f"{producer.out_channels}")
    if bn is not None and bn.num_features != producer.out_channels:
        raise ConvError(f"bn: has {bn.num_features} features, the producer gives "
                        f"{producer.out_channels}")
