"""Fusing Conv -> BatchNorm -> [add] -> [activation] chains: in a traced graph
(``fuse_graph``, which fuses causal conv1d blocks first: causal.py), or, without a trace,
in runs of nn.Sequential children (``walk``)."""

from __future__ import annotations

import collections
import operator

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConvError
from ..nn.chained import ChainedSequential
from ..nn.conv import Conv1d, Conv2d, _FastconvMixin
from ..nn.fused import ConvBNAct1d, ConvBNAct2d, _activation_of
from ..tracing import TRAINING_ARG, has_hooks, known_norm
from .causal import fuse_causal
from .report import HOOKED, NO_NORM, UNSEEN, Report

_FUNCTION_ACTIVATIONS = {
    F.relu: "relu", torch.relu: "relu", torch.relu_: "relu", F.relu6: "relu6",
    F.silu: "silu", F.hardswish: "hardswish", torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid",
    torch.tanh: "tanh", F.tanh: "tanh",
}
_ADDS = (operator.add, operator.iadd, torch.add)
_FUSED = {1: (nn.Conv1d, nn.BatchNorm1d, ConvBNAct1d), 2: (nn.Conv2d, nn.BatchNorm2d, ConvBNAct2d)}



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


def fuse_graph(gm: torch.fx.GraphModule, report: Report, precision,
                state_keys: dict[str, str]) -> nn.Module:
    fuse_causal(gm, report, precision, state_keys, _activation_node)
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
        from ..nn.stochastic import StochasticDepth

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
            return f"{NO_NORM} (its output is not used)"
        follower = users[0]
        target = getattr(follower.target, "__name__", follower.target)
        if follower.op == "call_module":
            target = type(modules.get(follower.target)).__name__
        return f"{NO_NORM} (next: {target})"
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
        return HOOKED
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


def walk(model: nn.Module, report: Report, precision) -> None:
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
                inner = HOOKED
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
    report.left += [(name, UNSEEN) for name, m in model.named_modules()
                    if isinstance(m, nn.modules.conv._ConvNd) and id(m) not in fused_ids
                    and not isinstance(m, (ConvBNAct1d, ConvBNAct2d))]

