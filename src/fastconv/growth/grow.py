"""grow_width: find the pairs, widen them all in one step or none, carry the optimizer
state to the new parameters."""

from __future__ import annotations

import collections
import math
import warnings

import torch
from torch import Tensor, nn

from ..errors import ConvError, real_number
from .dataflow import find_groups, width
from .multibranch import MultiBranch, _out_width
from .pairs import NO_CONSUMER, Pair, inside, is_conv
from .report import GrowthError, GrowthReport
from .widen import (
    INITS,
    Carries,
    Widening,
    _widen_batchnorm,
    _widen_conv_out,
    _widen_depthwise,
    _widen_in,
)


def _new_width(old: int, blocks: int, factor_or_mapping, names: tuple[str, ...]) -> int:
    """The width ``names`` (producers tied to one width) grow to."""
    if not isinstance(factor_or_mapping, dict):
        return math.ceil(old * float(factor_or_mapping) / blocks) * blocks
    given = {factor_or_mapping[n] for n in names if n in factor_or_mapping}
    if len(given) > 1:
        raise ConvError(f"factor_or_mapping: {', '.join(names)} are tied to one width by "
                        f"residual adds, but got the widths {sorted(given)}")
    return given.pop() if given else old


def _check_growth(factor_or_mapping, pairs: list[Pair]) -> None:
    """A factor must be a real number ≥ 1; a mapping must name producers that ``pairs`` holds
    (a name of no such layer is an error, not a silent no-op) and give each a positive int."""
    if isinstance(factor_or_mapping, dict):
        producers = sorted({name for p in pairs for name in (p.producer, *p.tied)})
        unknown = [k for k in factor_or_mapping if k not in producers]
        if unknown:
            raise ConvError(f"factor_or_mapping: {unknown} name no layer grow_width can grow "
                            f"(producers found: {', '.join(producers) or 'none'})")
        bad = {k: v for k, v in factor_or_mapping.items()
               if isinstance(v, bool) or not isinstance(v, int) or v < 1}
        if bad:
            raise ConvError(f"factor_or_mapping: widths must be positive ints, got {bad}")
        return
    factor = real_number("factor_or_mapping", factor_or_mapping, positive=True)
    if factor < 1:
        raise ConvError(f"factor_or_mapping: got {factor_or_mapping!r}; a factor grows, so it "
                        f"must be at least 1")


class _Holders:
    """Every path each module of a model is registered under, and every name each of its
    parameters and buffers is held under: a layer reached under one name but held under
    two (a module registered twice, a weight tied to another layer's) cannot be replaced
    by a widened copy without leaving the other name on the old one."""

    def __init__(self, model: nn.Module):
        self.paths: dict[int, list[str]] = collections.defaultdict(list)
        for path, m in model.named_modules(remove_duplicate=False):
            self.paths[id(m)].append(path)
        self.names: dict[int, list[str]] = collections.defaultdict(list)
        # (nn.Module's own walk: an OptimizedModel names its parameters as the original)
        for name, t in (*nn.Module.named_parameters(model, remove_duplicate=False),
                        *model.named_buffers(remove_duplicate=False)):
            self.names[id(t)].append(name)

    def check(self, path: str, layer: nn.Module) -> None:
        """Raise ConvError where ``layer`` (at ``path``) is held under other names too."""
        paths = self.paths.get(id(layer), [path])
        if len(paths) > 1:
            raise ConvError(f"{path}: the module is registered under {len(paths)} names "
                            f"({', '.join(paths)}); a widened copy would replace it under "
                            f"one only")
        for name, t in (*layer.named_parameters(), *layer.named_buffers()):
            others = [n for n in self.names.get(id(t), ()) if n != f"{path}.{name}"]
            if others:
                raise ConvError(f"{path}.{name}: the same tensor is held as "
                                f"{', '.join(others)} (tied); widening it here would untie "
                                f"them")


def _grow_pair(pair: Pair, get, factor_or_mapping, init, noise, generator,
               carries: dict[str, Carries], holders: _Holders):
    """(the widened layers by path, or None when the width stays; old and new width) of
    one producer (and those tied to it) with every layer it reaches."""
    producers = [get(n) for n in (pair.producer, *pair.tied)]
    old = producers[0].out_channels
    for n, p in zip(pair.tied, producers[1:]):
        if p.out_channels != old:
            raise ConvError(f"{n} gives {p.out_channels} channels, {pair.producer} {old}: "
                            f"a residual add ties them to one width")

    def channels(node):
        return width(node, lambda target: get(pair.prefix + target))

    def placed(path: str, w: Widening) -> Widening:  # the widening as ``path`` sees it
        for cat, index in pair.routes.get(path, ()):
            widths = [channels(a) for a in cat.args[0]]
            if widths[index] != w.old:
                raise ConvError(f"{path}: concatenation {cat.name} holds {widths[index]} "
                                f"channels where {w.old} were expected")
            w = w.within(sum(widths[:index]), sum(widths))
        return w

    plain = [get(c) for c in pair.consumers if c not in pair.routes]
    blocks = math.lcm(*(p.groups for p in producers), *(getattr(c, "groups", 1)
                                                        for c in plain))
    if old % blocks:
        raise ConvError(f"groups: the producers and consumers have groups whose lcm "
                        f"{blocks} does not divide their {old} channels")
    new = _new_width(old, blocks, factor_or_mapping, (pair.producer, *pair.tied))
    if new == old:
        return None, old, new
    w = Widening.plan(old, new, blocks, init, generator)
    grown: dict[str, nn.Module] = {}

    def apply(path, fn, what, size):
        if path not in grown:
            holders.check(path, get(path))
        layer = grown[path] if path in grown else get(path)
        wp = placed(path, w)
        if getattr(layer, size) != wp.old:
            raise ConvError(f"{path}: {what} {getattr(layer, size)} channels where "
                            f"{wp.old} were expected")
        grown[path] = fn(layer, wp, carries.setdefault(path, {}))

    for path in (pair.producer, *pair.tied):
        apply(path, lambda m, wp, c: _widen_conv_out(m, wp, init, noise, generator, c),
              "gives", "out_channels")
    for path in pair.consumers:
        layer = grown[path] if path in grown else get(path)
        apply(path, lambda m, wp, c: _widen_in(m, wp, init, c), "takes",
              "in_features" if isinstance(layer, nn.Linear) else "in_channels")
    for path in pair.depthwise:
        apply(path, lambda m, wp, c: _widen_depthwise(m, wp, init, noise, generator, c),
              "gives", "out_channels")
    for path in pair.bns:
        apply(path, lambda m, wp, c: _widen_batchnorm(m, wp, c), "normalises",
              "num_features")
    return grown, old, new


def grow_width(module: nn.Module, factor_or_mapping, optimizer=None, *, init: str = "zero",
               noise: float = 0.0, on_error: str = "raise",
               generator: torch.Generator | None = None) -> GrowthReport:
    """Widen every producer/consumer pair of ``module`` in place: by ``factor`` (rounded up
    to the groups) or to ``{producer name: width}``. All or nothing: on any failure the model
    and optimizer are left as they were and :class:`GrowthError` lists each layer; with
    ``on_error="drop"`` the failing :class:`MultiBranch` branches are removed instead (after
    the pass) and reported. With ``optimizer=`` its state follows the new parameters."""
    if on_error not in ("raise", "drop"):
        raise ConvError(f"on_error: got {on_error!r}; allowed: 'raise', 'drop'")
    if init not in INITS:
        raise ConvError(f"init: got {init!r}; allowed: {', '.join(map(repr, INITS))}")
    pairs, reasons, note = find_groups(module)
    _check_growth(factor_or_mapping, pairs)
    report = GrowthReport(notes=[note] if note else [])
    current: dict[str, nn.Module] = {}
    carries: dict[str, Carries] = {}
    holders = _Holders(module)
    failed_branches: dict[str, str] = {}

    def get(path):
        return current[path] if path in current else module.get_submodule(path)

    for pair in pairs:
        if pair.branch in failed_branches:
            continue
        try:
            names = (pair.producer, *pair.tied)
            grown, old, new = _grow_pair(pair, get, factor_or_mapping, init, noise,
                                         generator, carries, holders)
            if grown is None:
                report.not_grown += [(n, f"its width stays {old}") for n in names]
                continue
            current.update(grown)
            report.grown += [(n, old, new) for n in names]
            for n in names:
                report.widened[n] = tuple(p for p in grown if p != n)
        except Exception as exc:  # collected: the model is not touched until all succeed
            why = f"{type(exc).__name__}: {exc}"
            report.failed.append((pair.producer, why))
            if pair.branch is not None and on_error == "drop":
                failed_branches[pair.branch] = why
    paired = {name for p in pairs for name in (p.producer, *p.tied)}
    report.not_grown += [(name, reasons.get(name, NO_CONSUMER))
                         for name, m in module.named_modules()
                         if is_conv(m) and name not in paired]
    if report.failed and (on_error == "raise" or any(
            not any(inside(p, b) for b in failed_branches) for p, _ in report.failed)):
        raise GrowthError("grow_width: nothing was changed", report)
    drops: dict[str, list[int]] = {}
    for branch in failed_branches:  # each MultiBranch drops its failures at once
        owner_path, _, index = ("." + branch).rpartition(".branches.")
        drops.setdefault(owner_path.lstrip("."), []).append(int(index))
    for owner_path, indices in drops.items():
        owner = module.get_submodule(owner_path) if owner_path else module
        if len(indices) >= len(owner.branches):
            raise GrowthError(f"grow_width: every branch of {owner_path or 'the model'} "
                              f"failed, and a MultiBranch needs one; nothing was changed",
                              report)
    for path in list(current):  # a dropped branch's widened layers are not installed
        if any(inside(path, b) for b in failed_branches):
            del current[path]
    report.grown = [g for g in report.grown
                    if not any(inside(g[0], b) for b in failed_branches)]
    # commit: every module swapped in, then optimizer state moved
    for path, new in current.items():
        parent_path, _, name = path.rpartition(".")
        parent = module.get_submodule(parent_path) if parent_path else module
        for key, (origin, carry) in carries[path].items():
            if isinstance(origin, nn.Parameter):
                report.mapping[origin] = (new.get_parameter(key), carry)
        setattr(parent, name, new)
    for m in module.modules():  # a concatenation's width is its branches'
        if isinstance(m, MultiBranch) and m.merge == "concat":
            m.out_channels = sum(_out_width(b) for b in m.branches)
    report.dropped += list(failed_branches.items())
    for owner_path, indices in drops.items():
        (module.get_submodule(owner_path) if owner_path else module).drop_branches(indices)
    if optimizer is not None:
        carry_optimizer(optimizer, report.mapping)
    elif report.mapping:
        warnings.warn("grow_width: the model has new parameters; rebuild the optimizer or "
                      "pass optimizer= to carry its state", UserWarning, stacklevel=2)
    return report


def carry_optimizer(optimizer: torch.optim.Optimizer, mapping: dict) -> None:
    """Point ``optimizer`` at the new parameters of ``mapping`` ({old parameter: (new
    parameter, carry)}) and move their state: tensors of the parameter's shape (momentum,
    Adam's moments) are placed at the new positions with zeros in new slices; the rest
    (step counts) is kept."""
    for group in optimizer.param_groups:
        group["params"] = [mapping[p][0] if p in mapping else p for p in group["params"]]
    for old, (new, carry) in mapping.items():
        state = optimizer.state.pop(old, None)
        if state is None:
            continue
        optimizer.state[new] = {
            k: (carry(v) if isinstance(v, Tensor) and v.shape == old.shape else v)
            for k, v in state.items()}
