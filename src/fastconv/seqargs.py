"""What the sequence convolutions share (``seqconv``, ``decode``, ``longconv``): their
argument checks, each a ``ConvError`` naming the argument, the value and what is allowed;
the accumulation type; and the device type whose tensors Triton kernels run on."""

from __future__ import annotations

import functools

import torch

from .errors import ConvError, ConvTypeError

#: widths ``causal_conv1d`` and ``causal_conv1d_update`` accept
MIN_WIDTH, MAX_WIDTH = 2, 256
#: the widest filter backends/triton/shortconv.py's kernels take: a tap reaches at most two
#: chunks (16 positions) back
SHORT_MAX_WIDTH = 17
#: the activations they accept ("swish" is SiLU)
ACTIVATIONS = (None, "silu", "swish")


def short_eligible(x: torch.Tensor, width: int) -> bool:
    """Whether shortconv.py's kernels run causal_conv1d(x) of this width: up to
    SHORT_MAX_WIDTH taps, not float64 (they compute in float32), a batch of 1 to 65,535 rows
    and at most 65,535 channels (grid axes 2 and 1: a program may hold one channel)."""
    return (width <= SHORT_MAX_WIDTH and x.dtype != torch.float64 and 0 < x.shape[0] <= 65535
            and x.shape[1] <= 65535)


def accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """The accumulation type: float64 stays, everything else accumulates in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def described(t) -> object:
    """A tensor's shape, or the type of what was given instead (for error messages)."""
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def activation_name(activation) -> str:
    if activation not in ACTIVATIONS:
        raise ConvError(f"activation: got {activation!r}; allowed: None, 'silu', 'swish'")
    return "none" if activation is None else "silu"


def check_weight(weight: torch.Tensor, dim: int, x: torch.Tensor) -> int:
    if not isinstance(weight, torch.Tensor):
        raise ConvTypeError(f"weight: got {type(weight).__name__}; expected a tensor "
                            f"(dim, width)")
    if weight.dim() != 2 or weight.shape[0] != dim:
        raise ConvError(f"weight: got shape {tuple(weight.shape)}; expected (dim, width) "
                        f"with dim = {dim} (x's second dimension)")
    width = weight.shape[1]
    if not MIN_WIDTH <= width <= MAX_WIDTH:
        raise ConvError(f"weight: width {width}; allowed: {MIN_WIDTH} to {MAX_WIDTH}")
    if not weight.is_floating_point():
        raise ConvError(f"weight: got dtype {weight.dtype}; expected a floating-point tensor")
    if weight.device != x.device:
        raise ConvError(f"weight: on {weight.device}, x on {x.device}; expected one device")
    return width


def check_x(x: torch.Tensor, name: str = "x") -> None:
    if not isinstance(x, torch.Tensor):
        raise ConvTypeError(f"{name}: got {type(x).__name__}; expected a tensor")
    if x.dim() != 3:
        raise ConvError(f"{name}: got shape {tuple(x.shape)}; expected (batch, dim, seqlen)")
    if not x.is_floating_point():
        raise ConvError(f"{name}: got dtype {x.dtype}; expected a floating-point tensor")
    if x.shape[1] == 0 or x.shape[2] == 0:
        raise ConvError(f"{name}: got shape {tuple(x.shape)}; dim and seqlen must be positive "
                        f"(an empty batch is allowed)")


def check_bias(bias, dim: int, x: torch.Tensor) -> None:
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (dim,)
                             or bias.device != x.device or not bias.is_floating_point()):
        raise ConvError(f"bias: got {described(bias)}; expected None or a floating-point "
                        f"tensor ({dim},) on {x.device}")


def readable(x: torch.Tensor, name: str = "x") -> torch.Tensor:
    """``x`` itself in either layout the kernels read (seqlen-contiguous or dim-contiguous);
    any other strides are refused."""
    if x.stride(2) == 1 or x.stride(1) == 1 or x.numel() == 0:
        return x
    raise ConvError(f"{name}: strides {x.stride()} for shape {tuple(x.shape)}; expected "
                    f"seqlen-contiguous (stride(2) == 1) or dim-contiguous (stride(1) == 1): "
                    f"call .contiguous() first")


def check_tensor(t, name: str, layout: str, shape: tuple, dtype: torch.dtype,
                  device: torch.device) -> None:
    """``t`` has ``shape`` (described as ``layout``), ``dtype`` and ``device``."""
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
        raise ConvError(f"{name}: got {described(t)}; expected {layout} = {shape}")
    if t.dtype != dtype or t.device != device:
        raise ConvError(f"{name}: {t.dtype} on {t.device}; expected {dtype} on {device}")


@functools.lru_cache(maxsize=1)
def kernel_device() -> str | None:
    """The device type whose tensors Triton kernels run on in this process: "cuda", "cpu"
    under Triton's interpreter, None without Triton (asked once: the question costs ~0.1 ms,
    as much as the decode step itself)."""
    from . import backends

    if not backends.get("triton").available()[0]:
        return None
    from .backends.triton.launch import INTERPRETED

    return "cpu" if INTERPRETED else "cuda"


def kernels_run_on(device_type: str) -> bool:
    """Whether Triton's kernels run on tensors of this device type here (:func:`kernel_device`);
    a constant to torch.compile's tracing, which calls it once instead of tracing it."""
    return kernel_device() == device_type


# torch.compiler.assume_constant_result's mark, set without calling it: it imports
# torch._dynamo, which imports Triton's language, whose own jit functions are then decorated
# compiled, at ``import fastconv`` and before a command can choose the interpreter (every
# interpreted kernel then failed: "Cannot call @triton.jit'd outside of the scope of a
# kernel"). tests/test_cli.py checks that the mark is the one the API sets.
kernels_run_on._dynamo_marked_constant = True
