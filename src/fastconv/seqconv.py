"""Convolutions for sequence models: the causal depthwise conv1d of Mamba-style blocks (with
states, packed sequences and a decode step), and long causal convolutions (Hyena).

``causal_conv1d`` and ``causal_conv1d_update`` take causal-conv1d's arguments and follow
its convention (``F.conv1d`` with ``width - 1`` zeros on the left: ``weight[:, -1]``
multiplies the current position), so that a model switches by changing an import.
``long_conv1d`` follows the FFT convention of Hyena and FlashFFTConv (``weight[:, 0]``
multiplies the current position).

Routes: a causal conv1d without ``seq_idx`` runs through :func:`fastconv.conv1d` (dispatch
picks the Triton depthwise kernel or torch's; initial states are prepended to the input),
except where it will be differentiated and is large (``_TRAIN_KERNELS_MIN_NUMEL``): then the
kernels of ``backends/triton/packed.py`` run it, forward and backward, where they run; with
``seq_idx`` each tap is masked where it would reach into another sequence (those kernels on
a GPU; torch operations, one pass per tap, under torch.compile's tracing and where Triton
does not run). The decode step of one token is one Triton kernel on a GPU
(``backends/triton/decode.py``), torch operations otherwise (several tokens, a circular
state, autograd, torch.compile's tracing); neither synchronises the host: both capture in a
CUDA graph. Everything has autograd through torch's or fastconv's differentiable operations,
deterministic unless torch's deterministic setting says otherwise for an operation it
reports.
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F

from .errors import ConvError, ConvTypeError
from .functional import _autocast, conv1d
from .precision import parse

#: widths ``causal_conv1d`` accepts
MIN_WIDTH, MAX_WIDTH = 2, 256
#: where a causal conv1d without seq_idx that will be differentiated runs the packed kernels
#: (not fastconv.conv1d): measured on an H200 in bf16 (benchmarks/NOTES.md, "Sequence
#: convolutions"), forward and backward 1.5-3.1x faster from 2^25 elements at widths 2-16
#: (1.2x at width 32, none at 64); below 2^24 elements their fixed ~0.5 ms per step loses
_TRAIN_KERNELS_MIN_NUMEL, _TRAIN_KERNELS_MAX_WIDTH = 1 << 25, 32
#: from this width, a causal conv1d without seq_idx runs the tensor-core (Toeplitz) kernels
#: (forward, and backward where it will be differentiated)
_WIDE_MIN_WIDTH = 32
_ACTIVATIONS = (None, "silu", "swish")


def _acc(dtype: torch.dtype) -> torch.dtype:
    """The accumulation type: float64 stays, everything else accumulates in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _described(t) -> object:
    """A tensor's shape, or the type of what was given instead (for error messages)."""
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def _activation(activation) -> str:
    if activation not in _ACTIVATIONS:
        raise ConvError(f"activation: got {activation!r}; allowed: None, 'silu', 'swish'")
    return "none" if activation is None else "silu"


def _check_weight(weight: torch.Tensor, dim: int, x: torch.Tensor) -> int:
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


def _check_x(x: torch.Tensor, name: str = "x") -> None:
    if not isinstance(x, torch.Tensor):
        raise ConvTypeError(f"{name}: got {type(x).__name__}; expected a tensor")
    if x.dim() != 3:
        raise ConvError(f"{name}: got shape {tuple(x.shape)}; expected (batch, dim, seqlen)")
    if not x.is_floating_point():
        raise ConvError(f"{name}: got dtype {x.dtype}; expected a floating-point tensor")
    if x.shape[1] == 0 or x.shape[2] == 0:
        raise ConvError(f"{name}: got shape {tuple(x.shape)}; dim and seqlen must be positive "
                        f"(an empty batch is allowed)")


def _check_bias(bias, dim: int, x: torch.Tensor) -> None:
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (dim,)
                             or bias.device != x.device or not bias.is_floating_point()):
        raise ConvError(f"bias: got {_described(bias)}; expected None or a floating-point "
                        f"tensor ({dim},) on {x.device}")


def _in_dtypes(x, weight, bias, initial_states) -> tuple:
    """The operands in the dtypes every route computes in: autocast's casts where it is on
    for x's device (torch's rule for a convolution: floating tensors other than float64 to
    its dtype), then weight and bias in x's dtype (as causal-conv1d, they may come in
    another), so that the output has x's dtype, or autocast's, whichever route runs."""
    if torch._C._is_any_autocast_enabled() and torch.is_autocast_enabled(x.device.type):
        x, weight, bias, initial_states = _autocast(x.device.type, x, weight, bias,
                                                    initial_states)
    if weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    return x, weight, bias, initial_states


def _readable(x: torch.Tensor, name: str = "x") -> torch.Tensor:
    """``x`` itself in either layout the kernels read (seqlen-contiguous or dim-contiguous);
    any other strides are refused."""
    if x.stride(2) == 1 or x.stride(1) == 1 or x.numel() == 0:
        return x
    raise ConvError(f"{name}: strides {x.stride()} for shape {tuple(x.shape)}; expected "
                    f"seqlen-contiguous (stride(2) == 1) or dim-contiguous (stride(1) == 1): "
                    f"call .contiguous() first")


def _check_tensor(t, name: str, layout: str, shape: tuple, dtype: torch.dtype,
                  device: torch.device) -> None:
    """``t`` has ``shape`` (described as ``layout``), ``dtype`` and ``device``."""
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
        raise ConvError(f"{name}: got {_described(t)}; expected {layout} = {shape}")
    if t.dtype != dtype or t.device != device:
        raise ConvError(f"{name}: {t.dtype} on {t.device}; expected {dtype} on {device}")


def _check_states(states, x: torch.Tensor, width: int, name: str) -> None:
    _check_tensor(states, name, "(batch, dim, width - 1)", (x.shape[0], x.shape[1], width - 1),
                  x.dtype, x.device)


def _check_seq_idx(seq_idx, x: torch.Tensor) -> None:
    _check_tensor(seq_idx, "seq_idx", "(batch, seqlen)", (x.shape[0], x.shape[2]), torch.int32,
                  x.device)


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  seq_idx: torch.Tensor | None = None,
                  initial_states: torch.Tensor | None = None,
                  return_final_states: bool = False, activation: str | None = None, *,
                  precision: str | None = None):
    """Causal depthwise 1-D convolution: ``out[:, d, t] = act(bias[d] + Σ_k weight[d, k] ·
    x[:, d, t − (width − 1) + k])``, positions before the start reading ``initial_states``
    (zeros without them).

    Args:
        x: ``(batch, dim, seqlen)``, seqlen-contiguous or dim-contiguous.
        weight: ``(dim, width)``, width 2 to 256; any floating dtype (used in x's).
        bias: optional ``(dim,)``; any floating dtype (used in x's).
        seq_idx: optional ``(batch, seqlen)`` int32: packed sequences. A position never reads
            one with another ``seq_idx``; the sequence at position 0 of a row starts from
            ``initial_states`` (zeros without them), every later one from zeros.
        initial_states: optional ``(batch, dim, width − 1)``, x's dtype: the inputs before
            position 0.
        return_final_states: also return the ``(batch, dim, width − 1)`` inputs a next chunk
            of the row's last sequence reads (zeros where they belong to another sequence).
        activation: None, ``"silu"`` or ``"swish"`` (the same).
        precision: as :func:`fastconv.conv1d`'s, for the route through it (float32 data; the
            kernels' routes multiply-add in float32 whatever it says).

    Returns ``out`` (x's shape and dtype), or ``(out, final_states)``. Differentiable in x,
    weight, bias and initial_states. Under autocast, x, weight, bias and initial_states are
    cast first as for torch's convolutions (floating tensors other than float64 to
    autocast's dtype), so the output then has autocast's dtype.
    """
    _check_x(x)
    x = _readable(x)
    dim = x.shape[1]
    width = _check_weight(weight, dim, x)
    _check_bias(bias, dim, x)
    act = _activation(activation)
    if precision is not None:
        parse(precision)
    x, weight, bias, initial_states = _in_dtypes(x, weight, bias, initial_states)
    if initial_states is not None:
        _check_states(initial_states, x, width, "initial_states")
    if seq_idx is not None:
        _check_seq_idx(seq_idx, x)
        return _packed(x, weight, bias, seq_idx, initial_states, return_final_states, act)
    grad = _requires_grad(x, weight, bias, initial_states)
    if grad and x.numel() >= _TRAIN_KERNELS_MIN_NUMEL and width <= _TRAIN_KERNELS_MAX_WIDTH:
        out = _packed_kernel(x, weight, bias, None, initial_states, act == "silu")
    elif width >= _WIDE_MIN_WIDTH:
        out = _wide_kernel(x, weight, bias, initial_states, act == "silu")
    else:
        out = None
    if out is not None:
        return (out, _final_states(x, initial_states, width - 1)) if return_final_states \
            else out
    taps = weight.unsqueeze(1)
    if initial_states is None:
        out = conv1d(x, taps, bias, padding=((width - 1, 0),), groups=dim, activation=act,
                     precision=precision)
    else:
        out = conv1d(torch.cat([initial_states, x], dim=-1), taps, bias, groups=dim,
                     activation=act, precision=precision)
    if not return_final_states:
        return out
    return out, _final_states(x, initial_states, width - 1)


def _requires_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _final_states(x, initial_states, pad: int) -> torch.Tensor:
    """The last ``pad`` inputs of each row, the initial states (zeros without them) before
    position 0."""
    if x.shape[-1] >= pad:
        return x[..., x.shape[-1] - pad:].contiguous()
    start = x.new_zeros(*x.shape[:2], pad) if initial_states is None else initial_states
    return torch.cat([start, x], dim=-1)[..., -pad:].contiguous()


def _packed(x, weight, bias, seq_idx, initial_states, return_final_states: bool, act: str):
    """The packed-sequence route: tap k of position t reads position t − (width − 1) + k
    only where it has t's ``seq_idx`` (positions before 0 have position 0's): the kernels
    (:func:`_packed_kernel`) where they run, else :func:`_packed_torch`."""
    out = _packed_kernel(x, weight, bias, seq_idx, initial_states, act == "silu")
    if out is None:
        return _packed_torch(x, weight, bias, seq_idx, initial_states, return_final_states,
                             act)
    if not return_final_states:
        return out
    return out, _packed_final_states(x, seq_idx, initial_states, weight.shape[1] - 1)


def _packed_final_states(x, seq_idx, initial_states, pad: int) -> torch.Tensor:
    """The last ``pad`` inputs of each row (the initial states fill a row shorter than
    that), zero where they are not in the row's last sequence."""
    ids = seq_idx[:, -pad:]
    if ids.shape[-1] < pad:  # a row shorter than the state: the start (position 0's id)
        ids = torch.cat([seq_idx[:, :1].expand(-1, pad), seq_idx], dim=-1)[:, -pad:]
    return torch.where((ids == seq_idx[:, -1:]).unsqueeze(1),
                       _final_states(x, initial_states, pad), 0)


def _packed_torch(x, weight, bias, seq_idx, initial_states, return_final_states: bool,
                  act: str):
    """:func:`_packed` in torch operations, one masked multiply-add pass per tap."""
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    pad = width - 1
    start = x.new_zeros(batch, dim, pad) if initial_states is None else initial_states
    full = torch.cat([start, x], dim=-1)
    ids = torch.cat([seq_idx[:, :1].expand(batch, pad), seq_idx], dim=-1)
    acc_type = _acc(x.dtype)
    acc = torch.zeros(batch, dim, seqlen, device=x.device, dtype=acc_type)
    for k in range(width):
        same = (ids[:, k:k + seqlen] == seq_idx).unsqueeze(1)
        acc = acc + torch.where(same, full[..., k:k + seqlen], 0).to(acc_type) \
            * weight[:, k:k + 1].to(acc_type)
    if bias is not None:
        acc = acc + bias.to(acc_type).unsqueeze(-1)
    out = (F.silu(acc) if act == "silu" else acc).to(x.dtype)
    if not return_final_states:
        return out
    return out, _packed_final_states(x, seq_idx, initial_states, pad)


#: kernel family ("packed": packed.py's, "wide": toeplitz.py's) -> why it failed in this
#: process (then the other routes run: one family's failure leaves the other's in use)
_KERNEL_FAILED: dict[str, str] = {}
#: what runs instead of a family that failed
_INSTEAD = {"packed": "torch operations with seq_idx, and fastconv.conv1d for training "
                      "without it",
            "wide": "fastconv.conv1d for widths from 32"}


def _packed_kernel(x, weight, bias, seq_idx, initial_states, silu: bool):
    """The output by backends/triton/packed.py's kernels (with autograd: their backward;
    ``seq_idx`` may be None), or None where they do not run: torch.compile's tracing, a
    device Triton's kernels do not run on, or kernels that failed here before (said once in
    a warning; the other routes' result is the same)."""
    if x.device.type != _kernel_device() or torch.compiler.is_compiling() \
            or "packed" in _KERNEL_FAILED:
        return None
    try:
        if _requires_grad(x, weight, bias, initial_states):
            return _PackedFunction.apply(x, weight, bias, initial_states, seq_idx, silu)
        from .backends.triton.packed import packed_forward

        return packed_forward(x, seq_idx, initial_states, weight, bias, silu)
    except Exception as exc:  # (not a user error: the arguments were checked)
        _kernel_failed("packed", exc)
        return None


def _wide_kernel(x, weight, bias, initial_states, silu: bool):
    """The output by backends/triton/toeplitz.py's kernels (with autograd: their backward),
    or None where they do not run: torch.compile's tracing, a device Triton's kernels do
    not run on, data other than 16-bit floats on a GPU, x not seqlen-contiguous, more than
    65,535 channels or rows, or a kernel that failed here before."""
    if x.device.type != _kernel_device() or torch.compiler.is_compiling() \
            or "wide" in _KERNEL_FAILED or x.stride(2) != 1 or max(x.shape[:2]) > 65535 \
            or (x.dtype not in (torch.float16, torch.bfloat16) and x.device.type != "cpu"):
        return None
    try:
        if _requires_grad(x, weight, bias, initial_states):
            return _WideFunction.apply(x, weight, bias, initial_states, silu)
        from .backends.triton.toeplitz import toeplitz_forward

        return toeplitz_forward(x, weight, bias, initial_states, silu)
    except Exception as exc:  # (not a user error: the arguments were checked)
        _kernel_failed("wide", exc)
        return None


def _kernel_failed(family: str, exc: Exception) -> None:
    _KERNEL_FAILED[family] = f"{type(exc).__name__}: {str(exc)[:200]}"
    warnings.warn(f"fastconv: the sequence-convolution kernels ({family}) failed "
                  f"({_KERNEL_FAILED[family]}); causal_conv1d runs {_INSTEAD[family]} in "
                  f"this process", RuntimeWarning, stacklevel=4)


class _PackedFunction(torch.autograd.Function):
    """The packed kernels with their backward: the forward saves its inputs (no output);
    the backward is one pass for the pre-activation's gradient where SiLU was applied (the
    pre-activation recomputed in it, float32), one for the input gradients and one for the
    weight's."""

    @staticmethod
    def forward(ctx, x, weight, bias, initial_states, seq_idx, silu):
        from .backends.triton.packed import packed_forward

        ctx.save_for_backward(x, weight, bias, initial_states, seq_idx)
        ctx.silu = silu
        return packed_forward(x, seq_idx, initial_states, weight, bias, silu)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        from .backends.triton.packed import packed_backward, silu_grad

        x, weight, bias, initial_states, seq_idx = ctx.saved_tensors
        needs = ctx.needs_input_grad
        try:
            g = silu_grad(dy, x, seq_idx, initial_states, weight, bias) if ctx.silu else dy
            dx, dh, dw = packed_backward(g, x, seq_idx, initial_states, weight, needs[3])
            db = g.sum((0, 2), dtype=_acc(x.dtype)).to(bias.dtype) \
                if bias is not None and needs[2] else None
            grads = [dx, dw, db, dh]
        except Exception as exc:  # the torch route's gradients (see _packed_kernel)
            _kernel_failed("packed", exc)
            grads = _torch_grads(ctx, dy, seq_idx)
        return (*[g if need else None for g, need in zip(grads, needs)], None, None)


def _torch_grads(ctx, dy, seq_idx) -> list:
    """The gradients of x, weight, bias and the initial states (None where not asked) by
    autograd through :func:`_packed_torch`: a kernel's backward that failed."""
    x, weight, bias, initial_states = ctx.saved_tensors[:4]
    inputs = [t.detach().requires_grad_() if t is not None and need else None
              for t, need in zip((x, weight, bias, initial_states), ctx.needs_input_grad)]
    given = [t if t is not None else s for t, s in
             zip(inputs, (x, weight, bias, initial_states))]
    if seq_idx is None:  # (no packing: one sequence per row)
        seq_idx = x.new_zeros(x.shape[0], x.shape[2], dtype=torch.int32)
    with torch.enable_grad():
        out = _packed_torch(*given[:3], seq_idx, given[3], False,
                            "silu" if ctx.silu else "none")
    wanted = [t for t in inputs if t is not None]
    found = iter(torch.autograd.grad(out, wanted, dy))
    return [next(found) if t is not None else None for t in inputs]


class _WideFunction(torch.autograd.Function):
    """The wide-filter kernel with its backward (backends/triton/toeplitz.py): dy · SiLU'
    where SiLU was applied (the pre-activation recomputed), then the input gradient, the
    weight's and the initial states', each a pass of tensor-core products."""

    @staticmethod
    def forward(ctx, x, weight, bias, initial_states, silu):
        from .backends.triton.toeplitz import toeplitz_forward

        ctx.save_for_backward(x, weight, bias, initial_states)
        ctx.silu = silu
        return toeplitz_forward(x, weight, bias, initial_states, silu)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        from .backends.triton.toeplitz import silu_grad, toeplitz_backward

        x, weight, bias, initial_states = ctx.saved_tensors
        needs = ctx.needs_input_grad
        try:
            g = silu_grad(dy, x, weight, bias, initial_states) if ctx.silu else dy.to(x.dtype)
            dx, dw, dh = toeplitz_backward(g, x, weight, initial_states,
                                           (needs[0], needs[1], needs[3]))
            db = g.sum((0, 2), dtype=_acc(x.dtype)).to(bias.dtype) \
                if bias is not None and needs[2] else None
            grads = [dx, dw, db, dh]
        except Exception as exc:  # the torch route's gradients
            _kernel_failed("wide", exc)
            grads = _torch_grads(ctx, dy, None)
        return (*[g if need else None for g, need in zip(grads, needs)], None)


def causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None = None, activation: str | None = None,
                         cache_seqlens: torch.Tensor | None = None,
                         conv_state_indices: torch.Tensor | None = None) -> torch.Tensor:
    """One decode step of :func:`causal_conv1d`: ``x`` is ``(batch, dim)`` (one token) or
    ``(batch, dim, seqlen)`` (several, e.g. speculative decoding); ``conv_state`` is
    ``(batch, dim, state_len)`` with ``state_len ≥ width − 1``, the latest inputs, updated
    in place.

    ``cache_seqlens`` (``(batch,)`` int32): ``conv_state`` is a circular buffer and the new
    tokens are written from index ``cache_seqlens % state_len``. ``conv_state_indices``
    (``(batch,)`` int32): the rows of a larger state pool ``(pool, dim, state_len)`` that
    hold this batch's states (continuous batching; the indices are not checked on the host,
    so that the step captures in a CUDA graph). Returns the output, x's shape and dtype:
    autocast casts nothing here (the state is updated in place, in its own dtype; weight and
    bias may have another floating dtype), as in causal-conv1d's update.
    """
    if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3):
        raise ConvError(f"x: got {_described(x)}; expected (batch, dim) or "
                        f"(batch, dim, seqlen)")
    one = x.dim() == 2
    x3 = x.unsqueeze(-1) if one else x
    _check_x(x3)
    batch, dim, seqlen = x3.shape
    width = _check_weight(weight, dim, x3)
    _check_bias(bias, dim, x3)
    act = _activation(activation)
    _check_conv_state(conv_state, x3, width, conv_state_indices)
    if seqlen == 1 and cache_seqlens is None and _decode_kernel_runs(x, weight, bias):
        from .backends.triton.decode import decode_step

        out = decode_step(x3[..., 0], conv_state, weight, bias, act == "silu",
                          conv_state_indices)
        return out if one else out.unsqueeze(-1)
    state_len = conv_state.shape[-1]
    rows = conv_state if conv_state_indices is None else conv_state.index_select(
        0, conv_state_indices.long())
    if cache_seqlens is None:
        window = torch.cat([rows[..., state_len - (width - 1):], x3.to(rows.dtype)], dim=-1)
        new = torch.cat([rows, x3.to(rows.dtype)], dim=-1)[..., -state_len:]
    else:
        _check_tensor(cache_seqlens, "cache_seqlens", "(batch,)", (batch,), torch.int32,
                      x.device)
        lengths = cache_seqlens.long().unsqueeze(1)
        back = torch.arange(-(width - 1), 0, device=x.device).unsqueeze(0) + lengths
        past = rows.gather(2, back.remainder(state_len).unsqueeze(1).expand(-1, dim, -1))
        window = torch.cat([past, x3.to(rows.dtype)], dim=-1)
        ahead = torch.arange(seqlen, device=x.device).unsqueeze(0) + lengths
        new = rows.scatter(2, ahead.remainder(state_len).unsqueeze(1).expand(-1, dim, -1),
                           x3.to(rows.dtype))
    with torch.no_grad():
        if conv_state_indices is None:
            conv_state.copy_(new)
        else:
            conv_state.index_copy_(0, conv_state_indices.long(), new)
    acc_type = _acc(x.dtype)
    acc = F.conv1d(window.to(acc_type), weight.to(acc_type).unsqueeze(1),
                   None if bias is None else bias.to(acc_type), groups=dim)
    out = (F.silu(acc) if act == "silu" else acc).to(x.dtype)
    return out.squeeze(-1) if one else out


@functools.lru_cache(maxsize=1)
def _kernel_device() -> str | None:
    """The device type whose tensors Triton kernels run on in this process: "cuda", "cpu"
    under Triton's interpreter, None without Triton (asked once: the question costs ~0.1 ms,
    as much as the decode step itself)."""
    from . import backends

    if not backends.get("triton").available()[0]:
        return None
    from .backends.triton.launch import INTERPRETED

    return "cpu" if INTERPRETED else "cuda"


def _decode_kernel_runs(x, weight, bias) -> bool:
    """Whether a one-token step runs the Triton decode kernel: on a GPU (or a CPU tensor
    under Triton's interpreter), outside torch.compile's tracing, and without autograd (the
    step has no backward; torch's operations keep one where it is asked for)."""
    if x.device.type != _kernel_device() or torch.compiler.is_compiling():
        return False
    return not (torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias)))


def _check_conv_state(conv_state, x3, width: int, indices) -> None:
    batch, dim, _ = x3.shape
    if not isinstance(conv_state, torch.Tensor) or conv_state.dim() != 3 \
            or conv_state.shape[1] != dim or conv_state.shape[2] < width - 1:
        raise ConvError(f"conv_state: got {_described(conv_state)}; expected (batch, {dim}, "
                        f"state_len) with state_len >= width - 1 = {width - 1}")
    if conv_state.device != x3.device:
        raise ConvError(f"conv_state: on {conv_state.device}; expected x's {x3.device}")
    if indices is None:
        if conv_state.shape[0] != batch:
            raise ConvError(f"conv_state: {conv_state.shape[0]} rows for a batch of {batch}; "
                            f"give conv_state_indices to select rows of a larger pool")
    else:
        _check_tensor(indices, "conv_state_indices", "(batch,)", (batch,), torch.int32,
                      x3.device)


def long_conv1d(x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """Long causal depthwise convolution (Hyena's implicit filters):
    ``out[:, d, t] = bias[d] + Σ_{j=0..t} weight[d, j] · x[:, d, t − j]`` (``weight[:, 0]``
    multiplies the current position, the FFT convention), for a filter as long as the
    sequence.

    ``x`` is ``(batch, dim, seqlen)``, ``weight`` ``(dim, K)`` with ``1 ≤ K ≤ seqlen``. Short
    filters run as a direct convolution (:func:`fastconv.conv1d`), long ones through real
    FFTs of a length with factors 2, 3, 5 and 7 only, at least ``seqlen + K − 1`` (no power
    of two padding), in float32 (float64 for float64 inputs). On a GPU the first call of each shape
    times both and keeps the faster (``LONG_CONV_CHOICES``); elsewhere, and while
    compiling, filters longer than ``DIRECT_MAX_K`` take the FFT. Differentiable in x,
    weight and bias.
    """
    _check_x(x)
    x = _readable(x)
    batch, dim, seqlen = x.shape
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] != dim \
            or not 1 <= weight.shape[1] <= seqlen:
        raise ConvError(f"weight: got {_described(weight)}; expected (dim, K) with dim = {dim} "
                        f"and 1 <= K <= seqlen = {seqlen}")
    if weight.device != x.device:
        raise ConvError(f"weight: on {weight.device}, x on {x.device}; expected one device")
    _check_bias(bias, dim, x)
    key = (tuple(x.shape), weight.shape[1], x.dtype, x.device.type)
    route = LONG_CONV_CHOICES.get(key)
    if route is None:
        route = _choose_route(x, weight, bias, key)
    return _ROUTES[route](x, weight, bias)


#: filters up to this length take the direct convolution where nothing was timed
DIRECT_MAX_K = 64
#: filters longer than this take the FFT untimed (a direct pass costs K multiply-adds per
#: output: at K = seqlen = 64K, seconds per call, and the timing makes ~60 calls)
TIMED_MAX_K = 1024
#: (x shape, K, dtype, device type) -> "direct" or "fft", measured on the GPU
LONG_CONV_CHOICES: dict[tuple, str] = {}


def _direct(x, weight, bias):
    k = weight.shape[1]
    return conv1d(x, weight.flip(-1).unsqueeze(1), bias, padding=((k - 1, 0),),
                  groups=x.shape[1])


def fft_length(n: int) -> int:
    """The least integer ≥ n whose prime factors are 2, 3, 5 and 7 (fast FFT sizes)."""
    best = 1 << (max(n, 1) - 1).bit_length()
    f7 = 1
    while f7 < best:
        f5 = f7
        while f5 < best:
            f3 = f5
            while f3 < best:
                f2 = f3
                while f2 < n:
                    f2 *= 2
                best = min(best, f2)
                f3 *= 3
            f5 *= 5
        f7 *= 7
    return best


def _fft(x, weight, bias):
    seqlen = x.shape[-1]
    n = fft_length(seqlen + weight.shape[1] - 1)
    acc_type = _acc(x.dtype)
    spectrum = torch.fft.rfft(x.to(acc_type), n=n) * torch.fft.rfft(weight.to(acc_type), n=n)
    out = torch.fft.irfft(spectrum, n=n)[..., :seqlen]
    if bias is not None:
        out = out + bias.to(acc_type).unsqueeze(-1)
    return out.to(x.dtype)


_ROUTES = {"direct": _direct, "fft": _fft}


def _choose_route(x, weight, bias, key) -> str:
    guess = "direct" if weight.shape[1] <= DIRECT_MAX_K else "fft"
    if x.device.type != "cuda" or weight.shape[1] > TIMED_MAX_K \
            or torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
        return guess
    from .costs import time_costs

    with torch.no_grad():
        times = {name: sum(time_costs(lambda f=f: f(x, weight, bias)))
                 for name, f in _ROUTES.items()}
    LONG_CONV_CHOICES[key] = min(times, key=times.get)
    return LONG_CONV_CHOICES[key]
