"""GPU: every zoo model (issue 22's list, random weights) through optimize in bf16
channels-last, as the models bench runs them: every conv -> BatchNorm pattern fused, the
output within 2x torch bf16's own error against a float64 run (the issue's bound), the
CUDA-graph replay equal to the eager call, and the original's checkpoint loading into the
optimized model. Small inputs (batch 4, 64x64; DeepLab 96x96)."""

import pytest
import torch

import fastconv
from fastconv.precision import relative_error
from fastconv.tools.bench import models

pytestmark = pytest.mark.gpu
pytest.importorskip("torchvision")


@pytest.mark.parametrize("key", [k for k in models.BUILDERS  # (the image models)
                                 if k not in models.SEQUENCE_MODELS])
def test_zoo_model_in_bf16_within_torch_s_error(key):
    if key.startswith("timm_"):
        pytest.importorskip("timm")
    torch.manual_seed(0)
    model = models.BUILDERS[key]().eval().cuda()
    size = 96 if key.startswith("deeplab") else 64
    x = torch.randn(4, 3, size, size, device="cuda")
    with torch.no_grad():
        want = models.output(model.double()(x.double()))
        model = model.float().to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", torch.bfloat16):
            torch_err = relative_error(models.output(model(x)), want)
        fast = fastconv.optimize(model, "inference", "bf16")
        fused, eligible, _ = fast.report.coverage()
        assert fused == eligible, str(fast.report)
        eager = models.output(fast(x))
        assert relative_error(eager, want) <= 2 * torch_err, (relative_error(eager, want),
                                                               torch_err)
        graphed = fastconv.optimize(model, "inference", "bf16", cuda_graph=True)
        graphed(x)  # captured
        replayed = models.output(graphed(x))
        assert relative_error(replayed, want) <= 2 * torch_err
        fast.load_state_dict(model.state_dict())  # the original's checkpoint
        assert relative_error(models.output(fast(x)), eager) < 1e-3
