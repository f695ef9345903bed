"""Swap a model's torch.nn convolutions for fastconv's."""

from __future__ import annotations

import copy

import torch

from .conv import Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d

#: torch.nn class -> fastconv class. Exact types only: a user's subclass of torch.nn.Conv2d
#: may override forward, and converting it would silently drop that.
REPLACEMENTS: dict[type, type] = {
    torch.nn.Conv1d: Conv1d,
    torch.nn.Conv2d: Conv2d,
    torch.nn.ConvTranspose1d: ConvTranspose1d,
    torch.nn.ConvTranspose2d: ConvTranspose2d,
}

_CTOR_ARGS = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation",
              "groups", "padding_mode")


def convert(model: torch.nn.Module, inplace: bool = False, *, backend: str = "auto",
            precision: str | None = None) -> torch.nn.Module:
    """Replace every torch.nn Conv1d/Conv2d/ConvTranspose1d/ConvTranspose2d in ``model``
    (``model`` itself included) by its fastconv counterpart and return the model.

    The new modules hold the *same* Parameter objects (weights, device, dtype, requires_grad
    and any optimizer referring to them are unchanged) and the same training flag and hooks;
    a module registered in several places becomes one fastconv module in all of them.
    With ``inplace=False`` the model is deep-copied first and the original is left as it was.
    """
    if not inplace:
        model = copy.deepcopy(model)
    if type(model) in REPLACEMENTS:
        return _replacement(model, backend, precision)
    done: dict[int, torch.nn.Module] = {}  # a module registered twice stays one module
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) in REPLACEMENTS:
                if id(child) not in done:
                    done[id(child)] = _replacement(child, backend, precision)
                setattr(parent, name, done[id(child)])
    return model


def _replacement(module: torch.nn.Module, backend: str, precision: str | None):
    cls = REPLACEMENTS[type(module)]
    kwargs = {name: getattr(module, name) for name in _CTOR_ARGS}
    if module.transposed:
        kwargs["output_padding"] = module.output_padding
    new = cls(**kwargs, bias=module.bias is not None, device="meta", backend=backend,
              precision=precision)
    new.weight = module.weight
    new.bias = module.bias
    new.train(module.training)
    for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                 "_state_dict_hooks", "_load_state_dict_pre_hooks"):
        setattr(new, attr, getattr(module, attr))
    return new
