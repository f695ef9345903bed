"""Which cuDNN runtime-fusion graphs of a conv -> BatchNorm -> ReLU training layer run on this
GPU, are they correct, and what do they cost against the bare convolution (issue 55)?

ResNet-50 layer shapes at batch 256, channels-last, fp16 and bf16. For a layer whose input
is the previous layer's pre-BatchNorm output X (its BatchNorm applied as a per-channel scale
S and shift B, then ReLU):
- ``sbr_fprop_genstats`` / ``sbr_fprop_sums``: relu(X*S+B) in the convolution's prologue, Y
  written, per-channel sum and sum of squares of Y from its epilogue (genstats, or two
  reductions);
- ``fprop_sums``: the same without the prologue;
- ``dgrad_drelu_sums``: the data gradient dZ = dgrad(dY, W) with ReLU's backward (against
  X*S+B, recomputed) in the epilogue, dR written, and the two sums BatchNorm's backward
  needs (sum dR, sum dR*X);
- ``sbr_wgrad``: the weight gradient with relu(X*S+B) recomputed in its prologue.
S and B are float32, or X's dtype with SB_DTYPE=io (cuDNN's own samples use X's dtype).
Each row: the plan's relative error against float32 torch, its time, the bare aten
convolution's time, and torch's unfused sequence's time (medians of interleaved rounds).
One JSON line per (layer, dtype, graph). Run on the device with the cuDNN frontend on the
path (benchmarks/device_env.sh)."""
import json
import os
import sys

import cudnn
import torch
import torch.nn.functional as F

torch.backends.cudnn.benchmark = True
DEV = "cuda"
N = int(os.environ.get("N", 256))
LAYERS = [("l1_3x3_64", 64, 64, 56, 3), ("l1_1x1_256to64", 256, 64, 56, 1),
          ("l1_1x1_64to256", 64, 256, 56, 1), ("l3_3x3_256", 256, 256, 14, 3),
          ("l3_1x1_1024to256", 1024, 256, 14, 1)]
GRAPHS = os.environ.get("GRAPHS", "sbr_fprop_genstats,sbr_fprop_sums,fprop_sums,"
                        "dgrad_drelu_sums,sbr_wgrad").split(",")
SB_IO = os.environ.get("SB_DTYPE") == "io"
HANDLE = cudnn.create_handle()
CL = torch.channels_last
F32 = cudnn.data_type.FLOAT


def cdt(t):
    return {torch.float16: cudnn.data_type.HALF, torch.bfloat16: cudnn.data_type.BFLOAT16,
            torch.float32: F32}[t]


def bench(fns, rounds=7, n=10):
    ts = {k: [] for k in fns}
    for f in fns.values():
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


def conv_bwd(dy, x, w, p, which):
    """aten's convolution backward, stride 1: which = "dgrad" or "wgrad"."""
    mask = [which == "dgrad", which == "wgrad", False]
    out = torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [p, p], [1, 1], False,
                                              [0, 0], 1, mask)
    return out[0] if which == "dgrad" else out[1]


def rel(a, b):
    return round(((a.float() - b.float()).norm() / b.float().norm()).item(), 7)


def chan(c):
    return dict(dim=[1, c, 1, 1], stride=[c, 1, c, c])


def sums_of(g, t, c, name):
    s = g.reduction(input=t, mode=cudnn.reduction_mode.ADD, compute_data_type=F32, name=name)
    s.set_output(True).set_data_type(F32).set_dim([1, c, 1, 1]).set_stride([c, 1, c, c])
    return s


def sbr(g, X, c, dt):
    """relu's input X*S+B; S and B float32, or X's dtype with SB_DTYPE=io."""
    sb = cdt(dt) if SB_IO else F32
    S = g.tensor(name="S", data_type=sb, **chan(c))
    B = g.tensor(name="B", data_type=sb, **chan(c))
    pre = g.bias(name="bias", input=g.scale(name="scale", input=X, scale=S), bias=B)
    return S, B, pre


def build(g):
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return torch.empty(g.get_workspace_size(), device=DEV, dtype=torch.uint8)


def probe(kind, name, cin, cout, hw, r, dt):
    p = r // 2
    geo = dict(padding=[p, p], stride=[1, 1], dilation=[1, 1])
    x = torch.randn(N, cin, hw, hw, device=DEV, dtype=dt).to(memory_format=CL)
    w = torch.randn(cout, cin, r, r, device=DEV, dtype=dt) / (cin * r * r) ** 0.5
    w = w.to(memory_format=CL)
    dy = torch.randn(N, cout, hw, hw, device=DEV, dtype=dt).to(memory_format=CL)
    s = (torch.rand(cin, device=DEV) + 0.5).view(1, cin, 1, 1)
    b = (torch.randn(cin, device=DEV) * 0.5).view(1, cin, 1, 1)
    if SB_IO:
        s, b = s.to(dt), b.to(dt)
    z32 = torch.relu(x.float() * s.float() + b.float())
    g = cudnn.pygraph(io_data_type=cdt(dt), intermediate_data_type=F32, compute_data_type=F32,
                      handle=HANDLE)
    X = g.tensor(name="X", dim=list(x.size()), stride=list(x.stride()), data_type=cdt(dt))
    W = g.tensor(name="W", dim=list(w.size()), stride=list(w.stride()), data_type=cdt(dt))
    row = dict(layer=name, dtype=str(dt)[6:], n=N, graph=kind, sb_dtype=str(s.dtype)[6:])
    errs, pack, bufs = {}, {X: x, W: w}, {}
    if kind in ("sbr_fprop_genstats", "sbr_fprop_sums", "fprop_sums"):
        if kind == "fprop_sums":
            inp, ref_in = X, x.float()
        else:
            S, B, pre = sbr(g, X, cin, dt)
            pack.update({S: s, B: b})
            inp, ref_in = g.relu(name="relu", input=pre), z32
        Y = g.conv_fprop(image=inp, weight=W, **geo)
        Y.set_output(True).set_data_type(cdt(dt))
        if kind == "sbr_fprop_genstats":
            S1, S2 = g.genstats(name="gs", input=Y)
            for t in (S1, S2):
                t.set_output(True).set_data_type(F32)
        else:
            S1 = sums_of(g, Y, cout, "sum")
            S2 = sums_of(g, g.mul(a=Y, b=Y, compute_data_type=F32, name="sq"), cout, "sumsq")
        ws = build(g)
        y = torch.empty(N, cout, hw, hw, device=DEV, dtype=dt).to(memory_format=CL)
        bufs = dict(y=y, s1=torch.zeros(1, cout, 1, 1, device=DEV),
                    s2=torch.zeros(1, cout, 1, 1, device=DEV))
        pack.update({Y: y, S1: bufs["s1"], S2: bufs["s2"]})
        ref = F.conv2d(ref_in, w.float(), padding=p)
        refs = dict(y=ref, s1=ref.sum((0, 2, 3)), s2=ref.square().sum((0, 2, 3)))

        def torch_bare():
            return F.conv2d(x, w, padding=p)

        def torch_unfused():
            a = torch.relu(x * s + b).to(dt) if kind != "fprop_sums" else x
            o = F.conv2d(a, w, padding=p)
            return torch.var_mean(o, dim=(0, 2, 3))
    elif kind == "dgrad_drelu_sums":
        DY = g.tensor(name="DY", dim=list(dy.size()), stride=list(dy.stride()), data_type=cdt(dt))
        DZ = g.conv_dgrad(loss=DY, filter=W, **geo)
        DZ.set_dim(list(x.size())).set_stride(list(x.stride()))
        S, B, pre = sbr(g, X, cin, dt)
        DR = g.relu_backward(loss=DZ, input=pre, name="drelu")
        DR.set_output(True).set_data_type(cdt(dt))
        S1 = sums_of(g, DR, cin, "sum_dr")
        S2 = sums_of(g, g.mul(a=DR, b=X, compute_data_type=F32, name="drx"), cin, "sum_drx")
        ws = build(g)
        dr = torch.empty_like(x)
        bufs = dict(dr=dr, s1=torch.zeros(1, cin, 1, 1, device=DEV),
                    s2=torch.zeros(1, cin, 1, 1, device=DEV))
        pack.update({DY: dy, S: s, B: b, DR: dr, S1: bufs["s1"], S2: bufs["s2"]})
        dz = conv_bwd(dy.float(), z32, w.float(), p, "dgrad")
        dr32 = dz * (x.float() * s.float() + b.float() > 0)
        refs = dict(dr=dr32, s1=dr32.sum((0, 2, 3)), s2=(dr32 * x.float()).sum((0, 2, 3)))

        def torch_bare():
            return conv_bwd(dy, x, w, p, "dgrad")

        def torch_unfused():
            d = torch_bare()
            m = (x * s + b) > 0
            d = d * m
            return d, d.float().sum((0, 2, 3)), (d.float() * x).sum((0, 2, 3))
    elif kind == "sbr_wgrad":
        DY = g.tensor(name="DY", dim=list(dy.size()), stride=list(dy.stride()), data_type=cdt(dt))
        S, B, pre = sbr(g, X, cin, dt)
        DW = g.conv_wgrad(name="wgrad", image=g.relu(name="relu", input=pre), loss=DY, **geo)
        DW.set_output(True).set_dim(list(w.size())).set_stride(list(w.stride())).set_data_type(F32)
        ws = build(g)
        dw = torch.empty(w.size(), device=DEV, dtype=torch.float32).to(memory_format=CL)
        bufs = dict(dw=dw)
        pack.update({DY: dy, S: s, B: b, DW: dw})
        refs = dict(dw=conv_bwd(dy.float(), z32, w.float(), p, "wgrad"))

        def torch_bare():
            return conv_bwd(dy, x, w, p, "wgrad")

        def torch_unfused():
            a = torch.relu(x * s + b).to(dt)
            return conv_bwd(dy, a, w, p, "wgrad")
    else:
        raise ValueError(kind)
    for v in bufs.values():
        v.fill_(float("nan"))
    g.execute(pack, ws, handle=HANDLE)
    torch.cuda.synchronize()
    for k, v in bufs.items():
        errs[k] = rel(v.reshape(refs[k].shape), refs[k])
        errs[k + "_nan"] = int(torch.isnan(v).sum().item())
    row["err"] = errs
    row["ms"] = bench({"fused": lambda: g.execute(pack, ws, handle=HANDLE), "bare": torch_bare,
                       "unfused": torch_unfused})
    row["fused_vs_bare"] = round(row["ms"]["bare"] / row["ms"]["fused"], 3)
    row["fused_vs_unfused"] = round(row["ms"]["unfused"] / row["ms"]["fused"], 3)
    return row


if __name__ == "__main__":
    print(json.dumps(dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(),
                          cudnn=torch.backends.cudnn.version(), cudnn_frontend=cudnn.__version__,
                          backend=cudnn.backend_version_string(),
                          sha=os.environ.get("FASTCONV_GIT_SHA"))), flush=True)
    g0 = cudnn.pygraph(handle=HANDLE)
    docs = {k: (getattr(g0, k).__doc__ or "")[:600] for k in ("relu_backward", "reduction")}
    print(json.dumps(docs), flush=True)
    for dt in [getattr(torch, d) for d in os.environ.get("DTYPES", "float16,bfloat16").split(",")]:
        for layer in LAYERS:
            for kind in GRAPHS:
                try:
                    row = probe(kind, *layer, dt)
                except Exception as ex:  # noqa: BLE001 - a probe records every refusal
                    row = dict(layer=layer[0], dtype=str(dt)[6:], n=N, graph=kind,
                               error=repr(ex)[:300])
                print(json.dumps(row), flush=True)
                torch.cuda.empty_cache()
    sys.exit(0)
