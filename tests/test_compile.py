"""torch.compile(fastconv.optimize(model)) on the CPU (aot_eager, fullgraph): the modules'
host-side caches (folded BatchNorm, per-signature plans, autocast casts) stay out of the
traced graph, which sees fastconv's custom ops: the convolution and, in training, the
BatchNorm passes (bn_ops.py; Triton's kernels in the interpreter here) (issue 25, first
part)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fastconv
from fastconv.precision import relative_error


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                               nn.ReLU())
        self.dw = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False),
                                nn.BatchNorm2d(8), nn.Hardswish())
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = self.a(x)
        return self.head(self.dw(y) + y)


def _net():
    torch.manual_seed(0)
    net = _Net()
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return net


@pytest.mark.parametrize("precision,bound", [("ieee", 1e-5), ("bf16", 2e-2)])
def test_compiled_inference_fullgraph(precision, bound):
    net = _net().eval()
    opt = fastconv.optimize(net, precision=precision, channels_last=False)
    compiled = torch.compile(opt, backend="aot_eager", fullgraph=True)
    x = torch.randn(2, 3, 9, 8)
    with torch.no_grad():
        for _ in range(2):  # the second call runs the cached graph
            assert relative_error(compiled(x), net(x).double()) < bound
        for model in (net, opt):  # an in-place update of a statistic reaches the graph
            next(m for m in model.modules() if isinstance(m, nn.BatchNorm2d)).running_mean.add_(1)
        assert relative_error(compiled(x), net(x).double()) < bound
    torch._dynamo.reset()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiled_training_step_fullgraph(dynamic):
    """(dynamic=True: the fused layers' float attributes are symbolic in the trace; torch
    2.13's dynamo cannot trace a ContextVar's get, which bn_act skips while compiling)"""
    net = _net().train()
    ref = copy.deepcopy(net)
    opt = fastconv.optimize(net, mode="training", precision="ieee", channels_last=False)
    compiled = torch.compile(opt, backend="aot_eager", fullgraph=True, dynamic=dynamic)
    x = torch.randn(4, 3, 9, 8)
    y = compiled(x)
    y.square().mean().backward()
    r = ref(x)
    r.square().mean().backward()
    assert relative_error(y.detach(), r.detach().double()) < 1e-5
    # (the fused layers rename the parameters: compare every gradient's norm, sorted)
    got = sorted(float(p.grad.norm()) for p in opt.parameters())
    want = sorted(float(p.grad.norm()) for p in ref.parameters())
    assert got == pytest.approx(want, rel=1e-4)
    torch._dynamo.reset()


def _fastconv_ops(model):
    """``model``'s modules traced as fastconv's custom ops (not torch's own operators)."""
    for m in model.modules():
        if hasattr(m, "compiled_as_torch"):
            m.compiled_as_torch = False
    return model


def _traced_ops(model, x) -> set:
    """The operators of ``model``'s dynamo graph (fullgraph) on ``x``."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=keep, fullgraph=True)(x)
    torch._dynamo.reset()
    return {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}


def test_modules_trace_as_torch_ops_unless_compiled_for_cuda_graphs():
    """Under torch.compile the optimized modules are torch's own operators by default (a
    custom op's host cost per call loses without CUDA graphs); ``fastconv.compile`` keeps
    fastconv's op in the CUDA-graph modes only. Both compute the model (float64)."""
    net = _net().eval().double()
    x = torch.randn(2, 3, 9, 8, dtype=torch.float64)
    with torch.no_grad():
        want = net(x)
    opt = fastconv.optimize(net, precision="ieee", channels_last=False)
    ops = _traced_ops(opt, x)
    assert not any("fastconv" in o for o in ops) and any("conv2d" in o for o in ops), ops
    assert any("fastconv.conv" in o for o in _traced_ops(_fastconv_ops(opt), x))
    for mode, as_torch in (("default", True), ("max-autotune-no-cudagraphs", True),
                           ("reduce-overhead", False), ("max-autotune", False)):
        compiled = fastconv.compile(net, "ieee", channels_last=False, mode=mode)
        assert {m.compiled_as_torch for m in compiled.modules()
                if hasattr(m, "compiled_as_torch")} == {as_torch}
    compiled = torch.compile(fastconv.optimize(net, precision="ieee", channels_last=False),
                             backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        assert relative_error(compiled(x), want) < 1e-10
    torch._dynamo.reset()


#: issue 22's model list (torchvision and timm), and three smaller models
ZOO = ["resnet18", "mobilenet_v3_small", "timm:mobilenetv3_small_050", "resnet50",
       "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny", "regnet_y_1_6gf",
       "deeplabv3_resnet50", "timm:resnet50", "timm:resnext50_32x4d", "timm:efficientnet_b0",
       "timm:mobilenetv3_large_100", "timm:convnext_tiny"]


@pytest.mark.parametrize("name", ZOO)
@pytest.mark.slow
def test_compiled_zoo_models(name):
    """Whole torchvision and timm models (random weights, 32x32, float64 so that only real
    differences show) through ``torch.compile(fastconv.optimize(model), fullgraph=True)``
    with fastconv's custom ops (as ``fastconv.compile`` traces them for CUDA graphs)
    (aot_eager: dynamo and AOTAutograd, the CPU's stand-in for Inductor), inference and a
    training step, against the uncompiled model: outputs and gradients. Every eligible
    conv-norm(-act) pattern is fused (convnext has none: LayerNorm after a permute). Dropout
    and StochasticDepth off (timm's create_model has no drop rate by default). timm's
    MobileNetV3 fuses through its BatchNormAct2d (activation inside the norm)."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    if name.startswith("timm:"):
        net = pytest.importorskip("timm").create_model(name[5:], pretrained=False,
                                                       num_classes=10).double()
    elif name == "deeplabv3_resnet50":
        net = torchvision.models.segmentation.deeplabv3_resnet50(
            num_classes=3, weights_backbone=None, aux_loss=False).double()
    else:
        net = getattr(torchvision.models, name)(num_classes=10).double()
    for m in net.modules():
        if isinstance(m, (nn.Dropout, torchvision.ops.StochasticDepth)):
            m.p = 0.0
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    for mode in ("inference", "training"):
        net.train(mode == "training")
        ref = copy.deepcopy(net)
        opt = _fastconv_ops(fastconv.optimize(net, mode=mode, precision="ieee",
                                              channels_last=False))
        fused, eligible, _ = opt.report.coverage()
        assert fused == eligible and (eligible > 0 or "convnext" in name)
        compiled = torch.compile(opt, backend="aot_eager", fullgraph=True)
        with torch.set_grad_enabled(mode == "training"):
            y, r = compiled(x), ref(x)
        if isinstance(y, dict):  # segmentation models
            y, r = y["out"], r["out"]
        assert relative_error(y.detach(), r.detach()) < 1e-10, mode
        if mode == "training":
            y.square().mean().backward()
            r.square().mean().backward()
            got = sorted(float(p.grad.norm()) for p in opt.parameters())
            want = sorted(float(p.grad.norm()) for p in ref.parameters())
            # (a shift before a training BatchNorm has a zero gradient: roundoff on both;
            # timm zero-initialises each block's last BatchNorm scale, which zeroes the
            # gradients of the layers before it in the block)
            pairs = [(g, w) for g, w in zip(got, want) if w > 1e-8]
            assert len(pairs) >= 10
            assert all(abs(g - w) <= 1e-8 * w for g, w in pairs)
            assert all(g <= 1e-8 * want[-1] for g, w in zip(got, want) if w <= 1e-8)
        torch._dynamo.reset()


@pytest.mark.parametrize("training", [False, True])
def test_fastconv_compile_entry_point(training):
    """fastconv.compile = torch.compile(optimize(model)) with Inductor's combo kernels (a
    mode passed as its options); the model's own training flag picks optimize's mode."""
    net = _net().train(training)
    ref = copy.deepcopy(net)
    compiled = fastconv.compile(net, "ieee", channels_last=False, fullgraph=True)
    assert compiled.training == training
    x = torch.randn(2, 3, 9, 8)
    with torch.set_grad_enabled(training):
        y, r = compiled(x), ref(x)
    assert relative_error(y.detach(), r.detach().double()) < 1e-5
    if training:
        y.square().mean().backward()
        assert all(p.grad is not None for p in compiled.parameters())
    torch._dynamo.reset()


def test_compiled_training_takes_torchs_convolution_where_it_computes_alike():
    """Under torch.compile a convolution that needs gradients is torch's own op (Inductor
    lowers and differentiates it; the custom op's host cost per step exceeded its gain),
    except on float32 data (torch's precision there follows cuDNN's TF32 flag, which the
    trace cannot read: fastconv's op keeps the call's precision). Inference too, by the
    modules' default (compiled_as_torch); with it off, fastconv::conv. (float64 stands for
    bf16 / fp16 here: any dtype but float32.)"""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    for training, dtype, as_torch, want_op in (
            (True, torch.float64, True, False), (True, torch.float32, True, True),
            (False, torch.float64, True, False), (False, torch.float64, False, True)):
        graphs.clear()
        net = _net().to(dtype).train(training)
        ref = copy.deepcopy(net)
        opt = fastconv.optimize(net, mode="training" if training else "inference",
                                precision="ieee", channels_last=False)
        if not as_torch:
            _fastconv_ops(opt)
        compiled = torch.compile(opt, backend=record, fullgraph=True)
        x = torch.randn(4, 3, 9, 8, dtype=dtype)
        with torch.set_grad_enabled(training):
            y, r = compiled(x), ref(x)
        assert relative_error(y.detach(), r.detach().double()) < 1e-5
        assert ("fastconv.conv" in graphs[0]) == want_op, (training, dtype)
        if training:
            y.square().mean().backward()
            assert all(p.grad is not None for p in opt.parameters())
        torch._dynamo.reset()


@pytest.mark.parametrize("transposed", [False, True])
def test_compiled_functional_call_with_grad_matches_eager(transposed):
    """The traced torch path: asymmetric "same" padding (even kernel), stride, dilation,
    groups, the epilogue (scale, shift, residual, activation) and a transposed call; values
    and every gradient as the eager call's."""
    torch.manual_seed(0)
    dt = torch.float64
    if transposed:
        x = torch.randn(2, 4, 5, 6, dtype=dt, requires_grad=True)
        w = torch.randn(4, 3, 3, 2, dtype=dt, requires_grad=True)
        kw = dict(stride=2, padding=1, output_padding=1, groups=1, dilation=1)
        fn = fastconv.conv_transpose2d
    else:
        x = torch.randn(2, 4, 7, 6, dtype=dt, requires_grad=True)
        w = torch.randn(6, 2, 4, 3, dtype=dt, requires_grad=True)
        kw = dict(padding="same", dilation=(1, 2), groups=2)
        fn = fastconv.conv2d
    k = w.shape[1] if transposed else w.shape[0]
    scale = torch.rand(k, dtype=dt, requires_grad=True)
    shift = torch.randn(k, dtype=dt, requires_grad=True)
    ops = dict(activation="silu", scale=scale, shift=shift)

    def f(x, w):
        return fn(x, w, None, **kw, **ops)

    want = f(x, w)
    res = torch.randn_like(want)
    ops["residual"] = res
    want = f(x, w)
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(x, w)
    assert relative_error(got, want) < 1e-12
    g = torch.randn_like(want)
    wanted = torch.autograd.grad(want, (x, w, scale, shift), g)
    gotten = torch.autograd.grad(got, (x, w, scale, shift), g)
    for a, b in zip(gotten, wanted):
        assert relative_error(a, b) < 1e-12
    torch._dynamo.reset()


def test_the_conv_op_schema_takes_opargs_fields_in_order():
    """The op's implementation and fake read the arguments after the six tensors as OpArgs:
    the written schema must name its fields in the same order."""
    from fastconv import ops
    from fastconv.spec import OpArgs

    schema = ops.conv._opoverload._schema
    assert [a.name for a in schema.arguments[:6]] == ["input", "weight", "bias", "scale",
                                                      "shift", "residual"]
    assert [a.name for a in schema.arguments[6:]] == list(OpArgs._fields)
