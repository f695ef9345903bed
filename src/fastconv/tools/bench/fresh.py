"""``fastconv bench --fresh SECONDS``: each case as a new user's process meets it.

Every case runs in a new Python process with an empty plan cache (a new
``FASTCONV_CACHE_DIR``), the default tuning budget and the shipped tuning database unless
``FASTCONV_TUNING_DB=off``; ``--spent-budget`` starts it with the process's tuning budget
already spent (a process whose model used it). The fastconv provider (``backend="auto"``)
is called back to back for SECONDS from its first call, each call timed with CUDA events
(the eager time per call, host overhead included), nothing waited for. The row gives the
first call's seconds, the median time per call in the seconds before 1, 3, 10 and 30 s and
the last second, and the choice at 10 s and at the end; then fastconv (its final choice),
forced Triton and torch (cuDNN with ``cudnn.benchmark``) are timed interleaved in the same
process, medians, for the ratios. Forward cases only.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

#: seconds at whose end the median time per call is reported (the last second is also)
MARKS = (1, 3, 10, 30)


def run_case(suite: str, case, precision, layout: str, seconds: float, spent: bool,
             reps: int) -> list[dict]:
    """One case in a new process (see the module docstring): its row."""
    spec = dict(suite=suite, case=case.name, precision=precision.value, layout=layout,
                seconds=seconds, spent=spent, reps=reps)
    with tempfile.TemporaryDirectory(prefix="fastconv-fresh-") as cache:
        env = dict(os.environ, FASTCONV_CACHE_DIR=cache, FASTCONV_PROGRESS="0")
        env.pop("FASTCONV_TUNE_BUDGET", None)  # the library's default
        try:
            done = subprocess.run([sys.executable, "-m", "fastconv.tools.bench.fresh",
                                   json.dumps(spec)], env=env, capture_output=True,
                                  text=True, timeout=3 * seconds + 600)
        except subprocess.TimeoutExpired:
            return [dict(case=case.name, provider="fastconv_fresh", mode="fwd",
                         precision=precision.value, error="timed out")]
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return [dict(case=case.name, provider="fastconv_fresh", mode="fwd",
                     precision=precision.value,
                     error=f"exit {done.returncode}: {' | '.join(tail)}")]
    return [json.loads(lines[-1])]


def _child(spec: dict) -> dict:
    import torch

    from fastconv import dispatch, plancache
    from fastconv.precision import Precision
    from fastconv.tools.bench import runner, suites

    case = next(c for c in suites.get(spec["suite"]) if c.name == spec["case"])
    precision, layout = Precision(spec["precision"]), spec["layout"]
    torch.backends.cudnn.benchmark = True  # torch's provider, as the bench runs it
    torch.backends.cudnn.allow_tf32 = precision == Precision.TF32
    if spec["spent"]:
        dispatch.budget.TUNING.spent_s = dispatch.budget.TUNING.per_process_s
    sets = runner._input_sets(case, precision, layout, "fwd")
    problem = runner._problem(case, precision, "fwd", sets[0])
    fns = [runner._call("fastconv", case, precision, t, "fwd", {}) for t in sets]
    row = dict(case=case.name, provider="fastconv_fresh", precision=precision.value,
               mode="fwd", layout=layout, spent_budget=spec["spent"],
               database=plancache.database_file() is not None
               and bool(dispatch.store.CACHE.database_entries()))
    start = time.perf_counter()
    fns[0]()
    torch.cuda.synchronize()
    row["first_call_s"] = time.perf_counter() - start
    samples, i = [], 1  # (seconds since the first call began, ms of one call)
    while time.perf_counter() - start < spec["seconds"]:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(20)]
        for a, b in events:
            a.record()
            fns[i % len(fns)]()
            b.record()
            i += 1
        torch.cuda.synchronize()
        now = time.perf_counter() - start
        samples += [(now, a.elapsed_time(b)) for a, b in events]
        if "choice_10s" not in row and now >= 10:
            row["choice_10s"] = _choice(problem)
    for mark in (*MARKS, "end"):
        t = spec["seconds"] if mark == "end" else mark
        window = [ms for s, ms in samples if t - 1 <= s < t or (mark == "end" and s >= t - 1)]
        if window and t <= spec["seconds"]:
            row[f"ms_at_{mark}" + ("" if mark == "end" else "s")] = statistics.median(window)
    row["calls"] = i
    row["choice_end"] = _choice(problem)
    final = {"fastconv": fns,
             "fastconv_triton": [runner._call("fastconv_triton", case, precision, t, "fwd",
                                              {}) for t in sets],
             "torch": [runner._call("torch", case, precision, t, "fwd", {}) for t in sets]}
    for calls in final.values():
        calls[0]()
    rounds = runner.GpuTimer().eager_rounds(final, spec["reps"])
    for name, times in rounds.items():
        row[f"{name}_ms"] = statistics.median(times)
    for mark in ("1s", "3s", "10s", "30s", "end"):
        if f"ms_at_{mark}" in row:
            row[f"speedup_at_{mark}"] = row["torch_ms"] / row[f"ms_at_{mark}"]
    row["speedup_final"] = row["torch_ms"] / row["fastconv_ms"]
    row["triton_speedup"] = row["torch_ms"] / row["fastconv_triton_ms"]
    return row


def _choice(problem) -> str:
    """The stored choice, marked while background builds may still change it."""
    from fastconv import dispatch
    from fastconv.tools.bench import runner

    return runner._choices(problem, "auto", "fwd") + (
        " (provisional)" if dispatch.building() else "")


def _ratio(row: dict, key: str) -> str:
    return f"{row[key]:5.2f}x" if key in row else "     -"


def table(rows: list[dict]) -> str:
    """The fresh rows as text: time per call against torch's at 1, 3, 10 s and the end."""
    head = (f"{'case':<30} {'first s':>7} {'@1s':>6} {'@3s':>6} {'@10s':>6} {'end':>6} "
            f"{'final':>6} {'triton':>6}  choice at 10 s")
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['case']:<30} {r['error']}")
            continue
        x = functools.partial(_ratio, r)
        lines.append(f"{r['case']:<30} {r['first_call_s']:7.2f} {x('speedup_at_1s')} "
                     f"{x('speedup_at_3s')} {x('speedup_at_10s')} {x('speedup_at_end')} "
                     f"{x('speedup_final')} {x('triton_speedup')}  "
                     f"{r.get('choice_10s', '-')}")
    return "\n".join(lines) + "\n(ratios: torch's time per call / fastconv's; triton: forced)"


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))
