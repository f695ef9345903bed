"""The 16-bit pair-word depthwise forward (backends/triton/dw_pairs.py) against float64 torch
on the same 16-bit inputs: rank 1 and 2, causal and symmetric padding, dilation, channel
multipliers, row stride, a kernel longer than the input, a 9x9 kernel (its rows looped at
run time), the epilogue, poisoned outputs;
and the backend's choice between it and the generic kernel."""

import pytest
import torch
import torch.nn.functional as F

import fastconv
from fastconv.backends.triton import depthwise, dw_pairs
from fastconv.backends.triton.backend import TritonBackend
from fastconv.backends.triton.launchargs import EpilogueArgs, Geometry
from fastconv.precision import relative_error
from fastconv.problem import ConvProblem

# (N, C, multiplier, spatial, kernel, stride_h, (pad_h, pad_left, pad_right), dilation)
CASES = [
    (2, 5, 1, (1, 22), (1, 4), 1, (0, 3, 0), 1),     # causal conv1d k=4
    (3, 3, 1, (1, 18), (1, 3), 1, (0, 1, 1), 1),     # symmetric k=3
    (2, 4, 2, (1, 20), (1, 5), 1, (0, 4, 4), 2),     # dilation 2, multiplier 2
    (1, 3, 1, (1, 6), (1, 9), 1, (0, 4, 4), 1),      # kernel longer than the input
    (2, 6, 1, (1, 16), (1, 2), 1, (0, 1, 0), 3),     # odd left padding, odd dilation
    (2, 3, 1, (7, 10), (3, 3), 2, (1, 1, 1), 1),     # rank 2, row stride 2
    (1, 4, 3, (5, 12), (2, 5), 1, (0, 2, 2), 1),     # rank 2, multiplier 3, wide kernel
    (1, 3, 1, (9, 12), (9, 9), 1, (4, 4, 4), 1),     # 9x9: rows looped at run time
]
TOL = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}  # one unit in the last place


def _run(case, dtype, epilogue=False):
    n, c, mult, (h, w), (r, s), stride_h, (pad_h, left, right), dil = case
    x = torch.randn(n, c, h, w).to(dtype)
    wt = torch.randn(c * mult, 1, r, s).to(dtype)
    ref = F.conv2d(F.pad(x.double(), (left, right)), wt.double(), None, (stride_h, 1),
                   (pad_h, 0), (1, dil), c)
    scale = shift = res = None
    act = 0
    if epilogue:
        scale = torch.rand(c * mult) + 0.5
        shift = torch.randn(c * mult)
        res = torch.randn(ref.shape).to(dtype)
        ref = F.silu(ref * scale.double()[:, None, None] + shift.double()[:, None, None]
                     + res.double())
        act = fastconv.ACTIVATIONS.index("silu")
    out = torch.full(ref.shape, float("nan"), dtype=dtype)  # poisoned: every word written
    assert dw_pairs.eligible(x, out, res, 1)
    dw_pairs.launch_fprop(x, wt, out, EpilogueArgs(scale, shift, res, act),
                          Geometry((stride_h, 1), (pad_h, left), (1, dil)), channels_last=False,
                          config=depthwise.DwConfig(2, 8, 4, pairs=True), int64=False)
    return out, ref


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"h{c[3][0]}k{c[4][1]}d{c[7]}m{c[2]}")
@pytest.mark.slow_after(4)
def test_pairs_forward_matches_float64(case, dtype):
    out, ref = _run(case, dtype)
    assert not out.isnan().any(), "an output word was not written"
    # fp32 accumulation of a few taps, one rounding to the 16-bit type: within one ulp
    err = (out.double() - ref).abs()
    assert (err <= TOL[dtype] * ref.abs() + 1e-6).all(), err.max()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_pairs_forward_epilogue(dtype):
    out, ref = _run(CASES[0], dtype, epilogue=True)
    assert not out.isnan().any()
    assert relative_error(out, ref) < 2 * TOL[dtype]


def test_eligibility_needs_words():
    x = torch.randn(2, 3, 1, 10, dtype=torch.bfloat16)
    out = torch.empty(2, 3, 1, 10, dtype=torch.bfloat16)
    assert dw_pairs.eligible(x, out, None, 1)
    assert not dw_pairs.eligible(x, out, None, 2)                     # column stride
    assert not dw_pairs.eligible(x.float(), out.float(), None, 1)     # 32-bit type
    assert not dw_pairs.eligible(x[..., 1:9], out, None, 1)           # odd element offset
    assert not dw_pairs.eligible(x[..., :9], out, None, 1)            # odd width
    assert not dw_pairs.eligible(x.transpose(1, 3).contiguous().transpose(1, 3), out, None, 1)


@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "odd-offset"])
def test_backend_runs_pairs_only_where_eligible(monkeypatch, offset):
    """A pairs tile runs dw_pairs.py on word-addressable tensors and the generic kernel on
    others (here an input that starts at an odd element), with the same result."""
    base = torch.randn(2 * 4 * 17 + 1).to(torch.bfloat16)
    x = base[offset:offset + 2 * 4 * 16].view(2, 4, 16)
    w = torch.randn(4, 1, 4).to(torch.bfloat16)
    problem = ConvProblem.from_tensors(x, w, None, 1, ((3, 0),), 1, 4, rank=1)  # causal
    cands = TritonBackend.candidates(problem)
    pairs = [c for c in cands if c.pairs]
    assert pairs and not any(c.pairs for c in TritonBackend.candidates(problem, "dgrad"))
    calls = []
    launch = dw_pairs.launch_fprop
    monkeypatch.setattr(dw_pairs, "launch_fprop", lambda *a, **k: calls.append(1) or
                        launch(*a, **k))
    y = TritonBackend.bind(problem, pairs[0])(x, w, None, None, None, None, None)
    ref = F.conv1d(F.pad(x.double(), (3, 0)), w.double(), None, 1, 0, 1, 4)
    assert bool(calls) == (offset == 0)
    assert relative_error(y, ref) < 2 * TOL[torch.bfloat16]
