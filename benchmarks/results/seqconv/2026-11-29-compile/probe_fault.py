"""Throwaway: which call faults (illegal memory access) on fastconv.conv1d of a causal
depthwise conv1d with x a dim-contiguous view (a projection's output split in two)."""
import os, subprocess, sys

CHILD = r'''
import sys, torch, fastconv
variant, b, d, L, layout, backend = sys.argv[1:7]
b, d, L = int(b), int(d), int(L)
torch.manual_seed(0)
def make(b, d, L, layout):
    if layout == "view":
        return torch.randn(b, L, 2 * d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)[:, :d]
    if layout == "dense":
        return torch.randn(b, L, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    return torch.randn(b, d, L, device="cuda", dtype=torch.bfloat16)
def call(x, backend):
    w = (torch.randn(x.shape[1], 1, 4, device="cuda") / 2).bfloat16()
    bias = torch.randn(x.shape[1], device="cuda").bfloat16()
    ref = torch.nn.functional.silu(torch.nn.functional.conv1d(x.double(), w.double(), bias.double(), padding=3, groups=x.shape[1])[..., :x.shape[2]])
    with torch.no_grad():
        out = fastconv.conv1d(x, w, bias, padding=((3, 0),), groups=x.shape[1], activation="silu", backend=backend)
    torch.cuda.synchronize()
    return float((out.double() - ref).norm() / ref.norm())
if variant == "history":
    for LL in (256, 512, 1024, 2048):
        print("L", LL, call(make(b, d, LL, layout), backend), flush=True)
elif variant == "explain":
    x = make(b, d, L, layout)
    w = (torch.randn(d, 1, 4, device="cuda") / 2).bfloat16()
    print(fastconv.explain(x, w, None, padding=((3, 0),), groups=d, activation="silu"), flush=True)
else:
    print("rel err", call(make(b, d, L, layout), backend), flush=True)
'''
# (the run at b325779 ran these nine; the run at 6fcb384, after the fix, "history" then the
# first "one")
variants = [("one", 8, 1536, 2048, "view", "auto"), ("one", 8, 1536, 2048, "dense", "auto"),
            ("one", 8, 1536, 2048, "view", "triton"), ("one", 8, 1536, 2048, "view", "cudnn"),
            ("one", 8, 1536, 2048, "view", "aten"), ("one", 8, 1536, 1024, "view", "auto"),
            ("one", 8, 4096, 2048, "view", "auto"), ("history", 8, 1536, 0, "view", "auto"),
            ("explain", 8, 1536, 2048, "view", "auto")]
env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
for v in variants:
    r = subprocess.run([sys.executable, "-c", CHILD, *map(str, v)], capture_output=True, text=True, env=env, timeout=90)
    print("==", v, "rc", r.returncode, flush=True)
    out = (r.stdout + r.stderr).strip().splitlines()
    print("\n".join(out[-(60 if v[0] == "explain" else 12):]), flush=True)
