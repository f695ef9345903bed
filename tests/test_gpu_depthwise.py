"""GPU tests of the depthwise kernels at the benchmark suites' sizes (depthwise,
conv1d_short, every depthwise_models layer, a 13x13 layer): forward, data and weight
gradients against float64 in fp32, bf16 and fp16, channels-first and channels-last, and
every tile candidate on one layer."""

import pytest
import torch
import torch.nn.functional as F

import fastconv
from fastconv.backends.triton import depthwise
from fastconv.precision import TOLERANCE, Precision, relative_error
from fastconv.tools.bench import suites

pytestmark = pytest.mark.gpu

CASES = [c for c in suites.get("depthwise") + suites.get("conv1d_short") if c.groups == c.c]
# 7x7 (convnext): the forward loops over kernel rows at run time (depthwise.UNROLLED_TAPS)
CASES += [c for c in suites.get("depthwise_models") if c.name in ("dwm_384_14_k7",
                                                                   "dwm_768_7_k7")]
# a large-kernel layer (RepLKNet's 13x13 at 14x14): the kernels past the roll tiles' 7 rows
CASES += [suites.BenchCase("dw_lk_256_14_k13", 32, 256, 256, (14, 14), (13, 13), 1, 6,
                           groups=256)]
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
@pytest.mark.parametrize("dtype", list(PRECISIONS), ids=str)
def test_every_depthwise_models_layer(dtype, channels_last):
    """Every layer of the depthwise_models suite (its channels, sizes, kernels and strides;
    batch 4) through the Triton kernels dispatch picks for it: forward, data and weight
    gradients against float64. One test per precision and layout: the layers share their
    compiled kernels (sizes are run-time arguments), so the loop costs little beyond them."""
    for case in suites.get("depthwise_models"):
        x, w = _tensors(case, dtype, channels_last)
        xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        y, ref = _conv(case, x, w, True), _conv(case, xr, wr, False)
        tol = TOLERANCE[PRECISIONS[dtype]]
        assert relative_error(y, ref) <= tol, case.name
        g = torch.randn_like(ref)
        got = torch.autograd.grad(y, (x, w), g.to(dtype))
        want = torch.autograd.grad(ref, (xr, wr), g)
        assert relative_error(got[0], want[0]) <= tol, (case.name, "dx")
        assert relative_error(got[1], want[1]) <= tol, (case.name, "dw")


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



@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_pairs_candidates_are_correct(dtype):
    """Every pair-word tile (dw_pairs.py) on the causal conv1d cases and a stride-1 depthwise
    conv2d layer, channels-first, into poisoned outputs, against float64."""
    from fastconv.backends.triton import dw_pairs
    from fastconv.backends.triton.backend import TritonBackend

    cases = [c for c in CASES if c.causal] + [suites.get("depthwise")[0]]
    for case in cases:
        x, w = _tensors(case, dtype, False)
        x, w = x.detach(), w.detach()
        ref = _conv(case, x.double(), w.double(), False)
        problem = fastconv.ConvProblem.from_tensors(x, w, None, case.stride,
                                                    case.padding_arg(), case.dilation,
                                                    case.groups, rank=case.rank)
        configs = [c for c in TritonBackend.candidates(problem) if c.pairs]
        assert configs, case.name
        for config in configs:
            out = torch.full(problem.output_shape(), float("nan"), device="cuda",
                             dtype=dtype)
            four = [t if t.dim() == 4 else t.unsqueeze(2) for t in (x, out)]
            assert dw_pairs.eligible(*four, None, 1)
            TritonBackend.bind(problem, config)(x, w, None, None, None, None, out)
            assert not out.isnan().any(), (case.name, config.name())
            assert relative_error(out, ref) <= TOLERANCE[PRECISIONS[dtype]], \
                (case.name, config.name())

@pytest.mark.parametrize("dtype", list(PRECISIONS), ids=str)
def test_roll_candidates_are_correct(dtype):
    """Every dw_roll.py tile, forward with a folded-BN epilogue and (stride 1) the data
    gradient, and every dw_wgrad.py tile, channels-last, into poisoned outputs against
    float64: ConvNeXt's 7x7, a 3x3 stride-2 and a 5x5 layer at batch 4."""
    from fastconv.backends.triton.backend import TritonBackend
    from fastconv.backends.triton.depthwise import _ROLL_WGRAD, DwConfig
    from fastconv.epilogue import Epilogue

    names = ("dwm_96_56_k7", "dwm_144_56_k3_s2", "dwm_672_14_k5", "dwm_768_7_k7")
    for case in [c for c in suites.get("depthwise_models") if c.name in names]:
        x, w = _tensors(case, dtype, True)
        x, w = x.detach(), w.detach()
        shift = torch.randn(case.k, device="cuda")
        ref = F.relu(_conv(case, x.double(), w.double(), False)
                     + shift.double().view(1, -1, 1, 1))
        problem = fastconv.ConvProblem.from_tensors(
            x, w, None, case.stride, case.padding_arg(), case.dilation, case.groups, rank=2,
            epilogue=Epilogue("relu", has_shift=True))
        g = torch.randn_like(ref)
        xr = x.double().requires_grad_()
        (want_dx,) = torch.autograd.grad(_conv(case, xr, w.double(), False), xr, g)
        tol = TOLERANCE[PRECISIONS[dtype]]
        configs = [c for c in TritonBackend.candidates(problem) if c.roll]
        assert configs, case.name
        for config in configs:
            out = torch.full(problem.output_shape(), float("nan"), device="cuda",
                             dtype=dtype).contiguous(memory_format=torch.channels_last)
            TritonBackend.bind(problem, config)(x, w, None, None, shift, None, out)
            assert not out.isnan().any(), (case.name, config.name())
            assert relative_error(out, ref) <= tol, (case.name, config.name())
            if case.stride == 1:
                dx = torch.full_like(x, float("nan"))
                TritonBackend.bind(problem, config, "dgrad")(g.to(dtype), w, dx)
                assert relative_error(dx, want_dx) <= tol, (case.name, config.name(), "dx")
        # dw_wgrad.py's tiles: the weight gradient of the bare convolution (every stride)
        wr = w.double().requires_grad_()
        (want_dw,) = torch.autograd.grad(_conv(case, x.double(), wr, False), wr, g)
        for config in [DwConfig(*t, roll=rows) for *t, rows in _ROLL_WGRAD]:
            dw = torch.full_like(w, float("nan"))
            TritonBackend.bind(problem, config, "wgrad")(g.to(dtype), x, dw)
            assert relative_error(dw, want_dw) <= tol, (case.name, config.name(), "dw")


def _grouped_layers(dtype, channels_last, names=None):
    """ResNeXt's grouped 3x3 layers (suite grouped, or those of ``names``) at batch 2:
    (name, problem, x, w, dy, float64 results by op) with ``x`` in the layout asked for."""
    from fastconv.problem import ConvProblem

    for case in suites.get("grouped"):
        if names is not None and case.name not in names:
            continue
        x = torch.randn(2, case.c, *case.spatial, device="cuda").to(dtype)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        w = (torch.randn(case.k, case.c // case.groups, *case.kernel, device="cuda")
             / 6).to(dtype)
        pad = case.padding_arg()
        xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
        ref = F.conv2d(xr, wr, None, case.stride, pad, 1, case.groups)
        g = torch.randn_like(ref)
        want = dict(zip(("dgrad", "wgrad"), torch.autograd.grad(ref, (xr, wr), g)))
        want["fprop"] = ref.detach()
        problem = ConvProblem.from_tensors(x, w, None, case.stride, pad, 1, case.groups,
                                           rank=2)
        yield case.name, problem, x, w, g.to(dtype), want


@pytest.mark.parametrize("channels_last", [False, True], ids=["cfirst", "clast"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_grouped_direct_candidates_are_listed_and_correct(dtype, channels_last):
    """ResNeXt's grouped 3x3 layers with 4, 8 (stride 2) and 32 channels per group (batch
    2; all seven took ~140 s per parametrization, every tile compiled per layer and op):
    the Triton backend lists the direct kernels' tiles among its candidates, and each
    computes the forward (into a poisoned output), dx and dw within the contract against
    float64."""
    from fastconv.backends.triton.backend import TritonBackend

    tol = TOLERANCE[PRECISIONS[dtype]]  # the direct kernels compute in fp32 FMA
    layers = ("rx50_128_56", "rx50_256_56_s2", "rx50_1024_7")
    seen = []
    for name, problem, x, w, g, want in _grouped_layers(dtype, channels_last, layers):
        seen.append(name)
        for op in ("fprop", "dgrad", "wgrad"):
            direct = [c for c in TritonBackend.candidates(problem, op)
                      if isinstance(c, depthwise.DwConfig)]
            assert direct, (name, op)
        for config in direct:
            out = torch.full_like(want["fprop"], float("nan"), dtype=dtype)
            TritonBackend.bind(problem, config)(x, w, None, None, None, None, out)
            assert relative_error(out, want["fprop"]) <= tol, (name, config)
            dx = TritonBackend.bind(problem, config, "dgrad")(g, w, None)
            dw = TritonBackend.bind(problem, config, "wgrad")(g, x, None)
            assert relative_error(dx, want["dgrad"]) <= tol, (name, config, "dx")
            assert relative_error(dw, want["wgrad"]) <= tol, (name, config, "dw")
    assert seen == list(layers), seen


@pytest.mark.parametrize("channels_last", [False, True], ids=["cfirst", "clast"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_grouped_packed_candidates_are_correct(dtype, channels_last):
    """ResNeXt's grouped 3x3 layers (suite grouped, batch 2) through every packed-group tile
    (groups run as fewer groups of a block-diagonal weight): forward into a poisoned output,
    dx and dw into poisoned buffers, within the contract against float64."""
    from fastconv.backends.triton.backend import TritonBackend

    for case_name, problem, x, w, g, want in _grouped_layers(dtype, channels_last):
        ref = want["fprop"]
        tol = TOLERANCE[problem.precision]  # GEMM tiles: fp32 runs as torch's flags say (TF32)
        for op, operands, like in (("fprop", (x, w), ref), ("dgrad", (g, w), x),
                                   ("wgrad", (g, x), w)):
            packed = [c for c in TritonBackend.candidates(problem, op)
                      if getattr(c, "pack_groups", 1) > 1]
            assert packed, (case_name, op)
            for config in packed:
                out = torch.full_like(like, float("nan"), dtype=dtype)
                run = TritonBackend.bind(problem, config, op)
                if op == "fprop":
                    run(*operands, None, None, None, None, out)
                else:
                    run(*operands, out)
                assert torch.isfinite(out).all(), (case_name, op, config.name())
                err = relative_error(out, want[op])
                assert err <= tol, (case_name, op, config.name(), err)
