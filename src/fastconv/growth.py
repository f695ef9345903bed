"""Width growth of convolutional networks that keeps what they compute.

A *producer* (a convolution whose output channels grow, with the BatchNorm after it) and its
*consumer* (the next convolution, whose input channels grow) are widened together:

* ``init="zero"``: the producer's new filters are initialised as torch initialises a fresh
  layer, the consumer's weights from them are zero — the network computes exactly what it
  did, and gradients reach the new weights at once (the new channels are not dead);
* ``init="net2net"``: each new filter copies an existing one of its group and the consumer
  divides the weights of every copied channel among its copies (Net2WiderNet).

New BatchNorm channels start as the identity (γ = 1, β = 0, running mean 0, variance 1) under
``"zero"`` and as copies of their source channel under ``"net2net"``. Old weights are copied
slice-wise into zero-initialised tensors of the new size; every hyper-parameter (stride,
padding, padding_mode, dilation, groups, bias, device, dtype, fastconv's backend and
precision) is kept. With groups, channels stay in their group: old channel ``c`` of group
``b`` keeps its offset inside the group, and new channels are appended at the end of each
group. ``noise`` (a fraction of the old weights' standard deviation) perturbs the new filters
and breaks exact preservation.

:func:`grow_width` finds the producers from the model's dataflow (a torch.fx trace): a
convolution whose output reaches, through BatchNorms, per-channel activations, pooling,
dropout, flatten and depthwise convolutions (which widen with it), only convolutions and
Linear layers (after global pooling) — any number of them, all widened in one step. A
consumer reading the channels through concatenations along dim 1 widens at their offset
there. Residual adds (and element-wise products) tie the widths of their operands: every
producer so tied grows with the same widening, as one. A stack (MultiBranch's mean), a tie to
the model's input or the model's output ends the search with a reason in the report. Where
fx cannot trace the model, a module walk finds pairs (chains inside ``nn.Sequential``, the
inner convolutions of residual blocks, each :class:`MultiBranch` branch) and the report
says so. It either succeeds as a whole or
leaves model and optimizer exactly as they were (raising :class:`GrowthError` with a
per-layer report). Optimizer state (SGD momentum, Adam/AdamW moments, step counts) moves to
the new parameters.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd

from .errors import ConvError, real_number

__all__ = ["GrowthError", "GrowthReport", "MultiBranch", "Widening", "carry_optimizer",
           "grow_width", "widen_batchnorm", "widen_conv_in", "widen_conv_out", "widen_pair"]

INITS = ("zero", "net2net")

#: Modules that keep the channel dimension and act per channel or per element: a producer
#: and a consumer separated only by these (and at most one BatchNorm) form a pair.
PASSTHROUGH = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.SiLU, nn.GELU, nn.Sigmoid, nn.Tanh,
               nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Mish, nn.ELU, nn.SELU,
               nn.Softplus, nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d,
               nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d)
#: per-sample layers of other libraries (torchvision's stochastic depth, timm's drop path)
PASSTHROUGH_NAMES = ("StochasticDepth", "DropPath")
PASSTHROUGH_FUNCTION_NAMES = ("stochastic_depth", "drop_path")


class GrowthError(ConvError):
    """A growth step that could not be done; ``report`` says which layer failed and why.
    The model and optimizer are left exactly as they were."""

    def __init__(self, message: str, report: GrowthReport | None = None):
        self.report = report
        super().__init__(message if report is None else f"{message}\n{report}")


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
    new = copy.deepcopy(conv)
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
    new = copy.deepcopy(conv)
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
    new = copy.deepcopy(bn)
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
    return _widen_conv_out(conv, w, init, noise, generator, {})


def widen_conv_in(conv, new_in: int, init: str = "zero", *, widening: Widening | None = None,
                  generator: torch.Generator | None = None):
    """A copy of ``conv`` taking ``new_in`` input channels: zero weights from the new ones
    (``"zero"``), or, for ``"net2net"`` with the producer's ``widening``, every copied
    channel's weights shared among its copies."""
    _check_conv(conv, "conv")
    w = widening or Widening.plan(conv.in_channels, new_in, conv.groups, init, generator)
    if init == "net2net" and w.source is None:
        raise ConvError("widening: net2net needs the producer's widening (its source map)")
    return _widen_conv_in(conv, w, init, {})


def widen_batchnorm(bn, new_features: int, *, widening: Widening | None = None):
    """A copy of ``bn`` with ``new_features`` channels: old statistics, parameters, eps,
    momentum and num_batches_tracked kept; new channels the identity (or copies, given a
    net2net ``widening``)."""
    if not isinstance(bn, _BatchNorm):
        raise ConvError(f"bn: expected a BatchNorm module, got {type(bn).__name__}")
    w = widening or Widening.plan(bn.num_features, new_features)
    return _widen_batchnorm(bn, w, {})


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


# ------------------------------------------------------------------------- MultiBranch
def _out_width(module: nn.Module) -> int:
    for m in reversed(list(module.modules())):
        for attr in ("out_channels", "num_features"):
            if isinstance(getattr(m, attr, None), int):
                return getattr(m, attr)
    raise ConvError(f"branches: cannot tell the output width of {type(module).__name__} "
                    f"(no convolution or BatchNorm inside); give out_channels")


class MultiBranch(nn.Module):
    """Branches applied to the same input and merged: ``merge="mean"`` returns
    ``scale · mean(branch outputs)`` (add it to a residual stream: ``x + block(x)``),
    branches of another width than ``out_channels`` (default: the widest) meeting through
    1x1 convolutions initialised to the identity — learnable, never zero padding;
    ``merge="concat"`` concatenates them along channels (ASPP-like)."""

    def __init__(self, branches, merge: str = "mean", scale: float = 0.2,
                 out_channels: int | None = None):
        super().__init__()
        if merge not in ("mean", "concat"):
            raise ConvError(f"merge: got {merge!r}; allowed: 'mean', 'concat'")
        self.branches = nn.ModuleList(branches)
        if len(self.branches) == 0:
            raise ConvError("branches: expected at least one module")
        self.merge, self.scale = merge, float(scale)
        widths = [_out_width(b) for b in self.branches]
        self.out_channels = sum(widths) if merge == "concat" else (out_channels or max(widths))
        self.projections = nn.ModuleList(
            [self._identity(b, w) if merge == "mean" and w != self.out_channels
             else nn.Identity() for b, w in zip(self.branches, widths)])

    def _identity(self, branch: nn.Module, width: int) -> nn.Module:
        ref = next((m for m in branch.modules() if isinstance(m, _ConvNd)), None)
        conv_cls = {1: nn.Conv1d, 3: nn.Conv3d}.get(
            len(ref.kernel_size) if ref is not None else 2, nn.Conv2d)
        p = next(branch.parameters())
        proj = conv_cls(width, self.out_channels, 1, bias=False, device=p.device,
                        dtype=p.dtype)
        with torch.no_grad():
            proj.weight.zero_()
            n = min(width, self.out_channels)
            proj.weight.view(self.out_channels, width)[:n, :n] = torch.eye(n)
        return proj

    def forward(self, x: Tensor) -> Tensor:
        outs = [p(b(x)) for b, p in zip(self.branches, self.projections)]
        if self.merge == "concat":
            return torch.cat(outs, dim=1)
        return self.scale * torch.stack(outs).mean(0)

    def drop_branches(self, indices) -> None:
        """Remove the branches at ``indices`` (a new list is built; nothing is removed
        while iterating)."""
        drop = set(indices)
        keep = [i for i in range(len(self.branches)) if i not in drop]
        if not keep:
            raise GrowthError("drop_branches: every branch would be removed")
        self.branches = nn.ModuleList([self.branches[i] for i in keep])
        self.projections = nn.ModuleList([self.projections[i] for i in keep])
        if self.merge == "concat":
            self.out_channels = sum(_out_width(b) for b in self.branches)


# --------------------------------------------------------------------------- grow_width
@dataclasses.dataclass
class GrowthReport:
    """What a :func:`grow_width` pass did (or would have done)."""
    grown: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)
    #: every other convolution, with the reason it was not grown
    not_grown: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    failed: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    dropped: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    #: original parameter -> (its replacement, carry) for optimizer state
    mapping: dict = dataclasses.field(default_factory=dict)
    #: how the pairs were found (the fx trace, or the module walk and why)
    notes: list[str] = dataclasses.field(default_factory=list)
    #: grown producer -> the layers that grew with it (consumers, norms, depthwise)
    widened: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"  note: {n}" for n in self.notes]
        lines += [f"  grown {p}: {a} -> {b} channels, with {', '.join(self.widened.get(p, ()))}"
                  for p, a, b in self.grown]
        lines += [f"  not grown {p}: {why}" for p, why in self.not_grown]
        lines += [f"  FAILED {p}: {why}" for p, why in self.failed]
        lines += [f"  dropped branch {p}: {why}" for p, why in self.dropped]
        return "\n".join(lines) or "  nothing to grow"


@dataclasses.dataclass
class _Pair:
    """A producer and every layer its widening reaches: the convolutions and Linear layers
    that consume its channels, the BatchNorms and depthwise convolutions in between (which
    widen with it)."""
    producer: str
    consumers: tuple[str, ...]
    bns: tuple[str, ...] = ()
    depthwise: tuple[str, ...] = ()
    branch: str | None = None  # the MultiBranch branch it lies in ("path.branches.i"), if any
    #: producers that residual adds tie to this one's width: they grow with it, as one
    tied: tuple[str, ...] = ()
    #: a layer that reads the channels through concatenations -> ((cat node, input), ...)
    #: from the innermost out: its channels sit at an offset inside a wider input
    routes: dict[str, tuple] = dataclasses.field(default_factory=dict)
    prefix: str = ""  # the path of the traced model inside the model grown


#: Why a convolution that is no pair's producer is not grown.
NO_CONSUMER = ("no consumer found (pairs are a convolution and the next one in a Sequential "
               "or a residual block, and a MultiBranch branch's last one with its projection)")


def _is_conv(m) -> bool:
    return isinstance(m, _ConvNd)


def _find_pairs(module: nn.Module, prefix: str = "", branch: str | None = None
                ) -> list[_Pair]:
    pairs: list[_Pair] = []

    def join(name: str) -> str:
        return f"{prefix}.{name}" if prefix else name
    if isinstance(module, MultiBranch):
        for i, (b, proj) in enumerate(zip(module.branches, module.projections)):
            name = join(f"branches.{i}")
            pairs += _find_pairs(b, name, name)
            tail = _tail(b)  # the branch's last conv feeds its 1x1 projection: a pair
            if tail is not None and _is_conv(proj):
                conv, bn = tail
                pairs.append(_Pair(_under(name, conv), (join(f"projections.{i}"),),
                                   (_under(name, bn),) if bn is not None else (), (), name))
        return pairs
    if all(hasattr(module, a) for a in ("conv1", "bn1", "conv2", "bn2")):  # residual block
        chain = [("conv1", "bn1", "conv2")]
        if hasattr(module, "conv3"):
            chain.append(("conv2", "bn2", "conv3"))
        return [_Pair(join(p), (join(c),), (join(b),), (), branch) for p, b, c in chain]
    if isinstance(module, nn.Sequential):
        producer, bn = None, None
        for name, child in module.named_children():
            if _is_conv(child):
                if producer is not None:
                    pairs.append(_Pair(join(producer), (join(name),),
                                       (join(bn),) if bn else (), (), branch))
                producer, bn = name, None
            elif isinstance(child, _BatchNorm) and producer is not None and bn is None:
                bn = name
            elif isinstance(child, PASSTHROUGH):
                continue
            else:  # a block: its own inner pairs; no pair across it
                pairs += _find_pairs(child, join(name), branch)
                producer, bn = None, None
        return pairs
    for name, child in module.named_children():
        pairs += _find_pairs(child, join(name), branch)
    return pairs


def _find_groups(module: nn.Module) -> tuple[list[_Pair], dict[str, str], str]:
    """The producers of ``module`` with everything each one's widening reaches, from the
    dataflow of a torch.fx trace; where the model does not trace, the module walk
    (:func:`_find_pairs`) and a note saying so. Also the reason each other convolution is
    not a producer (fx only)."""
    try:
        pairs, reasons = _dataflow(module)
    except Exception as exc:  # data-dependent control flow, unsupported ops, ...
        return _find_pairs(module), {}, (
            f"torch.fx could not trace the model ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:160] if str(exc) else ''}); pairs were found by the "
            f"module walk: a convolution and the next one in a Sequential or a residual "
            f"block, and a MultiBranch branch's last one with its projection")
    return pairs, reasons, ""


class _Tracer(torch.fx.Tracer):
    """Convolutions (fastconv's fused ones included), norms and Linear layers stay whole;
    everything else (MultiBranch, blocks) is traced through."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, (_ConvNd, _BatchNorm, nn.Linear)) \
            or super().is_leaf_module(m, qualname)


#: functions and methods that act per channel (or per element), like PASSTHROUGH modules
_PASS_FUNCTIONS = {
    torch.relu, torch.sigmoid, torch.tanh, torch.nn.functional.relu,
    torch.nn.functional.relu6, torch.nn.functional.leaky_relu, torch.nn.functional.silu,
    torch.nn.functional.gelu, torch.nn.functional.hardswish,
    torch.nn.functional.hardsigmoid, torch.nn.functional.dropout,
    torch.nn.functional.max_pool2d, torch.nn.functional.avg_pool2d,
    torch.nn.functional.adaptive_avg_pool2d, torch.nn.functional.adaptive_max_pool2d,
    torch.flatten,
}
_PASS_METHODS = {"relu", "relu_", "sigmoid", "tanh", "contiguous", "clone", "flatten"}
_POOLS = (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool1d,
          nn.AdaptiveMaxPool2d, nn.Flatten)
#: element-wise operations of two tensors: a residual add (or an SE gate's product) ties
#: the widths of its operands and its output
_TIE_NAMES = {"add", "iadd", "add_", "sub", "isub", "mul", "imul", "mul_"}


class _NoGrowth(Exception):
    """Why a producer cannot grow (found while following its channels)."""


def _dataflow(module: nn.Module) -> tuple[list[_Pair], dict[str, str]]:
    from .optimize import OptimizedModel

    if isinstance(module, OptimizedModel):  # its forward wraps the traced model's
        inner, prefix = module.model, "model."
    else:
        inner, prefix = module, ""
    graph = _Tracer().trace(inner)
    modules = dict(inner.named_modules())
    calls: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    pairs, reasons, done = [], {}, set()
    for node in graph.nodes:
        if node.op != "call_module" or not _is_conv(modules[node.target]) \
                or node.target in done:
            continue
        name, conv = node.target, modules[node.target]
        if calls[name] > 1:
            reasons[name] = f"called {calls[name]} times in the forward (a shared module)"
        elif _depthwise(conv):
            reasons[name] = "depthwise: its width is its input's, it grows with that producer"
        else:
            try:
                pair = _Space(node, modules, calls).pair()
            except _NoGrowth as why:
                reasons[name] = str(why)
                continue
            pair.branch = _branch_of(pair.producer, modules) if not pair.tied else None
            done.update((pair.producer, *pair.tied))
            pairs.append(pair)
    if prefix:  # paths from the wrapper, as named_modules() of the model given names them
        for p in pairs:
            p.producer, p.prefix = prefix + p.producer, prefix
            p.consumers, p.bns, p.depthwise, p.tied = (
                tuple(prefix + c for c in group)
                for group in (p.consumers, p.bns, p.depthwise, p.tied))
            p.routes = {prefix + k: v for k, v in p.routes.items()}
            p.branch = None if p.branch is None else prefix + p.branch
        reasons = {prefix + k: v for k, v in reasons.items()}
    return pairs, reasons


def _depthwise(conv) -> bool:
    return conv.groups > 1 and conv.groups == conv.in_channels == conv.out_channels


def _tie(node) -> bool:
    """An element-wise operation of ``node``'s tensor with another tensor."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    return node.op in ("call_function", "call_method") and name in _TIE_NAMES and sum(
        isinstance(a, torch.fx.Node) for a in node.args) > 1


def _cat_dim(node) -> int | None:
    if node.op != "call_function" or node.target not in (torch.cat, torch.concat):
        return None
    return node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0)


def _width(node, module: Callable[[str], nn.Module]) -> int:
    """How many channels ``node``'s tensor has, from the layers that made it (``module``
    maps a module path of the trace to the module as it is now)."""
    if node.op == "call_module":
        m = module(node.target)
        if _is_conv(m):
            return m.out_channels
        if isinstance(m, _BatchNorm):
            return m.num_features
        if isinstance(m, nn.Linear):
            return m.out_features
    if _cat_dim(node) == 1:
        return sum(_width(a, module) for a in node.args[0])
    if _per_channel(node, module) and isinstance(node.args[0], torch.fx.Node):
        return _width(node.args[0], module)
    raise ConvError(f"cannot tell how many channels {node.name} has")


def _passthrough(m: nn.Module) -> bool:
    return isinstance(m, PASSTHROUGH + _POOLS) or type(m).__name__ in PASSTHROUGH_NAMES


def _pass_call(node) -> bool:
    """A function or method call acting per channel on its first argument."""
    if node.op == "call_function":
        return node.target in _PASS_FUNCTIONS or _spatial_mean(node) \
            or getattr(node.target, "__name__", "") in PASSTHROUGH_FUNCTION_NAMES
    return node.op == "call_method" and (node.target in _PASS_METHODS or _spatial_mean(node))


def _spatial_mean(node) -> bool:
    """``x.mean((2, 3), keepdim=True)`` (or ``torch.mean``): a global pool keeping the
    channels (an SE block's squeeze)."""
    if node.target not in ("mean", "amax", torch.mean, torch.amax):
        return False
    dims = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
    dims = (dims,) if isinstance(dims, int) else dims
    return isinstance(dims, (tuple, list)) and all(
        isinstance(d, int) and (d >= 2 or d == -1) for d in dims)


def _per_channel(node, module: Callable[[str], nn.Module]) -> bool:
    """Whether ``node`` acts per channel on its first argument (keeping the channels)."""
    if not node.args:
        return False
    if node.op == "call_module":
        return _passthrough(module(node.target))
    if _pass_call(node):
        return True
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    return node.op in ("call_function", "call_method") and name in _TIE_NAMES


class _Space:
    """The channels of one producer's output followed through the traced graph: the layers
    that act on them per channel (BatchNorms, activations, pooling, depthwise convolutions:
    they widen with it), the layers that consume them (convolutions, a Linear after global
    pooling: their inputs widen), the other producers that residual adds (or products) tie
    to the same width, and the concatenations each consumer reads them through. Anything
    else stops the search with a reason (:class:`_NoGrowth`)."""

    def __init__(self, start, modules: dict, calls: dict):
        self.modules, self.calls = modules, calls
        self.producers, self.consumers, self.bns, self.dws = [start.target], [], [], []
        self.routes: dict[str, tuple] = {}
        self.start, self.seen, self.todo = start, {start: ()}, [start]

    def pair(self) -> _Pair:
        while self.todo:
            node = self.todo.pop()
            try:
                if not self.seen[node]:
                    self._backward(node)
                self._forward(node)
            except ConvError as exc:  # a width it cannot tell
                raise _NoGrowth(str(exc)) from None
        if not self.consumers:
            raise _NoGrowth(NO_CONSUMER)
        order = {n.target: i for i, n in enumerate(self.start.graph.nodes)
                 if n.op == "call_module"}
        first, *tied = self.producers[:1] + sorted(self.producers[1:], key=order.get)
        return _Pair(first, tuple(self.consumers), tuple(self.bns), tuple(self.dws),
                     tied=tuple(tied), routes=self.routes)

    def _visit(self, node, hops: tuple) -> None:
        if node in self.seen:
            if self.seen[node] != hops:
                raise _NoGrowth(f"its channels reach {node.name} at two different channel "
                                f"offsets")
            return
        self.seen[node] = hops
        self.todo.append(node)

    def _where(self, node) -> str:
        return f"({node.target})" if node.op == "call_module" else f"({node.name})"

    def _backward(self, node) -> None:
        """The tensors ``node``'s channels are also (its inputs, for a layer acting per
        channel; the other operands of a residual add; a fused layer's residual)."""
        m = self.modules.get(node.target) if node.op == "call_module" else None
        if _is_conv(m) and not _depthwise(m):  # a producer: its residual, if fused
            inputs = list(node.args[1:]) + list(node.kwargs.values())
        elif _is_conv(m):  # depthwise: its input (and a fused residual) too
            inputs = list(node.args) + list(node.kwargs.values())
        elif _tie(node):
            inputs = node.args
        elif isinstance(m, _BatchNorm) or _per_channel(node, self.modules.__getitem__):
            inputs = node.args[:1]
        elif node.op == "placeholder":
            raise _NoGrowth(f"a residual add ties its width to the model's input "
                            f"({node.name})")
        else:
            raise _NoGrowth(f"a residual add ties its width to {self._where(node)}, which "
                            f"grow_width cannot widen")
        for src in inputs:
            if not isinstance(src, torch.fx.Node):
                continue
            if _cat_dim(src) is not None:
                raise _NoGrowth(f"a residual add ties its width to a concatenation "
                                f"({src.name}) (not supported)")
            if src.op == "call_module" and _is_conv(m := self.modules[src.target]) \
                    and not _depthwise(m):
                self._tied(src)
            elif src.op == "call_module" and isinstance(self.modules[src.target], _BatchNorm):
                self._norm(src, ())
            elif src.op == "call_module" and _is_conv(self.modules[src.target]):
                self._depthwise_layer(src, ())
            else:
                self._visit(src, ())

    def _tied(self, node) -> None:
        if node not in self.seen:
            if self.calls[node.target] > 1:
                raise _NoGrowth(f"a residual add ties its width to {node.target}, a module "
                                f"called more than once")
            self.producers.append(node.target)
        self._visit(node, ())

    def _norm(self, node, hops) -> None:
        if node not in self.seen:
            self.bns.append(node.target)
            self._route(node.target, hops)
        self._visit(node, hops)

    def _depthwise_layer(self, node, hops) -> None:
        if node not in self.seen:
            self.dws.append(node.target)
            self._route(node.target, hops)
        self._visit(node, hops)

    def _route(self, path: str, hops: tuple) -> None:
        if hops:
            self.routes[path] = hops

    def _forward(self, source) -> None:
        hops = self.seen[source]
        for node in source.users:
            where = self._where(node)
            if node.op == "output":
                raise _NoGrowth("its output is the model's output: growing it would change "
                                "that width")
            if node.op == "call_module":
                self._module_user(node, source, hops, where)
            elif _pass_call(node):
                if any(a is source for a in node.args[1:]):
                    raise _NoGrowth(f"reaches {where} as a second argument")
                self._visit(node, hops)
            elif _tie(node):
                if hops:
                    raise _NoGrowth(f"a residual add {where} after a concatenation ties "
                                    f"widths (not supported)")
                self._visit(node, ())
            elif _cat_dim(node) is not None:
                self._concat(node, source, hops, where)
            elif node.target is torch.stack:
                raise _NoGrowth(f"stacked {where} with other tensors (a MultiBranch mean): "
                                f"its width is tied to theirs")
            elif node.op in ("call_function", "call_method") \
                    and getattr(node.target, "__name__", node.target) in _TIE_NAMES:
                self._visit(node, hops)  # times or plus a number
            else:
                raise _NoGrowth(f"reaches {getattr(node.target, '__name__', node.target)} "
                                f"{where}")

    def _module_user(self, node, source, hops, where) -> None:
        m = self.modules[node.target]
        if self.calls[node.target] > 1 and not _passthrough(m):
            raise _NoGrowth(f"reaches {node.target}, a module called more than once")
        first = bool(node.args) and node.args[0] is source
        later = any(a is source for a in node.args[1:]) or any(
            v is source for v in node.kwargs.values())
        if _is_conv(m) and not first and later and not _depthwise(m):
            if hops:
                raise _NoGrowth(f"the residual of {node.target} (a fused add) after a "
                                f"concatenation (not supported)")
            self._tied(node)  # a fused residual: the layer's output has these channels
            return
        if not first or later:
            raise _NoGrowth(f"reaches {node.target} as an argument other than its input")
        if _is_conv(m) and _depthwise(m):
            self._depthwise_layer(node, hops)
        elif _is_conv(m) or isinstance(m, nn.Linear):
            if isinstance(m, nn.Linear) and m.in_features != (
                    width := _width(source, self.modules.__getitem__)):
                raise _NoGrowth(f"reaches Linear {where} with {m.in_features} features from "
                                f"{width} channels: not one feature per channel")
            if hops and getattr(m, "groups", 1) > 1:
                raise _NoGrowth(f"reaches the grouped convolution {where} through a "
                                f"concatenation (not supported)")
            if node.target not in self.consumers:
                self.consumers.append(node.target)
                self._route(node.target, hops)
        elif isinstance(m, _BatchNorm):
            self._norm(node, hops)
        elif _passthrough(m):
            self._visit(node, hops)
        else:
            raise _NoGrowth(f"reaches {type(m).__name__} {where}, which grow_width cannot "
                            f"widen")

    def _concat(self, node, source, hops, where) -> None:
        inputs = node.args[0]
        if _cat_dim(node) != 1:
            raise _NoGrowth(f"concatenated {where} along dim {_cat_dim(node)}, not the "
                            f"channels")
        if sum(a is source for a in inputs) != 1:
            raise _NoGrowth(f"concatenated {where} more than once")
        try:
            for a in inputs:
                _width(a, self.modules.__getitem__)
        except ConvError as exc:
            raise _NoGrowth(f"concatenated {where}: {exc}") from None
        index = next(i for i, a in enumerate(inputs) if a is source)
        self._visit(node, hops + ((node, index),))


def _branch_of(path: str, modules: dict) -> str | None:
    """The innermost MultiBranch branch ("owner.branches.i") that ``path`` lies in."""
    parts = path.split(".")
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] == "branches" and isinstance(modules.get(".".join(parts[:i])),
                                                  MultiBranch):
            return ".".join(parts[:i + 2])
    return None


def _tail(branch: nn.Module) -> tuple[str, str | None] | None:
    """(path of the convolution whose output a branch returns, of the BatchNorm after it)
    relative to the branch ("" for the branch itself), or None when something else ends
    it."""
    if _is_conv(branch):
        return "", None
    if not isinstance(branch, nn.Sequential):
        return None
    conv, bn = None, None
    for name, child in branch.named_children():
        if _is_conv(child):
            conv, bn = name, None
        elif isinstance(child, _BatchNorm) and conv is not None and bn is None:
            bn = name
        elif not isinstance(child, PASSTHROUGH):
            conv, bn = None, None
    return None if conv is None else (conv, bn)


def _under(prefix: str, path: str) -> str:
    return f"{prefix}.{path}" if path else prefix


def _inside(path: str, branch: str) -> bool:
    """Whether ``path`` is part of MultiBranch branch ``branch`` (its projection included)."""
    owner, _, index = branch.rpartition("branches.")
    projection = f"{owner}projections.{index}"
    return any(path == p or path.startswith(p + ".") for p in (branch, projection))


def _new_width(old: int, blocks: int, factor_or_mapping, names: tuple[str, ...]) -> int:
    """The width ``names`` (producers tied to one width) grow to."""
    if not isinstance(factor_or_mapping, dict):
        return math.ceil(old * float(factor_or_mapping) / blocks) * blocks
    given = {factor_or_mapping[n] for n in names if n in factor_or_mapping}
    if len(given) > 1:
        raise ConvError(f"factor_or_mapping: {', '.join(names)} are tied to one width by "
                        f"residual adds, but got the widths {sorted(given)}")
    return given.pop() if given else old


def _check_growth(factor_or_mapping, pairs: list[_Pair]) -> None:
    """A factor must be a real number ≥ 1; a mapping must name producers that ``pairs`` holds
    (a name of no such layer is an error, not a silent no-op) and give each a positive int."""
    if isinstance(factor_or_mapping, dict):
        producers = sorted({name for p in pairs for name in (p.producer, *p.tied)})
        unknown = [k for k in factor_or_mapping if k not in producers]
        if unknown:
            raise ConvError(f"factor_or_mapping: {unknown} name no layer grow_width can grow "
                            f"(producers found: {', '.join(producers) or 'none'})")
        bad = {k: v for k, v in factor_or_mapping.items()
               if isinstance(v, bool) or not isinstance(v, int) or v < 1}
        if bad:
            raise ConvError(f"factor_or_mapping: widths must be positive ints, got {bad}")
        return
    factor = real_number("factor_or_mapping", factor_or_mapping, positive=True)
    if factor < 1:
        raise ConvError(f"factor_or_mapping: got {factor_or_mapping!r}; a factor grows, so it "
                        f"must be at least 1")


def _grow_pair(pair: _Pair, get, factor_or_mapping, init, noise, generator,
               carries: dict[str, Carries]):
    """(the widened layers by path, or None when the width stays; old and new width) of
    one producer (and those tied to it) with every layer it reaches."""
    producers = [get(n) for n in (pair.producer, *pair.tied)]
    old = producers[0].out_channels
    for n, p in zip(pair.tied, producers[1:]):
        if p.out_channels != old:
            raise ConvError(f"{n} gives {p.out_channels} channels, {pair.producer} {old}: "
                            f"a residual add ties them to one width")

    def width(node):
        return _width(node, lambda target: get(pair.prefix + target))

    def placed(path: str, w: Widening) -> Widening:  # the widening as ``path`` sees it
        for cat, index in pair.routes.get(path, ()):
            widths = [width(a) for a in cat.args[0]]
            if widths[index] != w.old:
                raise ConvError(f"{path}: concatenation {cat.name} holds {widths[index]} "
                                f"channels where {w.old} were expected")
            w = w.within(sum(widths[:index]), sum(widths))
        return w

    plain = [get(c) for c in pair.consumers if c not in pair.routes]
    blocks = math.lcm(*(p.groups for p in producers), *(getattr(c, "groups", 1)
                                                        for c in plain))
    if old % blocks:
        raise ConvError(f"groups: the producers and consumers have groups whose lcm "
                        f"{blocks} does not divide their {old} channels")
    new = _new_width(old, blocks, factor_or_mapping, (pair.producer, *pair.tied))
    if new == old:
        return None, old, new
    w = Widening.plan(old, new, blocks, init, generator)
    grown: dict[str, nn.Module] = {}

    def apply(path, fn, what, size):
        layer = grown[path] if path in grown else get(path)
        wp = placed(path, w)
        if getattr(layer, size) != wp.old:
            raise ConvError(f"{path}: {what} {getattr(layer, size)} channels where "
                            f"{wp.old} were expected")
        grown[path] = fn(layer, wp, carries.setdefault(path, {}))

    for path in (pair.producer, *pair.tied):
        apply(path, lambda m, wp, c: _widen_conv_out(m, wp, init, noise, generator, c),
              "gives", "out_channels")
    for path in pair.consumers:
        layer = grown[path] if path in grown else get(path)
        apply(path, lambda m, wp, c: _widen_in(m, wp, init, c), "takes",
              "in_features" if isinstance(layer, nn.Linear) else "in_channels")
    for path in pair.depthwise:
        apply(path, lambda m, wp, c: _widen_depthwise(m, wp, init, noise, generator, c),
              "gives", "out_channels")
    for path in pair.bns:
        apply(path, lambda m, wp, c: _widen_batchnorm(m, wp, c), "normalises",
              "num_features")
    return grown, old, new


def grow_width(module: nn.Module, factor_or_mapping, optimizer=None, *, init: str = "zero",
               noise: float = 0.0, on_error: str = "raise",
               generator: torch.Generator | None = None) -> GrowthReport:
    """Widen every producer/consumer pair of ``module`` in place: by ``factor`` (rounded up
    to the groups) or to ``{producer name: width}``. All or nothing: on any failure the model
    and optimizer are left as they were and :class:`GrowthError` lists each layer; with
    ``on_error="drop"`` the failing :class:`MultiBranch` branches are removed instead (after
    the pass) and reported. With ``optimizer=`` its state follows the new parameters."""
    if on_error not in ("raise", "drop"):
        raise ConvError(f"on_error: got {on_error!r}; allowed: 'raise', 'drop'")
    if init not in INITS:
        raise ConvError(f"init: got {init!r}; allowed: {', '.join(map(repr, INITS))}")
    pairs, reasons, note = _find_groups(module)
    _check_growth(factor_or_mapping, pairs)
    report = GrowthReport(notes=[note] if note else [])
    current: dict[str, nn.Module] = {}
    carries: dict[str, Carries] = {}
    failed_branches: dict[str, str] = {}

    def get(path):
        return current[path] if path in current else module.get_submodule(path)

    for pair in pairs:
        if pair.branch in failed_branches:
            continue
        try:
            names = (pair.producer, *pair.tied)
            grown, old, new = _grow_pair(pair, get, factor_or_mapping, init, noise,
                                         generator, carries)
            if grown is None:
                report.not_grown += [(n, f"its width stays {old}") for n in names]
                continue
            current.update(grown)
            report.grown += [(n, old, new) for n in names]
            for n in names:
                report.widened[n] = tuple(p for p in grown if p != n)
        except Exception as exc:  # collected: the model is not touched until all succeed
            why = f"{type(exc).__name__}: {exc}"
            report.failed.append((pair.producer, why))
            if pair.branch is not None and on_error == "drop":
                failed_branches[pair.branch] = why
    paired = {name for p in pairs for name in (p.producer, *p.tied)}
    report.not_grown += [(name, reasons.get(name, NO_CONSUMER))
                         for name, m in module.named_modules()
                         if _is_conv(m) and name not in paired]
    if report.failed and (on_error == "raise" or any(
            not any(_inside(p, b) for b in failed_branches) for p, _ in report.failed)):
        raise GrowthError("grow_width: nothing was changed", report)
    for path in list(current):  # a dropped branch's widened layers are not installed
        if any(_inside(path, b) for b in failed_branches):
            del current[path]
    report.grown = [g for g in report.grown
                    if not any(_inside(g[0], b) for b in failed_branches)]
    # commit: every module swapped in, then optimizer state moved
    for path, new in current.items():
        parent_path, _, name = path.rpartition(".")
        parent = module.get_submodule(parent_path) if parent_path else module
        for key, (origin, carry) in carries[path].items():
            if isinstance(origin, nn.Parameter):
                report.mapping[origin] = (new.get_parameter(key), carry)
        setattr(parent, name, new)
    for m in module.modules():  # a concatenation's width is its branches'
        if isinstance(m, MultiBranch) and m.merge == "concat":
            m.out_channels = sum(_out_width(b) for b in m.branches)
    drops: dict[str, list[int]] = {}
    for branch, why in failed_branches.items():  # each MultiBranch drops its failures at once
        owner_path, _, index = ("." + branch).rpartition(".branches.")
        drops.setdefault(owner_path.lstrip("."), []).append(int(index))
        report.dropped.append((branch, why))
    for owner_path, indices in drops.items():
        (module.get_submodule(owner_path) if owner_path else module).drop_branches(indices)
    if optimizer is not None:
        carry_optimizer(optimizer, report.mapping)
    elif report.mapping:
        warnings.warn("grow_width: the model has new parameters; rebuild the optimizer or "
                      "pass optimizer= to carry its state", UserWarning, stacklevel=2)
    return report


def carry_optimizer(optimizer: torch.optim.Optimizer, mapping: dict) -> None:
    """Point ``optimizer`` at the new parameters of ``mapping`` ({old parameter: (new
    parameter, carry)}) and move their state: tensors of the parameter's shape (momentum,
    Adam's moments) are placed at the new positions with zeros in new slices; the rest
    (step counts) is kept."""
    for group in optimizer.param_groups:
        group["params"] = [mapping[p][0] if p in mapping else p for p in group["params"]]
    for old, (new, carry) in mapping.items():
        state = optimizer.state.pop(old, None)
        if state is None:
            continue
        optimizer.state[new] = {
            k: (carry(v) if isinstance(v, Tensor) and v.shape == old.shape else v)
            for k, v in state.items()}
