"""Fill tuning-database caches on every GPU of a device host at once: shards of
``tune_models.sh`` items, each in its own process on one GPU with its own plan cache.

    python3 benchmarks/tune_parallel.py [--deadline S] [--gpus N] SHARD [SHARD ...]

A SHARD is ``PRECISION[/MODES]=ITEM[+ITEM...]``, ITEM as ``tune_models.sh`` takes it, e.g.
``tf32/fwd=suite:depthwise`` or ``bf16=model:timm_resnet50+model:resnet50:64``. Shards are
handed out in the order given to whichever GPU is free (put the longest first). At the
deadline (seconds from the start, default 540: a device command may run 600) the running
shards are stopped; each shard's cache holds the choices completed before that.

Writes under $OUT: ``tune-shards.tgz`` (per shard ``shard-N/plans-tuned.json`` and its tune
logs) and prints one line per shard. Merge here with
``build_tuning_db.py --capability 9.0 --keep shard-*/plans-tuned.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def parse(spec: str) -> tuple[str, str, list[str]]:
    head, sep, items = spec.partition("=")
    precision, _, modes = head.partition("/")
    if not sep or not precision or not items:
        raise SystemExit(f"shard {spec!r}: expected PRECISION[/MODES]=ITEM[+ITEM...]")
    return precision, modes, items.split("+")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shards", nargs="+")
    ap.add_argument("--deadline", type=float, default=540.0)
    ap.add_argument("--gpus", type=int, default=torch.cuda.device_count(),
                    help="how many of the host's GPUs to use (default: all)")
    args = ap.parse_args()
    shards = [parse(s) for s in args.shards]
    out = os.environ.get("OUT", "out")
    # the carried wheels, installed once here: every shard's tune_models.sh sources this too
    subprocess.run(["bash", "-c", f"source {HERE}/device_env.sh"], check=False)
    start = time.monotonic()
    todo = list(enumerate(shards))
    lock = threading.Lock()
    running: dict[int, subprocess.Popen] = {}
    report: dict[int, str] = {}

    def worker(gpu: int) -> None:
        while True:
            with lock:
                if not todo or time.monotonic() - start > args.deadline:
                    return
                n, (precision, modes, items) = todo.pop(0)
            shard_out = os.path.join(out, f"shard-{n}")
            os.makedirs(shard_out, exist_ok=True)
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu), OUT=shard_out,
                       CACHE=f"/tmp/tune-shard-{n}", PRECISION=precision,
                       ITEM_S=str(int(max(10, args.deadline - (time.monotonic() - start)))))
            if modes:
                env["SUITE_MODES"] = modes
            t0 = time.monotonic()
            with open(os.path.join(shard_out, "driver.log"), "w") as log:
                proc = subprocess.Popen(["bash", os.path.join(HERE, "tune_models.sh"), *items],
                                        env=env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
                with lock:
                    running[n] = proc
                proc.wait()
            with lock:
                running.pop(n, None)
                report[n] = f"gpu {gpu}, {time.monotonic() - t0:.0f} s, exit {proc.returncode}"

    threads = [threading.Thread(target=worker, args=(g,)) for g in range(args.gpus)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(1)
        if time.monotonic() - start > args.deadline:
            with lock:
                for proc in running.values():
                    os.killpg(proc.pid, signal.SIGTERM)
            # tune_models.sh runs each item under `timeout`, in a process group of its own
            subprocess.run(["pkill", "-TERM", "-f", "fastconv.tools.cli tune|tune_cost.py"],
                           check=False)
    for t in threads:
        t.join()
    for n, (precision, modes, items) in enumerate(shards):
        cache = f"/tmp/tune-shard-{n}/plans-v1.json"
        if os.path.exists(cache):
            shutil.copy(cache, os.path.join(out, f"shard-{n}", "plans-tuned.json"))
        print(f"shard {n} {precision}/{modes or 'all'} {'+'.join(items)}: "
              f"{report.get(n, 'not started')}")
    names = sorted(d for d in os.listdir(out) if d.startswith("shard-"))
    subprocess.run(["tar", "czf", "tune-shards.tgz", *names], cwd=out, check=True)
    for d in names:
        shutil.rmtree(os.path.join(out, d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
