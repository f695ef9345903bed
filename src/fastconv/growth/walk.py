"""Pairs without a trace: a module walk over Sequential chains, residual blocks and
MultiBranch branches (used where torch.fx cannot trace the model)."""

from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .multibranch import MultiBranch
from .pairs import PASSTHROUGH, Pair, is_conv


def find_pairs(module: nn.Module, prefix: str = "", branch: str | None = None
                ) -> list[Pair]:
    pairs: list[Pair] = []

    def join(name: str) -> str:
        return f"{prefix}.{name}" if prefix else name
    if isinstance(module, MultiBranch):
        for i, (b, proj) in enumerate(zip(module.branches, module.projections)):
            name = join(f"branches.{i}")
            pairs += find_pairs(b, name, name)
            last = tail(b)  # the branch's last conv feeds its 1x1 projection: a pair
            if last is not None and is_conv(proj):
                conv, bn = last
                pairs.append(Pair(under(name, conv), (join(f"projections.{i}"),),
                                   (under(name, bn),) if bn is not None else (), (), name))
        return pairs
    if all(hasattr(module, a) for a in ("conv1", "bn1", "conv2", "bn2")):  # residual block
        chain = [("conv1", "bn1", "conv2")]
        if hasattr(module, "conv3"):
            chain.append(("conv2", "bn2", "conv3"))
        return [Pair(join(p), (join(c),), (join(b),), (), branch) for p, b, c in chain]
    if isinstance(module, nn.Sequential):
        producer, bn = None, None
        for name, child in module.named_children():
            if is_conv(child):
                if producer is not None:
                    pairs.append(Pair(join(producer), (join(name),),
                                       (join(bn),) if bn else (), (), branch))
                producer, bn = name, None
            elif isinstance(child, _BatchNorm) and producer is not None and bn is None:
                bn = name
            elif isinstance(child, PASSTHROUGH):
                continue
            else:  # a block: its own inner pairs; no pair across it
                pairs += find_pairs(child, join(name), branch)
                producer, bn = None, None
        return pairs
    for name, child in module.named_children():
        pairs += find_pairs(child, join(name), branch)
    return pairs


def tail(branch: nn.Module) -> tuple[str, str | None] | None:
    """(path of the convolution whose output a branch returns, of the BatchNorm after it)
    relative to the branch ("" for the branch itself), or None when something else ends
    it."""
    if is_conv(branch):
        return "", None
    if not isinstance(branch, nn.Sequential):
        return None
    conv, bn = None, None
    for name, child in branch.named_children():
        if is_conv(child):
            conv, bn = name, None
        elif isinstance(child, _BatchNorm) and conv is not None and bn is None:
            bn = name
        elif not isinstance(child, PASSTHROUGH):
            conv, bn = None, None
    return None if conv is None else (conv, bn)


def under(prefix: str, path: str) -> str:
    return f"{prefix}.{path}" if path else prefix
