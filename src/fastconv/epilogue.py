"""The fused epilogue shared by every backend: ``y = act(scale[k]·conv + shift[k] + residual)``.

A convolution bias is a shift; a folded BatchNorm is a scale and a shift. The residual is
added before the activation (as in a ResNet block: ``relu(bn(conv(x)) + identity)``).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor

from .errors import ConvError, ConvTypeError, real_number
from .precision import accumulate_dtype

#: Activation names in the order of their integer codes (the Triton kernels use the code).
ACTIVATIONS: tuple[str, ...] = ("none", "relu", "relu6", "leaky_relu", "silu", "gelu",
                                "gelu_tanh", "sigmoid", "tanh", "hardswish")


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """What is applied to the convolution result before it is stored.

    Only the *signature* lives here (which operands exist, which activation); the per-call
    tensors travel beside it.
    """

    activation: str = "none"
    negative_slope: float = 0.01  # leaky_relu only
    has_scale: bool = False
    has_shift: bool = False
    has_residual: bool = False

    def __post_init__(self):
        if not isinstance(self.activation, str):
            raise ConvTypeError(f"activation: expected one of the names "
                                f"{', '.join(map(repr, ACTIVATIONS))}, got "
                                f"{type(self.activation).__name__} {self.activation!r}")
        if self.activation not in ACTIVATIONS:
            raise ConvError(f"activation: got {self.activation!r}; allowed: "
                            f"{', '.join(map(repr, ACTIVATIONS))}")
        real_number("negative_slope", self.negative_slope)

    @property
    def act_code(self) -> int:
        return ACTIVATIONS.index(self.activation)

    @property
    def is_identity(self) -> bool:
        """Nothing applied: no operand and no activation (the slope, read by leaky_relu
        only, does not count)."""
        return self.activation == "none" and not (self.has_scale or self.has_shift
                                                  or self.has_residual)

    def signature(self) -> str:
        parts = [self.activation if self.activation != "leaky_relu"
                 else f"leaky_relu{self.negative_slope:g}"]
        parts += [name for name, on in (("scale", self.has_scale), ("shift", self.has_shift),
                                        ("res", self.has_residual)) if on]
        return "+".join(parts)

    def apply(self, y: torch.Tensor, scale: torch.Tensor | None = None,
              shift: torch.Tensor | None = None,
              residual: torch.Tensor | None = None) -> torch.Tensor:
        """Apply the epilogue in torch, in ``y``'s dtype; channels are dimension 1.

        Used by the aten backend and, on float64 tensors, as the reference in tests.
        """
        return apply(y, scale, shift, residual, self.activation, self.negative_slope)


def apply(y: torch.Tensor, scale: torch.Tensor | None, shift: torch.Tensor | None,
          residual: torch.Tensor | None, activation: str,
          negative_slope: float = 0.01) -> torch.Tensor:
    """:meth:`Epilogue.apply` without an Epilogue (what torch.compile traces: dynamo on torch
    2.11 cannot build the dataclass in a traced function)."""
    view = (1, -1) + (1,) * (y.dim() - 2)
    if scale is not None:
        y = y * scale.to(y.dtype).view(view)
    if shift is not None:
        y = y + shift.to(y.dtype).view(view)
    if residual is not None:
        y = y + residual.to(y.dtype)
    return activate(y, activation, negative_slope)


def activate(y: torch.Tensor, activation: str, negative_slope: float = 0.01,
             inplace: bool = False) -> torch.Tensor:
    """``activation`` applied with torch's own functions (NaN propagates as in torch); with
    ``inplace``, into ``y`` where torch has an in-place form (not GELU)."""
    if activation == "none":
        return y
    if activation == "relu":
        return F.relu(y, inplace)
    if activation == "relu6":
        return F.hardtanh(y, 0.0, 6.0, inplace)
    if activation == "leaky_relu":
        return F.leaky_relu(y, negative_slope, inplace)
    if activation == "silu":
        return F.silu(y, inplace)
    if activation == "gelu":
        return F.gelu(y)
    if activation == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    if activation == "sigmoid":
        return y.sigmoid_() if inplace else torch.sigmoid(y)
    if activation == "tanh":
        return y.tanh_() if inplace else torch.tanh(y)
    if activation == "hardswish":
        return F.hardswish(y, inplace)
    raise ConvError(f"activation: got {activation!r}; allowed: {', '.join(map(repr, ACTIVATIONS))}")


def fold_bias(bias: torch.Tensor | None, scale: torch.Tensor | None,
              shift: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Fold a convolution bias into the epilogue: ``scale·(conv + bias) + shift``.

    Returns ``(scale, shift)`` for backends that take no bias. A lone bias is passed through
    as the shift, untouched (kernels read it in its own dtype); only a bias combined with a
    scale or a shift costs a small fp32 (float64 for float64 data) computation.
    """
    if bias is None:
        return scale, shift
    if scale is None and shift is None:
        return None, bias
    acc = accumulate_dtype(bias.dtype)
    b = bias.detach().to(acc)
    if scale is not None:
        b = b * scale.detach().to(acc)
    if shift is not None:
        b = b + shift.detach().to(acc)
    return scale, b.contiguous()


def derivative_from_output(activation: str, negative_slope: float) -> bool:
    """Whether ``activation_grad`` reads the output (else it recomputes the pre-activation,
    or needs nothing: no activation)."""
    return activation in ("relu", "relu6", "sigmoid", "tanh") or (
        activation == "leaky_relu" and negative_slope > 0)


def activation_grad(grad: Tensor, y: Tensor, activation: str, negative_slope: float,
                    pre_activation) -> Tensor:
    """``act'(z)·grad`` given the output ``y``; ``pre_activation()`` recomputes ``z`` for
    the activations whose derivative ``y`` does not determine."""
    aten = torch.ops.aten
    if activation == "none":
        return grad
    if activation == "relu":
        return aten.threshold_backward(grad, y, 0)
    if activation == "relu6":  # 0 < y < 6 exactly where 0 < z < 6
        return aten.hardtanh_backward(grad, y, 0.0, 6.0)
    if activation == "leaky_relu" and negative_slope > 0:  # y > 0 exactly where z > 0
        return aten.leaky_relu_backward(grad, y, negative_slope, False)
    if activation == "sigmoid":
        return aten.sigmoid_backward(grad, y)
    if activation == "tanh":
        return aten.tanh_backward(grad, y)
    z = pre_activation()  # (the cases above are derivative_from_output's)
    if activation == "leaky_relu":
        return aten.leaky_relu_backward(grad, z, negative_slope, False)
    if activation == "silu":
        return aten.silu_backward(grad, z)
    if activation in ("gelu", "gelu_tanh"):
        return aten.gelu_backward(grad, z, approximate="tanh" if activation == "gelu_tanh"
                                  else "none")
    if activation == "hardswish":
        return aten.hardswish_backward(grad, z)
    raise AssertionError(f"no derivative for activation {activation!r}")
