"""Probe (issue 54, 2026-11-29): where a 70 s first call goes. torchvision regnet_y_1_6gf,
training, batch 256, bf16 channels_last: torch eager's first training step timed, then
``optimize(cuda_graph=True)``'s (the models bench's ``fastconv_cuda_graph``) under cProfile
(the main thread: background builds are not in it). Prints the first calls' seconds, the
tuning budget's and the build waits' share, and the profile's top functions by cumulative
and by own time.
Run: PYTHONPATH=src python3 probe_firstcall.py [case] > log"""

import cProfile
import io
import pstats
import sys
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


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "tv_regnet_y_1_6gf"
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    print("#", torch.cuda.get_device_name(), torch.__version__, name, batch, flush=True)
    torch.manual_seed(0)
    model = BUILDERS[name]().cuda().train()
    x = model_input(name, batch, 224, "cuda")
    first_call("torch", model, x)
    first_call("fastconv_cuda_graph", model, x, profile=True)


if __name__ == "__main__":
    sys.exit(main())
