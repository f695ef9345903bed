"""Where a call's host microseconds go: the exact call ``fastconv bench`` times for one case
of a suite (default: the ``host`` suite's plain conv), profiled with cProfile over many
cached calls. Prints the functions by their own time per call (microseconds), then the
cumulative view, so the dispatch, plan lookup, launch and autograd layers can be told apart.

cProfile inflates every Python function call by a similar fixed cost; read the shares, and
the wall-clock figure printed first (measured without the profiler), for the absolute cost.

Usage (GPU or CPU): PYTHONPATH=src python benchmarks/host_profile.py \
    [--case host_conv] [--provider fastconv] [--mode fwd|train] [--precision tf32|bf16|...]
"""

import argparse
import cProfile
import pstats
import statistics

import torch

from fastconv.precision import Precision
from fastconv.tools.bench import runner, suites


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="host")
    ap.add_argument("--case", default="host_conv")
    ap.add_argument("--provider", default="fastconv", choices=runner.PROVIDERS)
    ap.add_argument("--mode", default="fwd", choices=runner.MODES)
    ap.add_argument("--precision", default="tf32")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    torch.set_num_threads(1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    (case,) = [c for c in suites.get(args.suite) if c.name == args.case]
    prec = Precision(args.precision)
    layout = "nhwc" if prec in (Precision.BF16, Precision.FP16) else "nchw"
    sets = runner._input_sets(case, prec, layout, args.mode, device)
    fns = [runner._call(args.provider, case, prec, t, args.mode) for t in sets]
    wall = statistics.median(runner.time_host(fns))  # also the warm-up: plans cached
    print(f"{case.name} {args.mode} {prec.value} {layout} {args.provider} on {device}: "
          f"{wall:.1f} us per call (wall clock, no profiler)")
    prof = cProfile.Profile()
    prof.enable()
    for i in range(args.calls):
        fns[i % len(fns)]()
    if device == "cuda":
        torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = []
    for (file, line, name), (_, ncalls, tottime, cumtime, _) in stats.stats.items():
        where = f"{file.split('/site-packages/')[-1].split('/src/')[-1]}:{line}({name})"
        rows.append((tottime, cumtime, ncalls, where))
    for title, key in (("own time", 0), ("cumulative", 1)):
        print(f"\n{title}, us per call (calls per call), top {args.top}:")
        for r in sorted(rows, key=lambda r: -r[key])[:args.top]:
            print(f"{r[key] / args.calls * 1e6:8.2f} {r[2] / args.calls:6.1f}  {r[3]}")


if __name__ == "__main__":
    main()
