"""torchvision's FrozenBatchNorm2d as a BatchNorm that optimize() fuses."""

from __future__ import annotations

from torch import nn

from .report import Report


class _FrozenBatchNorm2d(nn.BatchNorm2d):
    """torchvision's ``FrozenBatchNorm2d`` as a BatchNorm that optimize() fuses: always in
    eval mode (``train()`` leaves it there), γ, β and the statistics buffers (no parameters,
    as in the original), the same state_dict keys (no ``num_batches_tracked``)."""

    def __init__(self, frozen: nn.Module):
        super().__init__(frozen.weight.numel(), eps=frozen.eps, affine=False,
                         device=frozen.weight.device, dtype=frozen.weight.dtype)
        del self.weight, self.bias  # the None parameters of affine=False
        for name in ("weight", "bias", "running_mean", "running_var"):
            self.register_buffer(name, getattr(frozen, name))  # the very tensors
        self.num_batches_tracked = None
        self.train(False)

    def train(self, mode: bool = True):
        return super().train(False)

    def _load_from_state_dict(self, state_dict, prefix, *args):
        state_dict.pop(prefix + "num_batches_tracked", None)  # as torchvision's does
        nn.Module._load_from_state_dict(self, state_dict, prefix, *args)


def unfreeze_frozen_norms(model: nn.Module, report: Report) -> None:
    """Every torchvision ``FrozenBatchNorm2d`` of ``model`` (the copy) replaced by
    :class:`_FrozenBatchNorm2d`, a module used twice by one replacement."""
    try:
        from torchvision.ops.misc import FrozenBatchNorm2d
    except ImportError:
        return
    done: dict[int, nn.Module] = {}
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if type(child) is FrozenBatchNorm2d:
                if id(child) not in done:
                    done[id(child)] = _FrozenBatchNorm2d(child)
                parent._modules[name] = done[id(child)]
    if done:
        report.notes.append(f"{len(done)} FrozenBatchNorm2d normalise with their fixed "
                            f"statistics as eval-mode BatchNorms (fused where a convolution "
                            f"precedes them)")
