"""In-process A/B of the two per-plan launch paths of issue 20 (one process, rounds
alternated, so the host's drift between processes does not enter the ratio):

* a Triton tile forward plan's prepared launch (fprop.prepare_fprop) against the cached
  launcher path it replaced (``launch()`` with its per-call key), forced Triton;
* a cuDNN plan executed by ``tensor_uids`` (an ordered tuple) against a {uid: tensor} dict,
  forced cuDNN;

beside torch's F.conv2d, on a tiny bf16 channels-last 1x16x8x8 3x3 convolution (+ bias +
ReLU for Triton): host µs per call = wall time of back-to-back calls, median of rounds.

    python benchmarks/host_launch_ab.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import fastconv
from fastconv import plans
from fastconv.backends import cudnn
from fastconv.backends.triton import fprop


def per_call_us(fn, calls: int = 300) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    rounds = ap.parse_args().rounds
    cl = torch.channels_last
    x = torch.randn(1, 16, 8, 8, device="cuda", dtype=torch.bfloat16).to(memory_format=cl)
    w = torch.randn(16, 16, 3, 3, device="cuda", dtype=torch.bfloat16).to(memory_format=cl)
    b = torch.randn(16, device="cuda", dtype=torch.bfloat16)
    unprepared = lambda *a, **k: (fprop.launch_fprop(*a, **k), None)[1]  # noqa: E731
    prepared = fprop.prepare_fprop

    def triton(prepare):
        def setup():
            fprop.prepare_fprop = prepare  # what the plan made next binds
        return setup, lambda: fastconv.conv2d(x, w, b, padding=1, activation="relu",
                                              backend="triton", dispatch="heuristic")

    def cudnn_call(ordered):
        def call():
            return fastconv.conv2d(x, w, padding=1, backend="cudnn", dispatch="heuristic")

        def setup():
            call()  # the plan, then its graph's execution path
            for g in cudnn._GRAPHS.values():
                g.ordered = ordered
        return setup, call

    def nothing():
        pass

    variants = {"torch F.conv2d": (nothing, lambda: F.conv2d(x, w, padding=1)),
                "torch F.conv2d + bias + relu": (
                    nothing, lambda: F.relu(F.conv2d(x, w, b, padding=1))),
                "triton, launch() per call": triton(unprepared),
                "triton, prepared launch": triton(prepared),
                "cudnn, {uid: tensor} dict": cudnn_call(False),
                "cudnn, tensor_uids tuple": cudnn_call(True)}
    results: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name, (setup, fn) in variants.items():
            plans.clear_plans()  # each variant's plan made under its own launch path
            setup()
            for _ in range(20):
                fn()
            results[name].append(per_call_us(fn))
    fprop.prepare_fprop = prepared
    ref = F.conv2d(x.double(), w.double(), padding=1)
    y = fastconv.conv2d(x, w, padding=1, backend="cudnn", dispatch="heuristic")
    print(f"cudnn error {float((y.double() - ref).norm() / ref.norm()):.2e}; {rounds} rounds "
          f"x 300 calls, median (min)")
    for name, times in results.items():
        print(f"{name:32s} {statistics.median(times):7.2f} us  ({min(times):6.2f})")


if __name__ == "__main__":
    main()
