"""Where exhaustive tuning's time goes: ``fastconv tune ARGS`` with every candidate's cost
recorded, then one table per tuned problem (issue 21: the tf32 depthwise layers took
10-150 s each to tune, bf16 ~2.5 s).

    python3 benchmarks/tune_cost.py [fastconv tune arguments]   (GPU)

Per problem and direction: the seconds spent listing each backend's candidates, and per
candidate the seconds waited for its background build, spent in its eager timing
(``costs.time_costs``: 69 calls) and its CUDA-graph timing, with its GPU ms per call, eager
and graphed, or the reason it has none. ``tune_models.sh`` runs items through this with
TUNE_COST=1.
"""

from __future__ import annotations

import signal
import sys
import time

from fastconv import backends, dispatch
from fastconv.tools import cli

LOG: list[dict] = []  # one entry per problem: {"what", "list": {backend: s}, "rows": [...]}


def _timed(fn, record):
    """``fn`` calling ``record(seconds, failed, *args)`` after each call."""
    def wrapper(*args, **kwargs):
        start, failed = time.perf_counter(), True
        try:
            out = fn(*args, **kwargs)
            failed = False
            return out
        finally:
            record(time.perf_counter() - start, failed, *args)
    return wrapper


def install() -> None:
    pending = {"wait": 0.0, "eager": 0.0}
    failed: list[float] = []  # seconds of eager timings that raised (their rows: a note)

    def benchmark(fn):
        def wrapper(problem, names, run, op):
            # (a timing outside a problem's tuning, a budgeted upgrade, is not counted)
            pending.update(wait=0.0, eager=0.0)
            failed.clear()
            LOG.append({"what": f"{problem.key()} {op}", "list": {}, "rows": [],
                        "start": time.perf_counter()})
            rows = fn(problem, names, run, op)
            entry = LOG[-1]
            entry["total"] = time.perf_counter() - entry["start"]
            timed = {id(r["row"]) for r in entry["rows"]}
            for r in rows:
                if id(r) not in timed:
                    # a timing that raised left its row with a note and no time
                    cost = failed.pop(0) if failed and r.note and not r.note.startswith(
                        (dispatch.BUDGET_NOTE, dispatch.PRUNED_NOTE)) else 0.0
                    entry["rows"].append({"row": r, "wait": 0.0, "eager": cost, "graph": 0.0})
            return rows
        return wrapper

    def on_wait(seconds, _failed, *args):
        pending["wait"] += seconds

    def on_eager(seconds, raised, *args):
        if raised:
            failed.append(pending["wait"] + seconds)
            pending["wait"] = 0.0
        else:
            pending["eager"] += seconds

    def on_graph(seconds, _failed, row, *args):
        LOG[-1]["rows"].append({"row": row, "wait": pending["wait"], "eager": pending["eager"],
                                "graph": seconds})
        pending.update(wait=0.0, eager=0.0)

    dispatch._benchmark = benchmark(dispatch._benchmark)
    dispatch._wait_built = _timed(dispatch._wait_built, on_wait)
    dispatch.time_costs = _timed(dispatch.time_costs, on_eager)
    dispatch._time_graphed = _timed(dispatch._time_graphed, on_graph)
    for name, cls in backends.REGISTRY.items():
        def listed(seconds, _failed, *args, name=name):
            if LOG:
                LOG[-1]["list"][name] = LOG[-1]["list"].get(name, 0.0) + seconds
        cls.candidates = classmethod(_timed(cls.candidates.__func__, listed))


def _ms(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def report() -> None:
    for entry in LOG:
        rows = entry["rows"]
        print(f"\n## {entry['what']}: {entry.get('total', 0.0):.1f} s, {len(rows)} candidates; "
              "listing " + ", ".join(f"{k} {v:.2f} s" for k, v in entry["list"].items()))
        print(f"{'candidate':44} {'wait_s':>7} {'eager_s':>8} {'graph_s':>8} {'gpu_ms':>9} "
              f"{'graph_ms':>9}  note")
        for r in sorted(rows, key=lambda r: -(r["wait"] + r["eager"] + r["graph"])):
            row = r["row"]
            print(f"{row.name()[:44]:44} {r['wait']:7.2f} {r['eager']:8.2f} {r['graph']:8.2f} "
                  f"{_ms(row.gpu_ms):>9} {_ms(row.graph_ms):>9}  {row.note[:60]}")
        spent = sum(r["wait"] + r["eager"] + r["graph"] for r in rows)
        print(f"(candidates' own time {spent:.1f} s; listing {sum(entry['list'].values()):.1f} s;"
              f" the rest {entry.get('total', 0.0) - spent - sum(entry['list'].values()):.1f} s)")


def main(argv: list[str]) -> int:
    install()
    # stopped at a deadline (tune_parallel.py, timeout): the table of what was tuned
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return cli.main(["tune", *argv])
    finally:
        report()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
