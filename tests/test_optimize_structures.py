"""optimize() on model structures that break naive fusion: shared modules (traced and walked),
broadcast adds, parameters used twice, untraceable models, weight tying over training."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fastconv
from fastconv.precision import relative_error


def _block(c_in, c_out):
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                         nn.ReLU())


class Untraceable(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it (optimize walks Sequentials)."""

    def __init__(self, share: bool):
        super().__init__()
        self.seq = nn.Sequential(nn.Conv2d(3, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(),
                                 nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6))
        self.extra = self.seq[0] if share else nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        y = self.seq(x)
        if x.sum() > -1e9:  # always true; a Proxy cannot be branched on
            y = y + self.extra(x).mean()
        return y


class SharedBlock(nn.Module):
    """Traceable; one conv -> bn block called on two paths."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 1)
        self.block = _block(4, 4)

    def forward(self, x):
        x = self.stem(x)
        return self.block(self.block(x))


class TiedWeights(nn.Module):
    """Two conv -> bn chains sharing one weight Parameter."""

    def __init__(self):
        super().__init__()
        self.a, self.b = _block(4, 4), _block(4, 4)
        self.b[0].weight = self.a[0].weight

    def forward(self, x):
        return self.b(self.a(x))


class BroadcastAdd(nn.Module):
    """relu(bn(conv(x)) + p) with p broadcast: (1, C, 1, 1) or a scalar tensor."""

    def __init__(self, scalar: bool):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.p = nn.Parameter(torch.randn(()) if scalar else torch.randn(1, 4, 1, 1))

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)) + self.p)


def _randomize_bn(model):
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    return model


def _train_side_by_side(model, steps=3):
    """The same SGD steps on the model and on its optimized copy: outputs after each step."""
    torch.manual_seed(0)
    ref = copy.deepcopy(model).train()
    opt = fastconv.optimize(model, mode="training", precision="ieee", channels_last=False)
    assert sum(p.numel() for p in opt.parameters()) == sum(p.numel() for p in ref.parameters())
    sgd_ref = torch.optim.SGD(ref.parameters(), lr=0.05)
    sgd_opt = torch.optim.SGD(opt.parameters(), lr=0.05)
    errors = []
    for _ in range(steps):
        x = torch.randn(4, _first_in_channels(ref), 8, 7)
        for net, sgd in ((ref, sgd_ref), (opt, sgd_opt)):
            sgd.zero_grad()
            net(x).square().mean().backward()
            sgd.step()
        with torch.no_grad():
            errors.append(relative_error(opt(x), ref(x).double()))
    return opt, errors


def _first_in_channels(model):
    return next(m for m in model.modules() if isinstance(m, nn.Conv2d)).in_channels


def test_walk_path_fuses_a_chain_whose_conv_is_also_called_alone():
    """The walked Sequential runs its chain fused; its conv, also called on its own, is the
    conv as it was (one module, the same parameters), so training stays equal."""
    model = Untraceable(share=True)
    opt, errors = _train_side_by_side(model)
    assert any("torch.fx could not trace" in n for n in opt.report.notes)
    assert len(opt.report.fused) == 2, str(opt.report)
    assert max(errors) < 1e-5, errors
    assert opt.model.extra is opt.model.seq[0]  # still one module


def test_walk_path_fuses_an_unshared_untraceable_model():
    model = Untraceable(share=False)
    opt, errors = _train_side_by_side(model)
    assert len(opt.report.fused) == 2, str(opt.report)
    assert max(errors) < 1e-5, errors


def test_fx_path_leaves_a_block_called_twice():
    model = _randomize_bn(SharedBlock()).eval()
    opt = fastconv.optimize(model, precision="ieee", channels_last=False)
    assert any("more than one path" in why for _, why in opt.report.left), str(opt.report)
    x = torch.randn(2, 3, 9, 8)
    with torch.no_grad():
        assert relative_error(opt(x), model(x).double()) < 1e-5
    _, errors = _train_side_by_side(SharedBlock())
    assert max(errors) < 1e-5, errors


def test_tied_weights_stay_tied_through_training():
    model = TiedWeights()
    opt, errors = _train_side_by_side(model)
    assert len(opt.report.fused) == 2, str(opt.report)
    fused = [m for m in opt.modules() if isinstance(m, fastconv.nn.ConvBNAct2d)]
    assert fused[0].weight is fused[1].weight
    assert max(errors) < 1e-5, errors


@pytest.mark.parametrize("scalar", [False, True])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_broadcast_add_after_batchnorm(scalar, mode):
    model = _randomize_bn(BroadcastAdd(scalar))
    model.train(mode == "training")
    ref = copy.deepcopy(model)
    opt = fastconv.optimize(model, mode=mode, precision="ieee", channels_last=False)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        assert relative_error(opt(x), ref(x).double()) < 1e-5
    if mode == "training":
        opt(x).sum().backward()
        ref(x).sum().backward()
        got = dict(opt.named_parameters())
        for name, p in ref.named_parameters():
            match = [g for n, g in got.items() if n.endswith(name.split(".")[-1])
                     and g.shape == p.shape]
            assert any(relative_error(g.grad, p.grad.double()) < 1e-5 for g in match), name


class Nested(nn.Module):
    """Modules two and three levels down, identities and p = 0 dropouts (module and
    function, as timm's ConvNeXt and heads have them), a live dropout, and a LayerNorm whose
    parameters the trace reads directly."""

    def __init__(self):
        super().__init__()
        self.stages = nn.Sequential(nn.Sequential(nn.Conv2d(3, 5, 3, padding=1), nn.Identity(),
                                                  nn.Dropout(0.0)),
                                    nn.Sequential(nn.Conv2d(5, 5, 1), nn.Dropout(0.5)))
        self.norm = nn.ModuleDict({"ln": nn.LayerNorm(5)})
        self.head = nn.Sequential(nn.Linear(5, 4))

    def forward(self, x):
        x = self.stages(x)
        x = nn.functional.dropout(x, 0.0, self.training)
        x = self.norm["ln"](x.permute(0, 2, 3, 1)).mean((1, 2))
        return self.head(x).relu()


def _same_function_and_keys(opt, model, make, x):
    """``opt`` (optimized, ieee) computes ``model``'s function, and its state_dict keys are
    the original model's both ways: its checkpoint loads into a fresh ``make()`` and the
    model's into a fresh optimized copy."""
    with torch.no_grad():
        assert relative_error(opt(x), model(x).double()) < 1e-5
    sd = opt.state_dict()
    assert set(sd) == set(model.state_dict())
    fresh = make().eval()
    fresh.load_state_dict(sd)
    again = fastconv.optimize(make().eval(), precision="ieee", channels_last=False)
    again.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert relative_error(fresh(x), model(x).double()) < 1e-6
        assert relative_error(again(x), model(x).double()) < 1e-5


def test_identities_leave_the_graph_and_deep_modules_are_reached_flat():
    torch.manual_seed(0)
    model = Nested().eval()
    with torch.no_grad():
        for p in model.norm["ln"].parameters():
            p.uniform_(0.5, 1.5)
    opt = fastconv.optimize(model, precision="ieee", channels_last=False)
    code = opt.model.code
    assert "getattr(" not in code and "stages.0" not in code, code
    assert "dropout" not in code.replace("stages_1_1", ""), code  # the live one stays
    assert "stages_1_1" in code and "identity" not in code.lower(), code
    assert "self.norm_ln(" in code and "self.head_0(" in code, code
    x = torch.randn(2, 3, 6, 7)
    _same_function_and_keys(opt, model, Nested, x)
    # train(): the live dropout drops, the p = 0 ones stayed identities
    opt.train()
    with torch.no_grad():
        assert not torch.equal(opt(x), opt(x))


class ScaledBlock(nn.Module):
    """torchvision ConvNeXt's block shape: the graph reads the block's own parameter
    (``scale``) and calls modules inside it."""

    def __init__(self, c):
        super().__init__()
        self.scale = nn.Parameter(torch.rand(c, 1, 1) + 0.5)
        self.body = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, groups=c), nn.GELU())

    def forward(self, x):
        return x + self.scale * self.body(x)


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 1)
        self.stages = nn.Sequential(nn.Sequential(ScaledBlock(4), ScaledBlock(4)))

    def forward(self, x):
        return self.stages(self.stem(x))


def test_a_block_whose_parameter_the_graph_reads_moves_with_its_modules():
    """Both the block (for its parameter) and the modules called inside it are reached with
    one lookup each, every parameter has one path, and checkpoints load both ways."""
    torch.manual_seed(0)
    model = Scaled().eval()
    opt = fastconv.optimize(model, precision="ieee", channels_last=False)
    code = opt.model.code
    assert "getattr(" not in code and "self.stages_0_0.scale" in code, code
    assert "self.stages_0_1_body_0(" in code, code
    names = [n for n, _ in opt.model.named_parameters(remove_duplicate=False)]
    assert len(names) == len(set(names)) == len(list(model.parameters())), names
    _same_function_and_keys(opt, model, Scaled, torch.randn(2, 3, 6, 7))
