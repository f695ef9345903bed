"""A differential fuzzer of fastconv's model paths: random small models, built from the layers
and patterns users write, run through ``optimize`` (inference and training),
``fastconv.compile`` (CPU Inductor), ``grow_width``, a state_dict round trip, an optimizer
checkpoint resume, pickling and attributes changed between calls; each result is compared
with the original model's in float64.

A model is a stem, a few random *parts* and a head. The parts:

* ``seq``: Conv -> BatchNorm -> activation in an ``nn.Sequential`` (some with an identity, a
  p = 0 dropout, an in-place ReLU, a depthwise or strided conv);
* ``residual``: a custom forward ``act(bn2(conv2(act(bn1(conv1(x))))) + x)``;
* ``shared``: one block called twice;
* ``nograd``: a teacher block under ``torch.no_grad()``;
* ``autocast_off``: a block under ``torch.autocast("cpu", enabled=False)``;
* ``script``: a ``torch.jit.script``-ed block;
* ``untraceable``: Python control flow on a tensor's value;
* ``reach``: a forward calling a Sequential's children one by one with an op between;
* ``tied``: two blocks whose convolutions share one weight Parameter;
* ``hooked``: a forward hook or pre-hook on a conv, BatchNorm, activation or block;
* ``branch``: a ``MultiBranch`` of two blocks (mean, added to its input);
* ``subclass``: a Conv2d subclass with a forward of its own.

The model's own forward is a loop over its parts, or an ``nn.Sequential``, or a loop with
a grad-mode region around one part. Used by ``tests/test_model_fuzz.py`` on fixed seeds;
for longer runs::

    python tests/model_fuzz.py --seed 1000 --count 500 [--compile]
"""

from __future__ import annotations

import argparse
import copy
import io
import pickle
import random
import sys
import time
import warnings

import torch
from torch import nn

import fastconv
from fastconv.growth import GrowthError, MultiBranch, grow_width
from fastconv.precision import relative_error

C = 4  # channels inside the model
PARTS = ("seq", "residual", "shared", "nograd", "autocast_off", "script", "untraceable",
         "reach", "tied", "hooked", "branch", "subclass")
ACTIVATIONS = (nn.ReLU, nn.SiLU, nn.Hardswish, nn.LeakyReLU, nn.Identity)
TOLERANCE = 1e-9  # float64 through other kernels and folds


# ------------------------------------------------------------------------------- parts
def _block(rng: random.Random, c: int = C, *, inplace: bool = False) -> nn.Sequential:
    kind = rng.choice(("plain", "plain", "depthwise", "strided"))
    groups = c if kind == "depthwise" else 1
    act = rng.choice(ACTIVATIONS)
    layers = [nn.Conv2d(c, c, 3, padding=1, groups=groups, bias=rng.random() < 0.5),
              nn.BatchNorm2d(c),
              nn.ReLU(inplace=True) if inplace and act is nn.ReLU else act()]
    if kind == "strided":  # (and back up, so that every part keeps the size)
        layers[0] = nn.Conv2d(c, c, 3, padding=1, stride=2, bias=False)
        layers.append(nn.Upsample(scale_factor=2))
    if rng.random() < 0.3:
        layers.insert(rng.randint(0, len(layers)), rng.choice((nn.Identity(),
                                                                 nn.Dropout(0.0))))
    return nn.Sequential(*layers)


class Residual(nn.Module):
    def __init__(self, rng: random.Random):
        super().__init__()
        self.conv1 = nn.Conv2d(C, C, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(C)
        self.conv2 = nn.Conv2d(C, C, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(C)
        self.act = rng.choice(ACTIVATIONS)()

    def forward(self, x):
        return self.act(self.bn2(self.conv2(self.act(self.bn1(self.conv1(x))))) + x)


class Shared(nn.Module):
    def __init__(self, rng: random.Random):
        super().__init__()
        self.block = _block(rng)

    def forward(self, x):
        return self.block(self.block(x))


class NoGrad(nn.Module):
    def __init__(self, rng: random.Random):
        super().__init__()
        self.student, self.teacher = _block(rng), _block(rng)

    def forward(self, x):
        x = self.student(x)
        with torch.no_grad():
            target = self.teacher(x)
        return x + target


class AutocastOff(nn.Module):
    def __init__(self, rng: random.Random):
        super().__init__()
        self.block = _block(rng)

    def forward(self, x):
        with torch.autocast("cpu", enabled=False):
            return self.block(x)


class Untraceable(nn.Module):
    def __init__(self, rng: random.Random):
        super().__init__()
        self.block = _block(rng)

    def forward(self, x):
        if x.sum() > -1e9:  # always; a Proxy cannot be branched on
            x = x * 1.5
        return self.block(x)


class Reach(nn.Module):
    def __init__(self, rng: random.Random):
        super().__init__()
        self.seq = nn.Sequential(nn.Conv2d(C, C, 3, padding=1), nn.BatchNorm2d(C),
                                 rng.choice(ACTIVATIONS)())

    def forward(self, x):
        y = self.seq[0](x)
        if y.sum() > -1e9:
            y = y * 2 - 0.5
        return self.seq[2](self.seq[1](y))


class Tied(nn.Module):
    def __init__(self, rng: random.Random):
        super().__init__()
        self.a, self.b = _block(rng), _block(rng)
        a, b = (next(m for m in s if isinstance(m, nn.Conv2d)) for s in (self.a, self.b))
        if a.weight.shape == b.weight.shape:
            b.weight = a.weight

    def forward(self, x):
        return self.b(self.a(x))


class Hooked(nn.Module):
    def __init__(self, rng: random.Random):
        super().__init__()
        self.block = _block(rng)
        self.shift = [rng.uniform(-1, 1)]  # read at each call
        target = rng.choice([self.block, *self.block[:3]])
        shift = self.shift
        if rng.random() < 0.5:
            target.register_forward_hook(lambda m, args, out: out.cos() + shift[0])
        else:
            target.register_forward_pre_hook(lambda m, args: (args[0] + shift[0],))

    def forward(self, x):
        return self.block(x)


class Branch(nn.Module):
    def __init__(self, rng: random.Random):
        super().__init__()
        self.branch = MultiBranch([_block(rng), _block(rng)], scale=0.5)

    def forward(self, x):
        return x + self.branch(x)


class OwnConv(nn.Conv2d):
    """A Conv2d subclass whose forward is its own: never fused as a convolution."""

    def forward(self, x):
        return super().forward(x) * 0.5 + 1


def _part(kind: str, rng: random.Random) -> nn.Module:
    if kind == "seq":
        return _block(rng, inplace=rng.random() < 0.5)
    if kind == "script":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.jit.script(_block(rng))
    if kind == "subclass":
        return nn.Sequential(OwnConv(C, C, 3, padding=1), nn.BatchNorm2d(C), nn.ReLU())
    return {"residual": Residual, "shared": Shared, "nograd": NoGrad,
            "autocast_off": AutocastOff, "untraceable": Untraceable, "reach": Reach,
            "tied": Tied, "hooked": Hooked, "branch": Branch}[kind](rng)


class Net(nn.Module):
    """stem -> parts -> global pooling -> Linear; ``region``: the index of a part run under
    ``torch.no_grad()`` by this forward itself (-1: none)."""

    def __init__(self, parts: list[nn.Module], region: int):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, C, 3, padding=1), nn.BatchNorm2d(C), nn.ReLU())
        self.parts = nn.ModuleList(parts)
        self.head = nn.Linear(C, 3)
        self.region = region

    def forward(self, x):
        x = self.stem(x)
        for i, part in enumerate(self.parts):
            if i == self.region:
                with torch.no_grad():
                    x = x + part(x)
            else:
                x = part(x)
        return self.head(x.mean((2, 3)))


def build(seed: int, init: int | None = None) -> nn.Module:
    """The model of ``seed`` (the same one at every call), float64, BatchNorm statistics and
    affine parameters away from their initial values; with ``init``, every parameter and
    statistic drawn again from that seed (the same structure, other values)."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    kinds = [rng.choice(PARTS) for _ in range(rng.randint(1, 3))]
    parts = [_part(k, rng) for k in kinds]
    shape = rng.choice(("net", "net", "sequential", "region"))
    if shape == "sequential":
        model = nn.Sequential(nn.Conv2d(3, C, 3, padding=1), nn.BatchNorm2d(C), nn.ReLU(),
                              *parts, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(C, 3))
    else:
        model = Net(parts, rng.randrange(len(parts)) if shape == "region" else -1)
    model = model.double()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    if init is not None:
        g = torch.Generator().manual_seed(init)
        with torch.no_grad():
            for t in (*model.parameters(), *model.buffers()):
                if t.is_floating_point():
                    t.copy_(torch.rand(t.shape, generator=g, dtype=t.dtype) + 0.5)
    model.kinds = kinds  # (plain attributes: for the report)
    model.shape = shape
    return model


# ------------------------------------------------------------------------------- checks
class Mismatch(AssertionError):
    pass


def _close(what: str, got, want, tol: float = TOLERANCE) -> None:
    if (got is None) != (want is None):
        raise Mismatch(f"{what}: {'no ' if got is None else ''}value where the original has "
                       f"{'none' if want is None else 'one'}")
    if got is None:
        return
    if got.shape != want.shape:
        raise Mismatch(f"{what}: shape {tuple(got.shape)}, the original's {tuple(want.shape)}")
    err = relative_error(got, want)
    if not err <= tol:
        raise Mismatch(f"{what}: relative error {err:.3g}")


def _inputs(seed: int, n: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=g, dtype=torch.float64)


def check_inference(seed: int) -> None:
    model = build(seed).eval()
    fast = fastconv.optimize(model, "inference", channels_last=False)
    x = _inputs(seed)
    with torch.no_grad():
        want = model(x)
        for i in range(2):  # the first call and a kept one
            _close(f"inference call {i}", fast(x), want)


def check_training(seed: int) -> None:
    """Two momentum-SGD steps on the original and on its optimized copy: outputs, every
    gradient (by name), parameter sets, BatchNorm statistics, optimizer state."""
    model = build(seed).train()
    fast = fastconv.optimize(model, "training", channels_last=False)
    names = [n for n, _ in model.named_parameters()]
    if [n for n, _ in fast.named_parameters()] != names:
        raise Mismatch("named_parameters differ from the original's")
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (model, fast)]
    for step in range(2):
        x = _inputs(seed + step)
        outs = []
        for net, opt in zip((model, fast), opts):
            opt.zero_grad()
            y = net(x)
            y.square().mean().backward()
            outs.append(y)
        _close(f"training step {step} output", outs[1], outs[0])
        got = dict(fast.named_parameters())
        for name, p in model.named_parameters():
            _close(f"step {step} gradient of {name}", got[name].grad, p.grad, 1e-8)
        for opt in opts:
            opt.step()
    got = fast.state_dict()
    for key, value in model.state_dict().items():
        if key not in got:
            raise Mismatch(f"state_dict lacks {key}")
        _close(f"state {key}", got[key].double(), value.double(), 1e-8)
    states = [opt.state_dict()["state"] for opt in opts]
    for i, name in enumerate(names):  # (no state: a parameter that never had a gradient)
        _close(f"momentum of {name}", states[1].get(i, {}).get("momentum_buffer"),
               states[0].get(i, {}).get("momentum_buffer"), 1e-8)


def check_round_trips(seed: int) -> None:
    """state_dict both ways, pickling and deepcopy after a call."""
    model = build(seed).eval()
    fast = fastconv.optimize(model, "inference", channels_last=False)
    x = _inputs(seed)
    with torch.no_grad():
        want = model(x)
        fast(x)
        fresh = build(seed, init=1).eval()  # the same structure, other values
        fresh.load_state_dict(fast.state_dict())
        _close("original loading the optimized state_dict", fresh(x), want)
        again = fastconv.optimize(build(seed, init=2).eval(), "inference",
                                  channels_last=False)
        again.load_state_dict(model.state_dict())
        _close("optimized loading the original state_dict", again(x), want)
        _close("deepcopy of the optimized model", copy.deepcopy(fast)(x), want)
        try:
            pickle.dumps(model)
        except Exception:  # (lambda hooks, scripted parts): the original does not pickle
            return
        buffer = io.BytesIO()
        torch.save(fast, buffer)
        buffer.seek(0)
        for what, copied in (("pickle", pickle.loads(pickle.dumps(fast))),
                             ("torch.save", torch.load(buffer, weights_only=False))):
            _close(f"{what} of the optimized model", copied(x), want)


def check_resume(seed: int) -> None:
    """An optimizer checkpoint of the original resumed on the optimized copy."""
    model = build(seed).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model(_inputs(seed)).square().mean().backward()
    opt.step()
    saved = copy.deepcopy(opt.state_dict())
    fast = fastconv.optimize(model, "training", channels_last=False)
    ref = build(seed).train()  # (torch's deepcopy of a scripted part breaks its training)
    ref.load_state_dict(model.state_dict())
    x = _inputs(seed + 7)
    for net in (ref, fast):
        resumed = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        resumed.load_state_dict(copy.deepcopy(saved))
        net(x).square().mean().backward()
        resumed.step()
    got = dict(fast.named_parameters())
    for name, p in ref.named_parameters():
        _close(f"resumed step: {name}", got[name], p, 1e-8)


def check_attributes(seed: int) -> None:
    """A 3x3 stride-1 convolution switched to dilation 2 (padding 2: the same shape) after a
    call, in the original and in the optimized copy alike."""
    rng = random.Random(seed)
    for mode in ("inference", "training"):
        model = build(seed).train(mode == "training")
        fast = fastconv.optimize(model, mode, channels_last=False)
        x = _inputs(seed)
        with torch.no_grad():
            fast(x)
            model(x)
            convs = [(n, m) for n, m in model.named_modules() if type(m) is nn.Conv2d
                     and m.kernel_size == (3, 3) and m.stride == (1, 1)
                     and m.padding == (1, 1) and m.dilation == (1, 1)]
            if not convs:
                return
            name, conv = rng.choice(convs)
            key = fast._names.internal_keys.get(f"{name}.weight", f"{name}.weight")
            ours = fast.model.get_submodule(key.rpartition(".")[0])  # its fused layer
            for m in (conv, ours):
                m.dilation, m.padding = (2, 2), (2, 2)
            want = model(x)
            _close(f"{mode} after {name}.dilation = 2", fast(x), want)


def check_growth(seed: int) -> None:
    """grow_width with an optimizer: the function is kept and the optimizer holds every
    parameter, or GrowthError and nothing changed."""
    model = build(seed).eval()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = _inputs(seed)
    with torch.no_grad():
        want = model(x)
    before = copy.deepcopy(model.state_dict())
    try:
        grow_width(model, 1.5, optimizer=opt, generator=torch.Generator().manual_seed(seed))
    except GrowthError:
        after = model.state_dict()
        if before.keys() != after.keys() or any(not torch.equal(before[k], after[k])
                                                for k in before):
            raise Mismatch("grow_width failed and changed the model") from None
        return
    with torch.no_grad():
        _close("grown model", model(x), want)
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    if held != {id(p) for p in model.parameters()}:
        raise Mismatch("after grow_width the optimizer does not hold exactly the model's "
                       "parameters")


def check_compile(seed: int) -> None:
    """fastconv.compile (CPU Inductor), inference: the first call and a later one."""
    model = build(seed).eval()
    compiled = fastconv.compile(model, training=False, channels_last=False)
    x = _inputs(seed)
    with torch.no_grad():
        want = model(x)
        for i in range(2):
            _close(f"compiled call {i}", compiled(x), want)


CHECKS = {"inference": check_inference, "training": check_training,
          "round_trips": check_round_trips, "resume": check_resume,
          "attributes": check_attributes, "growth": check_growth, "compile": check_compile}


def run(seed: int, checks=None) -> list[str]:
    """Every check of model ``seed``: a line per failure (empty: all passed)."""
    failures = []
    for name in checks or [c for c in CHECKS if c != "compile"]:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                CHECKS[name](seed)
        except Exception as exc:  # a failure of any kind is a finding
            first = str(exc).splitlines()[0] if str(exc) else ""
            failures.append(f"seed {seed} {name}: {type(exc).__name__}: {first[:300]}")
    return failures


def describe(seed: int) -> str:
    model = build(seed)
    return f"seed {seed}: {model.shape} of {', '.join(model.kinds)}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="first model's seed")
    parser.add_argument("--count", type=int, default=50, help="how many models")
    parser.add_argument("--compile", action="store_true",
                        help="also fastconv.compile each model (CPU Inductor, seconds each)")
    args = parser.parse_args(argv)
    checks = list(CHECKS) if args.compile else None
    start, found = time.monotonic(), []
    for seed in range(args.seed, args.seed + args.count):
        failures = run(seed, checks)
        if failures:
            print(describe(seed))
            for line in failures:
                print("  " + line)
        found += failures
    print(f"{args.count} models, {len(found)} failures, {time.monotonic() - start:.0f} s")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
