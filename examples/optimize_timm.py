"""A timm model through ``fastconv.optimize``, checked the way a user would check it: what was
fused, the output against a float64 run of the original (beside torch's own error in the same
precision), the original model's checkpoint loaded into the optimized copy and back, and on a
GPU the first call and the steady state of both, eager and replayed from a CUDA graph.

    python examples/optimize_timm.py [--model resnet50] [--batch 32] [--size 224]

On a CPU it runs the model in float32 at a small size (``--batch 2 --size 64`` by default)
and times nothing. timm builds the model with random weights: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import timm
import torch

import fastconv
from fastconv.precision import relative_error


def timed_ms(fn, reps: int = 20) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` calls (CUDA events; warm already)."""
    times = []
    for _ in range(reps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times)


def first_call_s(fn) -> float:
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    gpu = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet50", help="a timm model name")
    ap.add_argument("--batch", type=int, default=32 if gpu else 2)
    ap.add_argument("--size", type=int, default=224 if gpu else 64)
    args = ap.parse_args()
    device = "cuda" if gpu else "cpu"
    precision = "bf16" if gpu else "ieee"

    torch.manual_seed(0)
    model = timm.create_model(args.model, pretrained=False).eval().to(device)
    x = torch.randn(args.batch, 3, args.size, args.size, device=device)
    if gpu:
        torch.backends.cudnn.benchmark = True  # torch at its best, as the bench runs it
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)

    fast = fastconv.optimize(model, "inference", precision, channels_last=gpu)
    fused, eligible, total = fast.report.coverage()
    print(f"{args.model}: {fused} of {eligible} conv -> BatchNorm patterns fused "
          f"({total} convolutions)")

    with torch.no_grad():
        ref = copy.deepcopy(model).double()(x.double())
        with torch.autocast(device, torch.bfloat16, enabled=gpu):
            torch_first = first_call_s(lambda: model(x))
            theirs = model(x)
        fast_first = first_call_s(lambda: fast(x))
        ours = fast(x)
    print(f"error against float64: fastconv {relative_error(ours, ref):.2e}, "
          f"torch {relative_error(theirs, ref):.2e} ({precision})")

    # the optimized copy loads the original's checkpoint, and its own loads into the original
    fast.load_state_dict(model.state_dict())
    back = timm.create_model(args.model, pretrained=False).eval().to(device)
    back.load_state_dict(fast.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(),
                                                 model.state_dict().values()))
    print("state_dict: the original's checkpoint loads into the optimized model and back")

    if not gpu:
        print("no CUDA GPU found: nothing timed")
        return
    graphed = fastconv.optimize(model, "inference", "bf16", cuda_graph=True)
    with torch.no_grad():
        graphed(x)  # captured (the kernels still compiling are waited for first)
        with torch.autocast("cuda", torch.bfloat16):
            torch_ms = timed_ms(lambda: model(x))
        fast_ms, graph_ms = timed_ms(lambda: fast(x)), timed_ms(lambda: graphed(x))
    print(f"first call: torch {torch_first:.1f} s, fastconv {fast_first:.1f} s")
    print(f"eager: torch {torch_ms:.3f} ms, fastconv {fast_ms:.3f} ms "
          f"({torch_ms / fast_ms:.2f}x); fastconv CUDA graph {graph_ms:.3f} ms")


if __name__ == "__main__":
    main()
