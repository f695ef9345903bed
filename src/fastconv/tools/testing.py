"""Random convolution problems and float64 references, shared by the tests and
``fastconv check``.

A case is a plain dict of ``conv1d``/``conv2d`` keyword arguments plus shapes, so that a failing
one can be printed and replayed.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch
import torch.nn.functional as F

from ..epilogue import ACTIVATIONS, Epilogue
from ..precision import DTYPE, Precision, relative_error

#: Sentinel written into output buffers before a run: any element left unwritten shows up.
POISON = float("nan")


def random_case(rng: random.Random, *, rank: int | None = None, small: bool = True) -> dict:
    """A random valid convolution: odd sizes, groups, stride, dilation, asymmetric padding,
    layout and epilogue all vary. ``small`` keeps it cheap for the Triton interpreter."""
    rank = rank or rng.choice((1, 2))
    groups = rng.choice((1, 1, 1, 2, 3, "dw"))
    cpg = rng.choice((1, 2, 3, 5, 8, 16, 19)) if small else rng.choice((3, 16, 32, 48, 64, 96))
    kpg = rng.choice((1, 3, 4, 7, 16, 17)) if small else rng.choice((8, 16, 32, 64, 96, 128))
    if groups == "dw":
        groups = rng.choice((3, 4, 6)) if small else rng.choice((16, 32, 64))
        cpg, kpg = 1, rng.choice((1, 2))
    c, k = cpg * groups, kpg * groups
    kernel = tuple(rng.choice((1, 1, 2, 3, 3, 5)) for _ in range(rank))
    stride = tuple(rng.choice((1, 1, 2, 3)) for _ in range(rank))
    dilation = tuple(rng.choice((1, 1, 1, 2)) for _ in range(rank))
    pads = [(rng.randint(0, 2), rng.randint(0, 2)) for _ in range(rank)]
    if rng.random() < 0.6:  # symmetric, as torch takes it
        pads = [(a, a) for a, _ in pads]
    spatial = []
    for kk, d, (a, b) in zip(kernel, dilation, pads):
        need = d * (kk - 1) + 1 - a - b
        lo = max(need, 1)
        spatial.append(rng.randint(lo, lo + (9 if small else 40)))
    n = rng.choice((1, 2, 3)) if small else rng.choice((1, 4, 8, 16))
    activation = rng.choice(ACTIVATIONS)
    return dict(
        rank=rank, n=n, c=c, k=k, spatial=tuple(spatial), kernel=kernel, stride=stride,
        padding=tuple(pads), dilation=dilation, groups=groups,
        bias=rng.random() < 0.5, scale=rng.random() < 0.3, shift=rng.random() < 0.3,
        residual=rng.random() < 0.3, activation=activation,
        negative_slope=rng.choice((0.01, 0.2)),
        channels_last=rank == 2 and rng.random() < 0.4,
        noncontiguous=rng.random() < 0.15,
    )


def make_inputs(case: dict, precision: Precision, device: str = "cpu",
                generator: torch.Generator | None = None) -> dict[str, Any]:
    """Fresh random tensors for ``case`` (never zeros), in ``precision``'s dtype."""
    dtype = DTYPE[precision]

    def randn(*shape, dtype=dtype):
        return torch.randn(*shape, generator=generator, dtype=torch.float32).to(device, dtype)

    groups = case["groups"]
    x = randn(case["n"], case["c"], *case["spatial"])
    if case.get("noncontiguous"):
        x = torch.cat([x, x], dim=1)[:, ::2]  # channel stride 2: a strided view
    if case.get("channels_last"):
        x = x.contiguous(memory_format=torch.channels_last)
    w = randn(case["k"], case["c"] // groups, *case["kernel"])
    fan_in = (case["c"] // groups) * math.prod(case["kernel"])
    w = w / fan_in ** 0.5
    t = dict(input=x, weight=w)
    t["bias"] = randn(case["k"]) if case["bias"] else None
    t["scale"] = randn(case["k"], dtype=torch.float32) if case["scale"] else None
    t["shift"] = randn(case["k"], dtype=torch.float32) if case["shift"] else None
    out_size = output_size(case)
    t["residual"] = randn(case["n"], case["k"], *out_size) if case["residual"] else None
    return t


def output_size(case: dict) -> tuple[int, ...]:
    return tuple((i + a + b - d * (kk - 1) - 1) // s + 1 for i, (a, b), d, kk, s in zip(
        case["spatial"], case["padding"], case["dilation"], case["kernel"], case["stride"]))


def conv_kwargs(case: dict) -> dict[str, Any]:
    """Keyword arguments for fastconv.conv1d/conv2d (besides the tensors)."""
    return dict(stride=case["stride"], padding=case["padding"], dilation=case["dilation"],
                groups=case["groups"], activation=case["activation"],
                negative_slope=case["negative_slope"])


def reference(case: dict, t: dict[str, Any]) -> torch.Tensor:
    """The float64 result of ``case`` on tensors ``t``: torch's convolution and epilogue."""
    f64 = torch.float64
    x = t["input"].to(f64)
    flat = []
    for a, b in reversed(case["padding"]):
        flat += [a, b]
    x = F.pad(x, flat)
    conv = F.conv1d if case["rank"] == 1 else F.conv2d
    bias = t["bias"].to(f64) if t["bias"] is not None else None
    y = conv(x, t["weight"].to(f64), bias, case["stride"], 0, case["dilation"], case["groups"])
    ep = Epilogue(activation=case["activation"], negative_slope=case["negative_slope"])
    return ep.apply(y, t["scale"], t["shift"], t["residual"])


def run_case(case: dict, t: dict[str, Any], *, backend: str, precision: Precision,
             poison_out: bool = True) -> torch.Tensor:
    """Run ``case`` through fastconv, into a poisoned ``out=`` buffer when asked."""
    from .. import functional

    fn = functional.conv1d if case["rank"] == 1 else functional.conv2d
    out = None
    if poison_out:
        shape = (case["n"], case["k"], *output_size(case))
        out = torch.full(shape, POISON, dtype=t["input"].dtype, device=t["input"].device)
    return fn(t["input"], t["weight"], t["bias"], scale=t["scale"], shift=t["shift"],
              residual=t["residual"], out=out, backend=backend, precision=precision.value,
              **conv_kwargs(case))


def check_case(case: dict, *, backend: str, precision: Precision, device: str = "cpu",
               generator: torch.Generator | None = None) -> float:
    """Relative error of one fresh random run of ``case`` (inf if any element was unwritten
    or non-finite where the reference is finite)."""
    t = make_inputs(case, precision, device, generator)
    out = run_case(case, t, backend=backend, precision=precision)
    ref = reference(case, t)
    if not torch.isfinite(out).all():
        return float("inf")
    return relative_error(out, ref)


def describe(case: dict) -> str:
    sp = "x".join(map(str, case["spatial"]))
    ks = "x".join(map(str, case["kernel"]))
    def tag(prefix, values):
        return prefix + "x".join(map(str, values)) if any(v > 1 for v in values) else ""

    extras = [f"g{case['groups']}" if case["groups"] > 1 else "",
              tag("s", case["stride"]), tag("d", case["dilation"]),
              "cl" if case.get("channels_last") else "", case["activation"]
              if case["activation"] != "none" else "", "res" if case["residual"] else ""]
    return f"{case['rank']}d N{case['n']} {case['c']}->{case['k']} {sp} k{ks} " + \
        " ".join(e for e in extras if e)

