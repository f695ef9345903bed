"""What a candidate costs: its GPU time and its host time per call, back to back
(``time_costs``), and its GPU time replayed from a CUDA graph over operand copies larger than
the L2 cache (``time_graph_cost``, with ``rotation_count`` sets). Dispatch ranks candidates by
these (``dispatch`` module docstring); the bench sizes its input sets with ``rotation_count``.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable

import torch


def time_costs(fn: Callable[[], None], warmup: int = 5, batches: int = 7,
               per_batch: int = 8) -> tuple[float, float]:
    """``(GPU ms, host ms)`` per call of ``fn`` over ``batches`` of ``per_batch`` back-to-back
    calls: the median GPU time, the least host time (the host's noise only adds: one
    candidate's host time varied 2-4x between timings when it was the median). Each batch is
    queued behind a spinning kernel (``torch.cuda._sleep``) that outlasts the host's work, so
    the CUDA events around it time the GPU alone, and the wall clock of the calls is the
    host's time alone (it never waits for the GPU, unless ``fn`` synchronises: then its host
    time includes the wait, as it would in a program)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(per_batch):  # (the host runs ahead of the GPU, or the GPU waits for it)
        fn()
    first_guess = host_guess = (time.perf_counter() - start) * 1e3 / per_batch
    torch.cuda.synchronize()
    gpu, host = [], []
    for _ in range(batches):
        g, h = _queued_batch(fn, per_batch, host_guess)
        gpu.append(g)
        host.append(h)
        # a longer spin for a slower host, but bounded: a call of more launches than the
        # launch queue holds (cuDNN's fp32 grouped engines launch per group) blocks the host
        # until the spin ends, so its host time grew with the spin, and the spin with it,
        # doubling each batch (20-43 s to time one tf32 depthwise candidate of ~4 ms)
        host_guess = max(host_guess, min(h, HOST_GUESS_GROWTH * first_guess))
    return statistics.median(gpu), min(host)


#: How far a batch's host time may lengthen the next batch's spin in ``time_costs``, as a
#: multiple of the host time per call measured before the batches
HOST_GUESS_GROWTH = 2.0


def _queued_batch(fn: Callable[[], None], calls: int, host_guess: float) -> tuple[float, float]:
    """``(GPU ms, host ms)`` per call of ``calls`` calls queued behind a spinning kernel that
    outlasts ``host_guess`` ms of host work per call, twice over."""
    begin = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int((2 * calls * host_guess + 0.05) * _cycles_per_ms()))
    begin.record()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) * 1e3 / calls
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / calls, host


def time_probe(fn: Callable[[], None]) -> tuple[float, float]:
    """``(GPU ms, host ms)`` per call from one batch of two calls after a warm-up call, queued
    behind a spin as ``time_costs``' batches are: four calls against its 69, a first reading
    that tells a candidate far slower than the best timed so far (``dispatch.timing``'s
    ``SLOW_FACTOR``) without timing it in full."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    host_guess = (time.perf_counter() - start) * 1e3
    torch.cuda.synchronize()
    return _queued_batch(fn, 2, host_guess)


def time_host_cost(fn: Callable[[], None], host_guess: float, calls: int = 8) -> float:
    """Host ms per call of ``fn`` (already warm): one batch of ``time_costs``."""
    return _queued_batch(fn, calls, host_guess)[1]


#: Bytes the operand sets of a graph timing (and the bench's input sets) must exceed
#: together, twice over: H200's L2 cache (an over-estimate on smaller parts is harmless).
L2_BYTES = 60 * 2**20


def rotation_count(nbytes: int, most: int = 8) -> int:
    """How many operand sets of ``nbytes`` each to rotate over so that one pass through
    them moves more than twice the L2 cache (at most ``most``)."""
    return max(1, min(most, math.ceil(2 * L2_BYTES / max(nbytes, 1))))


#: GPU milliseconds of spinning queued ahead of a timed replay: more than the host takes to
#: submit it (tens of microseconds for a graph of 64 calls)
SUBMIT_MS = 0.2


def time_graph_cost(fn: Callable[[int], None], sets: int, gpu_ms: float,
                    replays: int = 5) -> float:
    """GPU ms per call of ``fn(k)`` (k: the operand set) replayed from one CUDA graph that
    rotates over ``sets`` sets: what a call costs inside a captured model, where no host
    time counts and operands arrive from memory rather than a warm L2 cache. ``gpu_ms``,
    the eager estimate, sizes the graph to about a millisecond of work (at most 64 calls).
    The median over ``replays``."""
    calls = sets * max(1, min(64 // sets, math.ceil(1.0 / max(gpu_ms, 1e-3) / sets)))
    for k in range(sets):  # every set once before capture (copies made, lazy state set)
        fn(k)
    graph = torch.cuda.CUDAGraph()
    stream = _side_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), generator_released_on_failure():
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            for i in range(calls):
                fn(i % sets)
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    times = []
    for _ in range(replays):
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        # the GPU spins while the host submits the replay, so the begin event does not
        # start the clock on a GPU waiting for the host (as time_costs' batches)
        torch.cuda._sleep(int(SUBMIT_MS * _cycles_per_ms()))
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / calls)
    return statistics.median(times)


@contextlib.contextmanager
def generator_released_on_failure():
    """A CUDA-graph capture in the block that fails leaves the current device's default
    random generator usable. torch (2.11) marks the generator as capturing when a capture
    begins and clears the mark only when ``capture_end`` succeeds: after a capture whose end
    raised (one invalidated by an operation a capture cannot hold), every random op on the
    device raised "Offset increment outside graph capture encountered unexpectedly". On
    failure one trivial capture is made and ended, which clears the mark on the generator's
    own state (graphs captured before keep advancing the same offsets), and the exception
    goes on."""
    try:
        yield
    except BaseException:
        try:
            scratch = torch.zeros(1, device="cuda")
            stream = _side_stream()
            stream.wait_stream(torch.cuda.current_stream())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream):
                # (thread-local: CUDA calls other threads make meanwhile are not refused)
                graph.capture_begin(capture_error_mode="thread_local")
                scratch.add_(1)
                graph.capture_end()
            torch.cuda.current_stream().wait_stream(stream)
        except Exception:  # (the capture's own failure is what the caller hears of)
            pass
        raise


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _side_stream() -> torch.cuda.Stream:
    """One capture stream per device (a new stream per capture would give the workspace
    pool, keyed by stream, a buffer per candidate)."""
    device = torch.cuda.current_device()
    stream = _SIDE_STREAMS.get(device)
    if stream is None:
        stream = _SIDE_STREAMS[device] = torch.cuda.Stream()
    return stream


_CYCLES_PER_MS: float | None = None


def _cycles_per_ms() -> float:
    """GPU clock cycles per millisecond of ``torch.cuda._sleep`` (measured once)."""
    global _CYCLES_PER_MS
    if _CYCLES_PER_MS is None:
        cycles = 2_000_000
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        begin.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _CYCLES_PER_MS = cycles / max(begin.elapsed_time(end), 1e-3)
    return _CYCLES_PER_MS
