"""Width growth of convolutional networks that keeps what they compute.

A *producer* (a convolution whose output channels grow, with the BatchNorm after it) and its
*consumer* (the next convolution, whose input channels grow) are widened together:

* ``init="zero"``: the producer's new filters are initialised as torch initialises a fresh
  layer, the consumer's weights from them are zero — the network computes exactly what it
  did, and gradients reach the new weights at once (the new channels are not dead);
* ``init="net2net"``: each new filter copies an existing one of its group and the consumer
  divides the weights of every copied channel among its copies (Net2WiderNet).

New BatchNorm channels start as the identity (γ = 1, β = 0, running mean 0, variance 1) under
``"zero"`` and as copies of their source channel under ``"net2net"``. Old weights are copied
slice-wise into zero-initialised tensors of the new size; every hyper-parameter (stride,
padding, padding_mode, dilation, groups, bias, device, dtype, fastconv's backend and
precision) is kept. With groups, channels stay in their group: old channel ``c`` of group
``b`` keeps its offset inside the group, and new channels are appended at the end of each
group. ``noise`` (a fraction of the old weights' standard deviation) perturbs the new filters
and breaks exact preservation.

:func:`grow_width` finds the producers from the model's dataflow (a torch.fx trace): a
convolution whose output reaches, through BatchNorms, per-channel activations, pooling,
dropout, flatten and depthwise convolutions (which widen with it), only convolutions and
Linear layers (after global pooling) — any number of them, all widened in one step. A
consumer reading the channels through concatenations along dim 1 widens at their offset
there. Residual adds (and element-wise products) tie the widths of their operands: every
producer so tied grows with the same widening, as one. A stack (MultiBranch's mean), a tie to
the model's input or the model's output ends the search with a reason in the report. Where
fx cannot trace the model, a module walk finds pairs (chains inside ``nn.Sequential``, the
inner convolutions of residual blocks, each :class:`MultiBranch` branch) and the report
says so. It either succeeds as a whole or
leaves model and optimizer exactly as they were (raising :class:`GrowthError` with a
per-layer report). Optimizer state (SGD momentum, Adam/AdamW moments, step counts) moves to
the new parameters.
"""

from .grow import carry_optimizer, grow_width
from .multibranch import MultiBranch
from .pairs import PASSTHROUGH as PASSTHROUGH
from .pairs import PASSTHROUGH_FUNCTION_NAMES as PASSTHROUGH_FUNCTION_NAMES
from .pairs import PASSTHROUGH_NAMES as PASSTHROUGH_NAMES
from .report import GrowthError, GrowthReport
from .widen import INITS as INITS
from .widen import (
    Widening,
    widen_batchnorm,
    widen_conv_in,
    widen_conv_out,
    widen_pair,
)

__all__ = ["GrowthError", "GrowthReport", "MultiBranch", "Widening", "carry_optimizer",
           "grow_width", "widen_batchnorm", "widen_conv_in", "widen_conv_out", "widen_pair"]
