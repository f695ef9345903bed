"""Probe (issue 54, 2026-11-29): where a 70 s first call goes. torchvision regnet_y_1_6gf,
training, batch 256, bf16 channels_last: torch eager's first training step timed, then
``optimize(cuda_graph=True)``'s (the models bench's ``fastconv_cuda_graph``) under cProfile
(the main thread: background builds are not in it). Prints the first calls' seconds, the
tuning budget's and the build waits' share, and the profile's top functions by cumulative
and by own time (run 1). Run 2 (``COUNT=1``, no profiler): the same first call with
counters instead: Triton compiles by kernel and thread, dispatch's timings (``time_row``)
inside and outside upgrades, the plan cache's saves.
Run: PYTHONPATH=src python3 probe_firstcall.py [case] > log"""

import collections
import cProfile
import io
import os
import pstats
import sys
import threading
import time

import torch

from fastconv import dispatch
from fastconv.precision import Precision
from fastconv.tools.bench.models import BUILDERS, model_input, no_dropout, provider_call


def first_call(provider, model, x, profile=False):
    start = time.perf_counter()
    fn, net = provider_call(provider, model, x, Precision.BF16, "train")
    prepared = time.perf_counter() - start
    timed, waited = dispatch.budget.TUNING.spent_s, dispatch.timing.WAITED["builds_s"]
    prof = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if prof:
        prof.enable()
    with no_dropout(net):
        fn()
    torch.cuda.synchronize()
    if prof:
        prof.disable()
    seconds = time.perf_counter() - start
    print(f"{provider}: prepare {prepared:.1f} s, first call {seconds:.1f} s, timing "
          f"{dispatch.budget.TUNING.spent_s - timed:.1f} s, build waits "
          f"{dispatch.timing.WAITED['builds_s'] - waited:.1f} s", flush=True)
    start = time.perf_counter()
    with no_dropout(net):
        fn()
    torch.cuda.synchronize()
    print(f"{provider}: second call {time.perf_counter() - start:.2f} s", flush=True)
    if prof:
        for key in ("cumulative", "tottime"):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(key).print_stats(45)
            print(f"## by {key}\n" + s.getvalue()[-9000:], flush=True)


COUNTS = collections.Counter()
SECONDS = collections.Counter()


def _counted(owner, name, label=None):
    """Wrap ``owner.name`` to count its calls and wall seconds under ``label``."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            key = label(args) if callable(label) else (label or name)
            COUNTS[key] += 1
            SECONDS[key] += time.perf_counter() - start
    setattr(owner, name, wrapper)


def install_counters():
    from triton.runtime.jit import JITFunction

    from fastconv import plancache
    from fastconv.dispatch import timing, upgrades

    if hasattr(JITFunction, "_do_compile"):
        main = threading.main_thread()
        _counted(JITFunction, "_do_compile", lambda a: (
            "compile " + ("main " if threading.current_thread() is main else "worker ")
            + getattr(a[0], "__name__", "?")))
    _counted(timing, "time_row", "time_row (all)")
    _counted(upgrades, "upgrade", "upgrade (timing what finished building)")
    _counted(plancache.PlanCache, "_save", "plan cache save")


def report():
    rows = sorted(SECONDS.items(), key=lambda kv: -kv[1])
    main = [(k, v) for k, v in rows if k.startswith("compile main")]
    print(f"compiles in the main thread: {sum(COUNTS[k] for k, _ in main)}, "
          f"{sum(v for _, v in main):.1f} s", flush=True)
    for key, seconds in rows[:40]:
        print(f"  {seconds:8.2f} s {COUNTS[key]:6d}  {key}", flush=True)


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "tv_regnet_y_1_6gf"
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    print("#", torch.cuda.get_device_name(), torch.__version__, name, batch, flush=True)
    torch.manual_seed(0)
    model = BUILDERS[name]().cuda().train()
    x = model_input(name, batch, 224, "cuda")
    first_call("torch", model, x)
    count = os.environ.get("COUNT") == "1"
    if count:
        install_counters()
    first_call("fastconv_cuda_graph", model, x, profile=not count)
    if count:
        report()


if __name__ == "__main__":
    sys.exit(main())
