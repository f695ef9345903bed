"""The training step's batched host work (nn/step.py) on and off in one process: torch's
model, ``optimize(model, "training")`` with the batching, and the same optimized model with
it off (each convolution's cast made by autocast, each BatchNorm counting its own step), one
step of each per round, the device synchronised around each step, the models bench's step
(forward, backward, SGD). Per model: median wall ms of each row and the median over rounds
of each round's ratio (same round, so the host's drift hits both sides alike).

    PYTHONPATH=src python benchmarks/step_batching_ab.py timm_resnet50_b32 [CASE ...] \
        [--rounds 40] [--precision bf16]
"""

import argparse

import torch
from alternate import alternate, medians, ratio, training_steps

from fastconv.nn import step as stepmod
from fastconv.precision import Precision

_COUNT = stepmod.Step.count
_BATCHES = stepmod.batches_casts


def _batching(on: bool) -> None:
    stepmod.batches_casts = _BATCHES if on else (lambda: False)
    stepmod.Step.count = _COUNT if on else (lambda self, tracked: tracked.add_(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--precision", default="bf16")
    args = ap.parse_args()
    precision = Precision(args.precision)
    for name, _, _, torch_step, fc_step, _ in training_steps(
            "step_batching_ab.py", args.cases, args.rounds, precision):
        rows = {"torch": (torch_step, True), "fastconv batched": (fc_step, True),
                "fastconv per layer": (fc_step, False)}
        times = alternate({k: (fn, lambda on=on: _batching(on)) for k, (fn, on) in rows.items()},
                          args.rounds, torch.cuda.synchronize)
        _batching(True)
        med = medians(times)
        ratios = {(a, b): ratio(times, a, b) for a, b in (
            ("fastconv per layer", "fastconv batched"), ("torch", "fastconv batched"),
            ("torch", "fastconv per layer"))}
        print(f"{name:28s} " + "  ".join(f"{k} {v:6.2f}" for k, v in med.items())
              + "  | " + "  ".join(f"{a} / {b} {v:.3f}" for (a, b), v in ratios.items()))


if __name__ == "__main__":
    main()
