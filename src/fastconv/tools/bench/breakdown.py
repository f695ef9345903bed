"""``fastconv bench --suite models --breakdown``: where one step of a model spends its GPU
time, per kind of kernel and per convolution layer, against each layer's floor.

Two tables per case, precision and mode:

* **step**: one step (``train``: forward, backward and the SGD step; ``eval``: a forward)
  of each provider (``models.provider_call``), profiled with ``torch.profiler``: the GPU
  time of its kernels per step (the sum of their durations, without the gaps between
  them), split by kind (:func:`kind`: convolution, BatchNorm, Inductor's fused kernels,
  elementwise, optimizer, other), with the kernel count and the five longest kernels.
* **layers**: every Conv→BatchNorm(→add)(→activation) layer that ``optimize`` fuses in the
  model, one row per distinct layer (its convolution, input shape and residual), with how
  many times the step runs it. Each is run alone on random inputs of its shapes
  (``train``: forward and backward with a random output gradient; ``eval``: forward) by
  torch (``Sequential(conv, bn, act)`` of the fused layer's ``to_torch``, plus the add),
  by ``torch.compile`` of that block, and by the fused layer itself, and profiled as the
  step: GPU time per call and kernels per call. The floor is the fused layer's: its
  convolutions' FLOP at the measured matrix rate, or its least traffic at the measured
  copy bandwidth, whichever is longer. The least traffic is, with the statistics made in
  the convolution's epilogue and normalisation + activation applied as the next one loads
  its input (MLPerf's fusions): forward, read x and w, write the convolution's output z
  (and read the residual); backward, read the output gradient, z, x and w, write dx and dw
  (and the residual's gradient).

Layers are timed alone, so the table omits what a step does between them (pooling, the
head, the loss, the optimizer): the step table has those. Kernel times come from CUPTI
through the profiler, not from CUDA events: a layer's row is its GPU work, whatever the
host's time per call. Bytes actually moved by each provider need Nsight Compute and are not
measured here.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import json
import math
import re

import torch

from ... import dispatch
from ...precision import Precision
from .timers import restore_cudnn_flags, torch_cudnn_flags

#: (kind, pattern of kernel names), the first match wins
KINDS = (
    ("inductor fused", re.compile(r"^triton_(poi|red|per|tem)_")),
    ("optimizer", re.compile(r"multi_tensor|foreach|sgd|adam", re.I)),
    ("batchnorm", re.compile(r"bn_|batch_norm|batchnorm|welford"
                             r"|^_(stats_partials|stats_finalize|apply|backward_partials"
                             r"|backward_apply)_kernel", re.I)),
    ("convolution", re.compile(r"conv|fprop|dgrad|wgrad|xmma|implicit|gemm|cutlass|splitk"
                               r"|sm90_|sm80_|nchw|nhwc", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|reduce|copy|fill|memset|memcpy"
                               r"|threshold|relu|add|mul|cat", re.I)),
)
#: the layer table's providers: fastconv_cuda_graph runs the fused layer with the fused
#: BatchNorm passes, as a captured training graph does (eager calls take torch's batch norm)
LAYER_PROVIDERS = ("torch", "torch_compile", "fastconv", "fastconv_cuda_graph")


def kind(name: str) -> str:
    """The kind of a kernel, by its name (see ``KINDS``; "other" when none matches)."""
    for label, pattern in KINDS:
        if pattern.search(name):
            return label
    return "other"


def kernel_times(fn, calls: int = 3) -> dict:
    """``fn`` run ``calls`` times under ``torch.profiler`` (GPU kernels): its kernels' GPU
    time per call in ms (``ms``), their number per call, the time by kind, the longest."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    by_name: dict[str, float] = collections.Counter()
    count = 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name] += e.time_range.elapsed_us() / 1000 / calls
            count += 1
    by_kind: dict[str, float] = collections.Counter()
    for name, ms in by_name.items():
        by_kind[kind(name)] += ms
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:5]
    return dict(ms=sum(by_name.values()), kernels=count / calls,
                by_kind={k: round(v, 4) for k, v in sorted(by_kind.items())},
                top=[(name[:120], round(ms, 4)) for name, ms in top])


class _Block(torch.nn.Module):
    """torch's form of a fused layer: ``act(bn(conv(x)) + residual)``."""

    def __init__(self, seq: torch.nn.Sequential):
        super().__init__()
        self.conv, self.bn, self.act = seq

    def forward(self, x, residual=None):
        y = self.bn(self.conv(x))
        return self.act(y if residual is None else y + residual)


def layers(net: torch.nn.Module, forward, train: bool) -> list[dict]:
    """The fused layers of the optimized ``net``, one entry per distinct (layer, input
    shape, residual shape, whether the input needs a gradient) of a ``forward()`` run (with
    autograd when ``train``): module, shapes and count."""
    from ...nn.fused import _ConvBNActMixin

    seen: dict[tuple, dict] = {}
    hooks = []

    def hook(name):
        def record(module, args, kwargs):
            inp = args[0]
            res = args[1] if len(args) > 1 else kwargs.get("residual")
            key = (module.extra_repr(), tuple(inp.shape),
                   None if res is None else tuple(res.shape), inp.requires_grad)
            if key in seen:
                seen[key]["count"] += 1
            else:
                seen[key] = dict(name=name, module=module, input=tuple(inp.shape),
                                 residual=key[2], input_grad=inp.requires_grad, count=1)
        return record
    for name, m in net.named_modules():
        if isinstance(m, _ConvBNActMixin):
            hooks.append(m.register_forward_pre_hook(hook(name), with_kwargs=True))
    try:
        with torch.set_grad_enabled(train):
            forward()
    finally:
        for h in hooks:
            h.remove()
    return list(seen.values())


def floor(layer: dict, precision: Precision, train: bool, ceilings: dict) -> dict:
    """The fused layer's FLOP, least bytes and floor ms (see the module docstring)."""
    m, (n, c, *size) = layer["module"], layer["input"]
    if isinstance(m.padding, str):  # "same" (stride 1) or "valid"
        pad = [d * (k - 1) // 2 if m.padding == "same" else 0
               for d, k in zip(m.dilation, m.kernel_size)]
    else:
        pad = m.padding
    out = [(i + 2 * p - d * (k - 1) - 1) // s + 1 for i, p, d, k, s in
           zip(size, pad, m.dilation, m.kernel_size, m.stride)]
    positions = n * math.prod(out)
    flop = 2 * positions * m.out_channels * (c // m.groups) * math.prod(m.kernel_size)
    item = 4 if precision in (Precision.IEEE, Precision.TF32) else 2
    x, z, w = n * c * math.prod(size), positions * m.out_channels, m.weight.numel()
    r = 0 if layer["residual"] is None else z
    elems = x + w + z + r
    if train:  # dy, z, x, w read; dx (when the input needs it), dw (and dr) written
        dx = x if layer["input_grad"] else 0
        flop *= 3 if dx else 2
        elems += 2 * z + x + w + dx + w + r
    bytes_ = elems * item
    ms = None
    rate = ceilings.get(f"{precision.value}_tflops")
    if rate and ceilings.get("hbm_gbps"):
        ms = max(flop / rate / 1e9, bytes_ / ceilings["hbm_gbps"] / 1e6)
    return dict(gflop=flop / 1e9, floor_mb=bytes_ / 1e6, floor_ms=ms)


def layer_calls(layer: dict, precision: Precision, train: bool, providers) -> dict:
    """provider -> a call running the layer alone (train: forward and backward)."""
    half = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(precision)
    fused = layer["module"]
    dev = fused.weight.device
    fmt = torch.channels_last if half is not None and len(layer["input"]) == 4 \
        else torch.contiguous_format
    dtype = half or torch.float32
    x = torch.randn(layer["input"], device=dev, dtype=dtype).contiguous(memory_format=fmt)
    x.requires_grad_(train and layer["input_grad"])
    r = None
    if layer["residual"] is not None:
        r = torch.randn(layer["residual"], device=dev, dtype=dtype) \
            .contiguous(memory_format=fmt).requires_grad_(train)
    calls = {}
    for provider in providers:
        if provider.startswith("fastconv"):
            net = copy.deepcopy(fused)
        else:
            net = _Block(fused.to_torch())
            if fmt is torch.channels_last:
                net = net.to(memory_format=fmt)
            if provider == "torch_compile":
                # (every layer's block shares one forward: a reset keeps dynamo's
                # recompile limit from sending later layers to eager)
                torch._dynamo.reset()
                net = torch.compile(net)
        net.train(train)
        calls[provider] = _call(net, x, r, half, train, provider == "fastconv_cuda_graph")
    return calls


def _call(net, x, r, half, train, fused_bn):
    """The call: under autocast to ``half`` (fastconv's modules honour it, as the optimized
    model runs them), with the fused BatchNorm passes where ``fused_bn``, with a backward of
    a random output gradient when ``train``."""
    from ...batchnorm import fused_passes

    grad = []

    def run():
        with torch.autocast(x.device.type, dtype=half or torch.float32,
                            enabled=half is not None), \
                (fused_passes() if fused_bn else contextlib.nullcontext()):
            y = net(x, r)
        if train:
            if not grad:
                grad.append(torch.randn_like(y))
            y.backward(grad[0])
            x.grad = None
            if r is not None:
                r.grad = None
            for p in net.parameters():
                p.grad = None
        return y
    if not train:
        return torch.no_grad()(run)
    return run


def run_case(case, providers, precision: Precision, mode: str, device: str,
             ceilings: dict, echo: bool = False) -> list[dict]:
    """The step rows (``table="step"``) and the layer rows (``table="layers"``); ``echo``
    prints each row as a JSON line once measured (a run cut short keeps them in its log)."""
    from .models import BUILDERS, model_input, no_dropout, provider_call

    train = mode == "train"
    torch.manual_seed(0)
    model = BUILDERS[case.model]().to(device).train(train)
    x = model_input(case.model, case.batch, case.size, device)
    flags = torch_cudnn_flags(precision)
    rows = []
    try:
        for provider in providers:
            row = dict(table="step", case=case.name, provider=provider, mode=mode,
                       precision=precision.value, batch=case.batch, size=case.size)
            rows.append(row)
            try:
                fn, net = provider_call(provider, model, x, precision, mode)
                with no_dropout(net):
                    fn()
                    dispatch.finish_builds(upgrades=True)
                    fn()
                    if device == "cuda":
                        row.update(kernel_times(fn))
                    else:
                        row["timing"] = "not measured (no GPU)"
            except Exception as exc:  # reported, not fatal
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            if echo:
                print(json.dumps(row), flush=True)
        # the layers: those of an eager optimized copy (a graphed one runs no hooks)
        from ...optimize import optimize
        net = optimize(model, "training" if train else "inference", precision.value,
                       channels_last=precision in (Precision.BF16, Precision.FP16))
        found = layers(net, lambda: net(x), train)
        found.sort(key=lambda lay: -floor(lay, precision, train, {})["gflop"] * lay["count"])
        wanted = [p for p in LAYER_PROVIDERS if p in providers]
        for layer in found:
            base = dict(table="layers", case=case.name, mode=mode, precision=precision.value,
                        layer=layer["name"], conv=layer["module"].extra_repr(),
                        input=list(layer["input"]), residual=layer["residual"] is not None,
                        count=layer["count"], **floor(layer, precision, train, ceilings))
            try:
                calls = layer_calls(layer, precision, train, wanted)
            except Exception as exc:
                rows.append(dict(base, error=f"{type(exc).__name__}: {str(exc)[:300]}"))
                continue
            for provider, fn in calls.items():
                row = dict(base, provider=provider)
                rows.append(row)
                try:
                    fn()
                    dispatch.finish_builds(upgrades=True)
                    fn()
                    if device == "cuda":
                        t = kernel_times(fn, calls=5)
                        row.update(ms=t["ms"], kernels=t["kernels"], by_kind=t["by_kind"])
                        if base["floor_ms"]:
                            row["floor_fraction"] = base["floor_ms"] / t["ms"]
                    else:
                        row["timing"] = "not measured (no GPU)"
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                if echo:
                    print(json.dumps({k: v for k, v in row.items() if k != "by_kind"}),
                          flush=True)
    finally:
        restore_cudnn_flags(flags)
    return rows


def table(rows: list[dict]) -> str:
    """The two tables as text: steps by kind, then layers (ms per call, % of floor)."""
    lines = []
    steps = [r for r in rows if r["table"] == "step"]
    kinds = sorted({k for r in steps for k in r.get("by_kind", {})})
    lines.append("step: GPU ms of kernels per step, by kind")
    lines.append(f"{'provider':22}{'total':>9}{'kernels':>9}" +
                 "".join(f"{k[:13]:>14}" for k in kinds))
    for r in steps:
        if "ms" not in r:
            lines.append(f"{r['provider']:22}{r.get('error', r.get('timing', ''))}")
            continue
        lines.append(f"{r['provider']:22}{r['ms']:9.2f}{r['kernels']:9.0f}" +
                     "".join(f"{r['by_kind'].get(k, 0):14.2f}" for k in kinds))
    layer_rows = [r for r in rows if r["table"] == "layers"]
    provs = list(dict.fromkeys(r["provider"] for r in layer_rows if "provider" in r))
    lines.append("layers: GPU ms per call (% of the fused floor); x count = per step")
    lines.append(f"{'layer':34}{'n':>3}{'floor':>8}" + "".join(f"{p[:16]:>20}" for p in provs))
    by_layer: dict[str, dict] = {}
    for r in layer_rows:
        name = r["layer"].removeprefix("model.").removesuffix("_bn_act")
        by_layer.setdefault(f"{name} {r['input'][1:]}", {})[r.get("provider")] = r
    total = collections.Counter()
    for name, got in by_layer.items():
        first = next(iter(got.values()))
        fl = first.get("floor_ms")
        cells = []
        for p in provs:
            r = got.get(p, {})
            if "ms" in r:
                total[p] += r["ms"] * r["count"]
                pct = f" ({100 * fl / r['ms']:3.0f}%)" if fl else ""
                cells.append(f"{r['ms']:13.3f}{pct}")
            else:
                cells.append(f"{'-':>20}")
        fl_s = f"{fl:8.3f}" if fl else f"{'-':>8}"
        lines.append(f"{name[:34]:34}{first['count']:3d}{fl_s}"
                     + "".join(f"{c:>20}" for c in cells))
        if fl:
            total["floor"] += fl * first["count"]
    if total:
        lines.append(f"{'sum x count':34}{'':3}{total['floor']:8.2f}" +
                     "".join(f"{total[p]:20.2f}" for p in provs))
    return "\n".join(lines)
