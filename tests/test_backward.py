"""Gradients, transposed convolution, torch integration and the nn modules.

On the CPU the Triton dgrad, wgrad and forward kernels run in the interpreter; gradcheck
uses float64, which the Triton backend accepts only there.
"""

import dataclasses
import random

import pytest
import torch
import torch.nn.functional as F

import fastconv
from fastconv import plans
from fastconv.precision import relative_error
from fastconv.problem import ConvProblem

TRITON = dict(backend="triton", precision="ieee")


def _f64(*shape, requires_grad=True):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=requires_grad)


# (rank, n, c, k, spatial, kernel, stride, padding, dilation, groups)
GEOMETRIES = {
    "plain": (2, 2, 3, 4, (5, 6), (3, 3), (1, 1), (1, 1), (1, 1), 1),
    "stride2": (2, 1, 4, 3, (7, 6), (3, 2), (2, 2), (1, 0), (1, 1), 1),
    "stride_gt_kernel": (2, 1, 2, 3, (8, 7), (2, 1), (3, 2), (0, 0), (1, 1), 1),
    "dilation": (2, 1, 2, 2, (7, 7), (2, 3), (1, 2), (1, 2), (2, 2), 1),
    "groups": (2, 2, 4, 6, (5, 5), (3, 3), (1, 1), (1, 1), (1, 1), 2),
    "depthwise": (2, 1, 3, 6, (6, 5), (3, 3), (2, 1), (1, 1), (1, 1), 3),
    "asymmetric_padding": (2, 1, 2, 3, (5, 6), (2, 3), (1, 1), ((0, 1), (2, 0)), (1, 1), 1),
    "conv1d": (1, 2, 3, 4, (9,), (3,), (2,), (1,), (2,), 1),
    "conv1d_causal_depthwise": (1, 1, 4, 4, (8,), (4,), (1,), ((3, 0),), (1,), 4),
}


def _conv_fn(rank):
    return fastconv.conv1d if rank == 1 else fastconv.conv2d


@pytest.mark.parametrize("name", GEOMETRIES)
@pytest.mark.slow_after(3)
def test_gradcheck_conv(name):
    rank, n, c, k, sp, ks, st, pad, dil, g = GEOMETRIES[name]
    x, w, b = _f64(n, c, *sp), _f64(k, c // g, *ks), _f64(k)

    def f(x, w, b):
        return _conv_fn(rank)(x, w, b, st, pad, dil, g, **TRITON)
    assert torch.autograd.gradcheck(f, (x, w, b), fast_mode=True)


@pytest.mark.parametrize("activation", fastconv.ACTIVATIONS)
@pytest.mark.slow_after(3)
def test_gradcheck_every_epilogue_operand(activation):
    """Gradients flow through the activation, scale, shift, residual and bias."""
    x, w, b = _f64(2, 3, 6, 5), _f64(4, 3, 3, 3), _f64(4)
    scale, shift, res = _f64(4), _f64(4), _f64(2, 4, 3, 3)

    def f(x, w, b, scale, shift, res):
        return fastconv.conv2d(x, w, b, 2, 1, activation=activation, negative_slope=0.2,
                               scale=scale, shift=shift, residual=res, **TRITON)
    assert torch.autograd.gradcheck(f, (x, w, b, scale, shift, res), fast_mode=True)


def test_gradcheck_leaky_relu_negative_slope_recomputes_pre_activation():
    x, w = _f64(1, 2, 5, 5), _f64(3, 2, 3, 3)

    def f(x, w):
        return fastconv.conv2d(x, w, activation="leaky_relu", negative_slope=-0.5, **TRITON)
    assert torch.autograd.gradcheck(f, (x, w), fast_mode=True)


# (rank, n, c_in, c_out, spatial, kernel, stride, padding, output_padding, dilation, groups)
TRANSPOSED = {
    "k4s2p1": (2, 1, 4, 3, (4, 5), (4, 4), (2, 2), (1, 1), (0, 0), (1, 1), 1),
    "k2s2": (2, 2, 3, 2, (3, 4), (2, 2), (2, 2), (0, 0), (0, 0), (1, 1), 1),
    "output_padding": (2, 1, 2, 3, (4, 3), (3, 3), (2, 3), (1, 0), (1, 2), (1, 1), 1),
    "groups_dilation": (2, 1, 4, 6, (4, 4), (3, 2), (1, 2), (1, 1), (0, 1), (2, 1), 2),
    "output_padding_ge_stride": (2, 1, 2, 2, (4, 4), (3, 3), (1, 1), (1, 1), (1, 2), (2, 3), 1),
    "conv_transpose1d": (1, 2, 3, 4, (6,), (3,), (3,), (1,), (2,), (1,), 1),
}


def _transposed_fn(rank):
    return fastconv.conv_transpose1d if rank == 1 else fastconv.conv_transpose2d


@pytest.mark.parametrize("name", TRANSPOSED)
@pytest.mark.slow_after(2)
def test_gradcheck_transposed(name):
    rank, n, ci, co, sp, ks, st, pad, opad, dil, g = TRANSPOSED[name]
    x, w, b = _f64(n, ci, *sp), _f64(ci, co // g, *ks), _f64(co)

    def f(x, w, b):
        return _transposed_fn(rank)(x, w, b, st, pad, opad, g, dil, activation="tanh",
                                    **TRITON)
    assert torch.autograd.gradcheck(f, (x, w, b), fast_mode=True)
    ref = (F.conv_transpose1d if rank == 1 else F.conv_transpose2d)(x, w, b, st, pad, opad, g,
                                                                    dil).tanh()
    assert relative_error(f(x, w, b), ref) < 1e-12


@pytest.mark.parametrize("rank", [1, 2])
def test_transposed_out_buffer_fully_written(rank):
    x = torch.randn(2, 5, *(7,) * rank)
    w = torch.randn(5, 3, *(4,) * rank)
    ref = _transposed_fn(rank)(x.double(), w.double(), None, 2, 1, 1, 1, 1, backend="aten")
    out = torch.full(ref.shape, float("nan"))
    res = _transposed_fn(rank)(x, w, None, 2, 1, 1, out=out, **TRITON)
    assert res is out and torch.isfinite(out).all()
    assert relative_error(out, ref) < 1e-5


def test_transposed_channel_rule():
    x, w = torch.randn(1, 6, 5, 5), torch.randn(4, 3, 3, 3)
    with pytest.raises(fastconv.ConvError, match=r"input channels \(6\).*weight.shape\[0\] \(4\)"):
        fastconv.conv_transpose2d(x, w)
    y = fastconv.conv_transpose2d(torch.randn(1, 4, 5, 5), w, groups=2, **TRITON)
    assert y.shape[1] == 3 * 2  # weight.shape[1] * groups


def test_out_with_grad_is_an_error():
    x = torch.randn(1, 2, 5, 5, requires_grad=True)
    with pytest.raises(fastconv.ConvError, match="out"):
        fastconv.conv2d(x, torch.randn(3, 2, 3, 3), out=torch.empty(1, 3, 3, 3))


@pytest.mark.parametrize("c,k", [(6, 4), (32, 64)])  # tiles over / dividing the channels
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.slow_after(1)
def test_wgrad_split_k_is_deterministic_and_matches(c, k, channels_last):
    """The split-K partial buffers and their fixed-order reduce give the exact same bits
    on every run, and the right values."""
    from fastconv.backends.triton.configs import TileConfig
    from fastconv.backends.triton.launchargs import Geometry
    from fastconv.backends.triton.wgrad import launch_wgrad

    x, dy = torch.randn(3, c, 9, 8), torch.randn(3, k, 5, 8)
    if channels_last:
        x, dy = x.to(memory_format=torch.channels_last), dy.to(memory_format=torch.channels_last)
    runs = []
    for _ in range(2):
        out = torch.full((k, c // 2, 3, 3), float("nan"))
        launch_wgrad(dy, x, out, Geometry((2, 1), (1, 1), (1, 1), 2), precision="ieee",
                     config=TileConfig(16, 16, 16, 4, 1, False, 3), int64=False)
        runs.append(out)
    assert torch.equal(runs[0], runs[1])
    ref = torch.nn.grad.conv2d_weight(x.double(), (k, c // 2, 3, 3), dy.double(), (2, 1),
                                      (1, 1), groups=2)
    assert relative_error(runs[0], ref) < 1e-5


@pytest.mark.parametrize("backend", ["aten", "triton"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_grad_ops_return_the_promised_strides(backend, channels_last):
    """The gradient ops return their operand's strides (what their fakes promise to a
    compiled graph), without a copy of the plan's result where only a size-1 dimension's
    stride differs (a depthwise weight (K, 1, R, S))."""
    from fastconv import ops

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(2, 6, 7, 5, dtype=torch.float64).to(memory_format=fmt)
    w = torch.randn(6, 1, 3, 3, dtype=torch.float64).to(memory_format=fmt)
    dy = torch.randn(2, 6, 7, 5, dtype=torch.float64).to(memory_format=fmt)
    geo = ([1, 1], [1, 1], [1, 1], [1, 1], 6, backend, "ieee")
    dx = ops.input_grad_impl(dy, x, w, *geo)
    dw = ops.weight_grad_impl(dy, x, w, *geo)
    assert dx.stride() == x.stride() and dw.stride() == w.stride()
    ref_dx = torch.nn.grad.conv2d_input(x.shape, w, dy, 1, 1, groups=6)
    ref_dw = torch.nn.grad.conv2d_weight(x, w.shape, dy, 1, 1, groups=6)
    assert relative_error(dx, ref_dx) < 1e-12 and relative_error(dw, ref_dw) < 1e-12


def test_aten_gradients_of_operands_strided_apart_only_in_size_one_dimensions():
    """A squeeze-excite layer's gradients: a pooled input strided channels-last beside a
    row-major output gradient (as mobilenet_v3's training step passes them), each a view at
    an offset into a larger buffer. aten's binds give both cuDNN the problem's own strides
    (a view of the same elements); the gradients stay torch's."""
    from fastconv.backends import aten
    from fastconv.problem import layout_strides

    n, c, k = 3, 5, 4
    buf = torch.randn(n * c + 7, dtype=torch.float64)
    x = buf.as_strided((n, c, 1, 1), (c, 1, c, c), 7)  # channels-last strides
    dy = torch.randn(n * k + 3, dtype=torch.float64).as_strided((n, k, 1, 1), (k, 1, 1, 1), 3)
    w = torch.randn(k, c, 1, 1, dtype=torch.float64)
    view = aten.restrided(x, layout_strides(x.shape, "nchw"))
    assert view.stride() == (c, 1, 1, 1) and view.data_ptr() == x.data_ptr()
    assert torch.equal(view, x)
    wide = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    assert aten.restrided(wide, layout_strides(wide.shape, "nchw")) is wide  # not a view

    problem = ConvProblem.from_tensors(x, w, None, (1, 1), ((0, 0), (0, 0)), (1, 1), 1,
                                       rank=2, precision=fastconv.Precision.IEEE)
    ref_dx = torch.nn.grad.conv2d_input(x.shape, w, dy)
    ref_dw = torch.nn.grad.conv2d_weight(x.contiguous(), w.shape, dy.contiguous())
    dw = aten.AtenBackend.bind(problem, None, "wgrad")(dy, x, None)
    dx = aten.AtenBackend.bind(problem, None, "dgrad")(dy, w, None)
    both = aten.conv_backward_both(problem, dy, x, w)
    for got, ref in ((dw, ref_dw), (dx, ref_dx), (both[0], ref_dx), (both[1], ref_dw)):
        assert relative_error(got, ref) < 1e-12


def test_backends_agree_on_gradients():
    x = torch.randn(2, 4, 7, 6, requires_grad=True)
    w = torch.randn(6, 2, 3, 3, requires_grad=True)
    grads = []
    for backend in ("aten", "triton"):
        y = fastconv.conv2d(x, w, None, (2, 1), 1, 1, 2, activation="relu", backend=backend,
                            precision="ieee")
        grads.append(torch.autograd.grad((y * y).sum(), (x, w)))
    for a, b in zip(*grads):
        assert relative_error(a, b) < 1e-5


@pytest.mark.parametrize("allow_tf32", [True, False])
def test_strict_fp32_gradients_never_left_to_a_tf32_backward(allow_tf32, monkeypatch):
    """On the GPU torch's own backward follows cuDNN's TF32 switch when it runs: an ieee
    forward may hand its gradients to torch's autograd only while that switch is off, a tf32
    one only while it is on."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", allow_tf32)
    x, w = torch.randn(1, 3, 6, 5), torch.randn(4, 3, 3, 3)
    for precision, native in (("ieee", not allow_tf32), ("tf32", allow_tf32)):
        problem = ConvProblem.from_tensors(x, w, padding=1, rank=2, precision=precision)
        assert plans._flags_match(dataclasses.replace(problem, device="cuda")) == native


@pytest.mark.parametrize("allow_tf32", [True, False])
def test_cpu_fp32_gradients_are_torchs_whatever_cudnns_switch(allow_tf32, monkeypatch):
    """cuDNN's TF32 switch does not apply to CPU convolutions, so an ieee forward on the CPU
    keeps torch's autograd (fastconv's general path, a Python backward running the same
    torch convolutions, cost a tiny mobilenet training step 35.6 against 27.9 ms)."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", allow_tf32)
    x = torch.randn(1, 3, 6, 5, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    y = fastconv.conv2d(x, w, padding=1, backend="aten", precision="ieee")
    assert "Convolution" in type(y.grad_fn).__name__, type(y.grad_fn).__name__
    dx, dw = torch.autograd.grad(y.square().sum(), (x, w))
    ref = F.conv2d(x.double(), w.double(), padding=1)
    rx, rw = torch.autograd.grad(ref.square().sum(), (x, w))
    assert relative_error(dx, rx) < 1e-5 and relative_error(dw, rw) < 1e-5


def test_autocast_runs_in_autocast_dtype():
    x, w = torch.randn(2, 4, 6, 6), torch.randn(5, 4, 3, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = fastconv.conv2d(x, w, padding=1)
        ref = F.conv2d(x, w, padding=1)
    assert ours.dtype == ref.dtype == torch.bfloat16
    assert relative_error(ours, ref) < 2e-2


@pytest.mark.slow
def test_compile_fullgraph_traces_forward_and_backward():
    """torch.compile(fullgraph=True) traces the custom ops (aot_eager: no C++ compiler
    needed on the CPU; the GPU test compiles with inductor)."""
    torch._dynamo.reset()
    model = torch.nn.Sequential(fastconv.nn.Conv2d(3, 4, 3, padding=1, **TRITON),
                                torch.nn.ReLU(),
                                fastconv.nn.ConvTranspose2d(4, 2, 2, stride=2, **TRITON))
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x = torch.randn(2, 3, 5, 5, requires_grad=True)
    y = compiled(x)
    y.square().sum().backward()
    gx = x.grad.clone()
    x.grad = None
    model(x).square().sum().backward()
    assert relative_error(y, model(x)) < 1e-6
    assert relative_error(gx, x.grad) < 1e-5


# ------------------------------------------------------------------------- modules
MODULES = {
    "Conv1d": (fastconv.nn.Conv1d, torch.nn.Conv1d, 1),
    "Conv2d": (fastconv.nn.Conv2d, torch.nn.Conv2d, 2),
    "ConvTranspose1d": (fastconv.nn.ConvTranspose1d, torch.nn.ConvTranspose1d, 1),
    "ConvTranspose2d": (fastconv.nn.ConvTranspose2d, torch.nn.ConvTranspose2d, 2),
}


def _random_module_config(rng):
    name = rng.choice(list(MODULES))
    rank = MODULES[name][2]
    transposed = name.startswith("ConvTranspose")
    groups = rng.choice((1, 1, 2, 3))
    cin, cout = groups * rng.randint(1, 3), groups * rng.randint(1, 3)
    kernel = tuple(rng.randint(1, 3) for _ in range(rank))
    stride = tuple(rng.randint(1, 3) for _ in range(rank))
    dilation = tuple(rng.randint(1, 2) for _ in range(rank))
    kw = dict(in_channels=cin, out_channels=cout, kernel_size=kernel, stride=stride,
              dilation=dilation, groups=groups, bias=rng.random() < 0.7)
    if transposed:
        kw["padding"] = tuple(rng.randint(0, (k - 1) * d // 2) for k, d in zip(kernel, dilation))
        kw["output_padding"] = tuple(rng.randint(0, max(s, d) - 1)
                                     for s, d in zip(stride, dilation))
    else:
        mode = rng.choice(("zeros", "reflect", "replicate", "circular"))
        kw["padding_mode"] = mode
        if mode == "zeros" and rng.random() < 0.2 and all(s == 1 for s in stride):
            kw["padding"] = "same"
        else:
            kw["padding"] = tuple(rng.randint(0, 2) for _ in range(rank))
    spatial = tuple(rng.randint(d * (k - 1) + 3, d * (k - 1) + 8)
                    for k, d in zip(kernel, dilation))
    return name, kw, (rng.randint(1, 3), cin, *spatial)


@pytest.mark.parametrize("chunk", range(5))
@pytest.mark.slow
def test_module_parity_with_torch_nn(chunk):
    """100 random configurations: outputs and the input, weight and bias gradients of each
    fastconv module equal torch.nn's (float64 reference) after loading torch's state_dict."""
    rng = random.Random(chunk)
    for _ in range(20):
        name, kw, shape = _random_module_config(rng)
        ours_cls, torch_cls, _ = MODULES[name]
        ref = torch_cls(**kw).double()
        ours = ours_cls(**kw, **TRITON)
        ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
        x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
        xf = x.detach().float().requires_grad_()
        y_ref, y = ref(x), ours(xf)
        g = torch.randn_like(y_ref)
        y_ref.backward(g)
        y.backward(g.float())
        what = f"{name}({kw}) on {shape}"
        assert relative_error(y, y_ref) < 1e-5, what
        assert relative_error(xf.grad, x.grad) < 1e-5, what
        assert relative_error(ours.weight.grad, ref.weight.grad) < 1e-5, what
        if kw["bias"]:
            assert relative_error(ours.bias.grad, ref.bias.grad) < 1e-5, what


def test_transposed_module_output_size():
    m = fastconv.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, **TRITON)
    ref = torch.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1)
    ref.load_state_dict(m.state_dict())
    x = torch.randn(1, 3, 5, 5)
    for size in ([9, 9], [10, 10], [9, 10]):
        y = m(x, output_size=size)
        assert y.shape[2:] == tuple(size)
        assert relative_error(y, ref(x, output_size=size)) < 1e-5


@pytest.mark.parametrize("name", MODULES)
def test_state_dict_round_trip(name):
    ours_cls, torch_cls, rank = MODULES[name]
    kw = dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, groups=2)
    theirs = torch_cls(**kw)
    ours = ours_cls(**kw)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    ours.load_state_dict(theirs.state_dict())
    back = torch_cls(**kw)
    back.load_state_dict(ours.state_dict())
    for k, v in theirs.state_dict().items():
        assert torch.equal(back.state_dict()[k], v)
    assert repr(ours) == repr(theirs)  # default backend and precision are not shown
    assert isinstance(ours, torch_cls)


def test_module_defaults_and_init_match_torch():
    torch.manual_seed(3)
    theirs = torch.nn.Conv2d(5, 7, 3)
    torch.manual_seed(3)
    ours = fastconv.nn.Conv2d(5, 7, 3)
    assert torch.equal(ours.weight, theirs.weight) and torch.equal(ours.bias, theirs.bias)
    assert "backend='triton'" in repr(fastconv.nn.Conv2d(5, 7, 3, backend="triton"))


def _small_net():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2)),
        torch.nn.ConvTranspose2d(8, 4, 2, stride=2), torch.nn.Flatten(2),
        torch.nn.Conv1d(4, 2, 3, padding=1, padding_mode="circular"))


def test_convert_copies_or_swaps_in_place():
    net = _small_net().eval()
    x = torch.randn(2, 3, 6, 6)
    ref = net(x)
    converted = fastconv.nn.convert(net)
    assert type(net[0]) is torch.nn.Conv2d  # the original is untouched
    kinds = [type(m) for m in converted.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)]
    assert kinds == [fastconv.nn.Conv2d, fastconv.nn.Conv2d, fastconv.nn.ConvTranspose2d,
                     fastconv.nn.Conv1d]
    assert relative_error(converted(x), ref) < 1e-5
    params = list(net.parameters())
    same = fastconv.nn.convert(net, inplace=True)
    assert same is net and type(net[0]) is fastconv.nn.Conv2d
    assert all(a is b for a, b in zip(params, net.parameters()))  # optimizers stay valid
    assert not net.training


def test_convert_resnet18_outputs_and_gradients():
    """Through dispatch's own choice (aten on the CPU: the interpreter would take an hour on
    ResNet-18's wide layers; the Triton kernels' parity is the random-module test above)."""
    torchvision = pytest.importorskip("torchvision")

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).train()
    ours = fastconv.nn.convert(model)
    assert sum(isinstance(m, fastconv.nn.Conv2d) for m in ours.modules()) == 20
    x = torch.randn(2, 3, 32, 32)
    y_ref, y = model(x), ours(x)
    assert relative_error(y, y_ref) < 1e-4
    y_ref.square().sum().backward()
    y.square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), ours.parameters()):
        assert relative_error(q.grad, p.grad) < 1e-4, name


class _EmulatedPrepared:
    """launch.Prepared's contract in the interpreter (where ``launch.prepare`` has none):
    the same kernel, grid and trailing arguments, new leading tensors."""

    def __init__(self, kernel, grid, rest, meta, calls):
        self.kernel, self.grid, self.rest, self.meta, self.calls = kernel, grid, rest, meta, calls

    def __call__(self, *tensors):
        self.calls.append(self.kernel)
        self.kernel[self.grid](*tensors, *self.rest, **self.meta)
        return True


def test_backward_launches_are_prepared_once_per_plan_and_layout(monkeypatch):
    """A plan's data, weight and transposed launches are prepared at its first call and
    reused by the next ones; an operand of other strides (a gradient in the other memory
    layout: the data gradient then follows it) is launched afresh, not through the launch
    prepared for the first layout. Every result against float64, into poisoned outputs."""
    from fastconv.backends.triton import dgrad, wgrad
    from fastconv.backends.triton.backend import TritonBackend
    from fastconv.backends.triton.configs import TileConfig

    reused = []

    def emulated(kernel, grid, ntensors, *args, **meta):
        kernel[grid](*args, **meta)
        return _EmulatedPrepared(kernel, grid, args[ntensors:], meta, reused)
    monkeypatch.setattr(dgrad, "prepare", emulated)
    monkeypatch.setattr(wgrad, "prepare", emulated)
    x, w = _f64(2, 6, 7, 5, requires_grad=False), _f64(4, 3, 3, 2, requires_grad=False)
    args = ((2, 1), (1, 0), (1, 1), 2)
    problem = ConvProblem.from_tensors(x, w, None, *args, rank=2)
    config = TileConfig(16, 16, 16, 4, 1, False, 1)
    run_dgrad = TritonBackend.bind(problem, config, "dgrad")
    run_wgrad = TritonBackend.bind(problem, config, "wgrad")
    for i, channels_last in enumerate((False, False, True, True, False)):
        xi = torch.randn_like(x)
        xi.requires_grad_()
        y = F.conv2d(xi, w.requires_grad_(), None, *args)
        g = torch.randn_like(y)
        if channels_last:
            g, xi_in = g.to(memory_format=torch.channels_last), \
                xi.detach().to(memory_format=torch.channels_last)
        else:
            xi_in = xi.detach()
        want_dx, want_dw = torch.autograd.grad(y, (xi, w), g)
        before = len(reused)
        dx = run_dgrad(g, w.detach(), None)
        dw = run_wgrad(g, xi_in, torch.full_like(w, float("nan")))
        assert relative_error(dx, want_dx) < 1e-12 and relative_error(dw, want_dw) < 1e-12
        # calls 2 and 4 reuse the launches the call before prepared; 1, 3 and 5 (a new
        # layout) prepare them
        assert len(reused) - before == (2 if i in (1, 3) else 0), i
    xt = torch.randn(2, 4, 4, 5, dtype=torch.float64)
    transposed = ConvProblem.from_tensors(xt, w, None, (2, 1), (1, 0), (1, 1), 2, rank=2,
                                          transposed=True)
    run_t = TritonBackend.bind(transposed, config)
    before = len(reused)
    for _ in range(2):
        xt = torch.randn_like(xt)
        out = run_t(xt, w.detach(), None, None, None, None, None)
        want = F.conv_transpose2d(xt, w.detach(), None, (2, 1), (1, 0), 0, 2, (1, 1))
        assert relative_error(out, want) < 1e-12
    assert reused[before:] == [dgrad._conv_dgrad_kernel]


def test_depthwise_gradient_launches_are_prepared_once_per_plan(monkeypatch):
    """The direct (grouped) and rolling depthwise kernels' data and weight gradients: the
    first call of a plan prepares its launches, the second reuses them all (the weight
    gradients' per-call buffers included: ``launch.Fixed``). Results against float64."""
    from fastconv.backends.triton import depthwise, dw_roll, launch
    from fastconv.backends.triton.backend import TritonBackend

    reused = []

    def emulated(kernel, grid, ntensors, *args, **meta):
        kernel[grid](*args, **meta)
        return _EmulatedPrepared(kernel, grid, args[ntensors:], meta, reused)
    for module in (depthwise, dw_roll, launch):
        monkeypatch.setattr(module, "prepare", emulated)
    cl = torch.channels_last
    cases = [  # (x, w, groups, config, layout): grouped direct; depthwise rolling rows
        (torch.randn(2, 8, 9, 7, dtype=torch.float64), torch.randn(6, 4, 3, 3,
         dtype=torch.float64), 2, depthwise.DwConfig(8, 16, 4), None),
        (torch.randn(2, 4, 9, 9, dtype=torch.float64), torch.randn(4, 1, 3, 3,
         dtype=torch.float64), 4, depthwise.DwConfig(4, 8, 4, roll=3), cl)]
    for x, w, groups, config, layout in cases:
        if layout is not None:
            x = x.contiguous(memory_format=layout)
        problem = ConvProblem.from_tensors(x, w, None, 1, 1, 1, groups, rank=2)
        run_dgrad = TritonBackend.bind(problem, config, "dgrad")
        run_wgrad = TritonBackend.bind(problem, config, "wgrad")
        for call in range(2):
            xi = torch.randn_like(x).requires_grad_()
            y = F.conv2d(xi, w.requires_grad_(), None, 1, 1, 1, groups)
            g = torch.randn_like(y)
            want_dx, want_dw = torch.autograd.grad(y, (xi, w), g)
            before = len(reused)
            dx = run_dgrad(g, w.detach(), torch.full_like(xi, float("nan")))
            dw = run_wgrad(g, xi.detach(), torch.full_like(w, float("nan")))
            assert relative_error(dx, want_dx) < 1e-12 and relative_error(dw, want_dw) < 1e-12
            # the first call prepares; the second reuses every launch (dgrad's one; the
            # weight gradient's: one per input channel of a group, or partials and their sum)
            wgrad_launches = w.shape[1] if layout is None else 2
            assert len(reused) - before == (0 if call == 0 else 1 + wgrad_launches), call
