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
