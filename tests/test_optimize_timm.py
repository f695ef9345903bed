"""optimize() on timm models (pretrained=False: nothing is downloaded): norm-act modules
(timm's BatchNormAct2d, a BatchNorm2d subclass with its activation inside) fuse with the
convolution before them, with the activation inside; coverage is reported; outputs,
gradients and running statistics match the original model; state_dict keys stay (issue 22).
CPU, small inputs."""

import pytest
import torch
import torch.nn as nn

import fastconv
from fastconv.precision import relative_error

timm = pytest.importorskip("timm")
from timm.layers import BatchNormAct2d  # noqa: E402

MODELS = ["mobilenetv3_small_050", "efficientnet_b0", "resnext26ts"]


def _model(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False)
    for m in model.modules():  # non-default statistics: a misplaced one shows
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("name", MODELS)
def test_norm_act_modules_fuse_and_match_in_inference(name):
    model = _model(name).eval()
    fast = fastconv.optimize(model, channels_last=False)
    report = fast.report
    fused, eligible, total = report.coverage()
    norms = sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert fused == eligible == norms, str(report)  # every conv -> norm of these models
    assert total == sum(isinstance(m, nn.Conv2d) for m in model.modules())
    assert all("BatchNorm" in why for _, why in report.left), report.left  # (SE, head)
    assert f"fused {fused} of {eligible}" in str(report)
    x = torch.randn(2, 3, 48, 40)
    with torch.no_grad():
        want = model.double()(x.double())
        got = fast(x)
        torch_fp32 = model.float()(x)
    assert relative_error(got, want) <= max(3 * relative_error(torch_fp32, want), 1e-6)
    assert set(fast.state_dict()) == set(model.state_dict())


def test_activation_inside_the_norm_is_the_fused_one():
    """The fused layer applies the norm's own activation once and holds a plain BatchNorm
    with the model's tensors; to_torch() gives conv -> BatchNorm2d -> that activation."""
    model = _model("mobilenetv3_small_050").eval()
    fast = fastconv.optimize(model, channels_last=False)
    layer = fast.model.conv_stem_bn_act
    assert layer.activation == "hardswish" and type(layer.bn) is nn.BatchNorm2d
    assert dict(fast.report.fused)["conv_stem"] == "conv -> bn -> hardswish"
    seq = layer.to_torch()
    assert [type(m) for m in seq] == [nn.Conv2d, nn.BatchNorm2d, nn.Hardswish]
    x = torch.randn(1, 3, 9, 9)
    with torch.no_grad():
        want = model.bn1(model.conv_stem(x))  # timm applies the act inside bn1
        assert torch.allclose(layer(x), want, rtol=1e-5, atol=1e-5)
        assert torch.allclose(seq(x), want, rtol=1e-5, atol=1e-5)


def test_norm_act_that_cannot_fuse_is_left_with_the_reason():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 4, 3, padding=1)
            self.na = BatchNormAct2d(4, act_layer=nn.PReLU)
            self.b = nn.Conv2d(4, 4, 1)
            self.nb = BatchNormAct2d(4, act_layer=nn.ReLU, drop_layer=nn.Dropout)

        def forward(self, x):
            return self.nb(self.b(self.na(self.a(x))))

    net = Net().eval()
    fast = fastconv.optimize(net, channels_last=False)
    left = dict(fast.report.left)
    assert left["a"] == "the activation inside BatchNormAct2d (PReLU) has no fused form"
    assert left["b"] == "BatchNormAct2d applies Dropout before its activation"
    assert fast.report.coverage() == (0, 2, 2)
    x = torch.randn(1, 3, 5, 5)
    with torch.no_grad():
        assert torch.allclose(fast(x), net(x), rtol=1e-5, atol=1e-6)


def test_training_step_matches_torch():
    """mode='training': the fused layers (batch statistics, the activation inside the
    norm) give torch's loss, gradients and running statistics."""
    model = _model("mobilenetv3_small_050").train()
    fast = fastconv.optimize(model, "training", precision="ieee", channels_last=False)
    assert len(fast.report.fused) == 34
    x = torch.randn(2, 3, 32, 32)
    want_loss = model(x).square().mean()
    want_loss.backward()
    got_loss = fast(x).square().mean()
    got_loss.backward()
    assert torch.allclose(got_loss, want_loss, rtol=1e-4)
    grads = dict(fast.named_parameters())
    params = dict(model.named_parameters())
    state = fast.state_dict()
    checked = 0
    for key, value in model.state_dict().items():
        assert torch.allclose(state[key].float(), value.float(), rtol=1e-4, atol=1e-5), key
    # gradients under the original names; a bias before a batch
    # statistics norm has a gradient of rounding noise only: a floor of 1e-6 of the largest
    floor = 1e-6 * max(float(p.grad.abs().max()) for p in params.values())
    for name, p in params.items():
        g = grads[name].grad
        assert g is not None, name
        assert float((g - p.grad).abs().max()) <= 1e-3 * float(p.grad.abs().max()) + floor, \
            name
        checked += 1
    assert checked == len(params)


def test_coverage_counts_only_convolutions_followed_by_a_norm():
    """A conv whose output feeds two non-norm users (ConvNeXt's downsample before a
    residual block) is not eligible; one feeding a BatchNorm and more is, and is left."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.down = nn.Conv2d(3, 4, 2, stride=2)
            self.a = nn.Conv2d(4, 4, 3, padding=1)
            self.bn_a = nn.BatchNorm2d(4)
            self.b = nn.Conv2d(4, 4, 1)
            self.bn_b = nn.BatchNorm2d(4)

        def forward(self, x):
            x = self.down(x)
            x = x + torch.relu(x)           # down: two users, no norm
            y = self.a(x)
            z = self.bn_a(y) + y            # a: a norm and another user
            return torch.relu(self.bn_b(self.b(z)))

    net = Net().eval()
    fast = fastconv.optimize(net, channels_last=False)
    left = dict(fast.report.left)
    assert left["down"].startswith("not followed by a BatchNorm module")
    assert left["a"] == "its output is used 2 times"
    assert fast.report.coverage() == (1, 2, 3)
    assert dict(fast.report.fused) == {"b": "conv -> bn -> relu"}
    x = torch.randn(1, 3, 8, 6)
    with torch.no_grad():
        assert torch.allclose(fast(x), net(x), rtol=1e-5, atol=1e-6)


class _ShiftedNorm(nn.BatchNorm2d):
    """A BatchNorm subclass with a forward of its own: never fused as a plain BatchNorm."""

    def forward(self, x):
        return super().forward(x) + 1.0


@pytest.mark.parametrize("traceable", [True, False])
def test_batchnorm_subclass_with_its_own_forward_is_left(traceable):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), _ShiftedNorm(4))

        def forward(self, x):
            y = self.body(x)
            if not traceable and y.sum() > 1e9:  # data-dependent: the module walk
                return -y
            return y

    net = Net().eval()
    fast = fastconv.optimize(net, channels_last=False)
    assert not fast.report.fused
    if not traceable:
        assert dict(fast.report.left)["body.0"] == \
            "_ShiftedNorm has a forward of its own (not fused as a BatchNorm)"
    x = torch.randn(1, 3, 5, 5)
    with torch.no_grad():
        assert torch.allclose(fast(x), net(x), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_the_timm_example_runs_and_reports_what_a_user_checks():
    """examples/optimize_timm.py as a user runs it (CPU: float32, small input): coverage,
    the error against float64 beside torch's, the state_dict round trip."""
    import os
    import re
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(__file__))
    done = subprocess.run([sys.executable, "examples/optimize_timm.py", "--model",
                           "mobilenetv3_small_050", "--size", "48"], capture_output=True,
                          text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    fused, eligible = map(int, re.search(r"(\d+) of (\d+) conv -> BatchNorm", done.stdout)
                          .groups())
    assert fused == eligible > 0, done.stdout
    ours, theirs = map(float, re.search(r"fastconv ([0-9.e+-]+), torch ([0-9.e+-]+)",
                                        done.stdout).groups())
    assert ours < max(3 * theirs, 1e-6), done.stdout
    assert "loads into the optimized model and back" in done.stdout
