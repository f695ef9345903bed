"""Processes sharing one plan-cache directory: does any of them stall, do they lose entries?

Runs ``--sequential`` processes one after another, then ``--concurrent`` at once, all with
the same ``FASTCONV_CACHE_DIR`` (a fresh temporary directory unless ``--dir``), each under
``--timeout`` seconds. A child that reaches its timeout dumps every thread's stack
(faulthandler) to its stderr, which goes into the log, and exits; so does one that fails.

Workloads:
* ``mobilenet`` (GPU): timm ``mobilenetv3_large_100`` (torchvision's ``mobilenet_v3_large``
  without timm), ``fastconv.optimize(model, precision="bf16")``, the first call on a batch
  of 8 at 224x224 timed; the setting where a warm-cache process once printed nothing for
  200 s on an H200.
* ``pins`` (CPU): 25 distinct problems pinned per process (each pin is one disk save).

Each child prints one line: first-call seconds, dispatch cache hits/misses, entries on disk,
cuDNN plans restored/stored. The last lines are a table per phase.

Usage: PYTHONPATH=src python benchmarks/cache_stress.py [--workload mobilenet|pins]
    [--sequential 20] [--concurrent 4] [--timeout 120] [--dir DIR] [--log FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _child(workload: str, tag: int, timeout: float) -> None:
    import faulthandler

    faulthandler.dump_traceback_later(max(timeout - 5, 1), exit=True)  # all threads' stacks
    t0 = time.perf_counter()
    import torch

    import fastconv
    from fastconv import dispatch

    if workload == "mobilenet":
        try:
            import timm
            model = timm.create_model("mobilenetv3_large_100", pretrained=False)
        except ImportError:
            import torchvision
            model = torchvision.models.mobilenet_v3_large()
        model = fastconv.optimize(model.cuda(), precision="bf16")
        x = torch.randn(8, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
        t1 = time.perf_counter()
        with torch.no_grad():
            model(x)
        torch.cuda.synchronize()
        first = time.perf_counter() - t1
    else:
        t1 = time.perf_counter()
        w = torch.randn(4, 3 + tag, 3, 3)
        for i in range(25):
            x = torch.randn(1, 3 + tag, 5 + i, 7)
            dispatch.pin(fastconv.ConvProblem.from_tensors(x, w, rank=2), "aten")
        first = time.perf_counter() - t1
    from fastconv.backends import cudnn

    print(json.dumps({"tag": tag, "import_s": round(t1 - t0, 2), "first_s": round(first, 2),
                      "hits": dispatch.CACHE.hits, "misses": dispatch.CACHE.misses,
                      "disk": dispatch.CACHE.disk_entries(),
                      "cudnn": [cudnn.SERIALIZATION["restored"],
                                cudnn.SERIALIZATION["stored"]]}), flush=True)


def _spawn(args, tag: int) -> tuple[subprocess.Popen, float]:
    env = dict(os.environ, FASTCONV_CACHE_DIR=args.dir, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, __file__, "--child", args.workload, "--tag", str(tag),
           "--timeout", str(args.timeout)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env), time.perf_counter()


def _finish(proc, t0, args, log, phase: str, tag: int) -> dict:
    try:
        out, err = proc.communicate(timeout=args.timeout + 10)  # faulthandler exits first
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    wall = time.perf_counter() - t0
    row = {"phase": phase, "tag": tag, "rc": proc.returncode, "wall_s": round(wall, 2)}
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if lines:
        row.update(json.loads(lines[-1]))
    ok = proc.returncode == 0 and lines
    log.write(f"--- {phase} #{tag}: rc {proc.returncode}, {wall:.1f} s\n{out}")
    if not ok:  # the stacks faulthandler dumped, or the traceback
        log.write(f"stderr:\n{err}\n")
    log.flush()
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=["mobilenet", "pins"], default="mobilenet")
    ap.add_argument("--sequential", type=int, default=20)
    ap.add_argument("--concurrent", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--log", default="cache_stress.log")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tag", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.tag, args.timeout)
        return 0
    args.dir = args.dir or tempfile.mkdtemp(prefix="fastconv-cache-")
    rows = []
    with open(args.log, "w") as log:
        for i in range(args.sequential):
            rows.append(_finish(*_spawn(args, i), args, log, "sequential", i))
        procs = [_spawn(args, args.sequential + i) for i in range(args.concurrent)]
        for i, (proc, t0) in enumerate(procs):
            rows.append(_finish(proc, t0, args, log, "concurrent", args.sequential + i))
    from fastconv import plancache

    path = os.path.join(args.dir, plancache.FILE_NAME)
    stored = len(json.load(open(path))["entries"]) if os.path.exists(path) else 0
    print(f"cache dir {args.dir}: {stored} entries at the end; log {args.log}")
    print(f"{'phase':<11} {'runs':>4} {'failed':>6} {'wall s (first, median, max)':>28} "
          f"{'first call s (median, max)':>27}")
    failed = 0
    for phase in ("sequential", "concurrent"):
        got = [r for r in rows if r["phase"] == phase]
        if not got:
            continue
        bad = [r for r in got if r["rc"] != 0 or "first_s" not in r]
        failed += len(bad)
        walls = [r["wall_s"] for r in got]
        firsts = [r["first_s"] for r in got if "first_s" in r] or [float("nan")]
        print(f"{phase:<11} {len(got):>4} {len(bad):>6} {walls[0]:>10.1f} "
              f"{statistics.median(walls):>8.1f} {max(walls):>8.1f} "
              f"{statistics.median(firsts):>14.2f} {max(firsts):>12.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
