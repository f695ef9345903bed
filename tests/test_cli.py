"""The ``fastconv`` command end to end, in a subprocess, as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch


def _fastconv(*args: str, tmp_path, timeout: float = 600) -> subprocess.CompletedProcess:
    # as from a user's shell: the tests' own TRITON_INTERPRET (conftest) is not passed on
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["FASTCONV_CACHE_DIR"] = str(tmp_path / "cache")
    return subprocess.run([sys.executable, "-m", "fastconv", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU path")
@pytest.mark.slow
def test_check_passes_end_to_end_on_the_cpu(tmp_path):
    """The README's main job on a machine without a GPU: the Triton kernels are checked too,
    in the interpreter, as the first line says (the command sets TRITON_INTERPRET itself)."""
    run = _fastconv("check", "--count", "3", tmp_path=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    lines = run.stdout.strip().splitlines()
    assert lines[0].startswith("No GPU found"), lines[0]
    assert re.fullmatch(r"\d+ problems in \d+ s: all within the contract", lines[-1]), lines[-1]
    assert "Traceback" not in run.stderr
    backends = {line.split()[-5] for line in lines[2:-1] if line.endswith(" ok")}
    assert backends == {"aten", "triton", "auto"}, backends
    # the sequence convolutions' routes, both dtypes
    for route in ("w4 forward", "w16 forward", "w4 fwd+bwd, kernels", "w4 packed, fwd+bwd",
                  "w40 forward, tensor cores", "_update w4, one token"):
        assert sum(route in line and line.endswith(" ok") for line in lines) == 2, route
    info = _fastconv("info", tmp_path=tmp_path)
    assert "backend triton   available" in info.stdout, info.stdout


def test_importing_fastconv_imports_no_kernel_module():
    """Kernels are decorated (compiled or interpreted, decided then) when first used, never
    at ``import fastconv``: a command or a user can still choose the interpreter after it.
    Neither Triton's language (its own jit functions) nor torch._dynamo, which imports it,
    is imported either."""
    code = ("import sys, fastconv; "
            "print(sorted(m for m in sys.modules if m.startswith('fastconv.backends.triton.'))); "
            "print(sorted(m for m in sys.modules if m.startswith(('triton.language', "
            "'torch._dynamo'))))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    kernels, language = done.stdout.strip().splitlines()
    assert kernels == "['fastconv.backends.triton.backend', " \
        "'fastconv.backends.triton.binds', 'fastconv.backends.triton.configs', " \
        "'fastconv.backends.triton.launchargs', 'fastconv.backends.triton.weights']", kernels
    assert language == "[]", language


def test_the_constant_mark_is_torch_compilers():
    """seqargs.kernels_run_on carries the mark torch.compiler.assume_constant_result sets
    (set by hand there, so that import fastconv imports no torch._dynamo)."""
    from fastconv.seqargs import kernels_run_on

    def probe():
        return None
    marked = torch.compiler.assume_constant_result(probe)
    assert marked is probe
    added = {k: v for k, v in vars(probe).items()}
    assert added == {"_dynamo_marked_constant": True}
    assert all(getattr(kernels_run_on, k, None) == v for k, v in added.items())


@pytest.mark.parametrize("args", [
    ["bench", "--suite", "nosuch"],
    ["bench", "--precision", "bogus"],
    ["bench", "--cases", "nosuch"],
    ["explain", "--input", "a,b", "--weight", "1,2,3"],
    ["explain", "--input", "1,3,8,8", "--weight", "4,3,3,3", "--stride", "0"],
    ["explain", "--input", "1,3,8,8", "--weight", "4,3,3,3", "--backend", "bogus"],
    ["explain", "--input", "1,3,8,8", "--weight", "4,3,-3,3"],
    ["nosuchcommand"],
])
def test_bad_arguments_print_one_line_and_exit_2(args, capsys):
    from fastconv.tools import cli

    with pytest.raises(SystemExit) as exited:
        raise SystemExit(cli.main(args))
    assert exited.value.code == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert "Traceback" not in captured.out + captured.err
    assert len(err) <= 1, err


def test_debug_shows_the_traceback():
    from fastconv import ConvError
    from fastconv.tools import cli

    with pytest.raises(ConvError, match="backend"):
        cli.main(["--debug", "explain", "--input", "1,3,8,8", "--weight", "4,3,3,3",
                  "--backend", "bogus"])


def test_the_demo_divides_by_one_baseline_in_the_same_precision():
    """Exactly one row is the baseline, torch eager in the demo's precision and layout (the
    float32 context row is not: a GPU run once divided by it)."""
    from fastconv.precision import Precision
    from fastconv.tools import demo

    for precision in Precision:
        names = [spec[0] for spec in demo._rows(precision)]
        baselines = [n for n in names if n.startswith(demo.BASELINE)]
        assert len(baselines) == 1, names
        assert baselines[0] == demo.BASELINE + (
            f" {precision.value} channels_last" if precision.value in ("bf16", "fp16") else "")
