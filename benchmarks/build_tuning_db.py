"""Build the package's tuning database for one GPU from plan caches filled by exhaustive
tuning on it (``plans-v1.json`` of a FASTCONV_CACHE_DIR, or ``fastconv plans --export``
files): the current-format choices that every candidate was timed for, keyed as
``plancache.database_key`` describes, into ``src/fastconv/data/tuning/<gpu>.json``.

    python benchmarks/build_tuning_db.py --capability 9.0 CACHE.json [CACHE.json ...]

Entries of later files override earlier ones. Every input must come from one environment.
``--keep`` starts from the GPU's current database file (its entries for problems the caches
do not hold stay), which must have been measured in that environment too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from fastconv import plancache  # noqa: E402

#: cache-key suffixes of the current format (dispatch.store.cost_name): the eager and CUDA-graph
#: rankings, without and with the backward
SUFFIXES = ("|eager", "|graph", "|eager+grad", "|graph+grad")


def stores(path: str):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if "stores" in doc:  # a `fastconv plans --export` file
        doc = next(s for s in doc["stores"] if s.get("file") == plancache.FILE_NAME)
    return doc["environment"], doc["entries"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--capability", required=True, help="the GPU's compute capability, e.g. 9.0")
    ap.add_argument("--keep", action="store_true",
                    help="keep the current database's entries the caches do not replace")
    args = ap.parse_args()
    env, entries = None, {}
    for path in args.files:
        their_env, theirs = stores(path)
        if env is not None and their_env != env:
            raise SystemExit(f"{path}: another environment than the files before it")
        env = their_env
        entries.update(theirs)
    major, minor = args.capability.split(".")
    key = plancache.database_key(env, (int(major), int(minor)))
    if args.keep and os.path.exists(plancache.database_path(env["gpu"])):
        with open(plancache.database_path(env["gpu"]), encoding="utf-8") as f:
            old = json.load(f)
        if old["key"] != key:
            raise SystemExit(f"--keep: the current database has key {old['key']}, not {key}")
        entries = {**old["entries"], **entries}
    kept = {k: {f: v for f, v in e.items() if f != "used"} for k, e in sorted(entries.items())
            if k.endswith(SUFFIXES) and not e.get("partial")}
    out = plancache.database_path(env["gpu"])
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"format": plancache.FORMAT, "key": key, "measured_with": env,
                   "entries": kept}, f, indent=0, sort_keys=True)
        f.write("\n")
    print(f"{len(kept)} of {len(entries)} entries -> {out} ({key})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
