"""The Triton forward kernel against float64 references (interpreter on the CPU).

Every run writes into a NaN-poisoned ``out=`` buffer, so an unwritten element fails the
check; inputs are fresh random values each time, never zeros.
"""

import random

import pytest
import torch
import torch.nn.functional as F

import fastconv
from fastconv.precision import TOLERANCE, Precision, relative_error
from fastconv.tools import testing

BACKEND = "triton"
PRECISIONS = list(Precision)
N_RANDOM = 300
CHUNK = 20


@pytest.mark.parametrize("chunk", range(N_RANDOM // CHUNK))
@pytest.mark.slow_after(1)
def test_random_problems(chunk, device):
    """300 random valid problems (20 per test), every precision, both ranks."""
    rng = random.Random(1000 + chunk)
    gen = torch.Generator().manual_seed(chunk)
    for _ in range(CHUNK):
        case = testing.random_case(rng, small=device == "cpu")
        prec = rng.choice(PRECISIONS)
        err = testing.check_case(case, backend=BACKEND, precision=prec, device=device,
                                 generator=gen)
        assert err <= TOLERANCE[prec], f"{testing.describe(case)} {prec}: {err:.3g}\n{case}"


def _case(**kw):
    base = dict(rank=2, n=2, c=5, k=7, spatial=(9, 11), kernel=(3, 3), stride=(1, 1),
                padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1, bias=True, scale=False,
                shift=False, residual=False, activation="none", negative_slope=0.01,
                channels_last=False, noncontiguous=False)
    base.update(kw)
    return base


NAMED = {
    "odd_channels": _case(c=19, k=23),
    "one_by_one": _case(kernel=(1, 1), padding=((0, 0), (0, 0)), c=33, k=17),
    "one_by_one_stride2": _case(kernel=(1, 1), padding=((0, 0), (0, 0)), stride=(2, 2), c=20),
    "depthwise": _case(c=6, k=6, groups=6),
    "depthwise_multiplier": _case(c=4, k=8, groups=4, kernel=(5, 5), padding=((2, 2), (2, 2))),
    "grouped_wide": _case(c=36, k=18, groups=2),
    "stride_gt_kernel": _case(kernel=(2, 2), stride=(3, 3), padding=((0, 0), (0, 0))),
    "dilation": _case(dilation=(2, 3), padding=((2, 2), (3, 3))),
    "asymmetric_padding": _case(padding=((0, 2), (3, 1)), kernel=(2, 4)),
    "rectangular_kernel": _case(kernel=(1, 5), padding=((0, 0), (2, 2))),
    "channels_last": _case(channels_last=True, c=24, k=9),
    "noncontiguous": _case(noncontiguous=True),
    "stem_7x7_s2": _case(c=3, k=8, kernel=(7, 7), stride=(2, 2), padding=((3, 3), (3, 3)),
                         spatial=(15, 14)),
    "kernel_covers_input": _case(spatial=(3, 3), kernel=(3, 3), padding=((0, 0), (0, 0))),
    "conv1d": _case(rank=1, spatial=(37,), kernel=(4,), stride=(2,), padding=((3, 1),),
                    dilation=(2,)),
    "conv1d_depthwise_causal": _case(rank=1, c=8, k=8, groups=8, spatial=(21,), kernel=(4,),
                                     padding=((3, 0),), stride=(1,), dilation=(1,)),
    "scale_shift_residual": _case(scale=True, shift=True, residual=True, activation="relu"),
    "batch1": _case(n=1, channels_last=True, c=16),
}


@pytest.mark.parametrize("precision", PRECISIONS, ids=str)
@pytest.mark.parametrize("name", NAMED)
@pytest.mark.slow_after(4)
def test_named_shapes(name, precision, device):
    case = NAMED[name]
    err = testing.check_case(case, backend=BACKEND, precision=precision, device=device)
    assert err <= TOLERANCE[precision], f"{name} {precision}: {err:.3g}"


@pytest.mark.parametrize("activation", fastconv.ACTIVATIONS)
def test_every_activation_with_residual(activation, device):
    case = _case(activation=activation, residual=True, scale=True, negative_slope=0.2)
    err = testing.check_case(case, backend=BACKEND, precision=Precision.IEEE, device=device)
    assert err <= TOLERANCE[Precision.IEEE], f"{activation}: {err:.3g}"


def test_poisoned_output_is_fully_written(device):
    case = _case(c=17, k=29, spatial=(13, 7))
    t = testing.make_inputs(case, Precision.IEEE, device)
    out = testing.run_case(case, t, backend=BACKEND, precision=Precision.IEEE)
    assert torch.isfinite(out).all()
    # and the same buffer object is returned
    buf = torch.full_like(out, float("nan"))
    res = fastconv.conv2d(t["input"], t["weight"], t["bias"], padding=1, out=buf, backend=BACKEND)
    assert res is buf and torch.isfinite(buf).all()


def test_channels_last_output_layout_follows_input(device):
    x = torch.randn(2, 16, 6, 5, device=device).contiguous(memory_format=torch.channels_last)
    w = torch.randn(8, 16, 3, 3, device=device)
    y = fastconv.conv2d(x, w, padding=1, backend=BACKEND, precision="ieee")
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert relative_error(y, F.conv2d(x.double(), w.double(), padding=1)) < 1e-5


def test_unbatched_input(device):
    x, w = torch.randn(5, 8, 9, device=device), torch.randn(4, 5, 3, 3, device=device)
    y = fastconv.conv2d(x, w, stride=2, backend=BACKEND, precision="ieee")
    assert y.shape == (4, 3, 4)
    assert relative_error(y, F.conv2d(x.double(), w.double(), stride=2)) < 1e-5


def test_non_finite_inputs_propagate_like_torch(device):
    x = torch.randn(2, 4, 8, 8, device=device)
    x[0, 1, 2, 3] = float("nan")
    x[1, 0, 5, 5] = float("inf")
    w = torch.randn(6, 4, 3, 3, device=device)
    ours = fastconv.conv2d(x, w, padding=1, backend=BACKEND, activation="relu")
    ref = F.relu(F.conv2d(x.double(), w.double(), padding=1))
    assert torch.equal(torch.isnan(ours), torch.isnan(ref))
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    finite = torch.isfinite(ref)
    assert relative_error(ours[finite], ref[finite]) < TOLERANCE[Precision.TF32]


def test_empty_batch(device):
    y = fastconv.conv2d(torch.randn(0, 4, 5, 5, device=device), torch.randn(3, 4, 3, 3,
                        device=device), backend=BACKEND)
    assert y.shape == (0, 3, 3, 3)


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("int64", [False, True])
@pytest.mark.parametrize("flat_k", [False, True])
def test_kernel_variants(flat_k, int64, split_k, device):
    """Every walk of the reduction, 64-bit addressing (its trigger, tensors of more than 2**31
    elements, is exercised on the GPU in test_gpu.py) and split-K with its reduce kernel give
    the same result, epilogue included."""
    from fastconv.backends.triton.configs import TileConfig
    from fastconv.backends.triton.fprop import launch_fprop
    from fastconv.backends.triton.launchargs import EpilogueArgs, Geometry

    x = torch.randn(2, 20, 7, 6, device=device)
    w = torch.randn(8, 10, 3, 2, device=device)
    scale, shift = torch.randn(8, device=device), torch.randn(8, device=device)
    res = torch.randn(2, 8, 4, 7, device=device)
    out = torch.full((2, 8, 4, 7), float("nan"), device=device)
    launch_fprop(x, w, out, EpilogueArgs(scale, shift, res, fastconv.ACTIVATIONS.index("silu")),
                 Geometry((2, 1), (1, 1), (1, 1), 2), precision="ieee",
                 config=TileConfig(32, 16, 16, 4, 1, flat_k, split_k), int64=int64)
    conv = F.conv2d(x.double(), w.double(), stride=(2, 1), padding=(1, 1), groups=2)
    ref = F.silu(conv * scale.double().view(1, -1, 1, 1) + shift.double().view(1, -1, 1, 1)
                 + res.double())
    assert relative_error(out, ref) < 1e-5


@pytest.mark.parametrize("int64", [False, True])
@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
@pytest.mark.parametrize("case", ["stem", "grouped_dilated"])
def test_tap_row_tiles(case, layout, int64, device):
    """The tap-row walk (one kernel row per step, its (s, c) run in one block) against
    float64: the RGB stem's shape (7x7, stride 2, padding 3, 21-element runs in a 32-wide
    block) with the epilogue, and a grouped, dilated, asymmetric one (4 channels per group,
    a 3x5 kernel: 20-element runs) in both layouts, every output element written."""
    from fastconv.backends.triton.backend import TritonBackend
    from fastconv.backends.triton.configs import TileConfig
    from fastconv.backends.triton.fprop import launch_fprop
    from fastconv.backends.triton.launchargs import EpilogueArgs, Geometry
    from fastconv.problem import ConvProblem

    fmt = {"channels_last": torch.channels_last, "contiguous": torch.contiguous_format}[layout]
    if case == "stem":
        x = torch.randn(2, 3, 13, 11, device=device)
        w = torch.randn(20, 3, 7, 7, device=device)
        geo, groups = Geometry((2, 2), (3, 3), (1, 1), 1), 1
    else:
        x = torch.randn(2, 8, 9, 12, device=device)
        w = torch.randn(6, 4, 3, 5, device=device)
        geo, groups = Geometry((1, 2), (2, 1), (2, 1), 2), 2
    x = x.contiguous(memory_format=fmt)
    conv = F.conv2d(x.double(), w.double(), stride=geo.stride, padding=geo.pad,
                    dilation=geo.dilation, groups=groups)
    k = w.shape[0]
    scale, shift = torch.randn(k, device=device), torch.randn(k, device=device)
    out = torch.full(conv.shape, float("nan"), device=device).contiguous(memory_format=fmt)
    config = TileConfig(32, 16, 32, 4, 1, True, tap_rows=True)
    problem = ConvProblem.from_tensors(x, w, stride=geo.stride, padding=geo.pad,
                                       dilation=geo.dilation, groups=groups, rank=2)
    assert TritonBackend.config_errors(problem, config) == []
    launch_fprop(x, w, out, EpilogueArgs(scale, shift, None, fastconv.ACTIVATIONS.index("relu")),
                 geo, precision="ieee", config=config, int64=int64)
    ref = F.relu(conv * scale.double().view(1, -1, 1, 1) + shift.double().view(1, -1, 1, 1))
    assert not out.isnan().any()
    assert relative_error(out, ref) < 1e-5


@pytest.mark.parametrize("split,int64", [(1, False), (3, False), (3, True)])
@pytest.mark.parametrize("case", ["stem", "grouped_dilated"])
def test_tap_row_weight_gradient(case, split, int64, device):
    """The weight gradient over kernel-row tiles against float64, its split reduction in a
    fixed order (the same bits twice), every weight element written."""
    from fastconv.backends.triton.backend import TritonBackend
    from fastconv.backends.triton.configs import TileConfig
    from fastconv.backends.triton.launchargs import Geometry
    from fastconv.backends.triton.wgrad import launch_wgrad
    from fastconv.problem import ConvProblem

    if case == "stem":
        x, wshape = torch.randn(2, 3, 13, 11, device=device), (20, 3, 7, 7)
        geo, groups = Geometry((2, 2), (3, 3), (1, 1), 1), 1
        x = x.contiguous(memory_format=torch.channels_last)
    else:
        x, wshape = torch.randn(2, 8, 9, 12, device=device), (6, 4, 3, 5)
        geo, groups = Geometry((1, 2), (2, 1), (2, 1), 2), 2
    conv = F.conv2d(x.double(), torch.randn(wshape, dtype=torch.float64, device=device),
                    stride=geo.stride, padding=geo.pad, dilation=geo.dilation, groups=groups)
    dy = torch.randn(conv.shape, device=device).contiguous(
        memory_format=torch.channels_last if case == "stem" else torch.contiguous_format)
    config = TileConfig(16, 32, 16, 4, 1, False, split, tap_rows=True)
    problem = ConvProblem.from_tensors(x, torch.empty(wshape), stride=geo.stride,
                                       padding=geo.pad, dilation=geo.dilation, groups=groups,
                                       rank=2)
    assert TritonBackend.config_errors(problem, config, "wgrad") == []
    runs = []
    for _ in range(2):
        out = torch.full(wshape, float("nan"), device=device)
        launch_wgrad(dy, x, out, geo, precision="ieee", config=config, int64=int64)
        runs.append(out)
    assert torch.equal(runs[0], runs[1])
    ref = torch.nn.grad.conv2d_weight(x.double(), wshape, dy.double(), geo.stride, geo.pad,
                                      geo.dilation, groups)
    assert relative_error(runs[0], ref) < 1e-5


@pytest.mark.parametrize("rank", [1, 2])
def test_tap_row_tiles_through_the_backend(rank):
    """The backend's bound forward and weight gradient (the entry points dispatch calls:
    views, layout copies, the partial-sum reduce) with tap-row tiles, conv1d in NCL and a
    channels-last conv2d, against float64."""
    from fastconv.backends.triton.backend import TritonBackend
    from fastconv.backends.triton.configs import TileConfig
    from fastconv.problem import ConvProblem

    if rank == 1:
        x, w = torch.randn(3, 4, 29, dtype=torch.float64), torch.randn(6, 4, 5, dtype=torch.float64)
        conv, grad_w = F.conv1d, torch.nn.grad.conv1d_weight
    else:
        x = torch.randn(2, 3, 15, 13, dtype=torch.float64).contiguous(
            memory_format=torch.channels_last)
        w = torch.randn(6, 3, 7, 7, dtype=torch.float64)
        conv, grad_w = F.conv2d, torch.nn.grad.conv2d_weight
    problem = ConvProblem.from_tensors(x, w, None, 2, 2, rank=rank)
    y = conv(x, w, None, 2, 2)
    g = torch.randn_like(y)
    forward = TileConfig(16, 16, 32, 4, 1, True, tap_rows=True)
    grad = TileConfig(16, 32, 16, 4, 1, False, 3, tap_rows=True)
    for cfg, op in ((forward, "fprop"), (grad, "wgrad")):
        assert TritonBackend.config_errors(problem, cfg, op) == [], (cfg, op)
    out = TritonBackend.bind(problem, forward)(x, w, None, None, None, None, None)
    assert relative_error(out, y) < 1e-12
    dw = TritonBackend.bind(problem, grad, "wgrad")(g, x, None)
    assert relative_error(dw, grad_w(x, w.shape, g, 2, 2)) < 1e-12


def test_tap_row_tiles_are_offered_where_they_fit():
    """Tap-row tiles are forward and weight-gradient candidates for 2-15 channels per group
    and kernel rows of 16-64 elements, each with a block wide enough for the run; a block
    narrower than the run, a split forward, the data gradient or a problem they do not fit
    is refused."""
    import dataclasses

    from fastconv.backends.triton.backend import TritonBackend
    from fastconv.backends.triton.configs import fprop_candidates, wgrad_candidates
    from fastconv.problem import ConvProblem

    stem = ConvProblem.from_tensors(torch.randn(8, 3, 224, 224), torch.randn(64, 3, 7, 7),
                                    stride=(2, 2), padding=(3, 3), rank=2)
    taps = [c for c in fprop_candidates(stem) if c.tap_rows]
    assert taps and all(c.block_k == 32 and c.flat_k for c in taps)
    assert all(TritonBackend.config_errors(stem, c) == [] for c in taps)
    for bad in (dataclasses.replace(taps[0], block_k=16), dataclasses.replace(taps[0], split_k=2),
                dataclasses.replace(taps[0], flat_k=False)):
        assert any("tap_rows" in e for e in TritonBackend.config_errors(stem, bad))
    wide = ConvProblem.from_tensors(torch.randn(2, 12, 16, 16), torch.randn(8, 12, 7, 7), rank=2)
    narrow = ConvProblem.from_tensors(torch.randn(2, 3, 16, 16), torch.randn(8, 3, 3, 3), rank=2)
    assert not any(c.tap_rows for p in (wide, narrow) for c in fprop_candidates(p))
    assert TritonBackend.config_errors(narrow, dataclasses.replace(taps[0], block_k=16))
    grads = [c for c in wgrad_candidates(stem) if c.tap_rows]
    assert grads and all(c.block_n == 32 and not c.flat_k and c.split_k > 1 for c in grads)
    assert all(TritonBackend.config_errors(stem, c, "wgrad") == [] for c in grads)
    assert TritonBackend.config_errors(stem, dataclasses.replace(grads[0], block_n=16), "wgrad")
    assert TritonBackend.config_errors(stem, taps[0], "dgrad")


def _tf32(t: torch.Tensor, nearest: bool) -> torch.Tensor:
    """float32 values with 10 mantissa bits: rounded to nearest (ties away) or truncated."""
    bits = t.view(torch.int32).to(torch.int64)
    if nearest:
        bits = bits + 0x1000
    return (bits & ~0x1FFF).to(torch.int32).view(torch.float32)


@pytest.mark.parametrize("kernel", ["fprop", "dgrad", "wgrad"])
def test_tf32_operands_are_rounded_to_nearest(kernel, device):
    """TF32 kernels round both operands to the nearest TF32 value before the product (a
    truncating tl.dot biases every layer the same way). The interpreter's tl.dot is exact,
    so its result equals the float64 convolution of rounded operands, and is far from the
    truncated ones; on a GPU the tensor cores' own truncation then changes nothing."""
    from fastconv.backends.triton.configs import TileConfig
    from fastconv.backends.triton.dgrad import launch_dgrad
    from fastconv.backends.triton.fprop import launch_fprop
    from fastconv.backends.triton.launchargs import NO_EPILOGUE, Geometry
    from fastconv.backends.triton.wgrad import launch_wgrad

    x = torch.randn(2, 12, 7, 9, device=device) + 3  # one sign: a truncation bias adds up
    w = torch.rand(5, 12, 3, 3, device=device) + 1
    dy = torch.rand(2, 5, 5, 7, device=device) + 1
    cfg = TileConfig(16, 16, 16, 4, 1, False, 1)
    geo = Geometry((1, 1), (0, 0), (1, 1))
    common = dict(precision="tf32", config=cfg, int64=False)

    def run(x, w, dy):
        if kernel == "fprop":
            out = torch.full((2, 5, 5, 7), float("nan"), device=device)
            return launch_fprop(x, w, out, NO_EPILOGUE, geo, **common)
        if kernel == "dgrad":
            out = torch.full_like(x, float("nan"))
            return launch_dgrad(dy, w, out, NO_EPILOGUE, geo, **common)
        out = torch.full_like(w, float("nan"))
        return launch_wgrad(dy, x, out, geo, **common)

    def exact(x, w, dy):
        x, w, dy = x.double(), w.double(), dy.double()
        if kernel == "fprop":
            return F.conv2d(x, w)
        if kernel == "dgrad":
            return torch.nn.grad.conv2d_input(x.shape, w, dy)
        return torch.nn.grad.conv2d_weight(x, w.shape, dy)

    got = run(x, w, dy)
    nearest = exact(*(_tf32(t, True) for t in (x, w, dy)))
    truncated = exact(*(_tf32(t, False) for t in (x, w, dy)))
    assert relative_error(got, nearest) < 1e-6
    assert relative_error(got, truncated) > 1e-4


def test_prepared_forward_launches_take_the_callers_tensors(monkeypatch):
    """A plan's later forward calls go through its prepared launch with the tensors as the
    caller gives them (a rank-1 problem's 4-D views are made for the first launch only: a
    prepared launch reads addresses, which the views share), for the GEMM and the direct
    depthwise kernels alike: every call against float64, into a poisoned output, and the
    second and third calls reuse the first's launch."""
    from fastconv.backends.triton import depthwise, fprop
    from fastconv.backends.triton.backend import TritonBackend
    from fastconv.backends.triton.configs import TileConfig
    from fastconv.problem import ConvProblem

    reused = []

    def emulated(kernel, grid, ntensors, *args, **meta):
        """launch.prepare's contract in the interpreter (where it has none): the same
        kernel, grid and trailing arguments, new leading tensors."""
        kernel[grid](*args, **meta)

        def again(*tensors):
            reused.append(kernel)
            kernel[grid](*tensors, *args[ntensors:], **meta)
            return True
        return again
    monkeypatch.setattr(fprop, "prepare", emulated)
    monkeypatch.setattr(depthwise, "prepare", emulated)
    cases = [(torch.randn(2, 6, 13, dtype=torch.float64), torch.randn(5, 6, 3, dtype=torch.float64),
              1, TileConfig(16, 16, 16, 4, 1, False, 1)),
             (torch.randn(2, 4, 11, dtype=torch.float64), torch.randn(4, 1, 3, dtype=torch.float64),
              4, None)]
    for x, w, groups, config in cases:
        problem = ConvProblem.from_tensors(x, w, None, 1, ((2, 0),), 1, groups, rank=1)
        run = TritonBackend.bind(problem, config)
        for call in range(3):
            xi, wi = torch.randn_like(x), torch.randn_like(w)
            out = torch.full(problem.output_shape(), float("nan"), dtype=torch.float64)
            before = len(reused)
            assert run(xi, wi, None, None, None, None, out) is out
            want = F.conv1d(F.pad(xi, (2, 0)), wi, None, 1, 0, 1, groups)
            assert relative_error(out, want) < 1e-12, (groups, call)
            assert len(reused) - before == (0 if call == 0 else 1), (groups, call)


def test_last_packed_weight_follows_the_weight_and_its_version():
    """A plan's packed weight (``weights.LastPacked``): the same copy while the same
    weight keeps its version, packed again after an in-place update or for another
    weight, and not kept inside a compiled graph's op (``context.transient``)."""
    from fastconv.backends.triton.weights import LastPacked
    from fastconv.context import transient_operands

    last = LastPacked()
    w = torch.randn(6, 5, 3)  # (K, C, R): channels not fastest
    first = last(w)
    assert first.stride(1) == 1 and torch.equal(first, w)
    assert last(w) is first
    with torch.no_grad():
        w.mul_(2)  # (an optimizer step: the version moves)
    again = last(w)
    assert again is not first and torch.equal(again, w)
    other = torch.randn(6, 5, 3)
    assert torch.equal(last(other), other) and last(w) is again  # (the shared cache)
    with transient_operands():
        fresh = last(w)
        assert torch.equal(fresh, w) and last(w) is not fresh
