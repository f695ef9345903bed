"""``fastconv plans --export FILE`` / ``--import FILE``: moving the disk caches (dispatch
choices and serialized cuDNN plans) between machines and containers of one environment."""

from __future__ import annotations

import json

import pytest

from fastconv import dispatch, plancache
from fastconv.backends import cudnn
from fastconv.tools import cli


@pytest.fixture
def stores(monkeypatch, tmp_path):
    """Fresh stores on a cache directory of this test; ``use(name)`` switches directory (a
    new machine: new store objects)."""
    def use(name):
        monkeypatch.setenv("FASTCONV_CACHE_DIR", str(tmp_path / name))
        monkeypatch.setattr(dispatch.store, "CACHE", plancache.PlanCache())
        monkeypatch.setattr(cudnn, "PLANS", plancache.PlanCache(file_name="cudnn-plans-v1.json"))
    use("a")
    return use


def test_export_then_import_round_trips_both_stores(stores, tmp_path, capsys):
    dispatch.CACHE.put("k1", {"backend": "aten", "config": None, "ms": 0.1}, persist=True)
    dispatch.CACHE.put("k2", {"backend": "triton", "config": "x"}, persist=True)
    dispatch.CACHE.put("memory-only", {"backend": "aten"})  # never persisted: not exported
    cudnn.PLANS.put("p1", {"recipe": [1, 2], "sha256": "ab"}, persist=True)
    out = tmp_path / "plans.json"
    assert cli.main(["plans", "--export", str(out)]) == 0
    assert "2 dispatch choices, 1 serialized cuDNN plans written" in capsys.readouterr().out
    stores("b")
    assert dispatch.CACHE.get("k1") is None
    assert cli.main(["plans", "--import", str(out)]) == 0
    assert "2 dispatch choices, 1 serialized cuDNN plans merged" in capsys.readouterr().out
    stores("b")  # a new process on machine b reads them from its disk
    assert dispatch.CACHE.get("k1")["backend"] == "aten"
    assert dispatch.CACHE.get("k2")["config"] == "x"
    assert dispatch.CACHE.get("memory-only") is None
    assert cudnn.PLANS.get("p1")["recipe"] == [1, 2]


def test_import_keeps_what_the_machine_already_has(stores, tmp_path):
    dispatch.CACHE.put("shared", {"backend": "aten", "ms": 1.0}, persist=True)
    out = tmp_path / "plans.json"
    assert cli.main(["plans", "--export", str(out)]) == 0
    stores("b")
    dispatch.CACHE.put("own", {"backend": "triton"}, persist=True)
    assert cli.main(["plans", "--import", str(out)]) == 0
    stores("b")
    assert dispatch.CACHE.get("own") is not None and dispatch.CACHE.get("shared") is not None


@pytest.mark.parametrize("damage", ["environment", "format", "not json", "other tool",
                                    "cudnn part"])
def test_a_foreign_or_damaged_export_is_refused_and_nothing_merged(stores, tmp_path, capsys,
                                                                   damage):
    dispatch.CACHE.put("k1", {"backend": "aten"}, persist=True)
    out = tmp_path / "plans.json"
    assert cli.main(["plans", "--export", str(out)]) == 0
    doc = json.loads(out.read_text())
    if damage == "environment":
        doc["stores"][0]["environment"] = dict(doc["stores"][0]["environment"], gpu="Other")
        out.write_text(json.dumps(doc))
    elif damage == "format":
        doc["stores"][0]["format"] = 99
        out.write_text(json.dumps(doc))
    elif damage == "cudnn part":  # the second store's part: the first is not merged either
        doc["stores"][1]["format"] = 99
        out.write_text(json.dumps(doc))
    elif damage == "not json":
        out.write_text("{half a file")
    else:
        out.write_text(json.dumps({"entries": {}}))
    stores("b")
    capsys.readouterr()
    assert cli.main(["plans", "--import", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err
    if damage == "environment":
        assert "another environment" in err and "Other" in err
    stores("b")
    assert dispatch.CACHE.get("k1") is None


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "terminal"])
def test_export_and_import_show_a_progress_bar_on_a_terminal_only(stores, tmp_path, capsys,
                                                                  monkeypatch, tty):
    """Each store read, checked, merged and the file written is a step of a progress bar
    on a terminal; piped, stderr stays empty (the commands take milliseconds, and scripts
    read their output)."""
    from fastconv.tools import progress

    steps = []
    real = progress.Bar.advance

    def advance(self, label):
        steps.append(label)
        real(self, label)
    monkeypatch.setattr(progress.Bar, "advance", advance)
    monkeypatch.setattr("sys.stderr.isatty", lambda: tty)
    dispatch.CACHE.put("k1", {"backend": "aten", "config": None, "ms": 0.1}, persist=True)
    out = tmp_path / "plans.json"
    assert cli.main(["plans", "--export", str(out)]) == 0
    stores("b")
    assert cli.main(["plans", "--import", str(out)]) == 0
    assert steps == ["reading the dispatch choices", "reading the serialized cuDNN plans",
                     f"writing {out}", f"reading {out}", "checking the dispatch choices",
                     "checking the serialized cuDNN plans", "merging 1 dispatch choices",
                     "merging 0 serialized cuDNN plans"]
    err = capsys.readouterr().err
    assert (err != "") == tty
