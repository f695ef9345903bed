"""The causal depthwise conv1d of Mamba-style blocks, with states and packed sequences:
``causal_conv1d`` takes causal-conv1d's arguments and follows its convention (``F.conv1d``
with ``width - 1`` zeros on the left: ``weight[:, -1]`` multiplies the current position), so
that a model switches by changing an import. Its decode step is ``decode.py``'s, the long
convolutions of Hyena ``longconv.py``'s.

Routes without ``seq_idx``: widths up to 17 (16-bit or float32, either layout) run the
forward kernel of ``backends/triton/shortconv.py`` where no gradient is wanted; where one
is and the problem is large (``_TRAIN_KERNELS_MIN_NUMEL``), shortconv.py's forward and
backward (widths up to 17, either layout; x dim-contiguous: shortrows.py's backward, and its
forward at widths 10-17), past width 17 the tensor-core kernels of
``backends/triton/toeplitz.py`` (``backends/triton/packed.py``'s up to
``_TRAIN_KERNELS_MAX_WIDTH`` where those do not run: float64, float32 on a GPU); these also from
``_WIDE_MIN_WIDTH``'s width (16-bit; x dim-contiguous through a seqlen-contiguous copy);
everything else, and wherever those kernels do not run, :func:`fastconv.conv1d` (dispatch
picks the Triton depthwise kernel or torch's; initial states are prepended to the input).
With ``seq_idx`` each tap is masked where it would reach into another sequence (on a GPU
shortconv.py's kernels for widths up to 17 in 16-bit or float32, packed.py's otherwise;
torch operations, one pass per tap, under torch.compile's tracing and where Triton does not
run). Everything has autograd, with a deterministic backward (weight gradients summed in a
fixed order), and captures in a CUDA graph. While torch.compile traces, shortconv.py's
kernels run as custom ops (``seq_ops.py``) wherever eager calls run them; the other routes
trace as torch's operations.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from . import seq_ops
from .devices import elsewhere
from .errors import ConvError
from .functional import _autocast, conv1d
from .precision import parse
from .seqargs import (
    SHORT_MAX_WIDTH,
    accumulate_dtype,
    activation_name,
    check_bias,
    check_tensor,
    check_weight,
    check_x,
    kernel_device,
    kernels_run_on,
    readable,
    short_eligible,
)

#: where a causal conv1d without seq_idx that will be differentiated runs the training
#: kernels (not fastconv.conv1d): from this many elements for shortconv.py's widths (2-17),
#: twice as many for the others (past width 17 the Toeplitz ones, and packed.py's to
#: _TRAIN_KERNELS_MAX_WIDTH where those do not run: float64, float32 on a GPU). Measured on
#: an H200 in bf16 (benchmarks/NOTES.md, "Sequence convolutions"):
#: shortconv's eager forward + backward
#: 1.23-1.44x the conv1d route at 2^24 elements and 1.46-2.19x at 1.5·2^24, width 4, either
#: layout; below, eager steps are the host's (0.82-0.90x at 2^18-2^23, seqlen-contiguous).
#: packed.py's 1.5-3.1x from 2^25 at widths 2-16 (1.2x at width 32, none at 64), their
#: fixed ~0.5 ms per step losing below 2^24. Past shortconv.py's widths the Toeplitz
#: kernels train from 2^25 elements: packed.py's step was 1.21-1.70x torch at widths
#: 20-31, theirs 4.3-7.8x (H100, bf16, 8×4096×2048, both layouts;
#: results/seqconv/2026-12-07-host/probe-train-mid-32497b2.log)
_TRAIN_KERNELS_MIN_NUMEL, _TRAIN_KERNELS_MAX_WIDTH = 1 << 24, 32
#: from this width, a causal conv1d without seq_idx runs the tensor-core (Toeplitz) kernels
#: (forward, and backward where it will be differentiated): x seqlen-contiguous, then
#: x dim-contiguous. Seqlen-contiguous, the direct depthwise kernel beats them below 32
#: (they were 0.63x it at width 16, 1.1-2.2x at 32; H200). Dim-contiguous, the widths past
#: shortconv.py's ran aten (1.03x torch at 64: the direct kernels' build took over 10 s),
#: while the Toeplitz kernels' time barely moves with the width (flat from 4 to 64 on an
#: H200; 0.14 ms at 64 on 8×4096×2048 bf16 on an H100, plus 0.19 ms for relayout.py's two
#: passes, against torch's 1.65 ms at width 16 and 2.65 at 64)
_WIDE_MIN_WIDTH = {"seqlen": 32, "dim": SHORT_MAX_WIDTH + 1}


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


def _check_states(states, x: torch.Tensor, width: int, name: str) -> None:
    check_tensor(states, name, "(batch, dim, width - 1)", (x.shape[0], x.shape[1], width - 1),
                  x.dtype, x.device)


def _check_seq_idx(seq_idx, x: torch.Tensor) -> None:
    check_tensor(seq_idx, "seq_idx", "(batch, seqlen)", (x.shape[0], x.shape[2]), torch.int32,
                  x.device)


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  seq_idx: torch.Tensor | None = None,
                  initial_states: torch.Tensor | None = None,
                  return_final_states: bool = False, activation: str | None = None, *,
                  final_states_out: torch.Tensor | None = None, precision: str | None = None):
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
        final_states_out: optional ``(batch, dim, width − 1)`` tensor of the output's dtype,
            any strides, with ``return_final_states``: the final states are written into it
            and it is returned in their place (causal-conv1d's argument, keyword-only here:
            causal-conv1d passes it before ``activation``).
        precision: as :func:`fastconv.conv1d`'s, for the route through it (float32 data; the
            kernels' routes multiply-add in float32 whatever it says).

    Returns ``out`` (x's shape and dtype), or ``(out, final_states)``. Differentiable in x,
    weight, bias and initial_states. Under autocast, x, weight, bias and initial_states are
    cast first as for torch's convolutions (floating tensors other than float64 to
    autocast's dtype), so the output then has autocast's dtype.
    """
    device = elsewhere(x)
    if device is not None:  # (its kernels run on the current device: fastconv.devices)
        with torch.cuda.device(device):
            return causal_conv1d(x, weight, bias, seq_idx, initial_states, return_final_states,
                                 activation, final_states_out=final_states_out,
                                 precision=precision)
    check_x(x)
    x = readable(x)
    dim = x.shape[1]
    width = check_weight(weight, dim, x)
    check_bias(bias, dim, x)
    if isinstance(activation, torch.Tensor):
        raise ConvError("activation: got a tensor; causal_conv1d's seventh argument is the "
                        "activation (None, 'silu' or 'swish'): pass final_states_out by "
                        "keyword (causal-conv1d's order puts it seventh)")
    act = activation_name(activation)
    if precision is not None:
        parse(precision)
    x, weight, bias, initial_states = _in_dtypes(x, weight, bias, initial_states)
    if initial_states is not None:
        _check_states(initial_states, x, width, "initial_states")
    if final_states_out is not None:
        _check_states_out(final_states_out, x, width, return_final_states)
        out, final = _causal_conv1d(x, weight, bias, seq_idx, initial_states, True, act, width,
                                    precision)
        final_states_out.copy_(final)
        return out, final_states_out
    return _causal_conv1d(x, weight, bias, seq_idx, initial_states, return_final_states, act,
                          width, precision)


def _check_states_out(final_states_out, x: torch.Tensor, width: int,
                      return_final_states: bool) -> None:
    if not return_final_states:
        raise ConvError("final_states_out: given with return_final_states=False; it is "
                        "written only where the final states are returned")
    _check_states(final_states_out, x, width, "final_states_out")
    if final_states_out.requires_grad and final_states_out.is_leaf:
        raise ConvError("final_states_out: a leaf tensor that requires grad; the final "
                        "states are written into it in place")


def _causal_conv1d(x, weight, bias, seq_idx, initial_states, return_final_states: bool,
                   act: str, width: int, precision: str | None):
    """:func:`causal_conv1d` of checked operands in their computing dtypes."""
    dim = x.shape[1]
    if seq_idx is not None:
        _check_seq_idx(seq_idx, x)
        return _packed(x, weight, bias, seq_idx, initial_states, return_final_states, act)
    grad = _requires_grad(x, weight, bias, initial_states)
    least = _TRAIN_KERNELS_MIN_NUMEL << (0 if short_eligible(x, width) else 1)
    large = grad and x.numel() >= least
    wide = width >= _WIDE_MIN_WIDTH["seqlen" if x.stride(2) == 1 else "dim"] \
        or (large and width > SHORT_MAX_WIDTH)
    out = _wide_kernel(x, weight, bias, initial_states, act == "silu") if wide else None
    if out is None and large and width <= _TRAIN_KERNELS_MAX_WIDTH:
        out = _packed_kernel(x, weight, bias, None, initial_states, act == "silu")
    elif out is None and not grad and not wide:
        out = _short_kernel(x, weight, bias, initial_states, act == "silu")
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
    width = weight.shape[1]
    full, same = _windows(x, initial_states, seq_idx, width - 1)
    acc_type = accumulate_dtype(x.dtype)
    acc = torch.zeros(x.shape, device=x.device, dtype=acc_type)
    for k in range(width):
        acc = acc + torch.where(same(k), full[..., k:k + x.shape[2]], 0).to(acc_type) \
            * weight[:, k:k + 1].to(acc_type)
    if bias is not None:
        acc = acc + bias.to(acc_type).unsqueeze(-1)
    out = (F.silu(acc) if act == "silu" else acc).to(x.dtype)
    if not return_final_states:
        return out
    return out, _packed_final_states(x, seq_idx, initial_states, width - 1)


def _windows(x, initial_states, seq_idx, pad: int) -> tuple:
    """(``full``: x with the initial states, zeros without them, in the ``pad`` positions
    before 0; ``same(k)``: (batch, 1, seqlen), where tap k of each position reads
    ``full[..., k + t]`` of its own sequence, positions before 0 having position 0's)."""
    batch, dim, seqlen = x.shape
    start = x.new_zeros(batch, dim, pad) if initial_states is None else initial_states
    full = torch.cat([start, x], dim=-1)
    ids = torch.cat([seq_idx[:, :1].expand(batch, pad), seq_idx], dim=-1)
    return full, lambda k: (ids[:, k:k + seqlen] == seq_idx).unsqueeze(1)


#: kernel family ("packed": packed.py's, "short": shortconv.py's, "wide": toeplitz.py's) ->
#: why it failed in this process (then the other routes run: one family's failure leaves
#: the others in use)
_KERNEL_FAILED: dict[str, str] = {}
#: what runs instead of a family that failed
_INSTEAD = {"packed": "torch operations with seq_idx, and fastconv.conv1d for training "
                      "without it",
            "short": "packed.py's kernels for training and packed sequences, and "
                     "fastconv.conv1d without autograd, for widths up to 17",
            "wide": "fastconv.conv1d for widths from 32"}


def _by_family(family: str, x: torch.Tensor, run):
    """``run()``: a call of one kernel family's kernels, or None where they do not run:
    torch.compile's tracing, a device Triton's kernels do not run on, or kernels of the
    family that failed here before (a failure is said once in a warning; the other
    routes' result is the same)."""
    if torch.compiler.is_compiling() or x.device.type != kernel_device() \
            or family in _KERNEL_FAILED:
        return None
    try:
        return run()
    except Exception as exc:  # (not a user error: the arguments were checked)
        _kernel_failed(family, exc, stacklevel=5)
        return None


def _packed_kernel(x, weight, bias, seq_idx, initial_states, silu: bool):
    """The output by the kernels of :class:`_PackedFunction` (with autograd: their
    backward; ``seq_idx`` may be None), without autograd shortconv.py's forward where it
    runs, else packed.py's, or None where they do not run (:func:`_by_family`); while
    torch.compile traces, shortconv.py's as a custom op (:func:`_traced_short`)."""
    if torch.compiler.is_compiling():
        return _traced_short(x, weight, bias, seq_idx, initial_states, silu)

    def run():
        if _requires_grad(x, weight, bias, initial_states):
            return _PackedFunction.apply(x, weight, bias, initial_states, seq_idx, silu)
        from .backends.triton import shortconv
        from .backends.triton.packed import packed_forward

        if short_eligible(x, weight.shape[1]):
            out = _by_family("short", x, lambda: shortconv.short_forward(
                x, initial_states, weight, bias, silu, seq_idx))
            if out is not None:
                return out
        return packed_forward(x, seq_idx, initial_states, weight, bias, silu)
    return _by_family("packed", x, run)


def _short_kernel(x, weight, bias, initial_states, silu: bool):
    """The output without autograd by backends/triton/shortconv.py's forward kernel, either
    layout (on an H100, bf16, eager calls, seqlen-contiguous: 90-97 % of the byte floor at
    widths 2-8, where fastconv.conv1d's route measured 70-79 %; on an H200, width 4,
    dim-contiguous views of a projection's half: 1.20-9.45x that route eager, 1.05-9.45x in
    CUDA graphs; widths 10-17 not yet measured), or None where it does not run: a filter
    wider than it takes or float64 data, and as :func:`_by_family` says (its own family,
    "short"); while torch.compile traces, the same kernel as a custom op
    (:func:`_traced_short`)."""
    if not short_eligible(x, weight.shape[1]):
        return None
    if torch.compiler.is_compiling():
        return _traced_short(x, weight, bias, None, initial_states, silu)

    def run():
        from .backends.triton import shortconv

        return shortconv.short_forward(x, initial_states, weight, bias, silu)
    return _by_family("short", x, run)


def _traced_short(x, weight, bias, seq_idx, initial_states, silu: bool):
    """While torch.compile traces: shortconv.py's kernels as one custom op with its autograd
    (``seq_ops.short_conv``: an opaque node whose forward and backward are the kernels, run
    by :func:`short_conv_run` and :func:`short_conv_grads`), or None where they do not run
    (a filter wider than they take, float64, a device Triton's kernels do not run on)."""
    if not short_eligible(x, weight.shape[1]) or not kernels_run_on(x.device.type):
        return None
    return seq_ops.short_conv(x, initial_states, weight, bias, silu, seq_idx)


def short_conv_run(x, initial_states, weight, bias, silu: bool, seq_idx) -> torch.Tensor:
    """``seq_ops.short_conv``'s implementation: shortconv.py's forward, or where it does not
    run (:func:`_by_family`: its family failed in this process, or fails now) the torch
    route's output (:func:`_packed_torch`), in the layout the op promises (x's)."""
    from .backends.triton import shortconv

    out = _by_family("short", x, lambda: shortconv.short_forward(
        x, initial_states, weight, bias, silu, seq_idx))
    if out is not None:
        return out
    out = _packed_torch(x, weight, bias, _one_sequence(x) if seq_idx is None else seq_idx,
                        initial_states, False, "silu" if silu else "none")
    return torch.empty_like(x).copy_(out)


def short_conv_grads(dy, x, initial_states, weight, bias, silu: bool, init_grad: bool,
                     seq_idx) -> list:
    """``seq_ops.short_conv_backward``'s implementation: ``[dx, d weight]``, then ``d bias``
    where there is a bias and ``d initial_states`` where ``init_grad``, by shortconv.py's
    backward, or the torch route's (as :func:`short_conv_run`); each contiguous, dx in
    x's layout, as the op promises."""
    from .backends.triton import shortconv

    found = _by_family("short", x, lambda: shortconv.short_backward(
        dy, x, initial_states, weight, bias, silu, init_grad, seq_idx))
    if found is not None:
        dx, dh, dw, db = found
    else:
        dx, dw, db, dh = _torch_grads((x, weight, bias, initial_states),
                                      (True, True, bias is not None, init_grad), dy, seq_idx,
                                      silu)
        dx = torch.empty_like(x).copy_(dx)
    return [dx, dw.contiguous()] + ([db.contiguous()] if bias is not None else []) \
        + ([dh.contiguous()] if init_grad else [])


def _wide_kernel(x, weight, bias, initial_states, silu: bool):
    """The output by backends/triton/toeplitz.py's kernels (with autograd: their backward),
    or None where they do not run: data other than 16-bit floats on a GPU, more than 65,535
    channels or rows, and as :func:`_by_family` says. They read x seqlen-contiguous: x in
    another layout (a Mamba projection's, dim-contiguous) is copied to it and the output
    copied back to dim-contiguous (:func:`_seqlen_major`)."""
    if max(x.shape[:2]) > 65535 \
            or (x.dtype not in (torch.float16, torch.bfloat16) and x.device.type != "cpu"):
        return None

    def run():
        if _requires_grad(x, weight, bias, initial_states):
            return _WideFunction.apply(x, weight, bias, initial_states, silu)
        return _toeplitz_forward(x, weight, bias, initial_states, silu)[1]
    return _by_family("wide", x, run)


def _toeplitz_forward(x, weight, bias, initial_states, silu: bool) -> tuple:
    """(x seqlen-contiguous: itself or a copy, the output in x's layout: seqlen-contiguous or
    dim-contiguous) by toeplitz.py's forward kernel."""
    from .backends.triton.relayout import relayout
    from .backends.triton.toeplitz import toeplitz_forward

    seq = _seqlen_major(x)
    out = toeplitz_forward(seq, weight, bias, initial_states, silu)
    return seq, out if seq is x else relayout(out, False)


def _seqlen_major(t: torch.Tensor) -> torch.Tensor:
    """t where it is seqlen-contiguous, else a seqlen-contiguous copy by one Triton pass
    (backends/triton/relayout.py: torch's copy of a transposed view takes 5.5x a plain
    copy's time; H100, results/seqconv/2026-12-07-host/)."""
    if t.stride(2) == 1:
        return t
    from .backends.triton.relayout import relayout

    return relayout(t, True)


def _kernel_failed(family: str, exc: Exception, stacklevel: int = 4) -> None:
    _KERNEL_FAILED[family] = f"{type(exc).__name__}: {str(exc)[:200]}"
    warnings.warn(f"fastconv: the sequence-convolution kernels ({family}) failed "
                  f"({_KERNEL_FAILED[family]}); causal_conv1d runs {_INSTEAD[family]} in "
                  f"this process", RuntimeWarning, stacklevel=stacklevel)


class _PackedFunction(torch.autograd.Function):
    """The packed kernels with their backward: the forward saves its inputs (no output).
    Short filters (16-bit or float32, with or without seq_idx) run shortconv.py's kernels
    (one pass each way; where one fails, its family "short" is set aside and packed.py's
    answer);
    otherwise the backward is one pass for the pre-activation's gradient where SiLU was
    applied (the pre-activation recomputed in it, float32), one for the input gradients and
    one for the weight's."""

    @staticmethod
    def forward(ctx, x, weight, bias, initial_states, seq_idx, silu):
        from .backends.triton import shortconv
        from .backends.triton.packed import packed_forward

        ctx.save_for_backward(x, weight, bias, initial_states, seq_idx)
        ctx.silu = silu
        ctx.short = "short" not in _KERNEL_FAILED and short_eligible(x, weight.shape[1])
        if ctx.short:
            try:
                return shortconv.short_forward(x, initial_states, weight, bias, silu, seq_idx)
            except Exception as exc:  # (packed.py's kernels answer)
                _kernel_failed("short", exc)
                ctx.short = False
        return packed_forward(x, seq_idx, initial_states, weight, bias, silu)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        from .backends.triton.packed import packed_backward, silu_grad
        from .backends.triton.shortconv import short_backward

        x, weight, bias, initial_states, seq_idx = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grads = None
        if ctx.short and "short" not in _KERNEL_FAILED:
            try:
                dx, dh, dw, db = short_backward(dy, x, initial_states, weight, bias, ctx.silu,
                                                needs[3], seq_idx)
                grads = [dx, dw, db, dh]
            except Exception as exc:  # (packed.py's kernels answer)
                _kernel_failed("short", exc)
        if grads is None:
            try:
                g = silu_grad(dy, x, seq_idx, initial_states, weight, bias) if ctx.silu \
                    else dy
                dx, dh, dw = packed_backward(g, x, seq_idx, initial_states, weight, needs[3])
                db = g.sum((0, 2), dtype=accumulate_dtype(x.dtype)).to(bias.dtype) \
                    if bias is not None and needs[2] else None
                grads = [dx, dw, db, dh]
            except Exception as exc:  # the torch route's gradients (see _packed_kernel)
                _kernel_failed("packed", exc)
                grads = _torch_grads(ctx.saved_tensors[:4], needs, dy, seq_idx, ctx.silu)
        return (*[g if need else None for g, need in zip(grads, needs)], None, None)


def _one_sequence(x) -> torch.Tensor:
    """The seq_idx of rows that are one sequence each."""
    return x.new_zeros(x.shape[0], x.shape[2], dtype=torch.int32)


def _torch_grads(saved, needs, dy, seq_idx, silu: bool) -> list:
    """The gradients of x, weight, bias and the initial states (``saved``; None where
    ``needs`` does not ask) of :func:`_packed_torch`, written out in torch operations (not
    by autograd, which custom ops' implementations run below): a kernel's backward that
    failed. One masked pass per tap for the pre-activation (where SiLU was applied), one
    for the gradients."""
    x, weight, bias, initial_states = saved
    seqlen, width = x.shape[2], weight.shape[1]
    acc_type = accumulate_dtype(x.dtype)
    full, same = _windows(x, initial_states, _one_sequence(x) if seq_idx is None else seq_idx,
                          width - 1)
    full = full.to(acc_type)
    w = weight.to(acc_type)
    g = dy.to(acc_type)
    if silu:
        z = torch.zeros_like(g) if bias is None else bias.to(acc_type).unsqueeze(-1)
        for k in range(width):
            z = z + torch.where(same(k), full[..., k:k + seqlen], 0) * w[:, k:k + 1]
        sig = torch.sigmoid(z)
        g = g * sig * (1 + z * (1 - sig))
    dfull = torch.zeros_like(full)
    dw = full.new_empty(weight.shape)
    for k in range(width):
        g_k = torch.where(same(k), g, 0)  # (a tap into another sequence gets nothing)
        dfull[..., k:k + seqlen] += g_k * w[:, k:k + 1]
        dw[:, k] = (full[..., k:k + seqlen] * g_k).sum((0, 2))
    grads = [dfull[..., width - 1:].to(x.dtype), dw.to(weight.dtype),
             g.sum((0, 2)).to(bias.dtype) if bias is not None else None,
             dfull[..., :width - 1].to(x.dtype) if initial_states is not None else None]
    return [t if need else None for t, need in zip(grads, needs)]


class _WideFunction(torch.autograd.Function):
    """The wide-filter kernel with its backward (backends/triton/toeplitz.py): dy · SiLU'
    where SiLU was applied (the pre-activation recomputed), then the input gradient, the
    weight's and the initial states', each a pass of tensor-core products."""

    @staticmethod
    def forward(ctx, x, weight, bias, initial_states, silu):
        seq, out = _toeplitz_forward(x, weight, bias, initial_states, silu)
        ctx.save_for_backward(seq, weight, bias, initial_states)
        ctx.silu = silu
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        from .backends.triton.toeplitz import silu_grad, toeplitz_backward

        x, weight, bias, initial_states = ctx.saved_tensors
        needs = ctx.needs_input_grad
        try:
            dy = _seqlen_major(dy)  # (dx comes seqlen-contiguous whatever x's layout)
            g = silu_grad(dy, x, weight, bias, initial_states) if ctx.silu else dy.to(x.dtype)
            dx, dw, dh = toeplitz_backward(g, x, weight, initial_states,
                                           (needs[0], needs[1], needs[3]))
            db = g.sum((0, 2), dtype=accumulate_dtype(x.dtype)).to(bias.dtype) \
                if bias is not None and needs[2] else None
            grads = [dx, dw, db, dh]
        except Exception as exc:  # the torch route's gradients
            _kernel_failed("wide", exc)
            grads = _torch_grads(ctx.saved_tensors, needs, dy, None, ctx.silu)
        return (*[g if need else None for g, need in zip(grads, needs)], None)


seq_ops.implement(short_conv_run, short_conv_grads)
