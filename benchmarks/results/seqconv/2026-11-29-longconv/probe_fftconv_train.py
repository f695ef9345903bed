"""Probe (issue 56, 2026-11-29): long_conv1d forward + backward in CUDA graphs, the fused
route (forward and backward kernels, ``backends/triton/fftconv.py``) against the seqconv
bench's torch.fft implementation under autograd; b4 d768, K = L, bf16; interleaved over 5
rounds, medians; the gradients' relative errors against float64.
Run: PYTHONPATH=src python3 probe_fftconv_train.py"""

import json
import sys

import torch

from fastconv import longconv
from fastconv.tools.bench.seqconv import _torch_fft as torch_fft


def graph_ms(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    for a, e in ev:
        a.record()
        g.replay()
        e.record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(e) for a, e in ev)
    return t[len(t) // 2]


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def main():
    print("#", torch.cuda.get_device_name(), torch.__version__, flush=True)
    for L in (1024, 2048):
        g = torch.Generator(device="cpu").manual_seed(L)
        x = torch.randn(4, 768, L, generator=g).cuda().bfloat16().requires_grad_()
        w = (torch.randn(768, L, generator=g) / L ** 0.5).cuda().bfloat16().requires_grad_()
        b = torch.randn(768, generator=g).cuda().bfloat16().requires_grad_()
        dy = torch.randn(4, 768, L, generator=g).cuda().bfloat16()
        refs = [t.detach().double().requires_grad_() for t in (x, w, b)]
        want = torch.autograd.grad(longconv._fft(*refs), refs, dy.double())
        row = {"L": L}
        fns = {"fused": longconv._fused_fft, "torch": torch_fft}
        for name, f in fns.items():
            got = torch.autograd.grad(f(x, w, b), (x, w, b), dy)
            row[f"err_{name}"] = [float(f"{rel(a, c):.3g}") for a, c in zip(got, want)]
        times = {k: [] for k in fns}
        for _ in range(5):
            for k, f in fns.items():
                times[k].append(graph_ms(lambda f=f: torch.autograd.grad(f(x, w, b),
                                                                         (x, w, b), dy)))
        row.update({f"ms_{k}": round(sorted(v)[2], 4) for k, v in times.items()})
        row["speedup"] = round(row["ms_torch"] / row["ms_fused"], 3)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
