"""Host time of one Triton kernel launch, GPU only: a trivial kernel with 3 and with 20
arguments, through Triton's ``kernel[grid]`` and through fastconv's cached launcher
(backends/triton/launch.py; skipped on a source tree without it), the batch-norm kernels
of backends/triton/bnstats.py, and a ConvBNAct training
step with the Triton passes against the torch-operations path; then cProfiles of 100
launches of the 20-argument kernel and of 100 training steps (where the time goes).

Usage: PYTHONPATH=src python benchmarks/launch_overhead.py
"""

import cProfile
import pstats
import time

import torch
import triton
import triton.language as tl

import fastconv
from fastconv import batchnorm
from fastconv.backends.triton import bnstats
from fastconv.nn import ConvBNAct2d


@triton.jit
def _small(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def _wide(x_ptr, y_ptr, n, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14,
          a15, a16, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n) + a0 + a16
    tl.store(y_ptr + offs, v, mask=offs < n)


def host_us(fn, reps=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
        torch.cuda.synchronize()
    return best * 1e6


x = torch.randn(4096, device="cuda")
y = torch.empty_like(x)
ints = list(range(1, 18))
small = lambda: _small[(4,)](x, y, 4096, BLOCK=1024)  # noqa: E731
wide = lambda: _wide[(4,)](x, y, 4096, *ints, BLOCK=1024)  # noqa: E731
print(f"triton launch, 3 args:   {host_us(small):6.1f} us")
print(f"triton launch, 20 args:  {host_us(wide):6.1f} us")
try:
    from fastconv.backends.triton.launch import launch
except ImportError:  # an older source tree
    launch = None
if launch is not None:
    small_l = lambda: launch(_small, (4,), x, y, 4096, BLOCK=1024)  # noqa: E731
    wide_l = lambda: launch(_wide, (4,), x, y, 4096, *ints, BLOCK=1024)  # noqa: E731
    print(f"fastconv launch(), 3 args:  {host_us(small_l):6.1f} us")
    print(f"fastconv launch(), 20 args: {host_us(wide_l):6.1f} us")
print(f"torch.add (reference):   {host_us(lambda: torch.add(x, 1, out=y)):6.1f} us")

t = torch.randn(32, 64, 56, 56, device="cuda", dtype=torch.bfloat16)
t = t.contiguous(memory_format=torch.channels_last)
gamma = torch.rand(64, device="cuda") + 0.5
beta = torch.randn(64, device="cuda")
stats = bnstats.forward_stats(t, gamma, beta, 1e-5, None, None, 0.1)
print(f"bn forward_stats, no plan (2 kernels + 2 empty): {host_us(lambda: bnstats.forward_stats(t, gamma, beta, 1e-5, None, None, 0.1)):6.1f} us")  # noqa: E501
print(f"bn apply, no plan (1 kernel):     {host_us(lambda: bnstats.apply(t, None, stats[3], stats[4], 'relu', 0.0)):6.1f} us")  # noqa: E501
plan = bnstats.passes(t, None, gamma, beta, None, None, "relu", 0.0,
                      bnstats.Finalize(True, True, False, 1e-5, 0.1))
print(f"bn forward_stats, plan:  {host_us(lambda: plan.forward_stats(t, gamma, beta, None, None)):6.1f} us")  # noqa: E501
print(f"bn apply, plan:          {host_us(lambda: plan.apply(t, None, stats[3], stats[4])):6.1f} us")  # noqa: E501

m = ConvBNAct2d(64, 64, 3, padding=1, device="cuda").to(torch.bfloat16)
m.bn.float()
m = m.to(memory_format=torch.channels_last)
xi = torch.randn(2, 64, 8, 8, device="cuda", dtype=torch.bfloat16,
                 requires_grad=True).contiguous(memory_format=torch.channels_last)


def step():
    out = m(xi)
    torch.autograd.grad(out, (xi, m.weight), torch.ones_like(out))


for use in (True, False):  # (eager calls take the fused passes only when asked to)
    batchnorm.USE_TRITON = batchnorm.FUSED_IN_EAGER = use
    print(f"ConvBNAct2d train step, tiny, {'triton' if use else 'torch ops'}: "
          f"{host_us(step, 100):6.1f} us")
batchnorm.USE_TRITON = True
seq = m.to_torch()
yi = torch.randn(2, 64, 8, 8, device="cuda", dtype=torch.bfloat16,
                 requires_grad=True).contiguous(memory_format=torch.channels_last)


def part(fn, wrt):
    def run():
        out = fn()
        torch.autograd.grad(out, wrt, torch.ones_like(out))
    return run


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, g):
        return g


xc = torch.randn(8, requires_grad=True)
parts = {
    "identity Function, CUDA": part(lambda: _Identity.apply(yi), (yi,)),
    "identity Function, CPU": part(lambda: _Identity.apply(xc), (xc,)),
    "BNActFunction forward only": lambda: batchnorm.BNActFunction.apply(
        yi, m.bn.weight, m.bn.bias, None, None, None, (0.1, 1e-5, "relu", 0.0, None)),
    "torch Sequential step": part(lambda: seq(xi), (xi, seq[0].weight)),
    "torch conv2d fwd+bwd": part(lambda: torch.nn.functional.conv2d(xi, m.weight, None, 1, 1),
                                 (xi, m.weight)),
    "fastconv conv2d fwd+bwd": part(lambda: fastconv.conv2d(xi, m.weight, None, 1, 1),
                                    (xi, m.weight)),
    "BNActFunction fwd+bwd": part(lambda: batchnorm.BNActFunction.apply(
        yi, m.bn.weight, m.bn.bias, None, None, None, (0.1, 1e-5, "relu", 0.0, None)), (yi,)),
    "ConvBNAct2d forward only": lambda: m(xi),
}
for name, fn in parts.items():
    print(f"{name:28} {host_us(fn, 100):7.1f} us")

bn_step = parts["BNActFunction fwd+bwd"]
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                        torch.profiler.ProfilerActivity.CUDA]) as tp:
    for _ in range(20):
        bn_step()
    torch.cuda.synchronize()
print("--- torch.profiler, 20 x BNActFunction fwd+bwd")
print(tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=22))

for what, fn in (("20-argument launch", wide), ("ConvBNAct2d train step", step)):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(100):
        fn()
    prof.disable()
    print(f"--- cProfile of 100 x {what}")
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
