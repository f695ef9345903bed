"""What grows together: a producer and every layer its widening reaches (:class:`Pair`),
and the module kinds that pass channels through."""

from __future__ import annotations

import dataclasses

from torch import nn
from torch.nn.modules.conv import _ConvNd

#: Modules that keep the channel dimension and act per channel or per element: a producer
#: and a consumer separated only by these (and at most one BatchNorm) form a pair.
PASSTHROUGH = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.SiLU, nn.GELU, nn.Sigmoid, nn.Tanh,
               nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Mish, nn.ELU, nn.SELU,
               nn.Softplus, nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d,
               nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d)
#: per-sample layers of other libraries (torchvision's stochastic depth, timm's drop path)
PASSTHROUGH_NAMES = ("StochasticDepth", "DropPath")
PASSTHROUGH_FUNCTION_NAMES = ("stochastic_depth", "drop_path")


@dataclasses.dataclass
class Pair:
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


def is_conv(m) -> bool:
    return isinstance(m, _ConvNd)


def inside(path: str, branch: str) -> bool:
    """Whether ``path`` is part of MultiBranch branch ``branch`` (its projection included)."""
    owner, _, index = branch.rpartition("branches.")
    projection = f"{owner}projections.{index}"
    return any(path == p or path.startswith(p + ".") for p in (branch, projection))

