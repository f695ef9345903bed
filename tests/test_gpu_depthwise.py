"""GPU tests of the depthwise kernels at the benchmark suites' sizes (depthwise,
conv1d_short): forward, data and weight gradients against float64 in fp32, bf16 and fp16,
channels-first and channels-last, and every tile candidate on one layer."""

import pytest
import torch
import torch.nn.functional as F

import fastconv
from fastconv.backends.triton import depthwise
from fastconv.bench import suites
from fastconv.precision import TOLERANCE, Precision, relative_error

pytestmark = pytest.mark.gpu

CASES = [c for c in suites.get("depthwise") + suites.get("conv1d_short") if c.groups == c.c]
PRECISIONS = {torch.float32: Precision.IEEE, torch.bfloat16: Precision.BF16,
              torch.float16: Precision.FP16}


def _tensors(case, dtype, channels_last, n=4):
    x = torch.randn(n, case.c, *case.spatial, device="cuda").to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 \
            else x.transpose(1, 2).contiguous().transpose(1, 2)
    w = (torch.randn(case.k, 1, *case.kernel, device="cuda") / case.kernel[0]).to(dtype)
    return x.requires_grad_(), w.requires_grad_()


def _conv(case, x, w, fn_fast):
    pad = case.padding_arg()
    if fn_fast:
        conv = fastconv.conv1d if case.rank == 1 else fastconv.conv2d
        return conv(x, w, None, case.stride, pad, case.dilation, case.groups,
                    backend="triton", precision=PRECISIONS[x.dtype].value)
    if case.causal:
        x, pad = F.pad(x, pad[0]), 0
    conv = F.conv1d if case.rank == 1 else F.conv2d
    return conv(x, w, None, case.stride, pad, case.dilation, case.groups)


@pytest.mark.parametrize("channels_last", [False, True], ids=["cfirst", "clast"])
@pytest.mark.parametrize("dtype", list(PRECISIONS), ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_and_gradients_at_suite_sizes(case, dtype, channels_last):
    x, w = _tensors(case, dtype, channels_last)
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y, ref = _conv(case, x, w, True), _conv(case, xr, wr, False)
    tol = TOLERANCE[PRECISIONS[dtype]]
    assert relative_error(y, ref) <= tol
    g = torch.randn_like(ref)
    got = torch.autograd.grad(y, (x, w), g.to(dtype))
    want = torch.autograd.grad(ref, (xr, wr), g)
    assert relative_error(got[0], want[0]) <= tol, "dx"
    assert relative_error(got[1], want[1]) <= tol, "dw"


@pytest.mark.parametrize("channels_last", [False, True], ids=["cfirst", "clast"])
def test_every_candidate_is_correct(channels_last):
    case = suites.get("depthwise")[3]  # stride 2
    x, w = _tensors(case, torch.bfloat16, channels_last)
    ref = _conv(case, x.detach().double(), w.detach().double(), False)
    problem = fastconv.ConvProblem.from_tensors(x, w, None, case.stride, case.padding,
                                                case.dilation, case.groups, rank=2)
    from fastconv.backends.triton.backend import TritonBackend

    configs = TritonBackend.candidates(problem)
    assert configs and all(isinstance(c, depthwise.DwConfig) for c in configs)
    for config in configs:
        out = torch.full(problem.output_shape(), float("nan"), device="cuda",
                         dtype=torch.bfloat16)
        if channels_last:
            out = out.contiguous(memory_format=torch.channels_last)
        TritonBackend.bind(problem, config)(x.detach(), w.detach(), None, None, None, None,
                                            out)
        assert relative_error(out, ref) <= TOLERANCE[Precision.BF16], config.name()
