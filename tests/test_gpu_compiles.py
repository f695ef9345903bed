"""GPU: Triton candidates compiled ahead by worker processes (backends/triton/compiles.py),
in a fresh process with an empty Triton cache: the recorded launch compiles nothing, the
workers build every kernel, the caller's run is then a cache hit and its output is right."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

_SCRIPT = textwrap.dedent("""
    import os, time
    import torch
    import torch.nn.functional as F
    import fastconv
    from fastconv.backends.triton import TritonBackend
    from fastconv.precision import Precision, relative_error

    if os.environ.get("TORCH_COMPILE_FIRST"):  # Inductor compiling in this process first
        import torch._inductor.config

        torch._inductor.config.compile_threads = 1
        torch.compile(lambda a: (a * 2).relu() + 1)(torch.randn(999, device="cuda"))
        assert "TRITON_CACHE_DIR" in os.environ  # (Inductor set it)
    x = torch.randn(3, 24, 17, 19, device="cuda", dtype=torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(40, 24, 3, 3, device="cuda", dtype=torch.bfloat16) / 12
    w = w.contiguous(memory_format=torch.channels_last)
    problem = fastconv.ConvProblem.from_tensors(x, w, None, padding=1, rank=2,
                                                precision=Precision.BF16)
    configs = TritonBackend.candidates(problem)[:6]
    out = torch.full(problem.output_shape(), float("nan"), device="cuda",
                     dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    run = lambda c: TritonBackend.bind(problem, c)(x, w, None, None, None, None, out)
    start = time.perf_counter()
    jobs = [TritonBackend.compile_ahead(lambda c=c: run(c)) for c in configs]
    recorded = time.perf_counter() - start
    assert all(j for j in jobs), [len(j) for j in jobs]
    assert torch.isnan(out.float()).all(), int((~torch.isnan(out.float())).sum())  # no launch
    for j in jobs:
        for f in j:
            f.result(timeout=300)
    built = time.perf_counter() - start
    cache = os.environ["TRITON_CACHE_DIR"]
    before = sorted(os.listdir(cache))
    ref = F.conv2d(x.double(), w.double(), padding=1)
    for c in configs:
        out.fill_(float("nan"))
        run(c)
        err = relative_error(out, ref)
        assert err < 1e-2 and not torch.isnan(out.float()).any(), (c, err)
    new = sorted(set(os.listdir(cache)) - set(before))
    assert not new, [os.listdir(os.path.join(cache, d)) for d in new]  # every run a cache hit
    assert TritonBackend.compile_ahead(lambda: run(configs[0])) == []  # compiled: no jobs
    print(f"{len(configs)} configs: recorded in {recorded:.2f} s, built in {built:.1f} s")
""")


@pytest.mark.parametrize("compile_first", [False, True])
def test_candidates_compiled_ahead_in_workers_run_correctly(tmp_path, compile_first):
    """``compile_first``: torch.compile runs first in the process, compiling there (one
    compile thread): Inductor then names torch's ptxas and its own Triton cache directory,
    after Triton read its settings; the workers' kernels must still be the caller's cache
    hits (before 57948b9 they were not: bench processes compiled every kernel twice)."""
    env = dict(os.environ, FASTCONV_COMPILE_WORKERS="6")
    for key in ("TRITON_CACHE_DIR", "TRITON_PTXAS_PATH", "TORCH_COMPILE_FIRST"):
        env.pop(key, None)
    if compile_first:
        env.update(TORCH_COMPILE_FIRST="1", TRITON_HOME=str(tmp_path),
                   TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    else:
        env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"))
    done = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                          text=True, timeout=400)
    print(done.stdout)
    assert done.returncode == 0 and "configs: recorded" in done.stdout, done.stderr[-3000:]
