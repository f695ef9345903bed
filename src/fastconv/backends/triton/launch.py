"""Kernel launches through the compiled kernel's own launcher.

``kernel[grid](*args, **meta)`` goes through Triton's ``JITFunction.run`` on every call:
it binds and specialises every argument, hashes the result, looks the compiled kernel up,
reads the current device and stream and builds launch metadata: 11.7 µs (3 arguments) and
16.3 µs (20) per launch on the H100's host, against 7.1 µs for torch.add and 8.5 / 11.3 µs
through ``launch`` (benchmarks/launch_overhead.py, benchmarks/results/host/).

``launch(kernel, grid, *args, **meta)`` does the same launch. The first call of a
specialisation goes through ``JITFunction.run`` (which compiles), and its compiled kernel is
remembered under a key that holds everything Triton specialises on: the grid, every
integer and flag by value (so its ``== 1``, ``% 16`` and width), every float by type, every
tensor's dtype and whether its address is 16-byte aligned, the constexprs and launch
options, and the device. A later call with the same key calls the compiled kernel's
launcher directly with the current stream. A parameter is given the same Python type at
every call (an int is never a bool or a float there), as the call sites in this package do.

Triton's own path is kept where the fast one could differ: the interpreter, and a
launch hook installed (a profiler such as proton reads launch metadata; Triton keeps the
hooks in a chain that is empty unless one is added).
"""

from __future__ import annotations

import torch
from triton import knobs

#: Whether the kernels were created for the interpreter (TRITON_INTERPRET=1 at import):
#: they then run on CPU tensors only, and on the GPU not at all.
INTERPRETED: bool = bool(knobs.runtime.interpret)

_Tensor = torch.Tensor

#: kernel -> {key: (launcher, function, packed metadata, grid 0, 1, 2, trailing arguments)};
#: one entry per distinct shape and flags a kernel ran with (a small tuple each)
_COMPILED: dict = {}


def launch(kernel, grid: tuple, *args, **meta) -> None:
    """``kernel[grid](*args, **meta)``, through the compiled kernel's launcher once cached."""
    _launch(kernel, grid, args, meta)


def prepare(kernel, grid: tuple, ntensors: int, *args, **meta) -> Prepared | None:
    """``launch(kernel, grid, *args, **meta)`` now, and the same launch for later calls that
    differ only in the first ``ntensors`` arguments (tensors of the same dtypes, shapes and
    strides: a plan's operands), or None where only Triton's own path runs (interpreter,
    launch hooks)."""
    entry = _launch(kernel, grid, args, meta)
    if entry is None:
        return None
    return Prepared(entry, args[:ntensors], args[ntensors:], torch.cuda.current_device())


class Prepared:
    """A cached launch whose arguments after the leading tensors are fixed. ``p(*tensors)``
    launches it with new leading tensors and returns True, or returns False (launching
    nothing) where the cached kernel may not apply: a tensor's address differs from the
    first call's in its low 4 bits (Triton specialises on 16-byte alignment; callers may
    have decided on 4-byte words), or a launch hook was installed since."""

    __slots__ = ("entry", "low_bits", "rest", "device")

    def __init__(self, entry: tuple, tensors: tuple, rest: tuple, device: int):
        self.entry = entry
        self.low_bits = tuple(t.data_ptr() & 15 for t in tensors)
        self.rest = rest
        self.device = device

    def __call__(self, *tensors) -> bool:
        if tuple(t.data_ptr() & 15 for t in tensors) != self.low_bits \
                or _hooked(knobs.runtime.launch_enter_hook) \
                or _hooked(knobs.runtime.launch_exit_hook):
            return False
        run, function, packed, g0, g1, g2, tail = self.entry
        run(g0, g1, g2, torch._C._cuda_getCurrentRawStream(self.device), function, packed,
            None, None, None, *tensors, *self.rest, *tail)
        return True


class Fixed:
    """A launch whose grid, arguments after the leading tensors and constexprs are fixed
    (a plan's launch whose buffers are made per call): ``f(*tensors)`` launches it, through
    a prepared launch (:func:`prepare`) after the first call and Triton's own path where
    that refuses (then prepared again). Returns True (it always launches)."""

    __slots__ = ("kernel", "grid", "rest", "meta", "prepared")

    def __init__(self, kernel, grid: tuple, rest: tuple, meta: dict):
        self.kernel, self.grid, self.rest, self.meta = kernel, grid, rest, meta
        self.prepared = None

    def __call__(self, *tensors) -> bool:
        prepared = self.prepared
        if prepared is None or not prepared(*tensors):
            self.prepared = prepare(self.kernel, self.grid, len(tensors), *tensors,
                                    *self.rest, **self.meta)
        return True


def _launch(kernel, grid: tuple, args: tuple, meta: dict) -> tuple | None:
    """The launch; returns its cache entry (None on Triton's own path, and where the kernel
    was not compiled but recorded: ``compiles.collecting``)."""
    hooks = knobs.runtime
    if INTERPRETED or _hooked(hooks.launch_enter_hook) or _hooked(hooks.launch_exit_hook):
        kernel[grid](*args, **meta)
        return None
    device = torch.cuda.current_device()
    key = [device, grid]
    for a in args:
        if isinstance(a, _Tensor):
            key.append(a.dtype)
            key.append(a.data_ptr() & 15 == 0)
        else:  # a float is not specialised on (and NaN would never match itself)
            key.append(float if type(a) is float else a)
    key.append(tuple(meta.items()))
    key = tuple(key)
    cache = _COMPILED.get(kernel)
    entry = None if cache is None else cache.get(key)
    if entry is None:
        compiled = kernel[grid](*args, **meta)
        if compiled is None:  # not compiled: recorded for the workers (compiles.collecting)
            return None
        entry = _entry(kernel, compiled, grid, len(args), meta)
        _COMPILED.setdefault(kernel, {})[key] = entry
        return entry
    run, function, packed, g0, g1, g2, tail = entry
    run(g0, g1, g2, torch._C._cuda_getCurrentRawStream(device), function, packed, None, None,
        None, *args, *tail)
    return entry


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for grids (``triton.cdiv`` is a constexpr function: microseconds a call)."""
    return -(-a // b)


def _hooked(hook) -> bool:
    """Whether a launch hook would run: Triton holds them in a (usually empty) chain."""
    return hook is not None and getattr(hook, "calls", True) != []


def _entry(kernel, compiled, grid: tuple, npositional: int, meta: dict) -> tuple:
    """What a cached launch needs: the launcher, the loaded function, the packed metadata,
    the grid as three numbers and the arguments after the positional ones (constexprs given
    by name or left at their defaults), in the kernel's parameter order."""
    tail = []
    for param in kernel.params[npositional:]:
        if param.name in meta:
            tail.append(meta[param.name])
        elif param.has_default:
            tail.append(param.default)
        else:  # Triton's own call would have failed: it did not, so this is a misuse here
            raise TypeError(f"{kernel}: no value for parameter {param.name}")
    grid3 = (*grid, 1, 1)[:3]
    return (compiled.run, compiled.function, compiled.packed_metadata, *grid3, tuple(tail))


def clear() -> None:
    """Forget every cached launch (tests; a module reload of a kernel)."""
    _COMPILED.clear()
