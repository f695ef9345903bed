"""Helpers shared by the timm profiling scripts (profile_eager.py, step_walls.py,
profile_compile.py): an eager step of torch's model or of fastconv.optimize's, and the CUDA
kernels of a torch.profiler run grouped by name."""

from __future__ import annotations

import collections

import timm  # (carried wheel on the device)
import torch

import fastconv

#: torch's model, fastconv.optimize's, and the latter with every layer's backend forced to aten
VARIANTS = ("torch", "fastconv", "fastconv_aten")


def eager_step(name: str, variant: str, x: torch.Tensor, train: bool):
    """One step of timm model ``name`` (random weights, channels-last, bf16 autocast) on
    ``x``: a forward, and with ``train`` a backward, the gradients dropped after it."""
    net = timm.create_model(name, pretrained=False).cuda().train(train)
    net = net.to(memory_format=torch.channels_last)
    if variant.startswith("fastconv"):
        net = fastconv.optimize(net, mode="training" if train else "inference",
                                precision="bf16")
        if variant == "fastconv_aten":
            for m in net.modules():
                if hasattr(m, "backend"):
                    m.backend = "aten"

    def step():
        with torch.set_grad_enabled(train), torch.autocast("cuda", torch.bfloat16):
            y = net(x)
        if train:
            y.float().square().mean().backward()
            for p in net.parameters():
                p.grad = None
    return step


def kernels_by_name(prof) -> dict[str, list]:
    """``{kernel name (90 characters): [launches, µs]}`` of a torch.profiler run."""
    kernels: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels[e.name[:90]]
            k[0] += 1
            k[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    return kernels
