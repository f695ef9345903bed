"""GPU tests of the cuDNN frontend backend and of dispatch with it: numerics in every
precision (ieee really without TF32), the frontend's pitfalls, streams, workspace."""

import pytest
import torch
import torch.nn.functional as F

import fastconv
from fastconv import dispatch, workspace
from fastconv.backends.cudnn import CudnnBackend
from fastconv.precision import TOLERANCE, Precision, relative_error

pytestmark = pytest.mark.gpu

if not CudnnBackend.available()[0]:  # the whole module needs the package
    pytest.skip(f"cudnn backend unavailable: {CudnnBackend.available()[1]}",
                allow_module_level=True)


def _ref(x, w, **geo):
    return F.conv2d(x.double(), w.double(), **geo)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("precision", list(Precision), ids=str)
def test_forward_every_precision(precision, layout):
    """The bare convolution in every precision and layout; an epilogue is refused with its
    reason (never run fused: cuDNN's fused plans were wrong for some layers)."""
    dtype = {Precision.FP16: torch.float16, Precision.BF16: torch.bfloat16}.get(precision,
                                                                              torch.float32)
    mf = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    ran = 0
    for c, k, hw, ks, s, g in ((64, 64, 56, 3, 1, 1), (3, 64, 112, 7, 2, 1),
                               (96, 192, 17, 3, 2, 3), (256, 128, 14, 1, 1, 1)):
        x = torch.randn(4, c, hw, hw, device="cuda").to(dtype).contiguous(memory_format=mf)
        w = (torch.randn(k, c // g, ks, ks, device="cuda") / (c // g * ks * ks) ** 0.5).to(dtype)
        call = dict(backend="cudnn", precision=precision.value)
        with pytest.raises(fastconv.NotSupported, match="fused epilogue"):
            fastconv.conv2d(x, w, None, s, ks // 2, 1, g, activation="relu", **call)
        if dtype != torch.float32 and c % 8:
            with pytest.raises(fastconv.NotSupported, match="multiples of 8"):
                fastconv.conv2d(x, w, None, s, ks // 2, 1, g, **call)
            continue
        y = fastconv.conv2d(x, w, None, s, ks // 2, 1, g, **call)
        err = relative_error(y, _ref(x, w, stride=s, padding=ks // 2, groups=g))
        assert err <= TOLERANCE[precision], (c, k, hw, ks, s, g, err)
        ran += 1
    assert ran >= 3


def test_ieee_excludes_tensor_core_plans():
    """The same data: a TF32-sized error in tf32, an fp32-sized one in ieee, for every
    plan dispatch may choose."""
    x = torch.randn(8, 256, 28, 28, device="cuda")
    w = torch.randn(256, 256, 3, 3, device="cuda") / 48
    ref = F.conv2d(x.double(), w.double(), padding=1)
    errs = {}
    for prec in ("ieee", "tf32"):
        prob = fastconv.ConvProblem.from_tensors(x, w, None, padding=1, rank=2, precision=prec)
        errs[prec] = [relative_error(CudnnBackend.bind(prob, i)(x, w, None, None, None, None,
                                                                None), ref)
                      for i in CudnnBackend.candidates(prob)]
    assert max(errs["ieee"]) < 1e-6, errs
    assert min(errs["tf32"]) > 1e-6 and max(errs["tf32"]) < TOLERANCE[Precision.TF32], errs


def test_output_in_another_layout_than_the_input():
    """An out= buffer whose strides differ from the input's (the output's stride is part of
    the graph: a stride set without its dim is silently ignored by the frontend)."""
    x = torch.randn(4, 32, 19, 23, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(48, 32, 3, 3, device="cuda", dtype=torch.bfloat16) / 17
    out = torch.full((4, 48, 19, 23), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = out.contiguous(memory_format=torch.channels_last)
    fastconv.conv2d(x, w, padding=1, out=out, backend="cudnn")
    assert relative_error(out, _ref(x, w, padding=1)) < TOLERANCE[Precision.BF16]


@pytest.mark.parametrize("groups", [1, 4, 64])
def test_grouped_and_strided_gradients(groups):
    """dgrad of a grouped strided convolution (the frontend cannot infer dx's dims) and
    wgrad, against float64."""
    x = torch.randn(4, 64, 29, 31, device="cuda", requires_grad=True)
    w = (torch.randn(128, 64 // groups, 3, 3, device="cuda") / 8).requires_grad_()
    y = fastconv.conv2d(x, w, None, 2, 1, 1, groups, backend="cudnn", precision="ieee")
    gy = torch.randn_like(y)
    dx, dw = torch.autograd.grad(y, (x, w), gy)
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    rx, rw = torch.autograd.grad(F.conv2d(xd, wd, None, 2, 1, 1, groups), (xd, wd), gy.double())
    assert relative_error(dx, rx) < 1e-5 and relative_error(dw, rw) < 1e-5


def test_conv1d_and_transposed():
    x = torch.randn(8, 48, 301, device="cuda")
    w = torch.randn(64, 48, 5, device="cuda") / 15
    y = fastconv.conv1d(x, w, padding=((4, 0),), dilation=1, backend="cudnn", precision="ieee")
    ref = F.conv1d(F.pad(x, (4, 0)).double(), w.double())
    assert relative_error(y, ref) < 1e-5
    xt = torch.randn(4, 64, 15, 17, device="cuda")
    wt = torch.randn(64, 32, 4, 4, device="cuda") / 16
    yt = fastconv.conv_transpose2d(xt, wt, stride=2, padding=1, output_padding=1,
                                   backend="cudnn", precision="ieee")
    reft = F.conv_transpose2d(xt.double(), wt.double(), stride=2, padding=1, output_padding=1)
    assert relative_error(yt, reft) < 1e-5


def test_runs_on_the_current_stream():
    """Inputs produced on a side stream by slow work: a plan launched on another stream
    would read them before they are written."""
    side = torch.cuda.Stream()
    w = torch.randn(64, 64, 3, 3, device="cuda") / 24
    a = torch.randn(4096, 4096, device="cuda")
    with torch.cuda.stream(side):
        for _ in range(3):
            fastconv.conv2d(torch.randn(8, 64, 56, 56, device="cuda"), w, padding=1,
                            backend="cudnn")  # build and warm on this stream
        slow = a
        for _ in range(20):
            slow = slow @ a / 64
        x = slow[:8 * 64 * 56 * 56 // 4096].reshape(8, 64, 56, 56).contiguous()
        y = fastconv.conv2d(x, w, padding=1, backend="cudnn", precision="ieee")
    side.synchronize()
    assert relative_error(y, _ref(x, w, padding=1)) < 1e-5


def test_benchmark_dispatch_times_cudnn_plans_and_explains():
    x = torch.randn(16, 128, 28, 28, device="cuda", dtype=torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(128, 128, 3, 3, device="cuda", dtype=torch.bfloat16) / 34
    ex = fastconv.explain(x, w, padding=1, dispatch="benchmark")
    timed = [r for r in ex.rows if r.backend == "cudnn" and r.timed]
    assert len(timed) >= 2, str(ex)  # every plan is timed, not just cuDNN's first
    assert all(r.gpu_ms > 0 and r.host_ms > 0 and r.graph_ms > 0 for r in timed), str(ex)
    # eager: the least GPU (graph-replayed, rotated operands) + host time wins
    assert ex.choice.ms == min(r.graph_ms + r.host_ms for r in ex.rows if r.timed)
    with dispatch.settings(graph=True):
        ex = fastconv.explain(x, w, padding=1, dispatch="benchmark")
    assert ex.choice.ms == min(r.graph_ms for r in ex.rows if r.timed), str(ex)
    print(ex)


def test_workspace_cap_skips_candidates_never_fails():
    x = torch.randn(8, 64, 56, 56, device="cuda")
    w = torch.randn(64, 64, 3, 3, device="cuda") / 24
    workspace.set_limit(0)
    try:
        with dispatch.settings("benchmark"):
            prob = fastconv.ConvProblem.from_tensors(x, w, None, padding=1, rank=2,
                                                     precision="tf32")
            ex = fastconv.explain(x, w, padding=1, precision="tf32", dispatch="benchmark")
        y = fastconv.conv2d(x, w, padding=1, precision="tf32", dispatch="benchmark")
        assert relative_error(y, _ref(x, w, padding=1)) < TOLERANCE[Precision.TF32]
        print(prob.key(), ex)
    finally:
        workspace.set_limit(None)


_SERIALIZATION_SCRIPT = r"""
import json, time, torch, torch.nn.functional as F
import fastconv
from fastconv.backends import cudnn
from fastconv.precision import relative_error
torch.manual_seed(int(__import__("sys").argv[1]))
x = torch.randn(7, 96, 29, 31, device="cuda", dtype=torch.bfloat16)
x = x.contiguous(memory_format=torch.channels_last)
w = (torch.randn(80, 96, 3, 3, device="cuda", dtype=torch.bfloat16) / 30)
w = w.contiguous(memory_format=torch.channels_last)
torch.cuda.synchronize()
t0 = time.perf_counter()
y = fastconv.conv2d(x, w, padding=1, stride=2, backend="cudnn", dispatch="benchmark")
torch.cuda.synchronize()
first = time.perf_counter() - t0
err = relative_error(y, F.conv2d(x.double(), w.double(), padding=1, stride=2))
print(json.dumps(dict(cudnn.SERIALIZATION, graphs=cudnn.graph_count(), err=err, first_s=first)))
"""


def test_plan_serialization_round_trip_across_processes(tmp_path):
    """The first process stores its chosen plan serialized; the second runs it without
    building a graph (no heuristics query, no plan build) and gets a correct result."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, FASTCONV_CACHE_DIR=str(tmp_path))
    runs = []
    for seed in (1, 2):
        proc = subprocess.run([sys.executable, "-c", _SERIALIZATION_SCRIPT, str(seed)],
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(runs)
    first, second = runs
    assert first["stored"] == 1 and first["restored"] == 0 and first["graphs"] >= 1, first
    assert second["restored"] == 1 and second["graphs"] == 0, second
    assert second["last_error"] == "", second  # deserialized, not rebuilt from the recipe
    for run in runs:
        assert run["err"] < TOLERANCE[Precision.BF16], run


def test_out_of_memory_candidate_is_skipped(monkeypatch):
    """A cuDNN plan whose workspace allocation really runs out of GPU memory is skipped with
    that reason; dispatch chooses another candidate and the result is correct."""
    import fastconv.backends.cudnn as cudnn_backend

    def huge(nbytes, device, stream):
        return torch.empty(1 << 46, dtype=torch.uint8, device="cuda")  # 64 TiB

    monkeypatch.setattr(cudnn_backend.workspace, "for_stream", huge)
    x = torch.randn(5, 48, 23, 27, device="cuda")
    w = torch.randn(40, 48, 3, 3, device="cuda") / 20
    ex = fastconv.explain(x, w, padding=1, precision="tf32", dispatch="benchmark")
    oom = [r for r in ex.rows if r.backend == "cudnn" and "out of memory" in r.note]
    assert oom and all(not r.timed for r in ex.rows if r.backend == "cudnn"), str(ex)
    assert ex.choice.backend != "cudnn"
    y = fastconv.conv2d(x, w, padding=1, precision="tf32", dispatch="benchmark")
    assert relative_error(y, _ref(x, w, padding=1)) < TOLERANCE[Precision.TF32]
