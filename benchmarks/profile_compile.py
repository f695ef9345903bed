"""Where the GPU time of a compiled model goes: torch.compile(model) against
torch.compile(fastconv.optimize(model)), both mode="reduce-overhead" (issue 25), bf16
channels-last inference. Prints, per variant, the median replay time and the CUDA kernels
of 5 calls grouped by name (count per call, µs per call), the largest first.

    python benchmarks/profile_compile.py [timm model name] [batch] [--combo] [--no-ops] [--train]

--train profiles a training step (forward + backward, default mode: torch.compile against
fastconv.compile) instead of reduce-overhead inference.

--combo sets Inductor's combo_kernels (independent small kernels, such as the per-layer
BatchNorm folds of an optimized model, fused horizontally) for both variants.
"""

from __future__ import annotations

import sys
import time

import torch

import fastconv

flags = [a for a in sys.argv[1:] if a.startswith("--")]
args = [a for a in sys.argv[1:] if not a.startswith("--")]
name = args[0] if args else "resnet50"
batch = int(args[1]) if len(args) > 1 else 32
if "--combo" in flags:
    import torch._inductor.config

    torch._inductor.config.combo_kernels = True
import timm  # noqa: E402  (carried wheel on the device)
from timm_steps import kernels_by_name  # noqa: E402

torch.backends.cudnn.benchmark = True
torch.manual_seed(0)
TRAIN = "--train" in flags
model = timm.create_model(name, pretrained=False).cuda().train(TRAIN)
x = torch.randn(batch, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)


def torch_variant():
    net = model.to(memory_format=torch.channels_last)
    compiled = torch.compile(net, mode=None if TRAIN else "reduce-overhead")

    def call():
        with torch.set_grad_enabled(TRAIN), torch.autocast("cuda", torch.bfloat16):
            y = compiled(x)
        if TRAIN:
            y.float().square().mean().backward()
        return y
    return call


def fastconv_variant():
    compiled = fastconv.compile(model, "bf16", mode=None if TRAIN else "reduce-overhead")

    def call():
        with torch.set_grad_enabled(TRAIN):
            y = compiled(x)
        if TRAIN:
            y.float().square().mean().backward()
        return y
    return call


SUFFIX = "" if TRAIN else "_ro"
VARIANTS = (("torch_compile" + SUFFIX, torch_variant),
            ("fastconv_compile" + SUFFIX, fastconv_variant))
for label, build in VARIANTS:
    start = time.perf_counter()
    call = build()
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    times = []
    for _ in range(30):
        t0 = torch.cuda.Event(enable_timing=True)
        t1 = torch.cuda.Event(enable_timing=True)
        t0.record()
        call()
        t1.record()
        torch.cuda.synchronize()
        times.append(t0.elapsed_time(t1))
    times.sort()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            call()
        torch.cuda.synchronize()
    kernels = kernels_by_name(prof)
    total = sum(v[1] for v in kernels.values()) / 5
    count = sum(v[0] for v in kernels.values()) / 5
    print(f"== {label} {name} b{batch}: {times[len(times) // 2]:.3f} ms per call (median of "
          f"30), first calls {first:.1f} s; kernels per call {count:.0f}, "
          f"kernel time {total / 1000:.3f} ms")
    for kname, (n, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:25]:
        print(f"  {n / 5:5.1f} x {us / 5:8.1f} us  {kname}")
    torch._dynamo.reset()

if "--no-ops" in flags or TRAIN:
    sys.exit(0)
# What fastconv's op receives from Inductor (strides, dtypes) and which eager ops run inside
# it: compile's default mode (no CUDA graphs), one call under the profiler.
from fastconv import ops  # noqa: E402

seen = {}
inner = ops.conv_impl


def logged(input, weight, bias, scale, shift, residual, *rest):
    key = tuple((tuple(t.shape), t.stride(), str(t.dtype)[6:]) if t is not None else None
                for t in (input, weight, bias, residual))
    seen[key] = seen.get(key, 0) + 1
    return inner(input, weight, bias, scale, shift, residual, *rest)


ops.conv_impl = logged
compiled = torch.compile(fastconv.optimize(model, precision="bf16"))
with torch.no_grad():
    compiled(x)
    compiled(x)
    seen.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=True) as prof:
        compiled(x)
print("== fastconv::conv inputs under compile (input, weight, bias, residual): shape, stride, "
      "dtype")
for key, n in seen.items():
    print(f"  {n} x {key}")
print(prof.key_averages(group_by_input_shape=True).table(sort_by="count", row_limit=25,
                                                         max_name_column_width=40))
