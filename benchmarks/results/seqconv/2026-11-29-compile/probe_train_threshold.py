"""Throwaway: causal_conv1d fwd+bwd (eager, bf16, SiLU) below the training-kernel size rule:
the conv1d route (rule as shipped) against shortconv's kernels (rule lowered to 0), and torch."""
import statistics, torch, torch.nn.functional as F
import fastconv
from fastconv import seqconv

def step(fn, args, g):
    out = fn(*args)
    torch.autograd.grad(out, args, g)

def torch_fn(x, w, b):
    return F.silu(F.conv1d(x, w.unsqueeze(1), b, padding=w.shape[1] - 1, groups=x.shape[1])[..., :x.shape[2]])

def fc(x, w, b):
    return fastconv.causal_conv1d(x, w, b, activation="silu")

def timed(fn, args, g, n=20):
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record()
    for _ in range(n):
        step(fn, args, g)
    e.record(); e.synchronize()
    return s.elapsed_time(e) / n

shapes = [(1, 1024, 256), (4, 1536, 512), (8, 1536, 1024), (8, 1536, 2048), (4, 2048, 2048), (16, 1024, 1024)]
print("shape layout numel | torch ms | conv1d-route ms | short ms | short/torch speedup, short vs route")
for (bt, d, L) in shapes:
    for layout in ("seqlen", "dim"):
        x = torch.randn(bt, L, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2) if layout == "dim" \
            else torch.randn(bt, d, L, device="cuda", dtype=torch.bfloat16)
        x.requires_grad_()
        w = (torch.randn(d, 4, device="cuda") / 2).bfloat16().requires_grad_()
        b = torch.randn(d, device="cuda").bfloat16().requires_grad_()
        g = torch.randn(bt, d, L, device="cuda", dtype=torch.bfloat16)
        if layout == "dim":
            g = g.transpose(1, 2).contiguous().transpose(1, 2)
        args = (x, w, b)
        res = {"torch": [], "route": [], "short": []}
        for name in res:  # warm
            seqconv._TRAIN_KERNELS_MIN_NUMEL = 0 if name == "short" else 1 << 25
            for _ in range(3):
                step(torch_fn if name == "torch" else fc, args, g)
        torch.cuda.synchronize()
        for _ in range(9):
            for name in res:
                seqconv._TRAIN_KERNELS_MIN_NUMEL = 0 if name == "short" else 1 << 25
                res[name].append(timed(torch_fn if name == "torch" else fc, args, g))
        m = {k: statistics.median(v) for k, v in res.items()}
        print(f"{bt}x{d}x{L} {layout} {bt*d*L/2**20:.1f}M | {m['torch']:.4f} | {m['route']:.4f} | {m['short']:.4f} | {m['torch']/m['short']:.2f}x, {m['route']/m['short']:.2f}x", flush=True)
