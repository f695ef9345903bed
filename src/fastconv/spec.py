"""The call specs: what a convolution call asks for besides its tensors, built once per call
and relayed whole, so that a reader follows one object from ``conv2d`` to the plan and a
plan key cannot leave an argument out.

* :class:`ConvCall`: the arguments as the caller gave them (the functional API builds it
  from its arguments, a module from its attributes at each call); part of every plan key.
* :class:`OpArgs`: the same arguments normalised, in the order of the ``fastconv::conv``
  custom op's schema (torch.library takes flat arguments: ``ops`` spreads them).
* :class:`GradArgs`: what the data and weight gradients of a convolution need.
* :class:`Norm`: a BatchNorm's tensors and numbers for ``batchnorm.bn_act``.

They are named tuples: built and hashed at C speed on the hot path.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import Tensor


class ConvCall(NamedTuple):
    """A convolution call's arguments besides its tensors, as given."""

    rank: int  # 1 or 2 spatial dimensions
    transposed: bool
    stride: Any
    padding: Any
    dilation: Any
    groups: Any
    output_padding: Any
    activation: str = "none"
    negative_slope: float = 0.01
    backend: str = "auto"
    precision: str | None = None

    def kinds(self) -> tuple | None:
        """What a cache key needs besides the values themselves: True == 1 and 1.0 == 1, but
        a bool or float stride must be refused, not served an int's plan. None (the common
        case, checked with the least work) when each geometry value is an int, a str or a
        tuple of ints and the slope an int or a float; else the types, one level into
        tuples."""
        for v in (self.stride, self.padding, self.dilation, self.groups, self.output_padding):
            t = type(v)
            if t is tuple:
                for e in v:
                    if type(e) is not int:
                        return self._types()
            elif t is not int and t is not str:
                return self._types()
        slope = type(self.negative_slope)
        if slope is not float and slope is not int:
            return self._types()
        return None

    def _types(self) -> tuple:
        return tuple(tuple(map(type, v)) if type(v) is tuple else type(v)
                     for v in (self.stride, self.padding, self.dilation, self.groups,
                               self.output_padding, self.negative_slope))


class OpArgs(NamedTuple):
    """A call's arguments normalised (``problem.normalize_geometry``): the non-tensor
    arguments of the ``fastconv::conv`` op, in its schema's order."""

    stride: list[int]
    pad_pre: list[int]
    pad_post: list[int]
    dilation: list[int]
    groups: int
    transposed: bool
    output_padding: list[int]
    activation: str
    negative_slope: float
    backend: str
    precision: str

    def grads(self) -> GradArgs:
        return GradArgs(self.stride, self.pad_pre, self.pad_post, self.dilation, self.groups,
                        self.backend, self.precision)


class GradArgs(NamedTuple):
    """The data and weight gradients' arguments (normalised geometry, no epilogue)."""

    stride: list[int]
    pad_pre: list[int]
    pad_post: list[int]
    dilation: list[int]
    groups: int
    backend: str
    precision: str


class Norm(NamedTuple):
    """A BatchNorm in a fused call: ``weight`` and ``bias`` are γ and β; the running
    statistics (None: none updated) are updated in place with ``momentum``."""

    weight: Tensor | None
    bias: Tensor | None
    running_mean: Tensor | None
    running_var: Tensor | None
    momentum: float
    eps: float
