"""optimize() keeps the original model's state_dict keys (issue 22, point 2): a checkpoint of
the original loads into the optimized model and the optimized model's state_dict loads into
the original, on the fx path and on the module walk, at the top level and nested, with
errors that name the original keys. CPU, small inputs."""

import pytest
import torch
import torch.nn as nn

import fastconv

tv = pytest.importorskip("torchvision")


def _randomize_stats(model: nn.Module, seed: int) -> nn.Module:
    """Non-default running statistics, so that a key mapped to the wrong BatchNorm shows."""
    gen = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) / 4)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=gen) / 4)
            m.num_batches_tracked.fill_(seed)
    return model


def _same_state(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for key, value in a.items():
        assert torch.equal(value, b[key]), key


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small"])
def test_checkpoints_move_both_ways(name):
    torch.manual_seed(0)
    original = _randomize_stats(getattr(tv.models, name)(), 1).eval()
    optimized = fastconv.optimize(original, channels_last=False)
    assert optimized.report.fused
    _same_state(optimized.state_dict(), original.state_dict())
    # the original model's checkpoint (another model's values) into the optimized one
    other = _randomize_stats(getattr(tv.models, name)(), 2).eval()
    optimized.load_state_dict(other.state_dict())
    _same_state(optimized.state_dict(), other.state_dict())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        want = other(x)
        got = optimized(x)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    # and the optimized model's state_dict into a fresh original
    fresh = getattr(tv.models, name)().eval()
    fresh.load_state_dict(optimized.state_dict())
    with torch.no_grad():
        assert torch.allclose(fresh(x), want, rtol=1e-5, atol=1e-5)


def test_training_updates_reach_the_original_keys():
    """After SGD steps in training mode, the optimized model's state (weights, BatchNorm
    parameters, running statistics, batch counters) loads into the original model."""
    torch.manual_seed(0)
    original = tv.models.resnet18(num_classes=5)
    optimized = fastconv.optimize(original, "training", channels_last=False)
    opt = torch.optim.SGD(optimized.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        optimized(torch.randn(2, 3, 32, 32)).square().mean().backward()
        opt.step()
    state = optimized.state_dict()
    assert int(state["layer1.0.bn1.num_batches_tracked"]) == 2
    assert not torch.equal(state["conv1.weight"], original.state_dict()["conv1.weight"])
    original.load_state_dict(state)
    _same_state(original.state_dict(), state)


class _Untraceable(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it, optimize() walks Sequentials."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.Conv2d(8, 4, 1), nn.BatchNorm2d(4))

    def forward(self, x):
        y = self.body(x)
        return y if y.sum() > 0 else -y


def test_walked_model_keeps_its_keys():
    torch.manual_seed(0)
    original = _randomize_stats(_Untraceable(), 3).eval()
    optimized = fastconv.optimize(original, channels_last=False)
    assert "torch.fx could not trace" in optimized.report.notes[0]
    assert len(optimized.report.fused) == 2
    _same_state(optimized.state_dict(), original.state_dict())
    other = _randomize_stats(_Untraceable(), 4).eval()
    optimized.load_state_dict(other.state_dict())
    x = torch.randn(1, 3, 6, 7)
    with torch.no_grad():
        assert torch.allclose(optimized(x), other(x), rtol=1e-4, atol=1e-5)


def test_nested_optimized_model_and_strict_errors():
    """Inside a parent module the keys carry the parent's prefix only; a strict load names
    missing and unexpected keys as the checkpoint has them."""
    torch.manual_seed(0)
    inner = tv.models.resnet18(num_classes=3).eval()
    parent = nn.ModuleDict({"net": fastconv.optimize(inner, channels_last=False)})
    state = parent.state_dict()
    assert set(state) == {f"net.{k}" for k in inner.state_dict()}
    parent.load_state_dict(state)
    del state["net.layer1.0.bn1.running_var"]
    state["net.extra"] = torch.zeros(1)
    with pytest.raises(RuntimeError) as err:
        parent.load_state_dict(state)
    assert '"net.layer1.0.bn1.running_var"' in str(err.value)
    assert '"net.extra"' in str(err.value)
    assert "bn_act" not in str(err.value)
    result = parent.load_state_dict(state, strict=False)
    assert result.missing_keys == ["net.layer1.0.bn1.running_var"]
    assert result.unexpected_keys == ["net.extra"]


class _Aliased(nn.Module):
    """A module kept under two attribute names (``fc`` is ``head[0]``): its state_dict has
    both names; the trace keeps the one it finds first."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Sequential(nn.Linear(4, 5))
        self.fc = self.head[0]

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def test_a_module_under_two_names_keeps_both_keys():
    torch.manual_seed(0)
    original = _randomize_stats(_Aliased(), 2).eval()
    optimized = fastconv.optimize(original, channels_last=False)
    assert optimized.report.fused
    _same_state(optimized.state_dict(), original.state_dict())
    other = _randomize_stats(_Aliased(), 3).eval()
    x = torch.randn(2, 3, 7, 6)
    optimized.load_state_dict(other.state_dict())  # strict: no unexpected key
    with torch.no_grad():
        assert torch.allclose(optimized(x), other(x), atol=1e-5)
    back = _Aliased()
    back.load_state_dict(optimized.state_dict())  # strict: no missing key
    _same_state(back.state_dict(), other.state_dict())
    # a checkpoint holding only the second name still loads the tensor
    only_fc = {k: v for k, v in other.state_dict().items() if not k.startswith("head.")}
    fresh = fastconv.optimize(_Aliased().eval(), channels_last=False)
    fresh.load_state_dict(only_fc)
    with torch.no_grad():
        assert torch.allclose(fresh(x), other(x), atol=1e-5)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small"])
def test_ddp_around_the_optimized_model_keeps_the_original_parameter_order(name, tmp_path):
    """DistributedDataParallel walks its module's parameters with torch's own walk, not the
    optimized model's ``named_parameters``: with fused layers appended after the modules
    left in place, ResNet-18 under DDP listed ``fc`` first, so an optimizer checkpoint of
    the original under DDP resumed its momentum on other parameters. The copy's modules
    are ordered so that the walk meets the original order (gloo, one rank, the CPU)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        torch.manual_seed(0)
        model = getattr(tv.models, name)().train()
        optimized = fastconv.optimize(model, "training", channels_last=False)
        walk = [optimized._names.original(n)
                for n, _ in nn.Module.named_parameters(optimized.model)]
        assert walk == [n for n, _ in model.named_parameters()]
        ddp_orig, ddp_fast = DDP(model), DDP(optimized)
        assert [p.shape for p in ddp_fast.parameters()] == [p.shape for p in model.parameters()]
        # an optimizer checkpoint taken under DDP of the original resumes under DDP of the copy
        opt = torch.optim.SGD(ddp_orig.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(2, 3, 64, 64)
        ddp_orig(x).square().mean().backward()
        opt.step()
        resumed = torch.optim.SGD(ddp_fast.parameters(), lr=0.1, momentum=0.9)
        resumed.load_state_dict(opt.state_dict())
        held = dict(optimized.named_parameters())
        for n, p in model.named_parameters():
            assert torch.equal(resumed.state[held[n]]["momentum_buffer"],
                               opt.state[p]["momentum_buffer"]), n
    finally:
        dist.destroy_process_group()
