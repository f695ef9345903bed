"""A call whose tensors are on another GPU than the current one runs with that GPU current
(fastconv's kernels, cuDNN handles, streams and timings are the current device's). Without
two GPUs the guard itself is simulated: each entry point's ``elsewhere`` says "device 1"
until ``torch.cuda.device(1)`` is entered, and the test checks that every public entry
re-enters under it, once, and computes exactly what the unguarded call computes (every
argument passed through). ``test_gpu_devices.py`` runs the real thing on two GPUs."""

import contextlib

import pytest
import torch

import fastconv
from fastconv import decode, devices, functional, longconv, seqconv
from fastconv.nn import conv as nn_conv
from fastconv.nn import fused as nn_fused
from fastconv.optimize import model as opt_model

MODULES = (functional, nn_conv, nn_fused, seqconv, decode, longconv, opt_model)


@pytest.fixture
def other_device(monkeypatch):
    """A function that makes every entry point see its input on device 1 until device 1 is
    made current; it returns the list of devices entered."""
    entered, current = [], [None]

    def elsewhere(t):
        return 1 if isinstance(t, torch.Tensor) and current[0] != 1 else None

    @contextlib.contextmanager
    def device(index):
        entered.append(index)
        before, current[0] = current[0], index
        try:
            yield
        finally:
            current[0] = before

    def activate():
        for module in MODULES:
            monkeypatch.setattr(module, "elsewhere", elsewhere)
        monkeypatch.setattr(torch.cuda, "device", device)
        return entered
    return activate


def _calls():
    torch.manual_seed(0)
    x2, w2 = torch.randn(2, 3, 7, 9), torch.randn(4, 3, 3, 3)
    x1 = torch.randn(2, 4, 11)
    wd = torch.randn(4, 3)
    mean, var = torch.randn(4), torch.rand(4) + 0.5
    gamma, beta = torch.randn(4), torch.randn(4)
    init = torch.randn(2, 4, 2)
    ids = torch.tensor([[0] * 5 + [1] * 6, [0] * 11], dtype=torch.int32)
    state = torch.randn(2, 4, 3)
    conv = fastconv.nn.Conv2d(3, 4, 3, padding=1).eval()
    fused = fastconv.nn.ConvBNAct2d(3, 4, 3, padding=1, activation="silu").eval()
    optimized = fastconv.optimize(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3),
                                                      torch.nn.ReLU()))
    return {
        "conv2d": lambda: functional.conv2d(x2, w2, gamma, stride=2, padding=1,
                                            activation="relu"),
        "conv1d": lambda: functional.conv1d(x1, torch.randn(4, 2, 3), None, padding=2,
                                            dilation=2, groups=2),
        "conv_transpose2d": lambda: functional.conv_transpose2d(x2, torch.randn(3, 4, 3, 3),
                                                                stride=2, output_padding=1),
        "conv_bn_act2d": lambda: functional.conv_bn_act2d(
            x2, w2, None, mean, var, gamma, beta, padding=1, activation="silu"),
        "explain": lambda: str(functional.explain(x2, w2, None, 1, 1)).count("\n"),
        "nn.Conv2d": lambda: conv(x2),
        "nn.ConvBNAct2d": lambda: fused(x2),
        "causal_conv1d": lambda: seqconv.causal_conv1d(
            x1, wd, None, ids, init, True, "silu"),
        "causal_conv1d_update": lambda: decode.causal_conv1d_update(
            x1[..., :2], state.clone(), wd, torch.randn(4), "silu"),
        "long_conv1d": lambda: longconv.long_conv1d(x1, torch.randn(4, 8), torch.randn(4)),
        "optimize": lambda: optimized(x2),
    }


@pytest.mark.parametrize("name", list(_calls()))
def test_every_entry_point_runs_with_its_inputs_device_current(name, other_device):
    torch.manual_seed(1)
    want = _calls()[name]()
    torch.manual_seed(1)
    calls = _calls()
    entered = other_device()
    got = calls[name]()
    assert entered and set(entered) == {1}, entered
    flat = torch.utils._pytree.tree_leaves
    for a, b in zip(flat(got), flat(want), strict=True):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), name
        else:
            assert a == b, name


def test_elsewhere_is_none_for_cpu_tensors_and_non_tensors():
    assert devices.elsewhere(torch.randn(2)) is None
    assert devices.elsewhere(None) is None
    assert devices.elsewhere(3) is None
