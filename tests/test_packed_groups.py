"""Grouped convolutions run as fewer, wider groups with a block-diagonal weight
(configs.pack_candidates, binds._bind_packed_groups): forward with the epilogue, data and
weight gradients against float64 torch into poisoned outputs, both layouts, rank 1 and 2;
the weight expansion itself; which problems get such tiles."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from fastconv.backends.triton import weights
from fastconv.backends.triton.backend import TritonBackend
from fastconv.backends.triton.configs import TileConfig, pack_candidates
from fastconv.epilogue import Epilogue
from fastconv.precision import relative_error
from fastconv.problem import ConvProblem

# (N, C, K, groups, spatial, kernel, stride, padding, dilation, pack)
CASES = [
    (2, 16, 16, 4, (7, 9), 3, 1, 1, 1, 2),
    (1, 16, 8, 4, (6, 5), 3, 1, 1, 1, 4),     # every group in one: a dense weight
    (2, 24, 12, 6, (8, 5), 3, 2, 1, 1, 3),    # stride 2, fewer outputs than inputs
    (2, 12, 18, 6, (11,), 3, 2, 2, 2, 2),     # rank 1, stride and dilation
    (1, 8, 8, 4, (5, 4), 2, 3, 0, 1, 2),      # stride > kernel
]
_IDS = [f"r{len(c[4])}g{c[3]}p{c[9]}s{c[6]}" for c in CASES]


def _layout(t, channels_last):
    if not channels_last:
        return t
    if t.dim() == 4:
        return t.contiguous(memory_format=torch.channels_last)
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def _conv(spatial):
    return F.conv2d if len(spatial) == 2 else F.conv1d


@pytest.mark.parametrize("channels_last", [False, True], ids=["cfirst", "clast"])
@pytest.mark.parametrize("case", CASES, ids=_IDS)
@pytest.mark.slow_after(3)
def test_packed_groups_forward_and_gradients(case, channels_last):
    n, c, k, groups, spatial, ks, stride, padding, dilation, pack = case
    x = torch.randn(n, c, *spatial, dtype=torch.float64, requires_grad=True)
    w = torch.randn(k, c // groups, *([ks] * len(spatial)), dtype=torch.float64,
                    requires_grad=True)
    y = _conv(spatial)(x, w, None, stride, padding, dilation, groups)
    g = torch.randn_like(y)
    want_dx, want_dw = torch.autograd.grad(y, (x, w), g)
    x, w, y = x.detach(), w.detach(), y.detach()
    shift, res = torch.randn(k, dtype=torch.float64), torch.randn_like(y)
    want = F.silu(y + shift.view(1, -1, *([1] * len(spatial))) + res)
    x, g, res = (_layout(t, channels_last) for t in (x, g, res))
    problem = ConvProblem.from_tensors(
        x, w, None, stride, padding, dilation, groups, rank=len(spatial),
        epilogue=Epilogue("silu", has_shift=True, has_residual=True))
    config = TileConfig(32, 16, 16, 4, 1, False, 1, pack)

    out = torch.full_like(res, float("nan"))
    TritonBackend.bind(problem, config)(x, w, None, None, shift, res, out)
    dx = torch.full_like(x, float("nan"))
    TritonBackend.bind(problem, config, "dgrad")(g, w, dx)
    dw = torch.full_like(w, float("nan"))
    TritonBackend.bind(problem, config, "wgrad")(g, x, dw)
    for got, ref in ((out, want), (dx, want_dx), (dw, want_dw)):
        assert torch.isfinite(got).all()
        assert relative_error(got, ref) < 1e-12
    fresh = TritonBackend.bind(problem, config, "wgrad")(g, x, None)  # allocated by the call
    assert fresh.shape == w.shape and fresh.is_contiguous()
    assert relative_error(fresh, want_dw) < 1e-12


def test_expanded_weight_is_block_diagonal():
    """The expanded weight holds each group's weight in its block and zeros elsewhere (a
    non-finite weight stays in its own output channel); its diagonal blocks give it back;
    an in-place change of the weight is seen by the next call (cache keyed by version)."""
    groups, pack, kg, cg = 6, 3, 2, 4
    w = torch.randn(groups * kg, cg, 3, 3, dtype=torch.float64)
    w[5, 1, 0, 0] = float("inf")
    full = weights.packed_weight(w, 1, groups, pack)
    assert full.shape == (groups * kg, pack * cg, 3, 3)
    assert full.stride(1) == 1  # channels fastest, as the forward reads it
    for out_ch in range(groups * kg):
        block = (out_ch // kg) % pack
        row = full[out_ch].unflatten(0, (pack, cg))
        assert torch.equal(row[block], w[out_ch])
        others = torch.cat([row[b] for b in range(pack) if b != block])
        assert torch.equal(others, torch.zeros_like(others))
    assert torch.equal(weights.diagonal_blocks(full, groups, pack), w)
    assert weights.packed_weight(w, 1, groups, pack) is full
    w.mul_(2)
    again = weights.packed_weight(w, 1, groups, pack)
    assert again is not full and torch.equal(weights.diagonal_blocks(again, groups, pack), w)
    assert weights.packed_weight(w, 0, groups, pack).stride(0) == 1  # dgrad's order


def _problem(c, k, groups, dtype=torch.bfloat16, **kw):
    return ConvProblem(rank=2, n=64, c=c, k=k, in_size=(28, 28), out_size=(28, 28),
                       kernel=(3, 3), stride=(1, 1), pad_pre=(1, 1), pad_post=(1, 1),
                       dilation=(1, 1), groups=groups, dtype=dtype, layout="nhwc",
                       device="cuda", **kw)


def test_which_problems_get_packed_tiles():
    """ResNeXt's narrow groups get packs reaching 32 and 64 channels (packs dividing the
    group count), for every op; dense, wide-group and transposed problems get none."""
    for c, packs in ((128, {8, 16}), (256, {4, 8}), (512, {2, 4}), (1024, {2})):
        problem = _problem(c, c, 32)
        for op in ("fprop", "dgrad", "wgrad"):
            cands = pack_candidates(problem, op)
            assert {t.pack_groups for t in cands} == packs, (c, op)
            assert all(problem.groups % t.pack_groups == 0 for t in cands)
    assert pack_candidates(_problem(64, 64, 1), "fprop") == []
    assert pack_candidates(_problem(2048, 2048, 32), "fprop") == []  # 64 per group
    assert pack_candidates(_problem(128, 128, 32, transposed=True), "fprop") == []
    assert pack_candidates(_problem(12, 12, 3), "fprop") == []  # no pack reaches 32


def test_packed_tile_round_trips_through_the_plan_cache_format():
    config = TileConfig(64, 64, 32, 4, 3, False, 1, 8)
    data = {"__dataclass__": "TileConfig", **dataclasses.asdict(config)}
    assert TritonBackend.decode_config(data) == config
    assert config.name().endswith("g8")
    old = {k: v for k, v in data.items() if k != "pack_groups"}  # a cache from before
    assert TritonBackend.decode_config(old).pack_groups == 1
