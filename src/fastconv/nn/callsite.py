"""What one fastconv module keeps between calls, in one object.

Every entry is derived from the module's attributes, parameters and the call, held under
the key it was made for, and made again at a call whose key differs. The object is never
pickled or copied (``_FastconvMixin.__getstate__`` drops it, so ``copy.deepcopy``,
``torch.save`` and DDP's broadcast see none of it): plans hold launchers and closures, and
a copy's first call makes its own (:meth:`_FastconvMixin._call_site`).
"""

from __future__ import annotations


class CallSite:
    """A module's kept entries, each None until its first use.

    * ``plan``: ``(key, plan, input cast, residual cast, parameter-cast dtype, the autograd
      function's arguments)``, the module's convolution for one signature
      (``_FastconvMixin._planned``; ``key``: ``_plan_key``'s);
    * ``casts``: the parameters' autocast casts, with the identities, versions and storage
      of the tensors they were made from (``_cast_params``);
    * ``step_conv``: ``(step key, plan)``, a convolution's entry inside an optimized
      model's training step (``_step_key_conv``'s key);
    * ``step_entry``: ``(step key, plan)``, a fused layer's entry inside a training step:
      its convolution, then torch's batch norm (``ConvBNAct._step_key``'s key);
    * ``fold``: ``(source tensors' state, folded weight, folded bias, eps)``, a fused
      layer's BatchNorm folded for inference without autograd;
    * ``shape``: ``(key, output shape)``, a fused layer's output shape for its last input.
    """

    __slots__ = ("plan", "casts", "step_conv", "step_entry", "fold", "shape")

    def __init__(self) -> None:
        self.plan = self.casts = self.step_conv = self.step_entry = None
        self.fold = self.shape = None
