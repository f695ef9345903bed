"""Compare two directories of `fastconv bench` JSON files (the same suites, benched with two
tuning budgets in separate processes): per layer, each run's speed-up over torch measured in
that run (eager and under CUDA graphs; eager times drift between processes, so only these
same-run ratios compare eagerly), and fastconv's graph time in the first over the second;
geomeans per suite.

    python benchmarks/budget_cost.py DEFAULT_DIR EXHAUSTIVE_DIR
"""

from __future__ import annotations

import glob
import json
import math
import os
import sys


def _rows(directory: str) -> dict:
    """{(suite, case, provider): row} of every JSON file under ``directory``."""
    rows = {}
    for path in glob.glob(os.path.join(directory, "*.json")):
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        suite = os.path.basename(path).split("-")[0]
        for row in doc["rows"]:
            rows[(suite, row["case"], row["provider"])] = row
    return rows


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def _vs_torch(rows: dict, key: tuple, field: str) -> float:
    """torch's time over fastconv's for one layer of one run (same process, interleaved)."""
    torch_row = rows.get((key[0], key[1], "torch"))
    return torch_row[field] / rows[key][field] if torch_row else float("nan")


def main(first: str, second: str) -> None:
    a, b = _rows(first), _rows(second)
    suites = sorted({s for s, _, p in a if p == "fastconv"})
    print("fastconv's speed-up over torch in the same run (eager | CUDA graph), first budget "
          "and second; 'graph a/b': fastconv's graph time, first over second")
    print(f"{'suite':<16} {'case':<24} {'a eager':>7} {'b eager':>7} {'a graph':>7} "
          f"{'b graph':>7} {'graph a/b':>9}  choices (a | b)")
    for suite in suites:
        stats: dict[str, list[float]] = {k: [] for k in ("ae", "be", "ag", "bg", "ab")}
        for key, ra in sorted(a.items()):
            rb = b.get(key)
            if key[0] != suite or key[2] != "fastconv" or rb is None:
                continue
            vals = dict(ae=_vs_torch(a, key, "ms_p50"), be=_vs_torch(b, key, "ms_p50"),
                        ag=_vs_torch(a, key, "graph_ms_p50"),
                        bg=_vs_torch(b, key, "graph_ms_p50"),
                        ab=ra["graph_ms_p50"] / rb["graph_ms_p50"])
            for k, v in vals.items():
                stats[k].append(v)
            print(f"{suite:<16} {key[1]:<24} {vals['ae']:7.3f} {vals['be']:7.3f} "
                  f"{vals['ag']:7.3f} {vals['bg']:7.3f} {vals['ab']:9.3f}  "
                  f"{ra.get('choice', '')} | {rb.get('choice', '')}")
        g = {k: _geomean(v) for k, v in stats.items()}
        print(f"{suite}: geomean over {len(stats['ab'])} layers: vs torch eager {g['ae']:.3f} | "
              f"{g['be']:.3f}, graph {g['ag']:.3f} | {g['bg']:.3f}; fastconv graph time "
              f"first / second {g['ab']:.3f} (max {max(stats['ab'], default=float('nan')):.3f})")

if __name__ == "__main__":
    main(*sys.argv[1:3])
