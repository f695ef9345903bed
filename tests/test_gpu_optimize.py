"""GPU tests of fastconv.optimize at real sizes: DeepLabV3-ResNet50 at 512x512 in tf32 and
bf16 (channels-last) against a float64 run, within twice torch's own error; the CUDA-graph
path equal to eager; a training step's output and gradients."""

import pytest
import torch

from fastconv.bench import models
from fastconv.optimize import optimize
from fastconv.precision import TOLERANCE, Precision, relative_error

pytestmark = pytest.mark.gpu
tv = pytest.importorskip("torchvision")


@pytest.mark.parametrize("precision", [Precision.TF32, Precision.BF16], ids=str)
def test_deeplab_inference_at_512(precision, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", precision == Precision.TF32)
    torch.manual_seed(0)
    model = models._deeplab().cuda().eval()
    x = torch.randn(2, 3, 512, 512, device="cuda")
    truth = models.float64_truth(model, x)
    rows = models.run_case(models.ModelCase("dl", "deeplabv3_r50", 2, 512),
                           ["torch", "fastconv"], precision, "eval", device="cuda")
    by = {r["provider"]: r for r in rows}
    assert "error" not in by["fastconv"], by["fastconv"].get("error")
    assert by["fastconv"]["rel_err"] <= max(TOLERANCE[precision], 2 * by["torch"]["rel_err"])
    fast = optimize(model, "inference", precision.value, cuda_graph=True)
    graphed = optimize(model, "inference", precision.value)
    with torch.no_grad():
        a, b = fast(x)["out"], graphed(x)["out"]
        a2 = fast(x + 1)["out"]  # a second replay with other inputs
        b2 = graphed(x + 1)["out"]
    assert relative_error(a, b) < 1e-6 and relative_error(a2, b2) < 1e-6
    assert relative_error(a.double(), truth) <= max(TOLERANCE[precision],
                                                   2 * by["torch"]["rel_err"])


def test_resnet50_training_step_matches_torch():
    torch.manual_seed(0)
    model = tv.models.resnet50().cuda().train()
    fast = optimize(model, "training", "ieee")
    x = torch.randn(8, 3, 224, 224, device="cuda")
    torch.backends.cudnn.allow_tf32 = False
    try:
        ya, yb = fast(x), model(x)
        assert relative_error(ya, yb) < 1e-4
        ga = torch.autograd.grad(ya.square().mean(), fast.model.conv1_bn_act.weight)
        gb = torch.autograd.grad(yb.square().mean(), model.conv1.weight)
        assert relative_error(ga[0], gb[0]) < 1e-3
    finally:
        torch.backends.cudnn.allow_tf32 = True
