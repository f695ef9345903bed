"""Benchmark output: the terminal table, the JSON of DESIGN.md §7, CSV, and summaries."""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import platform
import re
import subprocess
from pathlib import Path

import torch


def environment(ceilings: dict[str, float], suite: str) -> dict:
    """The ``meta`` block: what was measured, on what, with which versions."""
    import fastconv
    from fastconv import dispatch

    try:
        import triton
        triton_v = triton.__version__
    except ImportError:
        triton_v = None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "suite": suite, "gpu": gpu, "torch": torch.__version__, "triton": triton_v,
        "cudnn": cudnn, "cuda": torch.version.cuda, "fastconv": fastconv.__version__,
        "python": platform.python_version(), "git_sha": git_sha(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "ceilings": ceilings,
        "tuning_budget": "exhaustive" if dispatch.TUNING.exhaustive
        else dispatch.TUNING.describe(),
    }


def git_sha() -> str:
    """The commit measured: $FASTCONV_GIT_SHA (set where the tree travels without .git),
    else ``git rev-parse HEAD`` (+ "-dirty" with uncommitted changes), else "unknown"."""
    env = os.environ.get("FASTCONV_GIT_SHA")
    if env:
        return env
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=here, capture_output=True, text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def speedups(rows: list[dict], baseline: str = "torch",
             field: str = "ms_p50") -> dict[str, dict[str, float]]:
    """Per provider: speed-up over ``baseline`` in ``field`` (``ms_p50`` eager or
    ``graph_ms_p50``) per case, and their geometric mean."""
    def key_of(r):
        return r["case"], r["precision"], r.get("layout"), r.get("mode", "fwd")

    base = {key_of(r): r[field] for r in rows if r["provider"] == baseline and r.get(field)}
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        key = key_of(r)
        if r["provider"] == baseline or not r.get(field) or key not in base:
            continue
        out.setdefault(r["provider"], {})[r["case"]] = base[key] / r[field]
    for per_case in out.values():
        per_case["geomean"] = geomean(per_case.values())
    return out


def geomean(values) -> float:
    """The geometric mean of positive ``values``."""
    values = list(values)
    return math.exp(sum(map(math.log, values)) / len(values))


def add_roofline(rows: list[dict], ceilings: dict[str, float]) -> None:
    """Give every timed row ``roofline_pct``: the roofline bound's time — the tighter of the
    compute floor (FLOP at the measured matrix-product rate; for rows marked ``cuda_cores``,
    depthwise convolutions, which no tensor core runs, at the measured CUDA-core FMA rate)
    and the memory floor (minimum bytes at the measured copy bandwidth) — as a percentage
    of the measured median."""
    hbm = ceilings.get("hbm_gbps")
    for r in rows:
        peak = ceilings.get("cuda_core_tflops" if r.get("cuda_cores")
                            else f"{r['precision']}_tflops")
        if not r.get("ms_p50") or not peak or not hbm or "flops" not in r:
            continue  # (whole-model rows carry no FLOP count)
        bound_ms = max(r["flops"] / peak / 1e9, r["min_bytes"] / hbm / 1e6)
        r["roofline_pct"] = 100.0 * bound_ms / r["ms_p50"]


COLUMNS = ("case", "provider", "prec", "ms p50", "graph ms", "TFLOPS", "%roof", "rel err",
           "vs torch", "graph", "choice")


def _cells(rows: list[dict]) -> tuple[list[list[str]], list[str]]:
    """The table's rows as strings (one per COLUMNS entry) and its geomean footer lines."""
    sp = speedups(rows)
    spg = speedups(rows, field="graph_ms_p50")
    out = []
    for r in rows:
        first = [r["case"], r["provider"], r["precision"]]
        if "error" in r:
            out.append(first + ["error: " + r["error"][:80]] + [""] * 7)
            continue
        if r.get("ms_p50") is None:
            out.append(first + ["-", "-", "-", "", f"{r['rel_err']:.1e}", "", "",
                                f"{r.get('timing', '')} {r.get('choice', '')}".strip()])
            continue
        roof, gms = r.get("roofline_pct"), r.get("graph_ms_p50")
        ratio = sp.get(r["provider"], {}).get(r["case"])
        gratio = spg.get(r["provider"], {}).get(r["case"])
        out.append(first + [f"{r['ms_p50']:.4f}", f"{gms:.4f}" if gms else "-",
                            f"{r['tflops']:.1f}" if r.get("tflops") is not None else "",
                            f"{roof:.1f}" if roof is not None else "",
                            f"{r['rel_err']:.1e}", f"{ratio:.2f}x" if ratio else "",
                            f"{gratio:.2f}x" if gratio else "", r.get("choice", "")])
    footer = host_lines(rows)
    for prov, per_case in sp.items():
        g = spg.get(prov, {}).get("geomean")
        footer.append(f"geomean speed-up of {prov} over torch: eager {per_case['geomean']:.3f}x"
                      + (f", CUDA graph {g:.3f}x" if g else "") + f" ({len(per_case) - 1} cases)")
    return out, footer


def host_lines(rows: list[dict], baseline: str = "torch") -> list[str]:
    """One line per case of rows with host times: each provider's host microseconds per call
    and its difference to ``baseline``'s, measured in the same run."""
    lines = []
    by_case: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r.get("host_us_p50") is not None:
            by_case.setdefault((r["case"], r["mode"]), {})[r["provider"]] = r["host_us_p50"]
    for (case, mode), per in by_case.items():
        base = per.get(baseline)
        cells = [f"{prov} {us:.1f}" + (f" ({us - base:+.1f})" if base is not None
                                         and prov != baseline else "")
                 for prov, us in per.items()]
        lines.append(f"host us per call, {case} {mode}: " + ", ".join(cells))
    return lines


_WIDTHS = (-26, -16, -5, 8, 8, 7, 6, 8, 8, 6, 0)  # negative: left-aligned; 0: as long as needed


def table(rows: list[dict], ceilings: dict[str, float] | None = None) -> str:
    """A plain-text table (fits a terminal and a log file alike)."""
    def line(cells):
        if cells[3].startswith("error"):
            return " ".join(f"{c:<{-w}}" for c, w in zip(cells[:3], _WIDTHS)) + " " + cells[3]
        return " ".join(f"{c:<{-w}}" if w < 0 else f"{c:>{w}}" if w else c
                        for c, w in zip(cells, _WIDTHS))
    body, footer = _cells(rows)
    head = line(list(COLUMNS))
    return "\n".join([head, "-" * len(head), *map(line, body), *footer])


def rich_table(rows: list[dict]):
    """The same table as a rich.table.Table (for a terminal)."""
    from rich.table import Table

    body, footer = _cells(rows)
    t = Table(*COLUMNS, caption="\n".join(footer))
    for cells in body:
        t.add_row(*cells)
    return t


def write(doc: dict, out_dir: str | Path, stem: str) -> list[Path]:
    """Write ``doc`` as ``<stem>.json`` and its rows as ``<stem>.csv`` under ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    jpath = out_dir / f"{stem}.json"
    jpath.write_text(json.dumps(doc, indent=1) + "\n")
    cpath = out_dir / f"{stem}.csv"
    fields = sorted({k for r in doc["rows"] for k in r})
    with cpath.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(doc["rows"])
    return [jpath, cpath]


def write_partial(path: Path, doc: dict) -> None:
    """``doc`` as JSON at ``path``, replaced whole (written beside it, then renamed: a run
    killed while writing leaves the previous version)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps(doc, indent=1) + "\n")
    scratch.replace(path)


def file_stem(suite: str, precision: str, layout: str, gpu: str | None,
              mode: str = "fwd") -> str:
    gpu_s = re.sub(r"[^A-Za-z0-9]+", "", (gpu or "cpu").replace("NVIDIA", "")) or "gpu"
    date = datetime.date.today().isoformat()
    mode_s = "" if mode == "fwd" else f"-{mode}"
    return f"{suite}{mode_s}-{precision}-{layout}-{gpu_s}-{date}"
