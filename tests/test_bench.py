"""The benchmark tooling on the CPU: runner logic with a fake timer, the JSON schema, the CPU
correctness-only mode, compare and the regression gate."""

import json

import pytest
import torch

from fastconv.precision import Precision
from fastconv.tools import cli
from fastconv.tools.bench import compare, report, runner, suites, timers

ROW_KEYS = {"case", "provider", "precision", "mode", "ms_p50", "ms_p20", "ms_p80", "tflops",
            "gbps", "rel_err"}


class FakeTimer(runner.GpuTimer):
    """Provider-dependent, deterministic 'timings': torch 2 ms, fastconv 1 ms (its
    ``eager_rounds`` is the runner's own)."""

    def __init__(self):
        self.calls = []

    def eager(self, fns, reps):
        for fn in fns:
            fn()  # the runner must hand over runnable calls
        self.calls.append(reps)
        return [self.ms] * reps

    def graph(self, fns):
        return [self.ms / 2] * 3


def _rows_with(timer_ms):
    case = suites.shrink(suites.get("seed000")[1])  # conv + bias + relu
    rows = []
    for provider, ms in timer_ms.items():
        timer = FakeTimer()
        timer.ms = ms
        rows += runner.run_case(case, [provider], Precision.IEEE, "nchw", reps=21,
                                device="cpu", timer=timer)
        assert timer.calls == [5] * timers.ROUNDS  # 21 calls or more, in rounds
    return rows


def test_providers_eager_timings_are_interleaved_in_rounds():
    """One provider timed in one stretch reads the host's drift as a difference between
    providers: every provider is timed in each of ROUNDS rounds, each first in turn."""
    order = []

    class Recording(runner.GpuTimer):
        def eager(self, fns, reps):
            order.append((fns[0](), reps))
            return [1.0] * reps

    times = Recording().eager_rounds({"a": [lambda: "a"], "b": [lambda: "b"],
                                      "c": [lambda: "c"]}, reps=10, rounds=4)
    assert [k for k, _ in order] == list("abc" "bca" "cab" "abc")
    assert {n for _, n in order} == {3} and all(len(t) == 12 for t in times.values())


def test_runner_rows_follow_the_schema_and_the_timer():
    rows = _rows_with({"torch": 2.0, "fastconv": 1.0, "fastconv_triton": 4.0})
    for r in rows:
        assert ROW_KEYS <= set(r), r
        assert r["rel_err"] < 1e-5
        assert r["tflops"] == pytest.approx(r["flops"] / r["ms_p50"] / 1e9)
    sp = report.speedups(rows)
    assert sp["fastconv"]["geomean"] == pytest.approx(2.0)
    assert sp["fastconv_triton"]["geomean"] == pytest.approx(0.5)
    assert report.speedups(rows, field="graph_ms_p50")["fastconv"]["geomean"] == pytest.approx(2)
    assert "geomean speed-up of fastconv over torch: eager 2.000x" in report.table(rows)


def test_written_json_has_meta_and_rows(tmp_path):
    rows = _rows_with({"torch": 2.0, "fastconv": 1.0})
    doc = {"meta": report.environment({"ieee_tflops": 1.0}, "seed000"), "rows": rows}
    paths = report.write(doc, tmp_path, "seed000-test")
    loaded = json.loads(paths[0].read_text())
    for key in ("suite", "gpu", "torch", "triton", "cudnn", "fastconv", "git_sha", "date",
                "ceilings"):
        assert key in loaded["meta"]
    assert loaded["rows"] == json.loads(json.dumps(rows))
    assert paths[1].read_text().count("\n") == len(rows) + 1  # CSV header + rows


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only mode")
def test_cpu_bench_marks_timings_not_measured(tmp_path, capsys):
    rc = cli.main(["bench", "--suite", "seed000", "--precision", "ieee", "--out",
                   str(tmp_path)])
    assert rc == 0
    assert "No GPU found" in capsys.readouterr().out
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert doc["rows"] and all(r["ms_p50"] is None and r["timing"].startswith("not measured")
                               for r in doc["rows"])
    assert all(r["rel_err"] < 1e-5 for r in doc["rows"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only mode")
def test_a_run_cut_short_leaves_the_cases_it_finished(tmp_path, monkeypatch):
    """Before each case the rows so far are written to a partial file (a device call's
    timeout kills the bench mid-suite: everything measured before was lost); a run that
    ends writes its own files and removes the partial one."""
    from fastconv.tools.bench import runner

    real, calls = runner.run_case, []

    def third_fails(case, *args, **kwargs):
        calls.append(case.name)
        if len(calls) == 3:
            raise RuntimeError("killed")
        return real(case, *args, **kwargs)

    monkeypatch.setattr(runner, "run_case", third_fails)
    assert cli.main(["bench", "--suite", "seed002_conv1d", "--precision", "ieee", "--provider",
                     "torch", "--cpu-cases", "4", "--out", str(tmp_path)]) != 0
    partial = list(tmp_path.glob("partial-*.json"))
    assert len(partial) == 1 and not list(tmp_path.glob("seed002*.json"))
    doc = json.loads(partial[0].read_text())
    assert [r["case"] for r in doc["rows"]] == calls[:2]
    assert doc["meta"]["suite"] == "seed002_conv1d"
    monkeypatch.setattr(runner, "run_case", real)
    assert cli.main(["bench", "--suite", "seed002_conv1d", "--precision", "ieee", "--provider",
                     "torch", "--cpu-cases", "4", "--out", str(tmp_path)]) == 0
    assert not list(tmp_path.glob("partial-*")) and list(tmp_path.glob("seed002*.json"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only mode")
def test_unavailable_provider_is_skipped_with_the_reason(tmp_path, capsys):
    assert cli.main(["bench", "--provider", "torch,cudnn_fe", "--cpu-cases", "1",
                     "--precision", "ieee", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "skipping provider cudnn_fe: no CUDA GPU" in out
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert {r["provider"] for r in doc["rows"]} == {"torch"}
    assert cli.main(["bench", "--provider", "nope", "--out", str(tmp_path)]) == 2
    assert "allowed:" in capsys.readouterr().out


def _doc(ms):
    return {"meta": {"suite": "s"}, "rows": [
        {"case": c, "provider": "fastconv", "precision": "bf16", "mode": "fwd",
         "layout": "nhwc", "ms_p50": v} for c, v in ms.items()]}


def test_deltas_and_regressions():
    old = _doc({"a": 1.0, "b": 2.0, "gone": 1.0})["rows"]
    new = _doc({"a": 1.04, "b": 2.4, "new": 1.0})["rows"]
    ds = compare.deltas(old, new)
    assert [d.key[0] for d in ds] == ["a", "b"]
    assert ds[0].pct == pytest.approx(4.0) and ds[1].pct == pytest.approx(20.0)
    assert [d.key[0] for d in compare.regressions(ds, 5)] == ["b"]
    assert "REGRESSION" in compare.format_deltas(ds, 5)


def test_fail_if_regression_exits_non_zero(tmp_path):
    old, slower, same = tmp_path / "old.json", tmp_path / "slower.json", tmp_path / "same.json"
    old.write_text(json.dumps(_doc({"a": 1.0, "b": 1.0})))
    slower.write_text(json.dumps(_doc({"a": 1.0, "b": 1.06})))
    same.write_text(json.dumps(_doc({"a": 0.99, "b": 1.04})))
    assert cli.main(["compare", str(old), str(slower), "--fail-if-regression", "5"]) == 3
    assert cli.main(["compare", str(old), str(same), "--fail-if-regression", "5"]) == 0
    assert cli.main(["compare", str(old), str(slower)]) == 0  # deltas only, no gate


def test_compare_rejects_a_foreign_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(Exception, match="not a fastconv bench result"):
        compare.load(bad)


def test_shrunk_cases_stay_valid():
    for cases in suites.SUITES.values():
        for case in cases:
            small = suites.shrink(case)
            assert small.c <= 8 * small.groups and small.n == 1
            for s, k in zip(small.spatial, small.kernel):
                assert s + 2 * small.padding >= small.dilation * (k - 1) + 1


def test_plots_are_written_and_not_empty(tmp_path):
    from fastconv.tools.bench.plot import plot

    rows = _rows_with({"torch": 2.0, "fastconv": 1.0, "fastconv_triton": 3.0})
    doc = {"meta": {"suite": "seed000", "gpu": "fake",
                    "ceilings": {"ieee_tflops": 50.0, "hbm_gbps": 3000.0}}, "rows": rows}
    paths = plot(doc, tmp_path, "seed000-test")
    assert [p.name for p in paths] == ["seed000-test-speedup.png", "seed000-test-roofline.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    assert plot({"meta": {}, "rows": [dict(r, ms_p50=None) for r in rows]}, tmp_path, "x") == []


@pytest.mark.slow
def test_torch_compile_row_reports_its_compile_time():
    case = suites.shrink(suites.get("seed000")[1])
    timer = FakeTimer()
    timer.ms = 1.0
    (row,) = runner.run_case(case, ["torch_compile"], Precision.IEEE, "nchw", reps=5,
                             device="cpu", timer=timer)
    assert "error" not in row, row.get("error")
    assert row["compile_s"] > 0 and row["rel_err"] < 1e-5


@pytest.mark.parametrize("mode", ["bwd", "train"])
@pytest.mark.parametrize("suite", ["seed000", "transposed"])
def test_backward_modes_time_gradients_and_check_them(suite, mode):
    """bwd rows time the data + weight gradient, train rows forward + backward; their error
    covers every gradient, their FLOP count is 2x / 3x the forward's."""
    case = suites.shrink(suites.get(suite)[-1])
    rows = {}
    for provider, ms in {"torch": 2.0, "fastconv_triton": 1.0}.items():
        timer = FakeTimer()
        timer.ms = ms
        (rows[provider],) = runner.run_case(case, [provider], Precision.IEEE, "nchw", reps=3,
                                            device="cpu", timer=timer, mode=mode)
    (fwd,) = runner.run_case(case, ["torch"], Precision.IEEE, "nchw", device="cpu",
                             mode="fwd")
    for r in rows.values():
        assert "error" not in r, r.get("error")
        assert r["mode"] == mode and r["rel_err"] < 1e-5
        assert r["flops"] == fwd["flops"] * (2 if mode == "bwd" else 3)
    assert "dgrad=triton" in rows["fastconv_triton"]["choice"]
    assert "wgrad=triton" in rows["fastconv_triton"]["choice"]
    assert report.speedups(list(rows.values()))["fastconv_triton"]["geomean"] == \
        pytest.approx(2.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only mode")
def test_cli_modes_write_one_file_per_mode(tmp_path):
    assert cli.main(["bench", "--suite", "transposed", "--mode", "fwd,train", "--cpu-cases",
                     "1", "--provider", "torch,fastconv_triton", "--precision", "ieee",
                     "--out", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.glob("*.json"))
    assert len(names) == 2 and "-train-" in names[1] and "-train-" not in names[0]
    assert cli.main(["bench", "--mode", "sideways", "--out", str(tmp_path)]) == 2


@pytest.mark.parametrize("mode", ["dgrad", "wgrad"])
def test_gradient_modes_time_one_kernel(mode):
    case = suites.shrink(suites.get("resnet50")[2])  # 3x3
    timer = FakeTimer()
    timer.ms = 1.0
    rows = runner.run_case(case, ["torch", "fastconv_triton"], Precision.IEEE, "nchw",
                           reps=3, device="cpu", timer=timer, mode=mode)
    for r in rows:
        assert "error" not in r, r.get("error")
        assert r["rel_err"] < 1e-5
    assert rows[1]["choice"] == f"{mode}=triton:m32n16k16w4s1"
    (bad,) = runner.run_case(suites.shrink(suites.get("transposed")[0]), ["torch"],
                             Precision.IEEE, "nchw", device="cpu", mode=mode)
    assert "transposed" in bad["error"]


def test_roofline_percent_uses_the_tighter_floor():
    rows = [dict(precision="bf16", flops=2e12, min_bytes=1e9, ms_p50=10.0),  # compute-bound
            dict(precision="bf16", flops=1e9, min_bytes=4e9, ms_p50=2.0),    # memory-bound
            dict(precision="bf16", flops=1e9, min_bytes=1e9, ms_p50=None)]   # not timed
    report.add_roofline(rows, {"bf16_tflops": 800.0, "hbm_gbps": 4000.0})
    assert rows[0]["roofline_pct"] == pytest.approx(100 * 2.5 / 10)  # 2e12 / 800e12 s = 2.5 ms
    assert rows[1]["roofline_pct"] == pytest.approx(100 * 1.0 / 2)   # 4e9 / 4000e9 s = 1 ms
    assert "roofline_pct" not in rows[2]
    # depthwise rows: the compute floor at the CUDA cores' rate, not the tensor cores'
    dw = [dict(precision="bf16", flops=1e12, min_bytes=1e9, ms_p50=40.0, cuda_cores=True)]
    report.add_roofline(dw, {"bf16_tflops": 800.0, "cuda_core_tflops": 50.0,
                             "hbm_gbps": 4000.0})
    assert dw[0]["roofline_pct"] == pytest.approx(100 * 20.0 / 40)  # 1e12 / 50e12 s = 20 ms


@pytest.mark.parametrize("mode", ["train", "eval", "fwd"])
def test_conv_bn_relu_suite_modes(mode):
    """resnet50_cbr: torch's conv2d -> batch_norm -> relu against fastconv's fused layer, in
    training (batch statistics; every gradient, γ and β included, checked) and eval (the
    modules in eval mode: BatchNorm folded into the conv's weights and bias)."""
    case = suites.shrink(suites.get("resnet50_cbr")[2])  # 3x3
    assert case.bn and case.activation == "relu"
    rows = {}
    for provider, ms in {"torch": 2.0, "fastconv": 1.0}.items():
        timer = FakeTimer()
        timer.ms = ms
        (rows[provider],) = runner.run_case(case, [provider], Precision.IEEE, "nchw", reps=3,
                                            device="cpu", timer=timer, mode=mode)
    for r in rows.values():
        assert "error" not in r, r.get("error")
        assert r["rel_err"] < 1e-5, r
    assert rows["fastconv"]["choice"].startswith("aten")
    assert report.speedups(list(rows.values()))["fastconv"]["geomean"] == pytest.approx(2.0)


@pytest.mark.parametrize("suite", ["seed002_conv1d", "depthwise", "grouped", "conv1d_short"])
def test_kernel_family_suites_run_and_agree(suite):
    """The issue-7 suites: every shrunk case's fastconv and torch rows agree with float64
    (causal padding included) and carry the seed's error columns."""
    cases = suites.get(suite)
    assert len(cases) == {"seed002_conv1d": 17}.get(suite, len(cases))
    picks = [cases[0], cases[-1]] + [c for c in cases if c.causal][:1]
    for case in picks:
        rows = runner.run_case(suites.shrink(case), ["torch", "fastconv"], Precision.IEEE,
                               "nchw", device="cpu")
        for r in rows:
            assert "error" not in r, (case.name, r.get("error"))
            assert r["rel_err"] < 1e-5 and 0 < r["max_err"] and r["mean_err"] <= r["max_err"]


def test_host_suite_rows_carry_host_microseconds_per_call():
    """The host suite's rows time back-to-back calls on the wall clock (also on the CPU) and
    the table names each provider's host cost and its difference to torch's."""
    case = suites.get("host")[1]  # conv + bias + relu
    rows = runner.run_case(case, ["torch", "fastconv_aten"], Precision.IEEE, "nchw",
                           device="cpu", mode="fwd", host=True)
    for r in rows:
        assert len(r["host_us"]) == 7 and all(us > 0 for us in r["host_us"])
        assert r["host_us_p50"] == sorted(r["host_us"])[3]
    (line,) = report.host_lines(rows)
    torch_us, ours = rows[0]["host_us_p50"], rows[1]["host_us_p50"]
    assert line == (f"host us per call, host_conv_bias_relu fwd: torch {torch_us:.1f}, "
                    f"fastconv_aten {ours:.1f} ({ours - torch_us:+.1f})")
    assert line in report.table(rows)
    assert "host_us" not in runner.run_case(case, ["torch"], Precision.IEEE, "nchw",
                                            device="cpu")[0]


def test_time_host_counts_every_call():
    calls = []
    us = runner.time_host([lambda: calls.append(0), lambda: calls.append(1)], calls=10,
                          rounds=3)
    assert len(us) == 3 and len(calls) == 30 and calls[:4] == [0, 1, 0, 1]


def test_model_cases_are_named_once_and_the_zoo_runs_at_both_batches():
    """`--cases` picks by name: a name listed twice would run (and write) a model twice."""
    from fastconv.tools.bench import models

    names = [c.name for c in models.CASES]
    assert len(names) == len(set(names))
    zoo = [k for k in models.BUILDERS if k.startswith(("tv_", "timm_"))]
    assert {f"{k}_b{b}" for k in zoo for b in (32, 256)} <= set(names)
    assert all(c.batch == int(c.name.rsplit("_b", 1)[1]) for c in models.CASES
               if c.model in zoo)


def test_model_comparisons_turn_dropout_and_stochastic_depth_off():
    """A training row compares one step's output with float64: random layers must be off
    (torchvision's StochasticDepth left on gave torch itself a 0.87 relative error)."""
    torchvision = pytest.importorskip("torchvision")
    from fastconv.tools.bench import models

    net = torchvision.models.efficientnet_b0(num_classes=10).train()
    x = torch.randn(2, 3, 33, 31)
    with torch.no_grad(), models.no_dropout(net):
        first, second = net(x), net(x)
    assert torch.equal(first, second)
    assert all(m.training for m in net.modules())  # restored
    with torch.no_grad():
        assert not torch.equal(net(x), net(x))  # (on: the test can fail)


@pytest.mark.slow  # (~45 s: Mamba-1.4B's widths)
def test_the_mamba_block_case_runs_on_sequences_with_its_conv_fused():
    """The models suite's Mamba case (shrunk: batch 2, 64 positions) takes a (batch, seqlen,
    d_model) input, every provider's training-step row is within float32's error of
    float64, and optimize fuses its causal convolution."""
    from fastconv.precision import Precision
    from fastconv.tools.bench import models

    case = models.shrink(next(c for c in models.CASES if c.model == "mamba_conv"))
    rows = models.run_case(case, ["torch", "fastconv"], Precision.IEEE, "train", "cpu")
    assert all("error" not in r for r in rows), [r.get("error") for r in rows]
    assert all(r["rel_err"] < 1e-5 and "mask_agreement" not in r for r in rows)
    assert rows[1]["choice"].startswith("1 fused")


def test_choice_label_names_a_gradients_graph_choice(monkeypatch):
    """A gradient whose CUDA-graph choice differs from its eager one shows both."""
    from fastconv import ConvProblem, dispatch

    def cached(problem, backend, mode=None, op="fprop", grad=False):
        return dispatch.Choice("triton" if dispatch.current()[2] else "aten", None)

    monkeypatch.setattr(runner.dispatch, "cached", cached)
    problem = ConvProblem.from_tensors(torch.randn(1, 4, 5, 5), torch.randn(4, 1, 3, 3), None,
                                       1, 1, 1, 4, rank=2)
    assert runner._choices(problem, "auto", "wgrad") == "wgrad=aten graph:wgrad=triton"
    monkeypatch.setattr(runner.dispatch, "cached", lambda *a, **k: dispatch.Choice("aten", None))
    assert runner._choices(problem, "auto", "dgrad") == "dgrad=aten"


@pytest.mark.parametrize("mode", ["fwd", "train"])
def test_seqconv_suite_rows_check_both_providers_against_float64(mode):
    from fastconv.precision import Precision
    from fastconv.tools.bench import seqconv

    kinds = {}
    for case in seqconv.CASES:
        kinds.setdefault(case.kind, seqconv.shrink(case))
    for kind, case in kinds.items():
        rows = seqconv.run_case(case, ["fastconv", "torch", "cudnn_fe"], Precision.IEEE,
                                mode, device="cpu")
        if kind == "decode" and mode == "train":
            assert rows == []
            continue
        by = {r["provider"]: r for r in rows}
        assert "not a seqconv provider" in by["cudnn_fe"]["error"]
        for p in ("fastconv", "torch"):
            assert by[p]["rel_err"] < 1e-5, (kind, p, by[p])
            assert by[p]["min_bytes"] > 0 and by[p]["timing"].startswith("not measured")


@pytest.mark.parametrize("mode", ["fwd", "train"])
def test_seqconv_channel_last_rows_take_dim_contiguous_operands(mode, monkeypatch):
    """``…_cl`` causal cases hand the call x as a dim-contiguous view, and their rows still
    match float64."""
    import fastconv
    from fastconv.precision import Precision
    from fastconv.tools.bench import seqconv

    case = seqconv.shrink(next(c for c in seqconv.CASES if c.channel_last))
    assert case.name.endswith("_cl") and case.kind == "causal"
    seen, real = [], fastconv.causal_conv1d

    def spy(x, *args, **kwargs):
        seen.append(x.stride())
        return real(x, *args, **kwargs)
    monkeypatch.setattr(fastconv, "causal_conv1d", spy)
    rows = seqconv.run_case(case, ["fastconv", "torch"], Precision.IEEE, mode, device="cpu")
    assert all(r["rel_err"] < 1e-5 for r in rows), rows
    assert seen and all(s[1] == 1 and s[2] == case.dim for s in seen), seen


def test_seqconv_decode_rows_are_timed_in_a_graph_over_sets_larger_than_l2():
    """A decode row's graph time cycles through DECODE_SETS states of its own per provider
    (the same state each replay would sit in L2 and read faster than a model's layers);
    every set's step is the decode step (checked against torch's on the same set)."""
    from fastconv.precision import Precision
    from fastconv.tools.bench import seqconv

    case = next(c for c in seqconv.CASES if c.kind == "decode" and c.batch == 256)
    assert seqconv.DECODE_SETS * case.batch * case.dim * case.width * 2 > 60 * 2**20
    small = seqconv.shrink(case)
    seen = {}

    class Timer:
        def eager_rounds(self, fns, reps):
            return {p: [1.0, 2.0, 3.0] for p in fns}

        def graph(self, fns):
            seen[len(seen)] = [f() for f in fns]
            return [4.0, 5.0, 6.0]

    rows = seqconv.run_case(small, ["fastconv", "torch"], Precision.IEEE, "fwd", device="cpu",
                            timer=Timer(), hbm_gbps=1.0)
    assert [r["graph_ms_p50"] for r in rows] == [5.0, 5.0]
    assert rows[0]["graph_hbm_pct"] == pytest.approx(100.0 * rows[0]["min_bytes"] / 1e6 / 5.0)
    ours, theirs = seen[0], seen[1]
    assert len(ours) == seqconv.DECODE_SETS
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(ours, theirs))
    assert not torch.allclose(ours[0], ours[1])  # each set its own token and state


class _RecordingTimer:
    """A bench timer that runs every graph call once and keeps the outputs."""

    def __init__(self):
        self.seen = []

    def eager_rounds(self, fns, reps):
        return {p: [1.0, 2.0, 3.0] for p in fns}

    def graph(self, fns):
        self.seen.append([f() for f in fns])
        return [4.0, 5.0, 6.0]


@pytest.mark.parametrize("mode", ["fwd", "train"])
def test_seqconv_rows_are_timed_in_a_graph_over_operand_sets_larger_than_l2(mode, monkeypatch):
    """Causal, packed and long rows are replayed from a graph too, cycling through operand
    sets of their own whose bytes together exceed the L2 cache twice over; each set's call
    is the case's call (fastconv's output equal to torch's on the same set, sets
    differing)."""
    from fastconv import costs
    from fastconv.precision import Precision
    from fastconv.tools.bench import seqconv

    monkeypatch.setattr(costs, "L2_BYTES", 30_000)  # (the shrunk cases' size)
    for kind in ("causal", "packed", "long"):
        case = seqconv.shrink(next(c for c in seqconv.CASES if c.kind == kind))
        timer = _RecordingTimer()
        rows = seqconv.run_case(case, ["fastconv", "torch"], Precision.IEEE, mode,
                                device="cpu", timer=timer, hbm_gbps=1.0)
        seen = timer.seen
        assert [r["graph_ms_p50"] for r in rows] == [5.0, 5.0]
        moved = rows[0]["min_bytes"]
        ours, theirs = seen
        assert len(ours) == len(theirs) == costs.rotation_count(moved) > 1, kind
        assert len(ours) * moved > 2 * costs.L2_BYTES or len(ours) == 8  # (at most 8)
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(ours, theirs))
        assert not torch.allclose(ours[0], ours[1]), kind  # each set its own operands


@pytest.mark.parametrize("extra, says", [
    (["--mode", "train"], "expected at least 1 s, mode fwd"),
    (["--suite", "models"], "a convolution suite"),
    ([], "there is none here"),  # (this machine has no GPU)
])
def test_fresh_process_runs_are_refused_clearly_where_they_cannot_run(extra, says, capsys):
    args = ["bench", "--fresh", "5", "--suite", "seed002_conv1d"] + extra
    assert cli.main(args) == 2
    assert says in capsys.readouterr().out


def test_fresh_rows_print_their_ratios():
    from fastconv.tools.bench import fresh

    row = dict(case="c", first_call_s=1.5, speedup_at_1s=0.8, speedup_at_10s=5.0,
               speedup_at_end=5.1, speedup_final=5.2, triton_speedup=5.3,
               choice_10s="triton:dw")
    text = fresh.table([row, dict(case="d", error="exit 1: boom")])
    assert " 0.80x" in text and " 5.00x" in text and "triton:dw" in text
    assert "exit 1: boom" in text and "     -" in text  # (no 3 s window here)


def test_kernel_kinds_by_name():
    from fastconv.tools.bench.breakdown import kind

    assert kind("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc") \
        == "convolution"
    assert kind("_conv_dgrad_kernel") == "convolution"
    assert kind("triton_red_fused__native_batch_norm_legit_functional_convolution_0") \
        == "inductor fused"
    assert kind("_stats_partials_kernel") == "batchnorm"
    assert kind("void at::native::batch_norm_collect_statistics_channels_last_kernel") \
        == "batchnorm"
    assert kind("void at::native::(anonymous)::multi_tensor_apply_kernel<...>") == "optimizer"
    assert kind("void at::native::vectorized_elementwise_kernel<4, ...>") == "elementwise"
    assert kind("nothing we know") == "other"


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_breakdown_lists_every_fused_layer_with_its_floor(mode, monkeypatch):
    """The CPU breakdown: one step row per provider, the fused layers of resnet50 (shrunk)
    each once with how often the step runs it (53 layers in all), floors that grow with
    the work: a backward costs more FLOP and bytes than the forward alone."""
    from fastconv import batchnorm
    from fastconv.precision import Precision
    from fastconv.tools.bench import breakdown, models

    monkeypatch.setattr(batchnorm, "USE_TRITON", False)
    case = models.shrink(models.CASES[2])
    rows = breakdown.run_case(case, ["torch", "fastconv", "fastconv_cuda_graph"],
                              Precision.BF16, mode, "cpu",
                              {"bf16_tflops": 700.0, "hbm_gbps": 3000.0})
    steps = [r for r in rows if r["table"] == "step"]
    assert [r["provider"] for r in steps] == ["torch", "fastconv", "fastconv_cuda_graph"]
    assert all("error" not in r for r in rows), [r["error"] for r in rows if "error" in r]
    layer_rows = [r for r in rows if r["table"] == "layers"]
    per_layer = {(r["layer"], tuple(r["input"]), r["residual"]): r for r in layer_rows}
    assert sum(r["count"] for r in per_layer.values()) == 53
    assert {r["provider"] for r in layer_rows} == {"torch", "fastconv", "fastconv_cuda_graph"}
    assert sum(r["residual"] for r in per_layer.values()) >= 4  # each stage's last conv
    stem = next(r for r in per_layer.values() if r["input"][1] == 3)  # the 7x7 stem
    n, _, h, w = stem["input"]
    assert stem["gflop"] == pytest.approx(
        (2 if mode == "train" else 1) * 2 * n * 64 * 3 * 49 * (h // 2) * (w // 2) / 1e9)
    for r in per_layer.values():
        assert r["floor_ms"] >= r["floor_mb"] / 3000.0 / 1e3 * 0.999
        assert r["timing"] == "not measured (no GPU)"
    text = breakdown.table(rows)
    assert "layers:" in text and "step:" in text


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_layer_check_lists_each_convolution_of_the_step_once(mode):
    """The CPU layer check: one row per distinct convolution the shrunk resnet50's step ran
    (the same set as hooks on torch's own nn.Conv2d calls find), untimed without a GPU."""
    from fastconv import plans
    from fastconv.tools.bench import layercheck, models

    case = models.shrink(models.CASES[2])
    rows = layercheck.run_case(case, Precision.BF16, mode, "cpu")
    assert rows and all("error" not in r for r in rows), rows
    assert all(r["timing"] == "not measured (no GPU)" for r in rows)
    got = {(p.input_shape(), p.weight_shape(), p.stride, p.pad_pre)
           for op, _, p in ((op, g, plan.problem)
                            for op, g, plan, _ in plans.cached_plans(graph=False))
           if op == "fprop"}
    assert len(rows) == len({(r["op"], r["problem"], r["epilogue"]) for r in rows})
    # a training step's forwards are chosen with their backward: timed as layers
    assert {r["op"] for r in rows} == ({"layer"} if mode == "train" else {"fprop"})
    torch.manual_seed(0)
    net = models.BUILDERS[case.model]().train(mode == "train")
    seen = set()
    hooks = [m.register_forward_hook(lambda m, a, y: seen.add(
                 (tuple(a[0].shape), tuple(m.weight.shape), m.stride, m.padding)))
             for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        net(models.model_input(case.model, case.batch, case.size, "cpu"))
    for h in hooks:
        h.remove()
    assert got == seen


def test_layer_check_operands_take_the_steps_strides():
    """The check's operands carry the strides the step's plan was made for (a pooled input
    strided channels-last beside a row-major gradient), and the layout's where a recorded
    operand was expanded (stride 0: its random copy must not overlap itself)."""
    from fastconv.problem import ConvProblem
    from fastconv.tools.bench import layercheck

    x = torch.randn(3, 5, 1, 1)
    w = torch.randn(4, 5, 1, 1)
    problem = ConvProblem.from_tensors(x, w, None, (1, 1), ((0, 0), (0, 0)), (1, 1), 1, rank=2)
    dy, xi, _ = layercheck.operands(problem, "wgrad", "cpu", ((4, 1, 1, 1), (5, 1, 5, 5)))
    assert dy.stride() == (4, 1, 1, 1) and xi.stride() == (5, 1, 5, 5)
    dy, wi, _ = layercheck.operands(problem, "dgrad", "cpu", ((0, 1, 1, 1), (5, 1, 5, 5)))
    assert dy.stride() == (4, 1, 1, 1) and wi.stride() == (5, 1, 5, 5)
    assert torch.isfinite(dy).all() and dy.abs().sum() > 0
    xi, wi, *_ = layercheck.operands(problem, "fprop", "cpu", ((5, 1, 5, 5), (5, 1, 1, 1), None))
    assert xi.stride() == (5, 1, 5, 5) and wi.stride() == (5, 1, 1, 1)
    # what the step records: each gradient plan with its operands' strides
    from fastconv import ops, plans

    plans.clear_plans()
    x = torch.randn(15).as_strided((3, 5, 1, 1), (5, 1, 5, 5))
    geo = ([1, 1], [0, 0], [0, 0], [1, 1], 1, "aten", "ieee")
    ops.weight_grad_impl(torch.randn(3, 4, 1, 1), x, w, *geo)
    ops.input_grad_impl(torch.randn(3, 4, 1, 1), x, w, *geo)
    assert {(op, strides) for op, _, _, strides in plans.cached_plans(graph=False)} == {
        ("wgrad", ((4, 1, 1, 1), (5, 1, 5, 5))), ("dgrad", ((4, 1, 1, 1), (5, 1, 1, 1)))}


@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
def test_layer_check_compares_torch_on_the_same_call(op):
    """torch's side of a layer-check row computes the plan's own function: a strided,
    padded convolution with bias, residual and ReLU (and its two gradients), in float64
    against F.conv2d and torch.nn.grad on the same operands."""
    from fastconv.epilogue import Epilogue
    from fastconv.problem import ConvProblem
    from fastconv.tools.bench import layercheck

    x = torch.randn(2, 5, 9, 7, dtype=torch.float64)
    w = torch.randn(6, 5, 3, 3, dtype=torch.float64)
    ep = Epilogue("relu", has_shift=True, has_residual=True) if op == "fprop" else Epilogue()
    res = torch.randn(2, 6, 5, 4, dtype=torch.float64) if op == "fprop" else None
    problem = ConvProblem.from_tensors(x, w, None, (2, 2), ((1, 1), (1, 1)), (1, 1), 1,
                                       rank=2, epilogue=ep, residual=res)
    args = layercheck.operands(problem, op, "cpu")
    got = layercheck.torch_run(problem, op)(*args)
    if op == "fprop":
        xi, wi, bias, _, _, resid, _ = args
        want = torch.relu(torch.nn.functional.conv2d(xi, wi, bias, 2, 1) + resid)
    elif op == "dgrad":
        dy, wi, _ = args
        want = torch.nn.grad.conv2d_input(problem.input_shape(), wi, dy, 2, 1)
    else:
        dy, xi, _ = args
        want = torch.nn.grad.conv2d_weight(xi, problem.weight_shape(), dy, 2, 1)
    assert got.shape == want.shape
    assert ((got - want).norm() / want.norm()).item() < 1e-12


@pytest.mark.parametrize("need_input", [True, False])
def test_layer_check_layer_rows_differentiate_the_same_function(need_input):
    """A training layer's two runs (fastconv's functional call and torch's ops) give the
    same gradients of a grouped, strided, padded convolution with bias and ReLU, in float64,
    and the input's only where the step needs it."""
    from fastconv.epilogue import Epilogue
    from fastconv.problem import ConvProblem
    from fastconv.tools.bench import layercheck

    x = torch.randn(2, 4, 9, 7, dtype=torch.float64)
    w = torch.randn(6, 2, 3, 3, dtype=torch.float64)
    problem = ConvProblem.from_tensors(x, w, None, (2, 1), ((1, 1), (0, 0)), (1, 1), 2,
                                       rank=2, epilogue=Epilogue("relu", has_shift=True))
    fast, slow = layercheck.layer_runs(problem, need_input)
    args = layercheck.layer_operands(problem, need_input, "cpu")
    got, want = fast(*args), slow(*args)
    assert len(got) == len(want) == (3 if need_input else 2)
    for g, r in zip(got, want):
        assert ((g - r).norm() / r.norm()).item() < 1e-12


def test_ddp_worker_trains_every_provider_under_ddp(tmp_path, monkeypatch):
    """One process of ``bench --ddp`` (world 1, gloo, CPU): each provider's module wrapped
    in DistributedDataParallel takes training steps (fastconv's optimized copy inside DDP,
    its fused layers' backward through DDP's gradient hooks), rows without errors."""
    from fastconv.tools.bench import ddp, models

    def tiny():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                   torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                   torch.nn.Flatten(), torch.nn.Linear(8, 5))
    monkeypatch.setitem(models.BUILDERS, "tiny", tiny)
    out = tmp_path / "rows.json"
    case = models.ModelCase("tiny_b2", "tiny", 2, 9)
    ddp._worker(0, 1, ddp._free_port(), case, ["torch", "fastconv", "fastconv_cuda_graph"],
                Precision.IEEE, "cpu", 2, str(out))
    rows = json.loads(out.read_text())
    assert [r["provider"] for r in rows] == ["torch", "fastconv", "fastconv_cuda_graph"]
    assert all("error" not in r and r["world"] == 1 and r["ddp"] for r in rows), rows


def test_ddp_rows_get_the_scaling_efficiency(monkeypatch):
    """``run_case`` runs world 1 and world N and gives each provider's world-N row its step
    time on one GPU over that on N; a provider DDP cannot wrap is refused first."""
    from fastconv.tools.bench import ddp, models

    def spawn(fn, args, nprocs, join):
        world, out = args[0], args[-1]
        ms = {1: 10.0, 2: 12.5}[world]
        with open(out, "w") as f:
            json.dump([dict(case="c", provider="torch", world=world, ms_p50=ms,
                            images_per_s=world * 1000 / ms)], f)
    monkeypatch.setattr(torch.multiprocessing, "spawn", spawn)
    case = models.ModelCase("c", "resnet50", 4, 32)
    rows = ddp.run_case(case, ["torch"], Precision.BF16, 2, "cpu")
    assert [r["world"] for r in rows] == [1, 2]
    assert "scaling_efficiency" not in rows[0]
    assert rows[1]["scaling_efficiency"] == pytest.approx(0.8)
    assert "0.800" in ddp.table(rows)
    with pytest.raises(ValueError, match="fastconv_compile"):
        ddp.run_case(case, ["fastconv_compile"], Precision.BF16, 2, "cpu")
