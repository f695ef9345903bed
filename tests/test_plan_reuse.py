"""Cached call plans (plans._PLANS, keyed by a call's signature) are reused only when every
property a check depends on is the same, and the checks that depend on data pointers run on
every call. Each case changes one property after a cached call and compares with torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fastconv
from fastconv import costs, functional, plans
from fastconv.precision import relative_error
from fastconv.spec import ConvCall

_BACKENDS = ("aten", "triton")


def _ref(x, w, b=None, **kw):
    return F.conv2d(x.double(), w.double(), None if b is None else b.double(), **kw)


@pytest.fixture(autouse=True)
def _fresh_plans():
    functional.clear_plans()
    yield
    functional.clear_plans()


@pytest.mark.parametrize("backend", _BACKENDS)
def test_each_signature_change_gets_its_own_checked_plan(backend):
    w = torch.randn(4, 3, 3, 3)
    calls = [
        torch.randn(2, 3, 7, 6),                                            # first sight
        torch.randn(2, 3, 7, 6),                                            # reused
        torch.randn(1, 3, 9, 5),                                            # shape
        torch.randn(2, 3, 7, 12)[..., ::2],                                 # strides
        torch.randn(2, 3, 7, 6).contiguous(memory_format=torch.channels_last),  # layout
    ]
    for x in calls:
        y = fastconv.conv2d(x, w, padding=1, backend=backend, precision="ieee")
        assert relative_error(y, _ref(x, w, padding=1)) < 1e-5
    assert len(plans._PLANS) == 4  # one plan per distinct signature, the repeat reused
    x64 = torch.randn(2, 3, 7, 6, dtype=torch.float64)  # dtype: the weight must follow
    with pytest.raises(fastconv.ConvError, match="dtype"):
        fastconv.conv2d(x64, w, padding=1, backend=backend)
    y = fastconv.conv2d(x64, w.double(), padding=1, backend=backend)
    assert relative_error(y, _ref(x64, w, padding=1)) < 1e-12


@pytest.mark.parametrize("backend", _BACKENDS)
def test_the_tf32_flag_is_part_of_the_signature(backend):
    x, w = torch.randn(2, 3, 7, 6), torch.randn(4, 3, 3, 3)
    old = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = False  # precision=None: ieee now
        fastconv.conv2d(x, w, padding=1, backend=backend)
        torch.backends.cudnn.allow_tf32 = True  # tf32 now: another plan
        fastconv.conv2d(x, w, padding=1, backend=backend)
    finally:
        torch.backends.cudnn.allow_tf32 = old
    precisions = {plan.problem.precision for plan in plans._PLANS.values()}
    assert len(precisions) == 2, precisions


@pytest.mark.parametrize("backend", _BACKENDS)
def test_pointer_checks_run_on_every_cached_call(backend):
    """out= and the operands: same signature, other memory. The overlap checks depend on the
    data pointers, so a cached plan must still run them."""
    x, w = torch.randn(1, 4, 5, 5), torch.randn(4, 4, 1, 1)
    out = torch.empty(1, 4, 5, 5)
    fastconv.conv2d(x, w, out=out, backend=backend, precision="ieee")  # cached, no overlap
    with pytest.raises(fastconv.ConvError, match="overlaps input"):
        fastconv.conv2d(x, w, out=x, backend=backend, precision="ieee")
    res = torch.randn(1, 4, 5, 5)
    fastconv.conv2d(x, w, residual=res, out=out, backend=backend, precision="ieee")
    with pytest.raises(fastconv.ConvError, match="overlaps residual"):
        fastconv.conv2d(x, w, residual=res, out=res, backend=backend, precision="ieee")


@pytest.mark.parametrize("backend", _BACKENDS)
def test_a_module_follows_in_place_updates_and_data_swaps(backend):
    conv = fastconv.nn.Conv2d(3, 4, 3, padding=1, backend=backend, precision="ieee").eval()
    x = torch.randn(2, 3, 6, 7)
    with torch.no_grad():
        conv(x)
        conv.weight.mul_(-2.0)  # in place: the version counter moves
        assert relative_error(conv(x), _ref(x, conv.weight, conv.bias, padding=1)) < 1e-5
        conv.weight.data = torch.randn(4, 3, 3, 3)  # a new tensor behind the Parameter
        assert relative_error(conv(x), _ref(x, conv.weight, conv.bias, padding=1)) < 1e-5
        conv.bias.data = torch.randn(4)
        assert relative_error(conv(x), _ref(x, conv.weight, conv.bias, padding=1)) < 1e-5


@pytest.mark.parametrize("backend", _BACKENDS)
def test_requires_grad_switches_to_the_autograd_path(backend):
    x, w = torch.randn(2, 3, 6, 5), torch.randn(4, 3, 3, 3)
    fastconv.conv2d(x, w, padding=1, backend=backend, precision="ieee")  # cached, no grad
    xg = x.clone().requires_grad_()
    y = fastconv.conv2d(xg, w, padding=1, backend=backend, precision="ieee")
    g = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, xg, g)
    xr = x.double().requires_grad_()
    (want,) = torch.autograd.grad(F.conv2d(xr, w.double(), padding=1), xr, g.double())
    assert relative_error(dx, want) < 1e-5


@pytest.mark.parametrize("backend", _BACKENDS)
def test_grad_trial_runs_the_candidates_forward_and_backward_without_side_effects(
        backend, monkeypatch):
    """Dispatch times a call that needs gradients by the candidate's own forward and
    backward through autograd: torch's for aten's native plan, plans.ConvFunction's (the
    data and weight gradients through run_grads) for the others. The caller's tensors get
    no .grad and no graph."""
    from fastconv import backends

    x = torch.randn(2, 3, 7, 5, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    problem = plans.forward_problem(ConvCall(2, False, 1, 1, 1, 1, 0, "relu", 0.01, backend),
                                    x, w, b, None, None, None, None)
    grads = []
    real = plans.run_grads
    monkeypatch.setattr(plans, "run_grads", lambda *a: grads.append(a) or real(*a))
    trial = plans.forward_trial(problem, x, w, b, None, None, None, None, backend, grad=True)
    cls = backends.REGISTRY[backend]
    config = None if backend == "aten" else cls.candidates(problem, "fprop")[0]
    trial(cls, config)
    native = plans._native(cls, config, problem)
    assert native == (backend == "aten")
    assert len(grads) == (0 if native else 1)  # torch's autograd computed the native one's
    assert x.grad is None and w.grad is None and b.grad is None


def test_a_call_needing_gradients_runs_the_plan_dispatch_chose_for_it(monkeypatch):
    """The autograd path reuses the forward plan chosen with grad=True (no second dispatch
    inside plans.ConvFunction), a plan of its own beside the no-grad one."""
    x, w = torch.randn(2, 3, 6, 5), torch.randn(4, 3, 3, 3)
    fastconv.conv2d(x, w, padding=1, backend="triton", precision="ieee")
    seen = []
    real = plans._plan
    monkeypatch.setattr(plans, "_plan", lambda *a: seen.append(a[-1]) or real(*a))
    xg = x.clone().requires_grad_()
    for _ in range(2):
        y = fastconv.conv2d(xg, w, padding=1, backend="triton", precision="ieee")
        (dx,) = torch.autograd.grad(y, xg, torch.ones_like(y))
    assert seen == [True]  # planned once, for a call with a backward
    xr = x.double().requires_grad_()
    (want,) = torch.autograd.grad(F.conv2d(xr, w.double(), padding=1), xr,
                                  torch.ones_like(y).double())
    assert relative_error(dx, want) < 1e-5


def test_the_backward_takes_the_dispatch_settings_of_its_forward(monkeypatch):
    """plans.ConvFunction's backward dispatches its gradients with the settings of the forward
    call, even when it runs in another thread (a CUDA backward runs on autograd's device
    thread, where the caller's settings() context is not seen)."""
    import threading

    from fastconv import dispatch

    seen = []
    real = plans.run_grads
    monkeypatch.setattr(plans, "run_grads",
                        lambda *a: seen.append(dispatch.current()) or real(*a))
    x = torch.randn(2, 3, 6, 5, requires_grad=True)
    w = torch.randn(4, 3, 3, 3)
    with dispatch.settings("heuristic", deterministic=True, graph=True):
        y = fastconv.conv2d(x, w, padding=1, backend="triton", precision="ieee")
    grads = []
    thread = threading.Thread(target=lambda: grads.append(
        torch.autograd.grad(y, x, torch.ones_like(y))))
    thread.start()
    thread.join()
    assert seen == [("heuristic", True, True)] and len(grads) == 1
    assert dispatch.current() == (None, False, False)


def _grads(module, x, g):
    y = module(x)
    return (y, *torch.autograd.grad(y, (x, *module.parameters()), g))


@pytest.mark.parametrize("backend", _BACKENDS)
def test_a_module_call_with_autograd_reuses_its_native_plan_and_sees_every_change(
        backend, monkeypatch):
    """A module call that needs gradients runs the module's kept plan: a native one directly
    (torch's autograd differentiates it), one with fastconv's backward through
    ``plans.ConvFunction`` with the arguments kept beside it. Either way, a new shape or
    layout, a ``.data`` swap (other shape), an in-place update and the grad mode give
    results and gradients equal to torch's."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # strict fp32, as torch
    conv = fastconv.nn.Conv2d(3, 4, 3, padding=1, backend=backend)  # (precision: torch's)
    ref = torch.nn.Conv2d(3, 4, 3, padding=1).double()

    def check(x):
        ref.load_state_dict(conv.state_dict())
        xg, xr = x.clone().requires_grad_(), x.double().requires_grad_()
        y, *grads = _grads(conv, xg, g := torch.randn(conv(x).shape))
        want = _grads(ref, xr, g.double())
        for u, v in zip((y, *grads), want):
            assert relative_error(u, v) < 1e-5
    check(torch.randn(2, 3, 6, 7))
    kept = conv._call_site().plan
    assert kept[1] is not None and kept[1].native_grad == (backend == "aten")
    assert (kept[5] is None) == (backend == "aten")  # the autograd function's arguments
    check(torch.randn(2, 3, 6, 7))
    assert conv._call_site().plan is kept  # same signature: reused
    check(torch.randn(1, 3, 5, 9).contiguous(memory_format=torch.channels_last))
    with torch.no_grad():
        conv.weight.mul_(-2.0)
    check(torch.randn(2, 3, 6, 7))
    conv.weight.data = torch.randn(4, 3, 1, 1)  # another kernel size behind the Parameter
    conv.padding = (0, 0)
    ref = torch.nn.Conv2d(3, 4, 1).double()
    check(torch.randn(2, 3, 6, 7))
    with torch.no_grad():  # and back without autograd: its own plan
        x = torch.randn(2, 3, 6, 7)
        assert relative_error(conv(x), ref(x.double())) < 1e-5


def test_a_training_conv_bn_act_module_runs_torch_s_ops_through_its_plan():
    """ConvBNAct2d in training: the convolution through the module's kept plan, the batch
    norm as torch's; outputs, every gradient and the running statistics equal torch's
    modules', under autocast too (the parameters stay float32, their gradients too), and a
    residual of another dtype is the general path's clear error."""
    from fastconv.nn import ConvBNAct2d

    seq = torch.nn.Sequential(torch.nn.Conv2d(3, 5, 3, padding=1, bias=True),
                              torch.nn.BatchNorm2d(5), torch.nn.SiLU())
    m = ConvBNAct2d.from_torch(seq)
    for autocast in (False, True):
        x = torch.randn(3, 3, 7, 6)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y, *grads = _grads(m, x.clone().requires_grad_(), g := torch.randn(3, 5, 7, 6))
            want = _grads(seq, x.clone().requires_grad_(), g)
        assert y.dtype == want[0].dtype == (torch.bfloat16 if autocast else torch.float32)
        assert m._call_site().plan[1] is not None  # the kept plan ran
        for u, v in zip((y, *grads), want):
            assert u.dtype == v.dtype and relative_error(u, v) < (2e-2 if autocast else 1e-5)
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            assert relative_error(getattr(m.bn, name), getattr(seq[1], name)) < 1e-5, name
    with pytest.raises(fastconv.ConvError, match="residual: expected shape"):
        m(torch.randn(3, 3, 7, 6), torch.randn(3, 5, 7, 6, dtype=torch.float64))


def test_a_trial_binds_each_candidate_once(monkeypatch):
    """Dispatch's trial binds a candidate once and calls that plan for every timed call, as
    the plan it becomes will (binding per call timed the bind and a first launch each time)."""
    from fastconv.backends.aten import AtenBackend

    x, w = torch.randn(2, 3, 7, 6), torch.randn(4, 3, 3, 3)
    problem = plans.forward_problem(ConvCall(2, False, 1, 1, 1, 1, 0, precision="ieee"),
                                    x, w, None, None, None, None, None)
    binds = []
    real = AtenBackend.bind.__func__
    monkeypatch.setattr(AtenBackend, "bind",
                        classmethod(lambda cls, *a, **k: binds.append(a) or real(cls, *a, **k)))
    trial = plans.forward_trial(problem, x, w, None, None, None, None, None)
    for _ in range(5):
        trial(AtenBackend, None)
    assert len(binds) == 1


@pytest.mark.parametrize("grad", [False, True])
def test_trials_rotate_over_copies_of_the_operands(grad):
    """Graph timing runs a candidate on operand set k: set 0 is the call's own tensors,
    the others detached copies with the same values, layouts and requires_grad (made at
    first use); each set writes its own output. The caller's tensors are left alone."""
    from fastconv.backends.aten import AtenBackend

    x = torch.randn(2, 3, 7, 6).contiguous(memory_format=torch.channels_last)
    w = torch.randn(4, 3, 3, 3, requires_grad=grad)
    b = torch.randn(4)
    # into the caller's (poisoned) buffer without grad: each set writes a buffer like it
    out = None if grad else torch.full((2, 4, 7, 6), float("nan")).contiguous(
        memory_format=torch.channels_last)
    problem = plans.forward_problem(
        ConvCall(2, False, 1, 1, 1, 1, 0, "relu", precision="ieee"), x, w, b, None, None,
        None, out)
    trial = plans.forward_trial(problem, x, w, b, None, None, None, out, grad=grad)
    sets = trial.operand_sets
    assert sets.count == 8  # a tiny problem: the most sets (costs.rotation_count)
    for k in (2, 0, 1):
        trial(AtenBackend, None, k)
    assert len(sets.sets) == 3
    own, copy = sets[0], sets[2]
    assert own[0].data_ptr() == x.data_ptr()
    for a, c in zip(own[:-1], copy[:-1]):  # (the last: the set's own scratch)
        if isinstance(a, torch.Tensor):
            assert c.data_ptr() != a.data_ptr() and torch.equal(a, c)
            assert c.stride() == a.stride() and c.requires_grad == a.requires_grad
            assert c.grad_fn is None
    if not grad:
        ref = F.relu(_ref(x, w, b, padding=1))
        assert sets[0][-1] is out and len({sets[k][-1].data_ptr() for k in range(3)}) == 3
        for k in range(3):
            assert relative_error(sets[k][-1], ref) < 1e-6
            assert sets[k][-1].stride() == out.stride()
    assert w.grad is None


def test_rotation_count_passes_more_than_twice_the_l2_cache():

    assert costs.rotation_count(1) == 8
    assert costs.rotation_count(2 * costs.L2_BYTES) == 1
    n = costs.rotation_count(costs.L2_BYTES // 3)
    assert n == 6 and n * (costs.L2_BYTES // 3) >= 2 * costs.L2_BYTES - 6


def test_a_module_s_kept_entry_follows_autocast_and_the_input_dtype():
    """The module's kept entry is keyed on the operands as given plus autocast's state: a
    float32 input under bf16 autocast is cast (bf16 out), the same input under fp16
    autocast gets its own entry (fp16 out), an input already in the autocast dtype is not
    cast, and leaving autocast computes in float32 again; each result against float64."""
    conv = fastconv.nn.Conv2d(3, 5, 3, padding=1).eval()
    x = torch.randn(2, 3, 6, 7)
    ref = _ref(x, conv.weight, conv.bias, padding=1)
    seen = []
    with torch.no_grad():
        for dtype, given, tol in ((torch.bfloat16, x, 2e-2), (torch.bfloat16, x, 2e-2),
                                  (torch.float16, x, 2e-3),
                                  (torch.bfloat16, x.bfloat16(), 2e-2), (None, x, 1e-5)):
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16,
                                enabled=dtype is not None):
                y = conv(given)
            assert y.dtype == (dtype or torch.float32)
            assert relative_error(y, ref) < tol, (dtype, given.dtype)
            key, plan, to_input, _, params, op_args = conv._call_site().plan
            assert plan is not None and params == dtype and op_args is None
            assert (to_input is not None) == (dtype is not None and given.dtype != dtype)
            seen.append(conv._call_site().plan)
    assert seen[1] is seen[0]  # the same signature: kept
    assert len({id(e) for e in seen}) == 4


def _fused_reference(m, x, residual):
    """``m`` (a ConvBNAct2d in eval mode, ReLU) as torch's layers in float64."""
    conv = torch.nn.Conv2d(m.in_channels, m.out_channels, 3, padding=1,
                           bias=m.bias is not None).double()
    bn = torch.nn.BatchNorm2d(m.out_channels).double().eval()
    conv.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("bn.")})
    bn.load_state_dict({k[3:]: v for k, v in m.state_dict().items() if k.startswith("bn.")})
    xd = x.detach().double().requires_grad_()
    rd = residual.detach().double()
    y = torch.relu(bn(conv(xd)) + rd)
    return y, xd, conv.weight, bn.weight


@pytest.mark.parametrize("backend", _BACKENDS)
@pytest.mark.parametrize("autocast", [False, True])
def test_a_fused_layer_in_eval_with_autograd_runs_its_kept_plan(backend, autocast,
                                                                monkeypatch):
    """BatchNorm in eval mode with gradients (a frozen-statistics fine-tune): the module
    folds the statistics differentiably and runs its kept plan (with a residual), results
    and gradients as torch's layers give them; under bf16 autocast, within bf16's rounding."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    torch.manual_seed(1)
    m = fastconv.nn.ConvBNAct2d(3, 5, 3, padding=1, activation="relu", backend=backend)
    with torch.no_grad():
        m.bn.running_mean.normal_()
        m.bn.running_var.uniform_(0.5, 2.0)
        m.bn.weight.uniform_(0.5, 1.5)
    m.eval()
    tol = 3e-2 if autocast else 1e-5
    for shape in ((2, 3, 6, 7), (2, 3, 6, 7), (1, 3, 5, 9)):
        x = torch.randn(*shape, requires_grad=True)
        residual = torch.randn(shape[0], 5, *shape[2:])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = m(x, residual.bfloat16() if autocast else residual)
        g = torch.randn(y.shape)
        grads = torch.autograd.grad(y, (x, m.weight, m.bn.weight), g.to(y.dtype))
        ref, xd, wd, gd = _fused_reference(m, x, residual)
        want = torch.autograd.grad(ref, (xd, wd, gd), g.double())
        assert relative_error(y, ref) < tol
        for u, v in zip(grads, want):
            assert relative_error(u, v) < tol
        assert m._call_site().plan[1] is not None  # the kept plan ran


def _frames_to_the_kernel(fn) -> int:
    """fastconv frames (the package's own files: a checkout may itself sit in a folder
    named fastconv) on the stack when ``fn`` launches its first Triton kernel."""
    import os
    import sys

    package = os.path.dirname(os.path.abspath(fastconv.__file__)) + os.sep
    depth = []

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and not depth and "triton" in code.co_filename \
                and code.co_name in ("launch", "run"):
            n, f = 0, frame.f_back
            while f is not None:
                n += os.path.abspath(f.f_code.co_filename).startswith(package)
                f = f.f_back
            depth.append(n)
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return depth[0]


def test_a_fused_layer_reaches_its_kernel_in_six_frames_on_every_route():
    """From the module's forward to the kernel launch, at most 6 fastconv frames (counting
    the interpreter's lock wrapper, absent on a GPU), after the first call of each route."""
    from fastconv import dispatch

    x = torch.randn(2, 4, 7, 7)
    with dispatch.settings("heuristic"):
        m = fastconv.nn.ConvBNAct2d(4, 6, 3, padding=1, activation="relu", backend="triton")
        c = fastconv.nn.Conv2d(4, 6, 3, padding=1, backend="triton")
        residual = torch.randn(2, 6, 7, 7)
        routes = {
            "train": lambda: m.train()(x.clone().requires_grad_()),
            "eval with autograd": lambda: m.eval()(x.clone().requires_grad_(), residual),
            "conv with autograd": lambda: c(x.clone().requires_grad_()),
        }
        for name, call in routes.items():
            call()
            assert _frames_to_the_kernel(call) <= 6, name
        with torch.no_grad():
            for name, call in {"eval": lambda: m.eval()(x, residual), "conv": lambda: c(x)
                               }.items():
                call()
                assert _frames_to_the_kernel(call) <= 6, name


def test_operand_sets_keep_the_calls_strides():
    """Dispatch's operand-set copies have the call's strides, gaps and zero strides
    included: a plan's prepared launch keeps its first call's strides, and a kernel prepared
    for a non-dense view read past the end of clone()'s dense copy on a GPU."""
    from fastconv.plans import _Sets

    half = torch.randn(2, 9, 14).transpose(1, 2)[:, :7]  # (2, 7, 9), row stride 14
    wide = torch.randn(7).expand(3, 7)
    sets = _Sets((half, wide.requires_grad_(False), None, 3), lambda k: (), 1 << 40)
    copy = sets[1]
    for a, c in zip((half, wide), copy[:2]):
        assert c.stride() == a.stride() and torch.equal(c, a)
        assert c.data_ptr() != a.data_ptr()
    assert copy[2:] == (None, 3)
    grad = _Sets((half.clone().requires_grad_(),), lambda k: (), 1 << 40)[1][0]
    assert grad.requires_grad and grad.is_leaf and grad.stride() == half.clone().stride()
