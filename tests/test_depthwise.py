"""Depthwise kernels (backends/triton/depthwise.py) against float64 torch: forward with the
epilogue, data and weight gradients, rank 1 and 2, both layouts, channel multipliers, causal
padding, odd sizes, stride > kernel, a kernel longer than the padded input."""

import pytest
import torch
import torch.nn.functional as F

import fastconv
from fastconv.backends.triton import depthwise
from fastconv.backends.triton.launchargs import EpilogueArgs, Geometry
from fastconv.precision import relative_error


def _geometry(rank: int, stride: int, padding: int, dilation: int) -> Geometry:
    """The launchers' 4-D geometry of a rank-1 (H = 1) or rank-2 depthwise problem."""
    if rank == 2:
        return Geometry((stride, stride), (padding, padding), (dilation, dilation))
    return Geometry((1, stride), (0, padding), (1, dilation))

# (N, C, multiplier, spatial, kernel, stride, padding, dilation)
CASES = [
    (2, 6, 1, (9, 11), 3, 1, 1, 1),
    (2, 5, 1, (10, 7), 3, 2, 1, 1),      # stride 2, odd sizes
    (1, 4, 2, (7, 8), 5, 2, 2, 1),       # multiplier 2
    (3, 3, 1, (10, 9), 3, 1, 2, 2),      # dilation
    (2, 4, 3, (6, 5), 2, 3, 0, 1),       # stride > kernel
    (2, 3, 1, (4, 5), 7, 1, 3, 1),       # kernel longer than the input
    (2, 7, 1, (23,), 4, 1, ((3, 0),), 1),  # rank 1, causal
    (3, 6, 1, (19,), 5, 2, 2, 2),        # rank 1, stride and dilation
    (1, 4, 2, (6,), 9, 1, 4, 1),         # rank 1, kernel longer than the input, multiplier 2
]


def _ref(x, w, stride, padding, dilation, groups):
    conv = F.conv1d if x.dim() == 3 else F.conv2d
    if isinstance(padding, tuple):  # causal: torch pads symmetrically only
        x = F.pad(x, padding[0])
        padding = 0
    return conv(x, w, None, stride, padding, dilation, groups)


def _ours(x, w, stride, padding, dilation, groups, **kw):
    conv = fastconv.conv1d if x.dim() == 3 else fastconv.conv2d
    return conv(x, w, None, stride, padding, dilation, groups, backend="triton", **kw)


def _inputs(case, channels_last, dtype=torch.float64):
    n, c, mult, spatial, k, *_ = case
    x = torch.randn(n, c, *spatial, dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 \
            else x.transpose(1, 2).contiguous().transpose(1, 2)
    w = torch.randn(c * mult, 1, *([k] * len(spatial)), dtype=dtype)
    return x, w


@pytest.mark.parametrize("channels_last", [False, True], ids=["cfirst", "clast"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"r{len(c[3])}k{c[4]}s{c[5]}m{c[2]}")
@pytest.mark.slow_after(2)
def test_forward_and_gradients_match_float64(case, channels_last):
    n, c, mult, spatial, k, stride, padding, dilation = case
    x, w = _inputs(case, channels_last)
    x.requires_grad_()
    w.requires_grad_()
    y = _ours(x, w, stride, padding, dilation, c)
    ref = _ref(x, w, stride, padding, dilation, c)
    assert y.shape == ref.shape
    assert relative_error(y, ref) < 1e-12
    g = torch.randn_like(ref)
    got = torch.autograd.grad(y, (x, w), g)
    want = torch.autograd.grad(ref, (x, w), g)
    assert relative_error(got[0], want[0]) < 1e-12
    assert relative_error(got[1], want[1]) < 1e-12


@pytest.mark.parametrize("channels_last", [False, True], ids=["cfirst", "clast"])
@pytest.mark.slow
def test_large_kernel(channels_last):
    """A 9x9 depthwise layer: past the rolling-row and weight-gradient tiles' 7 kernel rows,
    so depthwise.py's tiles take every op, looping over kernel rows at run time in the
    forward and data gradient (past UNROLLED_TAPS and ROW_LOOP_PAST, as for 13x13) and
    giving each kernel row its own weight-gradient programs: forward and both gradients
    against float64. One small case: the interpreter's time grows with the taps (13x13:
    18 s here; the GPU tests run a 13x13 layer)."""
    test_forward_and_gradients_match_float64((1, 2, 1, (11, 7), 9, 1, 4, 1), channels_last)


def test_every_output_element_is_written_with_the_epilogue():
    x, w = _inputs(CASES[1], True, torch.float32)
    c = x.shape[1]
    scale, shift = torch.rand(c) + 0.5, torch.randn(c)
    ref = _ref(x, w, 2, 1, 1, c)
    res = torch.randn_like(ref)
    out = torch.full_like(ref, float("nan"))  # poisoned
    got = _ours(x, w, 2, 1, 1, c, scale=scale, shift=shift, residual=res,
                activation="silu", out=out)
    want = F.silu(ref * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1) + res)
    assert got.data_ptr() == out.data_ptr() and not out.isnan().any()
    assert relative_error(got, want) < 1e-5


def test_dispatch_routes_depthwise_to_the_direct_kernel():
    x, w = _inputs(CASES[0], False, torch.float32)
    ex = fastconv.explain(x, w, None, 1, 1, 1, x.shape[1], backend="triton")
    assert isinstance(ex.choice.config, depthwise.DwConfig), str(ex)


def test_gradcheck_rank1_causal():
    x = torch.randn(2, 3, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 1, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x, w: _ours(x, w, 1, ((3, 0),), 1, 3), (x, w), fast_mode=True)



@pytest.mark.parametrize("case", [c for c in CASES if len(c[3]) == 2],
                         ids=lambda c: f"k{c[4]}s{c[5]}m{c[2]}d{c[7]}")
@pytest.mark.slow_after(2)
def test_plane_tiles_forward_and_data_gradient(case):
    """Channels-first tiles over an image's flattened positions (DwConfig.plane): forward
    and data gradient into poisoned outputs against float64."""
    from fastconv.backends.triton.backend import TritonBackend
    from fastconv.problem import ConvProblem

    n, c, mult, spatial, k, stride, padding, dilation = case
    x, w = _inputs(case, False)
    problem = ConvProblem.from_tensors(x, w, None, stride, padding, dilation, c, rank=2)
    config = depthwise.DwConfig(4, 16, 4, plane=True)
    assert config in TritonBackend.candidates(problem)
    ref = _ref(x, w, stride, padding, dilation, c)
    out = torch.full_like(ref, float("nan"))
    TritonBackend.bind(problem, config)(x, w, None, None, None, None, out)
    assert relative_error(out, ref) < 1e-12
    g = torch.randn_like(ref)
    want = torch.autograd.grad(_ref(x.requires_grad_(), w, stride, padding, dilation, c), x,
                               g)[0]
    dx = torch.full_like(x, float("nan"))
    TritonBackend.bind(problem, config, "dgrad")(g, w, dx)
    assert relative_error(dx, want) < 1e-12

# (N, C, K, groups, spatial, kernel, stride, padding, dilation): grouped, C/groups > 1
GROUPED = [
    (2, 8, 8, 2, (9, 11), 3, 1, 1, 1),     # 4 in, 4 out per group
    (1, 12, 6, 3, (7, 10), 3, 2, 1, 1),    # 4 in, 2 out per group, stride 2
    (2, 6, 9, 3, (8, 5), 2, 3, 0, 1),      # 2 in, 3 out per group, stride > kernel
    (2, 10, 10, 2, (6, 7), 3, 1, 2, 2),    # dilation
    (3, 8, 4, 2, (13,), 5, 2, 2, 1),       # rank 1
]


@pytest.mark.parametrize("channels_last", [False, True], ids=["cfirst", "clast"])
@pytest.mark.parametrize("case", GROUPED, ids=lambda c: f"r{len(c[4])}g{c[3]}k{c[5]}s{c[6]}")
@pytest.mark.slow
def test_grouped_forward_direct_kernel_with_epilogue(case, channels_last):
    """The direct forward on grouped convolutions (each output element reduces its group's
    input channels), poisoned output, bias + residual + activation, against float64."""
    n, c, k, groups, spatial, ks, stride, padding, dilation = case
    x = torch.randn(n, c, *spatial, dtype=torch.float64)
    w = torch.randn(k, c // groups, *([ks] * len(spatial)), dtype=torch.float64)
    ref = _ref(x, w, stride, padding, dilation, groups)
    shift, res = torch.randn(k, dtype=torch.float64), torch.randn_like(ref)
    ref = F.silu(ref + shift.view(1, -1, *([1] * len(spatial))) + res)
    if channels_last:
        x, res = (t.contiguous(memory_format=torch.channels_last) if t.dim() == 4
                  else t.transpose(1, 2).contiguous().transpose(1, 2) for t in (x, res))
    out = torch.full_like(res, float("nan"))
    four = (lambda t: t) if len(spatial) == 2 else (lambda t: t.unsqueeze(2))
    depthwise.launch_fprop(
        four(x), four(w), four(out),
        EpilogueArgs(None, shift, four(res), fastconv.ACTIVATIONS.index("silu")),
        _geometry(len(spatial), stride, padding, dilation), channels_last=channels_last,
        config=depthwise.candidates(channels_last, False)[0], int64=False)
    assert torch.isfinite(out).all()
    assert relative_error(out, ref) < 1e-12


@pytest.mark.slow
def test_grouped_forward_through_dispatch_when_pinned(monkeypatch):
    """Grouped problems run the direct kernel when dispatch chooses it (here pinned)."""
    from fastconv import dispatch, functional
    from fastconv.backends.triton.backend import TritonBackend
    from fastconv.problem import ConvProblem

    x = torch.randn(2, 8, 9, 7, dtype=torch.float64)
    w = torch.randn(6, 4, 3, 3, dtype=torch.float64)
    problem = ConvProblem.from_tensors(x, w, None, 1, 1, 1, 2, rank=2)
    config = depthwise.DwConfig(8, 16, 4)
    calls = []
    launch = depthwise.launch_fprop
    monkeypatch.setattr(depthwise, "launch_fprop", lambda *a, **k: calls.append(1) or
                        launch(*a, **k))
    dispatch.pin(problem, "triton", config)
    functional.clear_plans()
    try:
        y = fastconv.conv2d(x, w, None, 1, 1, 1, 2, dispatch="pinned")
    finally:
        dispatch.clear()
        functional.clear_plans()
    assert relative_error(y, F.conv2d(x, w, None, 1, 1, 1, 2)) < 1e-12
    assert calls, "the pinned direct kernel did not run"
    g = torch.randn(2, 6, 9, 7, dtype=torch.float64)  # the backend's gradient entry points
    want = torch.autograd.grad(F.conv2d(x.requires_grad_(), w.requires_grad_(), None, 1, 1,
                                        1, 2), (x, w), g)
    dx = TritonBackend.bind(problem, config, "dgrad")(g, w.detach(), None)
    dw = TritonBackend.bind(problem, config, "wgrad")(g, x.detach(), None)
    assert relative_error(dx, want[0]) < 1e-12 and relative_error(dw, want[1]) < 1e-12
    assert all(not isinstance(c, depthwise.DwConfig)  # on the CPU: the interpreter's tile
               for c in TritonBackend.candidates(problem))


@pytest.mark.parametrize("channels_last", [False, True], ids=["cfirst", "clast"])
@pytest.mark.parametrize("case", GROUPED, ids=lambda c: f"r{len(c[4])}g{c[3]}k{c[5]}s{c[6]}")
@pytest.mark.slow
def test_grouped_gradients_direct_kernels(case, channels_last):
    """The direct data and weight gradients of grouped convolutions against float64
    autograd, into poisoned outputs."""
    n, c, k, groups, spatial, ks, stride, padding, dilation = case
    x = torch.randn(n, c, *spatial, dtype=torch.float64, requires_grad=True)
    w = torch.randn(k, c // groups, *([ks] * len(spatial)), dtype=torch.float64,
                    requires_grad=True)
    y = _ref(x, w, stride, padding, dilation, groups)
    g = torch.randn_like(y)
    want_dx, want_dw = torch.autograd.grad(y, (x, w), g)
    x, g = x.detach(), g
    if channels_last:
        x, g = (t.contiguous(memory_format=torch.channels_last) if t.dim() == 4
                else t.transpose(1, 2).contiguous().transpose(1, 2) for t in (x, g))
    dx = torch.full_like(x, float("nan"))
    dw = torch.full_like(w, float("nan"))
    four = (lambda t: t) if len(spatial) == 2 else (lambda t: t.unsqueeze(2))
    geo = _geometry(len(spatial), stride, padding, dilation)
    how = dict(channels_last=channels_last, config=depthwise.candidates(channels_last, False)[0],
               int64=False)
    depthwise.launch_dgrad(four(g), four(w.detach()), four(dx), geo, **how)
    depthwise.launch_wgrad(four(g), four(x), four(dw), geo, **how)
    assert relative_error(dx, want_dx) < 1e-12
    assert relative_error(dw, want_dw) < 1e-12


@pytest.mark.slow
def test_grouped_gradients_of_a_large_kernel():
    """An 8x8 grouped layer (2 input channels per group) past ROW_LOOP_PAST: the data
    gradient's rows looped at run time, the weight gradient's rows over programs, one
    input channel of each group per pass."""
    test_grouped_gradients_direct_kernels((1, 4, 4, 2, (6, 7), 8, 1, 3, 1), False)


def test_kernel_rows_past_the_unroll_limit_are_refused_with_the_reason():
    """The direct kernels unroll a kernel row's taps at compile time (minutes to compile
    past DIRECT_COLUMNS_MAX): a longer depthwise row is refused by the Triton backend with
    its reason, and a grouped one's direct tiles are refused (GEMM tiles remain); at the limit
both are served."""
    from fastconv.backends.triton.backend import TritonBackend
    from fastconv.backends.triton.binds import DIRECT_COLUMNS_MAX
    from fastconv.problem import ConvProblem

    for k, refused in ((DIRECT_COLUMNS_MAX, False), (DIRECT_COLUMNS_MAX + 1, True)):
        x = torch.randn(1, 4, 2 * k + 3)
        depthwise_w = torch.randn(4, 1, k)
        problem = ConvProblem.from_tensors(x, depthwise_w, None, 1, 0, 1, 4, rank=1)
        reasons = TritonBackend.not_supported_reasons(problem)
        assert any(f"kernel row of {k} taps" in r for r in reasons) == refused, reasons
        ex = fastconv.explain(x, depthwise_w, None, 1, 0, 1, 4)
        assert (f"kernel row of {k} taps" in str(ex)) == refused, str(ex)
        grouped = ConvProblem.from_tensors(x, torch.randn(4, 2, k), None, 1, 0, 1, 2, rank=1)
        errors = TritonBackend.config_errors(grouped, depthwise.DwConfig(4, 16, 4), "fprop")
        assert any(f"at most {DIRECT_COLUMNS_MAX} taps" in e for e in errors) == refused
