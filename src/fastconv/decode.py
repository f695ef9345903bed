"""The decode step of :func:`fastconv.causal_conv1d` (causal-conv1d's
``causal_conv1d_update``): one token is one Triton kernel on a GPU
(``backends/triton/decode.py``: the window's dot product in float32, SiLU, the state rows
shifted in place, a state pool's rows by index); several tokens, a circular state, autograd
and torch.compile's tracing take torch operations. Neither synchronises the host: both
capture in a CUDA graph. ``causal_conv1d_varlen_states`` gives packed sequences' states
after their prefill."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .devices import elsewhere
from .errors import ConvError
from .seqargs import (
    accumulate_dtype,
    activation_name,
    check_bias,
    check_tensor,
    check_weight,
    check_x,
    described,
    kernel_device,
)


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
    hold this batch's states (continuous batching). An index outside ``[0, pool)``, such as
    causal-conv1d's pad slot −1, marks a padded entry: no state row is read or written for
    it and its output is zeros (decided on the device, not the host, so that the step
    captures in a CUDA graph). Returns the output, x's shape and dtype:
    autocast casts nothing here (the state is updated in place, in its own dtype; weight and
    bias may have another floating dtype), as in causal-conv1d's update.
    """
    device = elsewhere(x)
    if device is not None:  # (its kernel runs on the current device: fastconv.devices)
        with torch.cuda.device(device):
            return causal_conv1d_update(x, conv_state, weight, bias, activation, cache_seqlens,
                                        conv_state_indices)
    if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3):
        raise ConvError(f"x: got {described(x)}; expected (batch, dim) or "
                        f"(batch, dim, seqlen)")
    one = x.dim() == 2
    x3 = x.unsqueeze(-1) if one else x
    check_x(x3)
    batch, dim, seqlen = x3.shape
    width = check_weight(weight, dim, x3)
    check_bias(bias, dim, x3)
    act = activation_name(activation)
    _check_conv_state(conv_state, x3, width, conv_state_indices)
    if seqlen == 1 and cache_seqlens is None and _decode_kernel_runs(x, weight, bias):
        from .backends.triton.decode import decode_step

        out = decode_step(x3[..., 0], conv_state, weight, bias, act == "silu",
                          conv_state_indices)
        return out if one else out.unsqueeze(-1)
    state_len = conv_state.shape[-1]
    rows, used = conv_state, None
    if conv_state_indices is not None:
        index = conv_state_indices.long()
        used = (index >= 0) & (index < conv_state.shape[0])  # else a padded entry
        index = index.clamp(0, conv_state.shape[0] - 1)
        rows = conv_state.index_select(0, index)
    if cache_seqlens is None:
        window = torch.cat([rows[..., state_len - (width - 1):], x3.to(rows.dtype)], dim=-1)
        new = torch.cat([rows, x3.to(rows.dtype)], dim=-1)[..., -state_len:]
    else:
        check_tensor(cache_seqlens, "cache_seqlens", "(batch,)", (batch,), torch.int32,
                      x.device)
        lengths = cache_seqlens.long().unsqueeze(1)
        back = torch.arange(-(width - 1), 0, device=x.device).unsqueeze(0) + lengths
        past = rows.gather(2, back.remainder(state_len).unsqueeze(1).expand(-1, dim, -1))
        window = torch.cat([past, x3.to(rows.dtype)], dim=-1)
        ahead = torch.arange(seqlen, device=x.device).unsqueeze(0) + lengths
        new = rows.scatter(2, ahead.remainder(state_len).unsqueeze(1).expand(-1, dim, -1),
                           x3.to(rows.dtype))
    with torch.no_grad():
        if used is None:
            conv_state.copy_(new)
        else:
            conv_state.index_copy_(*_pool_writes(index, used, rows, new))
    acc_type = accumulate_dtype(x.dtype)
    acc = F.conv1d(window.to(acc_type), weight.to(acc_type).unsqueeze(1),
                   None if bias is None else bias.to(acc_type), groups=dim)
    out = (F.silu(acc) if act == "silu" else acc).to(x.dtype)
    if used is not None:
        out = torch.where(used.view(-1, 1, 1), out, 0)  # a padded entry's output: zeros
    return out.squeeze(-1) if one else out


def causal_conv1d_varlen_states(x: torch.Tensor, cu_seqlens: torch.Tensor,
                                state_len: int) -> torch.Tensor:
    """The decode states of packed sequences after their prefill (causal-conv1d's function
    of the name, as Mamba-2's variable-length inference calls it): each sequence's last
    ``state_len`` inputs, zeros before its start, ready for :func:`causal_conv1d_update`.

    Args:
        x: ``(total_tokens, dim)``, the sequences one after another (any strides: a slice
            of a wider projection's output too).
        cu_seqlens: ``(batch + 1,)`` int32 or int64 on x's device, non-decreasing from 0 to
            at most ``total_tokens``: sequence ``i`` is rows ``cu_seqlens[i]`` to
            ``cu_seqlens[i + 1] − 1``. Its values stay on the device (no host
            synchronisation: the call captures in a CUDA graph); rows it names outside x
            read as zeros.
        state_len: the states' length, ≥ 1 (usually ``width − 1`` or the state pool's).

    Returns ``(batch, dim, state_len)`` in x's dtype, dim-contiguous (causal-conv1d's
    layout): ``states[i, :, j] = x[cu_seqlens[i + 1] − state_len + j]`` where that row is
    in sequence ``i``, else 0. Torch operations: differentiable in x, and traced by
    torch.compile.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point() \
            or x.shape[1] == 0:
        raise ConvError(f"x: got {described(x)}; expected a floating (total_tokens, dim) "
                        f"tensor with dim > 0")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 \
            or cu_seqlens.numel() == 0 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ConvError(f"cu_seqlens: got {described(cu_seqlens)}; expected (batch + 1,) "
                        f"int32 or int64")
    if cu_seqlens.device != x.device:
        raise ConvError(f"cu_seqlens: on {cu_seqlens.device}; expected x's {x.device}")
    if isinstance(state_len, bool) or not isinstance(state_len, int) or state_len < 1:
        raise ConvError(f"state_len: got {state_len!r}; expected an int >= 1")
    total, dim = x.shape
    batch = cu_seqlens.numel() - 1
    ends = cu_seqlens[1:].long().unsqueeze(1)
    rows = ends - state_len + torch.arange(state_len, device=x.device)  # (batch, state_len)
    inside = (rows >= cu_seqlens[:-1].long().unsqueeze(1)) & (rows >= 0) & (rows < total)
    if total == 0:
        states = x.new_zeros(batch, state_len, dim)
    else:
        picked = x.index_select(0, rows.clamp(0, total - 1).flatten())
        states = torch.where(inside.unsqueeze(-1), picked.view(batch, state_len, dim), 0)
    return states.transpose(1, 2)


def _pool_writes(index, used, rows, new):
    """(0, rows of the pool, their new values) for ``index_copy_`` without reading the
    indices on the host: a padded entry writes what the first used entry writes, to the
    same row (no row gets two different values; with no used entry, each row its old
    value)."""
    first = torch.argmax(used.to(torch.int32)).view(1)  # 0 where none is used
    fill = torch.where(used.index_select(0, first).view(1, 1, 1), new.index_select(0, first),
                       rows.index_select(0, first))
    return (0, torch.where(used, index, index.index_select(0, first)),
            torch.where(used.view(-1, 1, 1), new, fill))


def _decode_kernel_runs(x, weight, bias) -> bool:
    """Whether a one-token step runs the Triton decode kernel: on a GPU (or a CPU tensor
    under Triton's interpreter), outside torch.compile's tracing, and without autograd (the
    step has no backward; torch's operations keep one where it is asked for)."""
    if torch.compiler.is_compiling() or x.device.type != kernel_device():
        return False
    return not (torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias)))


def _check_conv_state(conv_state, x3, width: int, indices) -> None:
    batch, dim, _ = x3.shape
    if not isinstance(conv_state, torch.Tensor) or conv_state.dim() != 3 \
            or conv_state.shape[1] != dim or conv_state.shape[2] < width - 1:
        raise ConvError(f"conv_state: got {described(conv_state)}; expected (batch, {dim}, "
                        f"state_len) with state_len >= width - 1 = {width - 1}")
    if conv_state.device != x3.device:
        raise ConvError(f"conv_state: on {conv_state.device}; expected x's {x3.device}")
    if indices is None:
        if conv_state.shape[0] != batch:
            raise ConvError(f"conv_state: {conv_state.shape[0]} rows for a batch of {batch}; "
                            f"give conv_state_indices to select rows of a larger pool")
    else:
        check_tensor(indices, "conv_state_indices", "(batch,)", (batch,), torch.int32,
                      x3.device)
