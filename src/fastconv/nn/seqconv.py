"""``CausalConv1d``: the causal depthwise conv1d of a Mamba-style block as a module, with a
decode step."""

from __future__ import annotations

import math

import torch

from ..decode import causal_conv1d_update
from ..errors import ConvError
from ..seqargs import MAX_WIDTH, MIN_WIDTH
from ..seqconv import causal_conv1d


class CausalConv1d(torch.nn.Module):
    """``out = act(causal depthwise conv1d of x)`` over ``(batch, dim, seqlen)`` inputs
    (:func:`fastconv.causal_conv1d`); ``weight`` is ``(dim, width)``, initialised as
    ``torch.nn.Conv1d(dim, dim, width, groups=dim)`` initialises its weight.

    ``forward(x, seq_idx=None, initial_states=None, return_final_states=False)`` runs a
    whole sequence (or a prefill); ``step(x, conv_state, ...)`` one decode step
    (:func:`fastconv.causal_conv1d_update`), with ``new_state(batch)`` allocating a state.
    """

    def __init__(self, dim: int, width: int, bias: bool = True,
                 activation: str | None = None, device=None, dtype=None):
        super().__init__()
        if not isinstance(dim, int) or dim < 1:
            raise ConvError(f"dim: got {dim!r}; expected a positive int")
        if not isinstance(width, int) or not MIN_WIDTH <= width <= MAX_WIDTH:
            raise ConvError(f"width: got {width!r}; allowed: {MIN_WIDTH} to {MAX_WIDTH}")
        if activation not in (None, "silu", "swish"):
            raise ConvError(f"activation: got {activation!r}; allowed: None, 'silu', 'swish'")
        self.dim, self.width, self.activation = dim, width, activation
        factory = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty(dim, width, **factory))
        self.bias = torch.nn.Parameter(torch.empty(dim, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # torch.nn.Conv1d's: kaiming_uniform(a=sqrt(5)) over fan_in = width, bias U(±1/√fan_in)
        torch.nn.init.kaiming_uniform_(self.weight.unsqueeze(1), a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.width)
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor, seq_idx: torch.Tensor | None = None,
                initial_states: torch.Tensor | None = None,
                return_final_states: bool = False):
        return causal_conv1d(x, self.weight, self.bias, seq_idx, initial_states,
                             return_final_states, self.activation)

    def step(self, x: torch.Tensor, conv_state: torch.Tensor,
             cache_seqlens: torch.Tensor | None = None,
             conv_state_indices: torch.Tensor | None = None) -> torch.Tensor:
        """One decode step: ``x`` ``(batch, dim)`` or ``(batch, dim, seqlen)``;
        ``conv_state`` is updated in place."""
        return causal_conv1d_update(x, conv_state, self.weight, self.bias, self.activation,
                                    cache_seqlens, conv_state_indices)

    def new_state(self, batch: int, state_len: int | None = None) -> torch.Tensor:
        """A zero decode state ``(batch, dim, state_len)`` (default ``width − 1``)."""
        return self.weight.new_zeros(batch, self.dim, state_len or self.width - 1)

    def extra_repr(self) -> str:
        return (f"{self.dim}, width={self.width}, bias={self.bias is not None}, "
                f"activation={self.activation!r}")
