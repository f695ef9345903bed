"""``ChainedSequential``: an ``nn.Sequential`` whose forward runs some of its runs of children
as one fused layer, while the children themselves stay as they were.

``optimize`` uses it where a model cannot be traced: it cannot see whether the model calls a
Sequential as a whole or reaches into it (``seq[0](x)``, another op, then ``seq[1]``). With
this class both are right: a call of the Sequential runs the fused layers, and a child
called on its own is the child as it was (same object, parameters, buffers, hooks,
state_dict keys).
"""

from __future__ import annotations

from torch import Tensor, nn


class ChainedSequential(nn.Sequential):
    """``nn.Sequential`` (children, indexing, iteration and state_dict unchanged) whose
    forward runs each chain of children ``(conv, bn[, act])`` as its fused layer, for as
    long as those very modules stand there in that order (a Sequential edited after
    ``optimize`` runs the children it holds). The fused layers hold the children's own
    Parameters and BatchNorm (read again at each call, so that a replaced Parameter is
    used), and are not registered: the module's parameters, buffers and state_dict are the
    children's."""

    #: index of a chain's first child -> (the chain's children, their fused layer)
    _chains: dict[int, tuple[tuple[nn.Module, ...], nn.Module]]

    @classmethod
    def chain(cls, seq: nn.Sequential, chains: list[tuple[int, int, nn.Module]]) -> None:
        """Make ``seq`` (an exact ``nn.Sequential``) run ``chains`` ((index of the conv,
        number of children, fused layer) each) fused."""
        children = list(seq._modules.values())
        seq.__class__ = cls
        seq.__dict__["_chains"] = {i: (tuple(children[i:i + n]), fused)
                                   for i, n, fused in chains}

    def forward(self, input: Tensor) -> Tensor:
        children = list(self._modules.values())
        chains = self.__dict__.get("_chains", {})  # (a slice of it has none)
        x, i = input, 0
        while i < len(children):
            hit = chains.get(i)
            if hit is not None and _same(hit[0], children, i):
                x = _synced(hit[1], hit[0])(x)
                i += len(hit[0])
            else:
                x = children[i](x)
                i += 1
        return x


def _same(run: tuple[nn.Module, ...], children: list[nn.Module], i: int) -> bool:
    """Whether ``children[i:]`` starts with the very modules of ``run``."""
    return len(children) - i >= len(run) and all(
        a is b for a, b in zip(run, children[i:i + len(run)]))


#: the conv's attributes its forward reads, which the fused layer takes at each call
_CONV_ATTRIBUTES = ("stride", "padding", "dilation", "groups", "padding_mode",
                    "_reversed_padding_repeated_twice", "backend", "precision")


def _synced(fused: nn.Module, run: tuple[nn.Module, ...]) -> nn.Module:
    """``fused`` with the conv's current Parameters and attributes, the BatchNorm itself
    and its mode, and the activation's slope (a LeakyReLU's, set after ``optimize``)."""
    conv, bn = run[0], run[1]
    fused._parameters["weight"] = conv._parameters["weight"]
    fused._parameters["bias"] = conv._parameters["bias"]
    state = fused.__dict__
    for name in _CONV_ATTRIBUTES:
        state[name] = conv.__dict__[name]
    if len(run) > 2 and isinstance(run[2], nn.LeakyReLU):
        state["negative_slope"] = run[2].negative_slope
    fused._modules["bn"] = bn
    state["training"] = bn.training
    return fused
