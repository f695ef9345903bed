"""backends/triton/launch.py: when a launch may skip Triton's JITFunction.run and when not.

On the CPU the kernels are interpreted, so the cached path never runs there by itself; these
tests drive it with a stand-in kernel whose compiled form records what its launcher got.
Every kernel of the package goes through it on the GPU (tests/test_gpu_*.py).
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

from fastconv.backends.triton import launch as launch_mod


class _Kernel:
    """A JITFunction's surface: params, and ``kernel[grid](*args, **meta)`` -> compiled."""

    def __init__(self):
        sig = inspect.signature(lambda x, y, n, slope, BLOCK=4, ACT=0: None)
        self.params = [SimpleNamespace(name=p.name, default=p.default,
                                       has_default=p.default is not inspect.Parameter.empty)
                       for p in sig.parameters.values()]
        self.compiles = []
        self.launches = []
        self.compiled = SimpleNamespace(run=lambda *a: self.launches.append(a),
                                        function="function", packed_metadata="packed")

    def __getitem__(self, grid):
        def run(*args, **meta):
            self.compiles.append((grid, args, meta))
            return self.compiled
        return run


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setattr(launch_mod, "INTERPRETED", False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234,
                        raising=False)
    launch_mod.clear()
    yield _Kernel()
    launch_mod.clear()


def _tensors(dtype=torch.float32, offset=0):
    base = torch.randn(64, dtype=dtype)
    return base[offset:offset + 16], torch.randn(7, dtype=dtype)


def test_second_launch_goes_through_the_compiled_launcher(kernel):
    x, y = _tensors()
    launch_mod.launch(kernel, (3, 2), x, y, 5, 0.5, BLOCK=8, num_warps=4)
    assert len(kernel.compiles) == 1 and not kernel.launches
    x2, y2 = _tensors()  # fresh tensors, same dtypes and alignment
    launch_mod.launch(kernel, (3, 2), x2, y2, 5, 0.25, BLOCK=8, num_warps=4)
    assert len(kernel.compiles) == 1
    (got,) = kernel.launches
    # grid padded to 3, the current stream, the loaded function and metadata, no hooks,
    # the positional arguments, then the constexprs in parameter order (ACT's default)
    assert got[:9] == (3, 2, 1, 1234, "function", "packed", None, None, None)
    assert got[9] is x2 and got[10] is y2 and got[11:] == (5, 0.25, 8, 0)


@pytest.mark.parametrize("change", ["int", "dtype", "alignment", "constexpr", "option",
                                    "grid", "device"])
def test_a_change_triton_specialises_on_compiles_again(kernel, change, monkeypatch):
    x, y = _tensors()
    launch_mod.launch(kernel, (3,), x, y, 16, 0.5, BLOCK=8)
    args, meta, grid = [*_tensors(), 16, 0.5], {"BLOCK": 8}, (3,)
    if change == "int":
        args[2] = 1  # Triton makes an int equal to 1 a constant
    elif change == "dtype":
        args[:2] = _tensors(torch.float16)
    elif change == "alignment":
        args[:2] = _tensors(offset=1)  # 4 bytes past a 16-byte boundary
    elif change == "constexpr":
        meta["BLOCK"] = 16
    elif change == "option":
        meta["num_warps"] = 8
    elif change == "grid":
        grid = (4,)
    else:
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    launch_mod.launch(kernel, grid, *args, **meta)
    assert len(kernel.compiles) == 2 and not kernel.launches


def test_a_launch_hook_keeps_tritons_own_path(kernel, monkeypatch):
    from triton import knobs

    chain = knobs.runtime.launch_exit_hook  # a HookChain, empty unless a hook is added
    chain.add(hook := lambda *a: None)
    try:
        for _ in range(2):
            launch_mod.launch(kernel, (1,), *_tensors(), 3, 0.5)
    finally:
        chain.remove(hook)
    original = knobs.runtime.launch_enter_hook
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda *a: None)
    launch_mod.launch(kernel, (1,), *_tensors(), 3, 0.5)
    assert len(kernel.compiles) == 3 and not kernel.launches
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", original)
    for _ in range(2):  # hooks gone: the first call is cached, the second launches directly
        launch_mod.launch(kernel, (1,), *_tensors(), 3, 0.5)
    assert len(kernel.compiles) == 4 and len(kernel.launches) == 1


def test_nan_float_argument_still_hits(kernel):
    for _ in range(3):
        launch_mod.launch(kernel, (1,), *_tensors(), 3, float("nan"))
    assert len(kernel.compiles) == 1 and len(kernel.launches) == 2


def test_a_prepared_launch_takes_new_tensors_and_refuses_another_alignment(kernel):
    """prepare() launches now and returns a launch for later calls with new leading tensors
    (the rest as prepared); a tensor whose address differs in its low 4 bits is refused
    (nothing launched: the caller decides again), and so is every call once a launch hook
    is installed."""
    x, y = _tensors()
    prepared = launch_mod.prepare(kernel, (3, 2), 2, x, y, 5, 0.5, BLOCK=8)
    assert len(kernel.compiles) == 1 and not kernel.launches
    x2, y2 = _tensors()
    assert prepared(x2, y2)
    (got,) = kernel.launches
    assert got[:6] == (3, 2, 1, 1234, "function", "packed")
    assert got[9:] == (x2, y2, 5, 0.5, 8, 0)  # tensors, the prepared rest, BLOCK, ACT default
    shifted, _ = _tensors(offset=1)  # 4 bytes off: another alignment
    assert not prepared(shifted, y2) and len(kernel.launches) == 1
    hooks = launch_mod.knobs.runtime
    saved = hooks.launch_enter_hook
    hooks.launch_enter_hook = lambda *a: None
    try:
        assert not prepared(x2, y2) and len(kernel.launches) == 1
    finally:
        hooks.launch_enter_hook = saved


def test_prepare_is_none_where_only_tritons_path_runs(kernel, monkeypatch):
    monkeypatch.setattr(launch_mod, "INTERPRETED", True)
    x, y = _tensors()
    assert launch_mod.prepare(kernel, (3, 2), 2, x, y, 5, 0.5) is None
    assert len(kernel.compiles) == 1
