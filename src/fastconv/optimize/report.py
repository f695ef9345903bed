"""What optimize() did: the fused patterns, the convolutions left alone and why, notes."""

from __future__ import annotations

import dataclasses

NO_NORM = "not followed by a BatchNorm module"
UNSEEN = ("not a Conv -> BatchNorm run of an nn.Sequential's children (the model was not "
           "traced, so nothing else is fused)")
HOOKED = "has hooks (left as it is, so that they run)"
WALKED = ("fused only Conv -> BatchNorm runs of nn.Sequential children, each when the "
           "Sequential is called as a whole. To fuse more, make the forward traceable by "
           "torch.fx: no Python control flow on tensor values (torch.fx's 'Limitations of "
           "Symbolic Tracing')")


@dataclasses.dataclass
class Report:
    """What :func:`optimize` did: ``fused`` (conv name, pattern) and ``left`` (conv name,
    reason), plus notes on the whole model."""
    fused: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    left: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def coverage(self) -> tuple[int, int, int]:
        """(fused, eligible, total) convolutions: eligible ones are followed by a BatchNorm
        or are a causal conv1d block (fused, or left for a reason the report gives); total
        counts every convolution the pass looked at (the module walk, without a trace, sees
        only Sequential chains)."""
        eligible = len(self.fused) + sum(not why.startswith(NO_NORM) and why != UNSEEN
                                         for _, why in self.left)
        return len(self.fused), eligible, len(self.fused) + len(self.left)

    def __str__(self) -> str:
        fused, eligible, total = self.coverage()
        lines = [f"fused {fused} of {eligible} convolutions followed by a BatchNorm or "
                 f"causal ({total} convolutions), left {len(self.left)}"]
        lines += [f"  fused {name}: {pattern}" for name, pattern in self.fused]
        lines += [f"  left  {name}: {why}" for name, why in self.left]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)
