#!/usr/bin/env bash
# Host cost per call of an older tree against this one, on the device: step_layer_host.py
# and the host bench suite, the two trees alternating in fresh processes (RUNS rounds).
# Usage (here): mkdir .old && git archive <commit> src benchmarks | tar -x -C .old
#   (ignored: echo /.old/ >> .git/info/exclude); then a device call carrying .old:
#   bash benchmarks/host_ab.sh   -> a summary, and $OUT/ab.tgz with the logs and JSON.
# OLD_CLI: the older tree's command-line module (fastconv.cli before the tools moved).
set -u
OLD=${OLD:-.old}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/ab"
for i in $(seq 1 ${RUNS:-2}); do
  for t in old new; do
    if [ $t = old ]; then P=$OLD/src; B=$OLD/benchmarks; CLI=${OLD_CLI:-fastconv.cli}
    else P=src; B=benchmarks; CLI=fastconv.tools.cli; fi
    PYTHONPATH=$P:/tmp/site timeout 120 python3 $B/step_layer_host.py > "$OUT/ab/slh-$t-$i.log" 2>&1
    PYTHONPATH=$P:/tmp/site FASTCONV_CACHE_DIR=/tmp/pc-$t-$i timeout 200 python3 -m $CLI bench --suite host \
      --precision bf16 --mode fwd,train --provider torch,fastconv --reps 50 --out "$OUT/ab/host-$t-$i" \
      > "$OUT/ab/bench-$t-$i.log" 2>&1
  done
done
python3 - "$OUT/ab" <<'PY'
import glob, json, sys, re
d = sys.argv[1]
for f in sorted(glob.glob(f"{d}/slh-*.log")):
    rows = [l for l in open(f) if re.search(r"kept call|general path|bare torch", l)]
    print(f.rsplit("/", 1)[1], " | ".join(" ".join(r.split()) for r in rows))
for f in sorted(glob.glob(f"{d}/host-*/*.json")):
    data = json.load(open(f))
    rows = {(r["case"], r["provider"], r["mode"]): r.get("host_us") for r in data["rows"]}
    print(f.split("/")[-2], f.rsplit("/", 1)[1][:30], "; ".join(
        f"{c}/{m}: torch {rows.get((c, 'torch', m))} fc {rows.get((c, 'fastconv', m))}"
        for c, p, m in sorted(rows) if p == "torch"))
PY
tar czf "$OUT/ab.tgz" -C "$OUT" ab && rm -rf "$OUT/ab"
