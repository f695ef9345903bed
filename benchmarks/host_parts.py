"""Where a cached call's host microseconds go, layer by layer of fastconv's call path, on a
problem whose kernel takes a few microseconds (1x16x8x8, 16 -> 16, 3x3): torch's F.conv2d
and nn.Conv2d, then fastconv's plan alone (``plan.run``), the plan lookup alone
(``forward_plan``), the functional call and the module (no grad; and a training step of
a module with autograd against torch's module); then modules under bf16 autocast on a
float32 input (``autocast_rows``). Each row: min over 7 rounds of 300
back-to-back calls, the device synchronised around each round; the rows alternate, so the
host's drift hits them alike. Run on two source trees (PYTHONPATH) to compare them.

Usage: PYTHONPATH=src python benchmarks/host_parts.py
"""

import time

import torch
import torch.nn.functional as F

import fastconv
from fastconv import plans
from fastconv.spec import ConvCall


def per_call_us(fns: dict, calls: int = 300, rounds: int = 7, sync=None) -> dict:
    """Each ``fns`` row's us per call: min over ``rounds`` of ``calls`` back-to-back calls,
    rows alternating, ``sync`` (default: the CUDA device's) around each round."""
    sync = torch.cuda.synchronize if sync is None else sync
    for fn in fns.values():
        for _ in range(20):
            fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            sync()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            best[name] = min(best[name], (time.perf_counter() - start) / calls * 1e6)
    return best


def rows(dtype: torch.dtype, layout: torch.memory_format) -> dict:
    x = torch.randn(1, 16, 8, 8, device="cuda", dtype=dtype).contiguous(memory_format=layout)
    w = torch.randn(16, 16, 3, 3, device="cuda", dtype=dtype).contiguous(
        memory_format=layout)
    tmod = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False, device="cuda", dtype=dtype)
    fmod = fastconv.nn.Conv2d(16, 16, 3, padding=1, bias=False, device="cuda", dtype=dtype)
    for m in (tmod, fmod):
        m.to(memory_format=layout)
    args = (ConvCall(2, False, 1, 1, 1, 1, 0), x, w, None, None, None, None, None)
    with torch.no_grad():
        fastconv.conv2d(x, w, None, 1, 1)
        plan = plans.forward_plan(*args)
        fns = {
            "torch F.conv2d": lambda: F.conv2d(x, w, None, 1, 1),
            "torch nn.Conv2d": lambda: tmod(x),
            f"fastconv plan.run ({plan.backend})": lambda: plan.run(x, w, None, None, None,
                                                                    None, None),
            "fastconv forward_plan (lookup only)": lambda: plans.forward_plan(*args),
            "fastconv.conv2d": lambda: fastconv.conv2d(x, w, None, 1, 1),
            "fastconv.nn.Conv2d": lambda: fmod(x),
        }
        out = per_call_us(fns)
    xg = x.clone().requires_grad_()

    def step(m):
        return lambda: m(xg).sum().backward()
    out.update(per_call_us({"torch nn.Conv2d train step": step(tmod),
                            "fastconv.nn.Conv2d train step": step(fmod)}))
    return out


def autocast_rows(groups: int) -> dict:
    """The modules as a bf16 autocast model calls them: float32 parameters and a float32
    channels-last input (timm's ConvNeXt blocks end in a float32 residual add), cast by
    autocast (torch) or by the module's own casts (fastconv), 7x7 with ``groups``."""
    x = torch.randn(1, 16, 8, 8, device="cuda").contiguous(memory_format=torch.channels_last)
    kw = dict(padding=3, groups=groups, device="cuda")
    tmod = torch.nn.Conv2d(16, 16, 7, **kw).to(memory_format=torch.channels_last)
    fmod = fastconv.nn.Conv2d(16, 16, 7, **kw).to(memory_format=torch.channels_last)
    forced = fastconv.nn.Conv2d(16, 16, 7, backend="aten", **kw).to(
        memory_format=torch.channels_last)
    torch.backends.cudnn.benchmark = True  # as the bench runs torch

    def per_region(m):  # autocast entered per call, as a model's forward enters it
        def call():
            with torch.autocast("cuda", torch.bfloat16):
                return m(x)
        return call
    with torch.no_grad():
        out = per_call_us({"torch nn.Conv2d, autocast entered per call": per_region(tmod),
                           "fastconv.nn.Conv2d, autocast entered per call": per_region(fmod)})
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):  # one region: cached casts
        fmod(x)
        forced(x)
        plan = fmod._call_site().plan[1]
        xb = x.to(torch.bfloat16)
        wb, bb = fmod._cast_params(fmod.weight, fmod.bias, torch.bfloat16)
        geo = (1, 3, 1, groups)
        out.update(per_call_us({
            "torch nn.Conv2d": lambda: tmod(x),
            f"fastconv.nn.Conv2d ({plan.backend})": lambda: fmod(x),
            "fastconv.nn.Conv2d (backend=aten)": lambda: forced(x),
            "torch nn.Conv2d, bf16 input": lambda: tmod(xb),
            "fastconv.nn.Conv2d, bf16 input": lambda: fmod(xb),
            "fastconv plan.run, bf16 operands": lambda: plan.run(xb, wb, bb, None, None, None,
                                                                 None),
            "F.conv2d, bf16 operands": lambda: F.conv2d(xb, wb, bb, *geo),
            "F.conv2d, float32 input, bf16 weight": lambda: F.conv2d(x, wb, bb, *geo),
            "input cast alone (x.to(bf16))": lambda: x.to(torch.bfloat16),
            "input cast alone (x.bfloat16())": lambda: x.bfloat16()}))
    return out


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(), "fastconv", fastconv.__file__)
    for dtype, layout, name in ((torch.bfloat16, torch.channels_last, "bf16 channels-last"),
                                (torch.float32, torch.contiguous_format, "fp32 (tf32) NCHW")):
        result = rows(dtype, layout)
        base = result["torch F.conv2d"]
        print(f"\n{name}: host us per call (min of 7 x 300), and over torch's F.conv2d")
        for row, us in result.items():
            print(f"  {row:40s} {us:7.1f}  {us - base:+6.1f}")
    for groups in (16, 1):
        result = autocast_rows(groups)
        base = result["torch nn.Conv2d, autocast entered per call"]
        print(f"\nautocast bf16, float32 input, 7x7 groups={groups}: host us per call, and "
              f"over torch's nn.Conv2d (autocast entered per call)")
        for row, us in result.items():
            print(f"  {row:40s} {us:7.1f}  {us - base:+6.1f}")
