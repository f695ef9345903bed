"""NaN and Inf propagate as in torch (DESIGN.md §4): same positions, same signs of infinity,
for every backend and epilogue.

Two documented differences, both about which torch path is the reference:
* at a *padded* tap a kernel multiplies the zero padding by the weight, so a non-finite weight
  gives NaN there, as torch's dense convolutions do (im2col on the CPU, implicit GEMM);
  torch's CPU depthwise kernel skips padded taps instead (see test_padded_taps below);
* ``gelu(+inf)``: torch's float32 CPU kernel returns NaN, its float64 and CUDA kernels
  +inf, as the Triton epilogue does (the aten backend is torch, NaN on the CPU).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fastconv
from fastconv.epilogue import ACTIVATIONS, activate

_BACKENDS = ("aten", "triton")


def _poison(t: torch.Tensor, gen: torch.Generator, count: int) -> torch.Tensor:
    t = t.clone()
    flat = t.view(-1)
    idx = torch.randperm(flat.numel(), generator=gen)[:count]
    values = torch.tensor([float("nan"), float("inf"), -float("inf")])
    flat[idx] = values[torch.arange(count) % 3]
    return t


def _same_nonfinite(got: torch.Tensor, want: torch.Tensor) -> tuple[bool, str]:
    nan_ok = torch.equal(got.isnan(), want.isnan())
    pos_ok = torch.equal(got == float("inf"), want == float("inf"))
    neg_ok = torch.equal(got == -float("inf"), want == -float("inf"))
    return nan_ok and pos_ok and neg_ok, (f"nan {int(got.isnan().sum())} vs "
                                          f"{int(want.isnan().sum())}, +inf "
                                          f"{int((got == float('inf')).sum())} vs "
                                          f"{int((want == float('inf')).sum())}")


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("groups", [1, 4])
def test_nonfinite_inputs_propagate_as_in_torch(activation, groups):
    gen = torch.Generator().manual_seed(ACTIVATIONS.index(activation) * 7 + groups)
    x = _poison(torch.randn(2, 4, 7, 6, generator=gen), gen, 9)
    w = torch.randn(8, 4 // groups, 3, 3, generator=gen)
    b = torch.randn(8, generator=gen)
    res = _poison(torch.randn(2, 8, 7, 6, generator=gen), gen, 4)
    # finite weights: at padded taps 0·w is 0 on every path
    ref = activate(F.conv2d(x.double(), w.double(), b.double(), 1, 1, 1, groups)
                   + res.double(), activation, 0.1)
    for backend in _BACKENDS:
        y = fastconv.conv2d(x, w, b, 1, 1, 1, groups, activation=activation,
                            negative_slope=0.1, residual=res, backend=backend,
                            precision="ieee")
        want = ref
        if activation == "gelu" and backend == "aten":  # torch's float32 CPU gelu(+inf)
            want = torch.where(ref == float("inf"), float("nan"), ref)
        ok, detail = _same_nonfinite(y.double(), want)
        assert ok, f"{backend} {activation}: {detail}"
        finite = want.isfinite()
        assert torch.allclose(y.double()[finite], want[finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("groups", [1, 3])
def test_nonfinite_weights(groups):
    """Dense: as torch (0·inf = NaN at padded taps too). Depthwise: every valid tap as torch;
    see the module docstring for the padded taps."""
    gen = torch.Generator().manual_seed(groups)
    x = torch.randn(1, 3, 5, 5, generator=gen)
    w = torch.randn(3, 3 // groups, 3, 3, generator=gen)
    w[0, 0, 0, 0] = float("inf")
    w[1, 0, 2, 2] = float("nan")
    want = F.conv2d(x.double(), w.double(), None, 1, 1, 1, groups)
    if groups > 1:  # the reference with padded taps as 0·w: pad first, then no padding
        want = F.conv2d(F.pad(x.double(), (1, 1, 1, 1)), w.double(), None, 1, 0, 1, groups)
    for backend in _BACKENDS:
        y = fastconv.conv2d(x, w, None, 1, 1, 1, groups, backend=backend, precision="ieee")
        if backend == "aten" and groups > 1:
            continue  # torch's own depthwise CPU kernel: padded taps skipped
        ok, detail = _same_nonfinite(y.double(), want)
        assert ok, f"{backend} groups={groups}: {detail}"


def test_padded_taps_of_torch_depthwise_differ_only_there():
    """What the documented difference is, pinned: torch's CPU depthwise kernel gives finite
    values where a padded tap meets an infinite weight; the kernels give NaN."""
    x = torch.randn(1, 3, 5, 5)
    w = torch.randn(3, 1, 3, 3)
    w[0, 0, 0, 0] = float("inf")
    torch_dw = F.conv2d(x, w, None, 1, 1, 1, 3)
    ours = fastconv.conv2d(x, w, None, 1, 1, 1, 3, backend="triton", precision="ieee")
    differ = ours.isnan() != torch_dw.isnan()
    assert differ[0, 0, 0, :].all() and differ[0, 0, :, 0].all()  # the first row and column
    assert int(differ.sum()) == 9 and not differ[0, 1:].any()
