"""What :func:`fastconv.optimize` traces with torch.fx, and what it keeps whole.

A torch.fx trace records a forward's tensor operations and module calls, and nothing else
the forward does. Rewriting a model from its trace is only right where that loses nothing,
so a module is kept whole (a leaf of the trace: called as it is, its own forward running)
where it would lose something:

* its forward changes the grad mode or autocast (``torch.no_grad()``, ``enable_grad``,
  ``inference_mode``, ``torch.autocast(..., enabled=False)``): the trace runs those calls
  once, while tracing, and keeps none of them. They are seen as they run: the setters they
  call are watched while tracing, and the module whose forward called them is kept whole;
* it has forward or backward hooks (a traced-into module's hooks never run again);
* it is a TorchScript module (the trace reaches into its C++ module; its parameters would
  leave the copy);
* it is a BatchNorm, fastconv's own module or stochastic depth (the reasons are
  :class:`Tracer`'s).

Where the model's own forward is such a region, or the model has hooks, it cannot be
traced (:class:`KeptWhole`): optimize then uses the module walk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .nn.conv import _FastconvMixin

#: The module hooks that run when a module is called.
_CALL_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
               "_backward_pre_hooks")


def has_hooks(m: nn.Module) -> bool:
    """Whether ``m`` has a hook that runs when it is called (forward, forward pre,
    backward, backward pre)."""
    return any(getattr(m, name, None) for name in _CALL_HOOKS)


def is_script(m: nn.Module) -> bool:
    return isinstance(m, torch.jit.ScriptModule)


class KeptWhole(Exception):  # noqa: N818 (a reason, not a failure)
    """The model's own forward must run as written (it changes the grad mode or autocast,
    or has hooks): no trace of it can be used."""


#: torch's setters that the grad-mode and autocast context managers call, by where they
#: are looked up at call time (``torch._C._set_grad_enabled``, ``torch.set_autocast_...``)
_SETTERS = ((torch._C, "_set_grad_enabled"), (torch._C, "_InferenceMode"),
            (torch, "set_autocast_enabled"), (torch, "set_autocast_dtype"))


class Tracer(torch.fx.Tracer):
    """torch.fx's tracer with the leaves the module docstring lists, and ``leaves``: the
    paths of modules kept whole because their forwards change the grad mode or autocast.

    Every BatchNorm is a leaf: a BatchNorm subclass holding its activation (timm's
    BatchNormAct2d) stays one call, as torch's own BatchNorms do, instead of being traced
    into (where its input looks used several times). Stochastic depth (torchvision's
    StochasticDepth, timm's DropPath and DropBlock2d) stays a module too: traced into, its
    ``self.training`` became a constant of the graph. fastconv's own modules are leaves, as
    torch.nn's are (traced into, their forwards' argument checks fail on the proxies)."""

    def __init__(self, leaves: frozenset[str] = frozenset()):
        super().__init__()
        self.leaves = leaves
        self.path: list[str] = []  # the modules being traced into, outermost first
        #: (module path, setter) of each grad-mode or autocast setter called while tracing
        self.mode_changes: list[tuple[str, str]] = []

    def trace(self, root, concrete_args=None):
        """torch.fx's trace, with every call of a grad-mode or autocast setter recorded
        in ``mode_changes`` under the module whose forward made it (the calls go
        through)."""
        saved = [(owner, name, getattr(owner, name)) for owner, name in _SETTERS]

        def watched(original, what):
            def call(*args, **kwargs):
                self.mode_changes.append((self.path[-1] if self.path else "", what))
                return original(*args, **kwargs)
            return call

        try:
            for owner, name, original in saved:
                setattr(owner, name, watched(original, name.lstrip("_")))
            return super().trace(root, concrete_args)
        finally:
            for owner, name, original in saved:
                setattr(owner, name, original)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return (module_qualified_name in self.leaves or has_hooks(m) or is_script(m)
                or known_norm(m) or stochastic_depth(m) or isinstance(m, _FastconvMixin)
                or super().is_leaf_module(m, module_qualified_name))

    def call_module(self, m, forward, args, kwargs):
        self.path.append(self.path_of_module(m))
        try:
            return super().call_module(m, forward, args, kwargs)
        finally:
            self.path.pop()


def trace(model: nn.Module) -> tuple[torch.fx.GraphModule, list[str]]:
    """The model's GraphModule, with every module whose forward changes the grad mode or
    autocast kept whole, and a note for each of them; :class:`KeptWhole` where the model
    itself has hooks or such a region; what torch.fx raises where it cannot trace."""
    if has_hooks(model):
        raise KeptWhole("the model has forward or backward hooks, which a traced copy "
                        "would not run")
    if is_script(model):
        raise KeptWhole("the model is a TorchScript module")
    leaves: set[str] = set()
    notes: list[str] = []
    while True:
        tracer = Tracer(frozenset(leaves))
        graph = tracer.trace(model)
        seen = tracer.mode_changes
        regions = {path for path, _ in seen}
        if "" in regions:
            what = sorted({w for path, w in seen if path == ""})
            raise KeptWhole(f"the model's forward changes the grad mode or autocast "
                            f"({', '.join(what)}), which a traced copy would not do")
        if not regions - leaves:
            break
        for path in sorted(regions - leaves):
            what = sorted({w for p, w in seen if p == path})
            notes.append(f"{path} kept as it is: its forward changes the grad mode or "
                         f"autocast ({', '.join(what)}); nothing inside it is fused")
        leaves |= regions
    live_training_flags(graph)
    return torch.fx.GraphModule(tracer.root, graph, type(model).__name__), notes


#: Modules whose forward branches on ``self.training`` (random in training, identity in
#: eval), from the libraries whose models optimize() is measured on.
_STOCHASTIC = {("torchvision.ops.stochastic_depth", "StochasticDepth"),
               ("fastconv.nn.stochastic", "StochasticDepth"),
               ("timm.layers.drop", "DropPath"), ("timm.layers.drop", "DropBlock2d")}


def stochastic_depth(m: nn.Module) -> bool:
    return (type(m).__module__, type(m).__name__) in _STOCHASTIC


def known_norm(m: nn.Module) -> bool:
    """A BatchNorm whose forward is known: torch's own (a subclass that does not override
    it) or timm's BatchNormAct2d (normalise, then ``.drop``, then ``.act``). Other
    subclasses are traced into, so that nothing unknown is fused as a plain BatchNorm."""
    if not isinstance(m, nn.modules.batchnorm._BatchNorm):
        return False
    forward = type(m).forward
    return forward is nn.modules.batchnorm._BatchNorm.forward or (
        forward.__qualname__ == "BatchNormAct2d.forward"
        and forward.__module__.startswith("timm."))


#: Functions whose ``training`` argument a traced forward passes as ``self.training``
#: (timm's heads: ``F.dropout(x, p, training=self.training)``).
TRAINING_ARG = {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout,
                F.feature_alpha_dropout}


def live_training_flags(graph: torch.fx.Graph) -> None:
    """Tracing reads ``self.training`` once, so a dropout call's ``training=`` argument
    became a constant of the graph: a model traced for training would drop units in eval()
    too (timm's classifiers, drop_rate 0.2 by default), one traced for inference never in
    train(). Each such argument now reads the traced module's own flag at run time, which
    train()/eval() set."""
    flag = None
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in TRAINING_ARG:
            continue
        if flag is None:
            inputs = [n for n in graph.nodes if n.op == "placeholder"]
            with graph.inserting_after(inputs[-1]) if inputs else \
                    graph.inserting_before(node):
                flag = graph.get_attr("training")
        if isinstance(node.kwargs.get("training"), bool):
            node.update_kwarg("training", flag)
        elif len(node.args) > 2 and isinstance(node.args[2], bool):
            node.update_arg(2, flag)
