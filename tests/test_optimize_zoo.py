"""optimize() on every model of the zoo (issue 22: the models bench suite's torchvision and
timm models, random weights): every convolution followed by a BatchNorm fused, outputs
within 3x torch's own fp32 error against float64, checkpoints moving both ways through
state_dict, and a training step (loss, every gradient, running statistics) within 3x torch's
own fp32 error against a float64 copy. CPU, 32x32 (DeepLab 64x64), batch 1 (training: 2)."""

import pytest
import torch
import torch.nn as nn

import fastconv
from fastconv.precision import relative_error
from fastconv.tools.bench import models

pytest.importorskip("torchvision")
ZOO = [k for k in models.BUILDERS if k not in models.SEQUENCE_MODELS]  # (the image models)


def _build(key: str, seed: int) -> nn.Module:
    if key.startswith("timm_"):
        pytest.importorskip("timm")
    torch.manual_seed(seed)
    model = models.BUILDERS[key]()
    gen = torch.Generator().manual_seed(seed)
    for m in model.modules():  # non-default statistics: a misplaced one shows
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) / 10)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
    return model.eval()


@pytest.mark.parametrize("key", ZOO)
@pytest.mark.slow_after(4)
def test_zoo_model_fuses_matches_and_keeps_its_checkpoints(key):
    model = _build(key, 0)
    fast = fastconv.optimize(model, channels_last=False)
    fused, eligible, total = fast.report.coverage()
    assert fused == eligible, str(fast.report)
    if "convnext" not in key:  # ConvNeXt: LayerNorm after a permute, nothing to fuse
        assert fused > 0
    size = 64 if key.startswith("deeplab") else 32
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        want = models.output(model.double()(x.double()))
        torch_err = relative_error(models.output(model.float()(x)), want)
        assert relative_error(models.output(fast(x)), want) <= max(3 * torch_err, 1e-6)
        # another model's checkpoint in, and the optimized state back into a fresh model
        other = _build(key, 1)
        fast.load_state_dict(other.state_dict())
        want = models.output(other(x))
        assert relative_error(models.output(fast(x)), want) < 1e-5
        fresh = models.BUILDERS[key]().eval()
        fresh.load_state_dict(fast.state_dict())
        assert relative_error(models.output(fresh(x)), want) < 1e-6


def _no_dropout(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.Dropout) or type(m).__name__ in ("StochasticDepth", "DropPath"):
            m.p = 0.0
            if hasattr(m, "drop_prob"):
                m.drop_prob = 0.0
    return model


def _grads(model: nn.Module, names) -> torch.Tensor:
    params = dict(model.named_parameters())
    return torch.cat([params[n].grad.double().flatten() for n in names])


@pytest.mark.parametrize("key", ZOO)
@pytest.mark.slow_after(2)
def test_zoo_training_step(key):
    """mode='training' (batch statistics): the loss, every gradient (under the original
    parameter names) and the running statistics against a float64 copy, within 3x the error
    of torch's own fp32 model."""
    model = _no_dropout(_build(key, 0)).train()
    fast = fastconv.optimize(model, "training", precision="ieee", channels_last=False)
    truth = _no_dropout(_build(key, 0)).train().double()
    size = 64 if key.startswith("deeplab") else 32
    x = torch.randn(2, 3, size, size)
    for net, inp in ((truth, x.double()), (model, x), (fast, x)):
        models.output(net(inp)).square().mean().backward()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    want = _grads(truth, names)
    torch_err = relative_error(_grads(model, names), want)
    ours = torch.cat([dict(fast.named_parameters())[n].grad.double().flatten()
                      for n in names])
    assert relative_error(ours, want) <= max(3 * torch_err, 1e-6)
    stats = [k for k in model.state_dict() if k.endswith(("running_mean", "running_var"))]
    got, ref, t32 = fast.state_dict(), truth.state_dict(), model.state_dict()
    for k in stats:
        bound = max(3 * relative_error(t32[k], ref[k]), 1e-6)
        assert relative_error(got[k], ref[k]) <= bound, k
