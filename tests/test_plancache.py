"""The on-disk plan cache shared by processes: no lost entries, no blocking, no stale lock."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch

import fastconv
from fastconv import plancache
from fastconv.backends.base import Backend

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock")

# A process storing PUTS entries of its own; stacks dumped if it runs past its timeout.
_WRITER = textwrap.dedent("""
    import faulthandler, sys
    faulthandler.dump_traceback_later(50, exit=True)
    from fastconv import plancache
    plancache.environment()
    cache = plancache.PlanCache()
    tag, puts = int(sys.argv[1]), int(sys.argv[2])
    for i in range(puts):
        cache.put(f"p{tag}-{i}", {"backend": "aten", "i": i}, persist=True)
    print("stored", tag)
""")


def _spawn(code: str, *args, cache_dir) -> subprocess.Popen:
    env = dict(os.environ, FASTCONV_CACHE_DIR=str(cache_dir))
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _entries(cache_dir) -> dict:
    return json.loads((cache_dir / plancache.FILE_NAME).read_text())["entries"]


def test_concurrent_processes_lose_no_entries(tmp_path):
    """Four processes saving at once (each save merges the file on disk with its own): every
    entry of every process is in the file at the end (without the lock about half were lost)."""
    procs = [_spawn(_WRITER, tag, 25, cache_dir=tmp_path) for tag in range(4)]
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "stored" in out, err[-3000:]
    entries = _entries(tmp_path)
    assert sorted(entries) == sorted(f"p{t}-{i}" for t in range(4) for i in range(25))
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_a_held_lock_skips_the_save_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTCONV_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(plancache, "LOCK_TIMEOUT_S", 0.2)
    monkeypatch.setattr(plancache, "SAVE_SPACING_S", 0.0)  # every put saves
    cache = plancache.PlanCache()
    cache.put("before", {"i": 0}, persist=True)
    with plancache._file_lock(str(tmp_path / plancache.FILE_NAME) + ".lock"):
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cache.put("during", {"i": 1}, persist=True)
            cache.put("during2", {"i": 2}, persist=True)
        assert time.perf_counter() - t0 < 2
    assert len(caught) == 1 and "cannot write the plan cache" in str(caught[0].message)
    assert "TimeoutError" in str(caught[0].message)
    assert cache.get("during") == {"i": 1}  # kept in memory
    assert sorted(_entries(tmp_path)) == ["before"]
    cache.put("after", {"i": 3}, persist=True)  # lock free again: saved, with the rest
    assert sorted(_entries(tmp_path)) == ["after", "before", "during", "during2"]


def test_saves_are_spaced_and_the_last_entries_saved_at_exit(tmp_path, monkeypatch):
    """Puts sooner than SAVE_SPACING_S after a save wait for the next save (a later put, a
    flush, a clear) or the process's exit; memory has them at once."""
    monkeypatch.setenv("FASTCONV_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(plancache, "SAVE_SPACING_S", 60.0)
    cache = plancache.PlanCache()
    cache.put("a", {"i": 0}, persist=True)
    cache.put("b", {"i": 1}, persist=True)
    assert sorted(_entries(tmp_path)) == ["a"] and cache.get("b") == {"i": 1}
    monkeypatch.setattr(plancache, "SAVE_SPACING_S", 0.0)
    cache.put("c", {"i": 2}, persist=True)
    assert sorted(_entries(tmp_path)) == ["a", "b", "c"]
    monkeypatch.setattr(plancache, "SAVE_SPACING_S", 60.0)
    cache.put("d", {"i": 3}, persist=True)
    cache.clear()  # memory only: what waits is saved first
    assert sorted(_entries(tmp_path)) == ["a", "b", "c", "d"]
    code = _WRITER.replace("plancache.environment()",
                           "plancache.environment(); plancache.SAVE_SPACING_S = 60.0")
    proc = _spawn(code, 7, 5, cache_dir=tmp_path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "stored" in out, err[-3000:]
    assert {f"p7-{i}" for i in range(5)} <= set(_entries(tmp_path))


def test_the_lock_of_a_killed_process_is_released(tmp_path, monkeypatch):
    holder = _spawn(textwrap.dedent("""
        import sys, time
        from fastconv import plancache
        with plancache._file_lock(sys.argv[1]):
            print("locked", flush=True)
            time.sleep(60)
    """), str(tmp_path / plancache.FILE_NAME) + ".lock", cache_dir=tmp_path)
    assert holder.stdout.readline().strip() == "locked"
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    monkeypatch.setenv("FASTCONV_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(plancache, "LOCK_TIMEOUT_S", 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plancache.PlanCache().put("k", {"i": 0}, persist=True)
    assert list(_entries(tmp_path)) == ["k"]


@pytest.mark.parametrize("value", ["", "off", "OFF", "0", "false", "False", "no", "none"])
def test_false_words_turn_the_disk_cache_off(value, monkeypatch):
    monkeypatch.setenv("FASTCONV_CACHE_DIR", value)
    assert plancache.cache_dir() is None


def test_the_cache_dir_expands_the_home_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("FASTCONV_CACHE_DIR", "~/fc")
    assert plancache.cache_dir() == str(tmp_path / "fc")
    plancache.PlanCache().put("k", {"i": 1}, persist=True)
    assert (tmp_path / "fc" / plancache.FILE_NAME).exists()


# ---------------------------------------------------------------- the shipped tuning database
_DB_KEY = {"gpu": "NVIDIA Test GPU", "capability": "(9, 0)", "candidates": "6",
           "triton": "3.6", "cudnn": "919"}


@pytest.fixture
def database(monkeypatch, tmp_path):
    """A database file for a fake GPU, found through FASTCONV_TUNING_DB; this machine
    claims to be that GPU."""
    monkeypatch.setattr(plancache, "database_key", lambda: dict(_DB_KEY))
    path = tmp_path / "db.json"
    monkeypatch.setenv("FASTCONV_TUNING_DB", str(path))
    monkeypatch.setenv("FASTCONV_CACHE_DIR", str(tmp_path / "user"))

    def write(key=_DB_KEY, entries=None, text=None):
        path.write_text(text if text is not None else json.dumps(
            {"format": plancache.FORMAT, "key": key,
             "entries": entries if entries is not None else {"k|eager": {"backend": "aten"}}}))
    return write


def test_the_database_answers_below_the_user_store_marked_partial(database):
    database()
    cache = plancache.PlanCache(database=True)
    assert cache.get("k|eager") == {"backend": "aten", "partial": True, "source": "database"}
    assert plancache.PlanCache().get("k|eager") is None  # only where asked for (choices)
    cache.put("k|eager", {"backend": "triton"}, persist=True)  # the user's own: overrides
    again = plancache.PlanCache(database=True)
    assert again.get("k|eager") == {"backend": "triton", "used": again._load()["k|eager"]["used"]}


@pytest.mark.parametrize("field,value", [("gpu", "NVIDIA Other"), ("candidates", "5"),
                                         ("triton", "3.5"), ("capability", "(8, 0)")])
def test_a_database_for_another_gpu_or_versions_is_ignored_with_one_warning(database, field,
                                                                            value):
    database(key=dict(_DB_KEY, **{field: value}))
    cache = plancache.PlanCache(database=True)
    match = f"ignoring the tuning database .*{field} {re.escape(value)}"
    with pytest.warns(RuntimeWarning, match=match):
        assert cache.get("k|eager") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning, not one per lookup
        assert cache.get("k|other") is None


@pytest.mark.parametrize("text", ["{", "[]", '{"format": 1, "entries": {}}'])
def test_a_corrupt_database_is_ignored_with_one_warning(database, text):
    database(text=text)
    with pytest.warns(RuntimeWarning, match="ignoring the tuning database"):
        assert plancache.PlanCache(database=True).get("k|eager") is None


def test_the_database_can_be_turned_off(database, monkeypatch):
    database()
    monkeypatch.setenv("FASTCONV_TUNING_DB", "off")
    assert plancache.PlanCache(database=True).get("k|eager") is None


def test_dispatch_uses_a_database_choice_within_a_budget_and_retimes_it_exhaustively(
        database, monkeypatch):
    """A budgeted call takes the database's choice without timing anything; exhaustive
    tuning times the problem and stores its own choice, which then wins."""
    from fastconv import dispatch

    x, w = torch.randn(2, 3, 9, 7), torch.randn(4, 3, 3, 3)
    problem = dataclasses.replace(
        fastconv.ConvProblem.from_tensors(x, w, None, padding=1, rank=2), device="cuda")
    key = dispatch.store.cache_key(problem, "auto", "benchmark", "fprop", False,
                              dispatch.store.cost_name(False, False))
    database(entries={key: {"backend": "aten", "config": None, "ms": 7.0}})
    monkeypatch.setattr(dispatch.store, "CACHE", plancache.PlanCache(database=True))
    monkeypatch.setattr(dispatch.policy, "supported", lambda p, det=False: {"aten": []})
    timed = []

    def fake_costs(fn):  # (GPU ms, host ms)
        fn()
        timed.append(fn)
        return 0.5, 0.25
    monkeypatch.setattr(dispatch.timing, "time_costs", fake_costs)
    monkeypatch.setattr(dispatch.budget, "TUNING", dispatch.TuningBudget(1.0, 8.0))
    choice = dispatch.choose(problem, run=lambda cls, config: None, mode="benchmark")
    assert (choice.backend, choice.ms, timed) == ("aten", 7.0, [])  # no timing at all
    monkeypatch.setattr(dispatch.budget, "TUNING", dispatch.TuningBudget())  # exhaustive
    choice = dispatch.choose(problem, run=lambda cls, config: None, mode="benchmark")
    assert len(timed) == 1 and choice.ms == 0.75  # timed: its own choice now
    assert "source" not in dispatch.CACHE.get(key)


def test_the_shipped_databases_are_well_formed():
    """Every file in the package's database directory parses, names its key fields and holds
    current-format choices only."""
    files = [f for f in os.listdir(plancache.DATABASE_DIR) if f.endswith(".json")]
    assert files
    for name in files:
        with open(os.path.join(plancache.DATABASE_DIR, name), encoding="utf-8") as f:
            data = json.load(f)
        assert data["format"] == plancache.FORMAT and set(data["key"]) == set(_DB_KEY)
        assert data["key"]["candidates"] == str(plancache.CANDIDATES_REVISION), name
        assert data["entries"] and all(k.rsplit("|", 1)[1] in ("eager", "graph", "eager+grad",
                                                                "graph+grad")
                                       for k in data["entries"])


class _Tile(Backend):
    """A fake backend with one configuration."""
    NAME = "tile"
    SUPPORTED_DTYPES = frozenset({torch.float32})
    SUPPORTED_DEVICES = frozenset({"cpu", "cuda"})

    @classmethod
    def candidates(cls, problem, op="fprop"):
        return ["t"]


#: a database entry choosing ``_Tile``'s configuration
_TILE_CHOICE = {"backend": "tile", "config": "t", "ms": 0.1}


def _stored(database, monkeypatch, entry: dict, ks=(4,)):
    """CUDA problems with ``ks`` output channels (a 2x3x9x7 input, 3x3 kernels) and their
    eager benchmark keys; the database holds ``entry`` for each, read by dispatch's cache."""
    from fastconv import dispatch

    problems = [dataclasses.replace(fastconv.ConvProblem.from_tensors(
        torch.randn(2, 3, 9, 7), torch.randn(k, 3, 3, 3), None, padding=1, rank=2),
        device="cuda") for k in ks]
    keys = [dispatch.store.cache_key(p, "auto", "benchmark", "fprop", False, "eager")
            for p in problems]
    database(entries={k: dict(entry) for k in keys})
    monkeypatch.setattr(dispatch.store, "CACHE", plancache.PlanCache(database=True))
    return problems, keys


def test_a_database_choice_runs_once_inside_the_budget_or_gives_way_to_aten(database,
                                                                            monkeypatch):
    """The first use of a database choice runs it once (compiling it) and charges that to
    the tuning budget; once the process's budget is spent, a choice that needs more than
    aten is not taken (the new-problem rule applies: aten, run untimed)."""
    from fastconv import backends, dispatch

    monkeypatch.setitem(backends.REGISTRY, "tile", _Tile)
    monkeypatch.setattr(dispatch.policy, "supported", lambda p, det=False: {"aten": [], "tile": []})
    now = [0.0]
    monkeypatch.setattr(dispatch.timing, "clock", lambda: now[0])
    ran = []

    def run(cls, config):
        ran.append(cls.NAME)
        now[0] += 3.0  # a compilation
    monkeypatch.setattr(dispatch.timing, "time_costs", lambda fn: (fn(), (1.0, 0.0))[1])
    problems, _ = _stored(database, monkeypatch, _TILE_CHOICE, ks=(4, 6, 8))
    monkeypatch.setattr(dispatch.budget, "TUNING", dispatch.TuningBudget(1.0, 5.0))
    got = [dispatch.choose(p, run=run, mode="benchmark").backend for p in problems]
    # 0 -> 3 s, 3 -> 6 s: both adopted (run once each); then spent: aten for the third,
    # not timed (nothing charged)
    assert got == ["tile", "tile", "aten"] and ran == ["tile", "tile"]
    assert dispatch.TUNING.spent_s == 6.0
    ran.clear()
    assert dispatch.choose(problems[0], run=run, mode="benchmark").backend == "tile"
    assert ran == []  # adopted once: no second run


def test_database_choices_of_a_backend_missing_here_are_tuned_anew_with_one_warning(
        database, monkeypatch):
    """The database is measured with every backend installed. Where one is not (the cuDNN
    frontend is an optional extra), its choices are decided again as new problems, with one
    warning naming the backend and why, not one per problem."""
    from fastconv import backends, dispatch

    class _Missing(_Tile):
        @classmethod
        def available(cls):
            return False, "the package is not installed"
    monkeypatch.setitem(backends.REGISTRY, "tile", _Missing)
    monkeypatch.setattr(dispatch.policy, "supported", lambda p, det=False: {
        "aten": [], "tile": ["tile is unavailable: the package is not installed"]})
    monkeypatch.setattr(dispatch.upgrades, "WARNED_MISSING", set())
    monkeypatch.setattr(dispatch.timing, "time_costs", lambda fn: (fn(), (1.0, 0.0))[1])
    problems, _ = _stored(database, monkeypatch, _TILE_CHOICE, ks=(4, 6))
    monkeypatch.setattr(dispatch.budget, "TUNING", dispatch.TuningBudget(1.0, 5.0))
    ran = []

    def run(cls, config):
        ran.append(cls.NAME)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [dispatch.choose(p, run=run, mode="benchmark").backend for p in problems]
    assert got == ["aten", "aten"] and ran == ["aten", "aten"]  # each timed as a new problem
    assert [str(w.message) for w in caught] == [
        "fastconv: the tuning database's choices for backend 'tile' are not used here (the "
        "package is not installed): those problems are tuned as new ones"]


@pytest.mark.parametrize("backend", [["aten"], None, "nope"])
def test_a_database_entry_naming_no_backend_is_refused_and_decided_anew(database, monkeypatch,
                                                                          backend):
    """An entry whose backend is not a registered backend's name (a hand-edited or corrupt
    file) is dropped with a warning, and the problem decided as a new one."""
    from fastconv import dispatch

    monkeypatch.setattr(dispatch.policy, "supported", lambda p, det=False: {"aten": []})
    monkeypatch.setattr(dispatch.timing, "time_costs", lambda fn: (fn(), (1.0, 0.0))[1])
    (problem,), (key,) = _stored(database, monkeypatch, {"backend": backend, "config": None})
    monkeypatch.setattr(dispatch.budget, "TUNING", dispatch.TuningBudget(1.0, 5.0))
    ran = []
    with pytest.warns(RuntimeWarning, match="ignoring the stored plan"):
        choice = dispatch.choose(problem, run=lambda cls, config: ran.append(cls.NAME),
                                 mode="benchmark")
    assert choice.backend == "aten" and ran == ["aten"]


def test_a_database_choice_compiling_in_the_background_runs_aten_meanwhile(database,
                                                                            monkeypatch):
    """A database choice whose kernels a backend compiles in the background: aten runs the
    calls made before they are built (a provisional choice, not stored), the choice is
    adopted at the first call after, and ``finish_builds`` waits for them."""
    import concurrent.futures as cf
    import threading

    from fastconv import backends, dispatch

    build = cf.Future()
    started = []

    class _Building(_Tile):
        @classmethod
        def compile_ahead(cls, run):
            started.append(run)
            return [build]
    monkeypatch.setitem(backends.REGISTRY, "tile", _Building)
    monkeypatch.setattr(dispatch.policy, "supported", lambda p, det=False: {"aten": [], "tile": []})
    monkeypatch.setattr(dispatch.upgrades, "AHEAD", {})
    (problem,), (key,) = _stored(database, monkeypatch, _TILE_CHOICE)
    monkeypatch.setattr(dispatch.budget, "TUNING", dispatch.TuningBudget(1.0, 5.0))
    ran = []

    def run(cls, config):
        ran.append(cls.NAME)
    for _ in range(2):
        choice = dispatch.choose(problem, run=run, mode="benchmark")
        # (cuDNN's heuristic plan: aten.PROVISIONAL, tested below)
        assert (choice.backend, choice.config, choice.provisional) == \
            ("aten", "provisional", True)
    assert len(started) == 1 and ran == []  # one build started; nothing timed or run
    assert dispatch.CACHE.get(key)["source"] == "database"  # still to be adopted
    threading.Timer(0.05, build.set_result, ["built"]).start()
    assert dispatch.finish_builds(timeout=10)
    choice = dispatch.choose(problem, run=run, mode="benchmark")
    assert (choice.backend, choice.provisional, ran) == ("tile", False, ["tile"])
    assert "source" not in dispatch.CACHE.get(key)


@pytest.mark.parametrize("benchmark", [True, False])
@pytest.mark.parametrize("fails", [False, True])
def test_the_provisional_aten_plan_runs_without_the_benchmark_search(benchmark, fails):
    """aten.PROVISIONAL (what a database choice runs while its kernels compile) computes
    the convolution and its epilogue as the default aten plan does, with cudnn.benchmark off
    during the call; where it was on, cudnn.deterministic is on as well (a plan-cache key of
    its own), and both flags are restored afterwards, also when the call raises."""
    from fastconv.backends import aten
    from fastconv.epilogue import Epilogue

    x, w, b = torch.randn(2, 3, 9, 7), torch.randn(4, 3, 3, 3), torch.randn(4)
    problem = fastconv.ConvProblem.from_tensors(x, w, b, padding=1, rank=2,
                                                epilogue=Epilogue(activation="relu"))
    seen = []
    plain = aten.AtenBackend.bind(problem, None)
    run = aten._heuristic(lambda *a: seen.append(
        (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic))
        or (1 / 0 if fails else plain(*a)))
    saved = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    try:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = benchmark, False
        args = (x, w, b, None, None, None, None)
        if fails:
            with pytest.raises(ZeroDivisionError):
                run(*args)
        else:
            torch.testing.assert_close(run(*args), plain(*args), rtol=0, atol=0)
            torch.testing.assert_close(
                aten.AtenBackend.bind(problem, aten.PROVISIONAL)(*args),
                torch.relu(torch.nn.functional.conv2d(x, w, b, padding=1)))
        assert seen == [(False, benchmark)]
        assert (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic) == \
            (benchmark, False)
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved


@pytest.mark.parametrize("benchmark", [True, False])
@pytest.mark.parametrize("fails", [False, True])
def test_aten_runs_searched_plans_whatever_the_users_flag(benchmark, fails):
    """aten._searched (how aten runs on the GPU in benchmark dispatch mode) has
    cudnn.benchmark on during the call and leaves the user's flag as it was after it, also
    when the call raises: aten is then the implementation dispatch timed and the database
    stored, whichever flag the user set."""
    from fastconv.backends import aten

    seen = []

    def run(*args):
        seen.append(torch.backends.cudnn.benchmark)
        if fails:
            raise ZeroDivisionError
        return args
    saved = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = benchmark
        if fails:
            with pytest.raises(ZeroDivisionError):
                aten._searched(run)(1, 2)
        else:
            assert aten._searched(run)(1, 2) == (1, 2)
        assert seen == [True] and torch.backends.cudnn.benchmark == benchmark
    finally:
        torch.backends.cudnn.benchmark = saved


def test_aten_binds_searched_heuristic_or_plain_plans_by_mode_and_config():
    """On the GPU aten binds a searched plan in benchmark mode, cuDNN's heuristic plan for
    a provisional choice, the caller's flags in heuristic mode and on the CPU (nothing to
    run here: the bound functions are told apart by what they wrap them in)."""
    from fastconv import dispatch
    from fastconv.backends import aten

    cpu = fastconv.ConvProblem.from_tensors(torch.randn(2, 3, 9, 7), torch.randn(4, 3, 3, 3),
                                            None, padding=1, rank=2)
    gpu = dataclasses.replace(cpu, device="cuda")
    bind = aten.AtenBackend.bind
    with dispatch.settings("benchmark"):
        assert bind(gpu, None).__name__ == "run_searched"
        assert bind(gpu, None, "dgrad").__name__ == "run_searched"
        assert bind(gpu, aten.PROVISIONAL).__name__ == "run_heuristic"
        assert bind(cpu, None).__name__ == "run_bare"
    with dispatch.settings("heuristic"):
        assert bind(gpu, None).__name__ == "run_bare"
