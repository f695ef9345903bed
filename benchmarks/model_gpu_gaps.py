"""Where an eager model forward leaves the GPU idle (GPU): torch's model and the
``fastconv.optimize``'d one (built as ``model_host_profile.model_pair`` builds them), each
warmed up, then ``--calls`` back-to-back forwards under torch.profiler. Per model: kernels
per forward, the kernels' busy time and the span from the first kernel's start to the last
one's end (per forward), the CUDA runtime calls that can block the host (synchronisations,
copies, allocations) with their counts, and the largest idle gaps between consecutive
kernels with the kernel that ended each gap (what the GPU waited for the host to launch).

    PYTHONPATH=src python benchmarks/model_gpu_gaps.py timm_convnext_tiny [--precision tf32]
"""

import argparse
import collections

import torch
from model_host_profile import model_pair
from torch.profiler import ProfilerActivity, profile

import fastconv

#: runtime calls that can stall the host or the stream
BLOCKING = ("Synchronize", "Memcpy", "Malloc", "Free", "EventQuery", "HostAlloc")


def trace(fn, x, calls: int):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(x)
        torch.cuda.synchronize()
    kernels, runtime = [], collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels.append((e.time_range.start, e.time_range.end, e.name))
        elif e.name.startswith(("cuda", "cu")) and any(b in e.name for b in BLOCKING):
            runtime[e.name] += 1
    kernels.sort()
    return kernels, runtime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "tf32", "ieee"))
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--gaps", type=int, default=12, help="how many of the largest gaps")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True  # as the models bench runs both
    for name in args.models:
        _, x, torch_fn, fast = model_pair(name, args.batch, args.precision)
        with torch.no_grad():
            for fn in (torch_fn, fast):
                for _ in range(3):
                    fn(x)
                fastconv.dispatch.finish_builds(upgrades=True)
                for _ in range(3):
                    fn(x)
            for who, fn in (("torch", torch_fn), ("fastconv", fast)):
                kernels, runtime = trace(fn, x, args.calls)
                busy = sum(end - start for start, end, _ in kernels) / args.calls / 1e3
                span = (kernels[-1][1] - kernels[0][0]) / args.calls / 1e3
                print(f"{name} {args.precision} {who}: {len(kernels) / args.calls:.0f} kernels "
                      f"per forward, busy {busy:.3f} ms, span {span:.3f} ms per forward "
                      f"(idle {span - busy:.3f})")
                print("  blocking runtime calls per forward: " + (", ".join(
                    f"{k} {n / args.calls:g}" for k, n in runtime.most_common()) or "none"))
                gaps = collections.Counter()
                for (_, end, _), (start, _, kernel) in zip(kernels, kernels[1:]):
                    if start > end:
                        gaps[kernel[:70]] += start - end
                print(f"  idle time before each kernel name, us per forward, top {args.gaps}:")
                for kernel, us in gaps.most_common(args.gaps):
                    print(f"    {us / args.calls:8.1f}  {kernel}")


if __name__ == "__main__":
    main()
