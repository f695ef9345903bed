"""dw_wgrad.py's channels-last depthwise weight gradient against float64 torch: poisoned
outputs, odd sizes, rank 1 and 2, strides, multipliers, column dilation, kernels taller
than the input, strips of rows shorter than the image, and the same bits on every run."""

import pytest
import torch

from fastconv.backends.triton import depthwise, dw_wgrad
from fastconv.backends.triton.backend import TritonBackend
from fastconv.backends.triton.launchargs import Geometry
from fastconv.precision import relative_error
from fastconv.problem import ConvProblem
from test_dw_roll import CASES as ROLL_CASES
from test_dw_roll import _cl, _ref

# dw_roll's cases (the kernel takes row strides 1 and 2: its stride-3 case has stride 2 here)
CASES = [(2, 6, 1, (6, 5), 1, 2, 0, 1) if case[5] == 3 else case for case in ROLL_CASES]
CONFIGS = [depthwise.DwConfig(4, 8, 4, roll=3), depthwise.DwConfig(2, 4, 1, roll=64)]

PAIRS = [(case, CONFIGS[0]) for case in CASES] + [(CASES[i], CONFIGS[1]) for i in (1, 3, 7)]


@pytest.mark.parametrize(("case", "config"), PAIRS,
                         ids=lambda v: v.name() if isinstance(v, depthwise.DwConfig)
                         else f"r{len(v[3])}k{v[4]}s{v[5]}m{v[2]}")
@pytest.mark.slow_after(2)
def test_weight_gradient(case, config):
    n, c, mult, spatial, k, stride, padding, dilation = case
    x = _cl(torch.randn(n, c, *spatial, dtype=torch.float64, requires_grad=True).detach())
    w = torch.randn(c * mult, 1, *([k] * len(spatial)), dtype=torch.float64,
                    requires_grad=True)
    y = _ref(x, w, stride, padding, dilation, c)
    g = _cl(torch.randn_like(y))
    (want,) = torch.autograd.grad(y, w, g)
    problem = ConvProblem.from_tensors(x, w.detach(), None, stride, padding, dilation, c,
                                       rank=len(spatial))
    assert TritonBackend.config_errors(problem, config, "wgrad") == []
    bound = TritonBackend.bind(problem, config, "wgrad")
    dw = torch.full_like(w, float("nan"))  # poisoned
    bound(g, x, dw)
    assert not dw.isnan().any()
    assert relative_error(dw, want) < 1e-12
    if len(spatial) == 2 and n > 1:  # several images per program, one partial each
        dw = torch.full_like(w, float("nan"))
        dw_wgrad.launch_wgrad(g, x, dw, Geometry((stride,) * 2, (padding,) * 2, (1, dilation)),
                              config=config, int64=False, images=n)
        assert relative_error(dw, want) < 1e-12


def test_same_bits_every_run_and_plan_allocated_result():
    x = _cl(torch.randn(3, 5, 9, 8))
    g = _cl(torch.randn(3, 5, 9, 8))
    w = torch.randn(5, 1, 3, 3)
    problem = ConvProblem.from_tensors(x, w, None, 1, 1, 1, 5, rank=2)
    bound = TritonBackend.bind(problem, CONFIGS[0], "wgrad")
    runs = [bound(g, x, None) for _ in range(2)]  # allocated by the plan
    assert torch.equal(runs[0], runs[1])  # partials summed in a fixed order
    want = torch.nn.grad.conv2d_weight(x.double(), w.shape, g.double(), 1, 1, groups=5)
    assert runs[0].shape == w.shape and relative_error(runs[0], want) < 1e-5

def test_fp32_accumulation_of_half_inputs():
    x = _cl(torch.randn(2, 5, 9, 7).to(torch.bfloat16))
    w = torch.randn(5, 1, 3, 3)
    g = _cl(torch.randn(2, 5, 9, 7).to(torch.bfloat16))
    want = torch.nn.grad.conv2d_weight(x.double(), w.shape, g.double(), 1, 1, groups=5)
    problem = ConvProblem.from_tensors(x, w.to(torch.bfloat16), None, 1, 1, 1, 5, rank=2)
    dw = TritonBackend.bind(problem, CONFIGS[0], "wgrad")(g, x, None)
    assert dw.dtype == torch.bfloat16
    assert relative_error(dw, want) < 1e-2  # the bf16 rounding of the result
