"""MultiBranch: branches applied to one input and merged, the unit
:func:`~fastconv.growth.grow_width` grows branch by branch."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.modules.conv import _ConvNd

from ..errors import ConvError
from .report import GrowthError


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
