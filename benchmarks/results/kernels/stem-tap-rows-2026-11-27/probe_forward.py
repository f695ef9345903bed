"""Throwaway device probe: tap-row tiles on stem shapes against cuDNN and the flat tiles."""
import dataclasses, itertools, statistics, sys
import torch, torch.nn.functional as F, triton
from fastconv import ConvProblem
from fastconv.backends.triton import TritonBackend
from fastconv.precision import relative_error
from fastconv.tools.bench.timers import time_graph
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = True
print(torch.cuda.get_device_name(), "triton", triton.__version__, flush=True)
SHAPES = [("r50_b256", 256, 224), ("r50_b32", 32, 224), ("dlv3_b8_512", 8, 512)]
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    for name, n, hw in SHAPES:
        if dtype == torch.float32 and n == 256:
            continue
        x = torch.randn(n, 3, hw, hw, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last)
        w = (torch.randn(64, 3, 7, 7, device="cuda") / 12).to(dtype).contiguous(memory_format=torch.channels_last)
        ref = F.conv2d(x.double(), w.double(), None, 2, 3)
        t_cudnn = statistics.median(time_graph([lambda: F.conv2d(x, w, None, 2, 3)], reps=10, calls=8))
        e_cudnn = relative_error(F.conv2d(x, w, None, 2, 3), ref)
        problem = ConvProblem.from_tensors(x, w, None, 2, 3, rank=2,
                                           precision="tf32" if dtype == torch.float32 else None)
        cands = TritonBackend.candidates(problem)
        taps = [c for c in cands if c.tap_rows]
        extra = [dataclasses.replace(taps[0], block_m=bm, num_warps=wp, num_stages=st)
                 for bm, wp, st in itertools.product((64, 128, 256), (4, 8), (2, 3, 4))]
        cands = cands + [c for c in extra if c not in cands]
        out = torch.empty(ref.shape, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
        res = []
        for cfg in cands:
            try:
                run = TritonBackend.bind(problem, cfg)
                out.fill_(float("nan"))
                run(x, w, None, None, None, None, out)
                err = relative_error(out, ref)
                t = statistics.median(time_graph([lambda: run(x, w, None, None, None, None, out)], reps=10, calls=8))
            except Exception as exc:
                print("  ", cfg.name(), type(exc).__name__, str(exc)[:150], flush=True)
                continue
            res.append((t, cfg.name(), err))
        res.sort()
        flat = [r for r in res if not r[1].endswith("t")]
        listed = {c.name() for c in TritonBackend.candidates(problem)}
        print(f"{name} {str(dtype)[6:]}: cudnn {t_cudnn:.4f} ms (err {e_cudnn:.1e}); best tap-row "
              f"{[r for r in res if r[1].endswith('t')][0]}; best flat {flat[0] if flat else None}; "
              f"speedup {t_cudnn / res[0][0]:.2f}x; listed best {[r for r in res if r[1] in listed][0]}", flush=True)
        print("   all:", ", ".join(f"{n} {t:.4f} {e:.1e}" for t, n, e in res), flush=True)
