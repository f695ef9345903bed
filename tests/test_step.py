"""An optimized model's eager training forward batches its host work (nn/step.py): one cast
of every convolution parameter, one increment of every BatchNorm counter. The results must
be those of the per-layer work, bit for bit: checked on the CPU under bf16 autocast against
the same optimized model with the batching off."""

import copy

import pytest
import torch

import fastconv
from fastconv.nn import ConvBNAct2d, step

torchvision = pytest.importorskip("torchvision")


def _resnet(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torchvision.models.resnet18(num_classes=7).train()


def _train(model, steps: int, seed: int) -> list[torch.Tensor]:
    """``steps`` SGD steps on fresh random inputs; the last step's gradients."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(3, 3, 19, 23, generator=g)
        model(x).float().square().mean().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        opt.zero_grad(set_to_none=True)
    return grads


def _off(monkeypatch):
    """The per-layer work: no casts batched, each counter incremented by its layer."""
    monkeypatch.setattr(step, "batches_casts", lambda: False)
    monkeypatch.setattr(step.Step, "count", lambda self, tracked: tracked.add_(1))


def test_batched_step_equals_the_per_layer_work(monkeypatch):
    batched = fastconv.optimize(_resnet(0), "training", "bf16")
    per_layer = copy.deepcopy(batched)
    calls = []
    cast = step._Cast.apply
    monkeypatch.setattr(step._Cast, "apply", lambda *a: calls.append(len(a) - 1) or cast(*a))
    grads = _train(batched, 3, seed=1)
    convs = sum(isinstance(m, torch.nn.Conv2d) for m in batched.modules())
    assert calls == [convs, convs] * 3  # one cast forward, one backward, per step
    _off(monkeypatch)
    calls.clear()
    want = _train(per_layer, 3, seed=1)
    assert calls == []
    for got, ref in zip(grads, want):
        assert got.dtype is torch.float32 and torch.equal(got, ref)
    for (name, a), (_, b) in zip(batched.state_dict().items(), per_layer.state_dict().items()):
        assert torch.equal(a, b), name
    counts = {k: int(v) for k, v in batched.state_dict().items()
              if k.endswith("num_batches_tracked")}
    assert len(counts) == 20 and set(counts.values()) == {3}


class _Twice(torch.nn.Module):
    """One fused layer called twice per forward, one never called, and a forward that may
    raise after the first layer (it branches on data, so optimize keeps it as written)."""

    def __init__(self):
        super().__init__()
        self.a = ConvBNAct2d(3, 3, 3, padding=1)
        self.unused = ConvBNAct2d(3, 3, 3, padding=1)
        self.b = ConvBNAct2d(3, 3, 3, padding=1, momentum=None)
        self.fail = False

    def forward(self, x):
        x = self.a(self.a(x))
        if self.fail or x.sum() > 1e30:
            raise RuntimeError("mid-forward")
        return self.b(x)


def test_counters_count_each_call_also_when_the_forward_raises():
    model = fastconv.optimize(_Twice().train(), "training", "bf16")
    inner = model.model
    assert isinstance(inner, _Twice)
    model(torch.randn(2, 3, 5, 6)).float().sum().backward()
    assert int(inner.a.bn.num_batches_tracked) == 2
    assert int(inner.b.bn.num_batches_tracked) == 1  # momentum None: counted at once
    assert int(inner.unused.bn.num_batches_tracked) == 0
    assert inner.unused.weight.grad is None and inner.a.weight.grad is not None
    inner.fail = True
    with pytest.raises(RuntimeError, match="mid-forward"):
        model(torch.randn(2, 3, 5, 6))
    assert int(inner.a.bn.num_batches_tracked) == 4
    assert int(inner.b.bn.num_batches_tracked) == 1
    assert step.current() is None


def test_no_step_outside_training_forwards():
    model = fastconv.optimize(_Twice().train(), "training", "bf16")
    seen = []
    model.model.a.register_forward_pre_hook(lambda *_: seen.append(step.current()))
    model(torch.randn(2, 3, 5, 6))
    with torch.no_grad():
        model(torch.randn(2, 3, 5, 6))
    model.eval()(torch.randn(2, 3, 5, 6))
    assert seen[0] is not None and seen[1] is not None and seen[0].casts
    assert seen[2:] == [None] * 4


def test_no_casts_batched_under_torch_distributed(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    model = fastconv.optimize(_Twice().train(), "training", "bf16")
    seen = []
    model.model.a.register_forward_pre_hook(lambda *_: seen.append(step.current()))
    model(torch.randn(2, 3, 5, 6)).float().sum().backward()
    assert seen[0] is not None and seen[0].casts == {}
    assert int(model.model.a.bn.num_batches_tracked) == 2


def test_cast_is_twice_differentiable():
    w = torch.randn(4, 3, dtype=torch.float32, requires_grad=True)
    v = torch.randn(5, dtype=torch.float32, requires_grad=True)
    results = []
    for cast in (lambda *t: step._Cast.apply(torch.float64, *t),
                 lambda *t: tuple(x.to(torch.float64) for x in t)):
        cw, cv = cast(w, v)
        loss = (cw ** 3).sum() + (cv ** 2).sum()
        gw, gv = torch.autograd.grad(loss, (w, v), create_graph=True)
        assert gw.dtype is torch.float32
        results.append((gw, gv, torch.autograd.grad((gw * gw).sum() + gv.sum(), w)[0]))
    for got, ref in zip(*results):
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)


class _Nested(torch.nn.Module):
    """A block computed under another autocast dtype (float16 inside the model's bf16)."""

    def __init__(self):
        super().__init__()
        self.a = ConvBNAct2d(3, 4, 3, padding=1)
        self.b = ConvBNAct2d(4, 4, 3, padding=1)

    def forward(self, x):
        x = self.a(x)
        with torch.autocast(x.device.type, torch.float16):
            return self.b(x)


@pytest.mark.parametrize("case", ["pre-hook changes the weight", "nested autocast dtype"])
def test_casts_the_layer_cannot_use_are_left_to_autocast(case, monkeypatch):
    """A weight changed in place after the step cast it (by a forward pre-hook), and a layer
    under another autocast dtype: the layer takes autocast's cast, as without the step."""
    torch.manual_seed(0)
    net = _Nested().train()
    if case == "pre-hook changes the weight":
        def shrink(module, args):
            with torch.no_grad():
                module.weight.mul_(0.5)
        net.b.register_forward_pre_hook(shrink)
    batched = fastconv.optimize(net, "training", "bf16")
    per_layer = copy.deepcopy(batched)
    x = torch.randn(2, 3, 6, 7)
    batched(x).float().square().sum().backward()
    _off(monkeypatch)
    per_layer(x).float().square().sum().backward()
    for a, b in zip(batched.parameters(), per_layer.parameters()):
        assert torch.equal(a, b) and torch.equal(a.grad, b.grad)
