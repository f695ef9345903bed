"""Host cost of an eager training step's conv -> BatchNorm -> ReLU layers on the GPU, by
variant of the ops each layer issues: a chain of 16 such layers at a size whose kernels take
a few microseconds (2x16x8x8 channels-last, 3x3, bf16 autocast on float32 parameters), so
that a step's wall time is its host time. Each row: one forward + backward of the chain,
gradients set to None after it; min over 15 rounds of 50 steps, rows alternating.

Rows: torch's modules; torch's ops bare (autocast's weight cast per layer, the
``num_batches_tracked`` increment, cuDNN's batch norm, ``relu_``); without the increment;
with every weight cast to bf16 ahead of the layers by nn/step.py's ``_Cast`` (one
``_foreach_copy_``, one autograd node for all casts); the same with torch's native batch
norm instead of cuDNN's; fastconv's ``ConvBNAct2d`` chained; ``optimize(model, "training",
"bf16")`` (the same layers inside the optimized model's training step: batched casts and
counters); and one autograd Function per layer (torch's forward ops without autograd, its
backward ops called directly).

    PYTHONPATH=src python benchmarks/train_host_ops.py
"""

import copy

import torch
from host_parts import per_call_us

import fastconv
from fastconv.nn import ConvBNAct2d
from fastconv.nn.step import _Cast  # one multi-tensor cast, one autograd node

LAYERS, CHANNELS = 16, 16
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: a smoke run


class LayerFn(torch.autograd.Function):
    """conv -> batch norm (batch statistics, running ones updated) -> ReLU as one autograd
    node: torch's forward ops without autograd, its backward ops called directly."""

    @staticmethod
    def forward(ctx, x, w, gamma, beta, mean, var):
        y = torch.conv2d(x, w, None, 1, 1)
        z, smean, svar, reserve, impl = torch.ops.aten._batch_norm_impl_index(
            y, gamma, beta, mean, var, True, 0.1, 1e-5, True)
        ctx.impl = impl
        z = z.relu_()
        ctx.save_for_backward(x, w, y, z, gamma, mean, var, smean, svar, reserve)
        return z

    @staticmethod
    def backward(ctx, gz):
        x, w, y, z, gamma, mean, var, smean, svar, reserve = ctx.saved_tensors
        gz = torch.ops.aten.threshold_backward(gz, z, 0)
        layout = torch.channels_last if y.is_contiguous(memory_format=torch.channels_last) \
            else torch.contiguous_format
        gy, ggamma, gbeta = torch.ops.aten._batch_norm_impl_index_backward(
            ctx.impl, y, gz.contiguous(memory_format=layout), gamma, mean, var, smean, svar,
            True, 1e-5, [True, True, True], reserve)
        gy = gy.to(w.dtype)  # (the CPU's mixed-precision batch norm)
        gx, gw, _ = torch.ops.aten.convolution_backward(
            gy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
            [ctx.needs_input_grad[0], True, False])
        return gx, gw, ggamma, gbeta, None, None


def main() -> None:
    torch.manual_seed(0)
    cl = torch.channels_last
    seq = torch.nn.Sequential(*[
        m for _ in range(LAYERS) for m in (
            torch.nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(CHANNELS), torch.nn.ReLU(inplace=True))]).to(DEV).to(
        memory_format=cl).train()
    fused = torch.nn.Sequential(*[ConvBNAct2d.from_torch(seq[3 * i], seq[3 * i + 1], seq[3 * i + 2])
                                  for i in range(LAYERS)]).to(DEV).to(memory_format=cl).train()
    optimized = fastconv.optimize(copy.deepcopy(seq), "training", "bf16")
    x = torch.randn(2, CHANNELS, 8, 8, device=DEV).contiguous(memory_format=cl)
    convs = [seq[3 * i] for i in range(LAYERS)]
    bns = [seq[3 * i + 1] for i in range(LAYERS)]
    params = list(seq.parameters()) + list(fused.parameters()) + list(optimized.parameters())

    def ops(counter: bool, precast: bool, cudnn: bool):
        def forward(h):
            weights = [c.weight for c in convs]
            if precast:
                weights = _Cast.apply(torch.bfloat16, *weights)
            for w, bn in zip(weights, bns):
                if counter:
                    bn.num_batches_tracked.add_(1)
                h = torch.conv2d(h, w, None, 1, 1)
                h = torch.relu_(torch.batch_norm(h, bn.weight, bn.bias, bn.running_mean,
                                                 bn.running_var, True, 0.1, 1e-5, cudnn))
            return h
        return forward

    def layer_fns(h):
        weights = _Cast.apply(torch.bfloat16, *[c.weight for c in convs])
        h = h.to(torch.bfloat16)  # (autocast's cast of the first input, made here)
        for w, bn in zip(weights, bns):
            h = LayerFn.apply(h, w, bn.weight, bn.bias, bn.running_mean, bn.running_var)
        return h

    def step(forward):
        def run():
            with torch.autocast(DEV, torch.bfloat16):
                out = forward(x)
            out.float().sum().backward()
            for p in params:
                p.grad = None
        return run

    rows = per_call_us({
        "torch modules": step(seq),
        "ops: cast, counter, cudnn BN": step(ops(True, False, True)),
        "ops: cast, cudnn BN": step(ops(False, False, True)),
        "ops: one cast, cudnn BN": step(ops(False, True, True)),
        "ops: one cast, native BN": step(ops(False, True, False)),
        "one cast, one Function per layer": step(layer_fns),
        "fastconv ConvBNAct2d": step(fused),
        "fastconv optimize(model)": step(optimized),
    }, calls=50, rounds=15, sync=torch.cuda.synchronize if DEV == "cuda" else lambda: None)
    print(torch.__version__, torch.cuda.get_device_name() if DEV == "cuda" else "CPU",
          f"us per training step of {LAYERS} layers, and per layer (min of 15 x 50)")
    base = rows["torch modules"]
    for name, us in rows.items():
        print(f"  {name:32s} {us:8.1f}  {us / LAYERS:6.1f} per layer  {base / us:5.3f}x torch")


if __name__ == "__main__":
    main()
