"""Throwaway device probe: tap-row weight-gradient tiles on stem shapes against cuDNN."""
import dataclasses, itertools, statistics
import torch, triton
from fastconv import ConvProblem
from fastconv.backends.triton import TritonBackend
from fastconv.precision import relative_error
from fastconv.tools.bench.timers import time_graph
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = True
print(torch.cuda.get_device_name(), "triton", triton.__version__, flush=True)
import os
SHAPES = [("r50_b256", 256, 224), ("r50_b32", 32, 224), ("dlv3_b8_512", 8, 512)][:int(os.environ.get("NSHAPES", 3))]
for dtype in (torch.bfloat16, torch.float16, torch.float32)[:int(os.environ.get("NDTYPES", 3))]:
    for name, n, hw in SHAPES:
        if dtype != torch.bfloat16 and n == 256:
            continue
        cl = torch.channels_last
        x = torch.randn(n, 3, hw, hw, device="cuda").to(dtype).contiguous(memory_format=cl)
        w = (torch.randn(64, 3, 7, 7, device="cuda") / 12).to(dtype).contiguous(memory_format=cl)
        g = torch.randn(n, 64, hw // 2, hw // 2, device="cuda").to(dtype).contiguous(memory_format=cl)
        ref = torch.nn.grad.conv2d_weight(x.double(), w.shape, g.double(), 2, 3)
        aten = lambda: torch.ops.aten.convolution_backward(g, x, w, None, [2, 2], [3, 3], [1, 1], False, [0, 0], 1, [False, True, False])
        t_cudnn = statistics.median(time_graph([aten], reps=10, calls=8))
        e_cudnn = relative_error(aten()[1], ref)
        problem = ConvProblem.from_tensors(x, w, None, 2, 3, rank=2,
                                           precision="tf32" if dtype == torch.float32 else None)
        listed = TritonBackend.candidates(problem, "wgrad")
        taps = [c for c in listed if c.tap_rows]
        extra = [dataclasses.replace(taps[0], block_k=bk, num_warps=wp, num_stages=st, split_k=sp)
                 for bk, wp, st, sp in itertools.product((64, 128, 256), (4, 8), (3,), (taps[0].split_k // 2, taps[0].split_k, min(128, taps[0].split_k * 2)))]
        cands = listed + [c for c in extra if c not in listed]
        dw = torch.empty(w.shape, device="cuda", dtype=dtype)
        res = []
        for cfg in cands:
            try:
                run = TritonBackend.bind(problem, cfg, "wgrad")
                dw.fill_(float("nan"))
                run(g, x, dw)
                err = relative_error(dw, ref)
                t = statistics.median(time_graph([lambda: run(g, x, dw)], reps=10, calls=8))
            except Exception as exc:
                print("  ", cfg.name(), type(exc).__name__, str(exc)[:150], flush=True)
                continue
            res.append((t, cfg.name(), err))
        res.sort()
        names = {c.name() for c in listed}
        print(f"{name} {str(dtype)[6:]}: cudnn {t_cudnn:.4f} ms (err {e_cudnn:.1e}); best {res[0]}; "
              f"speedup {t_cudnn / res[0][0]:.2f}x; listed best {[r for r in res if r[1] in names][0]}", flush=True)
        print("   all:", ", ".join(f"{n} {t:.4f} {e:.1e}" for t, n, e in res[:12]), flush=True)
