"""Whether a Linear layer reads channels: its input must be provably (N, C), every
spatial dimension pooled to one and dropped."""

from __future__ import annotations

import torch
from torch import nn

from .pairs import PASSTHROUGH

#: functions acting per element (activations, dropout), which keep a tensor's shape
_ELEMENTWISE_FUNCTIONS = {
    torch.relu, torch.sigmoid, torch.tanh, torch.nn.functional.relu,
    torch.nn.functional.relu6, torch.nn.functional.leaky_relu, torch.nn.functional.silu,
    torch.nn.functional.gelu, torch.nn.functional.hardswish,
    torch.nn.functional.hardsigmoid, torch.nn.functional.dropout,
}
#: modules acting per element, which keep a tensor's shape
_ELEMENTWISE = tuple(t for t in PASSTHROUGH if not issubclass(t, nn.modules.pooling._MaxPoolNd)
                     and not issubclass(t, nn.modules.pooling._AvgPoolNd))



def _through_elementwise(node, modules: dict):
    """The first node at or before ``node`` (following first arguments) that is not an
    element-wise activation, dropout or identity."""
    while True:
        if node.op == "call_module" and isinstance(modules.get(node.target), _ELEMENTWISE):
            pass
        elif node.op == "call_function" and node.target in _ELEMENTWISE_FUNCTIONS:
            pass
        elif node.op == "call_method" and node.target in ("relu", "relu_", "sigmoid", "tanh",
                                                          "contiguous", "clone"):
            pass
        else:
            return node
        if not node.args or not isinstance(node.args[0], torch.fx.Node):
            return node
        node = node.args[0]


def _reduces(node, spatial: int) -> bool | None:
    """Whether ``node`` pools every spatial dimension to one: True where the result is
    (N, C), False where it keeps them as size-1 dimensions, None where it pools nothing or
    not all of them."""
    target = node.target
    if node.op == "call_module":
        return None
    if target in ("mean", "amax", torch.mean, torch.amax):
        dims = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
        dims = (dims,) if isinstance(dims, int) else dims
        rank = spatial + 2
        if not isinstance(dims, (tuple, list)) or \
                {d % rank for d in dims if isinstance(d, int)} != set(range(2, rank)):
            return None
        keep = node.kwargs.get("keepdim", node.args[2] if len(node.args) > 2 else False)
        return not keep
    if target in (torch.nn.functional.adaptive_avg_pool2d,
                  torch.nn.functional.adaptive_max_pool2d, torch.nn.functional.adaptive_avg_pool1d,
                  torch.nn.functional.adaptive_max_pool1d):
        size = node.kwargs.get("output_size", node.args[1] if len(node.args) > 1 else None)
        return False if _ones(size) else None
    return None


def _ones(size) -> bool:
    return size == 1 or (isinstance(size, (tuple, list)) and all(s == 1 for s in size))


def _flattens(node, modules: dict) -> bool:
    """Whether ``node`` flattens (N, C, 1, ...) to (N, C)."""
    if node.op == "call_module":
        m = modules.get(node.target)
        return isinstance(m, nn.Flatten) and m.start_dim == 1 and m.end_dim == -1
    start = node.kwargs.get("start_dim", node.args[1] if len(node.args) > 1 else 0)
    if node.op == "call_function" and node.target is torch.flatten:
        return start == 1 and node.kwargs.get("end_dim", -1) == -1 and len(node.args) <= 2
    if node.op == "call_method" and node.target == "flatten":
        return start == 1 and node.kwargs.get("end_dim", -1) == -1 and len(node.args) <= 2
    return node.op == "call_method" and node.target in ("view", "reshape") \
        and len(node.args) == 3 and node.args[2] == -1


def pooled(source, modules: dict, spatial: int) -> bool:
    """Whether ``source`` is provably (N, C): every spatial dimension pooled to one and
    dropped (a global pooling and a flatten, or a mean over them), so that a Linear layer
    reading it takes the channels as its features."""
    node = _through_elementwise(source, modules)
    if node.op == "call_module" and _global_pool(modules.get(node.target), spatial):
        return False  # (N, C, 1, ...): a flatten must follow
    reduced = _reduces(node, spatial)
    if reduced is not None:
        return reduced
    if not _flattens(node, modules) or not isinstance(node.args[0], torch.fx.Node):
        return False
    pool = _through_elementwise(node.args[0], modules)
    if pool.op == "call_module":
        return _global_pool(modules.get(pool.target), spatial)
    return _reduces(pool, spatial) is False


def _global_pool(m, spatial: int) -> bool:
    """An adaptive pooling module to one value per channel, of ``spatial`` dimensions."""
    kinds = {1: (nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d),
             2: (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)}.get(spatial, ())
    return isinstance(m, kinds) and _ones(m.output_size)
