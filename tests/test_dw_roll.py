"""dw_roll.py's channels-last depthwise walk down the rows (forward with the epilogue, the
stride-1 data gradient) against float64 torch: poisoned outputs, odd sizes, rank 1 and 2,
strides, multipliers, column dilation, kernels taller than the input, padded taps against
non-finite weights, and which problems the kernel takes."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from fastconv.backends.triton import depthwise, dw_roll
from fastconv.backends.triton.backend import TritonBackend
from fastconv.backends.triton.weights import roll_weight
from fastconv.epilogue import Epilogue
from fastconv.precision import relative_error
from fastconv.problem import ConvProblem

# (N, C, multiplier, spatial, kernel, stride, padding, dilation)
CASES = [
    (2, 6, 1, (9, 11), 3, 1, 1, 1),
    (2, 5, 1, (10, 7), 3, 2, 1, 1),            # stride 2, odd sizes
    (1, 4, 2, (7, 8), 5, 2, 2, 1),             # multiplier 2
    (2, 3, 1, (9, 10), 7, 1, 3, 1),            # 7x7: seven pending rows
    (2, 3, 1, (4, 5), 7, 1, 3, 1),             # kernel taller than the input
    (2, 6, 1, (6, 5), 2, 3, 0, 1),             # stride > kernel
    (1, 11, 1, (13, 12), 5, 1, 2, 1),          # channels past a block
    (2, 7, 1, (23,), 4, 1, ((3, 0),), 1),      # rank 1, causal
    (3, 6, 1, (19,), 5, 2, 2, 2),              # rank 1, stride and dilation
]
CONFIGS = [depthwise.DwConfig(4, 8, 4, roll=3), depthwise.DwConfig(2, 4, 1, roll=1)]


def _cl(t):
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 \
        else t.transpose(1, 2).contiguous().transpose(1, 2)


def _ref(x, w, stride, padding, dilation, groups):
    conv = F.conv1d if x.dim() == 3 else F.conv2d
    if isinstance(padding, tuple):  # causal: torch pads symmetrically only
        x = F.pad(x, padding[0])
        padding = 0
    return conv(x, w, None, stride, padding, dilation, groups)


def _problem(x, w, case):
    n, c, mult, spatial, k, stride, padding, dilation = case
    return ConvProblem.from_tensors(x, w, None, stride, padding, dilation, c,
                                    rank=len(spatial))


# the second tile (one column pair, one row per program) on three of the cases: 7x7 on the
# image shorter than the kernel (seven pending rows, as on 9x10, at a quarter of the
# interpreter's time: 37 s there)
PAIRS = [(case, CONFIGS[0]) for case in CASES] + [(CASES[i], CONFIGS[1]) for i in (1, 4, 7)]


@pytest.mark.parametrize(("case", "config"), PAIRS,
                         ids=lambda v: v.name() if isinstance(v, depthwise.DwConfig)
                         else f"r{len(v[3])}k{v[4]}s{v[5]}m{v[2]}")
@pytest.mark.slow_after(1)
def test_forward_with_epilogue_and_data_gradient(case, config):
    n, c, mult, spatial, k, stride, padding, dilation = case
    x = _cl(torch.randn(n, c, *spatial, dtype=torch.float64))
    w = torch.randn(c * mult, 1, *([k] * len(spatial)), dtype=torch.float64)
    problem = _problem(x, w, case)
    assert TritonBackend.config_errors(problem, config) == []
    ref = _ref(x, w, stride, padding, dilation, c)
    shape = (1, -1) + (1,) * len(spatial)
    scale = torch.rand(c * mult, dtype=torch.float64) + 0.5
    shift = torch.randn(c * mult, dtype=torch.float64)
    res = _cl(torch.randn_like(ref))
    want = F.silu(ref * scale.view(shape) + shift.view(shape) + res)
    problem = dataclasses.replace(problem, epilogue=Epilogue(
        "silu", has_scale=True, has_shift=True, has_residual=True))
    out = _cl(torch.full_like(ref, float("nan")))  # poisoned
    TritonBackend.bind(problem, config)(x, w, None, scale, shift, res, out)
    assert not out.isnan().any()
    assert relative_error(out, want) < 1e-12

    dgrad_ok = TritonBackend.config_errors(problem, config, "dgrad") == []
    assert dgrad_ok == (stride == 1 and mult == 1)
    if dgrad_ok:
        g = _cl(torch.randn_like(ref))
        xr = x.clone().requires_grad_()
        (want_dx,) = torch.autograd.grad(_ref(xr, w, stride, padding, dilation, c), xr, g)
        dx = _cl(torch.full_like(x, float("nan")))
        TritonBackend.bind(problem, config, "dgrad")(g, w, dx)
        assert relative_error(dx, want_dx) < 1e-12


def test_which_problems_the_kernel_takes():
    x = _cl(torch.randn(1, 4, 9, 9))
    cf = torch.randn(1, 4, 9, 9)
    roll = depthwise.DwConfig(4, 8, 4, roll=3)

    def problem(x, k=3, stride=1, dilation=1, mult=1):
        return ConvProblem.from_tensors(x, torch.randn(4 * mult, 1, k, k), None, stride,
                                        k // 2, dilation, 4, rank=2)
    assert TritonBackend.candidates(problem(x))[0] == roll  # the heuristic's pick
    assert TritonBackend.candidates(problem(x), "dgrad")[0] == roll
    assert TritonBackend.candidates(problem(x), "wgrad")[0] == roll  # dw_wgrad.py's walk
    assert not any(c.roll for c in TritonBackend.candidates(problem(x, k=9), "wgrad"))
    assert not any(c.roll for c in TritonBackend.candidates(problem(cf)))
    assert not any(c.roll for c in TritonBackend.candidates(problem(x, dilation=2)))
    assert TritonBackend.candidates(problem(x, k=13, stride=2))[0] == roll  # 7 pending rows
    assert not any(c.roll for c in TritonBackend.candidates(problem(x, k=15, stride=2)))
    for p, op in ((problem(x, k=9), "wgrad"), (problem(cf), "fprop"),
                  (problem(x, dilation=2), "fprop"), (problem(x, stride=2), "dgrad"),
                  (problem(x, mult=2), "dgrad")):
        assert any("roll" in e for e in TritonBackend.config_errors(p, roll, op)), (p, op)
    assert TritonBackend.config_errors(problem(x), dataclasses.replace(roll, roll=-1))


def _valid_taps(x, w, pad):
    """float64 depthwise forward summing only the taps inside the input."""
    n, c, h, wd = x.shape
    r, s = w.shape[2:]
    out = torch.zeros(n, c, h + 2 * pad - r + 1, wd + 2 * pad - s + 1, dtype=torch.float64)
    for i in range(r):
        for j in range(s):
            for p in range(out.shape[2]):
                ih = p - pad + i
                if not 0 <= ih < h:
                    continue
                for q in range(out.shape[3]):
                    iw = q - pad + j
                    if 0 <= iw < wd:
                        out[:, :, p, q] += x[:, :, ih, iw].double() * w[:, 0, i, j].double()
    return out


@pytest.mark.parametrize("k", [3, 7])
@pytest.mark.slow_after(1)
def test_padded_taps_add_nothing(k):
    """Against non-finite weights a padded tap adds nothing (as torch's depthwise kernels),
    forward and data gradient, padded rows and padded columns both."""
    gen = torch.Generator().manual_seed(k)
    x = _cl(torch.randn(2, 3, 5, 6, generator=gen))
    w = torch.randn(3, 1, k, k, generator=gen)
    w[0, 0, 0, 0] = float("inf")
    w[1, 0, 2, 1] = float("nan")
    w[2, 0, 1, k - 1] = -float("inf")
    pad = k // 2
    config = depthwise.DwConfig(4, 4, 4, roll=2)
    problem = ConvProblem.from_tensors(x, w, None, 1, pad, 1, 3, rank=2)
    want = _valid_taps(x, w, pad)
    out = _cl(torch.full(want.shape, 7.0))
    TritonBackend.bind(problem, config)(x, w, None, None, None, None, out)
    assert torch.equal(out.isnan(), want.isnan())
    assert torch.equal(out.isinf(), want.isinf())
    finite = want.isfinite()
    assert torch.allclose(out.double()[finite], want[finite], rtol=1e-5, atol=1e-5)
    dy = _cl(torch.randn(want.shape, generator=gen))
    want_dx = _valid_taps(dy, w.flip(2, 3), pad)
    dx = _cl(torch.full(x.shape, 7.0))
    TritonBackend.bind(problem, config, "dgrad")(dy, w, dx)
    assert torch.equal(dx.isnan(), want_dx.isnan())
    assert torch.allclose(dx.double()[want_dx.isfinite()], want_dx[want_dx.isfinite()],
                          rtol=1e-5, atol=1e-5)


def test_packed_weight_follows_in_place_updates():
    """The kernel's weight copy (fp32, channel blocks tap by tap) is cached per weight
    version: an optimizer step's in-place update repacks it."""
    w = torch.randn(5, 1, 3, 3, dtype=torch.bfloat16)
    packed = roll_weight(w, 4)
    assert packed.shape == (2, 9, 4) and packed.dtype == torch.float32
    assert torch.equal(packed[0, :, 1], w[1, 0].flatten().float())
    assert torch.equal(packed[1, :, 0], w[4, 0].flatten().float())
    assert roll_weight(w, 4) is packed
    w.mul_(2)
    assert torch.equal(roll_weight(w, 4)[1, :, 0], w[4, 0].flatten().float())
    assert dw_roll.pending(7, 1) == 7 and dw_roll.pending(5, 2) == 3

