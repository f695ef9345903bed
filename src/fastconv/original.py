"""The optimized copy of a model under the original model's names.

``optimize`` rewrites a model: fused layers hold a convolution's and a BatchNorm's tensors,
modules move to flat names. A user's checkpoints and optimizers must not see that. So
:class:`Names` maps the copy's names back to the original's, and the hooks here apply it:

* ``state_dict()`` has the original keys, and the original ``_metadata`` (each module's
  ``_version`` under the original module paths: versioned loaders such as torchvision's
  MNASNet or BatchNorm's read it);
* ``load_state_dict`` takes the original keys and metadata (from the original model or an
  optimized copy);
* ``named_parameters()`` yields the original names, in the original model's order, so an
  optimizer built over ``optimized.parameters()`` has its parameters in the same order as
  one built over the original's, and optimizer checkpoints move between them;
* the copy's modules are ordered (:func:`order_modules`) so that walks which do not call
  it, ``DistributedDataParallel``'s around the optimized model among them, meet the
  parameters in that order too (under the copy's own names).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn


@dataclasses.dataclass
class Names:
    """``state_keys``: the copy's keys (relative to ``OptimizedModel.model``) that differ
    from the original's -> the original's; ``aliases``: original keys of tensors the
    original holds under a second name that the copy lost -> the original key the copy
    holds them under; ``metadata``: the original state_dict's ``_metadata`` (module path
    -> its local metadata); ``order``: the original parameter names, in order."""

    state_keys: dict[str, str]
    aliases: dict[str, str]
    metadata: dict[str, dict]
    order: dict[str, int]

    def __post_init__(self):
        self.internal_keys = {v: k for k, v in self.state_keys.items()}
        modules: dict[str, str] = {}
        for inner, outer in self.state_keys.items():
            modules[inner.rpartition(".")[0]] = outer.rpartition(".")[0]
        self.modules = modules  # the copy's module paths that differ -> the original's

    @staticmethod
    def of(model: nn.Module) -> tuple[dict[str, dict], dict[str, int]]:
        """The ``metadata`` and ``order`` of ``model`` as it is (the original's copy, before
        any rewriting)."""
        metadata = {path: {"version": m._version}
                    for path, m in model.named_modules(remove_duplicate=False)}
        order = {name: i for i, (name, _) in enumerate(model.named_parameters())}
        return metadata, order

    def original(self, key: str) -> str:
        return self.state_keys.get(key, key)


def order_modules(model: nn.Module, names: Names) -> None:
    """Reorder the children of the traced copy (``model``: ``OptimizedModel.model``, an fx
    GraphModule) so that torch's own walk over its parameters meets them in the original
    model's order: children sorted by the first original parameter they hold, children
    without parameters kept right after the child before them. ``named_parameters()`` of
    the optimized model already yields the original order; this is for the walks that do
    not call it: ``DistributedDataParallel`` around the optimized model (its
    ``parameters()``, so an optimizer built over it, and its gradient buckets) and
    ``nn.Module.named_parameters`` of the copy itself. Fused layers and flat names are
    appended to the GraphModule after the modules left in place (ResNet-18 under DDP listed
    ``fc`` first), which moved an optimizer checkpoint's per-parameter state onto other
    parameters. Only the GraphModule's children move: its forward reaches them by name,
    while a Sequential or ModuleList runs and indexes its children by position, and any
    other module's forward may iterate over them (a model the walk rewrote, untraced, keeps
    its own order everywhere)."""
    if not isinstance(model, torch.fx.GraphModule):
        return
    last = len(names.order)
    keyed, key = [], -1
    for i, (name, child) in enumerate(model._modules.items()):
        if child is not None:
            found = [names.order.get(names.original(f"{name}.{n}"), last)
                     for n, _ in child.named_parameters(remove_duplicate=False)]
            key = min(found) if found else key
        keyed.append((key, i, name, child))
    ordered = sorted(keyed, key=lambda e: e[:2])
    if ordered != keyed:
        model._modules.clear()  # (in place: the same dict)
        model._modules.update((name, child) for *_, name, child in ordered)


def _join(prefix: str, path: str) -> str:
    return prefix + path if path else prefix[:-1]


def save_hook(module, state_dict, prefix, local_metadata) -> None:
    """state_dict post-hook of ``OptimizedModel``: ``model.<copy's key>`` -> the original
    model's key, and the original model's metadata."""
    names: Names = module._names
    inner = prefix + "model."
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + names.original(key[len(inner):])] = state_dict.pop(key)
    for alias, held in names.aliases.items():
        if prefix + held in state_dict:
            state_dict[prefix + alias] = state_dict[prefix + held]
    meta = getattr(state_dict, "_metadata", None)
    if meta is not None:
        for path in [p for p in meta if p == inner[:-1] or p.startswith(inner)]:
            del meta[path]
        for path, local in names.metadata.items():
            meta[_join(prefix, path)] = dict(local)


def load_hook(module, state_dict, prefix, local_metadata, strict, missing_keys,
              unexpected_keys, error_msgs) -> None:
    """load_state_dict pre-hook of ``OptimizedModel``: the original model's keys ->
    ``model.<copy's key>`` (a second name of a tensor the copy holds once is read only where
    the first is absent), and each module of the copy given the metadata of the original
    module it stands for."""
    names: Names = module._names
    module._load_prefix = prefix  # for report_hook
    for alias, held in names.aliases.items():
        value = state_dict.pop(prefix + alias, None)
        if value is not None and prefix + held not in state_dict:
            state_dict[prefix + held] = value
    for key in [k for k in state_dict if k.startswith(prefix)]:
        rel = key[len(prefix):]
        state_dict[prefix + "model." + names.internal_keys.get(rel, rel)] = \
            state_dict.pop(key)
    meta = getattr(state_dict, "_metadata", None)
    if meta is not None:
        for path, _ in module.model.named_modules(remove_duplicate=False):
            local = meta.get(_join(prefix, names.modules.get(path, path)))
            if local is not None:
                meta[_join(prefix + "model.", path)] = local


def report_hook(module, incompatible) -> None:
    """load_state_dict post-hook: missing and unexpected keys named as the caller wrote
    them (the original model's keys)."""
    inner = module._load_prefix + "model."
    for keys in (incompatible.missing_keys, incompatible.unexpected_keys):
        for i, key in enumerate(keys):
            if key.startswith(inner):
                keys[i] = module._load_prefix + module._names.original(key[len(inner):])


def named_parameters(module, prefix: str, remove_duplicate: bool):
    """``OptimizedModel.named_parameters``: the copy's parameters under the original
    names, in the original order (parameters the original did not have last, in the
    copy's order)."""
    names: Names = module._names
    last = len(names.order)
    found = [(names.order.get(names.original(name), last), i, names.original(name), p)
             for i, (name, p) in enumerate(
                 module.model.named_parameters(remove_duplicate=False))]
    seen: set[int] = set()
    for _, _, name, p in sorted(found, key=lambda e: e[:2]):
        if remove_duplicate:  # a tensor held twice: under its first original name
            if id(p) in seen:
                continue
            seen.add(id(p))
        yield (f"{prefix}.{name}" if prefix else name), p

