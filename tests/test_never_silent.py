"""Cases that once returned a wrong result without a word (float64 against torch, on the CPU):
attributes changed after a call, grad-mode and autocast regions, hooks, models fx cannot
trace, scripted parts, checkpoints of optimized models, pickling, width growth with an
optimizer and tied weights. Each gives torch's result, or a clear refusal."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

import fastconv
from fastconv.growth import GrowthError, MultiBranch, grow_width
from fastconv.precision import relative_error


def _randomized(model: nn.Module) -> nn.Module:
    """``model`` with BatchNorm statistics and affine parameters away from their
    initial values (an identity BatchNorm hides a missing fold)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return model


def _block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out),
                         nn.ReLU())


# ---------------------------------------------------------- attributes changed after a call
CHANGES = {"stride": (2, 2), "dilation": (2, 2), "padding": (2, 0), "groups": 2}


@pytest.mark.parametrize("attr", sorted(CHANGES))
@pytest.mark.parametrize("kind", ["conv", "conv_bn_eval", "conv_bn_train"])
def test_a_geometry_attribute_set_after_a_call_is_read_at_the_next(kind, attr):
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, padding=1).double()
    if kind == "conv":
        ours = fastconv.nn.Conv2d(4, 6, 3, padding=1).double()
        ours.load_state_dict(conv.state_dict())
        ref = conv
    else:
        ref = _randomized(nn.Sequential(conv, nn.BatchNorm2d(6).double(), nn.ReLU()))
        ref.train(kind == "conv_bn_train")
        ours = fastconv.nn.ConvBNAct2d.from_torch(ref)
    x = torch.randn(2, 4, 11, 9, dtype=torch.double)
    with torch.no_grad():
        ours(x)
        value = CHANGES[attr]
        for m in (ours, conv):
            setattr(m, attr, value)
            if attr == "groups":
                m.weight = nn.Parameter(m.weight[:, :2].clone())
        if attr == "groups":
            ours.weight = conv.weight
        want, got = ref(x), ours(x)
    assert got.shape == want.shape
    assert relative_error(got, want) < 1e-12


def test_a_stride_set_in_an_optimized_training_step_is_read_at_the_next():
    """The step's kept convolution plan (bf16 autocast, CPU) is made again."""
    torch.manual_seed(0)
    model = nn.Sequential(_block(3, 4), nn.Conv2d(4, 5, 3, padding=1))
    fast = fastconv.optimize(model, "training", "bf16", channels_last=False)
    x = torch.randn(2, 3, 9, 9)
    for _ in range(2):  # the second step runs the kept entries
        fast(x).sum().backward()
    sites = [m.__dict__["_callsite"] for m in fast.modules() if "_callsite" in m.__dict__]
    assert any(s.step_conv is not None or s.step_entry is not None for s in sites)
    for m in list(model.modules()) + list(fast.modules()):
        if isinstance(m, nn.Conv2d):
            m.stride = (2, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(x)
    got = fast(x)
    assert got.shape == want.shape == (2, 5, 3, 3)
    assert relative_error(got, want) < 2e-2


# ------------------------------------------------------------------- grad and autocast regions
class _StopGradient(nn.Module):
    """A teacher branch under no_grad, as distillation and stop-gradient code write it."""

    def __init__(self):
        super().__init__()
        self.student = _block(3, 4)
        self.teacher = nn.Sequential(_block(4, 4), nn.Conv2d(4, 4, 1))

    def forward(self, x):
        x = self.student(x)
        with torch.no_grad():
            target = self.teacher(x)
        return (x - target).square()


class _Float32Head(nn.Module):
    """A head kept in float32 inside a bf16 model; the region sits in a submodule."""

    def __init__(self):
        super().__init__()
        self.body = _block(3, 4)
        self.head = _Head()

    def forward(self, x):
        return self.head(self.body(x))


class _Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = _block(4, 4)
        self.b = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        with torch.autocast("cpu", enabled=False):
            return self.b(self.a(x.float()))


def test_a_no_grad_region_gives_no_gradient():
    torch.manual_seed(0)
    model = _StopGradient()
    fast = fastconv.optimize(model, "training", "ieee", channels_last=False)
    x = torch.randn(2, 3, 8, 8)
    model(x).sum().backward()
    fast(x).sum().backward()
    got = dict(fast.named_parameters())
    for name, p in model.named_parameters():
        if p.grad is None:
            assert got[name].grad is None, name
        else:
            assert relative_error(got[name].grad, p.grad) < 1e-5, name
    assert any("grad mode" in n for n in fast.report.notes), str(fast.report)


def test_an_autocast_disabled_region_stays_float32():
    torch.manual_seed(0)
    model = _randomized(_Float32Head()).eval()
    fast = fastconv.optimize(model, "inference", "bf16", channels_last=False)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(x)
    with torch.no_grad():
        got = fast(x)
    assert got.dtype == want.dtype == torch.float32
    assert relative_error(got, want) < 2e-2
    assert any(n.startswith("head kept as it is") for n in fast.report.notes), str(fast.report)
    assert any(name.startswith("body") for name, _ in fast.report.fused)  # outside: fused


# -------------------------------------------------------------------------------- hooks
def _hooked(where: str) -> nn.Module:
    model = nn.Sequential(_block(3, 4), nn.Identity(), nn.Dropout(0.0), _block(4, 4))
    target = {"conv": model[0][0], "bn": model[0][1], "act": model[0][2],
              "identity": model[1], "dropout": model[2], "root": model}[where]

    def bend(module, args, out):  # (neither undone by a BatchNorm nor by a ReLU)
        return out.cos()
    target.register_forward_hook(bend)
    return model


@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("where", ["conv", "bn", "act", "identity", "dropout", "root"])
def test_forward_hooks_keep_running(where, mode):
    torch.manual_seed(0)
    model = _randomized(_hooked(where)).train(mode == "training")
    fast = fastconv.optimize(model, mode, "ieee", channels_last=False)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert relative_error(fast(x), model(x)) < 1e-5


def test_a_forward_pre_hook_on_a_block_traced_into_runs_at_each_call():
    """Not its value at the trace, frozen into the graph: it runs, reading its state."""
    torch.manual_seed(0)
    model = _randomized(nn.Sequential(_block(3, 4), _block(4, 4))).eval()
    shift = [1.0]
    model[1].register_forward_pre_hook(lambda m, args: (args[0] + shift[0],))
    fast = fastconv.optimize(model, "inference", "ieee", channels_last=False)
    shift[0] = -3.0
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert relative_error(fast(x), model(x)) < 1e-5


# ------------------------------------------------------------------- models fx cannot trace
class _ReachesIn(nn.Module):
    """Calls a Sequential's children one by one, with an op between them, and has
    data-dependent control flow, so that fx cannot trace it."""

    def __init__(self):
        super().__init__()
        self.seq = _block(3, 4)

    def forward(self, x):
        y = self.seq[0](x)
        if y.sum() > -1e9:  # always; a Proxy cannot be branched on
            y = y * 3 - 1
        return self.seq[2](self.seq[1](y))


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_the_walk_fuses_only_a_sequential_called_as_a_whole(mode):
    torch.manual_seed(0)
    model = _randomized(_ReachesIn()).train(mode == "training")
    fast = fastconv.optimize(model, mode, "ieee", channels_last=False)
    assert any("could not trace" in n for n in fast.report.notes)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert relative_error(fast(x), model(x)) < 1e-5
        assert relative_error(fast.model.seq(x), model.seq(x)) < 1e-5  # as a whole: fused


# ---------------------------------------------------------------------- scripted submodules
class _WithScript(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = _block(3, 4)
        self.s = torch.jit.script(_block(4, 4))

    def forward(self, x):
        return self.s(self.a(x))


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
def test_a_scripted_submodule_keeps_its_parameters_and_trains():
    torch.manual_seed(0)
    model = _WithScript()
    fast = fastconv.optimize(model, "training", "ieee", channels_last=False)
    assert [n for n, _ in fast.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert set(fast.state_dict()) == set(model.state_dict())
    x = torch.randn(2, 3, 8, 8)
    fast(x).sum().backward()
    model(x).sum().backward()
    got = dict(fast.named_parameters())
    for name, p in model.named_parameters():
        assert relative_error(got[name].grad, p.grad) < 1e-5, name


# --------------------------------------------------------------------- checkpoints, pickling
@pytest.mark.filterwarnings("ignore:grow_width")
def test_a_versioned_model_loads_an_optimized_checkpoint():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.mnasnet0_5().eval()
    fast = fastconv.optimize(model, "inference", "ieee", channels_last=False)
    state = fast.state_dict()
    assert state._metadata[""] == {"version": 2}  # MNASNet's own
    assert state._metadata["layers.1"]["version"] == 2  # a BatchNorm's
    fresh = torchvision.models.mnasnet0_5().eval()
    fresh.load_state_dict(state)
    again = fastconv.optimize(torchvision.models.mnasnet0_5().eval(), "inference", "ieee",
                              channels_last=False)
    again.load_state_dict(model.state_dict())
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert relative_error(fresh(x), model(x)) == 0
        assert relative_error(again(x), model(x)) < 1e-5


class _Reordered(nn.Module):
    """A module whose parameters a rewrite would move (a fused chain between two plain
    layers, a flattened nested module)."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 3)
        self.body = nn.Sequential(nn.Sequential(nn.Conv2d(3, 4, 3)), nn.BatchNorm2d(4),
                                  nn.ReLU(), nn.Conv2d(4, 4, 3, bias=True))
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return self.head(self.body(x).mean((2, 3))) * self.scale


def test_an_optimizer_checkpoint_resumes_on_the_optimized_model():
    torch.manual_seed(0)
    model = _Reordered()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 9, 9)).sum().backward()
    sgd.step()
    saved = copy.deepcopy(sgd.state_dict())
    fast = fastconv.optimize(model, "training", "ieee", channels_last=False)
    assert [n for n, _ in fast.named_parameters()] == [n for n, _ in model.named_parameters()]
    ref = copy.deepcopy(model)
    nets = []
    for net in (ref, fast):
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        opt.load_state_dict(copy.deepcopy(saved))
        nets.append((net, opt))
    x = torch.randn(2, 3, 9, 9)
    for net, opt in nets:
        net(x).sum().backward()
        opt.step()
    got = dict(fast.named_parameters())
    for name, p in ref.named_parameters():
        assert relative_error(got[name], p) < 1e-6, name


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_an_optimized_model_pickles_after_a_call(mode):
    torch.manual_seed(0)
    model = _randomized(nn.Sequential(_block(3, 4), nn.Conv2d(4, 4, 3))).train(
        mode == "training")
    fast = fastconv.optimize(model, mode, "bf16", channels_last=False)
    x = torch.randn(2, 3, 8, 8)
    want = fast(x)
    for load in (lambda f: pickle.loads(pickle.dumps(f)), copy.deepcopy, _torch_round_trip):
        again = load(fast)
        assert torch.equal(again(x), want) if mode == "inference" else \
            relative_error(again(x), want) < 2e-2
    conv = fastconv.nn.Conv2d(3, 4, 3)
    conv(x)
    assert torch.equal(pickle.loads(pickle.dumps(conv))(x), conv(x))


def _torch_round_trip(module):
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


# ----------------------------------------------------------------------------------- growth
def test_growth_leaves_the_optimizer_holding_every_parameter():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                        nn.Conv2d(4, 5, 3, padding=1, bias=True))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    bias = net[3].bias
    grow_width(net, 2.0, optimizer=opt)
    held = [p for g in opt.param_groups for p in g["params"]]
    assert {id(p) for p in held} == {id(p) for p in net.parameters()}
    assert net[3].bias is bias  # not widened: the very tensor


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 1))
        self.b = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 1))
        self.b[0].weight = self.a[0].weight

    def forward(self, x):
        return self.a(x) + self.b(x)


class _Aliased(nn.Module):
    """A producer registered under two names, the forward calling the second."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)
        self.b = nn.Conv2d(4, 2, 1)
        self.alias = self.a

    def forward(self, x):
        return self.b(self.alias(x))


class _SpatialLinear(nn.Module):
    """A Linear over the last spatial axis, whose size equals the channels."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.conv(x))


@pytest.mark.parametrize("make", [_Tied, _Aliased])
def test_growth_refuses_a_layer_held_under_two_names_and_changes_nothing(make):
    torch.manual_seed(0)
    net = make()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    before = copy.deepcopy(net.state_dict())
    with pytest.raises(GrowthError, match="tied|registered under 2 names"):
        grow_width(net, 2.0, optimizer=opt)
    after = net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    if make is _Tied:
        assert net.b[0].weight is net.a[0].weight


@pytest.mark.filterwarnings("ignore:grow_width")
def test_growth_grows_no_linear_that_does_not_read_channels():
    net = _SpatialLinear()
    report = grow_width(net, 2.0)
    assert not report.grown
    assert "global pooling" in dict(report.not_grown)["conv"]
    assert net(torch.randn(1, 3, 4, 4)).shape == (1, 4, 4, 2)


def test_growth_that_would_drop_every_branch_changes_nothing():
    bad = nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU(), nn.Conv2d(4, 4, 1, groups=2))
    also_bad = nn.Sequential(nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1, groups=2))
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), MultiBranch([bad, also_bad]),
                        nn.Conv2d(4, 2, 1))
    before = copy.deepcopy(net.state_dict())
    with pytest.raises(GrowthError, match="every branch"):
        grow_width(net, {"0": 8, "2.branches.0.0": 5, "2.branches.1.0": 7}, on_error="drop")
    after = net.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k])
                                                 for k in before)


# -------------------------------------------------------------------- settings and the CLI
@pytest.mark.parametrize("name, value", [("FASTCONV_TUNE_BUDGET", "abc"),
                                         ("FASTCONV_WORKSPACE_MB", "nan"),
                                         ("FASTCONV_CACHE_DIR", "FILE")])
def test_a_bad_setting_is_named_at_first_use(name, value, tmp_path):
    import subprocess
    import sys

    if value == "FILE":
        value = str(tmp_path / "a-file")
        (tmp_path / "a-file").write_text("")
    code = ("import torch, fastconv\n"
            "print('imported')\n"
            "from fastconv import workspace\n"
            "x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)\n"
            "fastconv.conv2d(x, w, dispatch='benchmark')\n"
            "workspace.limit()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**__import__("os").environ, name: value,
                               "TRITON_INTERPRET": "1"})
    assert done.returncode != 0 and done.stdout.strip() == "imported"
    assert done.stderr.strip().splitlines()[-1].startswith(f"fastconv.errors.ConvError: "
                                                           f"{name}: got"), done.stderr


def test_imported_plans_never_evict_the_machines_own(tmp_path, monkeypatch):
    from fastconv import plancache

    monkeypatch.setenv("FASTCONV_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(plancache, "DISK_ENTRIES", 4)
    cache = plancache.PlanCache(file_name="test-plans.json")
    for i in range(3):
        cache.put(f"own{i}", {"backend": "aten", "config": None}, persist=True)
    taken = cache.merge({f"imported{i}": {"backend": "aten", "config": None, "used": i}
                         for i in range(5)} | {"own0": {"backend": "triton"}})
    assert taken == 1
    fresh = plancache.PlanCache(file_name="test-plans.json")
    keys = set(fresh._load())
    assert keys == {"own0", "own1", "own2", "imported4"}
    assert fresh._load()["own0"]["backend"] == "aten"
    snapshot = fresh.snapshot()
    fresh.merge({"x": {"backend": "aten"}})
    fresh.restore(snapshot)
    assert set(plancache.PlanCache(file_name="test-plans.json")._load()) == keys


def test_explain_validates_before_it_allocates(capsys):
    from fastconv.tools import cli

    assert cli.main(["explain", "--input", "64,1024,1024,1024",
                     "--weight", "64,1024,3,3"]) == 2
    assert "GiB" in capsys.readouterr().err
    assert cli.main(["explain", "--input", "2,4,8,8", "--weight", "6,3,3,3"]) == 2
    assert "weight" in capsys.readouterr().err

