"""Can a Triton 1x1 convolution carry a training layer's BatchNorm work at cuDNN's speed
(issue 55)? ResNet-50's 1x1 layers at batch 256, channels-last, bf16.

A 1x1 convolution of a channels-last tensor is a GEMM ``Y[m, n] = Σ_k A[m, k] W[n, k]`` over
``M = batch·H·W`` rows. In a bottleneck the last 1x1 convolution (conv3) reads
``A = relu(X·S + B)``: the previous layer's pre-BatchNorm output X, normalised by its
per-channel scale S and shift B (float32). Today fastconv runs, per such layer,

* forward: an apply pass (read X, write A), cuDNN's convolution of A, a statistics pass
  (read Y) for this layer's BatchNorm;
* backward: cuDNN's weight gradient of A (dW = Aᵀ dY), among others.

The fused forms timed here, each one Triton kernel:

* ``fused_fprop``: A computed from X as its tiles are loaded (the **prologue**), Y written,
  and per-tile column sums Σy, Σy² of the bf16 Y (the **statistics epilogue**; a fixed-order
  sum over tiles after, timed with it);
* ``genstats``: the same without the prologue (conv1, whose input is the block's output and
  is materialised anyway);
* ``fused_wgrad``: dW with A recomputed from X in the prologue (split over M, fixed-order
  sum after, timed with it): what cuDNN has no engine for (``../fusion-probe-2026-11-28``).

Against: cuDNN's bare convolution (aten, cudnn.benchmark), fastconv's apply and statistics
passes (``bnstats``), cuDNN's bare weight gradient. Every output is poisoned with NaN before
the first call and checked against float32 torch (relative Frobenius error). Times: each
variant captured in a CUDA graph of ``CALLS`` calls, the graphs replayed in turn ``ROUNDS``
times (each timed replay after an untimed one), medians per call. Each Triton kernel's tile
is the best of ``CONFIGS`` on that shape (timed the same way, fewer rounds).

One JSON line per layer on stdout, a table last. Run on a GPU: ``python3 probe_prologue_gemm.py``
(``N=...`` for another batch); under ``TRITON_INTERPRET=1`` at ``N=1`` it checks the maths (in
float32)."""
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from fastconv.backends.triton import bnstats

GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEV = "cuda" if torch.cuda.is_available() else "cpu"
N = int(os.environ.get("N", 256 if GPU else 1))
# bf16; float32 in the interpreter, whose bf16 tl.dot is wrong
DT = torch.bfloat16 if GPU else torch.float32
# (name, input channels, output channels, spatial size, prologue: the input is a BN+ReLU output)
LAYERS = [("l1_conv3_64to256", 64, 256, 56, True), ("l2_conv3_128to512", 128, 512, 28, True),
          ("l3_conv3_256to1024", 256, 1024, 14, True), ("l4_conv3_512to2048", 512, 2048, 7, True),
          ("l1_conv1_256to64", 256, 64, 56, False), ("l2_conv1_512to128", 512, 128, 28, False),
          ("l3_conv1_1024to256", 1024, 256, 14, False), ("l4_conv1_2048to512", 2048, 512, 7, False)]
if not GPU:
    LAYERS = [(n, c, k, 5, p) for n, c, k, _, p in LAYERS[:1] + LAYERS[4:5]]
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
CONFIGS = [(128, 128, 64, 4, 4), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3),
           (128, 64, 64, 4, 4), (64, 256, 64, 4, 3), (256, 64, 64, 4, 4)] if GPU else \
    [(16, 16, 16, 1, 1)]
# wgrad: (BLOCK_K: input channels, BLOCK_N: output channels, BLOCK_M: reduction, warps, stages)
WCONFIGS = [(64, 128, 64, 4, 3), (128, 128, 64, 8, 3), (64, 64, 128, 4, 3),
            (128, 64, 64, 4, 4), (128, 256, 64, 8, 3)] if GPU else [(16, 16, 16, 1, 1)]
CALLS, ROUNDS = (10, 15) if GPU else (1, 1)
PERSIST = int(os.environ.get("PERSIST", 2))  # persistent programs per SM
SMS = int(os.environ.get("SMS", 0)) or (
    torch.cuda.get_device_properties(0).multi_processor_count if GPU else 64)


@triton.jit
def _fprop_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, part_ptr, M, N, K,
                  PRO: tl.constexpr, STATS: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Y = prologue(X) @ Wᵀ; X (M, K) and Y (M, N) row-major, W (N, K); K % BLOCK_K == 0.
    With STATS, part[pid_m] = (Σ_rows y, Σ_rows y²) of the tile's bf16 outputs."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    rows = (offs_m % M).to(tl.int64)
    cols = offs_n % N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + rows[:, None] * K + offs_k[None, :])
        if PRO:
            scale = tl.load(s_ptr + offs_k)
            shift = tl.load(b_ptr + offs_k)
            a = tl.maximum(a.to(tl.float32) * scale[None, :] + shift[None, :], 0.0)
            a = a.to(x_ptr.dtype.element_ty)
        b = tl.load(w_ptr + cols[None, :] * K + offs_k[:, None])
        acc = tl.dot(a, b, acc)
    y = acc.to(y_ptr.dtype.element_ty)
    mask = mask_m[:, None] & mask_n[None, :]
    tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :], y, mask=mask)
    if STATS:
        yf = tl.where(mask, y.to(tl.float32), 0.0)
        base = part_ptr + pid_m * 2 * N
        tl.store(base + offs_n, tl.sum(yf, 0), mask=mask_n)
        tl.store(base + N + offs_n, tl.sum(yf * yf, 0), mask=mask_n)


@triton.jit
def _fprop_persistent_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, part_ptr, M, N, K,
                             PRO: tl.constexpr, STATS: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr):
    """``_fprop_kernel`` with one program per SM walking the tiles, the tile and reduction
    loops flattened so that the next tile's loads are issued while this one computes and
    stores (Triton's persistent-matmul tutorial's scheme)."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    width = GROUP_M * num_n
    for tile in tl.range(tl.program_id(0), num_m * num_n, PROGRAMS, flatten=True):
        first_m = (tile // width) * GROUP_M
        size_m = min(num_m - first_m, GROUP_M)
        pid_m = first_m + (tile % width) % size_m
        pid_n = (tile % width) // size_m
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rows = (offs_m % M).to(tl.int64)
        cols = offs_n % N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(k_steps):
            offs_k = kk * BLOCK_K + tl.arange(0, BLOCK_K)
            a = tl.load(x_ptr + rows[:, None] * K + offs_k[None, :])
            if PRO:
                scale = tl.load(s_ptr + offs_k)
                shift = tl.load(b_ptr + offs_k)
                a = tl.maximum(a.to(tl.float32) * scale[None, :] + shift[None, :], 0.0)
                a = a.to(x_ptr.dtype.element_ty)
            b = tl.load(w_ptr + cols[None, :] * K + offs_k[:, None])
            acc = tl.dot(a, b, acc)
        y = acc.to(y_ptr.dtype.element_ty)
        mask_m = offs_m < M
        mask_n = offs_n < N
        mask = mask_m[:, None] & mask_n[None, :]
        tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :], y, mask=mask)
        if STATS:
            yf = tl.where(mask, y.to(tl.float32), 0.0)
            base = part_ptr + pid_m * 2 * N
            tl.store(base + offs_n, tl.sum(yf, 0), mask=mask_n)
            tl.store(base + N + offs_n, tl.sum(yf * yf, 0), mask=mask_n)


@triton.jit
def _wgrad_kernel(x_ptr, dy_ptr, s_ptr, b_ptr, part_ptr, M, N, K, per_split,
                  PRO: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_M: tl.constexpr):
    """part[split] = prologue(X)[rows of split]ᵀ @ dY[rows of split], float32 (K, N);
    X (M, K), dY (M, N) row-major; K % BLOCK_K == 0, N % BLOCK_N == 0."""
    pid_k = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if PRO:
        scale = tl.load(s_ptr + offs_k)
        shift = tl.load(b_ptr + offs_k)
    acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    m_begin = split * per_split
    m_end = min(M, m_begin + per_split)
    for m0 in range(m_begin, m_end, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        ok = offs_m < m_end
        rows = offs_m.to(tl.int64)
        a = tl.load(x_ptr + rows[:, None] * K + offs_k[None, :], mask=ok[:, None], other=0.0)
        if PRO:  # rows past the split's end must stay zero after the shift
            a = tl.maximum(a.to(tl.float32) * scale[None, :] + shift[None, :], 0.0)
            a = tl.where(ok[:, None], a, 0.0).to(x_ptr.dtype.element_ty)
        d = tl.load(dy_ptr + rows[:, None] * N + offs_n[None, :], mask=ok[:, None], other=0.0)
        acc = tl.dot(tl.trans(a), d, acc)
    out = part_ptr + split * K * N + offs_k[:, None] * N + offs_n[None, :]
    tl.store(out, acc)


def fprop(x, w, s, b, cfg, pro: bool, stats: bool, poison: bool = False,
          persistent: bool = False):
    """(Y, (Σy, Σy²) or None); the tile sums added in a fixed order (torch.sum over dim 0).
    ``poison``: the buffers start as NaN (a check that the kernel writes every element);
    ``persistent``: ``_fprop_persistent_kernel``, ``PERSIST`` programs per SM."""
    M, K = x.shape
    Nc = w.shape[0]
    bm, bn, bk, warps, stages = cfg
    new = torch.full if poison else (lambda shape, _, **kw: torch.empty(shape, **kw))
    y = new((M, Nc), float("nan"), device=x.device, dtype=x.dtype)
    tiles = triton.cdiv(M, bm)
    part = new((tiles, 2, Nc), float("nan"), device=x.device, dtype=torch.float32) \
        if stats else y
    count = tiles * triton.cdiv(Nc, bn)
    if persistent:
        programs = min(count, PERSIST * SMS)
        _fprop_persistent_kernel[(programs,)](
            x, w, s, b, y, part, M, Nc, K, PRO=pro, STATS=stats, BLOCK_M=bm, BLOCK_N=bn,
            BLOCK_K=bk, GROUP_M=8, PROGRAMS=programs, num_warps=warps, num_stages=stages)
    else:
        _fprop_kernel[(count,)](x, w, s, b, y, part, M, Nc, K, PRO=pro, STATS=stats,
                                BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
                                num_warps=warps, num_stages=stages)
    return y, (part.sum(0) if stats else None)


def splits(M, K, Nc, cfg):
    bk, bn, bm = cfg[:3]
    tiles = (K // bk) * (Nc // bn)
    want = max(1, triton.cdiv(4 * SMS, tiles))
    per = max(bm, triton.cdiv(triton.cdiv(M, want), bm) * bm)
    return triton.cdiv(M, per), per


def wgrad(x, dy, s, b, cfg, pro: bool, poison: bool = False):
    """dW (N, K) in dY's dtype (``poison``: as ``fprop``'s)."""
    M, K = x.shape
    Nc = dy.shape[1]
    bk, bn, bm, warps, stages = cfg
    count, per = splits(M, K, Nc, cfg)
    part = (torch.full if poison else torch.empty)(
        (count, K, Nc), *((float("nan"),) if poison else ()), device=x.device,
        dtype=torch.float32)
    _wgrad_kernel[(K // bk, Nc // bn, count)](x, dy, s, b, part, M, Nc, K, per, PRO=pro,
                                               BLOCK_K=bk, BLOCK_N=bn, BLOCK_M=bm,
                                               num_warps=warps, num_stages=stages)
    return part.sum(0).t().to(dy.dtype)


def nchw(t, n, h):
    """The (M, C) row-major matrix as the channels-last (n, C, h, h) tensor it is."""
    return t.view(n, h, h, -1).permute(0, 3, 1, 2)


def graph_times(fns: dict, rounds=ROUNDS, calls=CALLS) -> dict:
    """Median ms per call of each function, captured CALLS times in a CUDA graph, the
    graphs replayed in turn (each timed replay after an untimed one)."""
    if not GPU:
        for f in fns.values():
            f()
        return {k: float("nan") for k in fns}
    graphs = {}
    for name, f in fns.items():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                f()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(calls):
                f()
        graphs[name] = g
    times = {k: [] for k in fns}
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, g in graphs.items():
            g.replay()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            g.replay()
            end.record()
            end.synchronize()
            times[name].append(begin.elapsed_time(end) / calls)
    return {k: statistics.median(v) for k, v in times.items()}


def best_config(make, configs) -> tuple:
    """(config, ms) of the fastest config that compiles, ``make(cfg)`` a call (None: the
    config does not fit the shape)."""
    fns = {}
    for cfg in configs:
        if make(cfg) is None:
            continue
        try:
            make(cfg)()
            fns[cfg] = make(cfg)
        except Exception as exc:  # out of shared memory or registers: skipped, said
            print(f"# config {cfg} failed: {type(exc).__name__}: {str(exc)[:120]}",
                  file=sys.stderr)
    ms = graph_times(fns, rounds=5)
    cfg = min(ms, key=lambda c: (ms[c], configs.index(c)))
    return cfg, ms[cfg]


def rel(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


def layer(name, cin, cout, hw, pro):
    M = N * hw * hw
    g = torch.Generator(device=DEV).manual_seed(hash(name) % 2**31)
    x = torch.randn(M, cin, device=DEV, generator=g).to(DT)
    w = (torch.randn(cout, cin, device=DEV, generator=g) / cin ** 0.5).to(DT)
    s = (0.5 + torch.rand(cin, device=DEV, generator=g)).float()
    b = (torch.randn(cin, device=DEV, generator=g) * 0.5).float()
    dy = torch.randn(M, cout, device=DEV, generator=g).to(DT)
    w4 = w.view(cout, cin, 1, 1).contiguous(memory_format=torch.channels_last)
    gamma = torch.ones(cout, device=DEV)
    beta = torch.zeros(cout, device=DEV)

    # references (float32 torch) and the fused outputs' errors
    a_ref = torch.relu(x.float() * s + b) if pro else x.float()
    y_ref = a_ref @ w.float().t()
    yb = y_ref.to(DT).float()
    sums_ref = torch.stack([yb.sum(0), (yb * yb).sum(0)])
    dw_ref = dy.float().t() @ a_ref
    a_bf = a_ref.to(DT)

    fcfg, _ = best_config(lambda c: lambda: fprop(x, w, s, b, c, pro, True), CONFIGS)
    pcfg, _ = best_config(lambda c: lambda: fprop(x, w, s, b, c, pro, True, persistent=True),
                          CONFIGS)
    wcfg, _ = best_config(lambda c: (lambda: wgrad(x, dy, s, b, c, pro))
                          if cin % c[0] == 0 and cout % c[1] == 0 else None, WCONFIGS)
    bcfg, _ = best_config(lambda c: lambda: fprop(a_bf if pro else x, w, s, b, c, False, False),
                          CONFIGS)
    y, sums = fprop(x, w, s, b, fcfg, pro, True, poison=True)
    yp, sums_p = fprop(x, w, s, b, pcfg, pro, True, poison=True, persistent=True)
    dw = wgrad(x, dy, s, b, wcfg, pro, poison=True)
    check = dict(y=rel(y, y_ref), sums=rel(sums, sums_ref), dw=rel(dw, dw_ref),
                 y_persistent=rel(yp, y_ref), sums_persistent=rel(sums_p, sums_ref),
                 nan_left=bool(y.isnan().any() or sums.isnan().any() or dw.isnan().any() or
                               yp.isnan().any() or sums_p.isnan().any()))

    a_in = nchw(a_bf if pro else x, N, hw)
    x_nchw = nchw(x, N, hw)
    dy_nchw = nchw(dy, N, hw)
    fns = {
        "cudnn_fprop": lambda: F.conv2d(a_in, w4),
        "triton_fprop": lambda: fprop(a_bf if pro else x, w, s, b, bcfg, False, False),
        "fused_fprop": lambda: fprop(x, w, s, b, fcfg, pro, True),
        "persistent_fprop": lambda: fprop(x, w, s, b, pcfg, pro, True, persistent=True),
        "stats_pass": lambda: bnstats.forward_stats(nchw(y, N, hw), gamma, beta, 1e-5,
                                                    None, None, 0.1),
        "cudnn_wgrad": lambda: torch.ops.aten.convolution_backward(
            dy_nchw, a_in, w4, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
            [False, True, False])[1],
        "fused_wgrad": lambda: wgrad(x, dy, s, b, wcfg, pro),
    }
    if pro:
        sc = s.clone()
        sh = b.clone()
        fns["apply_pass"] = lambda: bnstats.apply(x_nchw, None, sc, sh, "relu", 0.0)
    ms = graph_times(fns)
    unfused = ms["cudnn_fprop"] + ms["stats_pass"] + ms.get("apply_pass", 0.0) + ms["cudnn_wgrad"]
    fused = min(ms["fused_fprop"], ms["persistent_fprop"]) + ms["fused_wgrad"]
    # byte floor of the fused pair: fprop reads X, writes Y; wgrad reads X and dY
    floor_bytes = 2 * (M * cin + M * cout) + 2 * (M * cin + M * cout)
    row = dict(layer=name, batch=N, M=M, cin=cin, cout=cout, prologue=pro,
               fprop_tile=fcfg, persistent_tile=pcfg, wgrad_tile=wcfg, bare_tile=bcfg, errors=check,
               ms=ms, unfused_ms=unfused, fused_ms=fused,
               fused_floor_ms=floor_bytes / 4.8e12 * 1e3)
    print(json.dumps(row), flush=True)
    return row


def main():
    torch.backends.cudnn.benchmark = True
    meta = dict(gpu=torch.cuda.get_device_name() if GPU else "cpu (interpreter)",
                torch=torch.__version__, triton=triton.__version__,
                cudnn=torch.backends.cudnn.version() if GPU else None,
                sha=os.environ.get("FASTCONV_GIT_SHA", "?"))
    print(json.dumps(meta), flush=True)
    rows = [layer(*spec) for spec in LAYERS]
    cols = ["cudnn_fprop", "triton_fprop", "fused_fprop", "persistent_fprop", "apply_pass",
            "stats_pass", "cudnn_wgrad", "fused_wgrad"]
    print(f"{'layer':22s} " + " ".join(f"{c:>12s}" for c in cols) +
          f" {'unfused':>8s} {'fused':>8s} {'gain':>6s} {'err y/dw':>15s}")
    for r in rows:
        print(f"{r['layer']:22s} " + " ".join(f"{r['ms'].get(c, float('nan')):12.4f}"
                                               for c in cols) +
              f" {r['unfused_ms']:8.4f} {r['fused_ms']:8.4f} "
              f"{r['unfused_ms'] / r['fused_ms']:6.2f} "
              f"{r['errors']['y']:.1e}/{r['errors']['dw']:.1e}")


if __name__ == "__main__":
    main()
