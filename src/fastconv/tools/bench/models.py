"""Suite ``models``: whole torchvision and timm models through torch and through
fastconv.optimize.

Cases are named by model and batch (``deeplabv3_r50_b8``: DeepLabV3-ResNet50, batch 8,
512x512; ``mamba_conv_b8_l2048``: the convolution part of a Mamba block of Mamba-1.4B's
widths, batch 8, 2,048 positions; ``mamba130m_conv_b8_l2048``: Mamba-130M's widths).
Modes: ``eval`` (inference under no_grad) and ``train`` (forward, backward and an SGD step).
Providers: ``torch`` (eager; bf16/fp16 run channels-last under autocast, as users run mixed
precision), ``torch_compile`` and ``torch_compile_ro`` (mode="reduce-overhead"),
``fastconv`` (``optimize`` of the model in the same precision), ``fastconv_cuda_graph`` (the
same with ``cuda_graph=True``: inference replayed, training forward + backward replayed, the
SGD step eager), ``fastconv_compile`` and ``fastconv_compile_ro`` (``fastconv.compile``:
``torch.compile`` of the optimized model with combo kernels, default and reduce-overhead
mode). Every row has ``first_call_s``: the first call's wall time (compilation, dispatch and
autotuning), kept out of the timing, and ``prepare_s``: the time to build the provider's
model before it (``optimize``'s trace and fusion, torch's ``deepcopy`` and channels-last
copy, ``torch.compile``'s wrapper; a user's first result waits for both); fastconv rows also
``builds_left_s``: how long kernels the first call left compiling in the background (aten
running their layers meanwhile) took to finish after it, and what the first call spent
timing candidates (``first_call_timing_s``, the tuning budget's count) and waiting for
background builds (``first_call_build_wait_s``: strong priors, budgeted waits, a CUDA-graph
capture's wait for chosen kernels). Every row's ``rel_err`` is against a
float64 run of the same model (dropout off), so the table shows torch's own error beside
fastconv's. In ``train`` rows (BatchNorm on batch statistics) DeepLab in bf16 shows ~0.79 for every
provider, torch's included (ResNet-50: 0.12); the cause is not established (fp32 stays near
1e-4 on the CPU), so compare providers there, not against the contract.
``eval`` rows are also timed as CUDA-graph replays (``graph_ms_p50``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import sys
import time

import torch

from ... import dispatch
from ...precision import Precision, relative_error
from .timers import restore_cudnn_flags, torch_cudnn_flags

PROVIDERS = ("torch", "torch_compile", "torch_compile_ro", "fastconv", "fastconv_cuda_graph",
             "fastconv_compile", "fastconv_compile_ro")
MODES = ("eval", "train")


@dataclasses.dataclass(frozen=True)
class ModelCase:
    name: str
    model: str  # a key of BUILDERS
    batch: int
    size: int  # an image's side, or a sequence's length (SEQUENCE_MODELS)


def _deeplab():
    import torchvision

    return torchvision.models.segmentation.deeplabv3_resnet50(
        weights=None, weights_backbone=None, num_classes=21, aux_loss=False)


def _resnet50():
    import torchvision

    return torchvision.models.resnet50()


def _torchvision(name: str):
    def build():
        import torchvision

        return getattr(torchvision.models, name)(weights=None)
    return build


def _timm(name: str):
    def build():
        import timm  # the test/bench extra; pretrained=False: nothing is downloaded

        return timm.create_model(name, pretrained=False)
    return build


class MambaConvBlock(torch.nn.Module):
    """The convolution part of a Mamba block (Mamba-1.4B's widths), in plain torch as
    Mamba's reference code writes it: LayerNorm, in_proj, the causal depthwise conv1d as
    ``nn.Conv1d(padding=width - 1)`` and a slice, SiLU, the gate, out_proj and the residual.
    The selective scan is left out: it is not a convolution, and plain torch's is sequential."""

    def __init__(self, d_model: int = 2048, expand: int = 2, width: int = 4):
        super().__init__()
        inner = expand * d_model
        self.norm = torch.nn.LayerNorm(d_model)
        self.in_proj = torch.nn.Linear(d_model, 2 * inner, bias=False)
        self.conv1d = torch.nn.Conv1d(inner, inner, width, groups=inner, padding=width - 1)
        self.act = torch.nn.SiLU()
        self.out_proj = torch.nn.Linear(inner, d_model, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (batch, seqlen, d_model)
        seqlen = h.shape[1]
        x, z = self.in_proj(self.norm(h)).transpose(1, 2).chunk(2, dim=1)
        x = self.act(self.conv1d(x)[..., :seqlen])
        return h + self.out_proj((x * torch.nn.functional.silu(z)).transpose(1, 2))


BUILDERS = {"deeplabv3_r50": _deeplab, "resnet50": _resnet50, "mamba_conv": MambaConvBlock,
            "mamba130m_conv": lambda: MambaConvBlock(d_model=768)}
#: models whose input is (batch, size = seqlen, d_model), not an image: their d_model
SEQUENCE_MODELS = {"mamba_conv": 2048, "mamba130m_conv": 768}
BUILDERS.update({f"tv_{n}": _torchvision(n) for n in (
    "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny", "regnet_y_1_6gf")})
BUILDERS.update({f"timm_{n}": _timm(n) for n in (
    "resnet50", "resnext50_32x4d", "efficientnet_b0", "mobilenetv3_large_100",
    "convnext_tiny")})
CASES = [ModelCase("deeplabv3_r50_b8", "deeplabv3_r50", 8, 512),
         ModelCase("deeplabv3_r50_b1", "deeplabv3_r50", 1, 512),
         ModelCase("resnet50_b64", "resnet50", 64, 224),
         # where the GPU is the limit (issue 55): torchvision's and timm's ResNet-50
         ModelCase("resnet50_b256", "resnet50", 256, 224),
         ModelCase("timm_resnet50_b256", "timm_resnet50", 256, 224),
         # issue 56: a Mamba block's convolution part against torch.compile
         ModelCase("mamba_conv_b8_l2048", "mamba_conv", 8, 2048),
         ModelCase("mamba130m_conv_b8_l2048", "mamba130m_conv", 8, 2048)]
# the zoo of issue 22 at batch 32, 224x224, and at 256 where the GPU is the limit (issue 55)
CASES += [ModelCase(f"{key}_b{batch}", key, batch, 224) for batch in (32, 256)
          for key in BUILDERS if key.startswith(("tv_", "timm_"))
          and f"{key}_b{batch}" != "timm_resnet50_b256"]  # listed above


def shrink(case: ModelCase) -> ModelCase:
    """The CPU version: batch 2 (BatchNorm in training needs 2), 64x64 (64 positions)."""
    return dataclasses.replace(case, batch=2, size=64)


def model_input(model: str, batch: int, size: int, device) -> torch.Tensor:
    """A random batch for the model named (a key of BUILDERS, or another name: an image
    model): images (batch, 3, size, size), or (batch, size, d_model) for a sequence model."""
    if model in SEQUENCE_MODELS:
        return torch.randn(batch, size, SEQUENCE_MODELS[model], device=device)
    return torch.randn(batch, 3, size, size, device=device)


def output(y) -> torch.Tensor:
    return y["out"] if isinstance(y, dict) else y


@contextlib.contextmanager
def no_dropout(net: torch.nn.Module):
    """Dropout and stochastic depth (torchvision's StochasticDepth, timm's DropPath) off for
    a comparison (random: a dropout mask follows the memory layout, which differs between
    channels-first and channels-last runs; a training row of torchvision efficientnet_b0
    read a relative error of 0.87 for torch itself with its stochastic depth on)."""
    drops = [m for m in net.modules() if m.training and (
        isinstance(m, torch.nn.modules.dropout._DropoutNd)
        or type(m).__name__ in ("StochasticDepth", "DropPath"))]
    for m in drops:
        m.train(False)
    try:
        yield
    finally:
        for m in drops:
            m.train(True)


def float64_truth(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's output in float64 (same weights and mode, dropout off)."""
    truth = copy.deepcopy(model).double()
    with torch.no_grad(), no_dropout(truth):
        return output(truth(x.double()))


def train_step(net: torch.nn.Module, x: torch.Tensor, lr: float = 1e-3):
    """A training step of ``net`` on ``x`` (loss: mean square of the output; SGD)."""
    opt = torch.optim.SGD(net.parameters(), lr=lr)

    def step():
        y = output(net(x))
        y.float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return y.detach()
    return step


def provider_call(provider: str, model, x, precision: Precision, mode: str, wrap=None):
    """(call, network) for one provider (the demo runs its rows through it too). ``wrap``
    (e.g. DistributedDataParallel) wraps the provider's module: torch's before
    ``torch.compile`` compiles it, fastconv's ``optimize`` result (not ``fastconv.compile``)."""
    from ...optimize import compile_model, optimize

    if wrap is not None and provider.startswith("fastconv_compile"):
        raise ValueError(f"{provider}: not run wrapped (DistributedDataParallel)")
    wrap = wrap or (lambda net: net)

    half = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(precision)
    cmode = "reduce-overhead" if provider.endswith("_ro") else None
    if provider.startswith("fastconv_compile"):  # the recommended entry point
        net = compile_model(model, precision.value, training=mode == "train",
                            channels_last=half is not None, mode=cmode)
    elif provider.startswith("fastconv"):
        net = wrap(optimize(model, "training" if mode == "train" else "inference",
                            precision.value, channels_last=half is not None,
                            cuda_graph=provider == "fastconv_cuda_graph"))
    else:
        net = copy.deepcopy(model)
        if half is not None:
            net = net.to(memory_format=torch.channels_last)  # (its 4-D parameters)
            if x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
        net = wrap(net)
        if provider.startswith("torch_compile"):
            net = torch.compile(net, mode=cmode)

    def forward():
        if half is not None and not provider.startswith("fastconv"):
            with torch.autocast(x.device.type, dtype=half):
                return output(net(x))
        return output(net(x))
    if mode == "train":
        inner = _Wrapped(forward, net)
        return train_step(inner, x), net

    def infer():
        with torch.no_grad():
            return forward()
    return infer, net


class _Wrapped(torch.nn.Module):
    """A module whose forward is ``fn()`` (the provider's forward) and whose parameters are
    ``net``'s, so that :func:`train_step` builds its optimizer over them."""

    def __init__(self, fn, net):
        super().__init__()
        self.fn, self.net = fn, net

    def forward(self, x):
        return self.fn()


def _say(case: ModelCase, what: str, start: float) -> float:
    """The seconds since ``start``, also said on stderr (a model's stages at batch 256 take
    minutes: a log cut by a timeout shows which one held it)."""
    seconds = time.perf_counter() - start
    print(f"  {case.name}: {what} in {seconds:.1f} s", file=sys.stderr, flush=True)
    return seconds


def run_case(case: ModelCase, providers: list[str], precision: Precision, mode: str,
             device: str = "cuda", timer=None, reps: int = 20) -> list[dict]:
    """One row per provider (DESIGN.md §7 fields plus ``images_per_s``)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: the models suite runs {', '.join(MODES)}")
    torch.manual_seed(0)
    try:
        model = BUILDERS[case.model]().to(device).train(mode == "train")
    except ImportError as exc:  # timm not installed: every provider's row says so
        return [dict(case=case.name, provider=p, precision=precision.value, mode=mode,
                     error=f"{type(exc).__name__}: {exc} (pip install timm)")
                for p in providers]
    x = model_input(case.model, case.batch, case.size, device)
    start = time.perf_counter()
    truth = float64_truth(model, x)
    _say(case, "float64 reference", start)
    flags = torch_cudnn_flags(precision)
    layout = "nhwc" if precision in (Precision.BF16, Precision.FP16) else "nchw"
    rows = []
    try:
        ready = {}  # provider -> (row, its call); the others' rows carry their error
        for provider in providers:
            row = dict(case=case.name, provider=provider, precision=precision.value,
                       mode=mode, layout=layout, batch=case.batch, size=case.size)
            rows.append(row)
            try:
                if provider not in PROVIDERS:
                    raise ValueError(f"not a models provider (use {', '.join(PROVIDERS)})")
                start = time.perf_counter()
                fn, net = provider_call(provider, model, x, precision, mode)
                row["prepare_s"] = _say(case, f"{provider} prepared", start)
                start = time.perf_counter()
                timed, waited = dispatch.budget.TUNING.spent_s, dispatch.timing.WAITED["builds_s"]
                with no_dropout(net):
                    y = fn()  # compiles, dispatches and autotunes: kept out of the timing
                if device == "cuda":
                    torch.cuda.synchronize()
                row["first_call_s"] = _say(case, f"{provider} first call", start)
                if provider.startswith("fastconv"):
                    row["first_call_timing_s"] = dispatch.budget.TUNING.spent_s - timed
                    row["first_call_build_wait_s"] = dispatch.timing.WAITED["builds_s"] - waited
                    print(f"  {case.name}: {provider} first call: timing "
                          f"{row['first_call_timing_s']:.1f} s, waiting for builds "
                          f"{row['first_call_build_wait_s']:.1f} s", file=sys.stderr,
                          flush=True)
                    # kernels the first call left compiling in the background (aten ran
                    # meanwhile, and the choices a tuning budget cut short wait for them
                    # to be timed): their wait, before the steady state is timed
                    start = time.perf_counter()
                    dispatch.finish_builds(upgrades=True)
                    row["builds_left_s"] = _say(case, f"{provider} builds left", start)
                row["rel_err"] = relative_error(y, truth)
                if y.dim() == 4:  # a segmentation's or classifier's classes
                    row["mask_agreement"] = float(
                        (y.argmax(1) == truth.argmax(1)).float().mean())
                if provider.startswith("fastconv"):
                    row["choice"] = (f"{len(net.report.fused)} fused, "
                                     f"{len(net.report.left)} left")
                    if net.report.notes:
                        row["notes"] = "; ".join(net.report.notes)
            except Exception as exc:  # reported, not fatal
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                continue
            ready[provider] = (row, fn)
        if timer is None:
            for row, _ in ready.values():
                row.update(ms_p50=None, timing="not measured (no GPU)")
            return rows
        from .timers import percentiles

        try:  # (the providers interleaved: runner.GpuTimer.eager_rounds)
            start = time.perf_counter()
            eager = timer.eager_rounds({p: [v[1]] for p, v in ready.items()}, reps)
            _say(case, "steps timed", start)
        except Exception as exc:
            for row, _ in ready.values():
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            return rows
        for provider, (row, fn) in ready.items():
            try:
                p50, p20, p80 = percentiles(eager[provider])
                # (reduce-overhead replays compile's own CUDA graphs: none around them)
                graph = (timer.graph([fn]) if mode == "eval" and not provider.endswith("_ro")
                         else None)
                row.update(ms_p50=p50, ms_p20=p20, ms_p80=p80,
                           images_per_s=case.batch * 1000 / p50,
                           graph_ms_p50=sorted(graph)[len(graph) // 2] if graph else None)
            except Exception as exc:  # reported, not fatal
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        restore_cudnn_flags(flags)
    return rows
