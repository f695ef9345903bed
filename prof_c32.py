# throwaway: host cost of fastconv's Triton conv1d path on seed002's small dense cases
import cProfile, pstats, statistics, time, io
import torch, torch.nn.functional as F
import fastconv
torch.backends.cudnn.benchmark = True

def per_call(fn, n=300, rounds=7):
    for _ in range(30): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n): fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(ts)

for c in (32, 64, 128):
    x = torch.randn(128, c, 448, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2 * c, c, 3, device="cuda", dtype=torch.bfloat16) * 0.1
    fns = {"torch": lambda: F.conv1d(x, w, None, 1, 1),
           "fc_triton": lambda: fastconv.conv1d(x, w, None, 1, 1, backend="triton"),
           "fc_aten": lambda: fastconv.conv1d(x, w, None, 1, 1, backend="aten"),
           "fc_auto": lambda: fastconv.conv1d(x, w, None, 1, 1)}
    for f in fns.values(): f()
    res = {k: [] for k in fns}
    for _ in range(3):
        for k, f in fns.items(): res[k].append(per_call(f))
    print(f"c{c}: " + "  ".join(f"{k} {statistics.median(v):6.1f}us" for k, v in res.items()))
    print(fastconv.explain(x, w, None, 1, 1) if c == 32 else "")
    # GPU time alone of the triton path: torch profiler-free estimate via CUDA graph? use events on 300 calls after a long sleep kernel
    pr = cProfile.Profile(); pr.enable()
    for _ in range(2000): fns["fc_triton"]()
    pr.disable(); torch.cuda.synchronize()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22); print(s.getvalue()[-4500:])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]) as p:
        for _ in range(20): fns["fc_triton"]()
        torch.cuda.synchronize()
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
