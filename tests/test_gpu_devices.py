"""Tensors on a second GPU while the first is current (model parallelism in one process,
without ``torch.cuda.set_device``): every route runs on the tensors' GPU and gives torch's
result there (``fastconv.devices``). Needs two GPUs; skipped otherwise."""

from __future__ import annotations

import pytest
import torch

import fastconv
from fastconv.precision import TOLERANCE, Precision, relative_error

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]

BOUND = TOLERANCE[Precision.BF16]


@pytest.fixture(autouse=True)
def first_gpu_current():
    before = torch.cuda.current_device()
    torch.cuda.set_device(0)
    yield
    torch.cuda.synchronize(1)
    torch.cuda.set_device(before)


@pytest.mark.parametrize("backend", ["auto", "triton", "cudnn", "aten"])
def test_conv2d_and_its_gradients_on_the_second_gpu(backend):
    if backend == "cudnn" and not fastconv.backends.REGISTRY["cudnn"].available()[0]:
        pytest.skip("no cuDNN frontend here")
    x = torch.randn(3, 16, 17, 19, device="cuda:1", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(24, 16, 3, 3, device="cuda:1", dtype=torch.bfloat16, requires_grad=True)
    act = "none" if backend == "cudnn" else "relu"  # (cuDNN runs bare convolutions only)
    out = fastconv.conv2d(x, w, None, padding=1, activation=act, backend=backend)
    g = torch.randn_like(out)
    out.backward(g)
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = torch.nn.functional.conv2d(xd, wd, None, padding=1)
    ref = torch.relu(ref) if act == "relu" else ref
    ref.backward(g.double())
    assert out.device == torch.device("cuda:1") and torch.cuda.current_device() == 0
    assert relative_error(out, ref) < BOUND
    assert relative_error(x.grad, xd.grad) < BOUND and relative_error(w.grad, wd.grad) < BOUND


def test_sequence_convolutions_on_the_second_gpu():
    x = torch.randn(2, 64, 1031, device="cuda:1", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(64, 4, device="cuda:1", dtype=torch.bfloat16, requires_grad=True)
    out = fastconv.causal_conv1d(x, w, activation="silu")
    out.float().sum().backward()
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = torch.nn.functional.silu(torch.nn.functional.conv1d(
        xd, wd.unsqueeze(1), padding=3, groups=64)[..., :1031])
    ref.sum().backward()
    assert relative_error(out, ref) < BOUND and relative_error(x.grad, xd.grad) < BOUND
    assert relative_error(w.grad, wd.grad) < BOUND
    long_w = torch.randn(64, 700, device="cuda:1", dtype=torch.bfloat16) / 30
    y = fastconv.long_conv1d(x.detach(), long_w)
    want = torch.nn.functional.conv1d(torch.nn.functional.pad(x.detach().double(), (699, 0)),
                                      long_w.double().flip(-1).unsqueeze(1), groups=64)
    assert relative_error(y, want) < BOUND
    state = torch.randn(2, 64, 3, device="cuda:1", dtype=torch.bfloat16)
    token = torch.randn(2, 64, device="cuda:1", dtype=torch.bfloat16)
    step = fastconv.causal_conv1d_update(token, state.clone(), w.detach(), None, "silu")
    window = torch.cat([state, token.unsqueeze(-1)], -1).double()
    assert relative_error(step, torch.nn.functional.silu(
        (window * w.detach().double()).sum(-1))) < BOUND


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_an_optimized_model_on_the_second_gpu(cuda_graph):
    net = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.BatchNorm2d(16),
                              torch.nn.ReLU(), torch.nn.Conv2d(16, 8, 1)).to("cuda:1")
    x = torch.randn(4, 8, 15, 15, device="cuda:1")
    for mode in ("inference", "training"):
        net.train(mode == "training")
        ref_net = net.double()
        want = ref_net(x.double())
        net.float()
        opt = fastconv.optimize(net, mode, "bf16", cuda_graph=cuda_graph)
        for _ in range(3):  # eager, capture, replay
            got = opt(x)
        assert got.device == torch.device("cuda:1")
        assert relative_error(got, want) < BOUND, (mode, cuda_graph)
