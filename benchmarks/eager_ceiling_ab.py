"""How much of an optimized model's eager training step is fastconv's Python per layer: the
step of torch's model, of ``optimize(model, "training")``, and of the same optimized model
with each fastconv convolution module's forward replaced by the bare torch ops it runs
(``torch.conv2d`` on the step's batched casts, ``torch.batch_norm``, the activation in
place, the step's deferred counter; no checks, no plan lookup). The third row is the ceiling
of any trimming of that Python: what an eager step issuing torch's kernels costs with none
of it. With ``--compile``, a fourth row: torch.compile (default mode) of torch's model.
Rows alternate in one process (alternate.py); the models bench's step (forward, backward,
SGD), bf16 autocast, channels-last.

    PYTHONPATH=src python benchmarks/eager_ceiling_ab.py timm_resnet50_b32 [CASE ...] \
        [--rounds 30] [--compile]
"""

import argparse

import torch
from alternate import alternate, medians, ratio, training_steps

from fastconv.epilogue import activate
from fastconv.nn import conv, fused
from fastconv.nn import step as stepmod
from fastconv.precision import Precision
from fastconv.tools.bench import models

_FORWARDS = {cls: cls.forward for cls in (fused._ConvBNActMixin, conv.Conv2d)}


def _casts(self):
    step = stepmod._STEP.get()
    w, b = self.weight, self.bias
    if step is not None and step.casts:
        w = step.cast(w, step.dtype)
        b = None if b is None else step.cast(b, step.dtype)
    return step, w, b


def _bare_conv(self, input):
    _, w, b = _casts(self)
    return torch.conv2d(input, w, b, self.stride, self.padding, self.dilation, self.groups)


def _bare_conv_bn_act(self, input, residual=None):
    bn = self.bn
    step, w, b = _casts(self)
    if step is not None:
        step.count(bn.num_batches_tracked)
    else:
        bn.num_batches_tracked.add_(1)
    y = torch.conv2d(input, w, b, self.stride, self.padding, self.dilation, self.groups)
    z = torch.batch_norm(y, bn.weight, bn.bias, bn.running_mean, bn.running_var, True,
                         bn.momentum, bn.eps, True)
    if residual is not None:
        z = z.add_(residual) if residual.shape == z.shape and residual.dtype == z.dtype \
            else z + residual
    return activate(z, self.activation, self.negative_slope, inplace=True)


def _bare(on: bool) -> None:
    fused._ConvBNActMixin.forward = _bare_conv_bn_act if on \
        else _FORWARDS[fused._ConvBNActMixin]
    conv.Conv2d.forward = _bare_conv if on else _FORWARDS[conv.Conv2d]


def _check(net, x) -> float:
    """The bare layers' output against fastconv's on one forward (the model's training
    mode, its autocast): the relative difference (0 when the bare row computes alike)."""
    outs = []
    for on in (False, True):
        _bare(on)
        torch.manual_seed(1)  # dropout, stochastic depth alike
        outs.append(models.output(net(x)).float())
    _bare(False)
    return ((outs[0] - outs[1]).norm() / outs[0].norm()).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    precision = Precision.BF16
    for name, net, x, torch_step, fc_step, fc_net in training_steps(
            "eager_ceiling_ab.py", args.cases, args.rounds, precision):
        diff = _check(fc_net, x.contiguous(memory_format=torch.channels_last))
        rows = {"torch": (torch_step, lambda: _bare(False)),
                "fastconv": (fc_step, lambda: _bare(False)),
                "bare layers": (fc_step, lambda: _bare(True))}
        if args.compile:
            rows["torch.compile"] = (models.provider_call("torch_compile", net, x, precision,
                                                      "train")[0], lambda: _bare(False))
        times = alternate(rows, args.rounds, torch.cuda.synchronize)
        _bare(False)
        med = medians(times)
        pairs = [("torch", "fastconv"), ("torch", "bare layers"), ("fastconv", "bare layers")]
        if args.compile:
            pairs.append(("torch.compile", "fastconv"))
        print(f"{name:24s} " + "  ".join(f"{k} {v:6.2f}" for k, v in med.items())
              + "  | " + "  ".join(f"{a} / {b} {ratio(times, a, b):.3f}" for a, b in pairs)
              + f"  (bare vs fastconv output: {diff:.1e})")

if __name__ == "__main__":
    main()
