"""time_costs on a simulated GPU (CPU only): the spin queued ahead of each batch stays
bounded when a call fills the launch queue, and the GPU time it reports is the call's."""

import types

import pytest
import torch

from fastconv import costs


class FakeGPU:
    """One stream: the host clock (ms), the time the GPU's queued work ends, and calls of
    ``gpu_ms`` that cost the host ``host_ms`` each, and whose launches fill the launch queue
    where ``queue_bound`` (the host waits until the queue holds at most one call's work)."""

    def __init__(self, gpu_ms: float, host_ms: float, queue_bound: bool):
        self.clock = self.gpu_end = 0.0
        self.gpu_ms, self.host_ms, self.queue_bound = gpu_ms, host_ms, queue_bound
        self.slept = 0.0

    def call(self):
        if self.queue_bound:
            self.clock = max(self.clock, self.gpu_end - self.gpu_ms)
        self.clock += self.host_ms
        self.gpu_end = max(self.gpu_end, self.clock) + self.gpu_ms

    def sleep(self, cycles):
        self.slept += cycles / 1000.0
        self.gpu_end = max(self.gpu_end, self.clock) + cycles / 1000.0

    def synchronize(self):
        self.clock = max(self.clock, self.gpu_end)

    def event(self, **_):
        gpu = self

        class Event:
            def record(self):
                self.at = max(gpu.gpu_end, gpu.clock)

            def synchronize(self):
                gpu.synchronize()

            def elapsed_time(self, end):
                return end.at - self.at
        return Event()


@pytest.fixture
def gpu(monkeypatch, request):
    fake = FakeGPU(*request.param)
    monkeypatch.setattr(costs, "time", types.SimpleNamespace(perf_counter=lambda: fake.clock
                                                             / 1e3))
    monkeypatch.setattr(costs, "_cycles_per_ms", lambda: 1000.0)
    monkeypatch.setattr(torch.cuda, "_sleep", fake.sleep)
    monkeypatch.setattr(torch.cuda, "synchronize", fake.synchronize)
    monkeypatch.setattr(torch.cuda, "Event", fake.event)
    return fake


@pytest.mark.parametrize("gpu", [(4.0, 0.05, True)], indirect=True)
def test_a_call_that_fills_the_launch_queue_is_timed_in_bounded_time(gpu):
    gpu_ms, host_ms = costs.time_costs(gpu.call)
    assert gpu_ms == pytest.approx(4.0)
    assert host_ms >= 4.0  # the host waited for the GPU: its time says so
    # 69 calls of 4 ms, and 7 spins of at most 2 x 8 calls x 2 x 4 ms (the spin doubled
    # each batch before the bound: 11.9 s of spinning in this simulation)
    assert gpu.slept <= 7 * 2 * 8 * 2.0 * 4.0 + 1
    assert gpu.clock < 69 * 4.0 + gpu.slept + 1


@pytest.mark.parametrize("gpu", [(0.02, 0.3, False)], indirect=True)
def test_a_host_bound_call_reports_its_gpu_and_host_time(gpu):
    gpu_ms, host_ms = costs.time_costs(gpu.call)
    assert gpu_ms == pytest.approx(0.02)
    assert host_ms == pytest.approx(0.3)


@pytest.mark.parametrize("gpu", [(40.0, 0.05, False), (0.02, 0.3, False)], indirect=True)
def test_a_first_reading_takes_four_calls_and_reads_the_calls_gpu_and_host_time(gpu):
    calls = []
    gpu_ms, host_ms = costs.time_probe(lambda: calls.append(gpu.call()))
    assert len(calls) == 4
    assert gpu_ms == pytest.approx(gpu.gpu_ms) and host_ms == pytest.approx(gpu.host_ms)
