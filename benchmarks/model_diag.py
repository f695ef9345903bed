"""Per-layer diagnosis of fastconv.optimize on whole models, GPU only.

* ``layers``: DeepLabV3-ResNet50 inference at 512x512 (batch 2) in each precision: every
  fastconv layer's output against a float64 run of the same layer on the same input, beside
  torch's own error on that input (same precision), with the backend dispatch chose. Rows
  where fastconv's error is over 3x torch's are listed (all rows with ``-v``).
* ``train``: ResNet-50 training (batch 8, strict fp32): every fused layer's forward and its
  gradients (input, weight, γ, β, residual) for a random upstream gradient, against float64
  and beside torch's fp32 error.
* ``host``: host time of eager inference (batch 1): torch.profiler's CPU table for
  fastconv.optimize (bf16) and torch (autocast), and the backends of the cached plans.

* ``determinism``: NaN-poisoned memory and pass-to-pass differences of training grads.
* ``enqueue``: host time of one inference forward against its GPU time (batch 1 and 8).

Usage: PYTHONPATH=src python benchmarks/model_diag.py [layers] [train] [host] [enqueue]
    [determinism] [-v]
"""

from __future__ import annotations

import collections
import copy
import sys

import torch
import torch.nn.functional as F

from fastconv import batchnorm, dispatch, plans
from fastconv.nn import Conv2d
from fastconv.nn.fused import ConvBNAct2d
from fastconv.optimize import optimize
from fastconv.precision import relative_error
from fastconv.tools.bench import models

VERBOSE = "-v" in sys.argv


def _last_plans():
    """Record the plan of every forward call (layer -> backend:config)."""
    seen = []
    original = plans.forward_plan

    def recording(*args, **kwargs):
        plan = original(*args, **kwargs)
        choice = dispatch.cached(plan.problem, args[-2] if len(args) > 2 else "auto")
        seen.append(choice.name() if choice is not None else plan.backend)
        return plan
    plans.forward_plan = recording
    return seen, lambda: setattr(plans, "forward_plan", original)


def _reference(module, x, residual, dtype):
    """The module's computation with torch modules in ``dtype`` (eval or train as it is)."""
    if isinstance(module, ConvBNAct2d):
        conv, bn, act = module.to_torch().to(dtype)
        y = bn(conv(x.to(dtype)))
        if residual is not None:
            y = y + residual.to(dtype)
        return act(y)
    return F.conv2d(x.to(dtype), module.weight.to(dtype),
                    None if module.bias is None else module.bias.to(dtype), module.stride,
                    module.padding, module.dilation, module.groups)


def layers(precision: str):
    torch.manual_seed(0)
    model = models._deeplab().cuda().eval()
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    fast = optimize(model, "inference", precision, channels_last=half is not None)
    x = torch.randn(2, 3, 512, 512, device="cuda")
    captured = []

    def hook(module, args, out):
        captured.append((module, [a.detach().clone() if isinstance(a, torch.Tensor) else a
                                  for a in args], out.detach().clone()))
    names = {}
    handles = []
    for name, m in fast.model.named_modules():
        if isinstance(m, (ConvBNAct2d, Conv2d)):
            names[m] = name
            handles.append(m.register_forward_hook(hook))
    seen, restore = _last_plans()
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    try:
        with torch.no_grad():
            fast(x)
    finally:
        restore()
        for h in handles:
            h.remove()
    bad = 0
    print(f"\n== layers {precision}: {len(captured)} fastconv layers ==")
    print(f"{'layer':40s} {'input':>22s} {'fast err':>9s} {'torch err':>9s} {'ratio':>6s}  plan")
    with torch.no_grad():
        for i, (m, args, out) in enumerate(captured):
            inp, res = args[0], (args[1] if len(args) > 1 else None)
            truth = _reference(m, inp.double(), None if res is None else res.double(),
                               torch.float64)
            with torch.autocast("cuda", dtype=half, enabled=half is not None):
                theirs = _reference(m, inp, res, torch.float32)
            ef, et = relative_error(out, truth), relative_error(theirs, truth)
            ratio = ef / max(et, 1e-12)
            plan = seen[i] if i < len(seen) else "?"
            if ratio > 3 or VERBOSE:
                bad += ratio > 3
                print(f"{names[m][:40]:40s} {str(tuple(inp.shape)):>22s} {ef:9.2e} {et:9.2e} "
                      f"{ratio:6.1f}  {plan}")
    print(f"{bad} layers over 3x torch's error")
    torch.backends.cudnn.allow_tf32 = True


def train():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda().train()
    fast = optimize(model, "training", "ieee")
    torch.backends.cudnn.allow_tf32 = False
    captured = []

    def hook(module, args, out):
        captured.append((module, [a.detach().clone() if isinstance(a, torch.Tensor) else a
                                  for a in args]))
    handles = [m.register_forward_hook(hook) for m in fast.model.modules()
               if isinstance(m, ConvBNAct2d)]
    x = torch.randn(8, 3, 224, 224, device="cuda")
    fast(x)
    for h in handles:
        h.remove()
    print(f"\n== train ieee: {len(captured)} fused layers (errors vs float64; torch fp32) ==")
    print(f"{'#':>3s} {'input':>22s} " + " ".join(f"{k:>17s}" for k in
                                                    ("out", "dx", "dw", "dgamma", "dbeta",
                                                     "dres")))
    bad = 0
    for i, (m, args) in enumerate(captured):
        inp, res = args[0], (args[1] if len(args) > 1 else None)
        ref = {kind: _train_grads(m, inp, res, i, kind) for kind in ("f64", "torch", "fast")}
        cells, flag = _compare(ref["fast"], ref["torch"], ref["f64"])
        if flag or VERBOSE:
            bad += flag
            print(f"{i:3d} {str(tuple(inp.shape)):>22s} " + " ".join(cells)
                  + f"  {m.extra_repr()[:60]}")
        if flag:  # which part: the batch-norm kernels or the convolution's gradients?
            seen, restore = _last_plans()
            batchnorm.USE_TRITON = False
            try:
                ops_path = _train_grads(m, inp, res, i, "fast")
            finally:
                batchnorm.USE_TRITON = True
                restore()
            cells, _ = _compare(ops_path, ref["torch"], ref["f64"])
            print("    torch-ops BN path: " + " ".join(cells) + f"  fprop {seen}")
            grads = [(sig[0], p.backend) for sig, p in plans._PLANS.items()
                     if sig[0] in ("dgrad", "wgrad") and sig[2] is not None
                     and sig[2][0] == inp.shape]
            print(f"    grad plans for this input shape: {grads}")
    print(f"{bad} layers over 3x torch's error")
    torch.backends.cudnn.allow_tf32 = True


def _train_grads(m, inp, res, seed, kind):
    """[z, dx, dw, dγ, dβ(, dres)] of one layer for the upstream gradient randn(seed):
    ``kind`` "fast" (a copy of the fastconv module), "torch" (torch modules, float32) or
    "f64" (torch modules, float64)."""
    dtype = torch.float64 if kind == "f64" else torch.float32
    xi = inp.to(dtype).detach().requires_grad_()
    ri = None if res is None else res.to(dtype).detach().requires_grad_()
    if kind == "fast":
        mod = copy.deepcopy(m)
        z = mod(xi, ri)
        params = [mod.weight, mod.bn.weight, mod.bn.bias]
    else:
        conv, bn, act = m.to_torch().to(dtype)
        y = bn(conv(xi))
        z = act(y if ri is None else y + ri)
        params = [conv.weight, bn.weight, bn.bias]
    torch.manual_seed(seed)
    dz = torch.randn(z.shape, device=z.device, dtype=torch.float64).to(dtype)
    wrt = [xi, *params] + ([ri] if ri is not None else [])
    return [z, *torch.autograd.grad(z, wrt, dz)]


def _compare(fast, theirs, truth):
    """Cells "fastconv error/torch error" per tensor, and whether any is over 3x torch's."""
    cells, flag = [], False
    for a, b, t in zip(fast, theirs, truth):
        ef, et = relative_error(a.double(), t), relative_error(b.double(), t)
        flag |= ef > 3 * max(et, 1e-7)
        cells.append(f"{ef:8.1e}/{et:8.1e}")
    return cells, flag


def host():
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = models._deeplab().cuda().eval()
    x = torch.randn(1, 3, 512, 512, device="cuda")
    fast = optimize(model, "inference", "bf16")
    ref = copy.deepcopy(model).to(memory_format=torch.channels_last)
    xl = x.contiguous(memory_format=torch.channels_last)

    def torch_run():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return ref(xl)
    with torch.no_grad():
        for fn in (lambda: fast(x), torch_run):
            for _ in range(3):
                fn()
    torch.cuda.synchronize()
    backends = collections.Counter(p.backend for p in plans._PLANS.values())
    print(f"\n== host: cached plans by backend: {dict(backends)}")
    for label, fn in (("fastconv", lambda: fast(x)), ("torch", torch_run)):
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        print(f"\n-- {label} (5 forwards) --")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22))


def enqueue():
    """Host time to enqueue one inference forward (no synchronisation; the GPU queue does not
    fill at these sizes) against the GPU time of the call, DeepLab bf16 at batch 1 and 8,
    and the backends of the plans each batch size uses."""
    import time

    torch.manual_seed(0)
    model = models._deeplab().cuda().eval()
    fast = optimize(model, "inference", "bf16")
    print("\n== enqueue: host ms per forward (median of 10) vs GPU ms (events) ==")
    for batch in (1, 8):
        x = torch.randn(batch, 3, 512, 512, device="cuda")
        before = set(plans._PLANS)
        with torch.no_grad():
            for _ in range(3):
                fast(x)
            torch.cuda.synchronize()
            host, gpu = [], []
            for _ in range(10):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                t0 = time.perf_counter()
                start.record()
                fast(x)
                end.record()
                host.append((time.perf_counter() - t0) * 1e3)
                torch.cuda.synchronize()
                gpu.append(start.elapsed_time(end))
        new = [plans._PLANS[k].backend for k in set(plans._PLANS) - before]
        print(f"batch {batch}: host {sorted(host)[5]:.2f} ms, call {sorted(gpu)[5]:.2f} ms; "
              f"new plans by backend {dict(collections.Counter(new))}")


def determinism():
    """ResNet-18 training (strict fp32) twice on the same input, freed memory poisoned with
    NaN before each pass: parameters whose gradient holds NaN (an unwritten element read) or
    differs between the passes, for the Triton batch-norm passes and the torch-ops path."""
    import torchvision

    print("\n== determinism: resnet18 ieee, 2 passes, NaN-poisoned free memory ==")
    x = torch.randn(4, 3, 64, 64, device="cuda")
    torch.backends.cudnn.allow_tf32 = False
    for use_triton in (True, False):
        batchnorm.USE_TRITON = use_triton
        torch.manual_seed(0)
        fast = optimize(torchvision.models.resnet18().cuda().train(), "training", "ieee")
        passes = []
        for _ in range(2):
            poison = torch.full((2**28,), float("nan"), device="cuda")
            del poison
            fast(x).square().mean().backward()
            passes.append({n: p.grad.clone() for n, p in fast.named_parameters()})
            fast.zero_grad(set_to_none=True)
        nan = [n for n, g in passes[0].items() if not torch.isfinite(g).all()]
        diff = sorted(((relative_error(passes[1][n], g), n) for n, g in passes[0].items()
                       if n not in nan), reverse=True)[:4]
        print(f"bn {'triton' if use_triton else 'ops':6s}: NaN grads in {nan[:6]} "
              f"({len(nan)}); largest pass-to-pass differences "
              f"{[(n, f'{d:.1e}') for d, n in diff]}")
    batchnorm.USE_TRITON = True
    kinds = collections.Counter((sig[0], p.backend) for sig, p in plans._PLANS.items())
    print(f"plans by (op, backend): {dict(kinds)}")
    torch.backends.cudnn.allow_tf32 = True


if __name__ == "__main__":
    steps = [a for a in sys.argv[1:] if not a.startswith("-")] or ["layers", "train", "host"]
    if "layers" in steps:
        for p in ("tf32", "bf16"):
            layers(p)
    if "train" in steps:
        train()
    if "host" in steps:
        host()
    if "enqueue" in steps:
        enqueue()
    if "determinism" in steps:
        determinism()
