"""``fastconv tune`` on the CPU: its arguments, its refusal without a GPU, and that it lifts
the tuning budget (benchmark mode) only for its own calls."""

from __future__ import annotations

import pytest
import torch

import fastconv
from fastconv import cli, dispatch, tune


def test_a_model_name_that_does_not_exist_lists_the_known_ones():
    with pytest.raises(fastconv.ConvError, match="model: got 'nope'; expected one of .*"
                                                 "timm_resnet50.*timm:<name>"):
        tune.build("nope")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only refusal")
def test_without_a_gpu_it_refuses_clearly(capsys):
    with pytest.raises(fastconv.ConvError, match="no GPU found"):
        tune._exhaustively(lambda: None, "x")
    assert cli.main(["tune", "--suite", "resnet50"]) == 1
    assert "No CUDA GPU found" in capsys.readouterr().out
    assert cli.main(["tune"]) == 2
    assert "--model NAME or --suite NAME" in capsys.readouterr().out


def test_the_budget_is_lifted_for_the_tuning_calls_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    budget = dispatch.TuningBudget(1.0, 8.0)
    monkeypatch.setattr(dispatch, "TUNING", budget)
    seen = []

    def step():
        seen.append((dispatch.TUNING.exhaustive, dispatch.current()[0]))
    done = tune._exhaustively(step, "a step")
    assert seen == [(True, "benchmark")] and done["what"] == "a step"
    assert dispatch.TUNING is budget and dispatch.current()[0] is None

    def failing():
        raise RuntimeError("out of memory")
    with pytest.raises(RuntimeError):
        tune._exhaustively(failing, "a failing step")
    assert dispatch.TUNING is budget  # restored on the way out too
