"""What a growth step did, and the error that says why one could not be done."""

from __future__ import annotations

import dataclasses

from ..errors import ConvError


class GrowthError(ConvError):
    """A growth step that could not be done; ``report`` says which layer failed and why.
    The model and optimizer are left exactly as they were."""

    def __init__(self, message: str, report: GrowthReport | None = None):
        self.report = report
        super().__init__(message if report is None else f"{message}\n{report}")


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
