"""A loop over a suite's layers as a training or inference loop runs them (each layer's
forward once per round, bf16, default tuning budget), until no layer's choice is
provisional any more: the time of the first round (the first calls), the time until every
layer's background builds were built and timed, and the final choices (stored in the plan
cache, which a later `fastconv bench` with the same FASTCONV_CACHE_DIR then uses). Run with
FASTCONV_TUNING_DB=off to see what a process without database entries reaches (issue 21).

    python benchmarks/upgrade_check.py SUITE [--timeout S]
"""

from __future__ import annotations

import argparse
import time

import torch

from fastconv import ConvProblem, dispatch
from fastconv.epilogue import Epilogue
from fastconv.precision import Precision
from fastconv.tools.bench import runner, suites


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("suite")
    ap.add_argument("--timeout", type=float, default=240.0)
    args = ap.parse_args()
    cases = suites.get(args.suite)
    calls = []
    for case in cases:
        layout = "nhwc" if case.rank == 2 else "nchw"  # as `fastconv bench` does for bf16
        t = runner._input_sets(case, Precision.BF16, layout, "fwd")[0]
        problem = ConvProblem.from_tensors(   # as runner.run_case makes it
            t["x"], t["w"], t["b"], case.stride, case.padding_arg(), case.dilation,
            case.groups, rank=case.rank, precision="bf16",
            epilogue=Epilogue(activation=case.activation, has_shift=case.bias))
        calls.append((case, problem, runner._call("fastconv", case, Precision.BF16, t, "fwd")))
    start = time.perf_counter()
    rounds, first_round = 0, None
    while True:
        for *_, call in calls:
            call()
        torch.cuda.synchronize()
        rounds += 1
        if first_round is None:
            first_round = time.perf_counter() - start
        pending = len({u.keys[0] for u in dispatch._UPGRADES.values()})
        elapsed = time.perf_counter() - start
        if rounds == 1 or pending == 0 or rounds % 50 == 0:
            print(f"round {rounds}: {elapsed:.1f} s, {pending} problems still building",
                  flush=True)
        if pending == 0 or elapsed > args.timeout:
            break
        time.sleep(0.05)
    print(f"{args.suite}: first round {first_round:.1f} s; every choice final after "
          f"{elapsed:.1f} s ({rounds} rounds)" if pending == 0 else
          f"{args.suite}: first round {first_round:.1f} s; {pending} still building after "
          f"{elapsed:.1f} s")
    for case, problem, _ in calls:
        print(f"  {case.name:<24} {runner._choices(problem, 'auto', 'fwd')}")


if __name__ == "__main__":
    main()
