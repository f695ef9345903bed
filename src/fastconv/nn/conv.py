"""Drop-in replacements for torch.nn's convolution modules.

Each class subclasses its torch.nn counterpart, so constructor arguments and defaults,
parameter initialisation, padding modes, ``extra_repr``, state_dict keys and ``isinstance``
checks are torch's own; only the computation goes through fastconv. Two keyword-only
arguments are added: ``backend`` ("auto", "triton", "aten") and ``precision`` (None follows
torch's TF32 flag; see fastconv.conv2d).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import functional as fc

_REPR_DEFAULTS = {"backend": "auto", "precision": None}


class _FastconvMixin:
    """The fastconv-specific options shared by every module here."""

    backend: str
    precision: str | None

    def _init_fastconv(self, backend: str, precision: str | None) -> None:
        self.backend = backend
        self.precision = precision

    def extra_repr(self) -> str:
        s = super().extra_repr()
        for name, default in _REPR_DEFAULTS.items():
            value = getattr(self, name)
            if value != default:
                s += f", {name}={value!r}"
        return s

    def _padded(self, input: Tensor) -> tuple[Tensor, object]:
        """The input padded by the module's padding mode, and the padding left to the conv."""
        if self.padding_mode == "zeros":
            return input, self.padding
        return (torch.nn.functional.pad(input, self._reversed_padding_repeated_twice,
                                        mode=self.padding_mode), 0)


class Conv1d(_FastconvMixin, torch.nn.Conv1d):
    """torch.nn.Conv1d computed by :func:`fastconv.conv1d`."""

    def __init__(self, *args, backend: str = "auto", precision: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_fastconv(backend, precision)

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        input, padding = self._padded(input)
        return fc.conv1d(input, weight, bias, self.stride, padding, self.dilation, self.groups,
                         backend=self.backend, precision=self.precision)


class Conv2d(_FastconvMixin, torch.nn.Conv2d):
    """torch.nn.Conv2d computed by :func:`fastconv.conv2d`."""

    def __init__(self, *args, backend: str = "auto", precision: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_fastconv(backend, precision)

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        input, padding = self._padded(input)
        return fc.conv2d(input, weight, bias, self.stride, padding, self.dilation, self.groups,
                         backend=self.backend, precision=self.precision)


class _TransposedMixin(_FastconvMixin):
    _RANK: int
    _FN = None

    def forward(self, input: Tensor, output_size: list[int] | None = None) -> Tensor:
        if self.padding_mode != "zeros":  # torch's own rule and message
            raise ValueError(f"Only `zeros` padding mode is supported for "
                             f"{type(self).__name__}")
        output_padding = self._output_padding(input, output_size, self.stride, self.padding,
                                              self.kernel_size, self._RANK, self.dilation)
        fn = fc.conv_transpose1d if self._RANK == 1 else fc.conv_transpose2d
        return fn(input, self.weight, self.bias, self.stride, self.padding, output_padding,
                  self.groups, self.dilation, backend=self.backend, precision=self.precision)


class ConvTranspose1d(_TransposedMixin, torch.nn.ConvTranspose1d):
    """torch.nn.ConvTranspose1d computed by :func:`fastconv.conv_transpose1d`."""

    _RANK = 1

    def __init__(self, *args, backend: str = "auto", precision: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_fastconv(backend, precision)


class ConvTranspose2d(_TransposedMixin, torch.nn.ConvTranspose2d):
    """torch.nn.ConvTranspose2d computed by :func:`fastconv.conv_transpose2d`."""

    _RANK = 2

    def __init__(self, *args, backend: str = "auto", precision: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_fastconv(backend, precision)
