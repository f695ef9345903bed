"""What the cost model's pruning saves in compilation (issue 21): the Triton GEMM-tile
candidates of a few bench layers compiled for an H100 (sm_90) by a compile worker on this
machine, twice, each time into an empty Triton cache: every candidate, then only those the
default budget keeps (``dispatch.DEFAULT_BUDGET``'s candidates, ``cost.prune``). A tile
compiled for one layer serves the others (the kernel takes sizes at run time), so the
totals over the layers are what a process pays. No GPU is needed or used: the launches are
recorded (``compiles.collecting``) on CPU tensors of the layers' shapes.

    python benchmarks/prune_compile_cost.py [--keep 6]

Compile seconds depend on the machine (and on what else it runs); compare the two totals of
one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time

os.environ["TRITON_INTERPRET"] = "0"  # real compiles, not the interpreter
os.environ.setdefault("FASTCONV_COMPILE_WORKERS", "1")  # one job at a time: its own seconds

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402

from fastconv import dispatch  # noqa: E402
from fastconv.backends.triton import compiles, cost  # noqa: E402
from fastconv.backends.triton.backend import TritonBackend  # noqa: E402
from fastconv.problem import ConvProblem  # noqa: E402
from fastconv.tools.bench import suites  # noqa: E402

#: (suite, case, op): 1x1 and 3x3 layers at four sizes (the 7x7 one with split-K tiles), a
#: data gradient, and a channels-first conv1d (row tiles)
LAYERS = [("resnet50", "r50_l1_1x1_64_256", "fprop"),
          ("resnet50", "r50_l2_3x3_128_s2", "fprop"),
          ("resnet50", "r50_l3_1x1_1024_256", "fprop"),
          ("resnet50", "r50_l4_3x3_512", "fprop"),
          ("resnet50", "r50_l3_3x3_256", "dgrad"),
          ("seed002_conv1d", "seed002_c128_256", "fprop")]


def operands(case, op: str) -> tuple[ConvProblem, tuple]:
    """The layer's bf16 problem (as on a GPU: channels-last for rank 2) and CPU tensors of
    its shapes for the op's bound call."""
    x = torch.randn(case.n, case.c, *case.spatial).bfloat16()
    w = torch.randn(case.weight_shape()).bfloat16()
    if case.rank == 2:
        x, w = (t.contiguous(memory_format=torch.channels_last) for t in (x, w))
    problem = dataclasses.replace(ConvProblem.from_tensors(
        x, w, None, case.stride, case.padding, case.dilation, case.groups, rank=case.rank,
        precision="bf16"), device="cuda")
    if op == "dgrad":
        dy = torch.randn(problem.output_shape()).bfloat16()
        if case.rank == 2:
            dy = dy.contiguous(memory_format=torch.channels_last)
        return problem, (dy, w, None)
    return problem, (x, w, None, None, None, None, None)


def compile_all(layers: list, pick) -> tuple[float, int]:
    """Seconds to compile, into an empty Triton cache, the kernels of ``pick(problem, op,
    tiles)`` for every layer, and how many distinct kernels that was."""
    compiles._close()  # new workers, which take the new cache directory
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="prune-compile-")
    compiles._JOBS.clear()
    compiles._pool().submit(os.getpid).result()  # started (torch imported) before the clock
    start = time.perf_counter()
    jobs = []
    for problem, op, tiles, call in layers:
        for config in pick(problem, op, tiles):
            with compiles.collecting() as recorded:
                TritonBackend.bind(problem, config, op)(*call)
            jobs += recorded
    for job in jobs:
        job.result(timeout=1200)
    return time.perf_counter() - start, len({id(j) for j in jobs})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=int, default=dispatch.DEFAULT_BUDGET[2])
    args = ap.parse_args()
    torch.cuda.current_device = lambda: 0  # the launch path asks; nothing runs on a GPU
    driver.set_active(compiles._TargetDriver(GPUTarget("cuda", 90, 32)))
    layers = []
    for suite, name, op in LAYERS:
        case = next(c for c in suites.get(suite) if c.name == name)
        problem, call = operands(case, op)
        tiles = [c for c in TritonBackend.candidates(problem, op)
                 if isinstance(c, cost.TileConfig)]
        layers.append((problem, op, tiles, call))
        kept = cost.prune(problem, op, tiles, args.keep)[0]
        print(f"{name:<24} {op:<6} {len(tiles):>3} tiles, {len(kept)} kept: "
              + " ".join(c.name() for c in kept))
    print(f"Triton {__import__('triton').__version__}, sm_90 target, {os.cpu_count()} CPU "
          f"cores, {compiles.workers()} compile worker(s); keep {args.keep}", flush=True)
    every, n_every = compile_all(layers, lambda p, op, tiles: tiles)
    print(f"every candidate: {n_every} kernels in {every:.1f} s", flush=True)
    kept, n_kept = compile_all(layers, lambda p, op, tiles: cost.prune(p, op, tiles,
                                                                       args.keep)[0])
    print(f"kept ({args.keep} per layer): {n_kept} kernels in {kept:.1f} s "
          f"({kept / every:.2f} of the time, {n_kept / n_every:.2f} of the kernels)")
    compiles._close()


if __name__ == "__main__":
    main()
