"""Width growth (fastconv.growth): function preservation per layer type and for blocks,
gradients into the new channels, optimizer state, all-or-nothing failures, a training run
that grows every epoch."""

import copy
import math
import os

import pytest
import torch
from torch import nn

import fastconv
from fastconv import growth
from fastconv.errors import ConvError
from fastconv.growth import GrowthError, MultiBranch, grow_width, widen_pair
from fastconv.nn import ConvBNAct2d
from fastconv.precision import relative_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _close(a, b, dtype):
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    assert relative_error(a, b) < tol, relative_error(a, b)


def _pair(kind, dtype):
    """(producer, bn, consumer, input) of one layer type."""
    if kind == "conv1d":
        p = nn.Conv1d(4, 6, 3, padding=2, dilation=2, bias=True)
        c = nn.Conv1d(6, 5, 3, stride=2, padding=1, padding_mode="reflect")
        bn, x = nn.BatchNorm1d(6), torch.randn(3, 4, 17)
    elif kind == "conv2d_groups":
        p = nn.Conv2d(4, 6, 3, padding=1, groups=2)
        c = nn.Conv2d(6, 9, 3, stride=2, padding=1, groups=3)
        bn, x = nn.BatchNorm2d(6), torch.randn(2, 4, 9, 11)
    elif kind == "transposed":
        p = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
        c = nn.ConvTranspose2d(6, 3, 2, stride=2, groups=3, bias=True)
        bn, x = nn.BatchNorm2d(6), torch.randn(2, 4, 5, 6)
    elif kind == "fastconv":
        p = fastconv.nn.Conv2d(4, 6, 3, padding=1, padding_mode="circular", precision="ieee")
        c = fastconv.nn.Conv2d(6, 5, 1, precision="ieee")
        bn, x = nn.BatchNorm2d(6), torch.randn(2, 4, 7, 8)
    else:  # fused producer: its BatchNorm grows with it
        p = ConvBNAct2d(4, 6, 3, padding=1, activation="silu", precision="ieee")
        c = fastconv.nn.Conv2d(6, 5, 3, padding=1, precision="ieee")
        bn, x = None, torch.randn(2, 4, 7, 8)
    for b in (bn, getattr(p, "bn", None)):  # non-trivial statistics and affine parameters
        if b is not None:
            with torch.no_grad():
                b.running_mean.uniform_(-1, 1)
                b.running_var.uniform_(0.5, 2)
                b.weight.uniform_(0.5, 1.5)
                b.bias.uniform_(-0.5, 0.5)
    return p.to(DEVICE, dtype), bn.to(DEVICE, dtype) if bn is not None else None, \
        c.to(DEVICE, dtype), x.to(DEVICE, dtype)


def _net(p, bn, c):
    return nn.Sequential(*[m for m in (p, bn, nn.SiLU() if bn is not None else None, c)
                           if m is not None])


KINDS = ["conv1d", "conv2d_groups", "transposed", "fastconv", "fused"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("init", ["zero", "net2net"])
@pytest.mark.parametrize("kind", KINDS)
def test_widen_pair_preserves_the_function(kind, init, dtype):
    p, bn, c, x = _pair(kind, dtype)
    for training in (False, True):
        net = _net(p, bn, c).train(training)
        want = net(x)  # (in training, this updates the running statistics)
        before = copy.deepcopy(net.state_dict())
        p2, c2, bn2 = widen_pair(p, c, 12, bn, init=init,
                                 generator=torch.Generator().manual_seed(1))
        grown = _net(p2, bn2, c2).train(training)
        _close(grown(x), want, dtype)
        assert all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())  # copies
        assert p2.out_channels == 12 and c2.in_channels == 12
        for attr in ("stride", "padding", "dilation", "groups", "padding_mode",
                     "output_padding"):
            assert getattr(p2, attr) == getattr(p, attr)
            assert getattr(c2, attr) == getattr(c, attr)
        assert (p2.bias is None) == (p.bias is None) and p2.weight.dtype == dtype
        assert type(p2) is type(p)
        assert getattr(p2, "precision", None) == getattr(p, "precision", None)


def test_new_channels_receive_gradients_and_parameter_counts():
    p, bn, c, x = _pair("conv2d_groups", torch.float64)
    p2, c2, bn2 = widen_pair(p, c, 12, bn)
    net = _net(p2, bn2, c2)
    net(x).square().sum().backward()
    # the consumer's weights from the new channels (zero-initialised) get a gradient; with
    # producer groups 2 and consumer groups 3 the channels move in lcm = 6 blocks
    fresh = growth.Widening.plan(6, 12, 6).fresh
    assert fresh.tolist() == [1, 3, 5, 7, 9, 11]
    for j in fresh.tolist():
        rows = slice(j // 4 * 3, j // 4 * 3 + 3)  # the consumer group reading channel j
        assert c2.weight[rows, j % 4].abs().sum() == 0
        assert c2.weight.grad[rows, j % 4].abs().sum() > 0
    assert p2.weight.numel() == 12 * 2 * 9 and c2.weight.numel() == 9 * 4 * 9
    assert bn2.running_var[6:].eq(1).all() or bn2.running_var.numel() == 12


def test_groups_must_divide_the_new_width():
    p, bn, c, x = _pair("conv2d_groups", torch.float64)
    with pytest.raises(fastconv.ConvError, match="multiple of 6"):
        widen_pair(p, c, 10, bn)
    with pytest.raises(fastconv.ConvError, match="init"):
        widen_pair(p, c, 12, bn, init="random")


class _Residual(nn.Module):
    """A ResNet basic block (conv1/bn1/conv2/bn2) with an identity shortcut."""

    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


def _aspp(c=4):
    def branch(d):
        return nn.Sequential(nn.Conv2d(c, 6, 3, padding=d, dilation=d), nn.BatchNorm2d(6),
                             nn.ReLU(), nn.Conv2d(6, 5, 1))
    return nn.Sequential(MultiBranch([branch(1), branch(2), nn.Sequential(
        nn.Conv2d(c, 3, 1), nn.ReLU(), nn.Conv2d(3, 4, 1))], merge="concat"),
        nn.Conv2d(14, 3, 1))


@pytest.mark.filterwarnings("ignore:grow_width")
@pytest.mark.parametrize("init", ["zero", "net2net"])
def test_blocks_keep_their_function(init):
    torch.manual_seed(0)
    for net, x in ((nn.Sequential(_Residual(4), _Residual(4)), torch.randn(2, 4, 6, 7)),
                   (_aspp(), torch.randn(2, 4, 9, 8)),
                   (nn.Sequential(nn.Conv2d(3, 4, 1), MultiBranch(
                       [nn.Sequential(nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(6, 4, 3, padding=1)),
                        nn.Sequential(nn.Conv2d(4, 2, 1))], scale=0.2)),
                    torch.randn(2, 3, 5, 5))):
        net = net.double().eval()
        x = x.double()
        want = net(x)
        report = grow_width(net, 2.0, init=init, generator=torch.Generator().manual_seed(0))
        assert report.grown and not report.failed
        _close(net(x), want, torch.float64)
        net.train()
        net(x).sum().backward()  # backward after growth


def test_multibranch_projections_are_identity_never_padding():
    mb = MultiBranch([nn.Conv2d(3, 5, 1), nn.Conv2d(3, 2, 1)], scale=0.5).double()
    assert isinstance(mb.projections[0], nn.Identity)
    proj = mb.projections[1]
    assert isinstance(proj, nn.Conv2d) and proj.weight.requires_grad
    x = torch.randn(1, 3, 4, 4, dtype=torch.float64)
    b0, b1 = mb.branches[0](x), mb.branches[1](x)
    want = 0.5 * (b0 + torch.cat([b1, torch.zeros_like(b0[:, :3])], 1)) / 2
    _close(mb(x), want, torch.float64)


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.Adam(p, lr=1e-3), lambda p: torch.optim.AdamW(p, lr=1e-3),
    lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9)], ids=["Adam", "AdamW", "SGD"])
def test_optimizer_state_is_carried(make):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                        nn.Conv2d(4, 2, 1)).double()
    opt = make(net.parameters())
    x = torch.randn(2, 3, 5, 5, dtype=torch.float64)
    for _ in range(3):
        opt.zero_grad()
        net(x).square().mean().backward()
        opt.step()
    old_w = net[0].weight
    old_state = {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[old_w].items()}
    grow_width(net, 2.0, optimizer=opt)
    new_w = net[0].weight
    assert new_w.shape[0] == 8 and old_w not in opt.state
    st = opt.state[new_w]
    moments = [k for k in ("exp_avg", "exp_avg_sq", "momentum_buffer") if k in old_state]
    assert moments and all(torch.equal(st[k][:4], old_state[k]) and st[k][4:].abs().sum() == 0
                           for k in moments)
    if "step" in old_state:
        assert float(st["step"]) == float(old_state["step"]) == 3
    assert any(p is new_w for g in opt.param_groups for p in g["params"])
    opt.zero_grad()
    net(x).square().mean().backward()
    opt.step()  # training continues with the carried state


def test_without_optimizer_a_warning_says_to_rebuild_it():
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Conv2d(4, 2, 1))
    with pytest.warns(UserWarning, match="rebuild the optimizer"):
        grow_width(net, 2.0)


def test_failures_leave_everything_unchanged():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.Conv2d(4, 6, 3, groups=2),
                        nn.Conv2d(6, 2, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.randn(1, 3, 5, 5)).sum().backward()
    opt.step()
    before = copy.deepcopy(net.state_dict())
    params = [p for g in opt.param_groups for p in g["params"]]
    with pytest.raises(GrowthError, match="multiple of 2") as info:
        grow_width(net, {"0": 8, "2": 7}, optimizer=opt)  # 7 is not a multiple of 2 groups
    assert info.value.report.failed and "2" in dict(info.value.report.failed)
    after = net.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert [p for g in opt.param_groups for p in g["params"]] == params


@pytest.mark.filterwarnings("ignore:grow_width")
def test_on_error_drop_removes_failing_branches_after_the_pass():
    good = nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU(), nn.Conv2d(4, 4, 1))
    bad = nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU(), nn.Conv2d(4, 4, 1, groups=2))
    also_bad = nn.Sequential(nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1, groups=2))
    mb = MultiBranch([bad, good, also_bad])  # odd widths cannot split into 2 groups
    report = grow_width(mb, {"branches.0.0": 5, "branches.1.0": 8, "branches.2.0": 7},
                        on_error="drop")
    assert [b for b, _ in report.dropped] == ["branches.0", "branches.2"]
    assert len(mb.branches) == 1 and mb.branches[0][0].out_channels == 8
    mb(torch.randn(1, 4, 3, 3)).sum().backward()


def test_training_grows_every_epoch_and_the_loss_decreases():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        MultiBranch([nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8),
                                   nn.ReLU(), nn.Conv2d(8, 8, 1)),
                     nn.Sequential(nn.Conv2d(8, 4, 1), nn.ReLU(), nn.Conv2d(4, 6, 1))],
                    scale=0.5),
        nn.Conv2d(8, 2, 1)).to(DEVICE)
    x = torch.randn(16, 3, 8, 8, device=DEVICE)
    target = torch.randn(16, 2, 8, 8, device=DEVICE)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):  # epochs
        for _step in range(20):
            opt.zero_grad()
            loss = (net(x) - target).square().mean()
            loss.backward()
            opt.step()
        losses.append(float(loss.detach()))
        with torch.no_grad():
            before = net.eval()(x)
        grow_width(net, 1.5, optimizer=opt)
        with torch.no_grad():
            _close(net(x), before, torch.float32)
        net.train()
    assert losses[-1] < losses[0] * 0.8, losses
    assert net[3].branches[0][0].out_channels > 8 and net[3].branches[1][0].out_channels > 4


def test_widen_batchnorm_and_single_layers():
    bn = nn.BatchNorm2d(4, eps=1e-3, momentum=0.3)
    bn.num_batches_tracked += 5
    b2 = growth.widen_batchnorm(bn, 6)
    assert b2.eps == 1e-3 and b2.momentum == 0.3 and int(b2.num_batches_tracked) == 5
    assert b2.running_var[4:].eq(1).all() and b2.weight[4:].eq(1).all()
    conv = nn.Conv2d(4, 3, 3)
    wide = growth.widen_conv_in(conv, 6)
    assert wide.in_channels == 6 and torch.equal(wide.weight[:, :4], conv.weight)
    assert wide.weight[:, 4:].abs().sum() == 0
    out = growth.widen_conv_out(conv, 5, noise=0.1)
    assert torch.equal(out.weight[:3], conv.weight) and out.out_channels == 5
    tconv = nn.ConvTranspose2d(4, 6, 3, groups=2)  # output channels on the grouped axis 1
    for init in ("zero", "net2net"):
        wide = growth.widen_conv_out(tconv, 10, init=init, noise=0.1)
        assert wide.weight.shape == (4, 5, 3, 3)
        assert torch.equal(wide.weight[:, :3], tconv.weight)  # old channels untouched
    with pytest.raises(fastconv.ConvError, match="convolution module"):
        growth.widen_conv_out(nn.Linear(3, 3), 4)


@pytest.mark.parametrize("arg,match", [
    ({"0": 8, "nosuch": 4}, r"\['nosuch'\] name no layer grow_width can grow \(producers "
                            r"found: 0"),
    ({"0": 0}, "widths must be positive ints"),
    ({"0": 8.0}, "widths must be positive ints"),
    (0.5, "must be at least 1"),
    ("2", "expected a real number"),
])
def test_a_bad_factor_or_mapping_is_an_error_and_changes_nothing(arg, match):
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Conv2d(4, 2, 1))
    before = copy.deepcopy(net.state_dict())
    with pytest.raises(fastconv.ConvError, match=match):
        grow_width(net, arg)
    after = net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


class _IssueNet(nn.Module):
    """The network of issue 24: a stem feeding two branches that meet through an identity
    1x1 projection (the 12-wide branch) and an Identity (the 8-wide one)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.block = MultiBranch([nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()),
                                  nn.Sequential(nn.Conv2d(8, 12, 1), nn.BatchNorm2d(12),
                                                nn.ReLU())], out_channels=8)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))

    def forward(self, x):
        return self.head(self.block(self.stem(x)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("training", [False, True])
def test_a_branch_grows_into_its_projection(dtype, training):
    """A branch's last conv (and its BatchNorm) feeding the MultiBranch projection is a
    pair: the projection keeps the identity on the old channels and zero on the new, so the
    function is preserved, in train and eval; gradients reach the new channels."""
    torch.manual_seed(0)
    net = _IssueNet().to(DEVICE, dtype).train(training)
    with torch.no_grad():
        bn = net.block.branches[1][1]
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
    x = torch.randn(4, 3, 9, 7, device=DEVICE, dtype=dtype)
    with torch.no_grad():
        before = copy.deepcopy(net)(x)  # (a copy: training mode updates statistics)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    report = grow_width(net, 2.0, optimizer=opt)
    # the stem feeds both branches' first convolutions: one producer, two consumers (the
    # dataflow of a torch.fx trace); branch 0's conv reaches the MultiBranch mean itself
    assert report.grown == [("stem.0", 8, 16), ("block.branches.1.0", 12, 24)]
    assert [b[0].in_channels for b in net.block.branches] == [16, 16]
    assert net.stem[1].num_features == 16
    proj = net.block.projections[1]
    assert proj.in_channels == 24 and net.block.branches[1][1].num_features == 24
    assert torch.equal(proj.weight[:, :8, 0, 0], torch.eye(8, device=DEVICE, dtype=dtype))
    assert proj.weight[:, 12:].abs().sum() == 0
    with torch.no_grad():
        _close(net(x), before, dtype)
    net(x).square().mean().backward()
    assert proj.weight.grad[:, 12:].abs().sum() > 0  # the new channels learn
    opt.step()


def test_a_dropped_branch_takes_its_widened_projection_with_it():
    good = nn.Sequential(nn.Conv2d(4, 6, 1), nn.ReLU())
    bad = nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU(), nn.Conv2d(4, 6, 1, groups=2))
    mb = MultiBranch([bad, good], out_channels=4)
    opt = torch.optim.SGD(mb.parameters(), lr=0.1, momentum=0.9)
    mb(torch.randn(1, 4, 3, 3)).sum().backward()
    opt.step()
    report = grow_width(mb, {"branches.0.0": 5, "branches.0.2": 8, "branches.1.0": 8},
                        optimizer=opt, on_error="drop")
    assert [b for b, _ in report.dropped] == ["branches.0"]
    assert len(mb.branches) == 1 and mb.projections[0].in_channels == 8
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    assert {id(p) for p in mb.parameters()} <= held
    mb(torch.randn(1, 4, 3, 3)).sum().backward()


@pytest.mark.filterwarnings("ignore:grow_width")
def test_the_report_names_every_convolution_it_did_not_grow():
    torch.manual_seed(0)
    net = _IssueNet()
    report = grow_width(net, {"block.branches.1.0": 16})
    assert report.grown == [("block.branches.1.0", 12, 16)]
    reasons = dict(report.not_grown)
    # the stem (a producer: the mapping keeps it); branch 0 meets the others in the
    # MultiBranch mean through an Identity; the projection feeds it too
    assert set(reasons) == {"stem.0", "block.branches.0.0", "block.projections.1"}
    assert reasons["stem.0"] == "its width stays 8"
    assert reasons["block.branches.0.0"].startswith("stacked (stack) with other tensors")
    assert "not grown block.projections.1: stacked" in str(report)
    net2 = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Conv2d(4, 2, 1))
    report = grow_width(net2, {"0": 4})  # the mapping keeps its width
    assert report.grown == [] and dict(report.not_grown) == {
        "0": "its width stays 4",
        "1": "its output is the model's output: growing it would change that width"}


# ------------------------------------------------------ pairs from the dataflow (torch.fx)
def _random_norms(net):
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return net


def _convs(net):
    return {n for n, m in net.named_modules() if isinstance(m, nn.modules.conv._ConvNd)}


@pytest.mark.filterwarnings("ignore:grow_width")
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v2"])
@pytest.mark.slow_after(2)
def test_torchvision_models_grow_and_compute_what_they_did(name, training):
    """The dataflow finds the producers of real models: a block's inner convolutions (with
    torchvision's one ReLU module called three times), MobileNetV2's expansions through
    their depthwise convolutions, the last convolution into the classifier's Linear, and
    the producers residual adds tie to one width (a stage's stem or downsample and every
    block's last convolution), grown together. Every convolution but the depthwise ones
    grows; the function is kept in float64 within 1e-10, in train and eval; the consumers'
    new weights learn."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    net = _random_norms(getattr(torchvision.models, name)(num_classes=10)).double()
    for m in net.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0  # (a mask over a widened vector is another random draw)
    net.train(training)
    # Batch 4: in train mode the last stage's BatchNorms (1x1 maps at 32x32) normalise over the
    # batch alone, and over 2 values the float64 function amplifies a 1e-15 change of its input
    # to 3e-8 (resnet50) or 7e-9 (mobilenet_v2), above the bound; over 4 values to 2e-12 and 3e-12
    x = torch.randn(4, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        before = copy.deepcopy(net)(x)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    report = grow_width(net, 1.5, optimizer=opt)
    assert {p for p, *_ in report.grown} | {p for p, _ in report.not_grown} == _convs(net)
    assert not report.notes and report.not_grown == [
        (n, "depthwise: its width is its input's, it grows with that producer")
        for n, m in net.named_modules() if isinstance(m, nn.Conv2d) and m.groups > 1]
    assert all(b == math.ceil(a * 1.5) for _, a, b in report.grown)
    with torch.no_grad():
        _close(net(x), before, torch.float64)
    net(x).square().mean().backward()
    opt.step()
    if name == "resnet18":  # a stage's residual stream: stem, downsample, last convs
        tied = ("layer2.0.downsample.0", "layer2.0.conv2", "layer2.1.conv2")
        assert all(dict((p, b) for p, _, b in report.grown)[n] == 192 for n in tied)
        assert {"layer3.0.conv1", "layer3.0.downsample.0", "layer2.1.conv1"} <= set(
            report.widened["layer2.0.conv2"])
        assert net.layer3[0].downsample[0].weight.grad[:, 128:].abs().sum() > 0
    if name == "mobilenet_v2":  # expansion -> depthwise -> projection: all three grew
        block = net.features[2].conv
        assert block[0][0].out_channels == block[1][0].groups == block[2].in_channels == 144
        assert net.classifier[1].in_features == 1920
        assert net.classifier[1].weight.grad[:, 1280:].abs().sum() > 0


@pytest.mark.filterwarnings("ignore:grow_width")
@pytest.mark.parametrize("init", ["zero", "net2net"])
@pytest.mark.parametrize("name,grown", [("densenet121", 120), ("googlenet", 57),
                                        ("efficientnet_b0", 65), ("regnet_y_400mf", 85)])
@pytest.mark.slow_after(3)
def test_concatenating_and_gated_zoo_models_grow_in_training(name, grown, init):
    """torchvision's DenseNet (each layer's output concatenated onto the running tensor,
    a BatchNorm over it), GoogLeNet (Inception blocks), EfficientNet (squeeze-excitation:
    a gate multiplies the expansion's channels, which ties the gate's convolution to them;
    stochastic depth) and RegNetY: every convolution but the depthwise ones grows, the
    training-mode function is kept within 1e-10 in float64, the classifier's new inputs
    learn."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    kw = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
    net = _random_norms(getattr(torchvision.models, name)(num_classes=10, **kw)).double()
    for m in net.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    with torch.no_grad():
        torch.manual_seed(1)  # (the same stochastic-depth draws before and after)
        before = copy.deepcopy(net)(x)
    opt = torch.optim.AdamW(net.parameters())
    report = grow_width(net, 1.5, optimizer=opt, init=init,
                        generator=torch.Generator().manual_seed(0))
    assert len(report.grown) == grown and not report.notes
    assert all("depthwise" in why for _, why in report.not_grown)
    torch.manual_seed(1)
    out = net(x)
    _close(out.detach(), before, torch.float64)
    out.square().mean().backward()
    fc = [m for m in net.modules() if isinstance(m, nn.Linear)][-1]
    old_in = fc.in_features * 2 // 3
    assert fc.weight.grad[:, old_in:].abs().sum() > 0
    opt.step()


class _Inception(nn.Module):
    """Branches concatenated (each at its channel offset), a BatchNorm and a depthwise
    convolution over the concatenation, a nested concatenation, a pooled Linear head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 1)
        self.a = nn.Conv2d(6, 4, 1)
        self.b = nn.Sequential(nn.Conv2d(6, 4, 1), nn.ReLU(), nn.Conv2d(4, 5, 3, padding=1))
        self.c = nn.Sequential(nn.Conv2d(6, 3, 1), nn.BatchNorm2d(3))
        self.bn = nn.BatchNorm2d(12)
        self.dw = nn.Conv2d(12, 12, 3, padding=1, groups=12)
        self.mix = nn.Conv2d(12, 7, 1)
        self.side = nn.Conv2d(6, 2, 1)
        self.fc = nn.Linear(21, 3)

    def forward(self, x):
        s = torch.relu(self.stem(x))
        y = torch.cat([self.a(s), self.b(s), self.c(s)], 1)  # offsets 0, 4, 9
        y = self.dw(torch.relu(self.bn(y)))
        z = torch.cat([self.side(s), torch.cat([self.mix(y), y], dim=1)], 1)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(z, 1), 1))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("init", ["zero", "net2net"])
@pytest.mark.parametrize("training", [False, True])
def test_concatenations_grow_at_their_channel_offsets(training, init, dtype):
    """Each producer's channels are widened where they sit inside every concatenation they
    reach (nested ones too), with the norms and depthwise convolutions over it; the others'
    channels move up. The function is kept; the new weights learn; Adam's state follows."""
    torch.manual_seed(0)
    net = _random_norms(_Inception()).to(dtype).train(training)
    x = torch.randn(2, 3, 5, 7, dtype=dtype)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    net(x).square().mean().backward()
    opt.step()  # (moments to carry)
    opt.zero_grad()
    with torch.no_grad():
        before = copy.deepcopy(net)(x)
    report = grow_width(net, 2.0, optimizer=opt, init=init,
                        generator=torch.Generator().manual_seed(3))
    assert [p for p, *_ in report.grown] == ["stem", "a", "b.0", "b.2", "c.0", "side", "mix"]
    assert set(report.widened["a"]) == {"a", "bn", "dw", "mix", "fc"} - {"a"}
    assert net.bn.num_features == net.dw.groups == net.mix.in_channels == 24
    assert net.fc.in_features == 4 + 14 + 24
    assert dict(report.not_grown) == {
        "dw": "depthwise: its width is its input's, it grows with that producer"}
    with torch.no_grad():
        _close(net(x), before, dtype)
    net(x).square().mean().backward()
    assert net.mix.weight.grad[:, 4:8].abs().sum() > 0  # from a's new channels (offset 0)
    assert net.fc.weight.grad[:, 4 + 14 + 12 + 5:4 + 14 + 12 + 10].abs().sum() > 0  # b.2's
    opt.step()


def test_concatenations_and_ties_that_cannot_grow_say_why():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 4, 1)
            self.b = nn.Conv2d(3, 3, 1)
            self.c = nn.Conv2d(3, 5, 1)
            self.d = nn.Conv2d(7, 2, 1)
            self.e = nn.Conv2d(4, 3, 1)
            self.f = nn.Conv2d(6, 2, 1)
            self.g = nn.Conv2d(3, 4, 1)
            self.h = nn.Conv2d(3, 2, 1)

        def forward(self, x):
            u = self.d(torch.cat([x, self.a(x)], 1))  # x's width: unknown
            v = self.h(self.b(x) + x)  # b is tied to the model's input
            w = self.f(torch.cat([self.c(x), self.c(x)], 2))  # c is called twice
            t = self.e(torch.cat([self.g(x), x], 2))  # along the height
            return u, v, w, t

    reasons = dict(grow_width(Net(), 2.0).not_grown)
    assert "cannot tell how many channels x has" in reasons["a"]
    assert reasons["b"] == "a residual add ties its width to the model's input (x)"
    assert reasons["c"] == "called 2 times in the forward (a shared module)"
    assert reasons["g"] == "concatenated (cat_2) along dim 2, not the channels"


def test_tied_producers_take_one_width_from_a_mapping():
    net = torchvision_free_resnet()
    with pytest.raises(ConvError, match="tied to one width by residual adds"):
        grow_width(net, {"stem": 8, "body.2": 12})
    with pytest.warns(UserWarning, match="rebuild"):
        report = grow_width(net, {"body.2": 12})
    assert report.grown == [("stem", 6, 12), ("body.2", 6, 12)]


def torchvision_free_resnet():
    class Res(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 6, 3, padding=1)
            self.body = nn.Sequential(nn.Conv2d(6, 4, 1), nn.ReLU(), nn.Conv2d(4, 6, 1))
            self.head = nn.Conv2d(6, 2, 1)

        def forward(self, x):
            s = self.stem(x)
            return self.head(torch.relu(s + self.body(s)))

    return Res()


def test_a_concatenating_multibranch_grows_its_branches():
    torch.manual_seed(0)
    block = MultiBranch([nn.Conv2d(4, 3, 1), nn.Sequential(nn.Conv2d(4, 5, 3, padding=1),
                                                           nn.ReLU())], merge="concat")
    net = nn.Sequential(nn.Conv2d(3, 4, 1), block, nn.Conv2d(8, 2, 1)).double()
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    before = net(x).detach()
    with pytest.warns(UserWarning, match="rebuild"):
        report = grow_width(net, 2.0)
    assert [p for p, *_ in report.grown] == ["0", "1.branches.0", "1.branches.1.0"]
    assert block.out_channels == 16 == net[2].in_channels
    _close(net(x), before, torch.float64)


def test_a_fused_conv_bn_act_chain_grows_through_the_dataflow():
    torch.manual_seed(0)
    net = nn.Sequential(ConvBNAct2d(3, 4, 3, padding=1, activation="relu"),
                        ConvBNAct2d(4, 6, 1, activation="silu"), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(6, 3)).double()
    _random_norms(net).eval()
    x = torch.randn(2, 3, 6, 5, dtype=torch.float64)
    with torch.no_grad():
        before = net(x)
    with pytest.warns(UserWarning, match="rebuild the optimizer"):
        report = grow_width(net, 2.0)
    assert report.grown == [("0", 4, 8), ("1", 6, 12)]  # the second into the Linear
    assert "grown 1: 6 -> 12 channels, with 4" in str(report)
    assert net[0].bn.num_features == 8 and net[4].in_features == 12
    with torch.no_grad():
        _close(net(x), before, torch.float64)


def test_a_linear_reading_a_flattened_map_is_not_a_consumer():
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 9, 2))
    report = grow_width(net, 2.0)
    assert report.grown == [] and "36 features from 4 channels" in dict(report.not_grown)["0"]


def test_a_model_fx_cannot_trace_falls_back_to_the_module_walk():
    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.Conv2d(4, 2, 1))

        def forward(self, x):
            return self.body(x) if x.sum() > 0 else -self.body(x)

    net = DataDependent()
    with pytest.warns(UserWarning, match="rebuild the optimizer"):
        report = grow_width(net, 2.0)
    assert report.grown == [("body.0", 4, 8)]
    assert "torch.fx could not trace the model" in report.notes[0] and "module walk" in str(report)


@pytest.mark.filterwarnings("ignore:grow_width")
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_an_optimized_model_grows_like_the_original(mode):
    """fastconv.optimize's fused layers (a residual passed into a fused layer ties its
    width, as an add does): every convolution grows, as in torchvision's resnet18."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    net = _random_norms(torchvision.models.resnet18(num_classes=10)).double()
    opt = fastconv.optimize(net.train(mode == "training"), mode, "ieee")
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        before = copy.deepcopy(opt)(x)
    report = grow_width(opt, 1.5)
    assert len(report.grown) == 20 and not report.notes and not report.not_grown
    widths = {p: b for p, _, b in report.grown}
    assert widths["model.layer2_0_conv2_bn_act"] == widths["model.layer2_1_conv2_bn_act"] \
        == widths[next(p for p in widths if "downsample" in p and "layer2" in p)] == 192
    with torch.no_grad():
        _close(opt(x), before, torch.float64)


@pytest.mark.slow
def test_the_growth_example_runs_and_keeps_the_loss_across_growths(tmp_path):
    import re
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "examples/grow_multibranch.py", "--steps", "30",
                          "--out", str(tmp_path / "loss.png")], capture_output=True, text=True,
                         timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr
    pairs = re.findall(r"loss ([0-9.]+) before, ([0-9.]+) after", out.stdout)
    assert len(pairs) == 2 and all(a == b for a, b in pairs), out.stdout
