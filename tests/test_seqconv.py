"""causal_conv1d, causal_conv1d_update, CausalConv1d and long_conv1d against float64
references written from the definitions (loops over positions and taps), on fresh random
inputs with odd sizes."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import fastconv
from fastconv import ConvError
from fastconv.longconv import fft_length


@pytest.fixture(autouse=True)
def _no_kernel_fails():
    """Every test starts with no kernel family set aside, and a kernel that fails during a
    test fails it (the routes' fallbacks would otherwise answer for it: the same results,
    so the test would pass untested). Tests that make a kernel fail on purpose install their
    own record."""
    from fastconv import seqconv

    failed = {}
    saved, seqconv._KERNEL_FAILED = seqconv._KERNEL_FAILED, failed
    yield
    installed = seqconv._KERNEL_FAILED
    seqconv._KERNEL_FAILED = saved
    assert not (installed is failed and failed), f"a sequence kernel failed: {failed}"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _reference(x, weight, bias=None, seq_idx=None, initial_states=None, silu=False):
    """out[b, d, t] = Σ_k w[d, k] · x[b, d, t − (W − 1) + k] over positions of t's sequence
    (positions before 0: the initial states, in the sequence of position 0); and the final
    states: the last W − 1 inputs where they are in the last position's sequence."""
    x, weight = x.double(), weight.double()
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    init = (torch.zeros(batch, dim, width - 1, dtype=torch.float64) if initial_states is None
            else initial_states.double())
    full = torch.cat([init, x], -1)
    out = torch.zeros(batch, dim, seqlen, dtype=torch.float64)
    final = torch.zeros(batch, dim, width - 1, dtype=torch.float64)
    for b in range(batch):
        ids = [None] * (width - 1) + ([0] * seqlen if seq_idx is None
                                      else seq_idx[b].tolist())
        if seq_idx is not None:
            ids[:width - 1] = [ids[width - 1]] * (width - 1)
        else:
            ids[:width - 1] = [0] * (width - 1)
        for t in range(seqlen):
            for k in range(width):
                p = t + k  # index into full
                if ids[p] == ids[t + width - 1]:
                    out[b, :, t] += weight[:, k] * full[b, :, p]
        last = ids[-1]
        for j in range(width - 1):
            p = len(ids) - (width - 1) + j
            if ids[p] == last:
                final[b, :, j] = full[b, :, p]
    if bias is not None:
        out += bias.double()[None, :, None]
    return (F.silu(out) if silu else out), final


def _inputs(batch, dim, seqlen, width, layout="seqlen", dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if layout == "seqlen":
        x = torch.randn(batch, dim, seqlen, generator=g, dtype=dtype)
    else:  # dim-contiguous: (batch, seqlen, dim) memory
        x = torch.randn(batch, seqlen, dim, generator=g, dtype=dtype).transpose(1, 2)
    w = torch.randn(dim, width, generator=g, dtype=dtype)
    b = torch.randn(dim, generator=g, dtype=dtype)
    s = torch.randn(batch, dim, width - 1, generator=g, dtype=dtype)
    return x, w, b, s


@pytest.mark.parametrize("layout", ["seqlen", "dim"])
@pytest.mark.parametrize("width", [2, 3, 4, 7, 16])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_causal_conv1d_matches_the_definition(width, activation, layout):
    x, w, b, s = _inputs(2, 5, 19, width, layout, seed=width)
    for bias in (None, b):
        for states in (None, s):
            out, final = fastconv.causal_conv1d(x, w, bias, initial_states=states,
                                                return_final_states=True,
                                                activation=activation)
            ref, ref_final = _reference(x, w, bias, None, states, activation == "silu")
            assert out.shape == x.shape and out.dtype == x.dtype
            assert _rel(out, ref) < 1e-5
            assert torch.equal(final.double(), ref_final)


def test_width_up_to_256_and_swish_is_silu():
    x, w, b, _ = _inputs(1, 3, 300, 256, seed=3)
    out = fastconv.causal_conv1d(x, w, b, activation="swish")
    assert _rel(out, _reference(x, w, b, silu=True)[0]) < 1e-5


def test_chunks_carried_by_final_states_equal_one_call():
    x, w, b, _ = _inputs(2, 4, 23, 5, seed=1)
    whole = fastconv.causal_conv1d(x, w, b, activation="silu")
    first, state = fastconv.causal_conv1d(x[..., :9], w, b, return_final_states=True,
                                          activation="silu")
    second, state = fastconv.causal_conv1d(x[..., 9:11].contiguous(), w, b,
                                           initial_states=state, return_final_states=True,
                                           activation="silu")  # shorter than width - 1
    third = fastconv.causal_conv1d(x[..., 11:].contiguous(), w, b, initial_states=state,
                                   activation="silu")
    assert _rel(torch.cat([first, second, third], -1), whole) < 1e-6


@pytest.mark.parametrize("packed", [False, True])
def test_final_states_out_is_written_and_returned(packed):
    """causal-conv1d's ``final_states_out``: the final states written into the buffer given
    (strided as causal-conv1d allocates it: (batch, width - 1, dim) memory), which is
    returned in their place; the same values and gradients as without it; with seq_idx too
    (the packed route's states)."""
    x, w, b, s = _inputs(3, 5, 13, 4, seed=11)
    seq_idx = torch.tensor([[0] * 6 + [1] * 7] * 3, dtype=torch.int32) if packed else None
    want_out, want_final = _reference(x, w, b, seq_idx, s, silu=True)
    buffer = torch.full((3, 3, 5), float("nan")).transpose(1, 2)
    xs = x.clone().requires_grad_()
    out, final = fastconv.causal_conv1d(xs, w, b, seq_idx, s, True, "silu",
                                        final_states_out=buffer)
    assert final is buffer and not final.isnan().any()
    assert _rel(out, want_out) < 1e-6 and _rel(final, want_final) < 1e-6
    grad_out, grad_final = torch.randn(out.shape), torch.randn(final.shape)
    got = torch.autograd.grad((out * grad_out).sum() + (final * grad_final).sum(), xs)[0]
    xs = x.clone().requires_grad_()
    out, final = fastconv.causal_conv1d(xs, w, b, seq_idx, s, True, "silu")
    want = torch.autograd.grad((out * grad_out).sum() + (final * grad_final).sum(), xs)[0]
    assert torch.equal(got, want) and got[..., -3:].abs().sum() > 0


@pytest.mark.parametrize("call, match", [
    (lambda x, w: fastconv.causal_conv1d(x, w, final_states_out=torch.empty(2, 4, 3)),
     "final_states_out: given with return_final_states=False"),
    (lambda x, w: fastconv.causal_conv1d(x, w, return_final_states=True,
                                         final_states_out=torch.empty(2, 4, 4)),
     r"final_states_out: got \(2, 4, 4\); expected \(batch, dim, width - 1\)"),
    (lambda x, w: fastconv.causal_conv1d(x, w, return_final_states=True,
                                         final_states_out=torch.empty(2, 4, 3).half()),
     "final_states_out: torch.float16 on cpu; expected torch.float32"),
    (lambda x, w: fastconv.causal_conv1d(
        x, w, return_final_states=True,
        final_states_out=torch.empty(2, 4, 3, requires_grad=True)),
     "final_states_out: a leaf tensor that requires grad"),
    (lambda x, w: fastconv.causal_conv1d(x, w, None, None, None, True, torch.empty(2, 4, 3)),
     "activation: got a tensor; .* pass final_states_out by keyword"),
])
def test_bad_final_states_out_names_what_is_wrong(call, match):
    x = torch.randn(2, 4, 9)
    w = torch.randn(4, 4)
    with pytest.raises(ConvError, match=match):
        call(x, w)


@pytest.mark.parametrize("width", [2, 4, 6])
def test_packed_sequences_never_mix(width):
    lengths = [[5, 1, 9, 2], [17]]
    seqlen = 17
    x, w, b, s = _inputs(2, 3, seqlen, width, seed=width)
    seq_idx = torch.tensor([[i for i, n in enumerate(row) for _ in range(n)]
                            for row in lengths], dtype=torch.int32)
    for states in (None, s):
        out, final = fastconv.causal_conv1d(x, w, b, seq_idx, states,
                                            return_final_states=True, activation="silu")
        ref, ref_final = _reference(x, w, b, seq_idx, states, silu=True)
        assert _rel(out, ref) < 1e-5 and torch.equal(final.double(), ref_final)
        # each sequence alone gives the same: the first from the states, the rest from zero
        start = 0
        for i, n in enumerate(lengths[0]):
            alone = fastconv.causal_conv1d(x[:1, :, start:start + n].contiguous(), w, b,
                                           initial_states=None if (states is None or i)
                                           else states[:1], activation="silu")
            assert _rel(out[:1, :, start:start + n], alone) < 1e-5
            start += n


@pytest.mark.parametrize("layout", ["seqlen", "dim"])
@pytest.mark.parametrize("width,seqlen", [(3, 70), (5, 3), (2, 33)])
def test_packed_kernel_into_poisoned_output(width, seqlen, layout, monkeypatch):
    """Without autograd the packed route is one kernel (interpreted here): every output
    element written (the output starts as NaN), both layouts, more positions than a tile,
    a row shorter than the state (its final states from the initial ones), sequences of one
    position, against the float64 reference; the final states exactly."""
    from fastconv.backends.triton import packed

    empty_like, runs = torch.empty_like, []

    def poisoned(t, *args, **kwargs):
        runs.append(1)
        return empty_like(t, *args, **kwargs).fill_(float("nan"))
    monkeypatch.setattr(packed.torch, "empty_like", poisoned)
    x, w, b, s = _inputs(2, 37, seqlen, width, layout=layout, seed=seqlen)
    cuts = sorted({1, seqlen // 3, seqlen // 3 + 1, seqlen - 1} - {0, seqlen})
    seq_idx = torch.stack([
        torch.tensor([sum(t >= c for c in cuts) for t in range(seqlen)], dtype=torch.int32),
        torch.zeros(seqlen, dtype=torch.int32)])
    for states, silu in ((None, False), (s, True)):
        out, final = fastconv.causal_conv1d(x, w, b if silu else None, seq_idx, states,
                                            return_final_states=True,
                                            activation="silu" if silu else None)
        ref, ref_final = _reference(x, w, b if silu else None, seq_idx, states, silu=silu)
        assert _rel(out, ref) < 1e-6 and torch.equal(final.double(), ref_final)
        assert out.stride() == x.stride()
    assert len(runs) == 2, "the kernel route did not run"


def test_packed_kernel_failure_falls_back_to_torch_once(monkeypatch):
    """A packed kernel that fails (not yet compiled on a GPU of this kind, say) is said once
    in a warning, and this and every later call takes the torch route: same result (the
    short-filter kernels, which take these calls first, left out)."""
    from fastconv import seqconv
    from fastconv.backends.triton import packed

    def broken(*args, **kwargs):
        raise RuntimeError("no such kernel")
    monkeypatch.setattr(packed, "packed_forward", broken)
    monkeypatch.setattr(seqconv, "short_eligible", lambda x, width: False)
    monkeypatch.setattr(seqconv, "_KERNEL_FAILED", {})
    x, w, b, _ = _inputs(2, 3, 11, 4, seed=3)
    seq_idx = torch.tensor([[0] * 4 + [1] * 7, [0] * 11], dtype=torch.int32)
    with pytest.warns(RuntimeWarning,
                      match=r"kernels \(packed\) failed .*no such kernel"):
        out = fastconv.causal_conv1d(x, w, b, seq_idx, activation="silu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = fastconv.causal_conv1d(x, w, b, seq_idx, activation="silu")
    ref, _ = _reference(x, w, b, seq_idx, silu=True)
    assert _rel(out, ref) < 1e-6 and torch.equal(out, again)


def test_short_kernels_take_what_their_grid_holds():
    """shortconv runs batches of 1 to 65,535 rows and up to 65,535 channels (grid axes),
    16-bit and float32 data, widths to 17; the rest goes to the other routes."""
    from fastconv.seqargs import short_eligible as eligible

    def x(*shape, dtype=torch.float32):
        return torch.empty(shape, dtype=dtype)
    assert eligible(x(2, 65535, 1), 17) and eligible(x(65535, 3, 1, dtype=torch.bfloat16), 2)
    assert not eligible(x(2, 3, 5), 18) and not eligible(x(2, 3, 5, dtype=torch.float64), 4)
    assert not eligible(x(0, 3, 5), 4) and not eligible(x(65536, 3, 1), 4)
    assert not eligible(x(1, 65536, 1), 4)


@pytest.mark.parametrize("broken", ["short_forward", "short_backward"])
def test_short_kernel_failure_leaves_the_packed_kernels_in_use(broken, monkeypatch):
    """A shortconv kernel that fails is said once in a warning; packed.py's kernels answer
    for training (the same gradients) and fastconv.conv1d without autograd, and packed
    sequences keep packed.py's kernels."""
    from fastconv import seqconv
    from fastconv.backends.triton import packed, shortconv

    def failing(*args, **kwargs):
        raise RuntimeError("no such kernel")
    monkeypatch.setattr(shortconv, broken, failing)
    monkeypatch.setattr(seqconv, "_KERNEL_FAILED", {})
    monkeypatch.setattr(seqconv, "_TRAIN_KERNELS_MIN_NUMEL", 0)
    ran = []
    real_backward = packed.packed_backward
    monkeypatch.setattr(packed, "packed_backward",
                        lambda *a, **k: ran.append(1) or real_backward(*a, **k))
    x, w, b, s = _inputs(2, 3, 19, 4, seed=6)
    g = torch.randn(2, 3, 19)
    args = [t.clone().requires_grad_() for t in (x, w, b, s)]
    with pytest.warns(RuntimeWarning, match=r"kernels \(short\) failed .*no such kernel"):
        out = fastconv.causal_conv1d(*args[:3], initial_states=args[3], activation="silu")
        got = torch.autograd.grad(out, args, g)
    assert ran and set(seqconv._KERNEL_FAILED) == {"short"}
    want_args = [t.double().requires_grad_() for t in (x, w, b, s)]
    want = F.silu(F.conv1d(torch.cat([want_args[3], want_args[0]], -1),
                           want_args[1].unsqueeze(1), want_args[2], groups=3))
    assert _rel(out, want) < 1e-6
    assert all(_rel(a, c) < 1e-6
               for a, c in zip(got, torch.autograd.grad(want, want_args, g.double())))
    with warnings.catch_warnings():  # (no more of fastconv's; Triton 3.6's interpreter warns
        warnings.simplefilter("error", RuntimeWarning)  # of numpy's deprecations)
        again = fastconv.causal_conv1d(x, w, b, initial_states=s, activation="silu")
        seq_idx = torch.tensor([[0] * 9 + [1] * 10, [0] * 19], dtype=torch.int32)
        packed_out = fastconv.causal_conv1d(*args[:3], seq_idx, args[3], activation="silu")
        torch.autograd.grad(packed_out, args, g)
    assert _rel(again, want) < 1e-6 and len(ran) == 2  # (the first call, the packed one)
    assert _rel(packed_out, _reference(x, w, b, seq_idx, s, silu=True)[0]) < 1e-6


def test_packed_backward_kernel_failure_falls_back_to_torch(monkeypatch):
    """A backward kernel that fails is said in a warning and the gradients come from the
    torch route (the inputs that need none get none)."""
    from fastconv import seqconv
    from fastconv.backends.triton import packed

    def broken(*args, **kwargs):
        raise RuntimeError("no such kernel")
    monkeypatch.setattr(packed, "packed_backward", broken)
    monkeypatch.setattr(seqconv, "_KERNEL_FAILED", {})
    x, w, b, s = _inputs(2, 3, 11, 4, dtype=torch.float64, seed=4)
    seq_idx = torch.tensor([[0] * 4 + [1] * 7, [0] * 11], dtype=torch.int32)
    g = torch.randn(2, 3, 11, dtype=torch.float64)
    x.requires_grad_()
    w.requires_grad_()
    out = fastconv.causal_conv1d(x, w, b, seq_idx, s, activation="silu")
    with pytest.warns(RuntimeWarning, match=r"kernels \(packed\) failed"):
        got = torch.autograd.grad(out, (x, w), g)
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    want = torch.autograd.grad(seqconv._packed_torch(xr, wr, b, seq_idx, s, False, "silu"),
                               (xr, wr), g)
    assert all(_rel(a, c) < 1e-12 for a, c in zip(got, want))


def test_gradients_in_float64():
    """gradcheck of every input (packed: through the kernels' backward, interpreted)."""
    x, w, b, s = _inputs(2, 3, 8, 4, dtype=torch.float64, seed=5)
    seq_idx = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [0] * 8], dtype=torch.int32)
    for packed in (None, seq_idx):
        args = [t.clone().requires_grad_() for t in (x, w, b, s)]

        def f(x, w, b, s, packed=packed):
            out, final = fastconv.causal_conv1d(x, w, b, packed, s, True, "silu")
            return out, final
        assert torch.autograd.gradcheck(f, args, fast_mode=packed is not None)


@pytest.mark.parametrize("width,seqlen,activation,layout", [
    pytest.param(4, 1100, "silu", "dim", marks=pytest.mark.slow), (7, 5, "silu", "dim"),
    (3, 70, None, "dim"), (40, 45, "silu", "dim"), (9, 1100, "silu", "seqlen"),
    (2, 500, None, "seqlen")])
def test_packed_kernel_gradients_match_the_torch_route(width, seqlen, activation, layout,
                                                       monkeypatch):
    """The packed kernels' gradients (both layouts; many windows, a window's length
    exactly, or fewer positions than the state; a halo past 32 positions) against the torch
    route's autograd, in float64, every buffer poisoned (every element written);
    deterministic (two backward passes, the same bits)."""
    from fastconv import seqconv
    from fastconv.backends.triton import packed

    empty_like, empty = torch.empty_like, torch.empty
    monkeypatch.setattr(packed.torch, "empty_like",
                        lambda t, *a, **k: empty_like(t, *a, **k).fill_(float("nan")))
    monkeypatch.setattr(packed.torch, "empty",
                        lambda *a, **k: empty(*a, **k).fill_(float("nan")))
    x, w, b, s = _inputs(2, 5, seqlen, width, layout=layout, dtype=torch.float64, seed=width)
    seq_idx = torch.tensor([[min(t // 300, 2) for t in range(seqlen)],
                            [int(t >= seqlen - 2) for t in range(seqlen)]], dtype=torch.int32)
    g = torch.randn(2, 5, seqlen, dtype=torch.float64)
    grads = []
    for kernels in (True, True, False):
        args = [t.clone().requires_grad_() for t in (x, w, b, s)]
        if not kernels:
            monkeypatch.setattr(seqconv, "kernel_device", lambda: None)
        out = fastconv.causal_conv1d(*args[:3], seq_idx, args[3], activation=activation)
        grads.append(torch.autograd.grad(out, args, g))
    for got, want in zip(grads[0], grads[2]):
        assert _rel(got, want) < 1e-12
    assert all(torch.equal(a, b) for a, b in zip(grads[0], grads[1]))


@pytest.mark.parametrize("layout,states", [("seqlen", True), ("dim", False)])
def test_training_without_seq_idx_runs_the_kernels(layout, states, monkeypatch):
    """Where it will be differentiated (and is large: the size rule lowered to any size
    here), causal_conv1d without seq_idx runs the packed kernels (interpreted here;
    fastconv.conv1d made to fail, so no other route can answer): output, final states and
    every gradient as the float64 definition's."""
    from fastconv import seqconv

    monkeypatch.setattr(seqconv, "_TRAIN_KERNELS_MIN_NUMEL", 0)

    x, w, b, s = _inputs(2, 5, 23, 4, layout, dtype=torch.float64, seed=11)
    g = torch.randn(2, 5, 23, dtype=torch.float64)
    gf = torch.randn(2, 5, 3, dtype=torch.float64)
    want_args = [t.clone().requires_grad_() for t in (x, w, b, s)]
    start = want_args[3] if states else torch.zeros(2, 5, 3, dtype=torch.float64)
    full = torch.cat([start, want_args[0]], dim=-1)
    want = F.silu(F.conv1d(full, want_args[1].unsqueeze(1), want_args[2], groups=5))
    want_grads = torch.autograd.grad((want * g).sum() + (full[..., -3:] * gf).sum(),
                                     want_args if states else want_args[:3])

    def refused(*args, **kwargs):
        raise AssertionError("fastconv.conv1d ran")
    monkeypatch.setattr(seqconv, "conv1d", refused)
    args = [t.clone().requires_grad_() for t in (x, w, b, s)]
    out, final = fastconv.causal_conv1d(*args[:3], initial_states=args[3] if states else None,
                                        return_final_states=True, activation="silu")
    got = torch.autograd.grad((out * g).sum() + (final * gf).sum(),
                              args if states else args[:3])
    assert _rel(out, want) < 1e-12 and _rel(final, full[..., -3:]) < 1e-12
    assert all(_rel(a, c) < 1e-12 for a, c in zip(got, want_grads))


@pytest.mark.parametrize("width,seqlen,layout", [
    (4, 300, "seqlen"), (9, 41, "dim"), (12, 300, "seqlen"), (17, 37, "dim"), (3, 6, "seqlen")])
def test_packed_sequences_run_the_short_filter_kernels(width, seqlen, layout, monkeypatch):
    """Packed sequences (seq_idx) of short filters take shortconv.py's kernels (interpreted;
    packed.py's and the torch route made to fail, every buffer poisoned), forward without
    autograd and the training route: output, final states and every gradient as the float64
    definition's; sequences of one position, boundaries inside a chunk and at its edges,
    the initial states only the first sequence's; both layouts, taps one or two chunks
    back."""
    from fastconv import seqconv
    from fastconv.backends.triton import packed, shortconv

    def refused(*args, **kwargs):
        raise AssertionError("another route ran")
    empty_like, empty = torch.empty_like, torch.empty

    def short_only():
        monkeypatch.setattr(seqconv, "_TRAIN_KERNELS_MIN_NUMEL", 0)
        monkeypatch.setattr(seqconv, "_packed_torch", refused)
        for name in ("packed_forward", "packed_backward", "silu_grad"):
            monkeypatch.setattr(packed, name, refused)
        monkeypatch.setattr(shortconv.torch, "empty_like",
                            lambda t, *a, **k: empty_like(t, *a, **k).fill_(float("nan")))
        monkeypatch.setattr(shortconv.torch, "empty",
                            lambda *a, **k: empty(*a, **k).fill_(float("nan")))
    short_only()
    x, w, b, s = _inputs(2, 5, seqlen, width, layout=layout, seed=width + seqlen)
    cuts = sorted({1, 2, 8, 9, 16, seqlen // 2, seqlen - 1} & set(range(1, seqlen)))
    seq_idx = torch.stack([
        torch.tensor([sum(t >= c for c in cuts) for t in range(seqlen)], dtype=torch.int32),
        torch.tensor([int(t >= seqlen - 1) for t in range(seqlen)], dtype=torch.int32)])
    with torch.no_grad():
        out, final = fastconv.causal_conv1d(x, w, b, seq_idx, s, return_final_states=True,
                                            activation="silu")
    ref, ref_final = _reference(x, w, b, seq_idx, s, silu=True)
    assert _rel(out, ref) < 1e-6 and torch.equal(final.double(), ref_final)
    assert out.stride() == x.stride()
    g = torch.randn(2, 5, seqlen, dtype=torch.float64)
    want_args = [t.double().requires_grad_() for t in (x, w, b, s)]
    monkeypatch.undo()  # the torch route, in float64: the reference's gradients
    want = torch.autograd.grad(seqconv._packed_torch(*want_args[:3], seq_idx, want_args[3],
                                                     False, "silu"), want_args, g)
    short_only()
    args = [t.clone().requires_grad_() for t in (x, w, b, s)]
    out = fastconv.causal_conv1d(*args[:3], seq_idx, args[3], activation="silu")
    got = torch.autograd.grad(out, args, g.float())
    assert _rel(out, ref) < 1e-6
    assert all(_rel(a, c) < 1e-6 for a, c in zip(got, want))


def _short_kernels_only(monkeypatch) -> None:
    """causal_conv1d's training route on the short-filter kernels at any size: packed.py's
    kernels and fastconv.conv1d made to fail, every buffer torch.empty(_like) makes (the
    kernel modules' outputs) poisoned with NaN."""
    from fastconv import seqconv
    from fastconv.backends.triton import packed

    def refused(*args, **kwargs):
        raise AssertionError("another route ran")
    monkeypatch.setattr(seqconv, "_TRAIN_KERNELS_MIN_NUMEL", 0)
    monkeypatch.setattr(seqconv, "conv1d", refused)
    for name in ("packed_forward", "packed_backward", "silu_grad"):
        monkeypatch.setattr(packed, name, refused)
    empty_like, empty = torch.empty_like, torch.empty
    monkeypatch.setattr(torch, "empty_like",
                        lambda t, *a, **k: empty_like(t, *a, **k).fill_(float("nan")))
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))


def _trains_as_defined(x, w, b, s, g, bias: bool, states: bool):
    """Two training passes of causal_conv1d (SiLU; the bias and the initial states where
    asked) on float32 x against F.conv1d's in float64 given the output's
    gradient ``g``: the output and every gradient within 1e-6, the output and dx in x's
    layout, the two passes' gradients the same bits. Returns (the float64 output, the
    positions before 0 in float64)."""
    used = (True, True, bias, states)
    want_args = [t.double().requires_grad_() for t in (x, w, b, s)]
    batch, dim, _ = x.shape
    start = want_args[3] if states else torch.zeros(batch, dim, w.shape[1] - 1,
                                                    dtype=torch.float64)
    want = F.silu(F.conv1d(torch.cat([start, want_args[0]], -1), want_args[1].unsqueeze(1),
                           want_args[2] if bias else None, groups=dim))
    want_grads = torch.autograd.grad(want, [t for t, u in zip(want_args, used) if u], g)
    runs = []
    for _ in range(2):
        args = [t.clone().requires_grad_() for t in (x, w, b, s)]
        out = fastconv.causal_conv1d(args[0], args[1], args[2] if bias else None,
                                     initial_states=args[3] if states else None,
                                     activation="silu")
        grads = torch.autograd.grad(out, [t for t, u in zip(args, used) if u], g.float())
        assert _rel(out, want) < 1e-6 and out.stride() == x.stride()
        assert grads[0].stride() == x.stride()
        runs.append(grads)
    for got, ref in zip(runs[0], want_grads):
        assert _rel(got, ref) < 1e-6
    assert all(torch.equal(a, c) for a, c in zip(*runs))
    return want.detach(), start.detach()


@pytest.mark.parametrize("width,seqlen,states,bias,layout,overlap", [
    (4, 300, True, True, "seqlen", False), (2, 37, False, False, "seqlen", False),
    (9, 513, True, False, "seqlen", False), (3, 5, True, True, "seqlen", False),
    (7, 8, False, True, "seqlen", False), (4, 70, True, True, "dim", False),
    (9, 3, True, False, "dim", False), (10, 300, True, True, "seqlen", False),
    (16, 37, True, False, "seqlen", False), (17, 530, False, True, "seqlen", False),
    (12, 11, True, True, "seqlen", False), (16, 70, True, True, "dim", False),
    (17, 5, True, False, "dim", False), (16, 101, True, True, "seqlen", True),
    (13, 70, True, False, "dim", True), (17, 15, False, True, "seqlen", True),
    (5, 100, True, True, "seqlen", True), (6, 45, True, False, "dim", True)])
def test_short_filters_train_through_one_pass_kernels(width, seqlen, states, bias, layout,
                                                      overlap, monkeypatch):
    """causal_conv1d's training route for widths ≤ 17 on float32 x in both layouts
    (shortconv.py's kernels, interpreted; packed.py's and fastconv.conv1d made to fail, every
    buffer poisoned): output and every gradient as F.conv1d's in float64, and the same
    output and the final states without autograd (the forward kernel alone, x
    seqlen-contiguous);
    windows of one or several chunks and programs, rows shorter than a chunk or the
    state, taps reaching one chunk back (widths ≤ 9) or two; deterministic (two backward
    passes, the same bits). ``overlap``: backward windows of 4 chunks that write 2 (g
    computed once per chunk, the 2 after read from the window's own: ``shortconv.owned``),
    and at widths ≤ 9 windows of two 16-position chunks (``shortconv.PAIRS``), so many
    windows, their seams and the initial states' window."""
    from fastconv.backends.triton import shortconv, shortrows

    if layout == "dim":  # (shortconv.py's kernels throughout, not shortrows.py's)
        monkeypatch.setattr(shortrows, "TILES", {k: (None, None) for k in shortrows.TILES})
    if overlap:
        monkeypatch.setattr(shortconv, "SHIFT_MIN_CHUNKS", 4)
        for layout_ in ("seqlen", "dim"):
            forward, _ = shortconv.TILES[layout_, 2]
            # (dim-contiguous: the gathers along the chunks on column loads)
            monkeypatch.setitem(shortconv.TILES, (layout_, 2),
                                (forward, (2, 4, 1, layout_ == "seqlen")))
        assert shortconv.owned(2, 4) == 2
        monkeypatch.setattr(shortconv, "PAIRS", {
            (layout_, widest): (1, 2, 1, True) if layout_ == "seqlen" else (2, 2, 1, False)
            for layout_ in ("seqlen", "dim") for widest in (5, 9)})

    _short_kernels_only(monkeypatch)
    x, w, b, s = _inputs(2, 6, seqlen, width, layout, seed=width + seqlen)
    want, start = _trains_as_defined(x, w, b, s, torch.randn(2, 6, seqlen, dtype=torch.float64),
                                     bias, states)
    if layout == "dim":  # (without autograd this layout takes fastconv.conv1d's route)
        return
    with torch.no_grad():  # the forward kernel alone (any size), and the final states
        out, final = fastconv.causal_conv1d(x, w, b if bias else None,
                                            initial_states=s if states else None,
                                            return_final_states=True, activation="silu")
    assert _rel(out, want) < 1e-6 and out.stride() == x.stride()
    assert torch.equal(final.double(), torch.cat([start, x.double()], -1)[..., 1 - width:])


@pytest.mark.parametrize("width,seqlen,states,bias,dim", [
    (2, 39, True, True, 6), (4, 70, False, True, 6), (4, 70, True, True, 8),
    (4, 3, True, False, 6), (9, 25, True, True, 6), (16, 41, True, False, 6),
    (16, 41, False, True, 8), (17, 13, False, True, 6)])
def test_dim_contiguous_short_filters_train_a_position_at_a_time(width, seqlen, states,
                                                                 bias, dim, monkeypatch):
    """causal_conv1d's training route on a dim-contiguous float32 x where shortrows.py has
    tiles (interpreted; shortconv.py's own kernels and the other routes made to fail, every
    buffer poisoned): output and every gradient as F.conv1d's in float64, deterministic.
    Spans of 8 (forward) and 6 (backward) positions loaded 4 and 3 at a time, so rows
    shorter than a span, spans inside the row, spans past the row's end and the
    initial states' span; 4 channels a program over 6 (the second program's half masked)
    or over 8 (no channel masks); the backward's tile with a register cap."""
    from fastconv.backends.triton import shortconv, shortrows

    _short_kernels_only(monkeypatch)
    for name in ("_forward_kernel", "_backward_kernel", "_backward_pairs_kernel"):
        monkeypatch.setattr(shortconv, name, None)  # (launching one would fail)
    monkeypatch.setattr(shortrows, "TILES", {k: ((4, 8, 4, 1), (4, 6, 3, 1, 128))
                                             for k in shortrows.TILES})
    x, w, b, s = _inputs(2, dim, seqlen, width, "dim", seed=width + seqlen)
    _trains_as_defined(x, w, b, s, torch.randn(2, seqlen, dim, dtype=torch.float64).transpose(1, 2),
                       bias, states)


@pytest.mark.parametrize("width,seqlen,states", [(32, 7, True), (64, 4100, True),
                                                  (65, 300, False), (256, 129, True),
                                                  (128, 4200, True)])
def test_wide_filters_run_the_tensor_core_kernel(width, seqlen, states, monkeypatch):
    """Without autograd, widths from 32 run the Toeplitz kernel (interpreted here, in
    float64; fastconv.conv1d made to fail, the output poisoned): output and final states as
    the float64 definition's, every element written. Its tiles (toeplitz.tile): 32-position
    blocks, one program per sequence or two (4100), 64-position blocks (128 taps, 4200)."""
    from fastconv import seqconv
    from fastconv.backends.triton import toeplitz

    x, w, b, s = _inputs(2, 3, seqlen, width, dtype=torch.float64, seed=width)

    def refused(*args, **kwargs):
        raise AssertionError("fastconv.conv1d ran")

    def poisoned(t, **kwargs):
        return torch.full_like(t, float("nan"), **kwargs)
    monkeypatch.setattr(seqconv, "conv1d", refused)
    monkeypatch.setattr(toeplitz.torch, "empty_like", poisoned)
    start = s if states else torch.zeros_like(s)
    full = torch.cat([start, x], dim=-1)
    want = F.silu(F.conv1d(full, w.unsqueeze(1), b, groups=3))
    out, final = fastconv.causal_conv1d(x, w, b, initial_states=s if states else None,
                                        return_final_states=True, activation="silu")
    assert not out.isnan().any()
    assert _rel(out, want) < 1e-12 and torch.equal(final, full[..., -(width - 1):])


@pytest.mark.parametrize("width", [18, 33])
@pytest.mark.parametrize("grad", [False, True])
def test_wide_filters_take_dim_contiguous_x_through_a_copy(width, grad, monkeypatch):
    """x dim-contiguous (a Mamba projection's layout) at a width past shortconv.py's runs
    the Toeplitz kernels on a seqlen-contiguous copy (fastconv.conv1d refused; interpreted,
    float64): the output dim-contiguous and as the definition's, and the gradients of x,
    weight, bias and the initial states as the definition's."""
    from fastconv import seqconv

    monkeypatch.setattr(seqconv, "conv1d", None)  # (the conv1d route would fail)
    x, w, b, s = _inputs(2, 3, 37, width, dtype=torch.float64, seed=5)
    x = x.transpose(1, 2).contiguous().transpose(1, 2)
    g = torch.randn(2, 3, 37, dtype=torch.float64)
    args = [t.clone().requires_grad_(grad) for t in (x, w, b, s)]
    want = F.silu(F.conv1d(torch.cat([args[3], args[0]], -1), args[1].unsqueeze(1), args[2],
                           groups=3))
    if width < 32:  # (seqlen-contiguous, this width takes the conv1d route)
        with pytest.raises(TypeError):
            fastconv.causal_conv1d(x.contiguous(), w, b, initial_states=s)
    with torch.set_grad_enabled(grad):
        ours = [t.clone().requires_grad_(grad) for t in (x, w, b, s)]
        out = fastconv.causal_conv1d(*ours[:3], initial_states=ours[3], activation="silu")
    assert out.stride() == (37 * 3, 1, 3) and _rel(out, want) < 1e-12
    if grad:
        got = torch.autograd.grad((out * g).sum(), ours)
        for a, c in zip(got, torch.autograd.grad((want * g).sum(), args)):
            assert _rel(a, c) < 1e-12


@pytest.mark.parametrize("layout", ["seqlen", "dim"])
def test_large_training_past_width_17_runs_the_tensor_core_kernels(layout, monkeypatch):
    """Where it will be differentiated and is large (the size rule lowered to any size
    here), a width between 18 and 31 trains through the Toeplitz kernels in either layout,
    not packed.py's or fastconv.conv1d's routes (both made to fail; interpreted, float64):
    output and gradients as the definition's."""
    from fastconv import seqconv

    def refused(*args, **kwargs):
        raise AssertionError("another route ran")
    monkeypatch.setattr(seqconv, "_TRAIN_KERNELS_MIN_NUMEL", 0)
    monkeypatch.setattr(seqconv, "conv1d", refused)
    monkeypatch.setattr(seqconv, "_packed_kernel", refused)
    x, w, b, _ = _inputs(2, 3, 41, 20, layout, dtype=torch.float64, seed=9)
    g = torch.randn(2, 3, 41, dtype=torch.float64)
    args = [t.clone().requires_grad_() for t in (x, w, b)]
    want = F.silu(F.conv1d(F.pad(args[0], (19, 0)), args[1].unsqueeze(1), args[2], groups=3))
    want_grads = torch.autograd.grad((want * g).sum(), args)
    ours = [t.clone().requires_grad_() for t in (x, w, b)]
    out = fastconv.causal_conv1d(*ours, activation="silu")
    assert _rel(out, want) < 1e-12
    assert all(_rel(a, c) < 1e-12 for a, c in zip(torch.autograd.grad((out * g).sum(), ours),
                                                   want_grads))


def test_large_training_past_width_17_falls_back_to_the_packed_kernels(monkeypatch):
    """Where the Toeplitz kernels do not run (float32 on a GPU; here made to answer None),
    a large training step at widths 18-32 takes packed.py's kernels, as before they took
    these widths, not fastconv.conv1d's route."""
    from fastconv import seqconv

    ran = []
    real = seqconv._packed_kernel

    def spy(*args):
        ran.append(args[3])  # (seq_idx: None)
        return real(*args)

    def refused(*args, **kwargs):
        raise AssertionError("fastconv.conv1d ran")
    monkeypatch.setattr(seqconv, "_TRAIN_KERNELS_MIN_NUMEL", 0)
    monkeypatch.setattr(seqconv, "_wide_kernel", lambda *args: None)
    monkeypatch.setattr(seqconv, "_packed_kernel", spy)
    monkeypatch.setattr(seqconv, "conv1d", refused)
    x, w, b, _ = _inputs(2, 3, 29, 32, dtype=torch.float64, seed=4)
    args = [t.clone().requires_grad_() for t in (x, w, b)]
    out = fastconv.causal_conv1d(*args, activation="silu")
    want = F.silu(F.conv1d(F.pad(x, (31, 0)), w.unsqueeze(1), b, groups=3))
    assert ran == [None] and _rel(out, want) < 1e-12


@pytest.mark.parametrize("route", ["conv1d", "training kernels", "wide", "packed"])
def test_every_route_gives_x_s_dtype_or_autocast_s(route, monkeypatch):
    """float32 weight and bias with bfloat16 x give a bfloat16 output, and float32 operands
    under bfloat16 autocast too, whichever route runs (the conv1d route refused mixed
    dtypes and the others ignored autocast); values within bfloat16's rounding of the
    float64 definition."""
    from fastconv import seqconv

    width = 40 if route == "wide" else 4
    x, w, b, _ = _inputs(2, 5, 21, width, seed=3)
    seq_idx = torch.tensor([[0] * 10 + [1] * 11, [0] * 21], dtype=torch.int32) \
        if route == "packed" else None
    if route == "training kernels":
        monkeypatch.setattr(seqconv, "_TRAIN_KERNELS_MIN_NUMEL", 0)
    if route in ("training kernels", "wide", "packed"):
        monkeypatch.setattr(seqconv, "conv1d", None)  # (another route would fail)
    xd, wd, bd = (t.double() for t in (x.bfloat16(), w.bfloat16(), b.bfloat16()))
    want = seqconv._packed_torch(xd, wd, bd, seq_idx, None, False, "silu") \
        if route == "packed" else F.silu(F.conv1d(F.pad(xd, (width - 1, 0)), wd.unsqueeze(1),
                                                  bd, groups=5))
    xg = x.bfloat16().requires_grad_(route == "training kernels")
    with torch.set_grad_enabled(route == "training kernels"):
        mixed = fastconv.causal_conv1d(xg, w, b, seq_idx, activation="silu")
        with torch.autocast("cpu", torch.bfloat16):
            cast = fastconv.causal_conv1d(x.requires_grad_(route == "training kernels"), w, b,
                                          seq_idx, activation="silu")
    for out in (mixed, cast):
        assert out.dtype == torch.bfloat16 and _rel(out, want) < 1e-2


@pytest.mark.parametrize("width,seqlen,states,activation", [
    (32, 7, True, "silu"), (64, 4100, True, "silu"), (65, 300, False, None),
    (256, 129, True, "silu")])
def test_wide_filters_train_through_the_tensor_core_kernels(width, seqlen, states, activation,
                                                            monkeypatch):
    """With autograd, widths from 32 run the Toeplitz kernels forward and backward
    (interpreted, float64, fastconv.conv1d refused): the output and the gradients of x,
    weight, bias and the initial states as the definition's, the final states' gradient
    included; deterministic (two backward passes, the same bits)."""
    from fastconv import seqconv

    x, w, b, s = _inputs(2, 3, seqlen, width, dtype=torch.float64, seed=width)
    g = torch.randn(2, 3, seqlen, dtype=torch.float64)
    gf = torch.randn(2, 3, width - 1, dtype=torch.float64)
    act = (lambda t: F.silu(t)) if activation else (lambda t: t)
    args = [t.clone().requires_grad_() for t in (x, w, b, s)]
    full = torch.cat([args[3] if states else torch.zeros_like(s), args[0]], dim=-1)
    want = act(F.conv1d(full, args[1].unsqueeze(1), args[2], groups=3))
    wanted = args if states else args[:3]
    want_grads = torch.autograd.grad((want * g).sum() + (full[..., -(width - 1):] * gf).sum(),
                                     wanted)
    monkeypatch.setattr(seqconv, "conv1d", None)  # (the conv1d route would fail)
    runs = []
    for _ in range(2):
        args = [t.clone().requires_grad_() for t in (x, w, b, s)]
        out, final = fastconv.causal_conv1d(
            *args[:3], initial_states=args[3] if states else None, return_final_states=True,
            activation=activation)
        runs.append(torch.autograd.grad((out * g).sum() + (final * gf).sum(),
                                        args if states else args[:3]))
        assert _rel(out, want) < 1e-12
    assert all(_rel(a, c) < 1e-12 for a, c in zip(runs[0], want_grads))
    assert all(torch.equal(a, c) for a, c in zip(*runs))


def test_update_decodes_token_by_token_as_the_whole_sequence():
    x, w, b, _ = _inputs(3, 5, 13, 4, seed=7)
    whole = fastconv.causal_conv1d(x, w, b, activation="silu")
    layer_state = torch.zeros(3, 5, 6)  # state_len > width - 1
    steps = [fastconv.causal_conv1d_update(x[..., t], layer_state, w, b, "silu")
             for t in range(13)]
    assert _rel(torch.stack(steps, -1), whole) < 1e-6
    assert torch.equal(layer_state, x[..., -6:])
    # several tokens at once (speculative decoding) after a prefill
    prefill, state = fastconv.causal_conv1d(x[..., :8], w, b, return_final_states=True,
                                            activation="silu")
    multi = fastconv.causal_conv1d_update(x[..., 8:].contiguous(), state, w, b, "silu")
    assert _rel(multi, whole[..., 8:]) < 1e-6


def test_update_circular_buffer_and_state_pool():
    x, w, b, _ = _inputs(2, 4, 11, 3, seed=9)
    whole = fastconv.causal_conv1d(x, w, b)
    pool = torch.randn(5, 4, 4)  # rows 1 and 3 hold this batch; the others must not change
    pool[[1, 3]] = 0
    untouched = pool[[0, 2, 4]].clone()
    index = torch.tensor([3, 1], dtype=torch.int32)
    lengths = torch.tensor([0, 0], dtype=torch.int32)
    outs = []
    for t in range(11):
        outs.append(fastconv.causal_conv1d_update(x[..., t], pool, w, b, None, lengths,
                                                  index))
        lengths += 1
    assert _rel(torch.stack(outs, -1), whole) < 1e-6
    assert torch.equal(pool[[0, 2, 4]], untouched)
    # the circular buffer holds the last 4 inputs at positions (t mod 4)
    for t in range(7, 11):
        assert torch.equal(pool[3, :, t % 4], x[0, :, t])


def _varlen_states_reference(x, cu_seqlens, state_len):
    """causal-conv1d's definition, a loop over sequences and state positions."""
    batch = len(cu_seqlens) - 1
    states = torch.zeros(batch, x.shape[1], state_len, dtype=torch.float64)
    for i in range(batch):
        start, end = int(cu_seqlens[i]), int(cu_seqlens[i + 1])
        for j in range(state_len):
            row = end - state_len + j
            if start <= row < end:
                states[i, :, j] = x[row].double()
    return states


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_varlen_states_are_each_sequence_s_last_inputs(dtype, index_dtype):
    """causal_conv1d_varlen_states: sequences longer and shorter than the state, an empty
    one, x a slice of a wider buffer (a projection's output), the result dim-contiguous in
    x's dtype with every position written; the gradient x receives is the states' own."""
    g = torch.Generator().manual_seed(13)
    wide = torch.randn(29, 11, generator=g).to(dtype)
    x = wide[:, 2:9]  # (total_tokens 29, dim 7), rows 11 apart
    cu = torch.tensor([0, 9, 11, 11, 20, 29], dtype=index_dtype)
    got = fastconv.causal_conv1d_varlen_states(x, cu, 5)
    assert got.shape == (5, 7, 5) and got.dtype == dtype and got.stride(1) == 1
    assert torch.equal(got.double(), _varlen_states_reference(x, cu, 5))
    past = torch.tensor([0, 27, 31], dtype=index_dtype)  # rows 29 and 30 are outside x
    assert torch.equal(fastconv.causal_conv1d_varlen_states(x, past, 5)[1].double(),
                       torch.cat([torch.zeros(7, 1), x[27:29].T.double(),
                                  torch.zeros(7, 2)], 1))
    leaf = x.float().detach().requires_grad_()
    weights = torch.randn(5, 7, 5, generator=g)
    grad = torch.autograd.grad((fastconv.causal_conv1d_varlen_states(leaf, cu, 5)
                                * weights).sum(), leaf)[0]
    want = torch.zeros(29, 7)
    for i in range(5):
        for j in range(5):
            row = int(cu[i + 1]) - 5 + j
            if int(cu[i]) <= row:
                want[row] += weights[i, :, j]
    assert torch.equal(grad, want)


def test_varlen_states_carry_a_packed_prefill_into_decode():
    """A packed prefill (causal_conv1d with seq_idx), each sequence's states from
    causal_conv1d_varlen_states, then one decode step per sequence: as each sequence run
    alone with its next token."""
    g = torch.Generator().manual_seed(17)
    dim, width = 6, 4
    lengths = [7, 2, 5]
    total = sum(lengths)
    x = torch.randn(total + len(lengths), dim, generator=g)  # the prefill, then next tokens
    w, b = torch.randn(dim, width, generator=g), torch.randn(dim, generator=g)
    cu = torch.tensor([0, 7, 9, 14], dtype=torch.int32)
    seq_idx = torch.repeat_interleave(torch.arange(3, dtype=torch.int32),
                                      torch.tensor(lengths)).unsqueeze(0)
    prefill = fastconv.causal_conv1d(x[:total].T.unsqueeze(0), w, b, seq_idx,
                                     activation="silu")[0]
    states = fastconv.causal_conv1d_varlen_states(x[:total], cu, width - 1)
    step = fastconv.causal_conv1d_update(x[total:], states, w, b, "silu")
    for i in range(len(lengths)):
        start, end = int(cu[i]), int(cu[i + 1])
        alone = torch.cat([x[start:end], x[total + i:total + i + 1]]).T
        want = fastconv.causal_conv1d(alone.unsqueeze(0).contiguous(), w, b,
                                      activation="silu")[0]
        assert _rel(prefill[:, start:end], want[:, :-1]) < 1e-6
        assert _rel(step[i], want[:, -1]) < 1e-6


@pytest.mark.parametrize("call, match", [
    (lambda x, cu: fastconv.causal_conv1d_varlen_states(x.unsqueeze(0), cu, 3),
     r"x: got .*expected a floating \(total_tokens, dim\)"),
    (lambda x, cu: fastconv.causal_conv1d_varlen_states(x.int(), cu, 3), "x: got"),
    (lambda x, cu: fastconv.causal_conv1d_varlen_states(x, cu.float(), 3),
     r"cu_seqlens: got .*expected \(batch \+ 1,\) int32 or int64"),
    (lambda x, cu: fastconv.causal_conv1d_varlen_states(x, cu[:0], 3), "cu_seqlens: got"),
    (lambda x, cu: fastconv.causal_conv1d_varlen_states(x, cu.view(1, -1), 3),
     "cu_seqlens: got"),
    (lambda x, cu: fastconv.causal_conv1d_varlen_states(x, cu, 0),
     "state_len: got 0; expected an int >= 1"),
    (lambda x, cu: fastconv.causal_conv1d_varlen_states(x, cu, True), "state_len: got True"),
    (lambda x, cu: fastconv.causal_conv1d_varlen_states(x, cu, 2.0), "state_len: got 2.0"),
])
def test_bad_varlen_states_arguments_name_what_is_wrong(call, match):
    x = torch.randn(9, 4)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    with pytest.raises(ConvError, match=match):
        call(x, cu)


@pytest.mark.parametrize("route", ["kernel", "circular", "tokens"])
@pytest.mark.parametrize("index", [[3, -1, 1, 5], [0, -1, 7, 2], [-1, -2, 9, 6]])
def test_update_pads_entries_whose_pool_index_is_outside_the_pool(route, index):
    """causal-conv1d's pad slot (−1), or any index outside the pool, marks a padded entry:
    its output is zeros and no row of the pool changes for it; the used entries' rows and
    outputs are those of a step given only them. An index that clamps onto a used entry's
    row ([0, -1, ...], the padded entry written last) must not overwrite its update; none
    used leaves the pool as it was. Every route: the one-token kernel (the interpreter), the
    circular buffer and several tokens (torch operations)."""
    g = torch.Generator().manual_seed(11)
    dim, width, state_len = 6, 4, 3
    seqlen = 2 if route == "tokens" else 1
    w, b = torch.randn(dim, width, generator=g), torch.randn(dim, generator=g)
    x = torch.randn(4, dim, seqlen, generator=g)
    pool = torch.randn(6, dim, state_len, generator=g)
    idx = torch.tensor(index, dtype=torch.int32)
    lengths = torch.tensor([1, 2, 0, 1], dtype=torch.int32) if route == "circular" else None
    used = [i for i, r in enumerate(index) if 0 <= r < 6]
    want_pool = pool.clone()
    want = torch.zeros(4, dim, seqlen)
    if used:
        want[used] = fastconv.causal_conv1d_update(
            x[used], want_pool, w, b, "silu", None if lengths is None else lengths[used],
            idx[used]).view(len(used), dim, seqlen)
    got = pool.clone()
    out = fastconv.causal_conv1d_update(x[..., 0] if seqlen == 1 and route == "kernel" else x,
                                        got, w, b, "silu", lengths, idx)
    out = out.view(4, dim, seqlen)
    assert torch.allclose(out, want, rtol=1e-6, atol=1e-7)  # (conv1d's sums by batch)
    assert not out[[i for i in range(4) if i not in used]].any()
    assert torch.equal(got, want_pool)


def test_causal_conv1d_module_forward_and_step():
    torch.manual_seed(0)
    layer = fastconv.nn.CausalConv1d(6, 4, activation="silu")
    reference = torch.nn.Conv1d(6, 6, 4, groups=6)  # the same initialisation's bounds
    assert layer.weight.abs().max() <= reference.weight.abs().max() * 1.5
    x = torch.randn(2, 6, 10)
    whole = layer(x)
    state = layer.new_state(2)
    steps = torch.stack([layer.step(x[..., t], state) for t in range(10)], -1)
    assert _rel(steps, whole) < 1e-6
    whole.sum().backward()
    assert layer.weight.grad is not None and layer.bias.grad is not None
    assert "width=4" in repr(layer)


@pytest.mark.parametrize("k", [1, 5, 37, 64, 65, 200])
def test_long_conv1d_matches_the_definition(k):
    g = torch.Generator().manual_seed(k)
    x = torch.randn(2, 3, 200, generator=g)
    w = torch.randn(3, k, generator=g) / k ** 0.5
    b = torch.randn(3, generator=g)
    ref = torch.zeros(2, 3, 200, dtype=torch.float64)
    xd, wd = x.double(), w.double()
    for j in range(k):  # weight[:, 0] multiplies the current position
        ref[..., j:] += wd[:, j, None] * xd[..., :200 - j]
    ref += b.double()[None, :, None]
    out = fastconv.long_conv1d(x, w, b)
    assert out.shape == x.shape and _rel(out, ref) < 1e-5
    from fastconv import longconv

    for route in longconv._ROUTES.values():  # every route, whichever the rule picked
        assert _rel(route(x, w, b), ref) < 1e-5


def test_long_conv1d_gradients_through_the_torch_routes():
    from fastconv import longconv

    g = torch.Generator().manual_seed(2)
    args = [torch.randn(1, 2, 12, generator=g, dtype=torch.float64).requires_grad_(),
            torch.randn(2, 12, generator=g, dtype=torch.float64).requires_grad_(),
            torch.randn(2, generator=g, dtype=torch.float64).requires_grad_()]
    for name in ("direct", "fft"):  # (the fused kernel has no float64: the test below)
        assert torch.autograd.gradcheck(longconv._ROUTES[name], args)


def _long_reference(x, w, b=None):
    """long_conv1d's definition in float64: out[t] = Σ_{j ≤ t} w[j] · x[t − j] (+ b)."""
    xd, wd = x.detach().double(), w.detach().double()
    ref = torch.zeros(xd.shape, dtype=torch.float64)
    for j in range(w.shape[1]):
        ref[..., j:] += wd[:, j, None] * xd[..., :x.shape[-1] - j]
    return ref if b is None else ref + b.detach().double()[None, :, None]


def _poisoned(monkeypatch):
    """torch.empty and torch.empty_like fill what they make with NaN (an element a kernel
    reads or returns without writing it fails the test)."""
    empty, empty_like = torch.empty, torch.empty_like
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    monkeypatch.setattr(torch, "empty_like",
                        lambda *a, **kw: empty_like(*a, **kw).fill_(float("nan")))


@pytest.mark.parametrize("batch, dim, seqlen, k, bias, layout", [
    (2, 3, 37, 37, True, "seqlen"),  # N = 256: 16 x 16
    (1, 2, 200, 5, False, "seqlen"),  # a short filter, R = 16 rows of 16
    (3, 2, 129, 100, True, "dim"),  # N = 256, x dim-contiguous
    (1, 3, 300, 277, True, "seqlen"),  # N = 1024: 32 x 32
])
def test_fused_fft_kernel_matches_the_definition(monkeypatch, batch, dim, seqlen, k, bias,
                                                 layout):
    """The fused FFT kernel (interpreter, float32 operands) against float64, its output
    buffer poisoned so that an element it does not write fails the test."""
    from fastconv.backends.triton import fftconv

    _check_forward_kernel(monkeypatch, fftconv, seqlen + k, batch, dim, seqlen, k, bias,
                          layout)


def _check_forward_kernel(monkeypatch, kernels, seed, batch, dim, seqlen, k, bias, layout):
    """``kernels.long_conv`` against float64, x in the layout, its buffers poisoned so that
    an element it does not write fails the check."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, dim, seqlen, generator=g)
    if layout == "dim":
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    w = torch.randn(dim, k, generator=g) / k ** 0.5
    b = torch.randn(dim, generator=g) if bias else None
    _poisoned(monkeypatch)
    out = kernels.long_conv(x, w, b)
    assert out.shape == x.shape and out.isfinite().all()
    assert _rel(out, _long_reference(x, w, b)) < 1e-5


def test_fused_fft_route_gradients_match_the_definition():
    """The fused route's backward (real FFTs) against float64 autograd of the definition."""
    from fastconv import longconv

    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 45, generator=g).requires_grad_()
    w = (torch.randn(3, 31, generator=g) / 6).requires_grad_()
    b = torch.randn(3, generator=g).requires_grad_()
    grad = torch.randn(2, 3, 45, generator=g)
    longconv._fused_fft(x, w, b).backward(grad)
    refs = [t.detach().double().requires_grad_() for t in (x, w, b)]
    out = torch.zeros(2, 3, 45, dtype=torch.float64) + refs[2][None, :, None]
    for j in range(31):
        out = out + F.pad(refs[1][:, j, None] * refs[0][..., :45 - j], (j, 0))
    out.backward(grad.double())
    for mine, ref in zip((x, w, b), refs):
        assert _rel(mine.grad, ref.grad) < 1e-5


def _long_grads(x, w, grad):
    """(dx, dw) of long_conv1d's definition for the output gradient, float64 autograd."""
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    out = torch.zeros(xd.shape, dtype=torch.float64)
    for j in range(w.shape[1]):
        out = out + F.pad(wd[:, j, None] * xd[..., :x.shape[-1] - j], (j, 0))
    return torch.autograd.grad(out, (xd, wd), grad.double())


@pytest.mark.parametrize("batch, dim, seqlen, k, layout, need", [
    (3, 2, 37, 37, "seqlen", "both"), (2, 3, 129, 100, "dim", "both"),
    (1, 2, 300, 277, "seqlen", "dx"), (2, 2, 200, 5, "dim", "dw")])
def test_fused_fft_backward_kernel_matches_the_definition(monkeypatch, batch, dim, seqlen, k,
                                                          layout, need):
    """The fused backward kernel's dx and dw (interpreter, float32 operands) against float64
    autograd of the definition, for x and the output gradient in either layout (the
    gradient transposed: not contiguous), the buffers poisoned, only what is asked for."""
    from fastconv.backends.triton import fftconv

    _check_backward_kernel(monkeypatch, fftconv, seqlen * k, batch, dim, seqlen, k, layout,
                           need)


def _check_backward_kernel(monkeypatch, kernels, seed, batch, dim, seqlen, k, layout, need):
    """``kernels.long_conv_backward``'s dx and dw against float64 autograd of the
    definition: x and the output gradient in the layout, the buffers poisoned, only what
    ``need`` asks for."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, dim, seqlen, generator=g)
    grad = torch.randn(batch, dim, seqlen, generator=g)
    if layout == "dim":
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
        grad = grad.transpose(1, 2).contiguous().transpose(1, 2)
    w = torch.randn(dim, k, generator=g) / k ** 0.5
    ref_dx, ref_dw = _long_grads(x, w, grad)
    _poisoned(monkeypatch)
    dx, dw = kernels.long_conv_backward(x, w, grad, need != "dw", need != "dx")
    assert (dx is None) == (need == "dw") and (dw is None) == (need == "dx")
    if dx is not None:
        assert dx.shape == x.shape and _rel(dx, ref_dx) < 1e-5
    if dw is not None:
        assert dw.shape == w.shape and _rel(dw, ref_dw) < 1e-5


@pytest.mark.parametrize("batch, dim, seqlen, k, bias, layout, bk", [
    (2, 3, 200, 200, True, "seqlen", 32),  # M = 256: 16 x 16, one block
    (1, 2, 137, 9, False, "dim", 32),  # one batch row (the pair's second masked)
    (3, 2, 300, 277, True, "seqlen", 16),  # M = 512: 32 x 16, two blocks of 16 rows
])
def test_split_fft_kernel_matches_the_definition(monkeypatch, batch, dim, seqlen, k, bias,
                                                 layout, bk):
    """The two-halves FFT kernel (interpreter, float32 operands) at small sizes (the same
    code runs past 4,096 points on a GPU) against float64, its buffers poisoned."""
    from fastconv.backends.triton import fftsplit

    monkeypatch.setattr(fftsplit, "BK", bk)
    _check_forward_kernel(monkeypatch, fftsplit, seqlen + k + 1, batch, dim, seqlen, k, bias,
                          layout)


@pytest.mark.parametrize("batch, dim, seqlen, k, layout, need, bk", [
    (3, 2, 137, 100, "seqlen", "both", 32), (2, 2, 200, 200, "dim", "dx", 32),
    (1, 2, 300, 277, "seqlen", "dw", 16), (2, 1, 260, 31, "dim", "both", 16)])
def test_split_fft_backward_kernel_matches_the_definition(monkeypatch, batch, dim, seqlen, k,
                                                          layout, need, bk):
    """The two-halves backward kernel's dx and dw (interpreter, float32 operands) against
    float64 autograd of the definition, x and the output gradient in either layout, the
    buffers poisoned, only what is asked for."""
    from fastconv.backends.triton import fftsplit

    monkeypatch.setattr(fftsplit, "BK", bk)
    _check_backward_kernel(monkeypatch, fftsplit, seqlen * k + 1, batch, dim, seqlen, k,
                           layout, need)


def test_split_fft_route_takes_over_past_4096_points_for_bf16():
    """fftsplit is offered where fftconv's transform would pass 4,096 points, up to seqlen
    8,192, for bfloat16 only (fp16 has not run on a GPU); the fused route runs whichever
    module holds the shape."""
    from fastconv import longconv
    from fastconv.backends.triton import fftconv, fftsplit

    def x(seqlen, dtype=torch.bfloat16):
        return torch.empty(2, 4, seqlen, dtype=dtype)

    assert fftsplit.eligible(x(2049), 2049) and not fftconv.eligible(x(2049), 2049)
    assert fftsplit.eligible(x(8192), 8192) and fftsplit.eligible(x(4097), 1)
    assert not fftsplit.eligible(x(2048), 2048)  # 4,096 points: fftconv's
    assert not fftsplit.eligible(x(8193), 8)  # a half of 16,384 points
    assert not fftsplit.eligible(x(3000, torch.float16), 3000)
    assert not fftsplit.eligible(x(3000, torch.float32), 3000)
    assert longconv._fused_kernels(2048, 2048) is fftconv
    assert longconv._fused_kernels(2049, 2049) is fftsplit
    assert longconv._fused_kernels(4097, 1) is fftsplit
    assert fftsplit.sizes(3000, 3000) == (4096, 64, 64, 64, 32)
    assert fftsplit.sizes(200, 5) == (256, 16, 16, 16, 16)


def test_fused_fft_route_is_offered_for_16_bit_inputs_up_to_4096_points():
    from fastconv.backends.triton import fftconv

    half = torch.empty(2, 4, 2048, dtype=torch.bfloat16)  # (CPU: the interpreter's kernels)
    assert fftconv.eligible(half, 2048) and fftconv.transform_size(2048, 2048) == 4096
    assert not fftconv.eligible(torch.empty(2, 4, 2049, dtype=torch.float16), 2049)  # 8,192
    assert not fftconv.eligible(half.float(), 100)  # float32: the products would be 16-bit
    assert fftconv.transform_size(10, 3) == 256 and fftconv.split(2048) == (64, 32)


def test_fft_lengths_are_the_least_7_smooth_numbers():
    def smooth(n):
        for p in (2, 3, 5, 7):
            while n % p == 0:
                n //= p
        return n == 1
    for n in list(range(1, 400)) + [1023, 4097, 65537, 100001]:
        m = fft_length(n)
        assert m >= n and smooth(m) and not any(smooth(j) for j in range(n, m))


@pytest.mark.parametrize("call, match", [
    (lambda x, w: fastconv.causal_conv1d(x, w[:, :1]), "width 1; allowed: 2 to 256"),
    (lambda x, w: fastconv.causal_conv1d(x, torch.randn(4, 257)), "width 257"),
    (lambda x, w: fastconv.causal_conv1d(x, w[:3]), r"weight: got shape \(3, 4\)"),
    (lambda x, w: fastconv.causal_conv1d(x, w, activation="relu"), "activation: got 'relu'"),
    (lambda x, w: fastconv.causal_conv1d(x, w, seq_idx=torch.zeros(2, 9, dtype=torch.int64)),
     "seq_idx: torch.int64 on cpu; expected torch.int32"),
    (lambda x, w: fastconv.causal_conv1d(x, w, seq_idx=torch.zeros(2, 8, dtype=torch.int32)),
     r"seq_idx: got \(2, 8\)"),
    (lambda x, w: fastconv.causal_conv1d(x, w, initial_states=torch.zeros(2, 4, 4)),
     r"initial_states: got \(2, 4, 4\); expected \(batch, dim, width - 1\)"),
    (lambda x, w: fastconv.causal_conv1d(x, w, initial_states=torch.zeros(2, 4, 3).double()),
     "initial_states: torch.float64 on cpu; expected torch.float32"),
    (lambda x, w: fastconv.causal_conv1d(x[..., ::2], w), "strides"),
    (lambda x, w: fastconv.causal_conv1d(x[0], w), r"x: got shape \(4, 9\)"),
    (lambda x, w: fastconv.causal_conv1d(x[..., :0], w),
     r"x: got shape \(2, 4, 0\); dim and seqlen must be positive"),
    (lambda x, w: fastconv.causal_conv1d(x, w, torch.randn(4).int()), "bias: got"),
    (lambda x, w: fastconv.causal_conv1d(x, w.int()), "weight: got dtype torch.int32"),
    (lambda x, w: fastconv.causal_conv1d(x, w, precision="fp64"), "precision: got 'fp64'"),
    (lambda x, w: fastconv.causal_conv1d_update(x[..., 0], torch.zeros(2, 4, 2), w),
     "state_len >= width - 1 = 3"),
    (lambda x, w: fastconv.causal_conv1d_update(x[..., 0], torch.zeros(3, 4, 3), w),
     "3 rows for a batch of 2"),
    (lambda x, w: fastconv.long_conv1d(x, torch.randn(4, 10)), "1 <= K <= seqlen = 9"),
    (lambda x, w: fastconv.nn.CausalConv1d(4, 300), "width: got 300"),
])
def test_bad_arguments_name_what_is_wrong(call, match):
    x = torch.randn(2, 4, 9)
    w = torch.randn(4, 4)
    with pytest.raises(ConvError, match=match):
        call(x, w)


@pytest.mark.slow
def test_causal_conv1d_compiles_fullgraph():
    x, w, b, s = _inputs(2, 4, 11, 4, seed=4)
    seq_idx = torch.tensor([[0] * 5 + [1] * 6, [0] * 11], dtype=torch.int32)

    pool = torch.randn(5, 4, 3)
    index = torch.tensor([3, -1], dtype=torch.int32)  # a state pool with a padded entry

    def f(x, w, b, s, seq_idx, pool, buffer):
        out, final = fastconv.causal_conv1d(x, w, b, initial_states=s,
                                            return_final_states=True, activation="silu")
        packed, into = fastconv.causal_conv1d(x, w, b, seq_idx, return_final_states=True,
                                              activation="silu", final_states_out=buffer)
        step = fastconv.causal_conv1d_update(x[..., :2], pool, w, b, "silu", None, index)
        states = fastconv.causal_conv1d_varlen_states(x[0].T, cu_seqlens, 3)
        return out, final, packed, step, pool, into, states
    cu_seqlens = torch.tensor([0, 5, 6, 11], dtype=torch.int32)
    eager = f(x, w, b, s, seq_idx, pool.clone(), torch.empty(2, 4, 3))
    buffer = torch.full((2, 4, 3), float("nan"))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        compiled = torch.compile(f, fullgraph=True)(x, w, b, s, seq_idx, pool.clone(), buffer)
    for a, c in zip(eager, compiled):
        assert _rel(c, a) < 1e-6
    assert torch.equal(buffer, eager[5])  # (the buffer given, written)
    assert not compiled[3][1].any() and torch.equal(compiled[4][[0, 1, 2, 4]], pool[[0, 1, 2, 4]])
    # the routes ask whether they are traced before anything else (Dynamo warned that it
    # traced kernel_device()'s lru_cache)
    assert not [w for w in said if "lru_cache" in str(w.message)]


def _torch_route_grads(x, w, b, s, seq_idx, g):
    """Output and gradients (x, w, b, s) of the torch route in float64."""
    from fastconv import seqconv

    args = [t.detach().double().requires_grad_() for t in (x, w, b, s)]
    ids = seq_idx if seq_idx is not None else torch.zeros(x.shape[0], x.shape[2],
                                                          dtype=torch.int32)
    out = seqconv._packed_torch(*args[:3], ids, args[3], False, "silu")
    return out, torch.autograd.grad(out, args, g.double())


@pytest.mark.parametrize("layout", ["seqlen", "dim"])
@pytest.mark.parametrize("packed", [False, True])
def test_compiled_graphs_run_the_short_kernels_as_custom_ops(layout, packed, monkeypatch):
    """Inside torch.compile's graph (fullgraph) a short filter's training route is one
    custom op (seq_ops.short_conv), whose forward and backward are shortconv.py's kernels
    (interpreted), not a convolution of torch's: the output and every gradient against
    float64, and x's layout kept; without autograd the same op."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from fastconv import seqconv
    from fastconv.backends.triton import shortconv

    monkeypatch.setattr(seqconv, "_TRAIN_KERNELS_MIN_NUMEL", 0)
    backward = []
    real = shortconv.short_backward
    monkeypatch.setattr(shortconv, "short_backward",
                        lambda *a, **k: backward.append(1) or real(*a, **k))
    x, w, b, s = _inputs(2, 5, 29, 4, layout, seed=11)
    seq_idx = torch.tensor([[0] * 8 + [1] * 21, [0] * 29], dtype=torch.int32) \
        if packed else None
    args = [t.clone().requires_grad_() for t in (x, w, b, s)]

    def f(x, w, b, s):
        return fastconv.causal_conv1d(x, w, b, seq_idx, s, activation="silu")

    def traced(counter):
        return [str(n.target) for graph in counter.graphs for n in graph.graph.nodes
                if n.op == "call_function"]
    counter = CompileCounterWithBackend("aot_eager")
    out = torch.compile(f, fullgraph=True, backend=counter)(*args)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, args, g)
    want, want_grads = _torch_route_grads(x, w, b, s, seq_idx, g)
    assert traced(counter) == ["fastconv.short_conv.default"] and backward == [1]
    assert out.stride() == x.stride() and got[0].stride() == x.stride()
    assert _rel(out, want) < 1e-6
    assert all(_rel(a, c) < 1e-6 for a, c in zip(got, want_grads))
    counter = CompileCounterWithBackend("aot_eager")
    with torch.no_grad():
        plain = torch.compile(f, fullgraph=True, backend=counter)(x, w, b, s)
    assert traced(counter) == ["fastconv.short_conv.default"]
    assert _rel(plain, want) < 1e-6


def test_short_conv_ops_pass_opcheck():
    """torch.library.opcheck of both ops: schema, fakes (shapes and strides), autograd
    registration and AOT dispatch, with and without a bias, states and seq_idx."""
    from fastconv import seq_ops

    x, w, b, s = _inputs(2, 3, 13, 3, "dim", seed=12)
    seq_idx = torch.tensor([[0] * 5 + [1] * 8, [0] * 13], dtype=torch.int32)
    for bias, states, ids in ((b, s, seq_idx), (None, None, None)):
        args = [t.clone().requires_grad_() if t is not None else None
                for t in (x, states, w, bias)]
        torch.library.opcheck(seq_ops.short_conv, (*args, True, ids))
        dy = torch.randn(2, 3, 13)
        torch.library.opcheck(seq_ops.short_conv_backward,
                              (dy, x, states, w, bias, False, states is not None, ids))


def test_short_conv_op_answers_with_torch_where_its_kernels_fail(monkeypatch):
    """The op's kernels that fail are said once in a warning; the torch route answers, in
    the layouts the op promises (x's for the output and dx)."""
    from fastconv import seq_ops, seqconv
    from fastconv.backends.triton import shortconv

    def failing(*args, **kwargs):
        raise RuntimeError("no such kernel")
    monkeypatch.setattr(shortconv, "short_forward", failing)
    monkeypatch.setattr(seqconv, "_KERNEL_FAILED", {})
    x, w, b, s = _inputs(2, 3, 17, 5, "dim", seed=13)
    args = [t.clone().requires_grad_() for t in (x, s, w, b)]
    with pytest.warns(RuntimeWarning, match=r"kernels \(short\) failed .*no such kernel"):
        out = seq_ops.short_conv(*args, True, None)
    g = torch.randn(2, 3, 17)
    got = torch.autograd.grad(out, args, g)  # (the family is set aside: no kernel runs)
    want, want_grads = _torch_route_grads(x, w, b, s, None, g)
    assert out.stride() == x.stride() and got[0].stride() == x.stride()
    assert _rel(out, want) < 1e-6
    assert all(_rel(a, c) < 1e-6 for a, c in zip(got, [want_grads[i] for i in (0, 3, 1, 2)]))


class _MambaMixer(torch.nn.Module):
    """The convolution part of a Mamba block, in plain torch."""

    def __init__(self, d=12, expand=2, width=4, cut=0, hooked=False):
        super().__init__()
        inner = d * expand
        self.in_proj = torch.nn.Linear(d, 2 * inner)
        self.conv1d = torch.nn.Conv1d(inner, inner, width, groups=inner, padding=width - 1)
        self.act = torch.nn.SiLU()
        self.out_proj = torch.nn.Linear(inner, d)
        self.cut = cut  # outputs dropped from the end beyond the causal slice
        if hooked:
            self.conv1d.register_forward_hook(lambda m, i, o: o * 2)

    def forward(self, h):
        seqlen = h.shape[1]
        x, z = self.in_proj(h).transpose(1, 2).chunk(2, dim=1)
        x = self.act(self.conv1d(x)[..., :seqlen - self.cut])
        return self.out_proj((x * F.silu(z[..., :seqlen - self.cut])).transpose(1, 2))


@pytest.mark.parametrize("mode,route", [("inference", "conv1d"), ("training", "conv1d"),
                                        ("training", "kernels")])
def test_a_mamba_block_through_optimize_fuses_the_causal_conv(mode, route, monkeypatch):
    """The fused block runs causal_conv1d: through conv1d at this size, or (the size rule
    lowered, conv1d refused) through the training kernels (interpreted here)."""
    from fastconv import seqconv

    torch.manual_seed(0)
    model = _MambaMixer().double().train(mode == "training")
    h = torch.randn(2, 13, 12, dtype=torch.float64)
    if route == "kernels":
        monkeypatch.setattr(seqconv, "_TRAIN_KERNELS_MIN_NUMEL", 0)
        monkeypatch.setattr(seqconv, "conv1d", None)  # (the conv1d route would fail)
    fast = fastconv.optimize(model, mode, "ieee")
    assert fast.report.fused == [("conv1d", "causal conv1d -> slice -> silu")]
    assert sorted(fast.state_dict()) == sorted(model.state_dict())
    with torch.set_grad_enabled(mode == "training"):
        out, ref = fast(h), model(h)
    assert _rel(out, ref) < 1e-12
    if mode == "training":
        out.square().sum().backward()
        ref.square().sum().backward()
        grads = dict(fast.named_parameters())
        for name, p in model.named_parameters():
            assert _rel(grads[name].grad, p.grad) < 1e-12, name


@pytest.mark.parametrize("variant", ["other slice", "hooked", "not causal"])
def test_blocks_that_are_not_causal_convs_stay_as_written(variant):
    torch.manual_seed(1)
    model = _MambaMixer(cut=2 if variant == "other slice" else 0,
                        hooked=variant == "hooked").double().eval()
    if variant == "not causal":  # the same lengths, another padding
        model.conv1d.padding_mode = "circular"
    h = torch.randn(2, 13, 12, dtype=torch.float64)
    fast = fastconv.optimize(model, "inference", "ieee")
    assert _rel(fast(h), model(h)) < 1e-12
    if variant != "other slice":  # (that one fuses, and runs as written at its length)
        assert not fast.report.fused


def test_a_fused_causal_block_reads_its_convolution_at_each_call():
    torch.manual_seed(2)
    model = _MambaMixer().double().eval()
    h = torch.randn(2, 13, 12, dtype=torch.float64)
    fast = fastconv.optimize(model, "inference", "ieee")
    fast(h)
    model.conv1d.padding_mode = "circular"  # set after a call, on both models
    fast.model.conv1d_causal.conv.padding_mode = "circular"
    assert _rel(fast(h), model(h)) < 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_one_token_step_runs_one_kernel_and_matches_torch_s_step(dtype, monkeypatch):
    """One token without a circular buffer runs backends/triton/decode.py (the interpreter
    here): the output within the dtype's rounding of float64, the state rows shifted in
    place (pool rows not named untouched); with autograd on, torch's operations run."""
    from fastconv.backends.triton import decode

    ran = []
    real = decode.decode_step
    monkeypatch.setattr(decode, "decode_step", lambda *a: ran.append(1) or real(*a))
    g = torch.Generator().manual_seed(3)
    batch, dim, width, state_len = 3, 300, 4, 5  # two programs of 256 channels, masked
    w = (torch.randn(dim, width, generator=g) / 2).to(dtype)
    b = torch.randn(dim, generator=g).to(dtype)
    pool = torch.randn(6, dim, state_len, generator=g).to(dtype)
    index = torch.tensor([4, 0, 2], dtype=torch.int32)
    x = torch.randn(batch, dim, generator=g).to(dtype)
    before = pool.clone()
    window = torch.cat([before[index.long(), :, -(width - 1):], x.unsqueeze(-1)], -1)
    ref = F.silu((window.double() * w.double()).sum(-1) + b.double())
    out = fastconv.causal_conv1d_update(x, pool, w, b, "silu", conv_state_indices=index)
    assert ran and out.dtype == dtype and out.shape == x.shape
    assert _rel(out, ref) < (1e-6 if dtype == torch.float32 else 8e-3)
    want = torch.cat([before[index.long()], x.unsqueeze(-1)], -1)[..., 1:]
    assert torch.equal(pool[index.long()], want)
    assert torch.equal(pool[[1, 3, 5]], before[[1, 3, 5]])
    ran.clear()
    wg = w.float().requires_grad_()
    state = before[:batch].float().clone()
    y = fastconv.causal_conv1d_update(x.float(), state, wg, None)
    y.sum().backward()
    assert not ran and wg.grad is not None


@pytest.mark.parametrize("width, state_len, layout", [(2, 1, "rows"), (4, 3, "dim"),
                                                      (20, 23, "rows"), (20, 19, "dim")])
def test_a_one_token_step_s_kernel_reads_any_state_layout(width, state_len, layout,
                                                          monkeypatch):
    """The decode kernel on rows contiguous or not (a (pool, state_len, dim) buffer seen
    as (pool, dim, state_len)), one channel block or several, widths whose taps are
    unrolled and beyond (a loop): the state shifted exactly, the output within float32's
    rounding, padded entries zeros."""
    from fastconv.backends.triton import decode

    ran = []
    real = decode.decode_step
    monkeypatch.setattr(decode, "decode_step", lambda *a: ran.append(1) or real(*a))
    g = torch.Generator().manual_seed(width + state_len)
    dim = 300
    w = torch.randn(dim, width, generator=g) / width ** 0.5
    b = torch.randn(dim, generator=g)
    pool = torch.randn(7, dim, state_len, generator=g)
    if layout == "dim":
        pool = pool.transpose(1, 2).contiguous().transpose(1, 2)
    index = torch.tensor([4, -1, 0, 6], dtype=torch.int32)
    x = torch.randn(4, dim, generator=g)
    before = pool.clone()
    used = index.long()[[0, 2, 3]]
    window = torch.cat([before[used], x[[0, 2, 3]].unsqueeze(-1)], -1)
    ref = (window[..., -width:].double() * w.double()).sum(-1) + b.double()
    out = fastconv.causal_conv1d_update(x, pool, w, b, None, conv_state_indices=index)
    assert ran and _rel(out[[0, 2, 3]], ref) < 1e-6 and not out[1].any()
    assert torch.equal(pool[used], window[..., 1:])
    assert torch.equal(pool[[1, 2, 3, 5]], before[[1, 2, 3, 5]])


def test_check_rows_fail_on_a_wrong_route_and_on_a_failed_kernel(monkeypatch):
    """``fastconv check``'s sequence rows (interpreted here) are within the contract, fail
    where a route is 1 % off, and a kernel failure gives a failing row, not fewer rows."""
    from fastconv import seqconv
    from fastconv.tools.check import seqconv_rows

    rows = seqconv_rows("cpu", torch.Generator().manual_seed(1))
    assert len(rows) == 14 and all(r.ok for r in rows), [(r.case, r.rel_err) for r in rows]
    real = seqconv._wide_kernel
    monkeypatch.setattr(seqconv, "_wide_kernel", lambda *args: real(*args) * 1.01)
    rows = seqconv_rows("cpu", torch.Generator().manual_seed(1))
    assert {r.case for r in rows if not r.ok} == {"causal_conv1d w40 forward, tensor cores",
                                                  "causal_conv1d w40 fwd+bwd, tensor cores"}
    monkeypatch.setattr(seqconv, "_wide_kernel", real)
    monkeypatch.setattr(seqconv, "_KERNEL_FAILED", {"wide": "RuntimeError: no such kernel"})
    rows = seqconv_rows("cpu", torch.Generator().manual_seed(1))
    assert [r.case for r in rows if not r.ok] == [
        "causal_conv1d wide kernels FAILED: RuntimeError: no such kernel"]
    assert len(rows) == 11  # (the wide rows gone; the packed kernels' still run)


@pytest.mark.parametrize("layout", ["seqlen", "dim"])
def test_short_kernels_compile_for_an_h100(layout):
    """shortconv's kernels (and shortrows' where they run) compiled by Triton's own compiler
    for sm_90a, no GPU needed (in a process of its own: this one interprets kernels): what
    the interpreter does not check (a constexpr assigned inside a static loop ran in the
    interpreter and was refused by the compiler). Taps one or two chunks back, with and
    without seq_idx, the tiles the kernels run: none spills more than a few dozen bytes
    (width 17 with seq_idx holds 255 registers and spills ~24 bytes on Triton 3.8; the
    unused wider tiles, kilobytes)."""
    import os
    import re
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = ""
    for ids in ([], ["--ids"]):
        run = subprocess.run([sys.executable, "-m", "fastconv.tools.offline", "--layout",
                              layout, "--widths", "8,17", "--used", *ids],
                             capture_output=True,
                             text=True, env=env, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        out += run.stdout
    # every kernel compiled (width 8 without seq_idx: the backward over 16-position chunks
    # too; dim-contiguous without seq_idx: shortrows.py's backward in place of both, and its
    # forward at width 17)
    assert out.count("registers") == (9 if layout == "seqlen" else 8), out
    # (registers read where the ptxas Triton ships takes the PTX alone: not Triton 3.9's)
    rows = re.findall(r"(\d+) registers, spill stores (\d+) bytes", out)
    assert all(0 < int(r) <= 255 and int(s) <= 64 for r, s in rows), out


def test_offline_compile_takes_the_launch_num_stages():
    """tools.offline compiles with the launch's ``num_stages`` where given (fftconv's
    kernels launch with 1; Triton's default of 3 misreads their shared memory), and with
    Triton's default where not (shortconv's and shortrows' launches)."""
    import os
    import subprocess
    import sys

    code = ("import triton.language as tl\n"
            "from fastconv.tools.offline import compile_kernel\n"
            "from fastconv.backends.triton import fftconv\n"
            "ptrs = {n: '*fp32' for n in ('f1r_ptr', 'f1i_ptr', 'tw_r_ptr', 'tw_i_ptr',"
            " 'f2r_ptr', 'f2i_ptr', 'g1r_ptr', 'g1i_ptr')}\n"
            "for st in (1, None):\n"
            "    k = compile_kernel(fftconv._long_conv_kernel, dict(N1=16, N2=16, R=16,"
            " HAS_BIAS=False, DT=tl.bfloat16), ptrs, num_stages=st)\n"
            "    print(k.metadata.num_stages)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["1", "3"], run.stdout


@pytest.mark.parametrize("route", ["direct", "fft", "fused_fft"])
def test_long_conv1d_compiles_whole_whichever_route_was_measured(route, monkeypatch):
    """torch.compile (fullgraph) of long_conv1d with each route stored for the shape: the
    fused kernel's is replaced by the real FFTs inside a compiled graph."""
    from fastconv import longconv

    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(2, 3, 50, generator=g), torch.randn(3, 50, generator=g) / 7, \
        torch.randn(3, generator=g)
    monkeypatch.setattr(longconv, "LONG_CONV_CHOICES",
                        {((2, 3, 50), 50, torch.float32, "cpu"): route})
    called = []
    monkeypatch.setitem(longconv._ROUTES, "fused_fft", lambda *a: called.append(a))
    try:
        got = torch.compile(fastconv.long_conv1d, backend="aot_eager", fullgraph=True)(x, w, b)
    finally:
        torch._dynamo.reset()
    assert not called and _rel(got, _long_reference(x, w, b)) < 1e-5


@pytest.mark.parametrize("to_seqlen", [True, False])
def test_relayout_copies_every_element_into_the_layout_asked(to_seqlen):
    """backends/triton/relayout.py (interpreted): odd sizes past one tile, from either
    layout and from a strided view (a projection's half), the values x's, the layout the one
    asked for; an empty tensor launches nothing."""
    from fastconv.backends.triton.relayout import relayout

    base = torch.randn(2, 70, 2 * 67)
    sources = [base[..., :67], base.transpose(1, 2)[:, :67].transpose(1, 2)[..., :70],
               torch.randn(2, 67, 130)[:, :, ::2]]
    for x in sources:
        out = relayout(x, to_seqlen)
        assert torch.equal(out, x) and out.stride(2 if to_seqlen else 1) == 1
        assert out.is_contiguous() == to_seqlen
    assert relayout(torch.empty(2, 0, 5), to_seqlen).shape == (2, 0, 5)
