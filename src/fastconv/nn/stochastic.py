"""torchvision's StochasticDepth with a free eval() call, for the models ``optimize`` traces
(imported only where a model holds one: torchvision is optional)."""

from __future__ import annotations

import torchvision
from torch import Tensor


class StochasticDepth(torchvision.ops.StochasticDepth):
    """``torchvision.ops.StochasticDepth`` returning its input at once wherever torchvision's
    returns it unchanged (eval(), or p = 0). torchvision's forward logs its API use and
    checks its arguments on every call first: ~8 us of host per call under cProfile, 18
    calls per eager ConvNeXt-T forward (benchmarks/NOTES.md).
    Training calls are torchvision's own."""

    def forward(self, input: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return input
        return super().forward(input)

    @classmethod
    def from_torchvision(cls, module: torchvision.ops.StochasticDepth) -> StochasticDepth:
        """The same layer (``p``, ``mode``, training flag), or None where torchvision's would
        raise on its arguments (kept as it is: it raises there in eval() too)."""
        if not 0.0 <= module.p <= 1.0 or module.mode not in ("batch", "row"):
            return None
        return cls(module.p, module.mode).train(module.training)
