"""The differential model fuzzer (model_fuzz.py) on fixed seeds: every check of each model,
against the original in float64. Longer runs: ``python tests/model_fuzz.py --count 500``."""

from __future__ import annotations

import pytest

import model_fuzz


def test_every_part_is_drawn_by_the_fixed_seeds():
    kinds = {k for seed in range(60) for k in model_fuzz.build(seed).kinds}
    assert kinds == set(model_fuzz.PARTS)


@pytest.mark.parametrize("first", range(0, 60, 10))
@pytest.mark.slow_after(2)
def test_models_match_the_original(first):
    failures = [line for seed in range(first, first + 10) for line in model_fuzz.run(seed)]
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 4])
def test_compiled_models_match_the_original(seed):
    assert not model_fuzz.run(seed, ["compile"])


def test_a_wrong_result_is_found(monkeypatch):
    """The fuzzer's own check: a copy that computes something else is reported."""
    import torch

    import fastconv

    original = fastconv.optimize

    def wrong(model, *args, **kwargs):
        fast = original(model, *args, **kwargs)
        with torch.no_grad():
            next(fast.parameters()).mul_(1.01)
        return fast

    monkeypatch.setattr(fastconv, "optimize", wrong)
    failures = model_fuzz.run(0, ["inference", "training"])
    assert len(failures) == 2 and all("relative error" in f for f in failures), failures
