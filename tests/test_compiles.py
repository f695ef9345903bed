"""Triton kernels compiled ahead by worker processes (backends/triton/compiles.py), and the
provisional plans that run meanwhile. The workers compile for an H100 target here too (no
GPU is needed to compile), so the round trip is real: recorded in the caller, compiled in
a spawned worker, then found in Triton's on-disk cache by the caller's own compile."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from fastconv import dispatch, plans
from fastconv.backends.triton import compiles
from fastconv.errors import ConvError

_ROUND_TRIP = textwrap.dedent("""
    import faulthandler, os, sys, time
    faulthandler.dump_traceback_later(240, exit=True)
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from fastconv.backends.triton import compiles
    from fastconv.backends.triton.fprop import _splitk_reduce_kernel as kernel

    driver.set_active(compiles._TargetDriver(GPUTarget("cuda", 90, 32)))  # no GPU here
    compiles.IDLE_S = 0.5
    ws, out = torch.empty(3 * 40 * 24), torch.empty(40, 24, dtype=torch.bfloat16)
    args = (ws, out, out, out, out, 40, 24, 5, 8, 960, 960, 1, 192, 24, 0, 0, 0, 0, 0.0)
    meta = dict(HAS_SCALE=False, HAS_SHIFT=False, HAS_RES=False, ACT=1, INT64=False,
                SPLIT_K=3, BLOCK_M=32, BLOCK_N=32)
    with compiles.collecting() as jobs:
        assert kernel[(2, 1)](*args, **meta) is None  # recorded, not compiled or launched
        assert kernel[(2, 1)](*args, **meta) is None  # the same job again
    assert len(jobs) == 2 and jobs[0] is jobs[1], jobs
    assert compiles.wait(timeout=200) and jobs[0].result() == "_splitk_reduce_kernel"
    cache = os.environ["TRITON_CACHE_DIR"]
    built = sorted(os.listdir(cache))
    assert any(f.endswith(".cubin") for d in built for f in os.listdir(os.path.join(cache, d)))
    compiled = kernel.warmup(*args, grid=(2, 1), **meta)  # outside collecting: compiles
    assert compiled is not None and sorted(os.listdir(cache)) == built  # a cache hit
    if hasattr(os, "nice"):  # the workers run at a lower CPU priority than their caller
        # (the idle stop may have closed the pool already: this job may start a new one,
        # which it must close as a compile job does; under load it did not, and the pool
        # stayed)
        job = compiles._pool().submit(os.nice, 0)
        job.add_done_callback(compiles._idle_check)
        worker = job.result(timeout=60)
        assert worker == min(19, os.nice(0) + compiles.NICENESS), worker
    deadline = time.monotonic() + 30
    while compiles._POOL is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert compiles._POOL is None  # the idle workers stopped
    print("round trip ok")
""")


def test_a_recorded_kernel_compiles_in_a_worker_into_the_callers_cache(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path / "triton"),
               FASTCONV_COMPILE_WORKERS="2")
    done = subprocess.run([sys.executable, "-c", _ROUND_TRIP], env=env, capture_output=True,
                          text=True, timeout=280)
    assert done.returncode == 0 and "round trip ok" in done.stdout, done.stderr[-3000:]


_CALLER_SETTINGS = textwrap.dedent("""
    import faulthandler, os, sys
    faulthandler.dump_traceback_later(400, exit=True)
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas_version
    from triton.runtime import driver
    from fastconv.backends.triton import compiles
    from fastconv.backends.triton.fprop import _splitk_reduce_kernel as kernel

    driver.set_active(compiles._TargetDriver(GPUTarget("cuda", 90, 32)))  # no GPU here
    compiles.IDLE_S = 300.0  # the workers stay up across the settings' change below
    ws, out = torch.empty(3 * 40 * 24), torch.empty(40, 24, dtype=torch.bfloat16)
    args = (ws, out, out, out, out, 40, 24, 5, 8, 960, 960, 1, 192, 24, 0, 0, 0, 0, 0.0)

    def round_trip(act):
        meta = dict(HAS_SCALE=False, HAS_SHIFT=False, HAS_RES=False, ACT=act, INT64=False,
                    SPLIT_K=3, BLOCK_M=32, BLOCK_N=32)
        with compiles.collecting() as jobs:
            kernel[(2, 1)](*args, **meta)
        assert compiles.wait(timeout=300) and jobs[0].result()
        cache = os.environ["TRITON_CACHE_DIR"]
        built = sorted(os.listdir(cache))
        kernel.warmup(*args, grid=(2, 1), **meta)  # the caller's own compile
        return sorted(os.listdir(cache)) == built  # a hit: nothing compiled again

    # torch.compile's Inductor does both of these in the caller's process: its code cache
    # keys read the ptxas version (cached by Triton), then a compile in the process names
    # torch's own ptxas (TRITON_PTXAS_PATH), and it sets TRITON_CACHE_DIR
    get_ptxas_version(90)
    os.environ["TRITON_PTXAS_PATH"] = sys.argv[1]
    print("ptxas named after the version was read:", round_trip(1))
    os.environ["TRITON_CACHE_DIR"] = sys.argv[2]  # the workers started before this
    print("cache moved while the workers ran:", round_trip(2))
""")

_PTXAS_OF_ANOTHER_BUILD = """#!/bin/sh
if [ "$1" = "--version" ]; then
  echo "Cuda compilation tools, release {release}, V{release}.999 (another build)"; exit 0
fi
exec {real} "$@"
"""


def test_workers_compile_with_the_callers_triton_settings(tmp_path):
    """The workers' kernels are found by the caller's compile (no second compile, in the
    caller's thread) although the caller's Triton settings changed after its Triton read
    them or after the workers started. On the H200, a bench process that ran torch.compile
    first compiled every fastconv kernel again in its main thread after the workers had
    built them (stack dumps: Triton's ptxas under ``prepare_fprop`` for minutes): Triton
    keeps the ptxas version it first read for its cache keys while Inductor then named
    torch's own ptxas, which the workers, started after, read instead (a cache key of
    another version: a miss)."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = tmp_path / "ptxas"
    real = get_ptxas(90)  # (the same release: it chooses the PTX version)
    ptxas.write_text(_PTXAS_OF_ANOTHER_BUILD.format(real=real.path, release=real.version))
    ptxas.chmod(0o755)
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path / "triton"),
               FASTCONV_COMPILE_WORKERS="1")
    env.pop("TRITON_PTXAS_PATH", None)
    (tmp_path / "moved").mkdir()
    done = subprocess.run([sys.executable, "-c", _CALLER_SETTINGS, str(ptxas),
                           str(tmp_path / "moved")], env=env, capture_output=True, text=True,
                          timeout=450)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ptxas named after the version was read: True" in done.stdout, done.stdout
    assert "cache moved while the workers ran: True" in done.stdout, done.stdout


_UNGUARDED_SCRIPT = """
import os, sys
print("script body ran in", "worker" if __name__ == "__mp_main__" else "caller", flush=True)
import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from fastconv.backends.triton import compiles
from fastconv.backends.triton.fprop import _splitk_reduce_kernel as kernel

driver.set_active(compiles._TargetDriver(GPUTarget("cuda", 90, 32)))  # no GPU here
ws, out = torch.empty(3 * 40 * 24), torch.empty(40, 24, dtype=torch.bfloat16)
args = (ws, out, out, out, out, 40, 24, 5, 8, 960, 960, 1, 192, 24, 0, 0, 0, 0, 0.0)
with compiles.collecting() as jobs:
    kernel[(2, 1)](*args, HAS_SCALE=False, HAS_SHIFT=False, HAS_RES=False, ACT=1,
                   INT64=False, SPLIT_K=3, BLOCK_M=32, BLOCK_N=32)
print("built", jobs[0].result(timeout=200), flush=True)
"""


def test_workers_do_not_run_the_caller_s_script_again(tmp_path):
    """A user's script without an ``if __name__ == "__main__"`` guard (most training
    scripts): spawned workers would run it again as ``__mp_main__`` (building its model,
    touching its GPU, and failing to spawn workers of their own), and the pool would break.
    The workers leave the caller's main module alone."""
    script = tmp_path / "train.py"
    script.write_text(_UNGUARDED_SCRIPT)
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path / "triton"),
               FASTCONV_COMPILE_WORKERS="1")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("script body ran") == 1, done.stdout + done.stderr[-2000:]
    assert "built _splitk_reduce_kernel" in done.stdout


_EXIT_WITH_JOBS = """
import time
from fastconv.backends.triton import compiles

with compiles._LOCK, compiles._main_hidden():  # two long jobs (as a 7x7 depthwise compile)
    jobs = [compiles._pool().submit(time.sleep, 120.0) for _ in range(2)]
compiles._JOBS.update({str(i): j for i, j in enumerate(jobs)})
while not jobs[0].running():
    time.sleep(0.1)
print("exiting", flush=True)
"""


def test_a_process_does_not_wait_for_compiles_at_exit(tmp_path):
    """A process that ends while kernels compile in the workers exits at once: queued jobs
    are dropped and running ones ended. Before, concurrent.futures' own exit hook ran
    first and waited for every job (a bench process on the H100 ran on past its last line
    until its timeout; here one job of 120 s held the exit for all of it)."""
    env = dict(os.environ, FASTCONV_COMPILE_WORKERS="1")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _EXIT_WITH_JOBS], env=env, capture_output=True,
                          text=True, timeout=200)
    assert done.returncode == 0 and "exiting" in done.stdout, done.stderr[-3000:]
    assert time.monotonic() - start < 60, done.stderr[-2000:]


@pytest.mark.parametrize("text, want", [("", None), ("0", 0), (" 3 ", 3)])
def test_the_number_of_workers_from_the_environment(monkeypatch, text, want):
    monkeypatch.setenv("FASTCONV_COMPILE_WORKERS", text)
    got = compiles.workers()
    assert got == want if want is not None else 1 <= got <= 8


@pytest.mark.parametrize("text", ["-1", "many"])
def test_a_bad_number_of_workers_is_a_clear_error(monkeypatch, text):
    monkeypatch.setenv("FASTCONV_COMPILE_WORKERS", text)
    with pytest.raises(ConvError, match="FASTCONV_COMPILE_WORKERS.*integer >= 0"):
        compiles.workers()


def test_a_hook_installed_before_is_still_asked_first(monkeypatch):
    from triton import knobs

    asked = []

    def theirs(**kw):
        asked.append(kw["key"])
        return kw["key"] == "skip"
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", theirs)
    monkeypatch.setattr(compiles, "_CHAINED", [])
    compiles._install_hook()
    hook = knobs.runtime.jit_cache_hook
    assert hook is compiles._hook
    kw = dict(repr="", fn=None, compile={}, is_manual_warmup=False, already_compiled=False)
    assert hook(key="skip", **kw) is True  # theirs said skip
    assert hook(key="go", **kw) is None  # not collecting: Triton compiles as usual
    assert asked == ["skip", "go"]


def test_a_provisional_plan_is_not_kept(monkeypatch):
    """While a stored choice's kernels compile, the calls run aten through plans that are
    made again at the next call: the functional cache and a module keep none of them."""
    made = []
    real = dispatch.choose

    def provisional(*args, **kwargs):
        choice = real(*args, **kwargs)
        made.append(choice.backend)
        return dispatch.Choice(choice.backend, choice.config, provisional=True)
    monkeypatch.setattr(dispatch, "choose", provisional)
    plans.clear_plans()
    x, w = torch.randn(2, 3, 9, 8), torch.randn(5, 3, 3, 3)
    import fastconv

    for _ in range(2):
        torch.testing.assert_close(fastconv.conv2d(x, w, padding=1),
                                   torch.nn.functional.conv2d(x, w, padding=1))
    conv = fastconv.nn.Conv2d(3, 5, 3, padding=1)
    for _ in range(2):
        conv(x)
    assert len(made) == 4  # dispatched at every call
    assert not plans._PLANS and conv._call_site().plan is None
    monkeypatch.setattr(dispatch, "choose", real)
    conv(x)
    conv(x)
    assert len(made) == 4 and conv._call_site().plan is not None  # kept once final


def test_a_provisional_plan_with_an_until_is_kept_until_its_builds_are_done(monkeypatch):
    """A provisional choice that says when it expires (its builds' state) is kept by the
    functional cache and a module, which make it again once ``until()`` is True."""
    made, built = [], [False]
    real = dispatch.choose

    def provisional(*args, **kwargs):
        choice = real(*args, **kwargs)
        made.append(choice.backend)
        if len(made) > 2:  # the final choice
            return choice
        return dispatch.Choice(choice.backend, choice.config, provisional=True,
                               until=lambda: built[0])
    monkeypatch.setattr(dispatch, "choose", provisional)
    plans.clear_plans()
    import fastconv

    x, w = torch.randn(2, 3, 9, 8), torch.randn(5, 3, 3, 3)
    conv = fastconv.nn.Conv2d(3, 5, 3, padding=1)
    for _ in range(3):
        fastconv.conv2d(x, w, padding=1)
        conv(x)
    assert len(made) == 2  # one plan each, kept
    built[0] = True
    for _ in range(3):
        torch.testing.assert_close(fastconv.conv2d(x, w, padding=1),
                                   torch.nn.functional.conv2d(x, w, padding=1))
        conv(x)
    assert len(made) == 4  # made again once, then kept (final)


def test_warm_driver_creates_triton_s_driver_once_in_a_thread_and_waits_are_joined(
        monkeypatch):
    """``warm_driver`` makes Triton's driver in a background thread once per process, so a
    cold-cache first call does not wait for the compiler at its first Triton kernel; the
    Triton entry points wait for that thread (a driver made beside it would compile the
    same module again)."""
    import threading

    made, release = [], threading.Event()

    def create():
        release.wait(10)  # the compiler still running
        made.append(threading.current_thread().name)
    monkeypatch.setattr(compiles, "_create_driver", create)
    monkeypatch.setattr(compiles, "_DRIVER_THREAD", None)
    compiles.warm_driver()
    compiles.warm_driver()  # once per process
    thread = compiles._DRIVER_THREAD
    assert thread is not None and thread.is_alive() and not made
    release.set()
    compiles.driver_ready()
    assert not thread.is_alive() and made == ["fastconv-triton-driver"]


def test_a_driver_that_cannot_be_made_is_left_to_its_first_use():
    """On this GPU-less machine Triton finds no active driver: the warm-up thread's
    creation fails silently (the first real use reports it, as without the warm-up)."""
    from triton.runtime import driver

    before = driver._active
    compiles._create_driver()  # no exception
    assert driver._active is before


def test_optimize_warms_the_driver_for_a_model_on_a_gpu_only(monkeypatch):
    from fastconv import backends, optimize

    warmed = []
    monkeypatch.setattr(backends.REGISTRY["triton"], "warm_up",
                        classmethod(lambda cls: warmed.append(cls.NAME)))
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    optimize(model)
    assert warmed == []  # CPU parameters: nothing started
