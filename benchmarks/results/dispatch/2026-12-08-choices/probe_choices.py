"""Issue 54's two training rows below 0.98 on an H100 (57a7ba7,
``../2026-12-07-h100-layers/``), each timed alone in a new process: does dispatch's own
timing prefer the Triton tile there too, or only in the model's step?

- ``dgrad``: efficientnet_b0's data gradient of the 1x1 32→16 at 112², batch 32, bf16,
  the step's strides (the layer check: a Triton tile, 18.2 against aten's 15.4 µs same,
  0.936 rotated);
- ``wgrad``: mobilenet_v3's weight gradient of the squeeze-excitation 1x1 672→168 at 1²
  (a Triton tile, 2.7 against 2.5 µs).

Per problem: ``dispatch.explain`` in CUDA-graph settings (every candidate's GPU, host and
graph time, and the choice) under the budget given (``default`` or ``exhaustive``), then the
layer check's measurement (``layercheck.measure``: graphs on the same and on rotated
operands, replayed alternately) of the explained choice and of the best Triton row against
aten. Usage: ``probe_choices.py dgrad|wgrad default|exhaustive``. Without a GPU it prints
the untimed candidates.
"""

from __future__ import annotations

import sys
import time

import torch

import fastconv  # noqa: F401 (the package's set-up)
from fastconv import backends, dispatch, plans
from fastconv.dispatch.budget import parse_budget
from fastconv.precision import Precision
from fastconv.problem import ConvProblem
from fastconv.tools.bench import layercheck

#: (op, input shape, weight shape, the step's strides of (grad_out, other operand))
PROBLEMS = {
    "dgrad": ("dgrad", (32, 32, 112, 112), (16, 32, 1, 1),
              ((200704, 1, 1792, 16), (32, 1, 32, 32))),
    "wgrad": ("wgrad", (32, 672, 1, 1), (168, 672, 1, 1),
              ((168, 1, 1, 1), (672, 1, 672, 672))),
}


def main(which: str, budget: str) -> None:
    op, in_shape, w_shape, strides = PROBLEMS[which]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.empty(in_shape, device=device, dtype=dtype).to(
        memory_format=torch.channels_last)
    w = torch.empty(w_shape, device=device, dtype=dtype).to(memory_format=torch.channels_last)
    problem = ConvProblem.from_tensors(x, w, None, (1, 1), ((0, 0), (0, 0)), (1, 1), 1,
                                       rank=2, precision=Precision.BF16.value
                                       if device == "cuda" else None)
    grad_out, other, _ = layercheck.operands(problem, op, device, strides)
    sets = plans._Sets((grad_out, other), plans._like(None),
                       (other if op == "wgrad" else x).numel() * problem.dtype.itemsize)
    bound = plans._binder(lambda cls, config: cls.bind(problem, config, op))

    def trial(cls, config, k=0):
        bound(cls, config)(*sets[k])

    dispatch.budget.TUNING = parse_budget("" if budget == "default" else budget)
    started = time.perf_counter()
    with dispatch.settings("benchmark" if device == "cuda" else None, graph=True):
        found = dispatch.explain(problem, op=op, run=plans._rotating(trial, sets))
    print(found)
    print(f"explain took {time.perf_counter() - started:.1f} s ({budget} budget)")
    if device != "cuda":
        return
    timed = [r for r in found.rows if r.timed and r.graph_ms is not None]
    picks = {"choice": (found.choice.backend, found.choice.config)}
    tiles = sorted((r for r in timed if r.backend == "triton"), key=lambda r: r.graph_ms)
    if tiles:
        picks["best triton"] = (tiles[0].backend, tiles[0].config)
    for label, (name, config) in picks.items():
        cls = backends.REGISTRY[name]
        plan = plans._Plan(problem, cls.bind(problem, config, op), name)
        row = layercheck.measure(op, plan, device, strides=strides)
        print(f"{label:12} {name}{dispatch.store.config_suffix(config)}: "
              f"same {row['fastconv_ms_same'] * 1e3:.2f} against aten "
              f"{row['torch_ms_same'] * 1e3:.2f} us ({row['ratio_same']:.3f}); rotated "
              f"{row['fastconv_ms_cold'] * 1e3:.2f} against {row['torch_ms_cold'] * 1e3:.2f} "
              f"us ({row['ratio_cold']:.3f})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "default")
