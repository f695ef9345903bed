"""An optimized model's eager training forward batches its host work (nn/step.py): one cast
of every convolution parameter, one increment of every BatchNorm counter. The results must
be those of the per-layer work, bit for bit: checked on the CPU under bf16 autocast against
the same optimized model with the batching off."""

import contextlib
import copy
import dataclasses

import pytest
import torch

import fastconv
from fastconv import batchnorm, plans
from fastconv.nn import ConvBNAct2d, fused, step
from fastconv.nn import conv as conv_module

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


# --- the step's kept layer calls (nn/fused.py: _keep_step_call, _step_call) -------------
# On a GPU an eager training layer runs torch's own convolution and batch norm; from its
# second call in a step it runs them as the entry its first call kept, with no signature
# checks. On the CPU dispatch plans other convolutions, so these tests plan as on a GPU.


@pytest.fixture
def gpu_path(monkeypatch):
    """Convolutions planned as an eager GPU training call plans them (torch's own)."""
    native = plans._eager_native
    monkeypatch.setattr(plans, "_eager_native",
                        lambda p: native(dataclasses.replace(p, device="cuda")))


def _spy(monkeypatch) -> list[bool]:
    """Whether each kept call ran (True) or handed over to the general path (False)."""
    seen = []
    real = fused._ConvBNActMixin._step_call

    def spy(self, *args):
        out = real(self, *args)
        seen.append(out is not None)
        return out
    monkeypatch.setattr(fused._ConvBNActMixin, "_step_call", spy)
    return seen


def test_kept_calls_equal_the_general_path(gpu_path, monkeypatch):
    kept = fastconv.optimize(_resnet(0), "training", "bf16")
    general = copy.deepcopy(kept)
    seen = _spy(monkeypatch)
    grads = _train(kept, 3, seed=1)
    assert seen.count(True) == 2 * 20 and not seen.count(False)  # steps 2 and 3, 20 layers
    monkeypatch.setattr(fused._ConvBNActMixin, "_keep_step_call", lambda *a: None)
    seen.clear()
    want = _train(general, 3, seed=1)
    assert seen == []
    for got, ref in zip(grads, want):
        assert torch.equal(got, ref)
    for (name, a), (_, b) in zip(kept.state_dict().items(), general.state_dict().items()):
        assert torch.equal(a, b), name


def _layer_call(layer, x, **autocast):
    """One training call of ``layer`` inside a step that cast its weight in bf16."""
    with torch.autocast("cpu", **({"dtype": torch.bfloat16} | autocast)):
        with step.training_step([layer.weight], torch.bfloat16):
            return layer(x)


@pytest.mark.parametrize("change", [
    "autocast off", "float16 autocast", "deterministic", "fused passes", "frozen norm",
    "momentum None", "no running stats", "eval", "activation", "padding"])
def test_a_changed_layer_or_setting_takes_the_general_path(change, gpu_path, monkeypatch):
    """After a kept call, each change the key holds hands the call to the general path, which
    computes it as a layer never called before (a copy of the changed layer) does."""
    torch.manual_seed(0)
    layer = ConvBNAct2d(3, 5, 3, padding=1).train()
    x = torch.randn(2, 3, 6, 7)
    _layer_call(layer, x)
    seen = _spy(monkeypatch)
    _layer_call(layer, x)
    assert seen == [True]
    autocast, ctx = {}, contextlib.nullcontext()
    if change == "autocast off":
        autocast = {"enabled": False}
    elif change == "float16 autocast":
        autocast = {"dtype": torch.float16}
    elif change == "deterministic":
        ctx = fastconv.dispatch.settings(deterministic=True)
    elif change == "fused passes":
        ctx = batchnorm.fused_passes()
    elif change == "frozen norm":
        layer.bn.eval()
    elif change == "momentum None":
        layer.bn.momentum = None
    elif change == "no running stats":
        layer.bn.track_running_stats = False
    elif change == "eval":
        layer.eval()
    elif change == "activation":
        layer.activation = "silu"
    else:
        layer.padding = (0, 2)
    fresh = copy.deepcopy(layer)
    with ctx:
        got = _layer_call(layer, x, **autocast)
        want = _layer_call(fresh, x, **autocast)
    assert seen == [True, False]
    assert torch.equal(got, want)
    assert torch.equal(layer.bn.running_mean, fresh.bn.running_mean)
    assert torch.equal(layer.bn.num_batches_tracked, fresh.bn.num_batches_tracked)


@pytest.mark.parametrize("shape, match", [((2, 4, 6, 7), "channel"),
                                          ((1, 3, 1, 1), "more than 1 value")])
def test_bad_input_after_kept_calls_gets_fastconvs_error(shape, match, gpu_path,
                                                         monkeypatch):
    """An input torch's ops refuse, or one value per channel (which torch's batch norm
    would take without a word), hands over to the general path: its ConvError, the running
    statistics untouched, the call counted once (torch's BatchNorm counts before it
    computes)."""
    torch.manual_seed(0)
    layer = ConvBNAct2d(3, 5, 3, padding=1).train()
    _layer_call(layer, torch.randn(2, 3, 6, 7))
    seen = _spy(monkeypatch)
    _layer_call(layer, torch.randn(2, 3, 6, 7))
    mean, count = layer.bn.running_mean.clone(), int(layer.bn.num_batches_tracked)
    with pytest.raises(fastconv.ConvError, match=match):
        _layer_call(layer, torch.randn(*shape))
    assert seen == [True, False]
    assert torch.equal(layer.bn.running_mean, mean)
    assert int(layer.bn.num_batches_tracked) == count + 1


def test_kept_calls_take_any_input_and_residual_torch_takes(gpu_path, monkeypatch):
    """Another batch size, another memory format, a float32 input (autocast casts it) and a
    residual: kept calls, each equal to a fresh layer's general path."""
    torch.manual_seed(0)
    layer = ConvBNAct2d(3, 5, 3, padding=1).train()
    _layer_call(layer, torch.randn(2, 3, 6, 7).bfloat16())
    seen = _spy(monkeypatch)
    for x in (torch.randn(3, 3, 6, 7).bfloat16(),
              torch.randn(2, 3, 8, 5).bfloat16().contiguous(memory_format=torch.channels_last),
              torch.randn(2, 3, 6, 7)):
        fresh = copy.deepcopy(layer)
        assert torch.equal(_layer_call(layer, x), _layer_call(fresh, x))
    residual = torch.randn(2, 5, 6, 7).bfloat16()
    x = torch.randn(2, 3, 6, 7).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with step.training_step([layer.weight], torch.bfloat16):
            layer(x, residual)  # kept under the residual's dtype
            fresh = copy.deepcopy(layer)
            assert torch.equal(layer(x, residual), fresh(x, residual))
    assert seen == [True] * 3 + [False, True]


def _spy_conv(monkeypatch) -> list[str]:
    """Each plain convolution call in a step: kept ("kept") or not ("general")."""
    seen = []
    real = conv_module._FastconvMixin._step_run

    def spy(self, *args):
        out = real(self, *args)
        if not isinstance(self, fused._ConvBNActMixin):
            seen.append("kept")
        return out
    monkeypatch.setattr(conv_module._FastconvMixin, "_step_run", spy)
    return seen


def test_plain_convolutions_kept_calls_equal_the_general_path(gpu_path, monkeypatch):
    """mobilenet_v3_small: fused layers and the squeeze-excitation blocks' convolutions
    (with bias, no norm), kept from the second step on, bit for bit the general path."""
    torch.manual_seed(0)
    kept = fastconv.optimize(torchvision.models.mobilenet_v3_small(num_classes=7).train(),
                             "training", "bf16")
    general = copy.deepcopy(kept)
    plain = [m for m in kept.modules() if isinstance(m, conv_module.Conv2d)
             and not isinstance(m, fused._ConvBNActMixin)]
    assert len(plain) == 18  # 9 squeeze-excitation blocks
    seen = _spy_conv(monkeypatch)
    torch.manual_seed(2)  # the classifier's dropout
    grads = _train(kept, 3, seed=1)
    assert len(seen) == 2 * len(plain)
    monkeypatch.setattr(conv_module._FastconvMixin, "_step_run",
                        lambda *a: pytest.fail("kept call"))
    monkeypatch.setattr(fused._ConvBNActMixin, "_keep_step_call", lambda *a: None)
    monkeypatch.setattr(conv_module._FastconvMixin, "_step_plan", lambda *a: None)
    torch.manual_seed(2)
    want = _train(general, 3, seed=1)
    for got, ref in zip(grads, want):
        assert torch.equal(got, ref)
    for (name, a), (_, b) in zip(kept.state_dict().items(), general.state_dict().items()):
        assert torch.equal(a, b), name


def test_plain_convolution_changed_or_refused_takes_the_general_path(gpu_path, monkeypatch):
    torch.manual_seed(0)
    layer = conv_module.Conv2d(3, 5, 3, padding=1, bias=True).train()
    x = torch.randn(2, 3, 6, 7)
    _layer_call(layer, x)
    seen = _spy_conv(monkeypatch)
    _layer_call(layer, x)
    assert seen == ["kept"]
    layer.padding = (2, 0)
    fresh = copy.deepcopy(layer)
    assert torch.equal(_layer_call(layer, x), _layer_call(fresh, x))
    assert seen == ["kept"]  # the padding changed: the general path, which keeps anew
    _layer_call(layer, x)
    assert seen == ["kept"] * 2
    with pytest.raises(fastconv.ConvError, match="channel"):
        _layer_call(layer, torch.randn(2, 4, 6, 7))


def test_the_step_keeps_only_the_plan_made_for_this_call(gpu_path):
    """The plan entry a module holds may be another call's (a no-grad call's): the step
    keeps a plan only when it is this call's signature's."""
    torch.manual_seed(0)
    layer = conv_module.Conv2d(3, 5, 3, padding=1).train()
    x = torch.randn(2, 3, 6, 7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        key = layer._step_key_conv(x)
        with torch.no_grad():
            layer(x)
        assert layer._step_plan(key, x, layer.weight, layer.bias) is None
        layer(x)
        assert layer._step_plan(key, x, layer.weight, layer.bias) is not None
