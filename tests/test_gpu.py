"""GPU tests: real sizes, every precision, real compilation and tensor-core numerics."""

import functools
import random

import pytest
import torch
import torch.nn.functional as F

import fastconv
from fastconv import backends
from fastconv.precision import TOLERANCE, Precision, relative_error
from fastconv.tools import testing

pytestmark = pytest.mark.gpu
BACKENDS = list(backends.REGISTRY)


@pytest.mark.parametrize("precision", list(Precision), ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_random_real_size_problems(backend, precision):
    rng = random.Random(hash((backend, precision.value)) % 1000)
    gen = torch.Generator().manual_seed(7)
    ran = 0
    for _ in range(15 if backend != "cudnn" else 80):  # cuDNN refuses many random cases
        if ran == 15:
            break
        case = testing.random_case(rng, small=False)
        if backend == "cudnn":  # cuDNN runs no fused epilogue (backends/cudnn.py)
            case = dict(case, bias=False, scale=False, shift=False, residual=False,
                        activation="none")
        try:
            err = testing.check_case(case, backend=backend, precision=precision,
                                     device="cuda", generator=gen)
        except fastconv.NotSupported:  # e.g. an activation cuDNN has no pointwise mode for
            continue
        ran += 1
        assert err <= TOLERANCE[precision], f"{testing.describe(case)}: {err:.3g}\n{case}"
    assert ran >= 8, f"only {ran} random problems were supported"


@pytest.mark.parametrize("precision", list(Precision), ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_resnet_like_layers(precision, layout):
    for c, k, hw, ks, s in ((64, 64, 56, 3, 1), (256, 128, 56, 1, 1), (128, 128, 56, 3, 2),
                            (3, 64, 112, 7, 2), (512, 512, 7, 3, 1)):
        case = dict(rank=2, n=8, c=c, k=k, spatial=(hw, hw), kernel=(ks, ks), stride=(s, s),
                    padding=((ks // 2,) * 2,) * 2, dilation=(1, 1), groups=1, bias=True,
                    scale=True, shift=False, residual=True, activation="relu",
                    negative_slope=0.01, channels_last=layout == "nhwc")
        err = testing.check_case(case, backend="triton", precision=precision, device="cuda")
        assert err <= TOLERANCE[precision], f"{c}->{k} {hw} k{ks} s{s}: {err:.3g}"


def test_tf32_is_really_tf32_and_ieee_is_not():
    """The same data gives a TF32-sized error in tf32 and an fp32-sized one in ieee."""
    x = torch.randn(8, 256, 28, 28, device="cuda")
    w = torch.randn(256, 256, 3, 3, device="cuda") / 48
    ref = F.conv2d(x.double(), w.double(), padding=1)
    e_tf32 = relative_error(fastconv.conv2d(x, w, padding=1, backend="triton",
                                            precision="tf32"), ref)
    e_ieee = relative_error(fastconv.conv2d(x, w, padding=1, backend="triton",
                                            precision="ieee"), ref)
    assert e_ieee < 1e-6 < e_tf32 < TOLERANCE[Precision.TF32], (e_ieee, e_tf32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_candidate_config_is_correct(backend):
    """Each configuration dispatch may time is itself correct, epilogue included."""
    cls = backends.REGISTRY[backend]
    ran = 0
    for dtype, cl in ((torch.float32, False), (torch.float32, True), (torch.bfloat16, True)):
        for c, k, ks in ((64, 64, 3), (3, 64, 7), (256, 512, 1), (32, 32, 3), (512, 512, 3)):
            x = torch.randn(4, c, 23, 19, device="cuda").to(dtype)
            if cl:
                x = x.contiguous(memory_format=torch.channels_last)
            w = (torch.randn(k, c, ks, ks, device="cuda") / (c * ks * ks) ** 0.5).to(dtype)
            b = torch.randn(k, device="cuda").to(dtype)
            res = torch.randn(4, k, 23, 19, device="cuda").to(dtype)
            ep = fastconv.Epilogue(activation="relu", has_shift=True, has_residual=True)
            prob = fastconv.ConvProblem.from_tensors(x, w, b, padding=ks // 2, rank=2,
                                                     epilogue=ep, residual=res)
            ref = F.relu(F.conv2d(x.double(), w.double(), b.double(), padding=ks // 2)
                         + res.double())
            if cls.not_supported_reasons(prob):  # cuDNN fuses nothing: the bare convolution
                prob = fastconv.ConvProblem.from_tensors(x, w, None, padding=ks // 2, rank=2)
                b = res = None
                ref = F.conv2d(x.double(), w.double(), padding=ks // 2)
                if cls.not_supported_reasons(prob):
                    continue
            ran += 1
            for cfg in cls.candidates(prob):
                out = torch.full(prob.output_shape(), float("nan"), device="cuda", dtype=dtype)
                run = cls.bind(prob, cfg)
                if cls.TAKES_BIAS:
                    run(x, w, b, None, None, res, out)
                else:
                    run(x, w, None, None, b, res, out)
                err = relative_error(out, ref)
                assert err <= TOLERANCE[prob.precision], (cfg, c, k, ks, dtype, err)
    assert ran >= 4, f"{backend} ran only {ran} problems"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_tap_row_weight_gradient_candidate_is_correct(dtype):
    """The weight-gradient tiles over kernel rows (the RGB stem's) against float64 on an odd
    stem-like problem, each candidate dispatch may time, every element written."""
    from fastconv.backends.triton import TritonBackend

    x = torch.randn(4, 3, 45, 37, device="cuda").to(dtype).contiguous(
        memory_format=torch.channels_last)
    w = torch.randn(64, 3, 7, 7, device="cuda").to(dtype)
    prob = fastconv.ConvProblem.from_tensors(x, w, None, 2, 3, rank=2)
    g = torch.randn(prob.output_shape(), device="cuda").to(dtype).contiguous(
        memory_format=torch.channels_last)
    ref = torch.nn.grad.conv2d_weight(x.double(), w.shape, g.double(), 2, 3)
    cands = [c for c in TritonBackend.candidates(prob, "wgrad") if c.tap_rows]
    assert cands
    for cfg in cands:
        dw = torch.full(w.shape, float("nan"), device="cuda", dtype=dtype)
        TritonBackend.bind(prob, cfg, "wgrad")(g, x, dw)
        assert relative_error(dw, ref) <= TOLERANCE[prob.precision], (cfg, dtype)


@pytest.mark.parametrize("dtype,precision,names", [
    (torch.float32, "tf32", None), (torch.bfloat16, "bf16", None),
    (torch.float32, "ieee", ("seed002_g4", "seed002_g16", "seed002_c32_64")),
    (torch.float16, "fp16", ("seed002_g4", "seed002_g16", "seed002_c32_64"))],
    ids=["tf32", "bf16", "ieee-3cases", "fp16-3cases"])
def test_conv1d_row_tiles_are_correct(dtype, precision, names):
    """Every Triton candidate (row tiles included) of the seed002_conv1d cases (or those
    named) at batch 3, on NCL inputs as conv1d users pass them, with a shift + residual +
    relu epilogue, into poisoned outputs, against float64."""
    from fastconv.backends.triton.backend import TritonBackend
    from fastconv.tools.bench import suites

    for case in suites.get("seed002_conv1d"):
        if names is not None and case.name not in names:
            continue
        x = torch.randn(3, case.c, *case.spatial, device="cuda").to(dtype)
        w = (torch.randn(case.k, case.c // case.groups, *case.kernel, device="cuda")
             / (case.c // case.groups * case.kernel[0]) ** 0.5).to(dtype)
        shift = torch.randn(case.k, device="cuda").to(dtype)
        args = (case.stride, case.padding, case.dilation, case.groups)
        ref = F.conv1d(x.double(), w.double(), shift.double(), *args)
        res = torch.randn(ref.shape, device="cuda").to(dtype)
        ref = F.relu(ref + res.double())
        ep = fastconv.Epilogue(activation="relu", has_shift=True, has_residual=True)
        prob = fastconv.ConvProblem.from_tensors(x, w, shift, *args, rank=1, epilogue=ep,
                                                 residual=res, precision=precision)
        configs = TritonBackend.candidates(prob)
        assert sum(getattr(c, "rows", False) for c in configs) >= 2, case.name
        for cfg in configs:
            out = torch.full(prob.output_shape(), float("nan"), device="cuda", dtype=dtype)
            TritonBackend.bind(prob, cfg)(x, w, None, None, shift, res, out)
            assert not out.isnan().any(), (case.name, cfg.name())
            err = relative_error(out, ref)
            assert err <= TOLERANCE[prob.precision], (case.name, cfg.name(), err)


def test_int64_indexing_beyond_2_31_elements():
    """An input of more than 2**31 elements: the last rows must be right (int32 offsets
    would wrap and read or write the wrong place)."""
    x = torch.randn(2, 16, 8200, 8200, device="cuda", dtype=torch.bfloat16)
    assert x.numel() > 2**31
    w = torch.randn(8, 16, 1, 1, device="cuda", dtype=torch.bfloat16) / 4
    out = fastconv.conv2d(x, w, backend="triton")
    tail = out[1, :, -16:, :]
    ref = F.conv2d(x[1:, :, -16:, :].double(), w.double())[0]
    assert relative_error(tail, ref) < TOLERANCE[Precision.BF16]
    head = out[0, :, :16, :]
    ref0 = F.conv2d(x[:1, :, :16, :].double(), w.double())[0]
    assert relative_error(head, ref0) < TOLERANCE[Precision.BF16]


def test_auto_dispatch_runs_and_is_correct():
    x = torch.randn(16, 128, 28, 28, device="cuda", dtype=torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(128, 128, 3, 3, device="cuda", dtype=torch.bfloat16) / 34
    b = torch.randn(128, device="cuda", dtype=torch.bfloat16)
    y = fastconv.conv2d(x, w, b, padding=1, activation="relu")
    ref = F.relu(F.conv2d(x.double(), w.double(), b.double(), padding=1))
    assert relative_error(y, ref) < TOLERANCE[Precision.BF16]


# ------------------------------------------------------------------ backward, transposed
# (c, k, hw, kernel, stride, dilation, groups): ResNet-like layers plus the awkward ones.
BACKWARD_LAYERS = [(64, 64, 56, 3, 1, 1, 1), (256, 128, 28, 1, 1, 1, 1),
                   (128, 128, 28, 3, 2, 1, 1), (3, 64, 112, 7, 2, 1, 1),
                   (512, 512, 7, 3, 1, 1, 1), (64, 96, 30, 3, 1, 2, 2), (96, 96, 33, 3, 2, 1, 96)]


def _fastconv_silu(x, w, b, *, geo, backend, precision, act="silu"):
    return fastconv.conv2d(x, w, b, *geo, activation=act, backend=backend,
                           precision=precision.value)


def _torch_silu(x, w, b, *, geo, act="silu"):
    y = F.conv2d(x, w, b, *geo)
    return F.silu(y) if act == "silu" else y


def _grads(fn, x, w, b, g):
    xs = [t.detach().requires_grad_() for t in (x, w, b) if t is not None]
    if b is None:
        y = fn(*xs, None)
        return (y, *torch.autograd.grad(y, xs, g))
    y = fn(*xs)
    return (y, *torch.autograd.grad(y, xs, g))


@pytest.mark.parametrize("precision", list(Precision), ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_real_sizes(backend, layout, precision):
    """Output, dx, dw and db of conv + bias + silu against float64, each within the contract
    (cuDNN fuses no epilogue on NCHW tensors: there the bare convolution)."""
    dtype = {Precision.IEEE: torch.float32, Precision.TF32: torch.float32,
             Precision.FP16: torch.float16, Precision.BF16: torch.bfloat16}[precision]
    fused = backend != "cudnn"  # cuDNN runs no fused epilogue: the bare convolution
    ran = 0
    for c, k, hw, ks, s, d, g in BACKWARD_LAYERS:
        x = torch.randn(8, c, hw, hw, device="cuda").to(dtype)
        if layout == "nhwc":
            x = x.contiguous(memory_format=torch.channels_last)
        w = (torch.randn(k, c // g, ks, ks, device="cuda") / (c // g * ks * ks) ** 0.5).to(dtype)
        b = torch.randn(k, device="cuda").to(dtype) if fused else None
        act = "silu" if fused else "none"
        geo = (s, d * (ks // 2), d, g)
        fn = functools.partial(_fastconv_silu, geo=geo, backend=backend, precision=precision,
                               act=act)
        try:
            gy = torch.randn_like(fn(x, w, b))
        except fastconv.NotSupported:  # cuDNN: e.g. 3 channels in half precision
            continue
        ours = _grads(fn, x, w, b, gy)
        ref = _grads(functools.partial(_torch_silu, geo=geo, act=act), x.double(), w.double(),
                     b.double() if fused else None, gy.double())
        for name, a, r in zip(("y", "dx", "dw", "db"), ours, ref):
            err = relative_error(a, r)
            assert err <= TOLERANCE[precision], (name, c, k, hw, ks, s, d, g, err)
        ran += 1
    assert ran >= 4, f"only {ran} layers supported"


@pytest.mark.parametrize("backend", ["aten", "auto"])
def test_squeeze_excite_gradients_on_the_strides_a_model_passes(backend):
    """mobilenet_v3's squeeze-excite 1x1 convolution at 1x1 pixels: a pooled input strided
    channels-last, (C, 1, C, C), and a row-major output gradient, as its training step passes
    them (aten's binds restride such operands: a view of the same elements). dx, dw and db
    against float64, bf16 contract."""
    n, c, k = 32, 72, 24
    x = torch.randn(n * c, device="cuda", dtype=torch.bfloat16)
    x = x.as_strided((n, c, 1, 1), (c, 1, c, c)).requires_grad_()
    w = (torch.randn(k, c, 1, 1, device="cuda") / c ** 0.5).to(torch.bfloat16).requires_grad_()
    b = torch.randn(k, device="cuda", dtype=torch.bfloat16).requires_grad_()
    y = fastconv.conv2d(x, w, b, backend=backend)
    gy = torch.randn(n, k, 1, 1, device="cuda", dtype=torch.bfloat16)  # row-major
    ours = (y, *torch.autograd.grad(y, (x, w, b), gy))
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    yd = F.conv2d(xd, wd, bd)
    ref = (yd, *torch.autograd.grad(yd, (xd, wd, bd), gy.double()))
    for name, a, r in zip(("y", "dx", "dw", "db"), ours, ref):
        assert relative_error(a, r) <= TOLERANCE[Precision.BF16], (name, backend)


@pytest.mark.parametrize("precision", [Precision.TF32, Precision.BF16], ids=str)
def test_transposed_real_sizes(precision):
    dtype = torch.float32 if precision == Precision.TF32 else torch.bfloat16
    for c, k, hw, ks, s, p, op in ((512, 256, 16, 4, 2, 1, 0), (128, 64, 64, 4, 2, 1, 0),
                                   (256, 128, 32, 2, 2, 0, 0), (64, 32, 15, 3, 2, 1, 1)):
        x = torch.randn(8, c, hw, hw, device="cuda").to(dtype)
        x = x.contiguous(memory_format=torch.channels_last)
        w = (torch.randn(c, k, ks, ks, device="cuda") / (c * ks * ks / s / s) ** 0.5).to(dtype)
        b = torch.randn(k, device="cuda").to(dtype)

        ours = functools.partial(fastconv.conv_transpose2d, stride=s, padding=p,
                                 output_padding=op, backend="triton", precision=precision.value)
        gy = torch.randn_like(ours(x, w, b))
        got = _grads(ours, x, w, b, gy)
        ref = _grads(functools.partial(F.conv_transpose2d, stride=s, padding=p,
                                       output_padding=op), x.double(), w.double(), b.double(),
                     gy.double())
        for name, a, r in zip(("y", "dx", "dw", "db"), got, ref):
            err = relative_error(a, r)
            assert err <= TOLERANCE[precision], (name, c, k, hw, ks, s, err)


def test_wgrad_is_deterministic():
    x = torch.randn(32, 256, 28, 28, device="cuda")
    g = torch.randn(32, 256, 28, 28, device="cuda")
    w = torch.randn(256, 256, 3, 3, device="cuda")
    from fastconv import ops

    runs = [ops.conv_weight_grad(g, x, w, [1, 1], [1, 1], [1, 1], [1, 1], 1, "triton", "tf32")
            for _ in range(3)]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


def _small_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        fastconv.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
        fastconv.nn.Conv2d(32, 32, 3, stride=2, padding=1, groups=2), torch.nn.ReLU(),
        fastconv.nn.ConvTranspose2d(32, 8, 2, stride=2)).cuda()


def test_torch_compile_fullgraph_matches_eager():
    torch._dynamo.reset()
    net = _small_net()
    x = torch.randn(4, 16, 20, 20, device="cuda", requires_grad=True)
    compiled = torch.compile(net, fullgraph=True)
    y = compiled(x)
    y.square().sum().backward()
    gx = x.grad.clone()
    x.grad = None
    y_ref = net(x)
    y_ref.square().sum().backward()
    assert relative_error(y, y_ref) < TOLERANCE[Precision.TF32]
    assert relative_error(gx, x.grad) < TOLERANCE[Precision.TF32]


def test_cuda_graph_training_step_matches_eager():
    net = _small_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(4, 16, 20, 20, device="cuda")

    def step():
        opt.zero_grad(set_to_none=False)
        loss = net(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: dispatch decisions and compilation
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    eager_losses = [step().item() for _ in range(3)]
    eager_state = {k: v.clone() for k, v in net.state_dict().items()}
    net.load_state_dict(state)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step()
    net.load_state_dict(state)  # capture does not run the step
    graph_losses = []
    for _ in range(3):
        graph.replay()
        graph_losses.append(static_loss.item())
    assert graph_losses == pytest.approx(eager_losses, rel=1e-3)
    for k, v in net.state_dict().items():
        assert relative_error(v, eager_state[k]) < 1e-3, k


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_plans_reused_launch_takes_each_calls_tensors(dtype, layout):
    """A Triton forward plan launches through its prepared launch after the first call:
    every later call (new input, weight, bias, residual and output buffers; one input at
    another address alignment, which takes the full launch path again) writes every element
    of its own output, correctly."""
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    prec = Precision.BF16 if dtype == torch.bfloat16 else Precision.TF32
    for call in range(4):
        x = torch.randn(3, 40, 13, 11, device="cuda", dtype=dtype).to(memory_format=fmt)
        if call == 2:  # an input 2 elements past a 16-byte boundary, same strides
            big = torch.randn(3 * 40 * 13 * 11 + 2, device="cuda", dtype=dtype)
            x = big[2:].view(3, 13, 11, 40).permute(0, 3, 1, 2) if layout == "nhwc" \
                else big[2:].view(3, 40, 13, 11)
        w = torch.randn(24, 40, 3, 3, device="cuda", dtype=dtype) / 20
        b = torch.randn(24, device="cuda", dtype=dtype)
        res = torch.randn(3, 24, 13, 11, device="cuda", dtype=dtype).to(memory_format=fmt)
        out = torch.full_like(res, float("nan"))
        fastconv.conv2d(x, w, b, padding=1, activation="relu", residual=res, out=out,
                        backend="triton", precision=prec.value)
        ref = F.relu(F.conv2d(x.double(), w.double(), b.double(), padding=1) + res.double())
        assert not out.isnan().any(), f"call {call}: elements left unwritten"
        assert relative_error(out, ref) <= TOLERANCE[prec], f"call {call}"
