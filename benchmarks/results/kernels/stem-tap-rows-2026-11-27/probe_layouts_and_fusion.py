"""Throwaway device probe (not committed): (1) the ResNet-50 stem's conv forward + weight
gradient at b256 in four layouts; (2) cuDNN graph forms for per-channel sums in bf16."""
import json
import os
import sys

import torch
import torch.nn.functional as F

torch.backends.cudnn.benchmark = True
OUT = os.environ.get("OUT", ".")
dev = "cuda"
log = open(f"{OUT}/probe.jsonl", "a")


def emit(row):
    print(json.dumps(row), flush=True)
    log.write(json.dumps(row) + "\n")


def bench(fns, rounds=7, n=10):
    ts = {k: [] for k in fns}
    for k, f in fns.items():
        for _ in range(3):
            f()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for k, f in fns.items():
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(n):
                f()
            e.record()
            e.synchronize()
            ts[k].append(s.elapsed_time(e) / n)
    return {k: round(sorted(v)[len(v) // 2], 4) for k, v in ts.items()}


def stem(N, dt):
    cl = torch.channels_last
    x = torch.randn(N, 3, 224, 224, device=dev, dtype=dt)
    w = torch.randn(64, 3, 7, 7, device=dev, dtype=dt) * 0.1
    gy = torch.randn(N, 64, 112, 112, device=dev, dtype=dt).to(memory_format=cl)
    st, pd = [2, 2], [3, 3]

    def run(xx, ww, g):
        y = F.conv2d(xx, ww, stride=2, padding=3)
        dw = torch.ops.aten.convolution_backward(g, xx, ww, None, st, pd, [1, 1], False, [0, 0], 1,
                                                 [False, True, False])[1]
        return y, dw

    xcl, wcl = x.to(memory_format=cl), w.to(memory_format=cl)
    ref_y, ref_dw = run(x.float().to(memory_format=cl), w.float().to(memory_format=cl), gy.float())

    def v_cl():
        return run(xcl, wcl, gy)

    def v_nchw():
        y, dw = run(xcl.contiguous(), w, gy.contiguous())
        return y.contiguous(memory_format=cl), dw

    def pad(c):
        def f():
            xp = F.pad(xcl, (0, 0, 0, 0, 0, c - 3)).contiguous(memory_format=cl)
            wp = F.pad(wcl, (0, 0, 0, 0, 0, c - 3)).contiguous(memory_format=cl)
            y, dw = run(xp, wp, gy)
            return y, dw[:, :3]
        return f

    fns = {"channels_last": v_cl, "nchw_convert": v_nchw, "pad4": pad(4), "pad8": pad(8)}
    errs = {}
    for k, f in fns.items():
        y, dw = f()
        errs[k] = [round(((y.float() - ref_y).norm() / ref_y.norm()).item(), 6),
                   round(((dw.float() - ref_dw).norm() / ref_dw.norm()).item(), 6)]
    # parts: forward alone and wgrad alone, channels_last vs pad8
    xp8 = F.pad(xcl, (0, 0, 0, 0, 0, 5)).contiguous(memory_format=cl)
    wp8 = F.pad(wcl, (0, 0, 0, 0, 0, 5)).contiguous(memory_format=cl)
    parts = {
        "fwd_cl": lambda: F.conv2d(xcl, wcl, stride=2, padding=3),
        "fwd_pad8": lambda: F.conv2d(xp8, wp8, stride=2, padding=3),
        "fwd_nchw": lambda: F.conv2d(x, w, stride=2, padding=3),
        "wgrad_cl": lambda: torch.ops.aten.convolution_backward(gy, xcl, wcl, None, st, pd, [1, 1], False,
                                                                [0, 0], 1, [False, True, False]),
        "wgrad_pad8": lambda: torch.ops.aten.convolution_backward(gy, xp8, wp8, None, st, pd, [1, 1], False,
                                                                  [0, 0], 1, [False, True, False]),
        "pad_x8": lambda: F.pad(xcl, (0, 0, 0, 0, 0, 5)).contiguous(memory_format=cl),
    }
    t = bench(fns)
    t.update(bench(parts))
    emit(dict(probe="stem", n=N, dtype=str(dt)[6:], ms=t, err_y_dw=errs))


def reduction_forms(dt):
    import cudnn
    handle = cudnn.create_handle()
    cdt = {torch.float16: cudnn.data_type.HALF, torch.bfloat16: cudnn.data_type.BFLOAT16}[dt]
    for name, c, k, hw, r in [("l1_1x1_256to64", 256, 64, 56, 1), ("l3_3x3_256", 256, 256, 14, 3)]:
        N = 256
        p = r // 2
        cl = torch.channels_last
        x = torch.randn(N, c, hw, hw, device=dev, dtype=dt).to(memory_format=cl)
        w = (torch.randn(k, c, r, r, device=dev, dtype=dt) / (c * r * r) ** 0.5).to(memory_format=cl)
        ref = F.conv2d(x.float(), w.float(), padding=p)
        for form in ("sum", "sum_sq", "genstats"):
            row = dict(probe="reduction", layer=name, dtype=str(dt)[6:], form=form)
            try:
                g = cudnn.pygraph(io_data_type=cdt, intermediate_data_type=cudnn.data_type.FLOAT,
                                  compute_data_type=cudnn.data_type.FLOAT, handle=handle)
                X = g.tensor(name="X", dim=list(x.size()), stride=list(x.stride()), data_type=cdt)
                W = g.tensor(name="W", dim=list(w.size()), stride=list(w.stride()), data_type=cdt)
                Y = g.conv_fprop(image=X, weight=W, padding=[p, p], stride=[1, 1], dilation=[1, 1])
                Y.set_output(True).set_data_type(cdt)
                outs = []
                if form == "genstats":
                    S1, S2 = g.genstats(name="gs", input=Y)
                    outs = [S1, S2]
                else:
                    S1 = g.reduction(input=Y, mode=cudnn.reduction_mode.ADD,
                                     compute_data_type=cudnn.data_type.FLOAT, name="sum")
                    outs = [S1]
                    if form == "sum_sq":
                        SQ = g.mul(a=Y, b=Y, compute_data_type=cudnn.data_type.FLOAT, name="sq")
                        S2 = g.reduction(input=SQ, mode=cudnn.reduction_mode.ADD,
                                         compute_data_type=cudnn.data_type.FLOAT, name="sumsq")
                        outs.append(S2)
                for o in outs:
                    o.set_output(True).set_data_type(cudnn.data_type.FLOAT).set_dim([1, k, 1, 1]) \
                        .set_stride([k, 1, k, k])
                g.validate()
                g.build_operation_graph()
                g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
                g.check_support()
                g.build_plans()
                y = torch.empty(N, k, hw, hw, device=dev, dtype=dt).to(memory_format=cl)
                bufs = [torch.zeros(1, k, 1, 1, device=dev, dtype=torch.float32) for _ in outs]
                ws = torch.empty(g.get_workspace_size(), device=dev, dtype=torch.uint8)
                pack = {X: x, W: w, Y: y}
                pack.update(dict(zip(outs, bufs)))
                g.execute(pack, ws, handle=handle)
                torch.cuda.synchronize()
                row["err_y"] = ((y.float() - ref).norm() / ref.norm()).item()
                row["err_sum"] = ((bufs[0].flatten() - ref.sum((0, 2, 3))).norm()
                                  / ref.sum((0, 2, 3)).norm()).item()
                if len(bufs) > 1:
                    r2 = ref.square().sum((0, 2, 3))
                    row["err_sq"] = ((bufs[1].flatten() - r2).norm() / r2.norm()).item()
                row["ms"] = bench({"fused": lambda: g.execute(pack, ws, handle=handle),
                                   "conv": lambda: F.conv2d(x, w, padding=p)})
            except Exception as ex:  # noqa: BLE001
                row["error"] = repr(ex)[:400]
            emit(row)


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(), torch.backends.cudnn.version(), flush=True)
    for dt in (torch.bfloat16, torch.float16):
        for N in (256, 32):
            stem(N, dt)
    for dt in (torch.bfloat16, torch.float16):
        reduction_forms(dt)
    sys.exit(0)
