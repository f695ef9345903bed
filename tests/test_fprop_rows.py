"""Row tiles of the forward kernel (TileConfig.rows: consecutive columns of one output row,
channels-first tensors read and written as they are) against float64 torch: rank 1 with
groups, stride, dilation, padding, kernel longer than the input, the fused epilogue, and
poisoned outputs; and which problems list them."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import fastconv
from fastconv.backends.triton import configs
from fastconv.backends.triton.backend import TritonBackend
from fastconv.precision import relative_error
from fastconv.problem import ConvProblem

# (N, C, K, L, kernel, stride, padding, dilation, groups)
CASES = [
    (2, 8, 12, 37, 3, 1, 1, 1, 1),
    (3, 8, 16, 41, 5, 2, 2, 1, 4),      # grouped, stride 2
    (1, 6, 6, 29, 3, 1, 2, 2, 3),       # dilation
    (2, 4, 8, 7, 9, 1, 4, 1, 1),        # kernel longer than the input
    (2, 32, 20, 50, 3, 4, 1, 1, 2),     # stride > kernel, 16 channels per group (tap loop)
]
ROWS = configs.TileConfig(32, 16, 16, 4, 1, False, rows=True)


@pytest.mark.parametrize("flat", [False, True], ids=["taps", "flat"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"k{c[4]}s{c[5]}d{c[7]}g{c[8]}")
def test_rows_forward_matches_float64(case, flat):
    n, c, k, length, ks, stride, pad, dil, groups = case
    x = torch.randn(n, c, length, dtype=torch.float64)
    w = torch.randn(k, c // groups, ks, dtype=torch.float64)
    scale, shift = torch.rand(k, dtype=torch.float64) + 0.5, torch.randn(k, dtype=torch.float64)
    ref = F.conv1d(x, w, None, stride, pad, dil, groups)
    res = torch.randn_like(ref)
    want = F.relu(ref * scale[:, None] + shift[:, None] + res)
    problem = ConvProblem.from_tensors(x, w, None, stride, pad, dil, groups, rank=1,
                                       epilogue=fastconv.Epilogue(activation="relu",
                                                                  has_shift=True))
    out = torch.full_like(ref, float("nan"))  # poisoned: every element must be written
    config = dataclasses.replace(ROWS, flat_k=flat)
    TritonBackend.bind(problem, config)(x, w, None, scale, shift, res, out)
    assert relative_error(out, want) < 1e-12


def test_rows_listed_for_channels_first_rank1_forwards_only():
    x, w = torch.randn(2, 32, 30), torch.randn(16, 32, 3)
    conv1d = ConvProblem.from_tensors(x, w, None, 1, 1, rank=1)
    tiles = configs.rows_candidates(conv1d)
    # 16 outputs: no tile wider than 64 columns; 32 channels: reduction blocks of at most 32
    assert tiles and all(t.rows and t.block_n == 64 and t.block_k <= 32 for t in tiles)
    wide = ConvProblem.from_tensors(x.bfloat16(), torch.randn(512, 32, 3).bfloat16(), None,
                                    1, 1, rank=1)
    assert {t.block_n for t in configs.rows_candidates(wide)} == {64, 128, 256}
    nlc = ConvProblem.from_tensors(x.transpose(1, 2).contiguous().transpose(1, 2), w, None,
                                   1, 1, rank=1)
    conv2d = ConvProblem.from_tensors(x[..., None], w[..., None], None, 1, 1, rank=2)
    few = ConvProblem.from_tensors(x[:, :8], w[:, :8], None, 1, 1, rank=1)  # flat reduction
    transposed = ConvProblem.from_tensors(x, w.transpose(0, 1).contiguous(), None, 1, 1,
                                          rank=1, transposed=True)
    for problem in (nlc, conv2d, few, transposed):
        assert configs.rows_candidates(problem) == []
