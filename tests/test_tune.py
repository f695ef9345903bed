"""``fastconv tune`` on the CPU: its arguments, its refusal without a GPU, and that it lifts
the tuning budget (benchmark mode) only for its own calls."""

from __future__ import annotations

import pytest
import torch

import fastconv
from fastconv import dispatch
from fastconv.tools import cli, tune


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
    assert "one of --model NAME, --suite NAME, or --shape" in capsys.readouterr().out


def test_the_budget_is_lifted_for_the_tuning_calls_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    budget = dispatch.TuningBudget(1.0, 8.0)
    monkeypatch.setattr(dispatch.budget, "TUNING", budget)
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


@pytest.mark.parametrize(("spec", "want"), [
    ("32x64x56x56:128x64x3x3:stride=2:padding=1",
     dict(n=32, c=64, k=128, spatial=(56, 56), kernel=(3, 3), stride=2, padding=1)),
    ("2x8x31:8x1x4:groups=8:causal=1:dilation=2",  # rank 1, depthwise, causal
     dict(c=8, k=8, spatial=(31,), kernel=(4,), groups=8, causal=True, dilation=2)),
    ("4x64x7x7:64x32x3x3:transposed=1:groups=2:stride=2:padding=1:output_padding=1:bias=1"
     ":activation=relu",  # transposed: the weight is (C_in, C_out / groups, ...)
     dict(c=64, k=64, transposed=True, groups=2, output_padding=1, bias=True,
          activation="relu")),
])
def test_a_shape_spec_gives_its_convolution(spec, want):
    case = tune.parse_shape(spec)
    assert case.name == spec and {k: getattr(case, k) for k in want} == want


@pytest.mark.parametrize(("spec", "match"), [
    ("32x64x56x56", "expected INPUT:WEIGHT"),
    ("axb:8x3x3x3", "sizes >= 1 joined by 'x'"),
    ("1x3x0x4:8x3x3x3", "sizes >= 1"),
    ("1x3x4:8x3x3x3", "3 sizes each .* or 4"),
    ("1x3x8x8:8x4x3x3", "the weight must be 8x3x3x3"),
    ("1x3x8x8:8x3x3x3:strde=2", "allowed: stride=, padding="),
    ("1x3x8x8:8x3x3x3:bias=2", "bias takes 0 or 1"),
    ("1x3x8x8:8x3x3x3:stride=x", "stride takes an integer"),
    ("1x3x8x8:8x3x3x3:groups=0", "groups must be >= 1"),
    ("1x3x8x8:8x3x3x3:stride=0", "stride: got"),  # ConvProblem's own check
    ("1x3x4x4:8x3x5x5", "input too small"),
    ("32x64x56x56:63x21x3x3:groups=3", "must be equal"),
    ("1x3x8x8:8x3x3x3:activation=nope", "activation: got 'nope'"),
])
def test_a_bad_shape_spec_is_refused_naming_it(spec, match):
    with pytest.raises(fastconv.ConvError, match=f"shape: .*{match}"):
        tune.parse_shape(spec)


def test_shapes_from_a_file_and_the_cli_checks_them_before_the_gpu(tmp_path, capsys):
    path = tmp_path / "shapes.txt"
    path.write_text("# resnet stem\n32x3x224x224:64x3x7x7:stride=2:padding=3\n\n"
                    "8x16x9x9:16x1x3x3:groups=16  # depthwise\n")
    assert tune.read_shapes(str(path)) == ["32x3x224x224:64x3x7x7:stride=2:padding=3",
                                           "8x16x9x9:16x1x3x3:groups=16"]
    assert cli.main(["tune", "--shape", "1x3x8x8:8x4x3x3"]) == 2  # refused on any machine
    assert "the weight must be 8x3x3x3" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert cli.main(["tune", "--shapes", str(path)]) == 1
        assert "No CUDA GPU found" in capsys.readouterr().out
    assert cli.main(["tune", "--suite", "resnet50", "--shape", "1x3x8x8:8x3x3x3"]) == 2
    assert "one of --model NAME, --suite NAME, or --shape" in capsys.readouterr().out


def test_cases_are_tuned_once_each_with_a_progress_line_per_step(monkeypatch, capsys):
    """tune_cases runs the bench's call for every case and mode (eval only where the case has
    a BatchNorm), in benchmark mode, with a progress line each on stderr (no terminal)."""
    from fastconv.tools.bench import runner

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(runner, "_input_sets", lambda case, prec, layout, mode: [
        {"layout": layout}])
    calls = []

    def fake_call(provider, case, prec, t, mode):
        return lambda: calls.append((provider, case.name, mode, t["layout"],
                                     dispatch.current()[0]))
    monkeypatch.setattr(runner, "_call", fake_call)
    cases = [tune.parse_shape("2x4x8x8:4x4x3x3:padding=1"),
             tune.parse_shape("2x4x8x8:4x4x3x3:bn=1")]
    done = tune.tune_cases(cases, "bf16", ("fwd", "eval"), "two shapes", progress=True)
    assert calls == [("fastconv", cases[0].name, "fwd", "nhwc", "benchmark"),
                     ("fastconv", cases[1].name, "fwd", "nhwc", "benchmark"),
                     ("fastconv", cases[1].name, "eval", "nhwc", "benchmark")]
    assert done["what"] == "two shapes bf16 fwd,eval"
    err = capsys.readouterr().err
    assert "[1/3] 2x4x8x8:4x4x3x3:padding=1 fwd" in err and "[3/3] 2x4x8x8:4x4x3x3:bn=1 eval" \
        in err
    with pytest.raises(fastconv.ConvError, match="modes: got 'sideways'"):
        tune.tune_cases(cases, "bf16", ("sideways",))


def test_a_model_from_an_entry_point(tmp_path):
    assert isinstance(tune.build("torch.nn:Identity"), torch.nn.Identity)
    path = tmp_path / "my_net.py"
    path.write_text("import torch\n\ndef make():\n    return torch.nn.Conv2d(3, 8, 3)\n\n"
                    "def not_a_model():\n    return 3\n")
    net = tune.build(f"{path}:make")
    assert isinstance(net, torch.nn.Conv2d) and net.out_channels == 8
    with pytest.raises(fastconv.ConvError, match="returned a int, not a torch.nn.Module"):
        tune.build(f"{path}:not_a_model")
    with pytest.raises(fastconv.ConvError, match="has no function 'nothing'"):
        tune.build(f"{path}:nothing")
    with pytest.raises(fastconv.ConvError, match="cannot load 'no_such_package_xyz'"):
        tune.build("no_such_package_xyz:make")
    with pytest.raises(fastconv.ConvError, match="cannot load .*FileNotFoundError"):
        tune.build(f"{tmp_path}/missing.py:make")


def test_every_mode_of_a_shape_runs_on_the_bench_s_real_inputs(monkeypatch):
    """tune_cases with the bench's own input sets (on the CPU here) in every mode: the
    gradient modes need the output gradient the sets carry (``fastconv tune --mode train``
    failed with KeyError 'g' on the GPU at 976db49, which the fake sets above hid)."""
    from fastconv.tools.bench import runner

    real, ran = runner._input_sets, []
    monkeypatch.setattr(runner, "_input_sets", lambda case, prec, layout, mode: real(
        case, prec, layout, mode, device="cpu"))
    # the steps themselves, without the GPU check and the timing of benchmark dispatch
    monkeypatch.setattr(tune, "_exhaustively", lambda step, what: ran.append(what) or step())
    cases = [tune.parse_shape("2x3x5x7:4x3x3x3:padding=1"),
             tune.parse_shape("2x3x5x7:4x3x3x3:bn=1:activation=relu")]
    tune.tune_cases(cases, "ieee", runner.MODES)
    assert ran == [f"cases ieee {','.join(runner.MODES)}"]
