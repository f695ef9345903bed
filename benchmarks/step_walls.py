"""Eager step wall times of a timm model, torch against fastconv.optimize variants, the
variants alternated round by round in one process; per round the median wall (ms) and the
process CPU time per step (ms, every thread). Diagnoses host-bound steps whose profiles
agree but whose walls differ.

    python benchmarks/step_walls.py [timm model name] [batch] [--eval] [--nogc]
"""

from __future__ import annotations

import gc
import statistics
import sys
import time

import torch
from timm_steps import VARIANTS, eager_step

flags = [a for a in sys.argv[1:] if a.startswith("--")]
args = [a for a in sys.argv[1:] if not a.startswith("--")]
name = args[0] if args else "resnet50"
batch = int(args[1]) if len(args) > 1 else 32
TRAIN = "--eval" not in flags
if "--nogc" in flags:
    gc.disable()
torch.backends.cudnn.benchmark = True
x = torch.randn(batch, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)


steps = {v: eager_step(name, v, x, TRAIN) for v in VARIANTS}
for step in steps.values():
    for _ in range(5):
        step()
torch.cuda.synchronize()
for rnd in range(3):
    for v, step in steps.items():
        walls, cpus = [], []
        for _ in range(10):
            w, c = time.perf_counter(), time.process_time()
            step()
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - w) * 1e3)
            cpus.append((time.process_time() - c) * 1e3)
        print(f"round {rnd} {v:14s} wall {statistics.median(walls):7.2f} ms  process cpu "
              f"{statistics.median(cpus):7.2f} ms  min wall {min(walls):7.2f}", flush=True)
