"""Sequence convolutions on the GPU: bf16 against float64 within the contract, decode
steps replayed from a CUDA graph, long_conv1d's measured route."""

from __future__ import annotations

import copy

import pytest
import torch

import fastconv
from fastconv.precision import TOLERANCE, Precision, relative_error

pytestmark = pytest.mark.gpu


def _inputs(width: int, layout: str, batch: int = 3, dim: int = 520, seqlen: int = 1031):
    """x (batch, dim, seqlen) in the layout named, weight (dim, width), bias (dim,)."""
    x = torch.randn(batch, dim, seqlen, device="cuda")
    if layout == "dim":
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    return x, torch.randn(dim, width, device="cuda") / width ** 0.5, \
        torch.randn(dim, device="cuda")


@pytest.mark.parametrize("width", [2, 4, 16, 33, 64, 256])
@pytest.mark.parametrize("layout", ["seqlen", "dim"])
def test_causal_conv1d_bf16_within_the_contract(width, layout):
    x, w, b = _inputs(width, layout)
    ref = fastconv.causal_conv1d(x.double(), w.double(), b.double(), activation="silu")
    out = fastconv.causal_conv1d(x.bfloat16(), w.bfloat16(), b.bfloat16(), activation="silu")
    assert out.dtype == torch.bfloat16 and out.isfinite().all()
    assert relative_error(out, ref) <= TOLERANCE[Precision.BF16]


def test_decode_steps_replay_from_a_cuda_graph():
    dim, width = 256, 4
    layer = fastconv.nn.CausalConv1d(dim, width, activation="silu").cuda()
    x = torch.randn(8, dim, 64, device="cuda")
    with torch.no_grad():
        ref = copy.deepcopy(layer).double()(x.double())
        state = layer.new_state(8)
        token = torch.zeros(8, dim, device="cuda")
        out = layer.step(token, state)  # warm-up outside the capture
        state.zero_()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = layer.step(token, state)
        steps = []
        for t in range(64):
            token.copy_(x[..., t])
            graph.replay()
            steps.append(out.clone())
    # float32 on the GPU: torch's TF32 flag for convolutions applies (its default: on)
    assert relative_error(torch.stack(steps, -1), ref) <= TOLERANCE[Precision.TF32]
    assert torch.equal(state, x[..., -(width - 1):])


def test_long_conv1d_measured_route_is_kept_and_correct():
    from fastconv import longconv

    x = torch.randn(2, 64, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16) / 64
    ref = longconv._fft(x.double(), w.double(), None)
    out = fastconv.long_conv1d(x, w)
    assert relative_error(out, ref) <= TOLERANCE[Precision.BF16]
    short = torch.randn(64, 300, device="cuda", dtype=torch.bfloat16) / 17
    fastconv.long_conv1d(x, short)  # timed: both routes
    assert longconv.LONG_CONV_CHOICES[((2, 64, 4096), 300, torch.bfloat16, "cuda")] in (
        "direct", "fft")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch, dim, seqlen, k, layout", [
    (3, 520, 1031, 1031, "seqlen"), (2, 77, 2048, 2048, "seqlen"), (5, 64, 999, 301, "dim")])
def test_fused_fft_route_within_the_contract(dtype, batch, dim, seqlen, k, layout):
    """The fused FFT kernel compiled for the GPU (16-bit tensor-core products), forward and
    backward, against float64; and the route long_conv1d measured for the shape, correct."""
    _check_fused_route(dtype, batch, dim, seqlen, k, layout)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch, dim, seqlen, k, layout", [
    (3, 130, 3001, 3001, "seqlen"), (1, 64, 4100, 7, "dim"), (2, 33, 8192, 5000, "seqlen")])
def test_split_fft_route_within_the_contract(batch, dim, seqlen, k, layout, dtype):
    """Past 4,096 points the fused route runs fftsplit's kernels (offered for bf16 only:
    float16's rows check the kernels before ``fftsplit.eligible`` takes it)."""
    from fastconv import longconv

    assert longconv._fused_kernels(seqlen, k).__name__.endswith("fftsplit")
    _check_fused_route(dtype, batch, dim, seqlen, k, layout)


def _check_fused_route(dtype, batch, dim, seqlen, k, layout):
    """The fused route's forward and backward against float64 (real FFTs), deterministic,
    and long_conv1d's measured route within the contract."""
    from fastconv import longconv

    x, w, b = _inputs(k, layout, batch, dim, seqlen)
    x, w, b = x.to(dtype).requires_grad_(), w.to(dtype).requires_grad_(), \
        b.to(dtype).requires_grad_()
    grad = torch.randn(x.shape, device="cuda", dtype=dtype)
    refs = [t.detach().double().requires_grad_() for t in (x, w, b)]
    ref = longconv._fft(*refs)
    ref.backward(grad.double())
    out = longconv._fused_fft(x, w, b)
    out.backward(grad)
    tol = TOLERANCE[Precision.BF16 if dtype == torch.bfloat16 else Precision.FP16]
    assert out.dtype == dtype and relative_error(out, ref) <= tol
    for mine, theirs in zip((x, w, b), refs):
        assert relative_error(mine.grad, theirs.grad) <= tol
    again = torch.autograd.grad(longconv._fused_fft(x, w, b), (x, w, b), grad)
    assert all(torch.equal(a, t.grad) for a, t in zip(again, (x, w, b)))  # deterministic
    with torch.no_grad():
        assert relative_error(fastconv.long_conv1d(x, w, b), ref) <= tol
    assert longconv.LONG_CONV_CHOICES[((batch, dim, seqlen), k, dtype, "cuda")] in (
        "direct", "fft", "fused_fft")


@pytest.mark.parametrize("width, state_len, layout", [
    (2, 1, "rows"), (4, 3, "rows"), (4, 3, "dim"), (4, 7, "rows"), (64, 63, "rows"),
    (256, 300, "rows"), (256, 300, "dim")])
def test_one_token_steps_in_bf16_within_the_contract(width, state_len, layout):
    """The decode kernel (one token, a state pool, its rows contiguous or dim-contiguous)
    against float64, the pool's other rows untouched and the named rows shifted exactly."""
    batch, dim, rows = 37, 1031, 50
    w = (torch.randn(dim, width, device="cuda") / width ** 0.5).bfloat16()
    b = torch.randn(dim, device="cuda").bfloat16()
    pool = torch.randn(rows, dim, state_len, device="cuda").bfloat16()
    if layout == "dim":
        pool = pool.transpose(1, 2).contiguous().transpose(1, 2)
    index = torch.randperm(rows, device="cuda")[:batch].int()
    x = torch.randn(batch, dim, device="cuda").bfloat16()
    before = pool.clone()
    window = torch.cat([before[index.long()], x.unsqueeze(-1)], -1)[..., -width:]
    ref = torch.nn.functional.silu((window.double() * w.double()).sum(-1) + b.double())
    out = fastconv.causal_conv1d_update(x, pool, w, b, "silu", conv_state_indices=index)
    assert out.dtype == torch.bfloat16 and out.isfinite().all()
    assert relative_error(out, ref) <= TOLERANCE[Precision.BF16]
    want = torch.cat([before[index.long()], x.unsqueeze(-1)], -1)[..., 1:]
    assert torch.equal(pool[index.long()], want)
    others = torch.ones(rows, dtype=torch.bool, device="cuda")
    others[index.long()] = False
    assert torch.equal(pool[others], before[others])


def test_one_token_steps_pad_entries_outside_the_pool():
    """Indices outside the pool (−1, the pool's size, a large one) are padded entries on the
    GPU kernel: zeros out, no pool row touched for them, no out-of-bounds access (a CUDA
    fault would fail the synchronize); the used entries as a step given only them."""
    dim, width, rows = 1031, 4, 9
    w = (torch.randn(dim, width, device="cuda") / 2).bfloat16()
    b = torch.randn(dim, device="cuda").bfloat16()
    pool = torch.randn(rows, dim, 3, device="cuda").bfloat16()
    index = torch.tensor([2, -1, rows, 7, 1 << 30], dtype=torch.int32, device="cuda")
    x = torch.randn(5, dim, device="cuda").bfloat16()
    alone = pool.clone()
    want = fastconv.causal_conv1d_update(x[[0, 3]], alone, w, b, "silu",
                                         conv_state_indices=index[[0, 3]])
    out = fastconv.causal_conv1d_update(x, pool, w, b, "silu", conv_state_indices=index)
    torch.cuda.synchronize()
    assert torch.equal(out[[0, 3]], want) and not out[[1, 2, 4]].any()
    assert torch.equal(pool, alone)


@pytest.mark.parametrize("width", [2, 4, 16, 256])
@pytest.mark.parametrize("layout", ["seqlen", "dim"])
def test_packed_sequences_bf16_within_the_contract(width, layout):
    """The packed kernel (no autograd) on a GPU: bf16 against float64 (the differentiable
    torch route in float64, which the same call takes with autograd), final states exact."""
    from fastconv.tools.bench.seqconv import packed_ids

    x, w, b = _inputs(width, layout)
    batch, dim, seqlen = x.shape
    s = torch.randn(batch, dim, width - 1, device="cuda")
    ids = packed_ids(batch, seqlen, torch.Generator().manual_seed(width)).cuda()
    xd, wd, bd, sd = (t.double().requires_grad_() for t in (x, w, b, s))
    ref, ref_final = fastconv.causal_conv1d(xd, wd, bd, ids, sd, True, "silu")
    with torch.no_grad():
        out, final = fastconv.causal_conv1d(x.bfloat16(), w.bfloat16(), b.bfloat16(), ids,
                                            s.bfloat16(), True, "silu")
    assert out.dtype == torch.bfloat16 and out.isfinite().all()
    assert relative_error(out, ref) <= TOLERANCE[Precision.BF16]
    assert torch.equal(final, ref_final.detach().bfloat16())


@pytest.mark.parametrize("width", [4, 64])
def test_packed_sequence_gradients_bf16_within_the_contract(width):
    """The packed kernels' backward on a GPU: bf16 gradients of x, weight, bias and the
    initial states against the float64 ones (float64 runs the same kernels)."""
    from fastconv.tools.bench.seqconv import packed_ids

    x, w, b = _inputs(width, "dim", seqlen=2100)
    s = torch.randn(x.shape[0], x.shape[1], width - 1, device="cuda")
    ids = packed_ids(x.shape[0], x.shape[2], torch.Generator().manual_seed(width)).cuda()
    g = torch.randn_like(x)
    grads = {}
    for dtype in (torch.float64, torch.bfloat16):
        args = [t.to(dtype).requires_grad_() for t in (x, w, b, s)]
        out = fastconv.causal_conv1d(*args[:3], ids, args[3], activation="silu")
        grads[dtype] = torch.autograd.grad(out, args, g.to(dtype))
    for got, want in zip(grads[torch.bfloat16], grads[torch.float64]):
        assert got.dtype == torch.bfloat16 and got.isfinite().all()
        assert relative_error(got, want) <= TOLERANCE[Precision.BF16]


@pytest.mark.parametrize("width", [20, 33, 64, 256])
@pytest.mark.parametrize("layout", ["seqlen", "dim"])
def test_wide_filter_gradients_bf16_within_the_contract(width, layout):
    """The tensor-core kernels' backward on a GPU (widths from 32, and from 18 with x
    dim-contiguous, through a seqlen-contiguous copy, the output dim-contiguous; seqlen-
    contiguous width 20 takes fastconv.conv1d's route): bf16 output and gradients of x,
    weight, bias and the initial states against float64 (which runs fastconv.conv1d's
    route: another computation)."""
    x, w, b = _inputs(width, layout, seqlen=2100)
    s = torch.randn(x.shape[0], x.shape[1], width - 1, device="cuda")
    g = torch.randn_like(x)
    results = {}
    for dtype in (torch.float64, torch.bfloat16):
        args = [t.to(dtype).requires_grad_() for t in (x, w, b, s)]
        out = fastconv.causal_conv1d(*args[:3], None, args[3], activation="silu")
        results[dtype] = (out, *torch.autograd.grad(out, args, g.to(dtype)))
    assert results[torch.bfloat16][0].stride(2 if layout == "seqlen" else 1) == 1
    for got, want in zip(results[torch.bfloat16], results[torch.float64]):
        assert got.dtype == torch.bfloat16 and got.isfinite().all()
        assert relative_error(got, want) <= TOLERANCE[Precision.BF16]


@pytest.mark.parametrize("width", [2, 4, 9, 10, 16, 17])
@pytest.mark.parametrize("layout", ["seqlen", "dim"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_training_kernels_within_the_contract(width, layout, dtype, monkeypatch):
    """The kernels of causal_conv1d's training route (the size rule lowered to any size) on
    a GPU, shortconv.py's (16-bit and float32, widths ≤ 17, both layouts) and packed.py's
    (float64): output and gradients of x, weight, bias and the initial states
    against torch's F.conv1d in float64 (another computation), every dtype within its
    contract, many windows along a row of 2,100 positions."""
    from fastconv import seqconv

    monkeypatch.setattr(seqconv, "_TRAIN_KERNELS_MIN_NUMEL", 0)
    x, w, b = _inputs(width, layout, batch=2, dim=130, seqlen=2100)
    s = torch.randn(x.shape[0], x.shape[1], width - 1, device="cuda")
    g = torch.randn_like(x)
    want_args = [t.double().requires_grad_() for t in (x, w, b, s)]
    full = torch.cat([want_args[3], want_args[0]], -1)
    want_out = torch.nn.functional.silu(torch.nn.functional.conv1d(
        full, want_args[1].unsqueeze(1), want_args[2], groups=x.shape[1]))
    want = (want_out, *torch.autograd.grad(want_out, want_args, g.double()))
    args = [t.to(dtype).requires_grad_() for t in (x, w, b, s)]
    out = fastconv.causal_conv1d(*args[:3], None, args[3], activation="silu")
    got = (out, *torch.autograd.grad(out, args, g.to(dtype)))
    tol = {torch.bfloat16: TOLERANCE[Precision.BF16], torch.float32: TOLERANCE[Precision.IEEE],
           torch.float64: 1e-12}[dtype]
    for a, c in zip(got, want):
        assert a.dtype == dtype and a.isfinite().all()
        assert relative_error(a, c) <= tol


@pytest.mark.parametrize("width", [4, 16])
@pytest.mark.parametrize("layout", ["seqlen", "dim"])
def test_packed_sequences_on_the_short_kernels_within_the_contract(width, layout,
                                                                   monkeypatch):
    """Packed sequences (seq_idx) in bf16 through shortconv.py's kernels, forward and
    training: output and every gradient against the torch route in float64 (seq_idx's
    masked taps, another computation), sequences of 1 to 700 positions."""
    from fastconv import seqconv

    monkeypatch.setattr(seqconv, "_TRAIN_KERNELS_MIN_NUMEL", 0)
    x, w, b = _inputs(width, layout, batch=2, dim=130, seqlen=2100)
    s = torch.randn(2, 130, width - 1, device="cuda")
    cuts = torch.tensor([1, 2, 9, 700, 701, 1400, 2099], device="cuda")
    seq_idx = torch.stack([(torch.arange(2100, device="cuda")[:, None] >= cuts).sum(1),
                           torch.zeros(2100, device="cuda", dtype=torch.int64)]).int()
    g = torch.randn_like(x)
    want_args = [t.double().requires_grad_() for t in (x, w, b, s)]
    want_out = seqconv._packed_torch(*want_args[:3], seq_idx, want_args[3], False, "silu")
    want = (want_out, *torch.autograd.grad(want_out, want_args, g.double()))
    args = [t.bfloat16().requires_grad_() for t in (x, w, b, s)]
    out = fastconv.causal_conv1d(*args[:3], seq_idx, args[3], activation="silu")
    got = (out, *torch.autograd.grad(out, args, g.bfloat16()))
    for a, c in zip(got, want):
        assert a.dtype == torch.bfloat16 and a.isfinite().all()
        assert relative_error(a, c) <= TOLERANCE[Precision.BF16]
    with torch.no_grad():
        alone = fastconv.causal_conv1d(*args[:3], seq_idx, args[3], activation="silu")
    assert relative_error(alone, want_out) <= TOLERANCE[Precision.BF16]


def test_training_kernels_replay_from_a_cuda_graph(monkeypatch):
    """A training step of shortconv's kernels (forward, backward, the weight sums) captured
    in one CUDA graph and replayed on new inputs gives eager's results bit for bit."""
    from fastconv import seqconv

    monkeypatch.setattr(seqconv, "_TRAIN_KERNELS_MIN_NUMEL", 0)
    x, w, b = (t.bfloat16() for t in _inputs(4, "seqlen", batch=2, dim=130, seqlen=2100))
    args = [t.clone().requires_grad_() for t in (x, w, b)]
    g = torch.randn_like(x)

    def step():
        out = fastconv.causal_conv1d(*args, activation="silu")
        return (out, *torch.autograd.grad(out, args, g))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for _ in range(2):
        with torch.no_grad():
            for t in (*args, g):
                t.copy_(torch.randn_like(t) * t.abs().mean())
        graph.replay()
        eager = step()
        for a, c in zip(captured, eager):
            assert torch.equal(a, c)


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
@pytest.mark.parametrize("packed", [False, True])
def test_inductor_graphs_run_the_short_kernels(mode, packed, monkeypatch):
    """torch.compile (Inductor, fullgraph; and in CUDA graphs) of a block with causal_conv1d
    between elementwise work, x dim-contiguous and a view (a projection's output split in
    two, as Mamba's blocks pass it): the compiled graph calls seq_ops.short_conv, and its
    output and gradients are eager's (the same kernels) within bf16's contract of float64
    over three steps on new inputs."""
    from fastconv import seq_ops, seqconv

    monkeypatch.setattr(seqconv, "_TRAIN_KERNELS_MIN_NUMEL", 0)
    calls = []  # (the op's implementation, looked up at each call)
    real = seq_ops.IMPLEMENTATION["forward"]
    monkeypatch.setitem(seq_ops.IMPLEMENTATION, "forward",
                        lambda *a: calls.append(1) or real(*a))
    dim, seqlen = 136, 1031
    w = (torch.randn(dim, 4, device="cuda") / 2).bfloat16().requires_grad_()
    b = torch.randn(dim, device="cuda").bfloat16().requires_grad_()
    seq_idx = (torch.arange(seqlen, device="cuda") >= 500).int().expand(2, -1).contiguous() \
        if packed else None

    def block(h, w, b):
        x, z = h.transpose(1, 2).chunk(2, dim=1)
        y = fastconv.causal_conv1d(x * 2, w, b, seq_idx, activation="silu")
        return y * torch.nn.functional.silu(z)
    compiled = torch.compile(block, fullgraph=True, mode=mode)
    for _ in range(3):
        h = torch.randn(2, seqlen, 2 * dim, device="cuda").bfloat16().requires_grad_()
        g = torch.randn(2, dim, seqlen, device="cuda").bfloat16()
        got = compiled(h, w, b)
        got = (got, *torch.autograd.grad(got, (h, w, b), g))
        args = [t.detach().double().requires_grad_() for t in (h, w, b)]
        want = block(*args)
        want = (want, *torch.autograd.grad(want, args, g.double()))
        for a, c in zip(got, want):
            assert a.dtype == torch.bfloat16 and a.isfinite().all()
            assert relative_error(a, c) <= TOLERANCE[Precision.BF16]
    assert calls  # (under CUDA graphs the replays call nothing)


def test_a_projection_view_through_dispatch_timing():
    """A causal depthwise fastconv.conv1d on x a dim-contiguous view of a projection's
    output (row stride 2·dim, as Mamba's blocks pass it; causal_conv1d's route before its
    short kernels took this layout): dispatch times the candidates on operand-set copies,
    and the output is within bf16's contract at two lengths in one process (dense copies
    from clone() under a kernel prepared for the view read past their end: an illegal
    memory access)."""
    torch.manual_seed(5)
    for seqlen in (1024, 2048):
        h = torch.randn(8, seqlen, 2 * 1536, device="cuda", dtype=torch.bfloat16)
        x = h.transpose(1, 2)[:, :1536]
        w = (torch.randn(1536, 1, 4, device="cuda") / 2).bfloat16()
        b = torch.randn(1536, device="cuda").bfloat16()
        out = fastconv.conv1d(x, w, b, padding=((3, 0),), groups=1536, activation="silu",
                              dispatch="benchmark")  # (run_gpu.sh's tests: heuristic)
        ref = torch.nn.functional.silu(torch.nn.functional.conv1d(
            x.double(), w.double(), b.double(), padding=3, groups=1536)[..., :seqlen])
        torch.cuda.synchronize()
        assert relative_error(out, ref) <= TOLERANCE[Precision.BF16]
