"""How the bench times: batched CUDA events, CUDA-graph replays over rotated inputs, host
time per call, the GPU's measured ceilings, and the interleaved eager rounds of
:class:`GpuTimer`."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from ... import dispatch
from ...costs import generator_released_on_failure
from ...precision import DTYPE, Precision


def percentiles(times: list[float]) -> tuple[float, float, float]:
    """(p50, p20, p80) of ``times``."""
    q = statistics.quantiles(sorted(times), n=10, method="inclusive")
    return statistics.median(times), q[1], q[7]


def time_calls(fns: list[Callable[[], object]], reps: int, warmup: int = 5) -> list[float]:
    """Milliseconds of each of ``reps`` calls, cycling through ``fns`` (one per input set)."""
    for i in range(max(warmup, len(fns))):
        fns[i % len(fns)]()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fns[i % len(fns)]()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def time_graph(fns: list[Callable[[], object]], reps: int = 20, calls: int = 16) -> list[float]:
    """Milliseconds per call when ``calls`` calls (cycling through ``fns``) are captured in
    one CUDA graph and replayed ``reps`` times: the GPU time without host overhead."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as graph capture requires
        for i in range(3):
            # (choices still compiling run aten meanwhile; budget-cut ones wait to be timed)
            dispatch.finish_builds(upgrades=True)
            fns[i % len(fns)]()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with generator_released_on_failure(), torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        graph.replay()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / calls for s, e in zip(starts, ends)]


def time_host(fns: list[Callable[[], object]], calls: int = 300, rounds: int = 7) -> list[float]:
    """Microseconds per call of ``calls`` back-to-back calls (cycling through ``fns``), one
    value per round: wall clock, the device synchronised before and after each round. On a
    problem whose kernels take a few microseconds this is the host's cost per call."""
    cuda = torch.cuda.is_available()
    out = []
    for _ in range(rounds):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(calls):
            fns[i % len(fns)]()
        if cuda:
            torch.cuda.synchronize()
        out.append((time.perf_counter() - start) / calls * 1e6)
    return out


def measure_ceilings(precision: Precision) -> dict[str, float]:
    """The GPU's matrix-product rate in ``precision`` and its copy bandwidth, measured."""
    n = 8192
    dtype = DTYPE[precision]
    a = torch.randn(n, n, device="cuda").to(dtype)
    b = torch.randn(n, n, device="cuda").to(dtype)
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == Precision.TF32
    try:
        ms = statistics.median(time_calls([lambda: a @ b], reps=20))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    src = torch.randn(256 * 2**20, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    copy_ms = statistics.median(time_calls([lambda: dst.copy_(src)], reps=20))
    return {f"{precision.value}_tflops": 2 * n**3 / ms / 1e9,
            "hbm_gbps": 2 * src.numel() * 4 / copy_ms / 1e6,
            "cuda_core_tflops": cuda_core_tflops()}


def cuda_core_tflops() -> float:
    """The CUDA cores' fp32 FMA rate (2 FLOP each), measured: the compute ceiling of work
    that runs no tensor-core instruction (depthwise convolutions)."""
    from .ceiling_kernels import fma_chains

    block, iters, chains = 256, 4096, 8
    grid = 64 * torch.cuda.get_device_properties(torch.cuda.current_device()) \
        .multi_processor_count
    out = torch.empty(grid * block, device="cuda")
    ms = statistics.median(time_graph(
        [lambda: fma_chains[(grid,)](out, ITERS=iters, BLOCK=block, num_warps=8)],
        reps=10, calls=2))
    return 2 * grid * block * iters * chains / ms / 1e9


def torch_cudnn_flags(precision: Precision) -> tuple[bool, bool]:
    """Set cuDNN's flags as the bench runs torch (TF32 for tf32 only, cudnn.benchmark's
    search on); the flags before, for :func:`restore_cudnn_flags`."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark
    torch.backends.cudnn.allow_tf32 = precision == Precision.TF32
    torch.backends.cudnn.benchmark = True
    return saved


def restore_cudnn_flags(saved: tuple[bool, bool]) -> None:
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved


#: Interleaved rounds of the providers' eager timings (``GpuTimer.eager_rounds``).
ROUNDS = 5


class GpuTimer:
    """Eager and CUDA-graph timings of a list of calls (see the module docstring)."""

    def eager(self, fns: list[Callable[[], object]], reps: int) -> list[float]:
        return time_calls(fns, reps)

    def eager_rounds(self, fns: dict[str, list[Callable[[], object]]], reps: int,
                     rounds: int = ROUNDS) -> dict[str, list[float]]:
        """``eager`` of each entry of ``fns`` (a provider's calls), ``reps`` calls each,
        in ``rounds`` interleaved rounds: the host of the GPU machines drifts by 10-30 %
        between processes and within one (torch's own call 23-33 us), and one provider's
        calls timed in one stretch read that drift as a difference between providers."""
        out: dict[str, list[float]] = {k: [] for k in fns}
        per_round = max(1, -(-reps // rounds))
        keys = list(fns)
        for r in range(rounds):
            for k in keys[r % len(keys):] + keys[:r % len(keys)]:  # each first in turn
                out[k] += self.eager(fns[k], per_round)
        return out

    def graph(self, fns: list[Callable[[], object]]) -> list[float] | None:
        try:  # (fastconv's dispatch ranks by GPU time alone for a graph)
            with dispatch.settings(graph=True):
                return time_graph(fns)
        except Exception:  # not capturable: eager timings only
            return None
