"""Which convolutions grow together: the producer-consumer pairs of a model, from its
torch.fx dataflow (ties through residual adds, routes through concatenations) or,
where fx cannot trace it, from a module walk."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd

from ..errors import ConvError
from .multibranch import MultiBranch
from .pairs import NO_CONSUMER, PASSTHROUGH, PASSTHROUGH_FUNCTION_NAMES, PASSTHROUGH_NAMES, Pair
from .pairs import is_conv as is_conv
from .pooling import pooled
from .walk import find_pairs


def find_groups(module: nn.Module) -> tuple[list[Pair], dict[str, str], str]:
    """The producers of ``module`` with everything each one's widening reaches, from the
    dataflow of a torch.fx trace; where the model does not trace, the module walk
    (:func:`find_pairs`) and a note saying so. Also the reason each other convolution is
    not a producer (fx only)."""
    try:
        pairs, reasons = _dataflow(module)
    except Exception as exc:  # data-dependent control flow, unsupported ops, ...
        return find_pairs(module), {}, (
            f"torch.fx could not trace the model ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:160] if str(exc) else ''}); pairs were found by the "
            f"module walk: a convolution and the next one in a Sequential or a residual "
            f"block, and a MultiBranch branch's last one with its projection")
    return pairs, reasons, ""


class _Tracer(torch.fx.Tracer):
    """Convolutions (fastconv's fused ones included), norms and Linear layers stay whole;
    everything else (MultiBranch, blocks) is traced through."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, (_ConvNd, _BatchNorm, nn.Linear)) \
            or super().is_leaf_module(m, qualname)


#: functions and methods that act per channel (or per element), like PASSTHROUGH modules
_PASS_FUNCTIONS = {
    torch.relu, torch.sigmoid, torch.tanh, torch.nn.functional.relu,
    torch.nn.functional.relu6, torch.nn.functional.leaky_relu, torch.nn.functional.silu,
    torch.nn.functional.gelu, torch.nn.functional.hardswish,
    torch.nn.functional.hardsigmoid, torch.nn.functional.dropout,
    torch.nn.functional.max_pool2d, torch.nn.functional.avg_pool2d,
    torch.nn.functional.adaptive_avg_pool2d, torch.nn.functional.adaptive_max_pool2d,
    torch.flatten,
}
_PASS_METHODS = {"relu", "relu_", "sigmoid", "tanh", "contiguous", "clone", "flatten"}
_POOLS = (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool1d,
          nn.AdaptiveMaxPool2d, nn.Flatten)
#: element-wise operations of two tensors: a residual add (or an SE gate's product) ties
#: the widths of its operands and its output
_TIE_NAMES = {"add", "iadd", "add_", "sub", "isub", "mul", "imul", "mul_"}


class _NoGrowth(Exception):
    """Why a producer cannot grow (found while following its channels)."""


def _dataflow(module: nn.Module) -> tuple[list[Pair], dict[str, str]]:
    from ..optimize import OptimizedModel

    if isinstance(module, OptimizedModel):  # its forward wraps the traced model's
        inner, prefix = module.model, "model."
    else:
        inner, prefix = module, ""
    graph = _Tracer().trace(inner)
    modules = dict(inner.named_modules())
    calls: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    pairs, reasons, done = [], {}, set()
    for node in graph.nodes:
        if node.op != "call_module" or not is_conv(modules[node.target]) \
                or node.target in done:
            continue
        name, conv = node.target, modules[node.target]
        if calls[name] > 1:
            reasons[name] = f"called {calls[name]} times in the forward (a shared module)"
        elif _depthwise(conv):
            reasons[name] = "depthwise: its width is its input's, it grows with that producer"
        else:
            try:
                pair = _Space(node, modules, calls).pair()
            except _NoGrowth as why:
                reasons[name] = str(why)
                continue
            pair.branch = _branch_of(pair.producer, modules) if not pair.tied else None
            done.update((pair.producer, *pair.tied))
            pairs.append(pair)
    if prefix:  # paths from the wrapper, as named_modules() of the model given names them
        for p in pairs:
            p.producer, p.prefix = prefix + p.producer, prefix
            p.consumers, p.bns, p.depthwise, p.tied = (
                tuple(prefix + c for c in group)
                for group in (p.consumers, p.bns, p.depthwise, p.tied))
            p.routes = {prefix + k: v for k, v in p.routes.items()}
            p.branch = None if p.branch is None else prefix + p.branch
        reasons = {prefix + k: v for k, v in reasons.items()}
    return pairs, reasons


def _depthwise(conv) -> bool:
    return conv.groups > 1 and conv.groups == conv.in_channels == conv.out_channels


def _tie(node) -> bool:
    """An element-wise operation of ``node``'s tensor with another tensor."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    return node.op in ("call_function", "call_method") and name in _TIE_NAMES and sum(
        isinstance(a, torch.fx.Node) for a in node.args) > 1


def _cat_dim(node) -> int | None:
    if node.op != "call_function" or node.target not in (torch.cat, torch.concat):
        return None
    return node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0)


def width(node, module: Callable[[str], nn.Module]) -> int:
    """How many channels ``node``'s tensor has, from the layers that made it (``module``
    maps a module path of the trace to the module as it is now)."""
    if node.op == "call_module":
        m = module(node.target)
        if is_conv(m):
            return m.out_channels
        if isinstance(m, _BatchNorm):
            return m.num_features
        if isinstance(m, nn.Linear):
            return m.out_features
    if _cat_dim(node) == 1:
        return sum(width(a, module) for a in node.args[0])
    if _per_channel(node, module) and _tensor_arg(node) is not None:
        return width(_tensor_arg(node), module)
    raise ConvError(f"cannot tell how many channels {node.name} has")


def _tensor_arg(node):
    """The tensor a per-channel node acts on: its first argument that is a node (``0.5 * x``
    has its number first)."""
    return next((a for a in node.args if isinstance(a, torch.fx.Node)), None)


def _passthrough(m: nn.Module) -> bool:
    return isinstance(m, PASSTHROUGH + _POOLS) or type(m).__name__ in PASSTHROUGH_NAMES


def _pass_call(node) -> bool:
    """A function or method call acting per channel on its first argument."""
    if node.op == "call_function":
        return node.target in _PASS_FUNCTIONS or _spatial_mean(node) \
            or getattr(node.target, "__name__", "") in PASSTHROUGH_FUNCTION_NAMES
    return node.op == "call_method" and (node.target in _PASS_METHODS or _spatial_mean(node))


def _spatial_mean(node) -> bool:
    """``x.mean((2, 3), keepdim=True)`` (or ``torch.mean``): a global pool keeping the
    channels (an SE block's squeeze)."""
    if node.target not in ("mean", "amax", torch.mean, torch.amax):
        return False
    dims = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
    dims = (dims,) if isinstance(dims, int) else dims
    return isinstance(dims, (tuple, list)) and all(
        isinstance(d, int) and (d >= 2 or d == -1) for d in dims)


def _per_channel(node, module: Callable[[str], nn.Module]) -> bool:
    """Whether ``node`` acts per channel on its first argument (keeping the channels)."""
    if not node.args:
        return False
    if node.op == "call_module":
        return _passthrough(module(node.target))
    if _pass_call(node):
        return True
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    return node.op in ("call_function", "call_method") and name in _TIE_NAMES


class _Space:
    """The channels of one producer's output followed through the traced graph: the layers
    that act on them per channel (BatchNorms, activations, pooling, depthwise convolutions:
    they widen with it), the layers that consume them (convolutions, a Linear after global
    pooling: their inputs widen), the other producers that residual adds (or products) tie
    to the same width, and the concatenations each consumer reads them through. Anything
    else stops the search with a reason (:class:`_NoGrowth`)."""

    def __init__(self, start, modules: dict, calls: dict):
        self.modules, self.calls = modules, calls
        self.producers, self.consumers, self.bns, self.dws = [start.target], [], [], []
        self.routes: dict[str, tuple] = {}
        self.start, self.seen, self.todo = start, {start: ()}, [start]

    def pair(self) -> Pair:
        while self.todo:
            node = self.todo.pop()
            try:
                if not self.seen[node]:
                    self._backward(node)
                self._forward(node)
            except ConvError as exc:  # a width it cannot tell
                raise _NoGrowth(str(exc)) from None
        if not self.consumers:
            raise _NoGrowth(NO_CONSUMER)
        order = {n.target: i for i, n in enumerate(self.start.graph.nodes)
                 if n.op == "call_module"}
        first, *tied = self.producers[:1] + sorted(self.producers[1:], key=order.get)
        return Pair(first, tuple(self.consumers), tuple(self.bns), tuple(self.dws),
                     tied=tuple(tied), routes=self.routes)

    def _visit(self, node, hops: tuple) -> None:
        if node in self.seen:
            if self.seen[node] != hops:
                raise _NoGrowth(f"its channels reach {node.name} at two different channel "
                                f"offsets")
            return
        self.seen[node] = hops
        self.todo.append(node)

    def _spatial_dims(self) -> int:
        """How many spatial dimensions the producer's output has."""
        return len(self.modules[self.start.target].kernel_size)

    def _where(self, node) -> str:
        return f"({node.target})" if node.op == "call_module" else f"({node.name})"

    def _backward(self, node) -> None:
        """The tensors ``node``'s channels are also (its inputs, for a layer acting per
        channel; the other operands of a residual add; a fused layer's residual)."""
        m = self.modules.get(node.target) if node.op == "call_module" else None
        if is_conv(m) and not _depthwise(m):  # a producer: its residual, if fused
            inputs = list(node.args[1:]) + list(node.kwargs.values())
        elif is_conv(m):  # depthwise: its input (and a fused residual) too
            inputs = list(node.args) + list(node.kwargs.values())
        elif _tie(node):
            inputs = node.args
        elif isinstance(m, _BatchNorm) or _per_channel(node, self.modules.__getitem__):
            inputs = [_tensor_arg(node)]
        elif node.op == "placeholder":
            raise _NoGrowth(f"a residual add ties its width to the model's input "
                            f"({node.name})")
        else:
            raise _NoGrowth(f"a residual add ties its width to {self._where(node)}, which "
                            f"grow_width cannot widen")
        for src in inputs:
            if not isinstance(src, torch.fx.Node):
                continue
            if _cat_dim(src) is not None:
                raise _NoGrowth(f"a residual add ties its width to a concatenation "
                                f"({src.name}) (not supported)")
            if src.op == "call_module" and is_conv(m := self.modules[src.target]) \
                    and not _depthwise(m):
                self._tied(src)
            elif src.op == "call_module" and isinstance(self.modules[src.target], _BatchNorm):
                self._norm(src, ())
            elif src.op == "call_module" and is_conv(self.modules[src.target]):
                self._depthwise_layer(src, ())
            else:
                self._visit(src, ())

    def _tied(self, node) -> None:
        if node not in self.seen:
            if self.calls[node.target] > 1:
                raise _NoGrowth(f"a residual add ties its width to {node.target}, a module "
                                f"called more than once")
            self.producers.append(node.target)
        self._visit(node, ())

    def _norm(self, node, hops) -> None:
        if node not in self.seen:
            self.bns.append(node.target)
            self._route(node.target, hops)
        self._visit(node, hops)

    def _depthwise_layer(self, node, hops) -> None:
        if node not in self.seen:
            self.dws.append(node.target)
            self._route(node.target, hops)
        self._visit(node, hops)

    def _route(self, path: str, hops: tuple) -> None:
        if hops:
            self.routes[path] = hops

    def _forward(self, source) -> None:
        hops = self.seen[source]
        for node in source.users:
            where = self._where(node)
            if node.op == "output":
                raise _NoGrowth("its output is the model's output: growing it would change "
                                "that width")
            if node.op == "call_module":
                self._module_user(node, source, hops, where)
            elif _pass_call(node):
                if any(a is source for a in node.args[1:]):
                    raise _NoGrowth(f"reaches {where} as a second argument")
                self._visit(node, hops)
            elif _tie(node):
                if hops:
                    raise _NoGrowth(f"a residual add {where} after a concatenation ties "
                                    f"widths (not supported)")
                self._visit(node, ())
            elif _cat_dim(node) is not None:
                self._concat(node, source, hops, where)
            elif node.target is torch.stack:
                raise _NoGrowth(f"stacked {where} with other tensors (a MultiBranch mean): "
                                f"its width is tied to theirs")
            elif node.op in ("call_function", "call_method") \
                    and getattr(node.target, "__name__", node.target) in _TIE_NAMES:
                self._visit(node, hops)  # times or plus a number
            else:
                raise _NoGrowth(f"reaches {getattr(node.target, '__name__', node.target)} "
                                f"{where}")

    def _module_user(self, node, source, hops, where) -> None:
        m = self.modules[node.target]
        if self.calls[node.target] > 1 and not _passthrough(m):
            raise _NoGrowth(f"reaches {node.target}, a module called more than once")
        first = bool(node.args) and node.args[0] is source
        later = any(a is source for a in node.args[1:]) or any(
            v is source for v in node.kwargs.values())
        if is_conv(m) and not first and later and not _depthwise(m):
            if hops:
                raise _NoGrowth(f"the residual of {node.target} (a fused add) after a "
                                f"concatenation (not supported)")
            self._tied(node)  # a fused residual: the layer's output has these channels
            return
        if not first or later:
            raise _NoGrowth(f"reaches {node.target} as an argument other than its input")
        if is_conv(m) and _depthwise(m):
            self._depthwise_layer(node, hops)
        elif is_conv(m) or isinstance(m, nn.Linear):
            if isinstance(m, nn.Linear) and m.in_features != (
                    channels := width(source, self.modules.__getitem__)):
                raise _NoGrowth(f"reaches Linear {where} with {m.in_features} features from "
                                f"{channels} channels: not one feature per channel")
            if isinstance(m, nn.Linear) and not pooled(source, self.modules,
                                                        self._spatial_dims()):
                raise _NoGrowth(f"reaches Linear {where} without a global pooling and a "
                                f"flatten before it: its features may not be the channels")
            if hops and getattr(m, "groups", 1) > 1:
                raise _NoGrowth(f"reaches the grouped convolution {where} through a "
                                f"concatenation (not supported)")
            if node.target not in self.consumers:
                self.consumers.append(node.target)
                self._route(node.target, hops)
        elif isinstance(m, _BatchNorm):
            self._norm(node, hops)
        elif _passthrough(m):
            self._visit(node, hops)
        else:
            raise _NoGrowth(f"reaches {type(m).__name__} {where}, which grow_width cannot "
                            f"widen")

    def _concat(self, node, source, hops, where) -> None:
        inputs = node.args[0]
        if _cat_dim(node) != 1:
            raise _NoGrowth(f"concatenated {where} along dim {_cat_dim(node)}, not the "
                            f"channels")
        if sum(a is source for a in inputs) != 1:
            raise _NoGrowth(f"concatenated {where} more than once")
        try:
            for a in inputs:
                width(a, self.modules.__getitem__)
        except ConvError as exc:
            raise _NoGrowth(f"concatenated {where}: {exc}") from None
        index = next(i for i, a in enumerate(inputs) if a is source)
        self._visit(node, hops + ((node, index),))


def _branch_of(path: str, modules: dict) -> str | None:
    """The innermost MultiBranch branch ("owner.branches.i") that ``path`` lies in."""
    parts = path.split(".")
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] == "branches" and isinstance(modules.get(".".join(parts[:i])),
                                                  MultiBranch):
            return ".".join(parts[:i + 2])
    return None
