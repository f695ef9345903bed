"""torch.nn-compatible modules computed by fastconv."""

from .conv import Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d
from .convert import convert

__all__ = ["Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d", "convert"]
