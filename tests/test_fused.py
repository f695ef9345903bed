"""Conv + BatchNorm + activation: gradcheck of the training-mode function (Triton kernels in
the interpreter), parity with torch's Conv -> BatchNorm -> activation in both modes,
running statistics, state_dict, and statistics synchronised over two processes."""

import os
import random

import pytest
import torch

import fastconv
from fastconv import ConvError, batchnorm
from fastconv.nn import ConvBNAct1d, ConvBNAct2d
from fastconv.precision import relative_error


@pytest.fixture(params=["triton", "torch", "native"])
def bn_path(request, monkeypatch):
    """Every implementation of the training batch norm: the fused passes as Triton kernels
    (interpreted here) and as the torch operations used where the kernels cannot run, and
    torch's own batch_norm, which eager calls take by default (batchnorm.FUSED_IN_EAGER)."""
    monkeypatch.setattr(batchnorm, "USE_TRITON", request.param == "triton")
    monkeypatch.setattr(batchnorm, "FUSED_IN_EAGER", request.param != "native")
    return request.param


def _f64(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("activation,residual", [("relu", False), ("silu", True),
                                                 ("leaky_relu", False), ("sigmoid", True)])
@pytest.mark.slow_after(1)
def test_gradcheck_training_mode(activation, residual, bn_path):
    x, w, b = _f64(2, 4, 5, 4), _f64(6, 2, 3, 2), _f64(6)
    gamma, beta = _f64(6), _f64(6)
    res = _f64(2, 6, 3, 5) if residual else None

    def fn(x, w, b, gamma, beta, *rest):
        return fastconv.conv_bn_act2d(x, w, b, None, None, gamma, beta, (2, 1), 1, 1, 2,
                                      training=True, activation=activation,
                                      residual=rest[0] if rest else None, backend="triton",
                                      precision="ieee")
    inputs = (x, w, b, gamma, beta) + ((res,) if residual else ())
    # fast mode: one random projection per input (the interpreter runs each call in numpy)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5, fast_mode=True)


def _torch_reference(conv, bn, act, x, res):
    y = bn(conv(x))
    if res is not None:
        y = y + res
    return act(y)


def _err(t, ref, scale):
    """Distance to ``ref``, relative to it or to 1 % of ``scale``."""
    return float((t - ref).norm() / (ref.norm() + 1e-2 * scale))


def _params(conv, bn):
    return [p for p in (conv.weight, conv.bias, bn.weight, bn.bias) if p is not None]


def _config(rng: random.Random):
    rank = rng.choice((1, 2, 2))
    groups = rng.choice((1, 1, 2, 4))
    c, k = groups * rng.choice((1, 2, 3)), groups * rng.choice((1, 2, 5))
    spatial = tuple(rng.randint(3, 9) for _ in range(rank))
    return dict(rank=rank, n=rng.choice((2, 3, 4)), c=c, k=k, spatial=spatial,
                kernel=rng.choice((1, 2, 3)), stride=rng.choice((1, 2)),
                padding=rng.choice((0, 1)), dilation=rng.choice((1, 1, 2)), groups=groups,
                bias=rng.random() < 0.4, momentum=rng.choice((0.1, 0.3, None)),
                affine=rng.random() < 0.8, track=rng.random() < 0.85,
                activation=rng.choice(fastconv.ACTIVATIONS), residual=rng.random() < 0.3,
                negative_slope=rng.choice((0.01, 0.2)))


CONFIGS = [_config(random.Random(i)) for i in range(60)]


@pytest.mark.parametrize("index", range(len(CONFIGS)),
                         ids=[f"r{c['rank']}{c['activation']}" for c in CONFIGS])
@pytest.mark.slow_after(10)
def test_parity_with_torch_in_both_modes(index, monkeypatch):
    monkeypatch.setattr(batchnorm, "FUSED_IN_EAGER", True)
    _check_parity(index)


@pytest.mark.parametrize("index", range(0, len(CONFIGS), 5))
def test_parity_of_the_torch_operations_path(index, monkeypatch):
    monkeypatch.setattr(batchnorm, "USE_TRITON", False)
    monkeypatch.setattr(batchnorm, "FUSED_IN_EAGER", True)
    _check_parity(index)


@pytest.mark.parametrize("index", range(1, len(CONFIGS), 3))
def test_parity_of_the_eager_native_path(index):
    assert not batchnorm.FUSED_IN_EAGER  # the default
    _check_parity(index)


def _check_parity(index):
    """Outputs, every parameter gradient, running statistics and num_batches_tracked after
    three training steps, then the eval output, against torch's modules. In float64, so the
    check is of the formulas (1e-9), not of float32 rounding: BatchNorm's backward cancels,
    and torch's CPU batch norm accumulates float32 in float64; the GPU tests hold the float32
    and half paths to the precision contract."""
    cfg = CONFIGS[index]
    torch.manual_seed(index)
    rank, k = cfg["rank"], cfg["k"]
    cls = ConvBNAct1d if rank == 1 else ConvBNAct2d
    ours = cls(cfg["c"], k, cfg["kernel"], cfg["stride"], cfg["padding"], cfg["dilation"],
               cfg["groups"], cfg["bias"], momentum=cfg["momentum"], affine=cfg["affine"],
               track_running_stats=cfg["track"], activation=cfg["activation"],
               negative_slope=cfg["negative_slope"], dtype=torch.float64)
    if cfg["affine"]:  # non-trivial γ, β
        with torch.no_grad():
            ours.bn.weight.uniform_(0.5, 1.5)
            ours.bn.bias.uniform_(-0.5, 0.5)
    seq = ours.to_torch()
    conv, bn, act = seq
    for step in range(3):
        x = torch.randn(cfg["n"], cfg["c"], *cfg["spatial"], dtype=torch.float64)
        try:
            out_shape = conv(x).shape
        except RuntimeError:
            pytest.skip("kernel larger than the padded input")
        res = torch.randn(out_shape, dtype=torch.float64) if cfg["residual"] else None
        if out_shape[0] * out_shape[2:].numel() <= 1:
            pytest.skip("one value per channel")
        a = ours(x, res)
        b = _torch_reference(conv, bn, act, x, res)
        assert relative_error(a, b) < 1e-9, step
        g = torch.randn_like(b)
        ga = torch.autograd.grad(a, list(ours.parameters()), g)
        gb = torch.autograd.grad(b, _params(conv, bn), g)
        scale = gb[0].norm()  # the conv bias's gradient is ~0 in training (BN removes
        for u, v in zip(ga, gb):  # the mean): judged at the weight gradient's scale
            assert _err(u, v, scale) < 1e-9, step
    if cfg["track"]:
        assert relative_error(ours.bn.running_mean, bn.running_mean) < 1e-12
        assert relative_error(ours.bn.running_var, bn.running_var) < 1e-12
        assert int(ours.bn.num_batches_tracked) == int(bn.num_batches_tracked) == 3
    ours.eval()
    seq.eval()
    x = torch.randn(1, cfg["c"], *cfg["spatial"], dtype=torch.float64)  # batch 1 in eval
    res = torch.randn(conv(x).shape, dtype=torch.float64) if cfg["residual"] else None
    assert relative_error(ours(x, res), _torch_reference(conv, bn, act, x, res)) < 1e-9


def test_eval_is_one_fused_convolution_and_its_gradients_match():
    m = ConvBNAct2d(8, 16, 3, padding=1, bias=True, activation="relu6").eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
        m.bn.weight.uniform_(0.5, 1.5)
    seq = m.to_torch().eval()
    x = torch.randn(2, 8, 11, 9, requires_grad=True)
    a, b = m(x), seq(x)
    assert relative_error(a, b) < 1e-5
    ga = torch.autograd.grad(a.sum(), (x, m.weight, m.bias, m.bn.weight, m.bn.bias))
    gb = torch.autograd.grad(b.sum(), (x, seq[0].weight, seq[0].bias, seq[1].weight,
                                       seq[1].bias))
    for u, v in zip(ga, gb):
        assert relative_error(u, v) < 1e-5


def test_inference_without_grad_reuses_folded_weights_until_something_changes():
    m = ConvBNAct2d(6, 10, 3, padding=1, stride=2, activation="silu").eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
    seq = m.to_torch().eval()
    x = torch.randn(3, 6, 9, 13)
    with torch.no_grad():
        assert relative_error(m(x), seq(x)) < 1e-5
        first = m._call_site().fold
        m(x)
        assert m._call_site().fold is first  # nothing changed: no refold
        for ours, theirs in ((m.bn.running_var, seq[1].running_var),
                             (m.weight, seq[0].weight), (m.bn.bias, seq[1].bias)):
            ours.mul_(1.5)  # in place: the version moves
            theirs.mul_(1.5)
            assert relative_error(m(x), seq(x)) < 1e-5
        m.bn.running_mean = torch.zeros(10)  # replaced
        seq[1].running_mean = torch.zeros(10)
        assert relative_error(m(x), seq(x)) < 1e-5
    y = m(x.requires_grad_())  # with autograd: folded per call, gradients flow
    assert m._call_site().fold is not None and y.requires_grad


def test_inference_plan_and_autocast_casts_follow_the_inputs_and_parameters():
    """The no-grad path keeps a plan per input signature and the autocast casts of its
    weights: a new shape, layout, dtype or residual replans; an in-place change of a
    parameter (its version moves) recasts; results always equal torch's."""
    m = ConvBNAct2d(5, 7, 3, padding=1, activation="relu").eval()
    with torch.no_grad():
        m.bn.running_var.uniform_(0.5, 2)
    seq = m.to_torch().eval()
    with torch.no_grad():
        for shape in ((2, 5, 9, 11), (3, 5, 6, 7), (2, 5, 9, 11)):
            x = torch.randn(shape)
            assert relative_error(m(x), seq(x)) < 1e-5
            xl = x.contiguous(memory_format=torch.channels_last)
            assert relative_error(m(xl), seq(x)) < 1e-5
        res = torch.randn(2, 7, 9, 11)
        x = torch.randn(2, 5, 9, 11)
        assert relative_error(m(x, res), torch.relu(seq[1](seq[0](x)) + res)) < 1e-5
        ref = seq(x)  # (torch's own autocast cache would not see the in-place change below)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = m(x)
            assert y.dtype == torch.bfloat16
            assert relative_error(y.float(), ref) < 2e-2
            casts = m._call_site().casts
            m(x)
            assert m._call_site().casts is casts  # nothing changed: no recast
            m.weight.mul_(-1)  # in place: refold, recast
            seq[0].weight.mul_(-1)
            assert relative_error(m(x).float(), ref) > 0.5  # the change is seen
        ref = seq(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert relative_error(m(x).float(), ref) < 2e-2
            assert m._call_site().casts is not casts  # recast
            assert m._call_site().casts[7].dtype == torch.bfloat16
        plain = fastconv.nn.Conv2d(5, 4, 3, padding=2, dilation=2).eval()
        ref = torch.nn.functional.conv2d(x, plain.weight, plain.bias, 1, 2, 2)
        assert relative_error(plain(x), ref) < 1e-5
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert relative_error(plain(x).float(), ref) < 2e-2
            plain.bias.add_(1)
            assert relative_error(plain(x).float(), ref + 1) < 2e-2


def test_state_dict_round_trip_and_torch_interop():
    seq = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, padding=1),
                              torch.nn.BatchNorm2d(6, momentum=None),
                              torch.nn.LeakyReLU(0.2))
    seq(torch.randn(4, 3, 5, 5))  # non-trivial running statistics
    m = ConvBNAct2d.from_torch(seq)
    assert (m.activation, m.negative_slope, m.bn.momentum) == ("leaky_relu", 0.2, None)
    assert set(m.state_dict()) == {"weight", "bias", "bn.weight", "bn.bias",
                                   "bn.running_mean", "bn.running_var",
                                   "bn.num_batches_tracked"}
    fresh = ConvBNAct2d(3, 6, 3, padding=1, bias=True, activation="leaky_relu",
                        negative_slope=0.2)
    fresh.load_state_dict(m.state_dict())
    back = fresh.to_torch()
    for key, v in seq.state_dict().items():
        assert torch.equal(back.state_dict()[key], v), key
    seq.eval()
    back.eval()
    fresh.eval()
    x = torch.randn(2, 3, 5, 5)
    assert relative_error(fresh(x), seq(x)) < 1e-6 and relative_error(back(x), seq(x)) == 0


def test_from_torch_copies_the_parameters_as_they_are():
    """Copies, not the same tensors; a frozen weight stays frozen."""
    conv, bn = torch.nn.Conv2d(3, 5, 3, bias=False), torch.nn.BatchNorm2d(5, affine=False)
    conv.weight.requires_grad_(False)
    m = ConvBNAct2d.from_torch(conv, bn)
    assert torch.equal(m.weight, conv.weight) and m.weight is not conv.weight
    assert not m.weight.requires_grad and m.bias is None and m.bn.weight is None
    assert m.bn is not bn and m.bn.running_mean is not bn.running_mean
    m.weight.data.add_(1)
    assert not torch.equal(m.weight, conv.weight)


def test_bad_arguments_are_clear_errors():
    x, w = torch.randn(1, 2, 1, 1), torch.randn(3, 2, 1, 1)
    with pytest.raises(ConvError, match="more than 1 value per channel"):
        fastconv.conv_bn_act2d(x, w, training=True)
    with pytest.raises(ConvError, match=r"running_mean: expected a tensor of shape \(3,\)"):
        fastconv.conv_bn_act2d(x, w, None, torch.zeros(4), torch.ones(3))
    with pytest.raises(ConvError, match="give both or neither"):
        fastconv.conv_bn_act2d(x, w, None, torch.zeros(3), None)
    with pytest.raises(ConvError, match="eps"):
        fastconv.conv_bn_act2d(x, w, None, torch.zeros(3), torch.ones(3), eps=0)
    with pytest.raises(ConvError, match="activation"):
        ConvBNAct2d(2, 3, 1, activation="swish")
    with pytest.raises(ConvError, match="Conv2d and BatchNorm2d"):
        ConvBNAct2d.from_torch(torch.nn.Sequential(torch.nn.Conv2d(2, 3, 1),
                                                   torch.nn.BatchNorm1d(3)))
    with pytest.raises(ConvError, match="Softplus has no fastconv equivalent"):
        ConvBNAct2d.from_torch(torch.nn.Conv2d(2, 3, 1), torch.nn.BatchNorm2d(3),
                               torch.nn.Softplus())


# ----------------------------------------------------------------- two processes, gloo
def _sync_worker(rank, world, init_file, x, w, gamma, beta, g, out_file):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        m = ConvBNAct2d(4, 6, 3, padding=1, activation="silu", sync_stats=True,
                        precision="ieee")
        with torch.no_grad():
            m.weight.copy_(w)
            m.bn.weight.copy_(gamma)
            m.bn.bias.copy_(beta)
        part = slice(rank * 3, rank * 3 + 3) if rank == 0 else slice(3, None)  # 3 and 2 images
        xs = x[part].clone().requires_grad_()
        y = m(xs)
        grads = torch.autograd.grad(y, (xs, m.weight, m.bn.weight, m.bn.bias), g[part])
        dist.all_reduce(grads[1])  # DDP's gradient all-reduce of the parameters
        dist.all_reduce(grads[2])
        dist.all_reduce(grads[3])
        torch.save({"y": y.detach(), "dx": grads[0], "dw": grads[1], "dgamma": grads[2],
                    "dbeta": grads[3], "running_mean": m.bn.running_mean,
                    "running_var": m.bn.running_var}, out_file.format(rank))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_synced_statistics_over_two_processes_equal_one_process_on_the_whole_batch(tmp_path):
    """Two gloo ranks holding 3 and 2 images give what one process gives on all 5 (as
    SyncBatchNorm would): outputs, input gradients, summed parameter gradients, running
    statistics."""
    import torch.multiprocessing as mp

    torch.manual_seed(0)
    x, w = torch.randn(5, 4, 6, 7), torch.randn(6, 4, 3, 3) / 6
    gamma, beta = torch.rand(6) + 0.5, torch.randn(6)
    g = torch.randn(5, 6, 6, 7)
    out = str(tmp_path / "rank{}.pt")
    mp.spawn(_sync_worker, args=(2, str(tmp_path / "init"), x, w, gamma, beta, g, out),
             nprocs=2, join=True)
    r0, r1 = (torch.load(out.format(r)) for r in range(2))

    ref = ConvBNAct2d(4, 6, 3, padding=1, activation="silu", precision="ieee")
    with torch.no_grad():
        ref.weight.copy_(w)
        ref.bn.weight.copy_(gamma)
        ref.bn.bias.copy_(beta)
    xr = x.clone().requires_grad_()
    y = ref(xr)
    dx, dw, dgamma, dbeta = torch.autograd.grad(y, (xr, ref.weight, ref.bn.weight,
                                                    ref.bn.bias), g)
    assert relative_error(torch.cat([r0["y"], r1["y"]]), y) < 1e-5
    assert relative_error(torch.cat([r0["dx"], r1["dx"]]), dx) < 1e-5
    for name, refv in (("dw", dw), ("dgamma", dgamma), ("dbeta", dbeta),
                       ("running_mean", ref.bn.running_mean),
                       ("running_var", ref.bn.running_var)):
        assert relative_error(r0[name], refv) < 1e-5, name
        assert torch.equal(r0[name], r1[name]), name  # every rank holds the same values
    assert os.path.exists(out.format(1))


@pytest.mark.parametrize("programs", [512, 4, 1])
def test_statistics_kernels_over_many_tiles(programs, monkeypatch):
    """More partial-statistics tiles than the finalize combines at once (4920 rows: 77 tiles
    of 64, the last one of 56), one tile per program or several (the last program's range
    ending past the rows), a mean far from zero (no E[x²]−E[x]² cancellation), channels-last
    strides, the running statistics updated in place."""
    from fastconv.backends.triton import bnstats

    monkeypatch.setattr(bnstats, "PARTIALS", programs)
    monkeypatch.setitem(bnstats.PASS_TILES, "stats", bnstats.Tile(64, 32, 4))
    assert bnstats.partials(77) == {512: (77, 1), 4: (4, 20), 1: (1, 77)}[programs]
    y = (torch.randn(3, 5, 40, 41) * 0.01 + 100).contiguous(memory_format=torch.channels_last)
    rm, rv = torch.randn(5), torch.rand(5) + 0.5
    want_rm = 0.9 * rm + 0.1 * y.double().mean((0, 2, 3))
    want_rv = 0.9 * rv + 0.1 * y.double().var((0, 2, 3))
    mean, var, invstd, scale, shift = bnstats.forward_stats(y, None, None, 1e-5,
                                                            rm, rv, 0.1)
    assert relative_error(mean, y.double().mean((0, 2, 3))) < 1e-6
    assert relative_error(var, y.double().var((0, 2, 3), unbiased=False)) < 1e-4
    assert relative_error(rm, want_rm) < 1e-6 and relative_error(rv, want_rv) < 1e-4
    assert relative_error(scale, invstd) == 0 and relative_error(shift, -mean * invstd) < 1e-6


def test_statistics_when_the_first_rows_are_outliers(monkeypatch):
    """A program's shift (its first tile's mean) far from its rows' mean: one program over
    all 63 tiles, the first tile of 64 rows at +50σ, the rest ordinary; mean and variance
    still within float32's rounding of the float64 ones."""
    from fastconv.backends.triton import bnstats

    monkeypatch.setattr(bnstats, "PARTIALS", 1)
    y = torch.randn(1, 3, 4000, dtype=torch.float64)
    y[:, :, :64] += 50
    mean, var, *_ = bnstats.forward_stats(y.float(), None, None, 1e-5, None,
                                          None, 0.1)
    yd = y.float().double()
    assert relative_error(mean, yd.mean((0, 2))) < 1e-6
    assert relative_error(var, yd.var((0, 2), unbiased=False)) < 1e-6


@pytest.mark.parametrize("programs", [512, 3])
def test_backward_sums_over_many_tiles(programs, monkeypatch):
    """The backward's per-channel sums of du and du·x̂ (du = relu'(z)·dz) against float64,
    with one tile per program or several (the last program's range ending past the rows)."""
    from fastconv.backends.triton import bnstats

    monkeypatch.setattr(bnstats, "PARTIALS", programs)
    y = torch.randn(2, 6, 33, 29) * 3 + 1
    dz = torch.randn_like(y)
    mean, var, invstd, scale, shift = bnstats.forward_stats(y, None, None, 1e-5,
                                                            None, None, 0.1)
    z = bnstats.apply(y, None, scale, shift, "relu", 0.01)
    sums = bnstats.backward_sums(dz, z, y, None, (mean, invstd, scale, shift), "relu", 0.01)
    yd = y.double()
    xhat = (yd - yd.mean((0, 2, 3), keepdim=True)) \
        / (yd.var((0, 2, 3), unbiased=False, keepdim=True) + 1e-5).sqrt()
    du = torch.where(xhat > 0, dz.double(), 0.0)
    assert relative_error(sums[0], du.sum((0, 2, 3))) < 1e-5
    assert relative_error(sums[1], (du * xhat).sum((0, 2, 3))) < 1e-5


@pytest.mark.parametrize("activation", ["none", "silu", "relu"])
def test_output_changed_in_place_after_the_layer(activation, bn_path):
    """Models change a norm's output in place (timm: ``x = bn(conv(x)); x += shortcut``):
    torch's BatchNorm saves no output, and the fused layer saves it only where the
    activation's derivative reads it (relu: then torch's own relu has the same rule)."""
    torch.manual_seed(0)
    seq = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1, bias=False),
                              torch.nn.BatchNorm2d(4),
                              fastconv.nn.fused._torch_activation(activation, 0.01)).train()
    fused = ConvBNAct2d.from_torch(seq)
    x = torch.randn(2, 3, 5, 6)
    shortcut = torch.randn(2, 4, 5, 6)
    results = []
    for net in (seq, fused):
        y = net(x)
        if activation == "relu":
            y = y + shortcut  # torch's relu saves its output too: no in-place change there
        else:
            y += shortcut
        y.square().sum().backward()
        results.append([y.detach()] + [p.grad for p in net.parameters()])
    for got, want in zip(results[1], results[0]):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)


def test_eager_training_takes_torchs_batch_norm_and_fused_passes_where_asked(monkeypatch):
    """Eager training normalises with torch's batch_norm; ``fused_passes()`` (a training
    graph's warm-up and capture) and FUSED_IN_EAGER take the fused autograd Function; the
    outputs agree."""
    x = torch.randn(2, 3, 6, 5, requires_grad=True)
    w = torch.randn(4, 3, 3, 3)
    gamma, beta = torch.rand(4) + 0.5, torch.randn(4)

    def run():
        return fastconv.conv_bn_act2d(x, w, None, None, None, gamma, beta, 1, 1,
                                      training=True, activation="relu")

    native = run()
    assert "BNAct" not in type(native.grad_fn).__name__
    with batchnorm.fused_passes():
        fused = run()
    assert type(fused.grad_fn).__name__ == "BNActFunctionBackward"
    assert "BNAct" not in type(run().grad_fn).__name__  # the context ended
    monkeypatch.setattr(batchnorm, "FUSED_IN_EAGER", True)
    assert type(run().grad_fn).__name__ == "BNActFunctionBackward"
    assert torch.allclose(native, fused, rtol=1e-5, atol=1e-5)


def check_bn_plans_follow_the_call(device: str, dtype: torch.dtype) -> None:
    """A batch norm's plan (bnstats.Passes, launches prepared at their first call) is made
    once per operands and never reused where something it fixed changed: eps, momentum, the
    activation and its slope, γ's dtype, a residual, the layout. Each call is compared with
    torch's batch norm in float64, running statistics included; the second of two equal
    calls finds the first one's plan. (On the GPU this runs the prepared launches.)"""
    from fastconv import bn_ops
    from fastconv.backends.triton import bnstats
    from fastconv.spec import Norm

    bnstats.clear()
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # (bfloat16's rounding: 2⁻⁹)
    c = 5
    ref_mean, ref_var = torch.randn(c, dtype=torch.float64), torch.rand(c, dtype=torch.float64)
    rm, rv = ref_mean.to(device, torch.float32), ref_var.to(device, torch.float32)
    calls = [dict(), dict(), dict(eps=0.3), dict(momentum=0.5), dict(activation="leaky_relu"),
             dict(activation="leaky_relu", slope=0.3), dict(gamma_dtype=torch.float64),
             dict(residual=True), dict(channels_last=True), dict()]
    for i, call in enumerate(calls):
        eps, momentum = call.get("eps", 1e-5), call.get("momentum", 0.1)
        activation, slope = call.get("activation", "relu"), call.get("slope", 0.01)
        y = torch.randn(3, c, 6, 7, device=device, dtype=dtype) * 2 + 1
        if call.get("channels_last"):
            y = y.contiguous(memory_format=torch.channels_last)
        res = torch.randn_like(y) if call.get("residual") else None
        gamma = (torch.rand(c, dtype=torch.float64) + 0.5).to(
            device, call.get("gamma_dtype", torch.float32))
        beta = torch.randn(c, device=device, dtype=gamma.dtype)
        norm = Norm(gamma, beta, rm, rv, momentum, eps)
        y.requires_grad_(True)
        z = batchnorm.BNActFunction.apply(y, gamma, beta, res, rm, rv,
                                          (momentum, eps, activation, slope, None))
        yd, gd, bd = (t.detach().double().cpu() for t in (y, gamma, beta))
        want = torch.nn.functional.batch_norm(yd, ref_mean, ref_var, gd, bd, True, momentum,
                                              eps)  # (on the CPU: ref_mean, ref_var)
        if res is not None:
            want = want + res.double().cpu()
        want = torch.nn.functional.leaky_relu(want, slope) if activation == "leaky_relu" \
            else torch.relu(want)
        assert relative_error(z, want) < tol, (i, call)
        assert relative_error(rm, ref_mean) < 1e-5 and relative_error(rv, ref_var) < 1e-5
        dz = torch.randn_like(z)
        (dy,) = torch.autograd.grad(z, y, dz)
        yr = yd.clone().requires_grad_(True)
        wr = torch.nn.functional.batch_norm(yr, None, None, gd, bd, True, 0.0, eps)
        if res is not None:
            wr = wr + res.double().cpu()
        wr = torch.nn.functional.leaky_relu(wr, slope) if activation == "leaky_relu" \
            else torch.relu(wr)
        (dyr,) = torch.autograd.grad(wr, yr, dz.double().cpu())
        assert relative_error(dy, dyr) < 10 * tol, (i, call)
        made = len(bnstats._PASSES)
        assert made == (1, 1, 2, 3, 4, 5, 6, 7, 8, 8)[i]  # the 2nd and last repeat the 1st
        bn_ops.plan(y, res, norm, activation, slope, False)
        assert len(bnstats._PASSES) == made  # the call's own plan, found


def test_bn_plans_follow_the_call(monkeypatch):
    monkeypatch.setattr(batchnorm, "FUSED_IN_EAGER", True)
    check_bn_plans_follow_the_call("cpu", torch.float32)


def test_a_batch_norm_of_other_channels_is_refused_on_the_fused_route(monkeypatch):
    """A ConvBNAct2d whose BatchNorm was replaced by one of another size: the fused passes
    (as under a CUDA-graph capture) raise a ConvError naming the tensor, before any kernel
    reads it past its end; torch's own route raises torch's error."""
    m = ConvBNAct2d(3, 5, 3, padding=1)
    m.bn = torch.nn.BatchNorm2d(4)
    x = torch.randn(2, 3, 6, 6)
    monkeypatch.setattr(batchnorm, "FUSED_IN_EAGER", True)
    with pytest.raises(ConvError, match=r"batch norm weight: expected shape \(5,\).*got \(4,\)"):
        m(x)
    monkeypatch.setattr(batchnorm, "FUSED_IN_EAGER", False)
    with pytest.raises(RuntimeError):
        m(x)
