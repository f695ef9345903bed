"""``optimize(model)``: the same function, run through fastconv's fused layers.

The model is copied, traced with torch.fx (a module walk over ``nn.Sequential`` chains when
it does not trace), and every chain

    Conv1d/Conv2d -> BatchNorm -> [add(residual)] -> [activation]

whose intermediate results have no other use becomes one :class:`fastconv.nn.ConvBNAct1d`/
``2d`` (training: batch statistics and their backward in the fused path; inference:
BatchNorm folded into the convolution). Every other convolution becomes its fastconv
counterpart. ``.report`` lists each pattern fused and each convolution left alone, with the
reason. Cases that would change the result are left alone: a module called on two paths,
an intermediate result used twice, a transposed convolution before the BatchNorm, a
BatchNorm subclass with a forward of its own. torchvision's ``FrozenBatchNorm2d`` becomes
a BatchNorm that stays in eval mode (same buffers and state_dict keys) and fuses as one. A
BatchNorm keeps its own train/eval flag inside the fused layer.
"""

from __future__ import annotations

import collections
import copy
import itertools

import torch
from torch import nn

from .. import backends, original
from ..errors import ConvError
from ..nn import convert
from ..tracing import KeptWhole, trace
from .frozen import unfreeze_frozen_norms
from .fuse import fuse_graph, walk
from .model import OptimizedModel
from .report import WALKED, Report

__all__ = ["CUDA_GRAPH_MODES", "MODES", "OptimizedModel", "Report", "compile_model",
           "optimize"]

MODES = ("inference", "training")


def _copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model``. torch's deepcopy of a TorchScript module gives it
    parameters that are not leaves (computed from the originals), which a backward never
    reaches: those are made leaves again, with the same values."""
    model = copy.deepcopy(model)
    for m in model.modules():
        if isinstance(m, torch.jit.ScriptModule):
            for name, p in list(m.named_parameters(recurse=False)):
                if not p.is_leaf:
                    setattr(m, name, nn.Parameter(p.detach(), requires_grad=p.requires_grad))
    return model


def optimize(model: nn.Module, mode: str = "inference", precision: str | None = None,
             channels_last: bool = True, cuda_graph: bool = False,
             example_inputs=None) -> OptimizedModel:
    """A copy of ``model`` that computes the same function through fastconv's layers.

    Every chain Conv → BatchNorm → [add] → [activation] whose intermediate results have no
    other use becomes one ``fastconv.nn.ConvBNAct2d`` (or 1d): in inference the BatchNorm
    is folded into the convolution, in training its statistics and backward are the fused
    layer's. Every other ``nn.Conv1d``/``nn.Conv2d``/``nn.ConvTranspose*`` becomes its
    fastconv counterpart. ``model`` itself is not changed.

    Args:
        model: any ``nn.Module``.
        mode: ``"inference"`` (the copy in eval mode) or ``"training"`` (in train mode;
            BatchNorms the user froze in eval stay so).
        precision: None (torch's own: TF32 where ``torch.backends.cudnn.allow_tf32``),
            ``"ieee"``, ``"tf32"``, or ``"bf16"`` / ``"fp16"`` (the forward runs under
            ``torch.autocast`` in that dtype).
        channels_last: convert parameters and 4-D inputs to channels-last.
        cuda_graph: on a GPU, replay one CUDA graph per input signature: of the forward in
            inference; of the forward and its backward in training (your optimizer step
            stays yours; call ``zero_grad(set_to_none=True)`` between steps).
        example_inputs: a tuple of inputs run once through the copy, to check it.

    Returns:
        An :class:`OptimizedModel`: call it as the model. ``.report`` lists every pattern
        fused and every convolution left alone, with the reason, and notes (a model torch.fx
        cannot trace, modules kept whole, CUDA-graph captures that failed);
        ``.report.coverage()`` gives (fused, followed by a BatchNorm or causal, all).
        ``.model`` is the rewritten module. ``state_dict()``, ``load_state_dict`` and
        ``named_parameters()`` use the original model's names, metadata and order.

    What is kept as it is, never changed in meaning: a module whose forward changes the
    grad mode or autocast, has hooks, or is a TorchScript module (called as it is, nothing
    inside fused); a convolution or BatchNorm called on two paths or with hooks (not fused).
    A model torch.fx cannot trace (Python control flow on tensor values, or its own forward
    is such a region) gets only its ``nn.Sequential`` Conv → BatchNorm → activation runs
    fused, each when the Sequential is called as a whole; the report says how to make it
    traceable.

    Raises:
        ConvError: an unknown ``mode`` or ``precision``.
    """
    if mode not in MODES:
        raise ConvError(f"mode: got {mode!r}; allowed: {', '.join(map(repr, MODES))}")
    if precision not in (None, "ieee", "tf32", "bf16", "fp16"):
        raise ConvError(f"precision: got {precision!r}; allowed: None, 'ieee', 'tf32', "
                        f"'bf16', 'fp16'")
    report = Report()
    model = _copy(model)
    if any(t.is_cuda for t in itertools.chain(model.parameters(), model.buffers())):
        backends.REGISTRY["triton"].warm_up()  # Triton's driver made while this traces
    names = collections.defaultdict(list)  # each tensor's state_dict keys in the original
    for key, t in model.state_dict(keep_vars=True).items():
        names[id(t)].append(key)
    metadata, order = original.Names.of(model)
    unfreeze_frozen_norms(model, report)
    if mode == "inference":
        model.eval()
    elif not model.training:  # a training copy of an eval model; BatchNorms frozen by the
        model.train()  # user inside a training model keep their eval flag
    conv_precision = precision if precision in ("ieee", "tf32") else None
    state_keys: dict[str, str] = {}
    try:
        gm, notes = trace(model)
    except Exception as exc:
        why = str(exc) if isinstance(exc, KeptWhole) else (
            f"torch.fx could not trace the model ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:120]})")
        report.notes.append(f"not traced: {why}; {WALKED}")
        out = convert(model, inplace=True, precision=conv_precision)
        walk(out, report, conv_precision)
    else:
        report.notes += notes
        out = convert(fuse_graph(gm, report, conv_precision, state_keys), inplace=True,
                      precision=conv_precision)
    if channels_last:
        out = out.to(memory_format=torch.channels_last)
    if cuda_graph and not torch.cuda.is_available():
        report.notes.append("cuda_graph: replays on a GPU only; running eagerly")
        cuda_graph = False
    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    held = {state_keys.get(k, k) for k in out.state_dict()}
    aliases = {key: next(k for k in keys if k in held) for keys in names.values()
               if len(keys) > 1 and any(k in held for k in keys)
               for key in keys if key not in held}
    kept = original.Names(state_keys, aliases, metadata, order)
    original.order_modules(out, kept)
    result = OptimizedModel(out, report, channels_last, autocast, cuda_graph, kept)
    result.training = out.training
    if example_inputs is not None:
        with torch.no_grad():
            result(*example_inputs)
    return result


#: torch.compile modes that replay the compiled graph through CUDA graphs
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def compile_model(model: nn.Module, precision: str | None = None, *,
                  training: bool | None = None, channels_last: bool = True,
                  mode: str | None = None, fullgraph: bool = False,
                  dynamic: bool | None = None, backend="inductor",
                  combo_kernels: bool | None = None):
    """``torch.compile(optimize(model))`` with Inductor's combo kernels (exported as
    ``fastconv.compile``).

    ``training`` picks :func:`optimize`'s mode (None: the model's own ``training`` flag);
    ``precision`` and ``channels_last`` are :func:`optimize`'s; ``mode``, ``fullgraph``,
    ``dynamic`` and ``backend`` are ``torch.compile``'s. In the CUDA-graph modes
    (``CUDA_GRAPH_MODES``) the convolutions are fastconv's ops, its kernels replayed with no
    host cost; in the others they are torch's own operators, which Inductor fuses (a custom
    op's host cost per call would lose more than its kernel gains). Inside a compiled graph the
    BatchNorm folds that eager calls cache run every call (an in-place parameter update must
    reach a reduce-overhead replay), one small kernel pair per layer; ``combo_kernels``
    fuses such independent kernels horizontally (Inductor's ``combo_kernels`` option, set
    for this compilation only: timm resnet50 on an H100, 199 kernels per replay become 104,
    benchmarks/NOTES.md). ``combo_kernels=None`` sets it in the CUDA-graph modes only: in the
    others the folds are not in the graph, and combo kernels made timm convnext_tiny slower
    (5.4 against 3.1 ms). Modes are passed to Inductor as their options
    (``torch._inductor.list_mode_options``), since ``torch.compile`` takes a mode or options,
    not both."""
    if training is None:
        training = model.training
    net = optimize(model, "training" if training else "inference", precision,
                   channels_last=channels_last)
    # Without CUDA graphs each fastconv op inside the compiled graph costs host time that its
    # kernel rarely wins back: the modules trace as torch's own operators there
    # (compiled_as_torch, their default); with CUDA graphs they keep fastconv's op.
    graphs = mode in CUDA_GRAPH_MODES
    for m in net.modules():
        if hasattr(m, "compiled_as_torch"):
            m.compiled_as_torch = not graphs
    if combo_kernels is None:
        combo_kernels = graphs
    if backend != "inductor" or not combo_kernels:
        return torch.compile(net, mode=mode, fullgraph=fullgraph, dynamic=dynamic,
                             backend=backend)
    from torch._inductor import list_mode_options

    options = dict(list_mode_options(mode or "default", dynamic))
    options["combo_kernels"] = True
    return torch.compile(net, fullgraph=fullgraph, dynamic=dynamic, backend=backend,
                         options=options)
