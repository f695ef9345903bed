"""optimize() on models with torchvision's FrozenBatchNorm2d (detection backbones, issue 22):
every conv -> frozen norm fuses, the fixed statistics hold in training as in inference (no
batch statistics, nothing updated, no new parameters), and checkpoints keep their keys.
CPU, small inputs, float64 references."""

import pytest
import torch

import fastconv
from fastconv.nn import ConvBNAct2d
from fastconv.precision import relative_error

tv = pytest.importorskip("torchvision")
from torchvision.ops.misc import FrozenBatchNorm2d  # noqa: E402


def _frozen_resnet18(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = tv.models.resnet18(num_classes=5, norm_layer=FrozenBatchNorm2d)
    gen = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, FrozenBatchNorm2d):
            n = m.weight.numel()
            m.running_mean.copy_(torch.randn(n, generator=gen) / 4)
            m.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
            m.weight.copy_(torch.rand(n, generator=gen) + 0.5)
            m.bias.copy_(torch.randn(n, generator=gen) / 4)
    return model


def test_frozen_norms_fuse_in_inference_and_checkpoints_keep_their_keys():
    model = _frozen_resnet18(0).eval()
    opt = fastconv.optimize(model, "inference", "ieee")
    fused, eligible, total = opt.report.coverage()
    assert fused == eligible == total == 20, opt.report
    assert any("FrozenBatchNorm2d" in note for note in opt.report.notes)
    x = torch.randn(2, 3, 32, 32)
    want = model.double()(x.double())
    model.float()
    assert relative_error(opt(x), want) < 1e-5
    with torch.no_grad():  # the folded path, kept between calls
        assert relative_error(opt(x), want) < 1e-5
    assert set(opt.state_dict()) == set(model.state_dict())
    other = _frozen_resnet18(1).eval()
    opt.load_state_dict(other.state_dict())  # the original's checkpoint, strict
    assert relative_error(opt(x), other(x)) < 1e-5
    model.load_state_dict(opt.state_dict())  # and back
    assert relative_error(model(x), other(x)) < 1e-6


def test_frozen_norms_stay_frozen_in_training():
    model = _frozen_resnet18(2).train()
    reference = _frozen_resnet18(2).double().train()
    opt = fastconv.optimize(model, "training", "ieee")
    assert opt.report.coverage()[0] == 20
    names = [n for n, _ in model.named_parameters()]
    internal = dict(opt.named_parameters())
    assert [n for n, _ in opt.named_parameters()] == names
    layers = [m for m in opt.modules() if isinstance(m, ConvBNAct2d)]
    opt.train()  # a frozen norm stays in eval inside its fused layer
    assert all(m.training and not m.bn.training for m in layers)
    stats = [m.bn.running_mean.clone() for m in layers]
    x = torch.randn(2, 3, 32, 32)
    y = opt(x)
    want = reference(x.double())
    assert relative_error(y, want) < 1e-5  # fixed statistics, not the batch's
    y.square().mean().backward()
    want.square().mean().backward()
    for name, q in reference.named_parameters():
        got = internal[name].grad
        assert relative_error(got, q.grad) < 1e-4, name
    assert all(torch.equal(m.bn.running_mean, s) for m, s in zip(layers, stats))
