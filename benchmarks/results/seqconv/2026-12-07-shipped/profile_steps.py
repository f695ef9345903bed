"""Where a host-bound model step's time goes: torch.profiler over steps of one models-suite
case, per provider (NOTES.md, "Sequence convolutions": Mamba-130M's block is 0.87-0.93x
torch.compile in the default mode, an inference step 0.085 ms longer).

    python benchmarks/profile_steps.py [case] [providers] [modes] [outdir]

Per provider and mode: the step's wall time (median of 50 after 20 warm-up steps), then, over
20 profiled steps, the CUDA kernels a step launches and their GPU time, the host's self time
per op (top 10), and a Chrome trace under outdir. Providers run one after another, each
timed in the same process; the profiler's own overhead inflates host times alike."""

from __future__ import annotations

import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from fastconv.precision import Precision
from fastconv.tools.bench.models import BUILDERS, CASES, model_input, no_dropout, provider_call


def main(case_name="mamba130m_conv_b8_l2048", providers="torch_compile,fastconv_compile",
         modes="eval,train", outdir=".") -> None:
    case = next(c for c in CASES if c.name == case_name)
    for mode in modes.split(","):
        for provider in providers.split(","):
            torch.manual_seed(0)
            model = BUILDERS[case.model]().cuda().train(mode == "train")
            x = model_input(case.model, case.batch, case.size, "cuda")
            fn, net = provider_call(provider, model, x, Precision.BF16, mode)
            with no_dropout(net):
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
                walls = []
                for _ in range(50):
                    start = time.perf_counter()
                    fn()
                    torch.cuda.synchronize()
                    walls.append(time.perf_counter() - start)
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for _ in range(20):
                        fn()
                    torch.cuda.synchronize()
            events = prof.key_averages()
            kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
            launches = sum(e.count for e in kernels) / 20
            gpu_us = sum(e.self_device_time_total for e in kernels) / 20
            host = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CPU),
                          key=lambda e: -e.self_cpu_time_total)[:10]
            print(f"== {case_name} {mode} {provider}: step {statistics.median(walls) * 1e3:.3f} ms "
                  f"(wall, median of 50); {launches:.1f} kernels/step, GPU {gpu_us / 1e3:.3f} "
                  f"ms/step", flush=True)
            for e in host:
                print(f"   host {e.self_cpu_time_total / 20:8.1f} us/step  {e.count / 20:5.1f}x  "
                      f"{e.key[:90]}")
            for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:8]:
                print(f"   gpu  {e.self_device_time_total / 20:8.1f} us/step  "
                      f"{e.count / 20:5.1f}x  {e.key[:90]}")
            prof.export_chrome_trace(f"{outdir}/trace-{case_name}-{mode}-{provider}.json")
            torch._dynamo.reset()


if __name__ == "__main__":
    main(*sys.argv[1:])
