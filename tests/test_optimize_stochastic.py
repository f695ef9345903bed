"""Stochastic depth and dropout follow train()/eval() after optimize(): torchvision's
StochasticDepth and timm's DropPath stay modules, and a traced ``F.dropout(...,
training=self.training)`` (timm's classifier heads) reads the flag at run time. Traced
into, ``self.training`` was baked into the graph: a model optimized for training dropped
paths and units in eval() too."""

import pytest
import torch

import fastconv


def _models():
    import torchvision

    yield "tv efficientnet_b0", torchvision.models.efficientnet_b0(
        num_classes=10, stochastic_depth_prob=0.5), "StochasticDepth"
    timm = pytest.importorskip("timm")
    yield "timm convnext_tiny", timm.create_model("convnext_tiny", pretrained=False,
                                                  num_classes=10, drop_path_rate=0.5), \
        "DropPath"
    # drop_rate: F.dropout(x, p, training=self.training) in the head, no module
    yield "timm efficientnet_b0 head", timm.create_model(
        "efficientnet_b0", pretrained=False, num_classes=10, drop_rate=0.5), None


@pytest.mark.parametrize("mode", ["training", "inference"])
def test_stochastic_depth_follows_the_mode(mode):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    for name, model, kind in _models():
        for m in model.modules():  # no plain dropout: only the stochastic depth is random
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
        net = fastconv.optimize(model, mode)
        # (efficientnet's blocks without a residual hold one that their forward never calls)
        assert kind is None or any(type(m).__name__ == kind for m in net.modules()), name
        net.eval()
        model.eval()
        with torch.no_grad():
            a, b, want = net(x), net(x), model(x)
        assert torch.equal(a, b), f"{name} ({mode}): random in eval()"
        assert torch.allclose(a, want, rtol=1e-4, atol=1e-4), name
        net.train()
        with torch.no_grad():
            assert not torch.equal(net(x), net(x)), f"{name} ({mode}): no drops in train()"


def test_torchvision_stochastic_depth_calls_nothing_in_eval(monkeypatch):
    """optimize() swaps torchvision's StochasticDepth for fastconv's subclass, whose eval()
    call returns its input without torchvision's function (its API logging and checks on
    every call); in train() it is torchvision's function; a layer torchvision's would raise
    on stays torchvision's."""
    import importlib

    import torchvision

    tv = importlib.import_module("torchvision.ops.stochastic_depth")  # (the module, not the
    # function torchvision.ops exports under the same name)

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torchvision.ops.StochasticDepth(0.5,
                                                                                          "row"))
    bad = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torchvision.ops.StochasticDepth(1.5,
                                                                                        "row"))
    net = fastconv.optimize(model, "inference")
    kept = fastconv.optimize(bad, "inference")
    light = [m for m in net.modules() if isinstance(m, torchvision.ops.StochasticDepth)]
    assert [type(m).__module__ for m in light] == ["fastconv.nn.stochastic"]
    assert (light[0].p, light[0].mode) == (0.5, "row")
    assert any(type(m) is torchvision.ops.StochasticDepth for m in kept.modules())
    calls = []
    real = tv.stochastic_depth
    monkeypatch.setattr(tv, "stochastic_depth",
                        lambda *a, **k: calls.append(a) or real(*a, **k))
    x = torch.randn(8, 3, 5, 5)
    with torch.no_grad():
        want = model.eval()(x)
        calls.clear()
        assert torch.allclose(net(x), want, atol=1e-5)
        assert not calls
        net.train()
        net(x)
        assert len(calls) == 1 and calls[0][1:] == (0.5, "row", True)
