"""Where does an eager fastconv training run leave the float64 trajectory? (GPU)

ResNet-18, optimize(..., "training", "ieee"), SGD (lr 1e-3, momentum 0.9) stepped beside a
float64 torch copy on the same inputs; per step, the relative error of every parameter's
gradient, the worst three printed. Variants: as dispatched; BatchNorm passes through torch
ops instead of the Triton kernels; every convolution on aten; both. Usage:
    FASTCONV_DISPATCH=heuristic python3 benchmarks/train_drift.py [steps [variant ...]]
(variant "torch": a torch fp32 model in place of fastconv's)
"""

import copy
import sys

import torch
import torchvision

from fastconv import batchnorm
from fastconv.optimize import optimize
from fastconv.precision import relative_error


def _pairs(fast, ref):
    """(name, fastconv parameter, torch parameter) for every fused layer's convolution
    weight and BatchNorm weight and bias (torchvision's names: convK/bnK, downsample.0/.1)."""
    theirs = dict(ref.named_modules())
    for name, m in fast.model.named_modules():
        if not name.endswith("_bn_act"):
            continue
        conv = name[:-len("_bn_act")].replace("_", ".")
        bn = (conv[:-1] + "1" if conv.endswith("downsample.0")
              else conv.rsplit("conv", 1)[0] + "bn" + conv.rsplit("conv", 1)[1])
        yield conv + ".weight", m.weight, theirs[conv].weight
        yield bn + ".weight", m.bn.weight, theirs[bn].weight
        yield bn + ".bias", m.bn.bias, theirs[bn].bias


def run(variant: str, steps: int):
    torch.manual_seed(0)
    model = torchvision.models.resnet18().cuda().train()
    if variant == "torch":  # no fastconv at all: torch fp32 against torch float64
        fast = copy.deepcopy(model)
    else:
        fast = optimize(model, "training", "ieee")
    if "aten" in variant:
        for m in fast.modules():
            if hasattr(m, "backend"):
                m.backend = "aten"
    ref = copy.deepcopy(model).double()
    opts = [torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9) for m in (fast, ref)]
    batchnorm.USE_TRITON = "torchbn" not in variant
    gen = torch.Generator(device="cuda").manual_seed(1)
    for step in range(steps):
        x = torch.randn(4, 3, 64, 64, device="cuda", generator=gen)
        for net, opt in zip((fast, ref), opts):
            net(x.double() if net is ref else x).square().mean().backward()
        errs = []
        pairs = list(_pairs(fast, ref)) if variant != "torch" else [
            (n, p, q) for (n, p), q in zip(fast.named_parameters(), ref.parameters())
            if "fc" not in n]
        conv1 = relative_error(pairs[0][1].grad.double(), pairs[0][2].grad)
        for name, p, q in pairs:
            errs.append((relative_error(p.grad.double(), q.grad), name))
        errs.sort(reverse=True)
        worst = ", ".join(f"{n} {e:.1e}" for e, n in errs[:3])
        print(f"{variant:14} step {step}: conv1.weight {conv1:.2e}; matched "
              f"{len(errs)}; worst {worst}", flush=True)
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
    batchnorm.USE_TRITON = True


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    torch.backends.cudnn.allow_tf32 = False
    for variant in sys.argv[2:] or ("dispatched", "torchbn", "aten", "aten+torchbn"):
        run(variant, steps)
