"""Test set-up: the Triton interpreter on CPU-only machines, seeded RNGs, the gpu marker."""

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    # Must be set before fastconv's kernel modules are first imported (triton.jit decides
    # at decoration time whether a kernel is compiled or interpreted).
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tests time every candidate in benchmark mode (they check which one wins and that each is
# timed); the tests of the tuning budget set theirs. Read when fastconv.dispatch is imported.
os.environ.setdefault("FASTCONV_TUNE_BUDGET", "exhaustive")

HAS_GPU = torch.cuda.is_available()


@pytest.fixture(autouse=True, scope="session")
def _private_plan_cache(tmp_path_factory):
    """Tests read and write a plan cache of their own, never the user's (tests that need
    another set FASTCONV_CACHE_DIR themselves)."""
    if "FASTCONV_CACHE_DIR" not in os.environ:
        os.environ["FASTCONV_CACHE_DIR"] = str(tmp_path_factory.mktemp("plancache"))
    yield


@pytest.fixture(autouse=True)
def _saves_not_spaced(monkeypatch):
    """Every persisted put saves at once (tests read the file right after a call; the
    spacing of saves has its own test, and processes the tests start keep the default)."""
    from fastconv import plancache

    monkeypatch.setattr(plancache, "SAVE_SPACING_S", 0.0)


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    seen: dict[str, int] = {}  # test function -> its parametrizations collected so far
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip)
        # @pytest.mark.slow_after(n): the first n parametrizations run in the quick tests,
        # the others are marked slow (the interpreter-heavy ones: CI runs them all)
        sample = item.get_closest_marker("slow_after")
        if sample is not None:
            function = item.nodeid.split("[")[0]
            seen[function] = seen.get(function, 0) + 1
            if seen[function] > sample.args[0]:
                item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _environment_read_per_test():
    """fastconv reads FASTCONV_DISPATCH / FASTCONV_DETERMINISTIC once: a test that sets them
    (monkeypatch) sees its values, and the next test not."""
    from fastconv import dispatch

    dispatch.reload_environment()
    yield
    dispatch.reload_environment()


@pytest.fixture
def device():
    return "cuda" if HAS_GPU else "cpu"
