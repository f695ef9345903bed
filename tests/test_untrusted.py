"""Untrusted input never gives a wrong answer or a raw exception: mutated plan-cache entries,
unreadable cache files, bad arguments. Each case either matches the float64 reference within
the contract or raises a fastconv error (ConvError)."""

from __future__ import annotations

import json
import random
import warnings

import pytest
import torch
import torch.nn.functional as F

import fastconv
from fastconv import dispatch, functional, plancache
from fastconv.backends.triton.configs import TileConfig
from fastconv.backends.triton.depthwise import DwConfig
from fastconv.precision import relative_error

_BOUND = 1e-5  # strict fp32 (DESIGN.md §4)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTCONV_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(dispatch.store, "CACHE", plancache.PlanCache())
    functional.clear_plans()
    yield tmp_path
    functional.clear_plans()


def _write_cache(path, entries: dict) -> None:
    (path / plancache.FILE_NAME).write_text(json.dumps(
        {"format": plancache.FORMAT, "environment": plancache.environment(),
         "entries": entries}))


def _fresh_process():
    dispatch.store.CACHE = plancache.PlanCache()
    functional.clear_plans()


# ------------------------------------------------------------------ mutated cache entries
_BAD_VALUES = [0, -16, 3, 7, 48, 2**20, 2**40, -1, "16", 16.0, None, True, [16], {"a": 1},
               float("nan")]


def _mutations(rng: random.Random, base: dict, count: int) -> list[dict]:
    """``count`` corrupted copies of a stored configuration: one field at a time set to a bad
    value, removed, or joined by an unknown field; sometimes two fields at once."""
    fields = [k for k in base if k != "__dataclass__"]
    out = []
    for _ in range(count):
        cfg = dict(base)
        for _ in range(rng.choice((1, 1, 2))):
            what = rng.random()
            field = rng.choice(fields)
            if what < 0.8:
                cfg[field] = rng.choice(_BAD_VALUES)
            elif what < 0.9:
                cfg.pop(field, None)
            else:
                cfg["extra_" + field] = 1
        out.append(cfg)
    return out


def _case(rng: random.Random):
    """A small random problem the entry is stored for: conv2d (depthwise or not), odd sizes."""
    depthwise = rng.random() < 0.4
    c = rng.choice((3, 4, 5)) if not depthwise else rng.choice((2, 3))
    k = c if depthwise else rng.choice((2, 6))
    groups = c if depthwise else 1
    x = torch.randn(1, c, rng.choice((5, 7)), rng.choice((6, 9)))
    w = torch.randn(k, c // groups, 3, 3)
    return x, w, groups


def _run_pinned(x, w, groups, entry, cache_dir):
    problem = fastconv.ConvProblem.from_tensors(x, w, None, 1, 1, 1, groups, rank=2,
                                                precision="ieee")
    key = dispatch.store.cache_key(problem, "auto", "pinned", "fprop", False)
    _write_cache(cache_dir, {key: entry})
    _fresh_process()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the refusal's warning is tested below
        return fastconv.conv2d(x, w, None, 1, 1, 1, groups, dispatch="pinned",
                               precision="ieee")


def _assert_right_or_conv_error(fn, ref):
    try:
        y = fn()
    except fastconv.ConvError:
        return "error"
    err = relative_error(y, ref)
    assert err < _BOUND, f"wrong answer: relative error {err}"
    return "ran"


def test_fuzzed_cache_entries_run_correctly_or_are_refused(cache_dir):
    rng = random.Random(1234)
    bases = [
        {"backend": "triton", "config": plancache.encode(TileConfig(32, 16, 16, 4, 1, False))},
        {"backend": "triton", "config": plancache.encode(TileConfig(16, 32, 16, 4, 1, True))},
        {"backend": "triton", "config": plancache.encode(
            TileConfig(32, 16, 16, 4, 1, False, split_k=2))},
        {"backend": "triton", "config": plancache.encode(DwConfig(4, 16, 4))},
        {"backend": "triton", "config": plancache.encode(DwConfig(4, 8, 4, plane=True))},
    ]
    outcomes = {"ran": 0, "error": 0}
    cases = []
    for base in bases:
        cases += [{"backend": "triton", "config": cfg}
                  for cfg in _mutations(rng, base["config"], 36)]
        cases.append(base)
    cases += [{"backend": "cudnn", "config": 0}, {"backend": "cudnn"},
              {"backend": "aten", "config": "cudnn_relu"}, {"backend": "aten", "config": 5},
              {"backend": "nosuch"}, {"config": None}, {"backend": None}, [], "text", 7,
              {"backend": "triton", "config": {"__dataclass__": "Nope"}},
              {"backend": "triton", "config": None}]
    assert len(cases) > 180
    for entry in cases:
        x, w, groups = _case(rng)
        ref = F.conv2d(x.double(), w.double(), None, 1, 1, 1, groups)
        outcomes[_assert_right_or_conv_error(
            lambda x=x, w=w, g=groups, e=entry: _run_pinned(x, w, g, e, cache_dir), ref)] += 1
    # a refused entry is decided again (the heuristic): every case ran, and right
    assert outcomes == {"ran": len(cases), "error": 0}


def test_a_refused_entry_warns_once_and_is_decided_again(cache_dir):
    x, w = torch.randn(1, 3, 7, 6), torch.randn(4, 3, 3, 3)
    bad = {"backend": "triton", "config": dict(plancache.encode(
        TileConfig(32, 16, 16, 4, 1, False)), block_m=-16)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        problem = fastconv.ConvProblem.from_tensors(x, w, None, 1, 1, rank=2, precision="ieee")
        key = dispatch.store.cache_key(problem, "auto", "pinned", "fprop", False)
        _write_cache(cache_dir, {key: bad})
        _fresh_process()
        y = fastconv.conv2d(x, w, None, 1, 1, dispatch="pinned", precision="ieee")
        fastconv.conv2d(x, w, None, 1, 1, dispatch="pinned", precision="ieee")
    msgs = [str(c.message) for c in caught if "stored plan" in str(c.message)]
    assert len(msgs) == 1 and "block_m = -16" in msgs[0], msgs
    assert relative_error(y, F.conv2d(x.double(), w.double(), None, 1, 1)) < _BOUND


def test_a_cached_backend_that_cannot_run_here_is_not_used(cache_dir):
    """A cuDNN choice from a GPU machine, read on the CPU: decided again (no driver error)."""
    x, w = torch.randn(1, 3, 7, 6), torch.randn(4, 3, 3, 3)
    for mode in ("pinned", "heuristic"):
        problem = fastconv.ConvProblem.from_tensors(x, w, None, 1, 1, rank=2, precision="ieee")
        key = dispatch.store.cache_key(problem, "auto", mode, "fprop", False)
        _write_cache(cache_dir, {key: {"backend": "cudnn", "config": 0}})
        _fresh_process()
        with pytest.warns(RuntimeWarning, match="cudnn"):
            y = fastconv.conv2d(x, w, None, 1, 1, dispatch=mode, precision="ieee")
        assert relative_error(y, F.conv2d(x.double(), w.double(), None, 1, 1)) < _BOUND


@pytest.mark.parametrize("content", ["[" * 200000 + "]" * 200000, "\xff\xfe", '{"format": 1,',
                                     json.dumps({"format": 1, "environment": None,
                                                 "entries": []})])
def test_an_unreadable_cache_file_is_ignored(cache_dir, content):
    (cache_dir / plancache.FILE_NAME).write_bytes(content.encode("utf-8", "surrogateescape"))
    _fresh_process()
    x, w = torch.randn(1, 3, 7, 6), torch.randn(4, 3, 3, 3)
    with pytest.warns(RuntimeWarning, match="plan cache"):
        y = fastconv.conv2d(x, w, padding=1, dispatch="pinned")
    assert relative_error(y, F.conv2d(x.double(), w.double(), padding=1)) < 1e-4


def test_pin_refuses_a_bad_configuration():
    x, w = torch.randn(1, 3, 7, 6), torch.randn(4, 3, 3, 3)
    problem = fastconv.ConvProblem.from_tensors(x, w, None, 1, 1, rank=2)
    with pytest.raises(fastconv.ConvError, match="block_m"):
        dispatch.pin(problem, "triton", TileConfig(3, 16, 16, 4, 1, False))
    with pytest.raises(fastconv.ConvError, match="direct tiles"):
        dispatch.pin(problem, "triton", DwConfig(4, 16, 4))


# ------------------------------------------------------------------------ bad arguments
_GOOD = dict(stride=1, padding=1, dilation=1, groups=1, activation="leaky_relu",
             negative_slope=0.1, backend="auto", precision="ieee", dispatch=None)
_WRONG = ["a", None, -1, 0, 2.5, float("nan"), float("inf"), True, [1, 2, 3], (0, 1),
          10**9, -(10**9), "same", "valid", object(), torch.ones(2), "relu", "auto", ""]


def test_fuzzed_arguments_give_the_right_answer_or_a_conv_error(cache_dir):
    rng = random.Random(99)
    outcomes = {"ran": 0, "error": 0}
    for _ in range(240):
        kwargs = dict(_GOOD)
        for name in rng.sample(sorted(kwargs), rng.choice((1, 1, 2))):
            kwargs[name] = rng.choice(_WRONG)
        x, w = torch.randn(1, 4, 6, 7), torch.randn(4, 4, 3, 3)
        args = (kwargs.pop("stride"), kwargs.pop("padding"), kwargs.pop("dilation"),
                kwargs.pop("groups"))

        def reference(args=args, kwargs=kwargs, x=x, w=w):
            y = F.conv2d(x.double(), w.double(), None, *args)
            return fastconv.epilogue.activate(y, kwargs["activation"],
                                              kwargs["negative_slope"])

        try:
            y = fastconv.conv2d(x, w, None, *args, **kwargs)
        except fastconv.ConvError:
            outcomes["error"] += 1
            continue
        ref = reference()
        bound = 1e-5 if kwargs["precision"] == "ieee" else 2e-3
        assert relative_error(y, ref) < bound, (args, kwargs)
        outcomes["ran"] += 1
    assert outcomes["ran"] > 10 and outcomes["error"] > 100, outcomes


def test_out_must_not_overlap_any_operand_or_itself():
    for backend in ("aten", "triton"):
        w = torch.randn(3, 3, 1, 1)
        with pytest.raises(fastconv.ConvError, match="overlaps weight"):
            fastconv.conv2d(torch.randn(1, 3, 1, 1), w, out=w.view(1, 3, 3, 1)[:, :, :1, :1],
                            backend=backend)
        expanded = torch.zeros(1, 3, 3, 1).expand(1, 3, 3, 3)
        with pytest.raises(fastconv.ConvError, match="elements share memory"):
            fastconv.conv2d(torch.randn(1, 3, 3, 3), w, out=expanded, backend=backend)
        x = torch.randn(1, 3, 4, 4)
        with pytest.raises(fastconv.ConvError, match="overlaps input"):
            fastconv.conv2d(x, w, out=x, backend=backend)


@pytest.mark.parametrize("call", [
    lambda b: fastconv.conv2d(torch.randn(1, 2, 0, 5), torch.randn(3, 2, 3, 3), padding=2,
                              backend=b),
    lambda b: fastconv.conv_transpose2d(torch.randn(1, 3, 0, 5), torch.randn(3, 2, 3, 3),
                                        backend=b),
    lambda b: fastconv.conv1d(torch.randn(1, 2, 0), torch.randn(3, 2, 3), padding=1,
                              backend=b),
    lambda b: fastconv.conv_transpose1d(torch.randn(1, 3, 0), torch.randn(3, 2, 3),
                                        backend=b),
])
def test_zero_spatial_sizes_are_the_same_conv_error_on_every_backend(call):
    messages = set()
    for backend in ("aten", "triton"):
        with pytest.raises(fastconv.ConvError) as info:
            call(backend)
        messages.add(str(info.value))
    assert len(messages) == 1, messages


def test_an_empty_batch_gives_an_empty_result_on_every_backend():
    x, w = torch.randn(0, 2, 5, 5), torch.randn(3, 2, 3, 3)
    for backend in ("aten", "triton"):
        y = fastconv.conv2d(x, w, padding=1, backend=backend)
        assert y.shape == F.conv2d(x, w, padding=1).shape


@pytest.mark.parametrize("name,value", [("negative_slope", "a"), ("eps", "1e-5"),
                                        ("momentum", [0.1]), ("eps", -1.0)])
def test_scalar_arguments_are_type_checked_by_name(name, value):
    x, w = torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3)
    kwargs = {name: value}
    with pytest.raises(fastconv.ConvError, match=name):
        fastconv.conv_bn_act2d(x, w, None, None, None, torch.ones(4), torch.zeros(4),
                               training=True, activation="leaky_relu", **kwargs)
    if name != "negative_slope":
        with pytest.raises(fastconv.ConvError, match=name):
            fastconv.nn.ConvBNAct2d(3, 4, 3, **kwargs)


@pytest.mark.parametrize("name,value", [("stride", True), ("stride", 1.0), ("padding", (1, True)),
                                        ("groups", True), ("negative_slope", True)])
def test_a_value_equal_to_a_seen_one_is_still_type_checked(name, value):
    """True == 1 and 1.0 == 1: the plan caches must not serve them the int's plan."""
    x, w = torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3)
    good = dict(stride=1, padding=(1, 1), groups=1, negative_slope=1)
    fastconv.conv2d(x, w, activation="leaky_relu", **good)
    with pytest.raises(fastconv.ConvError, match=name):
        fastconv.conv2d(x, w, activation="leaky_relu", **dict(good, **{name: value}))


def test_a_stored_cudnn_plan_is_checked_before_cudnn_sees_it():
    import base64
    import hashlib

    from fastconv.backends.cudnn import _entry_error

    blob = bytes(range(40))
    good = {"engine": 3, "knobs": {"12": 1}, "name": "eng3", "blob":
            base64.b64encode(blob).decode(), "sha256": hashlib.sha256(blob).hexdigest()}
    assert _entry_error(good) == ""
    tampered = dict(good, blob=base64.b64encode(blob[:-1] + b"x").decode())
    assert "SHA-256" in _entry_error(tampered)
    for bad in (dict(good, engine=-1), dict(good, engine="3"), dict(good, knobs={"a": 1}),
                dict(good, knobs=[1]), dict(good, blob="@@@"), {"engine": 3}, [], None):
        assert _entry_error(bad), bad


def test_every_candidate_passes_its_own_backend_check():
    """A benchmark choice is one of the candidates: the check must never refuse one (or every
    process would decide again, and warn). GPU candidate lists, computed on the CPU."""
    import dataclasses

    from fastconv.backends.triton.backend import TritonBackend

    rng = random.Random(5)
    checked = 0
    for _ in range(150):
        rank = rng.choice((1, 2))
        groups = rng.choice((1, 1, 2, 4, 32, "dw"))
        c = rng.choice((3, 16, 64, 256)) if groups != "dw" else rng.choice((32, 96))
        groups = c if groups == "dw" else groups
        c = c * groups if c % groups else c
        k = rng.choice((c, 2 * c)) if groups == c else rng.choice((16, 64, 512)) * groups
        size = (rng.choice((7, 56)),) * rank
        transposed = rng.random() < 0.2 and groups != c
        dtype = rng.choice((torch.float32, torch.bfloat16, torch.float16))
        x = torch.empty(rng.choice((1, 8)), c, *size, dtype=dtype)
        w = torch.empty(*((c, k // groups) if transposed else (k, c // groups)),
                        *(3,) * rank, dtype=dtype)
        if rank == 2 and rng.random() < 0.5:
            x = x.contiguous(memory_format=torch.channels_last)
        problem = fastconv.ConvProblem.from_tensors(x, w, None, rng.choice((1, 2)), 1, 1,
                                                    groups, rank=rank, transposed=transposed)
        problem = dataclasses.replace(problem, device="cuda")
        for op in ("fprop",) if transposed else ("fprop", "dgrad", "wgrad"):
            for config in TritonBackend.candidates(problem, op):
                assert TritonBackend.config_errors(problem, config, op) == [], \
                    (problem.describe(), op, config)
                checked += 1
    assert checked > 500


@pytest.mark.parametrize("split_k", [10**6, 17, 0])
def test_a_huge_split_is_refused_not_run(cache_dir, split_k):
    """split_k = 10**6 unrolls a million-way reduction: it hung past 300 s before the check."""
    import time

    x, w = torch.randn(1, 3, 7, 6), torch.randn(4, 3, 3, 3)
    entry = {"backend": "triton", "config": dict(plancache.encode(
        TileConfig(32, 16, 16, 4, 1, False)), split_k=split_k)}
    t0 = time.perf_counter()
    y = _run_pinned(x, w, 1, entry, cache_dir)
    assert time.perf_counter() - t0 < 30
    assert relative_error(y, F.conv2d(x.double(), w.double(), None, 1, 1)) < _BOUND
