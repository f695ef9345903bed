"""Timing convolutions on the GPU: providers, rotating inputs, CUDA events, medians.

Each (case, provider) is timed twice after a warm-up that includes any compilation and
autotuning: eagerly, the way triton.testing.do_bench does it (a CUDA event pair around every
call, no synchronisation between calls, the median of ``reps``; host overhead included when
the host is the bottleneck), and as replays of a CUDA graph of the same calls (GPU time
alone: ``graph_ms_p50``). torch.compile rows exclude compilation and report its duration
(``compile_s``, the first call). Small problems rotate over several
input sets whose total size exceeds the L2 cache, so the cache cannot flatter them. Inputs
are random normal values, never zeros.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .. import dispatch, functional
from ..epilogue import Epilogue
from ..precision import DTYPE, Precision, relative_error
from ..problem import ConvProblem
from .suites import BenchCase

PROVIDERS = ("fastconv", "fastconv_triton", "torch", "torch_compile")
#: Providers named in DESIGN.md that cannot run yet, with the reason shown when skipped.
UNAVAILABLE = {"cudnn_fe": "the cuDNN frontend backend does not exist yet (its own issue)"}
_L2_BYTES = 60 * 2**20  # H200's L2; an over-estimate on smaller parts is harmless


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
            fns[i % len(fns)]()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
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
            "hbm_gbps": 2 * src.numel() * 4 / copy_ms / 1e6}


class GpuTimer:
    """Eager and CUDA-graph timings of a list of calls (see the module docstring)."""

    def eager(self, fns: list[Callable[[], object]], reps: int) -> list[float]:
        return time_calls(fns, reps)

    def graph(self, fns: list[Callable[[], object]]) -> list[float] | None:
        try:
            return time_graph(fns)
        except Exception:  # not capturable: eager timings only
            return None


def _input_sets(case: BenchCase, precision: Precision, layout: str,
                device: str = "cuda") -> list[dict]:
    dtype = DTYPE[precision]
    one = (case.n * case.c * math.prod(case.spatial) + case.k * case.c // case.groups *
           math.prod(case.kernel)) * torch.empty((), dtype=dtype).element_size()
    count = max(1, min(8, math.ceil(2 * _L2_BYTES / one))) if device == "cuda" else 1
    sets = []
    for _ in range(count):
        x = torch.randn(case.n, case.c, *case.spatial, device=device).to(dtype)
        if layout == "nhwc" and case.rank == 2:
            x = x.contiguous(memory_format=torch.channels_last)
        fan_in = case.c // case.groups * math.prod(case.kernel)
        w = (torch.randn(case.k, case.c // case.groups, *case.kernel, device=device)
             / fan_in**0.5).to(dtype)
        if layout == "nhwc" and case.rank == 2:
            w = w.contiguous(memory_format=torch.channels_last)
        b = torch.randn(case.k, device=device).to(dtype) if case.bias else None
        sets.append(dict(x=x, w=w, b=b))
    return sets


def _torch_conv(case: BenchCase):
    """conv -> add bias -> activation, as a PyTorch user writes it."""
    tconv = F.conv1d if case.rank == 1 else F.conv2d
    geo = (case.stride, case.padding, case.dilation, case.groups)
    ep = Epilogue(activation=case.activation)

    def run(x, w, b):
        y = tconv(x, w, None, *geo)
        if b is None and case.activation == "none":
            return y
        return ep.apply(y, shift=b)
    return run


def _call(provider: str, case: BenchCase, precision: Precision, t: dict,
          compiled: dict | None = None) -> Callable[[], object]:
    if provider == "torch":
        fn = _torch_conv(case)
        return lambda: fn(t["x"], t["w"], t["b"])
    if provider == "torch_compile":  # one compiled function shared by every input set
        if compiled is None:
            compiled = {}
        fn = compiled.setdefault("fn", torch.compile(_torch_conv(case), dynamic=False))
        return lambda: fn(t["x"], t["w"], t["b"])
    conv = functional.conv1d if case.rank == 1 else functional.conv2d
    geo = (case.stride, case.padding, case.dilation, case.groups)
    backend = {"fastconv": "auto", "fastconv_triton": "triton"}[provider]
    return lambda: conv(t["x"], t["w"], t["b"], *geo, activation=case.activation,
                        backend=backend, precision=precision.value)


def _reference(case: BenchCase, t: dict) -> torch.Tensor:
    tconv = F.conv1d if case.rank == 1 else F.conv2d
    f64 = torch.float64
    b = t["b"].to(f64) if t["b"] is not None else None
    y = tconv(t["x"].to(f64), t["w"].to(f64), b, case.stride, case.padding, case.dilation,
              case.groups)
    return Epilogue(activation=case.activation).apply(y)


def run_case(case: BenchCase, providers: list[str], precision: Precision, layout: str,
             reps: int = 50, device: str = "cuda", timer=None) -> list[dict]:
    """Rows (DESIGN.md §7) for one case and every provider, measured in this process.

    ``timer`` (default: :class:`GpuTimer` on the GPU, none on the CPU) has ``eager(fns, reps)``
    and ``graph(fns)``; without one the rows carry errors only, marked ``timing: "not
    measured"``.
    """
    if timer is None and device == "cuda":
        timer = GpuTimer()
    sets = _input_sets(case, precision, layout, device)
    ref = _reference(case, sets[0])
    problem = ConvProblem.from_tensors(
        sets[0]["x"], sets[0]["w"], sets[0]["b"], case.stride, case.padding, case.dilation,
        case.groups, rank=case.rank, precision=precision.value,
        epilogue=Epilogue(activation=case.activation, has_shift=case.bias))
    rows = []
    cudnn_flags = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = precision == Precision.TF32
    try:
        for provider in providers:
            row = dict(case=case.name, provider=provider, precision=precision.value,
                       mode="fwd", layout=layout, flops=problem.flops(),
                       min_bytes=problem.min_bytes())
            compiled: dict = {}
            fns = [_call(provider, case, precision, t, compiled) for t in sets]
            try:
                start = time.perf_counter()
                first = fns[0]()  # compiles, autotunes or dispatches: kept out of the timing
                if provider == "torch_compile":
                    if device == "cuda":
                        torch.cuda.synchronize()
                    row["compile_s"] = time.perf_counter() - start
                row["rel_err"] = relative_error(first, ref)
                if timer is not None:
                    p50, p20, p80 = percentiles(timer.eager(fns, reps))
                    graph = timer.graph(fns)
                    row.update(ms_p50=p50, ms_p20=p20, ms_p80=p80,
                               tflops=problem.flops() / p50 / 1e9,
                               gbps=problem.min_bytes() / p50 / 1e6,
                               graph_ms_p50=statistics.median(graph) if graph else None)
                else:
                    row.update(ms_p50=None, ms_p20=None, ms_p80=None, tflops=None, gbps=None,
                               graph_ms_p50=None, timing="not measured (no GPU)")
            except Exception as exc:  # an unsupported provider is reported, not fatal
                row["error"] = f"{type(exc).__name__}: {exc}"
                rows.append(row)
                continue
            if provider.startswith("fastconv"):
                backend = "auto" if provider == "fastconv" else provider.split("_", 1)[1]
                hit = dispatch.cached(problem, backend)
                row["choice"] = hit.name() if hit else "?"
            rows.append(row)
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = cudnn_flags
    return rows
