"""fastconv.optimize on torchvision models (small inputs, CPU): the same outputs in eval, the
same gradients in training, the expected fusions in the report, and each edge case left
alone or handled."""

import pytest
import torch
from torch import nn

from fastconv.nn import ConvBNAct2d
from fastconv.optimize import optimize
from fastconv.precision import relative_error

tv = pytest.importorskip("torchvision")


def _out(y):
    return y["out"] if isinstance(y, dict) else y


@pytest.mark.parametrize("name,ctor,fused,left", [
    ("resnet18", lambda: tv.models.resnet18(), 20, 0),
    ("resnet50", lambda: tv.models.resnet50(), 53, 0),
    ("mobilenet_v3_small", lambda: tv.models.mobilenet_v3_small(), 34, 18),  # SE fc convs
    ("deeplabv3_resnet50", lambda: tv.models.segmentation.deeplabv3_resnet50(
        weights=None, weights_backbone=None, num_classes=5), 60, 1),
])
def test_inference_matches_and_reports_the_fusions(name, ctor, fused, left):
    torch.manual_seed(0)
    model = ctor().eval()
    opt = optimize(model, "inference", precision="ieee")
    assert len(opt.report.fused) == fused and len(opt.report.left) == left, str(opt.report)
    assert all(p.startswith("conv -> bn") for _, p in opt.report.fused)
    for batch in (2, 1):  # batch 1: DeepLab's ASPP pooling branch normalises a 1x1 map
        x = torch.randn(batch, 3, 48, 40)
        with torch.no_grad():
            assert relative_error(_out(opt(x)), _out(model(x))) < 1e-5
    assert model.training is False and not any(
        isinstance(m, ConvBNAct2d) for m in model.modules())  # the original is untouched


def test_training_matches_outputs_gradients_and_running_stats():
    torch.manual_seed(0)
    model = tv.models.resnet18(num_classes=7).train()
    opt = optimize(model, "training", precision="ieee")
    assert opt.training and sum("add -> relu" in p for _, p in opt.report.fused) == 8
    x = torch.randn(3, 3, 40, 36)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = opt(xa), model(xb)
    assert relative_error(ya, yb) < 1e-5
    g = torch.randn_like(ya)
    ga = torch.autograd.grad(ya, (xa, opt.model.conv1_bn_act.weight,
                                  opt.model.layer4_1_conv2_bn_act.bn.weight), g)
    gb = torch.autograd.grad(yb, (xb, model.conv1.weight, model.layer4[1].bn2.weight), g)
    for a, b in zip(ga, gb):
        assert relative_error(a, b) < 1e-4
    assert relative_error(opt.model.conv1_bn_act.bn.running_mean, model.bn1.running_mean) < 1e-5


class _Reused(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(self.bn(self.conv(x))))  # the same modules twice


class _Forked(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv(x)
        return torch.relu(self.bn(y)) + y  # the conv output is used twice


class _Branchy(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())

    def forward(self, x):
        return self.body(x) if x.sum() > -1e9 else x


@pytest.mark.parametrize("model,reason", [
    (_Reused(), "more than one path"),
    (_Forked(), "used 2 times"),
    (nn.Sequential(nn.ConvTranspose2d(4, 4, 2, 2), nn.BatchNorm2d(4)), "transposed"),
])
def test_cases_that_would_change_the_result_are_left_with_a_reason(model, reason):
    torch.manual_seed(0)
    for mode in ("inference", "training"):
        opt = optimize(model, mode, precision="ieee")
        assert not opt.report.fused and any(reason in why for _, why in opt.report.left), \
            str(opt.report)
        x = torch.randn(2, 4, 6, 6)
        with torch.no_grad():
            assert relative_error(opt(x), model.train(mode == "training")(x)) < 1e-5


def test_frozen_batchnorm_in_a_training_model_keeps_its_running_statistics():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1),
                          nn.BatchNorm2d(2)).train()
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
    model[1].eval()  # frozen statistics, as in fine-tuning
    opt = optimize(model, "training", precision="ieee")
    fused = [m for m in opt.modules() if isinstance(m, ConvBNAct2d)]
    assert [m.training for m in fused] == [False, True]
    x = torch.randn(2, 3, 7, 7)
    assert relative_error(opt(x), model(x)) < 1e-5
    assert relative_error(fused[0].bn.running_mean, model[1].running_mean) == 0


def test_untraceable_model_fuses_sequential_chains_and_says_so():
    model = _Branchy().eval()
    opt = optimize(model, "inference", precision="ieee", cuda_graph=True)
    assert any("could not trace" in n for n in opt.report.notes)
    assert opt.report.fused == [("body.0", "conv -> bn -> relu")]
    if not torch.cuda.is_available():
        assert any("cuda_graph" in n for n in opt.report.notes)
    x = torch.randn(2, 3, 5, 5)
    with torch.no_grad():
        assert relative_error(opt(x), model(x)) < 1e-5


def test_a_failed_training_capture_is_said_when_it_happens(monkeypatch):
    """A training step whose CUDA-graph capture fails runs eagerly: a RuntimeWarning says so
    at that call (not only the report, read after the fact), and the buffers the warm-up
    touched are restored."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    opt = optimize(model, "training", precision="ieee", cuda_graph=True)

    def refuse(*args, **kwargs):
        raise RuntimeError("capture refused\nsecond line")
    monkeypatch.setattr(torch.cuda, "make_graphed_callables", refuse)
    before = [b.clone() for b in opt.model.buffers()]
    with pytest.warns(RuntimeWarning, match=r"training capture failed .*\(2, 3, 7, 7\).*"
                                            r"capture refused\); running eagerly"):
        assert opt._train_graph((torch.randn(2, 3, 7, 7),)) is None
    assert opt.report.notes[-1].startswith("cuda_graph: training capture failed")
    assert all(torch.equal(a, b) for a, b in zip(opt.model.buffers(), before))


def test_a_training_graph_captured_while_kernels_build_is_captured_again(monkeypatch):
    """A training graph captured while chosen kernels were still compiling (their layers
    ran stand-ins) is captured again at the first call after the builds are done, and kept
    from then on; one captured with nothing building is kept."""
    from fastconv import dispatch

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    opt = optimize(model, "training", precision="ieee", cuda_graph=True)
    captures = []

    def capture(module, args):
        captures.append(len(captures))
        return lambda *a: captures[-1]
    monkeypatch.setattr(torch.cuda, "make_graphed_callables", capture)
    building = [True]
    monkeypatch.setattr(dispatch, "building", lambda: building[0])
    x = torch.randn(2, 3, 7, 7)
    assert opt._train_graph((x,))(x) == 0
    assert opt._train_graph((x,))(x) == 0  # still building: the same graph
    building[0] = False
    assert opt._train_graph((x,))(x) == 1  # built: captured again
    assert opt._train_graph((x,))(x) == 1
    assert len(captures) == 2
    y = torch.randn(1, 3, 9, 9)  # captured with nothing building: kept
    assert opt._train_graph((y,))(y) == 2
    building[0] = True
    assert opt._train_graph((y,))(y) == 2
    building[0] = False
    assert opt._train_graph((y,))(y) == 2 and len(captures) == 3


def test_a_model_holding_fastconv_modules_is_traced_with_them_as_leaves():
    """Traced into, ConvBNAct2d's forward met the tracer's proxies: the trace failed after
    the layer had counted a training step on the copy."""
    model = nn.Sequential(ConvBNAct2d(3, 4, 3), nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4),
                          nn.ReLU()).train()
    opt = optimize(model, "training", precision="ieee")
    assert not any("could not trace" in n for n in opt.report.notes)
    assert opt.report.fused == [("0", "already a ConvBNAct2d"), ("1", "conv -> bn -> relu")]
    assert opt.report.coverage() == (2, 2, 2)
    assert int(opt.state_dict()["0.bn.num_batches_tracked"]) == 0


def test_bad_arguments():
    from fastconv import ConvError

    with pytest.raises(ConvError, match="mode"):
        optimize(nn.Conv2d(1, 1, 1), "train")
    with pytest.raises(ConvError, match="precision"):
        optimize(nn.Conv2d(1, 1, 1), precision="fp8")


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_segmentation_demo_runs_checks_and_writes_a_png(train, tmp_path, capsys,
                                                        monkeypatch):
    pytest.importorskip("matplotlib")
    from fastconv import batchnorm
    from fastconv.tools import demo

    # the batch-norm passes as torch operations: the Triton interpreter would take minutes
    # over DeepLab's 60 layers (the kernels have their own tests)
    monkeypatch.setattr(batchnorm, "USE_TRITON", torch.cuda.is_available())

    png = tmp_path / "demo.png"
    assert demo.run(size=32, reps=1, train=train, out=str(png), num_classes=4) == 0
    text = capsys.readouterr().out
    assert "fastconv.optimize" in text and "DISAGREES" not in text
    # the speed-up divides torch eager in the same precision, and the table says so
    baseline = [line for line in text.splitlines() if line.endswith("(baseline)")]
    assert len(baseline) == 1 and baseline[0].startswith("torch eager")
    if not torch.cuda.is_available():
        assert "No CUDA GPU found" in text and "Speed needs an NVIDIA GPU" in text
        assert "skipped: no GPU" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_demo_runs_a_classifier_and_refuses_unknown_models(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from fastconv import ConvError
    from fastconv.tools import demo

    assert demo.run("resnet18", size=32, reps=1, out=str(tmp_path / "c.png")) == 0
    assert "top-1" in capsys.readouterr().out
    with pytest.raises(ConvError, match="--model: got 'resnet_nine'"):
        demo.run("resnet_nine")
    with pytest.raises(ConvError, match="--batch: got 1"):
        demo.run(batch=1, train=True)


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_models_suite_rows(mode, monkeypatch):
    from fastconv import batchnorm
    from fastconv.precision import Precision
    from fastconv.tools.bench import models

    monkeypatch.setattr(batchnorm, "USE_TRITON", torch.cuda.is_available())
    case = models.shrink(models.CASES[2])  # resnet50
    rows = models.run_case(case, ["torch", "fastconv", "cudnn_fe"], Precision.IEEE, mode,
                           device="cpu")
    by = {r["provider"]: r for r in rows}
    assert "not a models provider" in by["cudnn_fe"]["error"]
    for p in ("torch", "fastconv"):
        assert "error" not in by[p], by[p].get("error")
        # against float64: torch's own error and fastconv's, same order
        assert by[p]["rel_err"] < (1e-5 if mode == "eval" else 1e-3)
        assert by[p]["timing"] == "not measured (no GPU)"
        assert by[p]["prepare_s"] > 0 and by[p]["first_call_s"] > 0
    # (heuristic dispatch on the CPU: nothing timed, nothing built)
    assert by["fastconv"]["first_call_timing_s"] == by["fastconv"]["first_call_build_wait_s"] == 0
    assert "first_call_timing_s" not in by["torch"]
    assert by["fastconv"]["choice"] == "53 fused, 0 left"
