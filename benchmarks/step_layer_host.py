"""Host cost of one fused training layer's forward inside an optimized model's training step
(the device: the GPU host, where eager training steps are host-bound): the kept call
(nn/fused.py ``_step_call``), the general path (no entry kept), the bare torch ops of
eager_ceiling_ab.py, and the kept call's parts called alone. A tiny problem (2x16x8x8, 3x3,
bf16 autocast, channels-last), so every row is host time. Each row: us per call, min over
rounds of back-to-back calls, rows alternating (host_parts.per_call_us).

    PYTHONPATH=src python benchmarks/step_layer_host.py [--device cuda]
"""

import argparse
import copy

import eager_ceiling_ab
import torch
from alternate import header
from host_parts import per_call_us

from fastconv import dispatch
from fastconv.nn import ConvBNAct2d
from fastconv.nn import step as stepmod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev = args.device
    torch.manual_seed(0)
    layer = ConvBNAct2d(16, 16, 3, padding=1, device=dev).train().to(
        memory_format=torch.channels_last)
    bn = layer.bn
    x = torch.randn(2, 16, 8, 8, device=dev, dtype=torch.bfloat16, requires_grad=True
                    ).contiguous(memory_format=torch.channels_last)
    other = copy.deepcopy(layer)
    other.__dict__["_keep_step_call"] = lambda *a: None  # this one keeps no entry
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

    def bare():
        eager_ceiling_ab._bare(True)
        try:
            return layer(x)
        finally:
            eager_ceiling_ab._bare(False)

    with torch.autocast(dev, dtype=torch.bfloat16), \
            stepmod.training_step([layer.weight], torch.bfloat16) as step:
        layer(x)
        kept = layer._call_site().step_entry
        weight = step.cast(layer.weight, torch.bfloat16)
        y = kept[1].run(x, weight, None, None, None, None, None)
        rows = {
            "kept call": lambda: layer(x),
            "general path (no entry kept)": lambda: other(x),
            "bare torch ops (+ patch/unpatch)": bare,
            "  current_step()": stepmod.current,
            "  _step_key": lambda: layer._step_key(bn, x, None, "relu"),
            "  torch.is_autocast_enabled(dev)": lambda: torch.is_autocast_enabled(dev),
            "  torch.get_autocast_dtype(dev)": lambda: torch.get_autocast_dtype(dev),
            "  dispatch.current()": dispatch.current,
            "  _step_run (cast, plan.run)": lambda: layer._step_run(kept[1], step,
                                                                    torch.bfloat16, x,
                                                                    layer.weight, None),
            "  step.cast": lambda: step.cast(layer.weight, torch.bfloat16),
            "  plan.run": lambda: kept[1].run(x, weight, None, None, None, None, None),
            "  torch.conv2d": lambda: torch.conv2d(x, weight, None, (1, 1), (1, 1), (1, 1), 1),
            "  torch.batch_norm": lambda: torch.batch_norm(
                y, bn.weight, bn.bias, bn.running_mean, bn.running_var, True, 0.1, 1e-5,
                True),
        }
        result = per_call_us(rows, calls=500, rounds=9, sync=sync)
    print(header("step_layer_host.py"))
    print("us per call (min over 9 rounds of 500)")
    for name, us in result.items():
        print(f"  {name:42s} {us:7.2f}")


if __name__ == "__main__":
    main()
