"""Exceptions raised by fastconv.

Every argument error is a :class:`ConvError` (a ``ValueError``) whose message names the
argument, the value received and what is allowed. Where PyTorch raises ``TypeError`` for the
same mistake (a non-tensor input, a float stride) fastconv raises :class:`ConvTypeError`,
which is both a ``ConvError`` and a ``TypeError``.
"""

from __future__ import annotations

import math
import numbers

import torch


class ConvError(ValueError):
    """An invalid argument to a fastconv operator."""


class ConvTypeError(ConvError, TypeError):
    """An argument of the wrong type (where PyTorch raises ``TypeError``)."""


class NotSupported(ConvError):
    """A backend that was asked for by name cannot run the problem.

    ``reasons`` lists every reason, one readable sentence each.
    """

    def __init__(self, backend: str, reasons: list[str]):
        self.backend = backend
        self.reasons = list(reasons)
        lines = "\n".join(f"  - {r}" for r in self.reasons)
        super().__init__(f"backend {backend!r} cannot run this convolution:\n{lines}")


def real_number(name: str, value, *, positive: bool = False) -> float:
    """``value`` as a finite float, or ConvTypeError / ConvError naming ``name``. While
    torch.compile traces, ``value`` passes as it is (with dynamic=True a module's float
    attribute is symbolic there; modules check theirs when they are built)."""
    if torch.compiler.is_compiling():
        return value
    if type(value) is float and math.isfinite(value) and (value > 0 or not positive):
        return value  # the common case, without the ABC check (runs on every layer call)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConvTypeError(f"{name}: expected a real number, got {type(value).__name__} "
                            f"{value!r}")
    number = float(value)
    if not math.isfinite(number) or (positive and number <= 0):
        raise ConvError(f"{name}: got {value!r}; must be finite"
                        + (" and positive" if positive else ""))
    return number
