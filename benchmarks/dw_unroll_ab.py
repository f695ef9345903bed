"""The Triton depthwise forward with its kernel rows unrolled (compile-time loop) against a
run-time row loop (depthwise.UNROLLED_TAPS), on convnext_tiny's stage-1 7x7 layer
(32x96x56x56), bf16 channels-last and fp32 NCHW: compile time of the first call and the
kernel's median time over 50 CUDA-event-timed calls, torch (cuDNN) beside.

    FASTCONV_DISPATCH=heuristic python benchmarks/dw_unroll_ab.py
"""

import statistics
import time

import torch
import torch.nn.functional as F

import fastconv
from fastconv.backends.triton import depthwise


def gpu_ms(fn, reps=50):
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


for dtype, layout in ((torch.bfloat16, torch.channels_last),
                      (torch.float32, torch.contiguous_format)):
    x = torch.randn(32, 96, 56, 56, device="cuda", dtype=dtype).contiguous(memory_format=layout)
    w = torch.randn(96, 1, 7, 7, device="cuda", dtype=dtype)
    b = torch.randn(96, device="cuda", dtype=dtype)
    with torch.no_grad():
        ref = gpu_ms(lambda: F.conv2d(x, w, b, 1, 3, 1, 96))
        for unrolled in (25, 49):
            depthwise.UNROLLED_TAPS = unrolled
            fastconv.functional.clear_plans()
            fastconv.dispatch.clear()
            start = time.perf_counter()
            fastconv.conv2d(x, w, b, padding=3, groups=96, backend="triton")
            torch.cuda.synchronize()
            first = time.perf_counter() - start
            ms = gpu_ms(lambda: fastconv.conv2d(x, w, b, padding=3, groups=96,
                                                backend="triton"))
            print(f"{dtype} rows {'unrolled' if unrolled == 49 else 'looped  '}: first call "
                  f"{first:5.1f} s, {ms * 1e3:6.1f} us (torch {ref * 1e3:6.1f} us)", flush=True)
