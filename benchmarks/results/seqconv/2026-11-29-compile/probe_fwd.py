"""Throwaway: causal_conv1d forward without autograd (eager, bf16, SiLU): the route as shipped
(seqlen-contiguous: shortconv; dim-contiguous: fastconv.conv1d) against shortconv's forward
called directly, and torch; eager per-call times and CUDA-graph replay times."""
import statistics, torch, torch.nn.functional as F
import fastconv
from fastconv.backends.triton import shortconv

def torch_fn(x, w, b):
    return F.silu(F.conv1d(x, w.unsqueeze(1), b, padding=w.shape[1] - 1, groups=x.shape[1])[..., :x.shape[2]])

def fc(x, w, b):
    return fastconv.causal_conv1d(x, w, b, activation="silu")

def short(x, w, b):
    return shortconv.short_forward(x, None, w, b, True)

def timed(fn, args, n=20):
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record()
    for _ in range(n):
        fn(*args)
    e.record(); e.synchronize()
    return s.elapsed_time(e) / n

def graphed(fn, args, n=20):
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn(*args)
    def run():
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); g.replay(); e.record(); e.synchronize()
        return s.elapsed_time(e) / n
    return run

shapes = [(1, 1024, 256), (4, 1536, 512), (8, 1536, 1024), (8, 1536, 2048), (8, 4096, 2048), (16, 1024, 1024)]
fns = {"torch": torch_fn, "route": fc, "short": short}
print("shape layout numel | eager ms torch route short | graph ms torch route short | short vs route eager, graph")
with torch.no_grad():
    for (bt, d, L) in shapes:
        for layout in ("seqlen", "dim"):
            x = torch.randn(bt, L, 2 * d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)[:, :d] if layout == "dim" \
                else torch.randn(bt, d, L, device="cuda", dtype=torch.bfloat16)
            w = (torch.randn(d, 4, device="cuda") / 2).bfloat16()
            b = torch.randn(d, device="cuda").bfloat16()
            args = (x, w, b)
            ref = torch_fn(x.double(), w.double(), b.double())
            errs = {k: float((f(*args).double() - ref).norm() / ref.norm()) for k, f in fns.items()}
            for f in fns.values():
                for _ in range(3):
                    f(*args)
            torch.cuda.synchronize()
            graphs = {k: graphed(f, args) for k, f in fns.items()}
            res = {k: [] for k in fns}
            gres = {k: [] for k in fns}
            for _ in range(9):
                for k, f in fns.items():
                    res[k].append(timed(f, args))
                    gres[k].append(graphs[k]())
            m = {k: statistics.median(v) for k, v in res.items()}
            gm = {k: statistics.median(v) for k, v in gres.items()}
            print(f"{bt}x{d}x{L} {layout} {bt*d*L/2**20:.1f}M | {m['torch']:.4f} {m['route']:.4f} {m['short']:.4f} | "
                  f"{gm['torch']:.4f} {gm['route']:.4f} {gm['short']:.4f} | {m['route']/m['short']:.2f}x, {gm['route']/gm['short']:.2f}x | err {max(errs.values()):.1e}", flush=True)
