"""Where the seqconv bench's process died at long_b4_d768_l1024 (fwd, bf16) once every row
got graph timing: each step printed and flushed, faulthandler on."""
import faulthandler
import sys

import torch

faulthandler.enable()
from fastconv.precision import Precision  # noqa: E402
from fastconv.tools.bench import runner, seqconv  # noqa: E402

case = next(c for c in seqconv.CASES if c.name == sys.argv[1])
mode = sys.argv[2]
step = sys.argv[3]
dtype = torch.bfloat16
calls, ref, moved = seqconv._calls(case, dtype, "cuda", mode == "train")
for p, f in calls.items():
    print(p, "first call", flush=True)
    out = f()
    torch.cuda.synchronize()
    print(p, "ok", seqconv.relative_error(out, ref), flush=True)
timer = runner.GpuTimer()
if step in ("eager", "all"):
    print("eager", {p: sorted(v)[len(v) // 2] for p, v in timer.eager_rounds(
        {p: [f] for p, f in calls.items()}, 20).items()}, flush=True)
if step in ("graph", "all"):
    sets = seqconv._graph_sets(case, dtype, "cuda", mode == "train", moved)
    for p, fns in sets.items():
        print(p, "graph over", len(fns), "sets", flush=True)
        g = timer.graph(fns)
        print(p, "graph", g and sorted(g)[len(g) // 2], flush=True)
