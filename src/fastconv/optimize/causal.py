"""Fusing the causal depthwise conv1d of Mamba-style blocks, written with torch.nn:
``act(conv(x)[..., :seqlen])`` where ``conv`` is ``nn.Conv1d(d, d, k, groups=d,
padding=k - 1)``. The padded convolution computes ``k - 1`` outputs that the slice throws
away; fused, one causal convolution with the activation in its epilogue computes only the
kept ones (``fastconv.causal_conv1d``, whose routes include kernels for training and for
wide filters; ``fastconv.conv1d`` with the padding on the left for other layouts)."""

from __future__ import annotations

import collections
import operator

import torch
import torch.nn.functional as F
from torch import nn

from ..functional import conv1d
from ..nn.conv import Conv1d
from ..seqconv import causal_conv1d
from ..tracing import has_hooks
from .report import Report


class CausalConv1dSliced(nn.Module):
    """``act(conv(x)[..., :end])``, holding the model's own ``conv``: one causal
    convolution with the activation fused where ``end`` is x's length (the slice of a
    causal block) and ``conv`` is still a causal depthwise convolution without hooks;
    anything else runs as written."""

    def __init__(self, conv: nn.Conv1d, activation: str, precision: str | None):
        super().__init__()
        self.conv, self.activation, self.precision = conv, activation, precision

    def forward(self, x: torch.Tensor, end) -> torch.Tensor:
        conv = self.conv  # (its attributes read at each call: one set later is seen)
        if x.dim() == 3 and end == x.shape[-1] and _causal_depthwise(conv) \
                and not has_hooks(conv):
            if x.stride(2) == 1 or x.stride(1) == 1:  # (the layouts causal_conv1d reads)
                return causal_conv1d(x, conv.weight.squeeze(1), conv.bias,
                                     activation=None if self.activation == "none" else "silu",
                                     precision=self.precision)
            return conv1d(x, conv.weight, conv.bias, padding=((conv.kernel_size[0] - 1, 0),),
                          groups=conv.groups, activation=self.activation,
                          precision=self.precision)
        y = conv(x)[..., :end]
        return F.silu(y) if self.activation == "silu" else y

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


def _causal_depthwise(conv) -> bool:
    """A depthwise conv1d whose zero padding is kernel − 1 on both sides (stride and
    dilation 1), torch's forward."""
    return type(conv) in (nn.Conv1d, Conv1d) \
        and conv.groups == conv.in_channels == conv.out_channels \
        and conv.stride == (1,) and conv.dilation == (1,) and conv.padding_mode == "zeros" \
        and isinstance(conv.padding, tuple) and conv.padding == (conv.kernel_size[0] - 1,) \
        and conv.kernel_size[0] >= 2


def _slice_end(node):
    """``end`` when ``node`` is ``input[..., :end]`` or ``input[:, :, :end]`` (a step of
    1 from the start), else None."""
    if node.op != "call_function" or node.target is not operator.getitem \
            or len(node.args) != 2 or node.kwargs:
        return None
    index = node.args[1]
    if not isinstance(index, tuple):
        return None
    whole = slice(None, None, None)
    if (len(index) == 2 and index[0] is Ellipsis) or (len(index) == 3
                                                       and index[:2] == (whole, whole)):
        last = index[-1]
        if isinstance(last, slice) and last.start is None and last.step is None \
                and last.stop is not None:
            return last.stop
    return None


def fuse_causal(gm: torch.fx.GraphModule, report: Report, precision,
                state_keys: dict[str, str], activation_of) -> None:
    """Replace each ``conv -> [..., :end] -> [silu]`` of a causal depthwise conv1d in
    ``gm``'s graph by one :class:`CausalConv1dSliced` call. ``activation_of(node,
    modules)`` is fuse.py's reading of an activation node."""
    modules = dict(gm.named_modules())
    calls = collections.Counter(n.target for n in gm.graph.nodes if n.op == "call_module")
    for node in list(gm.graph.nodes):
        conv = modules.get(node.target) if node.op == "call_module" else None
        if conv is None or not _causal_depthwise(conv) or has_hooks(conv) \
                or calls[node.target] > 1 or len(node.users) != 1 or len(node.args) != 1 \
                or node.kwargs:
            continue
        cut = next(iter(node.users))
        end = _slice_end(cut)
        if end is None or cut.args[0] is not node:
            continue
        chain, last, act = [node, cut], cut, "none"
        if len(cut.users) == 1:
            nxt = next(iter(cut.users))
            found = activation_of(nxt, modules)
            if found is not None and found[0] == "silu":
                chain.append(nxt)
                last, act = nxt, "silu"
        fused = CausalConv1dSliced(conv, act, precision)
        name = node.target.replace(".", "_") + "_causal"
        gm.add_submodule(name, fused)
        for key in conv.state_dict():
            state_keys[f"{name}.conv.{key}"] = f"{node.target}.{key}"
        with gm.graph.inserting_after(last):
            new = gm.graph.call_module(name, (node.args[0], end))
        last.replace_all_uses_with(new)
        for n in reversed(chain):
            gm.graph.erase_node(n)
        report.fused.append((node.target, "causal conv1d -> slice"
                             + (" -> silu" if act == "silu" else "")))
