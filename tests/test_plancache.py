"""The on-disk plan cache shared by processes: no lost entries, no blocking, no stale lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from fastconv import plancache

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
