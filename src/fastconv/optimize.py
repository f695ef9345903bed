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
import dataclasses
import itertools
import operator

import torch
import torch.nn.functional as F
from torch import nn

from . import backends, dispatch, original
from .errors import ConvError
from .nn import convert, step
from .nn.chained import ChainedSequential
from .nn.conv import Conv1d, Conv2d, _FastconvMixin
from .nn.fused import ConvBNAct1d, ConvBNAct2d, _activation_of
from .tracing import TRAINING_ARG, KeptWhole, has_hooks, known_norm, trace

MODES = ("inference", "training")

_FUNCTION_ACTIVATIONS = {
    F.relu: "relu", torch.relu: "relu", torch.relu_: "relu", F.relu6: "relu6",
    F.silu: "silu", F.hardswish: "hardswish", torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid",
    torch.tanh: "tanh", F.tanh: "tanh",
}
_ADDS = (operator.add, operator.iadd, torch.add)
_NO_NORM = "not followed by a BatchNorm module"
_UNSEEN = ("not a Conv -> BatchNorm run of an nn.Sequential's children (the model was not "
           "traced, so nothing else is fused)")
_HOOKED = "has hooks (left as it is, so that they run)"
_WALKED = ("fused only Conv -> BatchNorm runs of nn.Sequential children, each when the "
           "Sequential is called as a whole. To fuse more, make the forward traceable by "
           "torch.fx: no Python control flow on tensor values (torch.fx's 'Limitations of "
           "Symbolic Tracing')")
_FUSED = {1: (nn.Conv1d, nn.BatchNorm1d, ConvBNAct1d), 2: (nn.Conv2d, nn.BatchNorm2d, ConvBNAct2d)}


@dataclasses.dataclass
class Report:
    """What :func:`optimize` did: ``fused`` (conv name, pattern) and ``left`` (conv name,
    reason), plus notes on the whole model."""
    fused: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    left: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def coverage(self) -> tuple[int, int, int]:
        """(fused, eligible, total) convolutions: eligible ones are followed by a BatchNorm
        (fused, or left for a reason the report gives); total counts every convolution the
        pass looked at (the module walk, without a trace, sees only Sequential chains)."""
        eligible = len(self.fused) + sum(not why.startswith(_NO_NORM) and why != _UNSEEN
                                         for _, why in self.left)
        return len(self.fused), eligible, len(self.fused) + len(self.left)

    def __str__(self) -> str:
        fused, eligible, total = self.coverage()
        lines = [f"fused {fused} of {eligible} convolutions followed by a BatchNorm "
                 f"({total} convolutions), left {len(self.left)}"]
        lines += [f"  fused {name}: {pattern}" for name, pattern in self.fused]
        lines += [f"  left  {name}: {why}" for name, why in self.left]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


class OptimizedModel(nn.Module):
    """The optimized copy of a model (``.model``), with ``.report``; its forward converts
    4-D tensor inputs to channels-last when asked, runs under autocast for bf16/fp16, and
    with ``cuda_graph`` on a GPU replays CUDA graphs per input signature: of the forward in
    inference; of the forward and its backward in training
    (``torch.cuda.make_graphed_callables``; the optimizer step stays the caller's).

    An eager training forward batches host work the layers would do one by one
    (:mod:`fastconv.nn.step`): one cast of every convolution parameter to the autocast
    dtype, one increment of every fused BatchNorm's ``num_batches_tracked`` when the forward
    ends. The values are the per-layer work's; the weight gradients reach their parameters
    at the end of the backward (not under ``torch.distributed``, where the casts stay per
    layer).

    An inference graph is captured again when a parameter or buffer was changed in place
    since its capture (the layers' cached folded weights are read by the graph).
    Training graphs compute what eager calls compute, with these rules: the warm-up runs
    before capture leave the running statistics as they were (they are restored); a call
    while any parameter already holds a gradient runs eagerly (a replayed backward writes
    its gradients into the graph's own buffers, which would alias an accumulated gradient:
    use ``zero_grad(set_to_none=True)`` between steps, as torch's optimizers do by default);
    parameters must keep their tensors (an optimizer updates them in place; replacing one
    needs a new ``optimize``); a model that cannot be captured (e.g. a host
    synchronisation in its forward) runs eagerly, with the reason in ``report.notes``.

    ``state_dict()`` has the original model's keys and metadata (a fused layer's parameters
    and buffers under its convolution's and BatchNorm's names, no ``model.`` prefix) and
    ``load_state_dict`` takes them: checkpoints move both ways between the original model
    and the optimized one. ``named_parameters()`` and ``parameters()`` give the original
    names in the original order, so optimizer checkpoints move both ways too
    (:mod:`fastconv.original`); ``.model.named_parameters()`` shows the copy's own names.
    """

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True):
        if not recurse:
            return super().named_parameters(prefix, recurse, remove_duplicate)
        return original.named_parameters(self, prefix, remove_duplicate)

    def __init__(self, model: nn.Module, report: Report, channels_last: bool,
                 autocast: torch.dtype | None, cuda_graph: bool, names: original.Names):
        super().__init__()
        self.model = model
        self._names = names
        self._load_prefix = ""
        self.register_state_dict_post_hook(original.save_hook)
        self.register_load_state_dict_pre_hook(original.load_hook)
        self.register_load_state_dict_post_hook(original.report_hook)
        self.report = report
        self.channels_last = channels_last
        self.autocast = autocast
        self.cuda_graph = cuda_graph
        self._graphs: dict = {}
        self._train_graphs: dict = {}
        self._noted_held_grads = False

    def __getstate__(self) -> dict:
        """Pickled and deep-copied without its CUDA graphs and the modules it found (made
        again at the next call)."""
        state = super().__getstate__()
        state["_graphs"], state["_train_graphs"] = {}, {}
        state.pop("_convs", None)
        return state

    def _prepare(self, args):
        if not self.channels_last:
            return args
        return tuple(a.contiguous(memory_format=torch.channels_last)
                     if isinstance(a, torch.Tensor) and a.dim() == 4 else a for a in args)

    def _run(self, *args, cache: bool = True):
        """The model's forward under the optimization's autocast; an eager training forward
        (``cache``: not one a CUDA graph captures, ours or the caller's) inside a
        :func:`step.training_step`."""
        batched = cache and self.training and torch.is_grad_enabled() \
            and not torch.compiler.is_compiling() and not (
                any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
                and torch.cuda.is_current_stream_capturing())
        if self.autocast is None:
            if not batched:
                return self.model(*args)
            with step.training_step((), None):
                return self.model(*args)
        device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
        # (graph capture needs autocast's cast cache off: make_graphed_callables' rule)
        with torch.autocast(device, dtype=self.autocast, cache_enabled=cache):
            if not batched:
                return self.model(*args)
            with step.training_step(self._conv_params(), self.autocast):
                return self.model(*args)

    def _conv_params(self) -> list[torch.Tensor]:
        """The weights and biases of the model's fastconv convolutions (the modules found
        once per model: a module added later casts its own; a replica made by
        ``nn.DataParallel``, holding another model, finds its own)."""
        found = self.__dict__.get("_convs")
        if found is None or found[0] is not self.model:
            found = self.__dict__["_convs"] = (
                self.model, [m for m in self.model.modules() if isinstance(m, _FastconvMixin)])
        convs = found[1]
        return [p for m in convs for p in (m._parameters.get("weight"),
                                           m._parameters.get("bias")) if p is not None]

    def forward(self, *args):
        args = self._prepare(args)
        if self.cuda_graph and all(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
            if not self.training:
                return self._replay(args)
            if torch.is_grad_enabled():
                graphed = self._train_graph(args)
                if graphed is not None:
                    return graphed(*args)
        return self._run(*args)

    def _flags(self) -> tuple[bool, ...]:
        """Every submodule's train/eval flag: a graph replays the flags it was captured with
        (dropout on or off, batch or running statistics), so they are part of its key."""
        return tuple(m.training for m in self.model.modules())

    def _versions(self) -> tuple[int, ...]:
        """The version counters of every parameter and buffer (in-place changes move them)."""
        return tuple(t._version for t in itertools.chain(self.model.parameters(),
                                                         self.model.buffers()))

    def _train_graph(self, args):
        """The graphed forward + backward for this input signature (captured on first sight),
        or None where the call must run eagerly (see the class docstring)."""
        if any(p.grad is not None for p in self.model.parameters()):
            if not self._noted_held_grads:
                self._noted_held_grads = True
                self.report.notes.append(
                    "cuda_graph: a training call with gradients already held ran eagerly "
                    "(zero_grad(set_to_none=True) between steps keeps the graphs)")
            return None
        key = (tuple((a.shape, a.dtype, a.stride(), a.device, a.requires_grad) for a in args),
               self._flags())
        if key in self._train_graphs:
            return self._train_graphs[key]
        buffers = list(self.model.buffers())
        saved = [b.clone() for b in buffers]
        graphed = None
        try:
            with dispatch.settings(graph=True):  # plans ranked by GPU time
                graphed = torch.cuda.make_graphed_callables(
                    _Step(self), tuple(a.detach().clone().requires_grad_(a.requires_grad)
                                       for a in args))
        except Exception as exc:  # reported; the model runs eagerly for this signature
            self.report.notes.append(
                f"cuda_graph: training capture failed for input shapes "
                f"{[tuple(a.shape) for a in args]} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:160]}); running eagerly")
        finally:
            with torch.no_grad():  # the warm-up steps must not count as training steps
                for b, v in zip(buffers, saved):
                    b.copy_(v)
            for p in self.model.parameters():
                p.grad = None
        self._train_graphs[key] = graphed
        return graphed

    def _replay(self, args):
        """One CUDA graph per input signature and module flags: captured on first sight
        (after warm-up on a side stream), replayed with the inputs copied into its static
        buffers."""
        key = (tuple((a.shape, a.dtype, a.stride(), a.device) for a in args), self._flags())
        # The graph reads what the layers cached at capture (BatchNorm folded into weights,
        # packed weights): a parameter or statistic changed in place since then (its version
        # moved) needs a new capture. So does one captured while candidates a tuning budget
        # cut short were still building (their layers ran provisional choices, aten): once
        # they are built, the warm-up before the new capture times them and takes the best.
        hit = self._graphs.get(key)
        if hit is not None and (hit[3] != self._versions()
                                or (hit[4] and not dispatch.building())):
            del self._graphs[key]
            hit = None
        if hit is None:
            static = tuple(a.clone() for a in args)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad(), dispatch.settings(graph=True):
                for _ in range(3):  # dispatch, compilation and allocations happen here
                    # (choices whose kernels compile in the background run aten meanwhile:
                    # wait for them, so that the capture takes what was chosen)
                    dispatch.finish_builds()
                    self._run(*static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), torch.no_grad(), dispatch.settings(graph=True):
                out = self._run(*static)
            hit = self._graphs[key] = (graph, static, out, self._versions(),
                                       dispatch.building())
        graph, static, out = hit[:3]
        for s, a in zip(static, args):
            s.copy_(a)
        graph.replay()
        return torch.utils._pytree.tree_map(
            lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)


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


class _FrozenBatchNorm2d(nn.BatchNorm2d):
    """torchvision's ``FrozenBatchNorm2d`` as a BatchNorm that optimize() fuses: always in
    eval mode (``train()`` leaves it there), γ, β and the statistics buffers (no parameters,
    as in the original), the same state_dict keys (no ``num_batches_tracked``)."""

    def __init__(self, frozen: nn.Module):
        super().__init__(frozen.weight.numel(), eps=frozen.eps, affine=False,
                         device=frozen.weight.device, dtype=frozen.weight.dtype)
        del self.weight, self.bias  # the None parameters of affine=False
        for name in ("weight", "bias", "running_mean", "running_var"):
            self.register_buffer(name, getattr(frozen, name))  # the very tensors
        self.num_batches_tracked = None
        self.train(False)

    def train(self, mode: bool = True):
        return super().train(False)

    def _load_from_state_dict(self, state_dict, prefix, *args):
        state_dict.pop(prefix + "num_batches_tracked", None)  # as torchvision's does
        nn.Module._load_from_state_dict(self, state_dict, prefix, *args)


def _unfreeze_frozen_norms(model: nn.Module, report: Report) -> None:
    """Every torchvision ``FrozenBatchNorm2d`` of ``model`` (the copy) replaced by
    :class:`_FrozenBatchNorm2d`, a module used twice by one replacement."""
    try:
        from torchvision.ops.misc import FrozenBatchNorm2d
    except ImportError:
        return
    done: dict[int, nn.Module] = {}
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if type(child) is FrozenBatchNorm2d:
                if id(child) not in done:
                    done[id(child)] = _FrozenBatchNorm2d(child)
                parent._modules[name] = done[id(child)]
    if done:
        report.notes.append(f"{len(done)} FrozenBatchNorm2d normalise with their fixed "
                            f"statistics as eval-mode BatchNorms (fused where a convolution "
                            f"precedes them)")


class _Step(nn.Module):
    """What a training graph captures: the optimized model's forward (the model's
    parameters are this module's, so their gradients come out of the graph)."""

    def __init__(self, owner: OptimizedModel):
        super().__init__()
        self.model = owner.model
        self.__dict__["owner"] = owner  # not a submodule: no second copy of the parameters

    def forward(self, *args):
        from .batchnorm import fused_passes

        if not torch.cuda.is_current_stream_capturing():
            dispatch.finish_builds()  # the kernels a warm-up step set compiling (_replay)
        with fused_passes():  # warm-up and capture alike (eager calls take torch's BN)
            return self.owner._run(*args, cache=False)


def optimize(model: nn.Module, mode: str = "inference", precision: str | None = None,
             channels_last: bool = True, cuda_graph: bool = False,
             example_inputs=None) -> OptimizedModel:
    """A copy of ``model`` computing the same function through fastconv (see the module
    docstring); ``model`` itself is not changed. ``mode`` sets train/eval on the copy;
    ``precision`` is None (torch's flags), "ieee", "tf32", "bf16" or "fp16" (the last two
    run under autocast); ``example_inputs``, when given, are run once to check the copy."""
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
    _unfreeze_frozen_norms(model, report)
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
        report.notes.append(f"not traced: {why}; {_WALKED}")
        out = convert(model, inplace=True, precision=conv_precision)
        _walk(out, report, conv_precision)
    else:
        report.notes += notes
        out = convert(_fuse_graph(gm, report, conv_precision, state_keys), inplace=True,
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
    result = OptimizedModel(out, report, channels_last, autocast, cuda_graph,
                            original.Names(state_keys, aliases, metadata, order))
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


def _inner_activation(bn: nn.Module) -> tuple[str, float] | str | None:
    """The activation a norm-act module applies after normalising (timm's BatchNormAct2d:
    ``.drop`` then ``.act``): None for a plain BatchNorm or an identity act, the activation,
    or why it cannot be fused."""
    act = getattr(bn, "act", None)
    if not isinstance(act, nn.Module):
        return None
    drop = getattr(bn, "drop", None)
    if drop is not None and not isinstance(drop, nn.Identity):
        return f"{type(bn).__name__} applies {type(drop).__name__} before its activation"
    try:
        found = _activation_of(act)
    except ConvError:
        return (f"the activation inside {type(bn).__name__} ({type(act).__name__}) has no "
                f"fused form")
    return None if found[0] == "none" else found


def _conv_rank(conv) -> int | None:
    for rank, (conv_cls, _, _) in _FUSED.items():
        if isinstance(conv, conv_cls) and not conv.transposed:
            return rank
    return None


def _activation_node(node, modules) -> tuple[str, float] | None:
    if node.op == "call_module":
        module = modules.get(node.target)  # None: a layer fused during this pass
        if module is None or isinstance(module, nn.Sequential) or has_hooks(module):
            return None
        try:
            return _activation_of(module)
        except ConvError:
            return None
    if node.op == "call_function" and node.target in _FUNCTION_ACTIVATIONS:
        return _FUNCTION_ACTIVATIONS[node.target], 0.01
    if node.op == "call_method" and node.target in ("relu", "relu_", "sigmoid", "tanh"):
        return node.target.rstrip("_"), 0.01
    return None


def _record_keys(state_keys: dict[str, str], fused: nn.Module, path: str, conv_path: str,
                 bn_path: str) -> None:
    """The fused layer at ``path``: each of its state_dict keys -> the original key (its
    conv's parameters, its BatchNorm's parameters and buffers)."""
    for key in fused.state_dict():
        state_keys[f"{path}.{key}"] = (f"{bn_path}.{key[3:]}" if key.startswith("bn.")
                                       else f"{conv_path}.{key}")


def _fuse_graph(gm: torch.fx.GraphModule, report: Report, precision,
                state_keys: dict[str, str]) -> nn.Module:
    modules = dict(gm.named_modules())
    calls: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or not isinstance(modules.get(node.target),
                                                      nn.modules.conv._ConvNd):
            continue
        name, conv = node.target, modules[node.target]
        if isinstance(conv, (ConvBNAct1d, ConvBNAct2d)):  # fastconv's own, fused already
            if all(name != done for done, _ in report.fused):  # (once per module)
                report.fused.append((name, f"already a {type(conv).__name__}"))
            continue
        why = _why_not(node, conv, calls, modules)
        if why:
            report.left.append((name, why))
            continue
        bn_node = next(iter(node.users))
        bn = modules[bn_node.target]
        chain, last, residual, act = [node, bn_node], bn_node, None, ("none", 0.01)
        inner = _inner_activation(bn)  # (_why_not refused the strings)
        # an activation inside the norm comes before any add: nothing more to fuse
        nxt = next(iter(last.users)) if len(last.users) == 1 and inner is None else None
        if inner is not None:
            act = inner
        if nxt is not None and nxt.op == "call_function" and nxt.target in _ADDS \
                and len(nxt.args) == 2 and not nxt.kwargs:
            other = nxt.args[1] if nxt.args[0] is last else nxt.args[0]
            if isinstance(other, torch.fx.Node) and other is not last:
                chain.append(nxt)
                last, residual = nxt, other
                nxt = next(iter(last.users)) if len(last.users) == 1 else None
        found = _activation_node(nxt, modules) if nxt is not None else None
        if found is not None:  # a shared activation module stays for its other callers
            chain.append(nxt)
            last, act = nxt, found
        fused = _fused_layer(conv, bn, act, precision)
        new_name = name.replace(".", "_") + "_bn_act"
        gm.add_submodule(new_name, fused)
        _record_keys(state_keys, fused, new_name, name, bn_node.target)
        with gm.graph.inserting_after(last):
            args = (node.args[0],) if residual is None else (node.args[0], residual)
            new = gm.graph.call_module(new_name, args)
        last.replace_all_uses_with(new)
        for n in reversed(chain):
            gm.graph.erase_node(n)
        pattern = " -> ".join(["conv", "bn"] + (["add"] if residual is not None else [])
                              + ([act[0]] if act[0] != "none" else []))
        report.fused.append((name, pattern))
    _drop_identities(gm)
    _free_eval_stochastic_depth(gm)
    _flatten_targets(gm, state_keys)
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm


def _drop_identities(gm: torch.fx.GraphModule) -> None:
    """Calls that return their input itself leave the graph: ``nn.Identity`` and dropout
    with p = 0 (module or function; torch's dropout returns its input unchanged at p = 0, in
    training too). Each costs an eager forward a module or operator call (timm's ConvNeXt:
    37 dropouts per forward) and nothing else."""
    modules = dict(gm.named_modules())
    for node in list(gm.graph.nodes):
        if not node.args or not isinstance(node.args[0], torch.fx.Node):
            continue
        if node.op == "call_module":
            m = modules.get(node.target)
            same = not has_hooks(m) and (isinstance(m, nn.Identity) or (
                isinstance(m, nn.modules.dropout._DropoutNd) and m.p == 0
                and len(node.args) == 1 and not node.kwargs))
        elif node.op == "call_function" and node.target in TRAINING_ARG:
            p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
            same = type(p) in (int, float) and p == 0
        else:
            continue
        if same:
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)


def _free_eval_stochastic_depth(gm: torch.fx.GraphModule) -> None:
    """torchvision's StochasticDepth modules the graph calls become fastconv's subclass,
    whose eval() call returns its input without torchvision's per-call logging and checks
    (fastconv.nn.stochastic; no state, so no state_dict key changes)."""
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        module = gm.get_submodule(node.target)
        if (type(module).__module__, type(module).__name__) != (
                "torchvision.ops.stochastic_depth", "StochasticDepth") or has_hooks(module):
            continue
        from .nn.stochastic import StochasticDepth

        light = StochasticDepth.from_torchvision(module)
        if light is not None:
            parent, _, leaf = node.target.rpartition(".")
            gm.get_submodule(parent)._modules[leaf] = light


def _flatten_targets(gm: torch.fx.GraphModule, state_keys: dict[str, str]) -> None:
    """Each module the graph calls, or reads a parameter or buffer of, two or more levels
    down (``stages.0.blocks.0.conv_dw``) is moved onto ``gm`` itself under a flat name
    (``stages_0_blocks_0_conv_dw``, as fused layers are) and the graph uses that name: the
    traced forward then reaches it with one attribute lookup instead of one
    ``Module.__getattr__`` per level (ConvNeXt-T, whose blocks hold a parameter the graph
    reads: timm's 1309 lookups per forward -> 308, torchvision's 776 -> 326). Its
    state_dict keys map to the original ones (``state_keys``).

    Deepest first, each moved module leaves its parent, so that a module whose parameter
    the graph reads (torchvision ConvNeXt's ``layer_scale``) moves too once the modules
    called inside it have left it: no module is reachable by two paths. A module stays
    where it is when it is held under more than one path, or when it is called and
    another module the graph uses is inside it, or when it is inside a called module (a
    called module's forward may use what it holds)."""
    held = collections.Counter(id(m) for _, m in gm.named_modules(remove_duplicate=False))
    called = {n.target for n in gm.graph.nodes if n.op == "call_module"}
    used = called | {n.target.rpartition(".")[0] for n in gm.graph.nodes
                     if n.op == "get_attr" and "." in n.target}
    stays = {x for p in called for q in used if q.startswith(p + ".") for x in (p, q)}
    flat: dict[str, str] = {}
    for path in sorted(used - stays, key=lambda p: (-p.count("."), p)):
        module = gm.get_submodule(path)
        if "." not in path or held[id(module)] > 1:
            continue
        name = base = path.replace(".", "_")
        suffix = 0
        while hasattr(gm, name):
            suffix += 1
            name = f"{base}_{suffix}"
        parent, _, leaf = path.rpartition(".")
        del gm.get_submodule(parent)._modules[leaf]
        gm.add_submodule(name, module)
        for key in module.state_dict():
            state_keys[f"{name}.{key}"] = state_keys.get(f"{path}.{key}", f"{path}.{key}")
        flat[path] = name
    for node in gm.graph.nodes:
        if node.op == "call_module" and node.target in flat:
            node.target = flat[node.target]
        elif node.op == "get_attr" and "." in node.target:
            owner, _, attr = node.target.rpartition(".")
            if owner in flat:
                node.target = f"{flat[owner]}.{attr}"


def _fused_layer(conv, bn, act, precision) -> nn.Module:
    """The fused layer for ``conv -> bn -> act``, holding the model's own parameters and
    BatchNorm (the model is already a copy): weights tied to other layers stay tied. A
    norm-act module (its activation now the fused layer's) becomes a plain BatchNorm
    holding the same parameters and buffers."""
    rank = _conv_rank(conv)
    if getattr(bn, "act", None) is not None:
        plain = _FUSED[rank][1](bn.num_features, bn.eps, bn.momentum, bn.affine,
                                bn.track_running_stats, device="meta")
        plain._parameters.update(bn._parameters)  # the very tensors
        plain._buffers.update(bn._buffers)
        bn = plain.train(bn.training)
    return _FUSED[rank][2]._holding(conv, bn, *act, precision=precision)


#: the forwards of the convolutions fused as torch's: torch's own and fastconv's
_CONV_FORWARDS = (nn.Conv1d.forward, nn.Conv2d.forward, nn.Conv1d._conv_forward,
                  nn.Conv2d._conv_forward, _FastconvMixin._conv_forward)


def _why_not(node, conv, calls, modules) -> str:
    """Why the chain starting at this convolution cannot be fused ('' when it can)."""
    users = list(node.users)
    if not any(u.op == "call_module" and isinstance(modules.get(u.target),
                                                    nn.modules.batchnorm._BatchNorm)
               for u in users):
        if not users:
            return f"{_NO_NORM} (its output is not used)"
        follower = users[0]
        target = getattr(follower.target, "__name__", follower.target)
        if follower.op == "call_module":
            target = type(modules.get(follower.target)).__name__
        return f"{_NO_NORM} (next: {target})"
    if len(users) != 1:  # a BatchNorm, and other users of the conv's output
        return f"its output is used {len(users)} times"
    if conv.transposed:
        return "a transposed convolution before a BatchNorm (not fused)"
    bn_node = users[0]
    bn = modules[bn_node.target]
    rank = _conv_rank(conv)
    if rank is None or not isinstance(bn, _FUSED[rank][1]):
        return f"{type(conv).__name__} with {type(bn).__name__}: no fused layer for this rank"
    if has_hooks(conv) or has_hooks(bn):
        return _HOOKED
    if type(conv).forward not in _CONV_FORWARDS or \
            type(conv)._conv_forward not in _CONV_FORWARDS:
        return f"{type(conv).__name__} has a forward of its own (not fused as a convolution)"
    if calls.get(node.target, 0) > 1 or calls.get(bn_node.target, 0) > 1:
        return "the convolution or its BatchNorm is called on more than one path"
    if bn_node.args[0] is not node or len(bn_node.args) != 1 or bn_node.kwargs:
        return "the BatchNorm is called with other arguments"
    if not known_norm(bn):
        return f"{type(bn).__name__} has a forward of its own (not fused as a BatchNorm)"
    if not bn.track_running_stats and not bn.training:
        return "a BatchNorm without running statistics in eval mode"
    inner = _inner_activation(bn)
    return inner if isinstance(inner, str) else ""


def _walk(model: nn.Module, report: Report, precision) -> None:
    """Fusion without a trace (``model`` already converted): each run Conv, BatchNorm [,
    activation] of an ``nn.Sequential``'s children, none of them with hooks, runs fused when
    the Sequential is called as a whole, and its children stay as they are for a forward
    that calls them one by one (:class:`ChainedSequential`). Every other convolution is
    left, with the reason."""
    fused_ids: set[int] = set()
    for parent_name, parent in list(model.named_modules()):
        if type(parent) is not nn.Sequential:
            continue
        children = list(parent.named_children())
        chains, i = [], 0
        while i < len(children):
            name, conv = children[i]
            nxt = children[i + 1][1] if i + 1 < len(children) else None
            # (exact types: a subclass may have a forward of its own)
            rank = {Conv1d: 1, Conv2d: 2}.get(type(conv))
            if rank is None or not isinstance(nxt, _FUSED[rank][1]):
                i += 1
                continue
            full = f"{parent_name}.{name}" if parent_name else name
            inner = _inner_activation(nxt) if known_norm(nxt) else \
                f"{type(nxt).__name__} has a forward of its own (not fused as a BatchNorm)"
            if not isinstance(inner, str) and (has_hooks(conv) or has_hooks(nxt)):
                inner = _HOOKED
            if isinstance(inner, str):
                report.left.append((full, inner))
                fused_ids.add(id(conv))
                i += 1
                continue
            act_mod = children[i + 2][1] if i + 2 < len(children) and inner is None else None
            try:
                act = inner or _activation_of(act_mod)
            except ConvError:
                act_mod, act = None, ("none", 0.01)
            if act_mod is not None and has_hooks(act_mod):
                act_mod, act = None, ("none", 0.01)
            n = 2 if act_mod is None else 3
            chains.append((i, n, _fused_layer(conv, nxt, act, precision)))
            fused_ids.add(id(conv))
            report.fused.append((full, "conv -> bn" + (f" -> {act[0]}" if act[0] != "none"
                                                        else "")))
            i += n
        if chains:
            ChainedSequential.chain(parent, chains)
    report.left += [(name, _UNSEEN) for name, m in model.named_modules()
                    if isinstance(m, nn.modules.conv._ConvNd) and id(m) not in fused_ids
                    and not isinstance(m, (ConvBNAct1d, ConvBNAct2d))]
