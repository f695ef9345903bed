"""fastconv: fast, correct convolutions for PyTorch on NVIDIA GPUs.

Public names only; importing fastconv compiles nothing and queries no device. ``growth``
is imported at its first use, the tools (``fastconv.tools``: command line, demo, bench) only
by those who use them.
"""

import importlib

from . import dispatch, nn
from .decode import causal_conv1d_update, causal_conv1d_varlen_states
from .env import __version__
from .epilogue import ACTIVATIONS, Epilogue
from .errors import ConvError, ConvTypeError, NotSupported
from .functional import (
    conv1d,
    conv2d,
    conv_bn_act1d,
    conv_bn_act2d,
    conv_transpose1d,
    conv_transpose2d,
    explain,
)
from .longconv import long_conv1d
from .optimize import compile_model as compile  # noqa: A004 (torch.compile's name)
from .optimize import optimize
from .precision import TOLERANCE, Precision
from .problem import ConvProblem
from .seqconv import causal_conv1d

__all__ = [
    "ACTIVATIONS", "ConvError", "ConvProblem", "ConvTypeError", "Epilogue", "NotSupported",
    "Precision", "TOLERANCE", "causal_conv1d", "causal_conv1d_update",
    "causal_conv1d_varlen_states", "conv1d", "conv2d",
    "conv_bn_act1d", "conv_bn_act2d", "conv_transpose1d", "conv_transpose2d",
    "__version__", "compile", "dispatch", "explain", "growth", "long_conv1d", "nn", "optimize",
]


def __getattr__(name: str):
    if name == "growth":  # imported at its first use
        return importlib.import_module(".growth", __name__)
    raise AttributeError(f"module 'fastconv' has no attribute {name!r}")
