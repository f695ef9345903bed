"""torch.nn-compatible modules computed by fastconv."""

from .conv import Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d
from .convert import convert
from .fused import ConvBNAct1d, ConvBNAct2d
from .seqconv import CausalConv1d

__all__ = ["CausalConv1d", "Conv1d", "Conv2d", "ConvBNAct1d", "ConvBNAct2d", "ConvTranspose1d",
           "ConvTranspose2d", "convert"]
