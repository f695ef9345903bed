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
        vals = list(per_case.values())
        per_case["geomean"] = math.exp(sum(map(math.log, vals)) / len(vals))
    return out


def table(rows: list[dict], ceilings: dict[str, float] | None = None) -> str:
    """A plain-text table (fits a terminal and a log file alike)."""
    sp = speedups(rows)
    spg = speedups(rows, field="graph_ms_p50")
    head = f"{'case':<26} {'provider':<16} {'prec':<5} {'ms p50':>8} {'graph ms':>8} " \
           f"{'TFLOPS':>7} {'%peak':>6} {'rel err':>8} {'vs torch':>8} {'graph':>6}  choice"
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['case']:<26} {r['provider']:<16} {r['precision']:<5} "
                         f"{'error: ' + r['error'][:80]}")
            continue
        if r.get("ms_p50") is None:
            lines.append(f"{r['case']:<26} {r['provider']:<16} {r['precision']:<5} "
                         f"{'-':>8} {'-':>8} {'-':>7} {'':>6} {r['rel_err']:8.1e}  "
                         f"{r.get('timing', '')} {r.get('choice', '')}")
            continue
        peak = (ceilings or {}).get(f"{r['precision']}_tflops")
        pct = f"{100 * r['tflops'] / peak:6.1f}" if peak else f"{'':>6}"
        ratio = sp.get(r["provider"], {}).get(r["case"])
        gratio = spg.get(r["provider"], {}).get(r["case"])
        gms = r.get("graph_ms_p50")
        lines.append(f"{r['case']:<26} {r['provider']:<16} {r['precision']:<5} "
                     f"{r['ms_p50']:8.4f} {(f'{gms:8.4f}' if gms else f'{chr(45):>8}')} "
                     f"{r['tflops']:7.1f} {pct} {r['rel_err']:8.1e} "
                     f"{(f'{ratio:.2f}x' if ratio else ''):>8} "
                     f"{(f'{gratio:.2f}x' if gratio else ''):>6}  {r.get('choice', '')}")
    for prov, per_case in sp.items():
        g = spg.get(prov, {}).get("geomean")
        lines.append(f"geomean speed-up of {prov} over torch: eager {per_case['geomean']:.3f}x"
                     + (f", CUDA graph {g:.3f}x" if g else "") + f" ({len(per_case) - 1} cases)")
    return "\n".join(lines)


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


def file_stem(suite: str, precision: str, layout: str, gpu: str | None,
              mode: str = "fwd") -> str:
    gpu_s = re.sub(r"[^A-Za-z0-9]+", "", (gpu or "cpu").replace("NVIDIA", "")) or "gpu"
    date = datetime.date.today().isoformat()
    mode_s = "" if mode == "fwd" else f"-{mode}"
    return f"{suite}{mode_s}-{precision}-{layout}-{gpu_s}-{date}"
