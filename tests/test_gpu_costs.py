"""GPU: dispatch's first reading of a candidate (``costs.time_probe``) against its full timing
(``costs.time_costs``), and a candidate that cannot win left at that reading
(``dispatch.timing.time_row``), on real kernels of known relative cost."""

import time

import pytest
import torch

from fastconv.dispatch import timing

pytestmark = pytest.mark.gpu


@pytest.fixture
def matmuls():
    """``run(cls, n)``: n bf16 2048² matmuls per call (each ~30 µs on an H100), so that
    candidate n costs n times candidate 1 on the GPU."""
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)

    def run(cls, n):
        for _ in range(n):
            a @ a
    return run


def test_a_first_reading_agrees_with_the_full_timing(matmuls):
    from fastconv import costs
    for n in (1, 40):
        probe, _ = costs.time_probe(lambda n=n: matmuls(None, n))
        full, _ = costs.time_costs(lambda n=n: matmuls(None, n))
        assert probe == pytest.approx(full, rel=0.3), (n, probe, full)


def test_a_candidate_that_cannot_win_is_left_at_its_first_reading(matmuls):
    fast = timing.Row("aten", 1)
    timing.time_row(fast, matmuls)
    assert fast.timed and not fast.once and fast.note == ""
    slow = timing.Row("aten", 60)
    start = time.perf_counter()
    timing.time_row(slow, matmuls, [fast])
    probed_s = time.perf_counter() - start
    assert slow.once and slow.note.startswith("timed once") and slow.graph_ms is None
    assert slow.gpu_ms >= timing.SLOW_MIN_MS
    assert slow.gpu_ms == pytest.approx(60 * fast.gpu_ms, rel=0.35)
    near = timing.Row("aten", 2)  # 2x the best: it could win on a noisy day, timed in full
    timing.time_row(near, matmuls, [fast, slow])
    assert near.timed and not near.once and near.note == ""
    full = timing.Row("aten", 60)  # the same candidate timed in full: ~75 calls, not 4
    start = time.perf_counter()
    timing.time_row(full, matmuls)
    assert not full.once and probed_s < (time.perf_counter() - start) / 5
