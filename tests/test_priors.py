"""What dispatch knows before timing (dispatch/priors.py) and what it does with it: the
database's nearest problem of a shape class, the structural rule for rank-1 depthwise and
narrow grouped convolutions, a strong prior timed past the process's budget, a database
choice adopted past the budget, and candidates timed as their builds finish."""

import concurrent.futures as cf
import dataclasses

import pytest
import torch

import fastconv
from fastconv import backends, dispatch, plancache
from fastconv.dispatch import priors

# the fixtures of test_dispatch, shared (a parameter named after one is not a redefinition)
from test_dispatch import _Fake, _problem, clock, fakes  # noqa: F401

# ruff: noqa: F811


class _Aten(_Fake):
    NAME = "aten"
    TIMES = {None: 2.0}


def _builds(futures: dict, done: str, calls: list):
    """A fake backend whose candidates build in the background: one future per
    configuration (whatever the order they are listed in), finished for those in ``done``."""
    class _Builds(_Fake):
        BUILDS_AHEAD = True
        TIMES = {"a": 3.0, "b": 1.0, "c": 0.5}

        @classmethod
        def compile_ahead(cls, run_one):
            run_one()  # (collecting: the fixture's run records the configuration)
            config = calls[-1][1]
            future = futures[config] = cf.Future()
            if config in done:
                future.set_result("built")
            return [future]
    return _Builds


def _starved(monkeypatch, calls: list, done: str, prior=None) -> dict:
    """aten and a fake backend building in the background (futures by configuration,
    finished for those in ``done``), ``prior`` as every problem's prior, and the process's
    tuning budget spent; the futures."""
    futures: dict = {}
    monkeypatch.setattr(backends, "REGISTRY", {"aten": _Aten,
                                               "fake": _builds(futures, done, calls)})
    monkeypatch.setattr(priors, "prior", lambda *a: prior)
    dispatch.tuning_budget(per_problem_s=10, per_process_s=1)
    dispatch.TUNING.spent_s = 5.0  # spent
    return futures


def _conv1d(n=8, c=64, length=100, groups=64, k=4, dtype=torch.bfloat16):
    x = torch.randn(n, c, length).to(dtype)
    w = torch.randn(c, c // groups, k).to(dtype)
    p = fastconv.ConvProblem.from_tensors(x, w, None, padding=k - 1, groups=groups, rank=1)
    return dataclasses.replace(p, device="cuda")


def _key(problem, op="fprop", cost="graph"):
    return dispatch.store.cache_key(problem, "auto", "benchmark", op, False, cost)


def _with_database(monkeypatch, entries: dict) -> None:
    cache = plancache.PlanCache(database=True)
    cache._db = {k: dict(v, partial=True, source="database") for k, v in entries.items()}
    monkeypatch.setattr(dispatch.store, "CACHE", cache)


def test_the_shape_class_drops_batch_and_spatial_sizes_only():
    a, b = _conv1d(n=8, length=100), _conv1d(n=2, length=7)
    (ca, sa), (cb, sb) = priors._split(_key(a)), priors._split(_key(b))
    assert ca == cb and (sa, sb) == (800, 14)
    for other in (_conv1d(groups=32), _conv1d(k=3), _conv1d(dtype=torch.float16)):
        assert priors._split(_key(other))[0] != ca
    assert priors._split(_key(a, op="dgrad"))[0] != ca
    assert priors._split(_key(a, cost="eager"))[0] != ca


def test_the_nearest_problem_of_the_class_gives_the_prior(monkeypatch, fakes):
    """The database's choice for the problem of the class nearest in positions (log scale),
    decoded for this problem: a backend that cannot run it here gives none."""
    _with_database(monkeypatch, {
        _key(_conv1d(n=8, length=4096)): {"backend": "fake", "config": "a"},
        _key(_conv1d(n=1, length=64)): {"backend": "fake", "config": "c"},
        _key(_conv1d(n=1, length=64, groups=32)): {"backend": "fake", "config": "b"},
    })
    near = priors.nearest(_conv1d(n=4, length=2048), ["aten", "fake"], "fprop",
                          _key(_conv1d(n=4, length=2048)))
    assert (near.backend, near.config, near.strong) == ("fake", "a", False)
    assert "32768 positions (this: 8192)" in near.describe()
    small = _conv1d(n=2, length=100)
    assert priors.nearest(small, ["aten", "fake"], "fprop", _key(small)).config == "c"
    assert priors.nearest(small, ["aten"], "fprop", _key(small)) is None  # not runnable
    other = _conv1d(groups=16)
    assert priors.nearest(other, ["aten", "fake"], "fprop", _key(other)) is None


def test_rank1_depthwise_and_narrow_grouped_forwards_have_a_strong_prior():
    names = ["aten", "triton"]
    for p in (_conv1d(), _conv1d(c=512, groups=16, k=3), _conv1d(c=512, groups=4, k=3)):
        pri = priors.prior(p, names, "fprop", _key(p))
        assert pri is not None and pri.strong and pri.backend == "triton", p.describe()
    assert priors.prior(_conv1d(), ["aten", "triton"], "dgrad", _key(_conv1d())) is None
    wide = _conv1d(c=512, groups=2, k=3)  # 256 channels per group: cuDNN's territory
    assert priors.prior(wide, names, "fprop", _key(wide)) is None
    assert priors.prior(_conv1d(), ["aten"], "fprop", _key(_conv1d())) is None
    dense2d = _problem()
    assert priors.prior(dense2d, names, "fprop", _key(dense2d)) is None


def test_a_strong_prior_is_timed_past_the_process_budget(fakes, clock, monkeypatch):
    """Past the process's budget a new problem with a strong prior times aten and the prior
    at once (waiting for its build) and runs the faster; the rest build in the background,
    timed once built."""
    run, calls = fakes
    _starved(monkeypatch, calls, "c", priors.Prior("fake", "c", True, "a test's rule"))
    choice = dispatch.choose(_problem(), run=run, mode="benchmark")
    assert (choice.backend, choice.config, choice.provisional) == ("fake", "c", True)
    rows = dispatch.explain(_problem(k=6), mode="benchmark", run=run).rows
    assert [(r.name(), r.timed) for r in rows][:2] == [("aten", True), ("fake:c", True)]
    assert rows[1].prior == "prior: a test's rule"
    assert [r.timed for r in rows[2:]] == [False, False]


def test_without_a_prior_a_starved_problem_still_runs_aten_untimed(fakes, clock,
                                                                  monkeypatch):
    run, calls = fakes
    _starved(monkeypatch, calls, "abc")
    choice = dispatch.choose(_problem(), run=run, mode="benchmark")
    assert (choice.backend, choice.provisional) == ("aten", True)
    assert ("aten", None) not in calls


def test_candidates_are_timed_as_their_builds_finish(fakes, clock, monkeypatch, tmp_path):
    """A starved problem runs aten untimed; the first call after one build finishes times
    that candidate and aten and runs the faster (still provisional); the call after the
    last build times the new candidates, and again those timed before that could still win,
    and stores the final choice."""
    run, calls = fakes
    futures = _starved(monkeypatch, calls, "")
    p = _problem()
    first = dispatch.choose(p, run=run, mode="benchmark")
    assert (first.backend, first.provisional, first.until()) == ("aten", True, False)
    futures["b"].set_result("built")
    assert first.until()  # a plan asks again
    calls.clear()
    second = dispatch.choose(p, run=run, mode="benchmark")
    assert (second.config, second.provisional) == ("b", True)
    assert sorted(calls, key=str) == [("aten", None), ("fake", "b")]
    assert not second.until()
    assert "provisional" in str(dispatch.explain(p, mode="benchmark"))
    futures["a"].set_result("built")
    futures["c"].set_result("built")
    calls.clear()
    final = dispatch.choose(p, run=run, mode="benchmark")
    assert (final.config, final.provisional) == ("c", False)
    # b again (aten, at 2x b's time, not: RETIME_FACTOR), a and c; c beats aten: the two
    # timed once more (timing.confirm_against_aten)
    assert sorted(calls, key=str) == [("aten", None), ("fake", "a"), ("fake", "b"),
                                      ("fake", "c"), ("fake", "c")]
    assert (tmp_path / plancache.FILE_NAME).exists()


def test_a_database_choice_that_builds_ahead_is_adopted_past_the_budget(fakes, clock,
                                                                       monkeypatch):
    """A database hit whose kernels build in the background is used past the process's
    budget (aten runs until they are built); one that builds at the call is not."""
    run, calls = fakes
    futures = {}
    building = _builds(futures, calls=calls, done="")
    monkeypatch.setattr(backends, "REGISTRY", {"aten": _Aten, "fake": building})
    p = _problem()
    key = dispatch.store.cache_key(p, "auto", "benchmark", "fprop", False, "eager")
    _with_database(monkeypatch, {key: {"backend": "fake", "config": "b"}})
    dispatch.tuning_budget(per_problem_s=10, per_process_s=1)
    dispatch.TUNING.spent_s = 5.0
    first = dispatch.choose(p, run=run, mode="benchmark")
    assert (first.backend, first.provisional) == ("aten", True)
    for f in futures.values():
        f.set_result("built")
    assert first.until()
    again = dispatch.choose(p, run=run, mode="benchmark")
    assert (again.backend, again.config, again.provisional) == ("fake", "b", False)
    # a backend that builds at the call: decided as a new problem (aten, untimed)
    monkeypatch.setattr(building, "BUILDS_AHEAD", False)
    q = _problem(k=6)
    key = dispatch.store.cache_key(q, "auto", "benchmark", "fprop", False, "eager")
    _with_database(monkeypatch, {key: {"backend": "fake", "config": "b"}})
    assert dispatch.choose(q, run=run, mode="benchmark").backend == "aten"


@pytest.mark.parametrize("ready", [False, True])
def test_a_prior_whose_build_outlasts_the_wait_is_timed_later(fakes, clock, monkeypatch,
                                                              ready):
    """A strong prior not built within ``PRIOR_WAIT_S`` leaves aten running; the first
    call after its build is done times it."""
    run, calls = fakes
    futures = _starved(monkeypatch, calls, "", priors.Prior("fake", "c", True, "rule"))
    monkeypatch.setattr(dispatch.timing, "PRIOR_WAIT_S", 0.01)
    choice = dispatch.choose(_problem(), run=run, mode="benchmark")
    assert (choice.backend, choice.provisional) == ("aten", True)
    assert not choice.until()
    if ready:
        futures["c"].set_result("built")
    again = dispatch.choose(_problem(), run=run, mode="benchmark")
    assert (again.backend, again.provisional) == (("fake", True) if ready else ("aten", True))
