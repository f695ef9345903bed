"""Cached call plans (functional._PLANS, keyed by a call's signature) are reused only when every
property a check depends on is the same, and the checks that depend on data pointers run on
every call. Each case changes one property after a cached call and compares with torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fastconv
from fastconv import functional
from fastconv.precision import relative_error

_BACKENDS = ("aten", "triton")


def _ref(x, w, b=None, **kw):
    return F.conv2d(x.double(), w.double(), None if b is None else b.double(), **kw)


@pytest.fixture(autouse=True)
def _fresh_plans():
    functional.clear_plans()
    yield
    functional.clear_plans()


@pytest.mark.parametrize("backend", _BACKENDS)
def test_each_signature_change_gets_its_own_checked_plan(backend):
    w = torch.randn(4, 3, 3, 3)
    calls = [
        torch.randn(2, 3, 7, 6),                                            # first sight
        torch.randn(2, 3, 7, 6),                                            # reused
        torch.randn(1, 3, 9, 5),                                            # shape
        torch.randn(2, 3, 7, 12)[..., ::2],                                 # strides
        torch.randn(2, 3, 7, 6).contiguous(memory_format=torch.channels_last),  # layout
    ]
    for x in calls:
        y = fastconv.conv2d(x, w, padding=1, backend=backend, precision="ieee")
        assert relative_error(y, _ref(x, w, padding=1)) < 1e-5
    assert len(functional._PLANS) == 4  # one plan per distinct signature, the repeat reused
    x64 = torch.randn(2, 3, 7, 6, dtype=torch.float64)  # dtype: the weight must follow
    with pytest.raises(fastconv.ConvError, match="dtype"):
        fastconv.conv2d(x64, w, padding=1, backend=backend)
    y = fastconv.conv2d(x64, w.double(), padding=1, backend=backend)
    assert relative_error(y, _ref(x64, w, padding=1)) < 1e-12


@pytest.mark.parametrize("backend", _BACKENDS)
def test_the_tf32_flag_is_part_of_the_signature(backend):
    x, w = torch.randn(2, 3, 7, 6), torch.randn(4, 3, 3, 3)
    old = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = False  # precision=None: ieee now
        fastconv.conv2d(x, w, padding=1, backend=backend)
        torch.backends.cudnn.allow_tf32 = True  # tf32 now: another plan
        fastconv.conv2d(x, w, padding=1, backend=backend)
    finally:
        torch.backends.cudnn.allow_tf32 = old
    precisions = {plan.problem.precision for plan in functional._PLANS.values()}
    assert len(precisions) == 2, precisions


@pytest.mark.parametrize("backend", _BACKENDS)
def test_pointer_checks_run_on_every_cached_call(backend):
    """out= and the operands: same signature, other memory. The overlap checks depend on the
    data pointers, so a cached plan must still run them."""
    x, w = torch.randn(1, 4, 5, 5), torch.randn(4, 4, 1, 1)
    out = torch.empty(1, 4, 5, 5)
    fastconv.conv2d(x, w, out=out, backend=backend, precision="ieee")  # cached, no overlap
    with pytest.raises(fastconv.ConvError, match="overlaps input"):
        fastconv.conv2d(x, w, out=x, backend=backend, precision="ieee")
    res = torch.randn(1, 4, 5, 5)
    fastconv.conv2d(x, w, residual=res, out=out, backend=backend, precision="ieee")
    with pytest.raises(fastconv.ConvError, match="overlaps residual"):
        fastconv.conv2d(x, w, residual=res, out=res, backend=backend, precision="ieee")


@pytest.mark.parametrize("backend", _BACKENDS)
def test_a_module_follows_in_place_updates_and_data_swaps(backend):
    conv = fastconv.nn.Conv2d(3, 4, 3, padding=1, backend=backend, precision="ieee").eval()
    x = torch.randn(2, 3, 6, 7)
    with torch.no_grad():
        conv(x)
        conv.weight.mul_(-2.0)  # in place: the version counter moves
        assert relative_error(conv(x), _ref(x, conv.weight, conv.bias, padding=1)) < 1e-5
        conv.weight.data = torch.randn(4, 3, 3, 3)  # a new tensor behind the Parameter
        assert relative_error(conv(x), _ref(x, conv.weight, conv.bias, padding=1)) < 1e-5
        conv.bias.data = torch.randn(4)
        assert relative_error(conv(x), _ref(x, conv.weight, conv.bias, padding=1)) < 1e-5


@pytest.mark.parametrize("backend", _BACKENDS)
def test_requires_grad_switches_to_the_autograd_path(backend):
    x, w = torch.randn(2, 3, 6, 5), torch.randn(4, 3, 3, 3)
    fastconv.conv2d(x, w, padding=1, backend=backend, precision="ieee")  # cached, no grad
    xg = x.clone().requires_grad_()
    y = fastconv.conv2d(xg, w, padding=1, backend=backend, precision="ieee")
    g = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, xg, g)
    xr = x.double().requires_grad_()
    (want,) = torch.autograd.grad(F.conv2d(xr, w.double(), padding=1), xr, g.double())
    assert relative_error(dx, want) < 1e-5
