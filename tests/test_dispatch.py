"""The dispatcher with fake backends: filtering and reasons, modes, the plan cache (memory
LRU and disk), thread safety, determinism, explain; the workspace pool."""

import dataclasses
import itertools
import json
import threading
import time
import warnings

import pytest
import torch

import fastconv
from fastconv import backends, dispatch, plancache, workspace
from fastconv.backends.base import Backend
from fastconv.precision import Precision


def _problem(k=4, device="cuda"):
    x, w = torch.randn(2, 3, 9, 7), torch.randn(k, 3, 3, 3)
    p = fastconv.ConvProblem.from_tensors(x, w, None, padding=1, rank=2)
    return dataclasses.replace(p, device=device)


class _Fake(Backend):
    NAME = "fake"
    SUPPORTED_DTYPES = frozenset({torch.float32})
    SUPPORTED_DEVICES = frozenset({"cpu", "cuda"})
    TIMES = {"a": 3.0, "b": 1.0, "c": 2.0}
    runs: list = []

    @classmethod
    def candidates(cls, problem, op="fprop"):
        return list(cls.TIMES)


class _Refuses(_Fake):
    NAME = "refuses"

    @classmethod
    def not_supported_reasons(cls, problem):
        return ["odd number of output channels"] if problem.k % 2 else []


class _Nondet(_Fake):
    NAME = "nondet"
    IS_DETERMINISTIC = False
    TIMES = {"z": 0.1}


@pytest.fixture
def fakes(monkeypatch, tmp_path):
    """Only fake backends registered; fake timer (ms from TIMES); cache on a temp dir."""
    monkeypatch.setattr(backends, "REGISTRY", {c.NAME: c for c in (_Fake, _Refuses)})
    monkeypatch.setenv("FASTCONV_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FASTCONV_DISPATCH", raising=False)
    monkeypatch.delenv("FASTCONV_DETERMINISTIC", raising=False)
    monkeypatch.setattr(dispatch.store, "CACHE", plancache.PlanCache())
    monkeypatch.setattr(dispatch.upgrades, "UPGRADES", {})
    calls = []

    def fake_time(fn):  # a candidate's TIMES entry: GPU ms, or (GPU ms, host ms)
        t = fn()
        return t if isinstance(t, tuple) else (t, 0.0)

    monkeypatch.setattr(dispatch.timing, "time_costs", fake_time)
    # a first reading that rules no candidate out (its own test: test_a_candidate_whose_...)
    monkeypatch.setattr(dispatch.timing, "time_probe", lambda fn: (0.0, 0.0))
    # host times measured again (dispatch.timing._refine_host): the first measurement stands
    monkeypatch.setattr(dispatch.timing, "time_host_cost", lambda fn, guess: guess)

    def run(cls, config):
        calls.append((cls.NAME, config))
        if config == "boom":
            raise RuntimeError("does not compile")
        return cls.TIMES[config]
    return run, calls


def test_benchmark_times_every_candidate_and_keeps_the_fastest(fakes):
    run, calls = fakes
    p = _problem(k=4)
    choice = dispatch.choose(p, run=run, mode="benchmark")
    assert (choice.backend, choice.config, choice.ms) == ("fake", "b", 1.0)
    assert sorted(calls) == sorted([("fake", c) for c in "abc"] + [("refuses", c) for c in "abc"])
    calls.clear()
    assert dispatch.choose(p, run=run, mode="benchmark") == choice  # a hit times nothing
    assert calls == []


def test_refusals_are_reasons_and_explained(fakes):
    run, _ = fakes
    p = _problem(k=5)
    assert dispatch.supported(p)["refuses"] == ["odd number of output channels"]
    ex = dispatch.explain(p, mode="benchmark", run=run)
    text = str(ex)
    assert "odd number of output channels" in text and "refuses" in text
    assert ex.choice.name() == "fake:b"
    assert [r.name() for r in ex.rows if r.chosen] == ["fake:b"]
    with pytest.raises(fastconv.NotSupported, match="odd number"):
        dispatch.choose(p, "refuses", run=run)


def test_a_failing_candidate_is_skipped_with_its_reason(fakes, monkeypatch):
    run, _ = fakes
    monkeypatch.setattr(_Fake, "TIMES", {"boom": 0.0, "c": 2.0})
    p = _problem(k=5)
    assert dispatch.choose(p, run=run, mode="benchmark").config == "c"
    rows = dispatch.explain(p, mode="benchmark", run=run).rows
    assert any("does not compile" in r.note for r in rows if r.config == "boom")


def test_heuristic_and_pinned(fakes):
    run, calls = fakes
    p = _problem(k=4)
    assert dispatch.choose(p, run=run, mode="heuristic") == dispatch.Choice("fake", "a")
    assert dispatch.choose(p, run=run, mode="pinned").config == "a"  # nothing pinned yet
    q = _problem(k=6)
    dispatch.pin(q, "refuses", "c")
    assert dispatch.choose(q, run=run, mode="pinned") == dispatch.Choice("refuses", "c")
    assert calls == []  # neither mode times anything
    with pytest.raises(fastconv.NotSupported, match="odd number"):
        dispatch.pin(_problem(k=5), "refuses")


def test_mode_from_context_and_environment(fakes, monkeypatch):
    p = _problem(k=4)
    assert dispatch.default_mode(p) == "benchmark"
    assert dispatch.default_mode(_problem(device="cpu")) == "heuristic"
    monkeypatch.setenv("FASTCONV_DISPATCH", "pinned")
    assert dispatch.default_mode(p) == "benchmark"  # read once: the earlier value holds
    fastconv.functional.clear_plans()  # reads the environment again
    assert dispatch.default_mode(p) == "pinned"
    with dispatch.settings("heuristic"):
        assert dispatch.default_mode(p) == "heuristic"
        with dispatch.settings(deterministic=True):
            assert dispatch.current() == ("heuristic", True, False)
    assert dispatch.current() == ("pinned", False, False)
    monkeypatch.setenv("FASTCONV_DISPATCH", "fastest")
    dispatch.reload_environment()
    with pytest.raises(fastconv.ConvError, match="FASTCONV_DISPATCH.*'fastest'"):
        dispatch.default_mode(p)
    with pytest.raises(fastconv.ConvError, match="FASTCONV_DISPATCH.*'fastest'"):
        dispatch.default_mode(p)  # not cached while invalid
    with pytest.raises(fastconv.ConvError, match="mode.*'fastest'"):
        with dispatch.settings("fastest"):
            pass


def test_per_call_dispatch_argument(monkeypatch):
    monkeypatch.delenv("FASTCONV_DISPATCH", raising=False)
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    y = fastconv.conv2d(x, w, padding=1, dispatch="pinned")
    assert torch.allclose(y, torch.nn.functional.conv2d(x, w, padding=1), atol=1e-5)
    with pytest.raises(fastconv.ConvError, match="mode.*'quick'"):
        fastconv.conv2d(x, w, dispatch="quick")


def test_deterministic_keeps_only_deterministic_candidates(fakes, monkeypatch):
    run, _ = fakes
    monkeypatch.setitem(backends.REGISTRY, "nondet", _Nondet)
    p = _problem(k=4)
    assert dispatch.choose(p, run=run, mode="benchmark").backend == "nondet"  # fastest
    with dispatch.settings(deterministic=True):
        choice = dispatch.choose(p, run=run, mode="benchmark")
        assert choice.backend == "fake"
        assert "not deterministic" in str(dispatch.explain(p, mode="heuristic"))
        with pytest.raises(fastconv.NotSupported, match="not deterministic"):
            dispatch.choose(p, "nondet", run=run)


def test_lru_eviction():
    cache = plancache.PlanCache(max_entries=3)
    for i in range(4):
        cache.put(f"k{i}", {"i": i})
    assert cache.get("k0") is None and len(cache) == 3 and cache.evictions == 1
    cache.get("k1")  # k1 becomes most recent: k2 goes next
    cache.put("k4", {})
    assert cache.get("k2") is None and cache.get("k1") == {"i": 1}


def test_benchmark_choice_persists_to_a_new_process(fakes, tmp_path):
    run, calls = fakes
    p = _problem(k=4)
    first = dispatch.choose(p, run=run, mode="benchmark")
    data = json.loads((tmp_path / plancache.FILE_NAME).read_text())
    # one timing, two rankings stored: eager (GPU + host) and CUDA graph (GPU)
    assert data["environment"] == plancache.environment() and len(data["entries"]) == 2
    assert sorted(k.rsplit("|", 1)[1] for k in data["entries"]) == ["eager", "graph"]
    calls.clear()
    dispatch.store.CACHE = plancache.PlanCache()  # what a new process starts with
    assert dispatch.choose(p, run=run, mode="benchmark") == first
    with dispatch.settings(graph=True):
        assert dispatch.choose(p, run=run, mode="benchmark") == first
    assert calls == []


class _Aten(_Fake):
    NAME = "aten"
    TIMES = {None: 1.0}


def test_a_candidate_beating_aten_is_timed_again_with_aten(fakes, monkeypatch):
    """Where a candidate's GPU time beats aten's, the two are timed once more and each
    keeps its least (an H200 read aten's time 1.7x too high now and then in a model's first
    step): a one-off slow reading of aten no longer hands the choice to a slower candidate,
    and nothing is timed again where aten wins."""
    run, calls = fakes
    monkeypatch.setattr(backends, "REGISTRY", {c.NAME: c for c in (_Aten, _Fake)})
    monkeypatch.setattr(_Fake, "TIMES", {"a": 0.013, "b": 0.018})
    readings = {"aten": [0.016, 0.009]}  # the first reading of aten inflated

    def timed(fn):
        name, config = fn()
        ms = readings[name].pop(0) if readings.get(name) else _Fake.TIMES[config]
        return ms, 0.001

    def trial(cls, config):
        calls.append((cls.NAME, config))
        return cls.NAME, config
    monkeypatch.setattr(dispatch.timing, "time_costs", timed)
    p = _problem(k=4)
    with dispatch.settings(graph=True):
        choice = dispatch.choose(p, run=trial, mode="benchmark")
    assert (choice.backend, choice.gpu_ms) == ("aten", 0.009)
    assert calls.count(("aten", None)) == 2 and calls.count(("fake", "a")) == 2
    assert calls.count(("fake", "b")) == 1
    calls.clear()
    readings["aten"] = [0.009]  # aten wins at once: timed once, the others too
    with dispatch.settings(graph=True):
        choice = dispatch.choose(_problem(k=6), run=trial, mode="benchmark")
    assert choice.backend == "aten"
    assert sorted(calls) == [("aten", None), ("fake", "a"), ("fake", "b")]


def test_eager_dispatch_prices_host_time_and_graphs_only_gpu_time(fakes, monkeypatch):
    """A candidate whose GPU gain is smaller than its extra host cost loses eagerly; for a
    CUDA graph the GPU time alone decides. Both come from one timing, and explain shows
    both costs."""
    run, calls = fakes
    monkeypatch.setattr(_Fake, "TIMES", {"a": (0.050, 0.010), "b": (0.040, 0.030),
                                         "c": (0.045, 0.012)})
    p = _problem(k=5)  # (refuses takes no odd k: the fake backend alone)
    eager = dispatch.choose(p, run=run, mode="benchmark")
    assert (eager.config, eager.gpu_ms, eager.host_ms) == ("c", 0.045, 0.012)
    assert eager.ms == pytest.approx(0.057)
    n = len(calls)
    with dispatch.settings(graph=True):
        graphed = dispatch.choose(p, run=run, mode="benchmark")
        assert (graphed.config, graphed.ms) == ("b", 0.040)
        assert dispatch.cached(p, mode="benchmark") == graphed
        assert len(calls) == n  # the graph choice was stored by the same timing
        text = str(dispatch.explain(p, mode="benchmark", run=run))
        assert "ranked by GPU time (CUDA graph)" in text and "* fake:b" in text
    assert dispatch.cached(p, mode="benchmark") == eager
    text = str(dispatch.explain(p, mode="benchmark", run=run))
    assert "ranked by GPU + host time (eager)" in text and "* fake:c" in text
    assert "gpu     40.0 us  host     30.0 us" in text
    # a forward with a backward is a choice of its own (its trials time both)
    calls.clear()
    dispatch.choose(p, run=run, mode="benchmark", grad=True)
    assert len(calls) > 0
    assert dispatch.cached(p, mode="benchmark", grad=True).config == "c"


def test_the_cheapest_candidates_host_times_are_measured_again_interleaved(fakes,
                                                                          monkeypatch):
    """The first candidate timed for a problem measured a host time up to 2-4x its own on
    the GPU: the few of least eager cost are timed again, interleaved, each keeping its
    least host time, so that a noisy first timing does not decide the eager choice."""
    run, calls = fakes
    monkeypatch.setattr(_Fake, "TIMES", {"a": (0.030, 0.010), "b": (0.035, 0.012),
                                         "c": (0.090, 0.010), "d": (0.200, 0.010)})
    first = {"a": 0.060}  # a's own timing: its host time inflated
    monkeypatch.setattr(dispatch.timing, "time_costs",
                        lambda fn: (lambda t: (t[0], first.pop(config[0], t[1])))(fn()))
    config = []
    real_run = run

    def run_noting(cls, c):
        config[:] = [c]
        return real_run(cls, c)
    p = _problem(k=5)
    again = []
    monkeypatch.setattr(dispatch.timing, "time_host_cost",
                        lambda fn, guess: again.append(fn()) or again[-1][1])
    choice = dispatch.choose(p, run=run_noting, mode="benchmark")
    assert (choice.config, choice.host_ms) == ("a", 0.010)
    # every round re-times the four cheapest (here all four), in turn
    assert again[:4] == [_Fake.TIMES[c] for c in ("b", "a", "c", "d")]  # by eager cost
    assert len(again) == 12


@pytest.mark.parametrize("times, full, cut", [
    # b: 3.5x the best GPU time and >= SLOW_MIN_MS: its first reading stands; c: 2.9x
    ({"a": (1.0, 0.01), "b": (3.5, 0.01), "c": (2.9, 0.01)}, "ac", "b"),
    # b: 4.5x but under SLOW_MIN_MS (timed in full in a fraction of a second); c: 6x
    ({"a": (0.1, 0.01), "b": (0.45, 0.01), "c": (0.6, 0.01)}, "ab", "c"),
    # b: 3.5x a's GPU time, but a's host time makes b's eager cost a rival: timed in full
    ({"a": (0.2, 1.0), "b": (0.7, 0.01), "c": (4.0, 0.01)}, "ab", "c")])
def test_a_candidate_whose_first_reading_cannot_win_is_not_timed_in_full(
        fakes, monkeypatch, times, full, cut):
    """A candidate whose first reading (``costs.time_probe``: two calls) is over SLOW_FACTOR
    times the best timed so far, in GPU time and in GPU + host time, and at least
    SLOW_MIN_MS per call, keeps that reading: no full timing, no graph timing (left out of
    the graph ranking), no host time measured again; explain says why. The first candidate
    (nothing to compare with) and those within either bound are timed in full."""
    run, calls = fakes
    monkeypatch.setattr(_Fake, "TIMES", times)
    probed, timed, graphed, hosts = [], [], [], []

    def rotating(cls, config, k=0):
        return run(cls, config)
    rotating.operand_sets = type("Sets", (), {"count": 2})()

    def probe(fn):
        config = next(c for c, t in times.items() if t == fn())
        probed.append(config)
        return times[config]
    monkeypatch.setattr(dispatch.timing, "time_probe", probe)
    monkeypatch.setattr(dispatch.timing, "time_costs",
                        lambda fn: timed.append(fn()) or timed[-1])
    monkeypatch.setattr(dispatch.timing, "time_graph_cost",
                        lambda fn, sets, gpu_ms: graphed.append(gpu_ms) or gpu_ms)
    monkeypatch.setattr(dispatch.timing, "time_host_cost",
                        lambda fn, guess: hosts.append(fn()) or guess)
    ex = dispatch.explain(_problem(k=5), mode="benchmark", run=rotating)
    assert probed == ["b", "c"]  # every candidate after the first, a
    assert sorted(timed) == sorted(times[c] for c in full)
    assert sorted(graphed) == sorted(times[c][0] for c in full)
    assert times[cut] not in hosts and len(hosts) == 3 * 2  # the two others, three rounds
    rows = {r.config: r for r in ex.rows if r.backend == "fake"}
    assert (rows[cut].gpu_ms, rows[cut].graph_ms, rows[cut].once) == (times[cut][0], None, True)
    assert rows[cut].note.startswith("timed once:") and "cannot win" in rows[cut].note
    assert "timed once" in str(ex)
    assert not any(rows[c].once or rows[c].note for c in full)
    with dispatch.settings(graph=True):
        assert dispatch.choose(_problem(k=5), run=rotating, mode="benchmark").config == "a"


def test_graph_replayed_times_on_rotated_operands_rank_both_choices(fakes, monkeypatch):
    """Where a trial can rotate over operand sets, each candidate is also timed replayed
    from a CUDA graph; that GPU time ranks the graph choice and is the GPU part of the eager
    cost (a tile that looked fast re-reading a warm L2 cache loses). A candidate whose graph
    timing fails keeps its eager GPU time for eager calls, with the reason shown, and is not
    chosen for a CUDA graph; explain shows the column; the plan cache stores it."""
    run, calls = fakes
    monkeypatch.setattr(_Fake, "TIMES", {"a": (0.050, 0.010), "b": (0.040, 0.010),
                                         "c": (0.045, 0.010)})
    graphed = {"a": 0.052, "b": 0.070, "c": None}  # b: fast only on a warm L2; c: fails
    rotations = []

    def fake_graph(fn, sets, gpu_ms):
        config = fn(0)
        rotations.append((config, sets, gpu_ms))
        if graphed[config] is None:
            raise RuntimeError("operation not permitted when stream is capturing")
        return graphed[config]

    def rotating(cls, config, k=0):
        return config if k == 0 or cls.NAME != "fake" else run(cls, config)
    rotating.operand_sets = type("Sets", (), {"count": 3})()
    monkeypatch.setattr(dispatch.timing, "time_graph_cost", fake_graph)
    p = _problem(k=5)
    monkeypatch.setattr(dispatch.timing, "time_costs", lambda fn: _Fake.TIMES[fn()])
    eager = dispatch.choose(p, run=rotating, mode="benchmark")
    assert sorted(rotations) == [("a", 3, 0.050), ("b", 3, 0.040), ("c", 3, 0.045)]
    assert (eager.config, eager.graph_ms) == ("c", None)  # 0.045 + 0.010 < a's 0.062
    with dispatch.settings(graph=True):  # c's capture failed: a, the least graph time
        choice = dispatch.choose(p, run=rotating, mode="benchmark")
        assert (choice.config, choice.ms, choice.graph_ms) == ("a", 0.052, 0.052)
    monkeypatch.setattr(_Fake, "TIMES", {"a": (0.050, 0.010), "b": (0.040, 0.010)})
    dispatch.CACHE.clear(disk=True)
    rotations.clear()
    with dispatch.settings(graph=True):
        choice = dispatch.choose(p, run=rotating, mode="benchmark")
        assert (choice.config, choice.ms, choice.gpu_ms, choice.graph_ms) == \
            ("a", 0.052, 0.050, 0.052)
        text = str(dispatch.explain(p, mode="benchmark", run=rotating))
        dispatch.store.CACHE = plancache.PlanCache()  # a new process: read from disk
        assert dispatch.cached(p, mode="benchmark") == choice
    assert "* fake:a" in text and "graph     52.0 us" in text and "graph     70.0 us" in text
    monkeypatch.setattr(_Fake, "TIMES", {"a": (0.050, 0.010), "c": (0.045, 0.010)})
    text = str(dispatch.explain(_problem(k=7), mode="benchmark", run=rotating))
    assert "graph timing: RuntimeError: operation not permitted" in text


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": 99}),
                                     "FOREIGN"])
def test_corrupt_or_foreign_cache_file_is_ignored_with_one_warning(fakes, tmp_path, content):
    run, calls = fakes
    path = tmp_path / plancache.FILE_NAME
    if content == "FOREIGN":
        content = json.dumps({"format": plancache.FORMAT, "environment": {"gpu": "other"},
                              "entries": {}})
    path.write_text(content)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dispatch.choose(_problem(k=4), run=run, mode="benchmark")
        dispatch.choose(_problem(k=6), run=run, mode="benchmark")
    assert len([w for w in caught if "plan cache" in str(w.message)]) == 1
    data = json.loads(path.read_text())  # rebuilt: ours, with both problems (eager, graph)
    assert data["environment"] == plancache.environment() and len(data["entries"]) == 4


def test_cache_from_an_older_candidate_list_is_rebuilt(fakes, tmp_path):
    """Choices timed before candidates were added (another CANDIDATES_REVISION) are not
    reused: the file is ignored with a warning and the problem is timed again."""
    run, calls = fakes
    assert plancache.environment()["candidates"] == str(plancache.CANDIDATES_REVISION)
    p = _problem(k=4)
    dispatch.choose(p, run=run, mode="benchmark")
    path = tmp_path / plancache.FILE_NAME
    data = json.loads(path.read_text())
    data["environment"]["candidates"] = str(plancache.CANDIDATES_REVISION - 1)
    path.write_text(json.dumps(data))
    calls.clear()
    dispatch.store.CACHE = plancache.PlanCache()  # a new process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dispatch.choose(p, run=run, mode="benchmark")
    assert calls, "the stale choice was reused"
    assert any("another environment" in str(w.message) for w in caught)


def test_sixteen_threads_one_benchmark_and_one_entry_per_key(fakes):
    run, calls = fakes
    slow_lock = threading.Lock()

    def slow_run(cls, config):
        with slow_lock:
            pass
        time.sleep(0.002)  # keep several threads inside the miss at once
        return run(cls, config)

    problems = [_problem(k=k) for k in (2, 4, 6, 8)]
    results, errors = [], []

    def worker(i):
        try:
            p = problems[i % 4]
            results.append((p.k, dispatch.choose(p, run=slow_run, mode="benchmark")))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 16 and all(c.config == "b" for _, c in results)
    assert len(calls) == 4 * 6  # each key timed once: 2 backends x 3 candidates
    assert len(dispatch.CACHE) == 8  # an eager and a CUDA-graph entry per key


def test_workspace_pool_grows_only_and_respects_the_cap():
    workspace.clear()
    try:
        workspace.set_limit(1000)
        a = workspace.get(100, device="cpu")
        b = workspace.get(50, device="cpu")
        assert b.data_ptr() == a.data_ptr()  # reused, not shrunk
        c = workspace.get(400, device="cpu")
        assert c.numel() >= 400
        assert workspace.get(0, device="cpu") is None
        with pytest.raises(workspace.WorkspaceTooLarge, match="2000 bytes.*limit of 1000"):
            workspace.get(2000, device="cpu")
        (s,) = workspace.stats()
        assert (s.bytes, s.grows, s.requests, s.largest_request, s.refused) == \
            (400, 2, 5, 2000, 1)
        with pytest.raises(fastconv.ConvError, match="nbytes"):
            workspace.set_limit(-1)
    finally:
        workspace.set_limit(None)
        workspace.clear()


def test_out_of_memory_candidate_is_skipped(fakes, monkeypatch):
    run, _ = fakes

    def oom_run(cls, config):
        if config == "b":
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        return run(cls, config)

    p = _problem(k=5)
    assert dispatch.choose(p, run=oom_run, mode="benchmark").config == "c"
    rows = dispatch.explain(p, mode="benchmark", run=oom_run).rows
    assert any(r.note.startswith("out of memory") for r in rows if r.config == "b")


@pytest.mark.slow
def test_check_runs_refused_epilogues_bare_and_counts_refused_problems(monkeypatch):
    """A backend that refuses fused epilogues (cuDNN) is checked on the random problems'
    bare convolutions (nearly every random problem has an epilogue: cuDNN's random rows
    verified none); problems it refuses bare (here rank 1) are counted, not failed."""
    from fastconv.tools import check, testing

    monkeypatch.setitem(backends.REGISTRY, "picky", type("Picky", (backends.REGISTRY["aten"],), {
        "NAME": "picky",
        "not_supported_reasons": classmethod(
            lambda cls, p: (["epilogue"] if not p.epilogue.is_identity else [])
            + (["rank 1"] if p.rank == 1 else []))}))
    real, drawn = testing.random_case, itertools.count()
    monkeypatch.setattr(testing, "random_case",  # ranks 1 and 2 in turn
                        lambda rng, **kw: real(rng, rank=1 + next(drawn) % 2, **kw))
    rows = [r for r in check.run_check(count=6, seed=1) if r.backend == "picky"]
    assert rows and all(r.ok for r in rows)
    random_rows = [r for r in rows if r.case.startswith("random")]
    assert len(random_rows) == len(Precision)
    assert all(r.count == 3 and r.case.endswith("3 refused") for r in random_rows)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only output")
def test_explain_and_plans_commands(monkeypatch, tmp_path, capsys):
    from fastconv.tools import cli

    monkeypatch.setenv("FASTCONV_CACHE_DIR", str(tmp_path))
    assert cli.main(["explain", "--input", "2,8,9,7", "--weight", "4,8,3,3", "--padding", "1",
                     "--activation", "relu", "--bias"]) == 0
    out = capsys.readouterr().out
    assert "no CUDA GPU found" in out and "choice: aten" in out
    assert "cudnn" in out and "no CUDA GPU" in out.split("cudnn", 1)[1]  # refusal reason
    assert cli.main(["explain", "--input", "2,8,9", "--weight", "4,8,3,3"]) == 2
    assert cli.main(["plans"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path) in out and "workspace limit" in out
    assert cli.main(["plans", "--clear"]) == 0
    assert "cleared" in capsys.readouterr().out


@pytest.fixture
def clock(monkeypatch):
    """A fake monotonic clock that each candidate run advances by 1 s."""
    now = [0.0]
    monkeypatch.setattr(dispatch.timing, "clock", lambda: now[0])
    monkeypatch.setattr(dispatch.budget, "TUNING", dispatch.TuningBudget())
    return now


def _ticking(run, now):
    def timed(cls, config):
        now[0] += 1.0
        return run(cls, config)
    return timed


def test_the_per_problem_budget_stops_timing_and_stores_a_partial_choice(
        fakes, clock, tmp_path):
    run, calls = fakes
    dispatch.tuning_budget(per_problem_s=2.5)
    p = _problem(k=4)  # 6 candidates: fake a, b, c, refuses a, b, c
    choice = dispatch.choose(p, run=_ticking(run, clock), mode="benchmark")
    assert calls == [("fake", "a"), ("fake", "b"), ("fake", "c")]  # 0, 1, 2 s: then spent
    assert choice.config == "b"  # the best of those timed
    stored = json.loads((tmp_path / plancache.FILE_NAME).read_text())["entries"]
    assert stored and all(e["partial"] for e in stored.values())  # on disk, marked partial
    rows = dispatch.explain(p, mode="benchmark", run=_ticking(run, clock)).rows
    skipped = [r for r in rows if r.note.startswith(dispatch.BUDGET_NOTE)]
    assert [r.name() for r in skipped] == ["refuses"]  # its candidates were not even listed
    assert "2.5 s per problem" in skipped[0].note and "not listed" in skipped[0].note
    calls.clear()
    dispatch.choose(p, run=_ticking(run, clock), mode="benchmark")
    assert calls == []  # a budgeted process uses the partial choice
    dispatch.tuning_budget()  # exhaustive: the partial choice is timed again, in full
    dispatch.choose(p, run=_ticking(run, clock), mode="benchmark")
    assert len(calls) == 6
    stored = json.loads((tmp_path / plancache.FILE_NAME).read_text())["entries"]
    assert not any(e.get("partial") for e in stored.values())


def test_the_per_process_budget_leaves_one_candidate_per_new_problem(fakes, clock, tmp_path):
    run, calls = fakes
    dispatch.tuning_budget(per_process_s=2.5)
    dispatch.choose(_problem(k=4), run=_ticking(run, clock), mode="benchmark")
    assert len(calls) == 3 and dispatch.TUNING.spent_s == 3.0
    calls.clear()
    choice = dispatch.choose(_problem(k=6), run=_ticking(run, clock), mode="benchmark")
    assert calls == [("fake", "a")] and choice.config == "a"  # the most promising, at once
    # tuned with none of its own budget: memory only, so a later process tunes it
    stored = json.loads((tmp_path / plancache.FILE_NAME).read_text())["entries"]
    assert len(stored) == 2 and all(e["partial"] for e in stored.values())  # k=4's two
    dispatch.tuning_budget()  # exhaustive again
    calls.clear()
    dispatch.choose(_problem(k=8), run=_ticking(run, clock), mode="benchmark")
    assert len(calls) == 6


def test_a_backend_s_candidates_are_listed_inside_the_budget(fakes, clock, monkeypatch):
    """Listing candidates can cost seconds (cuDNN builds graphs): a backend whose turn comes
    after the budget is spent is not asked for them, and the listing counts as tuning."""
    run, calls = fakes
    listed = []

    class _Slow(_Refuses):
        @classmethod
        def candidates(cls, problem, op="fprop"):
            listed.append(problem.k)
            clock[0] += 10.0  # a slow listing
            return super().candidates(problem, op)
    monkeypatch.setitem(backends.REGISTRY, "refuses", _Slow)
    dispatch.tuning_budget(per_problem_s=100, per_process_s=20)
    dispatch.choose(_problem(k=4), run=_ticking(run, clock), mode="benchmark")
    assert listed == [4] and len(calls) == 6 and dispatch.TUNING.spent_s == 16.0
    dispatch.choose(_problem(k=6), run=_ticking(run, clock), mode="benchmark")
    assert listed == [4, 6]  # 16 + 3 s < 20: listed; 29 s after it: none of them timed
    assert calls[6:] == [("fake", "a"), ("fake", "b"), ("fake", "c")]
    calls.clear()
    dispatch.choose(_problem(k=8), run=_ticking(run, clock), mode="benchmark")
    assert listed == [4, 6] and calls == [("fake", "a")]  # spent: "refuses" never listed


def test_aten_then_the_heuristics_pick_are_timed_first(fakes, clock, monkeypatch):
    """aten first (it compiles nothing), then the heuristic's pick, then the rest."""
    run, calls = fakes

    class _Aten(_Fake):
        NAME = "aten"
        TIMES = {"a": 2.0}
    monkeypatch.setattr(backends, "REGISTRY", {c.NAME: c for c in (_Fake, _Refuses, _Aten)})
    monkeypatch.setattr(dispatch.policy, "rule", lambda problem, names, op: "refuses")
    dispatch.tuning_budget(per_problem_s=1.5)
    dispatch.choose(_problem(k=4), run=_ticking(run, clock), mode="benchmark")
    assert calls == [("aten", "a"), ("refuses", "a")]


def test_the_budget_prunes_by_the_backend_s_cost_model(fakes, clock, tmp_path, monkeypatch):
    """With ``candidates``, only those a backend's model keeps are run (built) and timed, in
    its order; the rest are rows noted as pruned and the choice is stored partial, which an
    exhaustive tuning redoes in full. A backend without a model keeps every candidate."""
    run, calls = fakes

    class _Modelled(_Fake):
        NAME = "modelled"
        TIMES = {"a": 3.0, "b": 1.0, "c": 2.0, "d": 0.5}

        @classmethod
        def prune(cls, problem, op, configs, keep):
            ranked = sorted(configs, key=lambda c: {"a": 0, "c": 1, "b": 2, "d": 3}[c])
            return ranked[:keep], ranked[keep:]
    monkeypatch.setattr(backends, "REGISTRY", {c.NAME: c for c in (_Fake, _Modelled)})
    dispatch.tuning_budget(candidates=2)
    p = _problem(k=4)
    choice = dispatch.choose(p, run=run, mode="benchmark")
    assert calls == [("fake", "a"), ("fake", "b"), ("fake", "c"),  # no model: all of them
                     ("modelled", "a"), ("modelled", "c")]  # the model's two, in its order
    assert choice.name() == "fake:b"  # d (0.5 ms) was pruned: the model was wrong about it
    rows = dispatch.explain(p, mode="benchmark", run=run).rows
    assert [r.name() for r in rows if r.note.startswith(dispatch.PRUNED_NOTE)] == \
        ["modelled:b", "modelled:d"]
    assert "2 candidates per backend" in rows[-1].note
    stored = json.loads((tmp_path / plancache.FILE_NAME).read_text())["entries"]
    assert stored and all(e["partial"] for e in stored.values())
    dispatch.tuning_budget()  # exhaustive: every candidate, d wins
    assert dispatch.choose(p, run=run, mode="benchmark").name() == "modelled:d"


def test_the_triton_model_ranks_gemm_tiles_and_a_grouped_problem_s_direct_tiles_go():
    """cost.py ranks the GEMM tiles of a real problem and keeps the fastest expected; a
    grouped problem's direct tiles (not modelled, never an exhaustive winner) are left out
    of budgeted tuning, after the modelled ones; a depthwise problem's are all kept."""
    from fastconv.backends.triton import cost
    from fastconv.backends.triton.backend import TritonBackend

    x = torch.empty(32, 64, 28, 28, device="meta").contiguous(memory_format=torch.channels_last)
    w = torch.empty(128, 16, 3, 3, device="meta")
    p = dataclasses.replace(fastconv.ConvProblem.from_tensors(
        x.bfloat16(), w.bfloat16(), None, padding=1, groups=4, rank=2, precision="bf16"),
        device="cuda")
    configs = TritonBackend.candidates(p)
    tiles = [c for c in configs if isinstance(c, cost.TileConfig)]
    direct = [c for c in configs if not isinstance(c, cost.TileConfig)]
    assert len(tiles) > 3 and direct
    kept, pruned = TritonBackend.prune(p, "fprop", configs, 3)
    assert len(kept) == 3 and pruned[len(tiles) - 3:] == direct
    assert sorted(kept + pruned[:len(tiles) - 3], key=tiles.index) == tiles
    times = [cost.estimate(p, "fprop", c) for c in kept + pruned[:len(tiles) - 3]]
    assert times == sorted(times) and all(0 < t < 1 for t in times)
    assert cost.estimate(p, "fprop", direct[0]) == float("inf")

    dw = dataclasses.replace(fastconv.ConvProblem.from_tensors(
        x.bfloat16(), torch.empty(64, 1, 3, 3, device="meta").bfloat16(), None, padding=1,
        groups=64, rank=2, precision="bf16"), device="cuda")
    configs = TritonBackend.candidates(dw)
    assert len(configs) > 3 and not any(isinstance(c, cost.TileConfig) for c in configs)
    assert TritonBackend.prune(dw, "fprop", configs, 3) == (configs, [])


def test_the_default_budget_bounds_a_first_call():
    budget = dispatch.parse_budget("")  # FASTCONV_TUNE_BUDGET unset or empty
    assert (budget.per_problem_s, budget.per_process_s, budget.candidates) \
        == dispatch.DEFAULT_BUDGET
    assert not budget.exhaustive and "6 candidates per backend" in budget.describe()


@pytest.mark.parametrize("tty,env,shown", [(True, None, True), (False, None, False),
                                           (True, "0", False)])
def test_a_progress_line_on_a_terminal_only(fakes, clock, monkeypatch, capsys, tty, env,
                                            shown):
    run, _ = fakes
    monkeypatch.setattr("sys.stderr.isatty", lambda: tty)
    if env is not None:
        monkeypatch.setenv("FASTCONV_PROGRESS", env)
    monkeypatch.setattr(dispatch.timing, "PROGRESS_AFTER_S", 1.5)
    dispatch.choose(_problem(k=4), run=_ticking(run, clock), mode="benchmark")
    err = capsys.readouterr().err
    if shown:  # from the third candidate (2 s in): which one, how many left
        assert "fastconv: tuning fprop of" in err
        assert "fake:c (0 more of its backend, then refuses; 2 s)" in err
        assert "refuses:c (0 more of its backend; 5 s)" in err and err.endswith("\n")
    else:
        assert err == ""


@pytest.mark.parametrize("text,want", [("", dispatch.DEFAULT_BUDGET), ("exhaustive", None),
                                       ("2", (2.0, None, None)),
                                       ("2.5,30", (2.5, 30.0, None)),
                                       ("2.5,30,4", (2.5, 30.0, 4))])
def test_the_budget_from_the_environment(text, want):
    budget = dispatch.parse_budget(text)
    if want is None:
        assert budget.exhaustive
    else:
        assert budget.per_problem_s == want[0] and budget.candidates == want[2]
        assert budget.per_process_s == (float("inf") if want[1] is None else want[1])


@pytest.mark.parametrize("text", ["fast", "0", "-1,5", "1,2,0", "1,2,3.5", "1,2,3,4"])
def test_a_bad_budget_is_a_clear_error(text):
    with pytest.raises(fastconv.ConvError, match="FASTCONV_TUNE_BUDGET"):
        dispatch.parse_budget(text)
    with pytest.raises(fastconv.ConvError, match="per_problem_s"):
        dispatch.tuning_budget(per_problem_s=0)
    with pytest.raises(fastconv.ConvError, match="candidates: got 2.0"):
        dispatch.tuning_budget(1, 2, candidates=2.0)


def test_a_backend_s_candidates_compile_ahead_at_once_and_time_as_built(fakes, clock,
                                                                       monkeypatch):
    """A backend that builds in the background gets every candidate's build started before
    the first is timed; each is timed once its build is done, and a build still running
    when the problem's budget is spent leaves its candidate (and the rest) untimed."""
    import concurrent.futures as cf

    run, calls = fakes
    builds = {}

    class _Ahead(_Fake):
        @classmethod
        def compile_ahead(cls, run_one):
            run_one()  # (collecting: what it would compile)
            future = builds[len(builds)] = cf.Future()
            if len(builds) != 3:  # the third candidate's build never finishes
                future.set_result("built")
            return [future]
    monkeypatch.setattr(backends, "REGISTRY", {"fake": _Ahead})
    dispatch.tuning_budget(per_problem_s=0.2)
    rows = dispatch.explain(_problem(), mode="benchmark", run=run).rows
    assert len(builds) == 3 and calls[:3] == [("fake", c) for c in "abc"]  # all ahead first
    assert calls[3:] == [("fake", "a"), ("fake", "b")]  # then timed as built
    assert [r.timed for r in rows] == [True, True, False]
    assert rows[2].note.startswith(dispatch.BUDGET_NOTE)
    builds[2].set_result("built")


def _building(futures: dict, done: str):
    """A fake backend that builds in the background: one future per configuration, already
    finished for those in ``done``."""
    import concurrent.futures as cf

    class _Builds(_Fake):
        BUILDS_AHEAD = True
        TIMES = {"a": 3.0, "b": 1.0, "c": 0.5}

        @classmethod
        def compile_ahead(cls, run_one):
            run_one()  # (collecting: what it would compile; returns its fake time)
            config = "abc"[len(futures) % 3]
            future = futures[config] = cf.Future()
            if config in done:
                future.set_result("built")
            return [future]
    return _Builds


def test_candidates_left_building_are_timed_once_built(fakes, clock, monkeypatch, tmp_path):
    """The budget stops timing while a candidate still builds: the best timed runs,
    provisionally (plans keep it until its builds are done); the next call times those
    candidates, with the ones timed before that could still win again, and stores the
    final choice on disk."""
    run, calls = fakes
    futures = {}
    monkeypatch.setattr(backends, "REGISTRY", {"fake": _building(futures, done="ab")})
    dispatch.tuning_budget(per_problem_s=0.2)
    p = _problem()
    first = dispatch.choose(p, run=run, mode="benchmark")
    assert (first.config, first.provisional) == ("b", True)
    calls.clear()
    again = dispatch.choose(p, run=run, mode="benchmark")  # "c" still building
    assert (again.config, again.provisional, calls) == ("b", True, [])
    assert not first.until()  # (a plan keeps it meanwhile)
    futures["c"].set_result("built")
    assert first.until()
    final = dispatch.choose(p, run=run, mode="benchmark")
    assert (final.config, final.provisional) == ("c", False)
    # b again (a, at 3x b's time, keeps its first: RETIME_FACTOR), and c
    assert calls == [("fake", "b"), ("fake", "c")]
    # a stand-in kept elsewhere (a plan of another signature of the same problem, which
    # did not make the final call) asks again rather than running for good
    assert first.until() and again.until()
    stored = json.loads((tmp_path / plancache.FILE_NAME).read_text())["entries"]
    assert [e["config"] for e in stored.values()] == ["c", "c"]  # both rankings
    assert not any(e.get("partial") for e in stored.values())
    calls.clear()
    assert dispatch.choose(p, run=run, mode="benchmark").config == "c" and calls == []


def test_an_upgrade_gives_a_candidate_that_cannot_win_its_first_reading_only(
        fakes, clock, monkeypatch):
    """Candidates timed once built (an upgrade) are compared with the problem's rows timed
    before: one whose first reading is over SLOW_FACTOR times the best is not timed in full
    (slow candidates timed in full held regnet's steady state for minutes at batch 256)."""
    run, calls = fakes
    futures = {}
    builds = _building(futures, done="ab")
    monkeypatch.setattr(builds, "TIMES", {"a": 3.0, "b": 1.0, "c": 9.0})
    monkeypatch.setattr(backends, "REGISTRY", {"fake": builds})
    dispatch.tuning_budget(per_problem_s=0.2)
    p = _problem()
    assert dispatch.choose(p, run=run, mode="benchmark").provisional
    full, probed = [], []
    monkeypatch.setattr(dispatch.timing, "time_costs",
                        lambda fn: full.append(fn()) or (full[-1], 0.0))
    monkeypatch.setattr(dispatch.timing, "time_probe",
                        lambda fn: probed.append(fn()) or (probed[-1], 0.0))
    futures["c"].set_result("built")
    final = dispatch.choose(p, run=run, mode="benchmark")
    assert (final.config, final.provisional) == ("b", False)
    # b again in full (not a: 3x b's time), c's first reading only (9x)
    assert sorted(probed) == [1.0, 9.0] and full == [1.0]


def test_finish_builds_and_building_see_budget_cut_candidates(fakes, clock, monkeypatch):
    """``finish_builds(upgrades=True)`` (the bench, before it times a steady state) also
    waits for the candidates a budget-cut timing left building; plain ``finish_builds``
    (a CUDA-graph capture) waits only for stored choices' builds; ``building()`` (whether a
    captured graph must be captured again later) sees both. The waits are counted
    (``timing.WAITED``, the bench's first-call breakdown)."""
    from fastconv.dispatch import timing

    run, _ = fakes
    futures = {}
    monkeypatch.setattr(backends, "REGISTRY", {"fake": _building(futures, done="ab")})
    dispatch.tuning_budget(per_problem_s=0.2)
    assert not dispatch.building()
    assert dispatch.choose(_problem(), run=run, mode="benchmark").provisional
    assert dispatch.finish_builds(timeout=0.01)  # nothing stored waits
    waited = timing.WAITED["builds_s"]
    assert not dispatch.finish_builds(timeout=0.01, upgrades=True)  # "c" still builds
    assert timing.WAITED["builds_s"] - waited >= 0.01
    assert dispatch.building()  # (a CUDA graph captured now runs the provisional choice)
    futures["c"].set_result("built")
    assert dispatch.finish_builds(timeout=0.01, upgrades=True)
    assert not dispatch.building()


def test_a_spent_budget_still_starts_background_builds(fakes, clock, monkeypatch):
    """After the process's budget is spent a new problem times one candidate; a backend
    that builds in the background still starts its builds (timed later), one that does not
    is not even listed; a failed build is reported, not compiled at the call."""
    run, calls = fakes
    futures = {}
    monkeypatch.setattr(backends, "REGISTRY", {"fake": _building(futures, done="a"),
                                               "refuses": _Refuses})
    dispatch.tuning_budget(per_problem_s=10, per_process_s=1)
    dispatch.TUNING.spent_s = 5.0  # spent
    p = _problem()
    choice = dispatch.choose(p, run=run, mode="benchmark")
    assert choice.provisional and set(futures) == {"a", "b", "c"}
    rows = dispatch.upgrades.UPGRADES[next(iter(dispatch.upgrades.UPGRADES))].rows
    assert [(r.name(), r.timed, bool(r.builds)) for r in rows if r.backend == "fake"] == \
        [("fake:a", True, False), ("fake:b", False, True), ("fake:c", False, True)]
    assert any(r.backend == "refuses" and "not listed" in r.note for r in rows)
    futures["b"].set_exception(RuntimeError("ptxas died"))
    futures["c"].set_result("built")
    calls.clear()
    final = dispatch.choose(p, run=run, mode="benchmark")
    assert (final.config, final.provisional) == ("c", False)
    assert calls == [("fake", "a"), ("fake", "c")]  # "a" timed again beside "c"
    assert any(r.note == "background build failed: RuntimeError: ptxas died" for r in rows)


def test_a_budgeted_timing_waits_briefly_for_builds(fakes, clock, monkeypatch):
    """Within a budget, a build still running after ``BUILD_WAIT_S`` is left to finish in
    the background (timed once built) even where the problem's budget has seconds left,
    and the backends after it are still listed and timed; exhaustive tuning waits for it."""
    import threading
    import time

    run, calls = fakes
    futures = {}
    building = _building(futures, done="a")  # "b" and "c" never finish here
    monkeypatch.setattr(backends, "REGISTRY", {"fake": building, "refuses": _Refuses})
    monkeypatch.setattr(dispatch.timing, "BUILD_WAIT_S", 0.05)
    dispatch.tuning_budget(per_problem_s=60, per_process_s=600)
    start = time.monotonic()
    rows = dispatch.explain(_problem(), mode="benchmark", run=run).rows
    assert time.monotonic() - start < 5  # not the problem's 60 s
    assert [(r.name(), r.timed, bool(r.builds)) for r in rows if r.backend == "fake"] == \
        [("fake:a", True, False), ("fake:b", False, True), ("fake:c", False, True)]
    assert [r.timed for r in rows if r.backend == "refuses"] == [True] * 3  # listed, timed
    for f in futures.values():
        if not f.done():
            f.set_result("built")
    # exhaustive: every build waited for ("b" and "c" finish 0.3 s in, past BUILD_WAIT_S)
    dispatch.tuning_budget()
    futures.clear()
    monkeypatch.setattr(backends, "REGISTRY", {"fake": _building(futures, done="a")})
    timer = threading.Timer(0.3, lambda: [f.set_result("built") for f in list(futures.values())
                                          if not f.done()])
    timer.start()
    rows = dispatch.explain(_problem(k=6), mode="benchmark", run=run).rows
    timer.join()
    assert [r.timed for r in rows] == [True] * 3


def test_past_the_process_budget_aten_runs_untimed_until_the_builds_are_done(fakes, clock,
                                                                              monkeypatch,
                                                                              tmp_path):
    """A new problem met after the process's budget is spent times nothing: aten runs,
    provisionally and in memory only, while the other candidates build in the background
    (a forward on cuDNN's heuristic plan, ``aten.PROVISIONAL``: no benchmark search for a
    stand-in); once they are built, aten's own plan is timed beside them and the best is
    stored on disk."""
    from fastconv.backends import aten

    run, calls = fakes
    futures = {}

    class _Aten(_Fake):
        NAME = "aten"
        TIMES = {None: 2.0}
    monkeypatch.setattr(backends, "REGISTRY", {"aten": _Aten,
                                               "fake": _building(futures, done="")})
    dispatch.tuning_budget(per_problem_s=10, per_process_s=1)
    dispatch.TUNING.spent_s = 5.0  # spent
    p = _problem()
    for _ in range(2):  # (the second call: the upgrade still waits)
        choice = dispatch.choose(p, run=run, mode="benchmark")
        assert (choice.backend, choice.config, choice.provisional) == \
            ("aten", aten.PROVISIONAL, True)
    assert calls == [("fake", c) for c in "abc"]  # the builds collected; nothing timed
    rows = dispatch.upgrades.UPGRADES[next(iter(dispatch.upgrades.UPGRADES))].rows
    assert [(r.name(), r.timed, r.assumed) for r in rows][0] == ("aten", False, True)
    assert not (tmp_path / plancache.FILE_NAME).exists()
    for f in futures.values():
        f.set_result("built")
    calls.clear()
    final = dispatch.choose(p, run=run, mode="benchmark")
    assert (final.config, final.provisional) == ("c", False)
    # (c beats aten: the two timed once more, timing.confirm_against_aten)
    assert sorted(calls, key=str) == [("aten", None), ("aten", None), ("fake", "a"),
                                      ("fake", "b"), ("fake", "c"), ("fake", "c")]
    # a gradient's stand-in keeps aten's own plan (aten.PROVISIONAL is a forward's)
    grad = dispatch.choose(_problem(k=6), run=run, mode="benchmark", op="dgrad")
    assert (grad.backend, grad.config, grad.provisional) == ("aten", None, True)
    stored = json.loads((tmp_path / plancache.FILE_NAME).read_text())["entries"]
    assert [e["config"] for e in stored.values()] == ["c", "c"]


def test_past_the_process_budget_with_nothing_building_aten_runs_untimed(fakes, clock,
                                                                          monkeypatch,
                                                                          tmp_path):
    """Where no candidate builds in the background, a starved problem runs aten untimed,
    for good in this process (memory only: the next process tunes it)."""
    run, calls = fakes

    class _Aten(_Fake):
        NAME = "aten"
        TIMES = {"x": 2.0}
    monkeypatch.setattr(backends, "REGISTRY", {"aten": _Aten, "refuses": _Refuses})
    dispatch.tuning_budget(per_problem_s=10, per_process_s=1)
    dispatch.TUNING.spent_s = 5.0
    p = _problem()
    choice = dispatch.choose(p, run=run, mode="benchmark")
    assert (choice.backend, choice.config, choice.provisional, calls) == \
        ("aten", "x", False, [])
    assert dispatch.choose(p, run=run, mode="benchmark").config == "x" and calls == []
    assert not (tmp_path / plancache.FILE_NAME).exists()
    rows = dispatch.explain(_problem(k=6), mode="benchmark", run=run).rows
    assert rows[0].assumed and "runs untimed" in rows[0].note
    assert "not listed" in rows[-1].note


def test_eager_calls_with_autograd_take_torchs_convolution_untimed(monkeypatch):
    """On the GPU in benchmark mode an eager forward whose backward follows runs aten's
    native plan (torch's autograd) without timing candidates; a CUDA graph's
    (settings(graph=True)), deterministic mode, the other modes, the CPU and a float32
    problem whose precision torch's backward would not keep take dispatch's choice."""
    from fastconv import plans

    monkeypatch.delenv("FASTCONV_DISPATCH", raising=False)
    dispatch.reload_environment()
    x = torch.randn(2, 3, 9, 7, dtype=torch.bfloat16)
    w = torch.randn(4, 3, 3, 3, dtype=torch.bfloat16)
    p = dataclasses.replace(fastconv.ConvProblem.from_tensors(x, w, None, padding=1, rank=2),
                            device="cuda")
    assert plans._eager_native(p)
    with dispatch.settings(graph=True):
        assert not plans._eager_native(p)
    with dispatch.settings(deterministic=True):
        assert not plans._eager_native(p)
    with dispatch.settings("heuristic"):
        assert not plans._eager_native(p)
    assert not plans._eager_native(dataclasses.replace(p, device="cpu"))
    strict = dataclasses.replace(fastconv.ConvProblem.from_tensors(
        x.float(), w.float(), None, padding=1, rank=2, precision="ieee"), device="cuda")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert not plans._eager_native(strict)

    # the wiring: such a call's plan is aten's, made without dispatch, and differentiable
    def no_dispatch(*args, **kwargs):
        raise AssertionError("dispatch.choose was called")
    monkeypatch.setattr(plans, "_eager_native", lambda problem: True)
    monkeypatch.setattr(dispatch, "choose", no_dispatch)
    plans.clear_plans()
    xf = torch.randn(2, 3, 9, 7, requires_grad=True)
    wf = torch.randn(4, 3, 3, 3, requires_grad=True)
    y = fastconv.conv2d(xf, wf, None, 1, 1, activation="silu")
    ref = torch.nn.functional.silu(torch.nn.functional.conv2d(xf, wf, None, 1, 1))
    assert torch.allclose(y, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(ref)
    got = torch.autograd.grad(y, (xf, wf), g)
    want = torch.autograd.grad(ref, (xf, wf), g)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    plans.clear_plans()


def test_a_graph_choice_never_loses_to_aten_on_warm_operands():
    """The CUDA-graph ranking takes a candidate over aten only where its GPU time on the
    call's own operands is within WARM_TOLERANCE of aten's: a tile faster on rotated
    operands but slower on warm ones gives way to aten, then to the next candidate that
    passes; the eager ranking (GPU + host) is unchanged, and without an aten row nothing
    is left out."""
    from fastconv.dispatch import policy
    from fastconv.dispatch.timing import Row

    assert policy.WARM_TOLERANCE == 0.02
    aten = Row("aten", None, gpu_ms=0.0154, host_ms=0.010, graph_ms=0.0171)
    tile = Row("triton", "t", gpu_ms=0.0182, host_ms=0.004, graph_ms=0.0160)  # warm: 1.18x
    near = Row("triton", "n", gpu_ms=0.0157, host_ms=0.004, graph_ms=0.0165)  # within 2 %
    far = Row("cudnn", 3, gpu_ms=0.0158, host_ms=0.004, graph_ms=0.0150)  # 2.6 % slower warm
    assert policy.best([aten, tile], True).backend == "aten"
    assert policy.best([tile, near, aten], True).config == "n"
    assert policy.best([far, aten], True).backend == "aten"
    assert policy.best([aten, tile], False).config == "t"  # 0.0222 against 0.0254 eagerly
    assert policy.best([tile, near], True).config == "t"  # no aten row: graph time alone
    assert policy.warm_losers([aten, tile, near, far]) == [tile, far]  # (explain notes them)
    broken = Row("aten", None, gpu_ms=0.0154, host_ms=0.010)  # its capture failed
    assert policy.best([broken, tile], True).config == "t"


def test_explain_notes_a_candidate_left_out_for_losing_on_warm_operands(monkeypatch):
    """explain's graph ranking marks the rows the warm-operand rule left out, and the
    choice is aten's."""
    from fastconv.dispatch.timing import Row

    rows = [Row("aten", None, gpu_ms=0.0154, host_ms=0.01, graph_ms=0.0171),
            Row("triton", "t", gpu_ms=0.0182, host_ms=0.004, graph_ms=0.0160)]
    monkeypatch.setattr(dispatch.store, "CACHE", plancache.PlanCache())
    monkeypatch.setattr(dispatch.timing, "benchmark", lambda *args, **kwargs: rows)
    with dispatch.settings(graph=True):
        found = dispatch.explain(_problem(), mode="benchmark", run=lambda *a: None)
    assert found.choice.backend == "aten"
    assert rows[1].note == "slower than aten on warm operands: not taken for a CUDA graph"
    assert "slower than aten on warm operands" in str(found)


def test_an_upgrades_final_timing_retimes_only_rows_that_could_still_win():
    """``upgrades.contenders``: timed rows within RETIME_FACTOR of the best in either the
    eager (GPU + host) or the CUDA-graph ranking; an untimed row is not one."""
    from fastconv.dispatch import upgrades
    from fastconv.dispatch.timing import Row

    a = Row("x", "a", gpu_ms=1.0, host_ms=0.1, graph_ms=1.0)  # (eager cost 1.1)
    b = Row("x", "b", gpu_ms=1.4, host_ms=0.1)  # eager 1.5 of 1.1: near; no graph time
    c = Row("x", "c", gpu_ms=1.0, host_ms=1.0, graph_ms=1.4)  # eager 2.4; graph 1.4 of 1.0
    d = Row("x", "d", gpu_ms=5.0, host_ms=0.0, graph_ms=5.0)
    e = Row("x", "e")
    assert upgrades.RETIME_FACTOR == 1.5
    assert upgrades.contenders([d, c, e, b, a]) == [b, a, c]
