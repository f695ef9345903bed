"""Issue 22, deliverable 5: one real option for ConvNeXt's depthwise conv -> LayerNorm, a
depthwise 7x7 convolution with the channels-last LayerNorm fused into its epilogue (one
Triton kernel: each program computes BLOCK_P output pixels over all C channels, then
normalises each pixel's C values), against what torch runs (cuDNN's depthwise convolution,
then layer_norm over the channels-last rows). An experiment, not a library kernel.

Checks the fused kernel against float64 (poisoned output, odd sizes), then times both under
CUDA graphs on ConvNeXt-T's four stages (batch 32, bf16), inputs rotated over more than
twice the L2 cache.

    PYTHONPATH=src python benchmarks/dw_layernorm_experiment.py          # GPU: check + time
    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/dw_layernorm_experiment.py --check-only
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from fastconv.dispatch import rotation_count
from fastconv.precision import relative_error
from fastconv.tools.bench.runner import time_graph


@triton.jit
def _dw_ln_kernel(x_ptr, w_ptr, b_ptr, g_ptr, beta_ptr, y_ptr, P, H, W, C, eps,
                  K: tl.constexpr, PAD: tl.constexpr, BLOCK_P: tl.constexpr,
                  BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)
    p = pid * BLOCK_P + tl.arange(0, BLOCK_P)  # output pixels (n, h, w), stride 1
    c = tl.arange(0, BLOCK_C)
    pm = p < P
    cm = c < C
    ow = p % W
    oh = (p // W) % H
    n = p // (W * H)
    acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for r in tl.static_range(K):
        ih = oh + r - PAD
        hm = pm & (ih >= 0) & (ih < H)
        for s in tl.static_range(K):
            iw = ow + s - PAD
            m = hm & (iw >= 0) & (iw < W)
            row = ((n * H + ih) * W + iw) * C
            xv = tl.load(x_ptr + row[:, None] + c[None, :], mask=m[:, None] & cm[None, :],
                         other=0.0)
            wv = tl.load(w_ptr + (r * K + s) * C + c, mask=cm, other=0.0)
            acc += xv.to(tl.float32) * wv.to(tl.float32)[None, :]
    acc += tl.load(b_ptr + c, mask=cm, other=0.0).to(tl.float32)[None, :]
    acc = tl.where(cm[None, :], acc, 0.0)
    mean = tl.sum(acc, axis=1) / C
    d = tl.where(cm[None, :], acc - mean[:, None], 0.0)
    var = tl.sum(d * d, axis=1) / C
    inv = 1.0 / tl.sqrt(var + eps)
    g = tl.load(g_ptr + c, mask=cm, other=0.0).to(tl.float32)
    bt = tl.load(beta_ptr + c, mask=cm, other=0.0).to(tl.float32)
    out = d * inv[:, None] * g[None, :] + bt[None, :]
    tl.store(y_ptr + p[:, None] * C + c[None, :], out.to(y_ptr.dtype.element_ty),
             mask=pm[:, None] & cm[None, :])


def taps(w):
    """The depthwise weight (C, 1, K, K) as (K*K, C): tap-major, channels contiguous (made
    once, as a plan would keep it)."""
    return w.reshape(w.shape[0], -1).t().contiguous()


def fused(x, wt, b, gamma, beta, eps=1e-6, block_p=None, out=None):
    """Depthwise KxK (stride 1, 'same' padding; ``wt`` from :func:`taps`) + LayerNorm over
    channels; x channels-last (N, C, H, W); the normalised NHWC rows as an (N, H, W, C)
    tensor, as ConvNeXt's block holds them after its permute."""
    n, c, h, wd = x.shape
    k = int(round(wt.shape[0] ** 0.5))
    block_c = triton.next_power_of_2(c)
    block_p = block_p or max(1, 4096 // block_c)
    y = out if out is not None else torch.empty((n, h, wd, c), device=x.device, dtype=x.dtype)
    p = n * h * wd
    _dw_ln_kernel[(triton.cdiv(p, block_p),)](
        x, wt, b, gamma, beta, y, p, h, wd, c, eps, K=k, PAD=k // 2, BLOCK_P=block_p,
        BLOCK_C=block_c, num_warps=4)
    return y


def torch_path(x, w, b, gamma, beta, eps=1e-6):
    y = F.conv2d(x, w, b, padding=w.shape[-1] // 2, groups=x.shape[1])
    return F.layer_norm(y.permute(0, 2, 3, 1), (x.shape[1],), gamma, beta, eps)


def _operands(n, c, hw, device, dtype):
    x = torch.randn(n, c, hw, hw, device=device).to(dtype).contiguous(
        memory_format=torch.channels_last)
    w = (torch.randn(c, 1, 7, 7, device=device) / 7).to(dtype)
    b = torch.randn(c, device=device).to(dtype)
    gamma = (1 + 0.1 * torch.randn(c, device=device)).to(dtype)
    beta = (0.1 * torch.randn(c, device=device)).to(dtype)
    return x, w, b, gamma, beta


def check(device: str, dtype: torch.dtype) -> None:
    for n, c, hw in ((2, 5, 9), (1, 96, 13), (3, 24, 7)):
        ops = _operands(n, c, hw, device, dtype)
        x, w, b, gamma, beta = ops
        ref = torch_path(*(t.double() for t in ops))
        poisoned = torch.full((n, hw, hw, c), float("nan"), device=device, dtype=dtype)
        got = fused(x, taps(w), b, gamma, beta, out=poisoned)
        assert not got.isnan().any(), "an output element was not written"
        err = relative_error(got, ref)
        print(f"check N{n} C{c} {hw}x{hw} {dtype}: relative error {err:.2e}")
        assert err < (1e-5 if dtype == torch.float32 else 2e-2), err


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--block-p", default="1,2,4,8,16,32,64",
                    help="BLOCK_P values to sweep (each a compile)")
    ap.add_argument("--stages", type=int, default=4, help="how many of the four stages")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True  # torch's side as the bench runs it
    device = "cuda" if torch.cuda.is_available() else "cpu"
    check(device, torch.float32)
    if args.check_only or device == "cpu":
        return
    check(device, torch.bfloat16)
    print("ConvNeXt-T depthwise 7x7 + LayerNorm, batch 32, bf16, CUDA-graph us per call "
          "(median of 20 replays), inputs rotated over > 2x L2")
    print(f"{'stage':>14} {'torch':>9} {'fused':>9} {'ratio':>7}  "
          f"{'best BLOCK_P':>12}  bytes floor us")
    for c, hw in ((96, 56), (192, 28), (384, 14), (768, 7))[:args.stages]:
        one = 32 * c * hw * hw * 2
        sets = [_operands(32, c, hw, device, torch.bfloat16)
                for _ in range(rotation_count(2 * one))]
        t = statistics.median(time_graph([lambda s=s: torch_path(*s) for s in sets])) * 1e3
        prepared = [(x, taps(w), b, g, bt) for x, w, b, g, bt in sets]
        best = None
        for bp in map(int, args.block_p.split(",")):
            if bp * triton.next_power_of_2(c) > 16384:
                continue
            try:
                f = statistics.median(time_graph(
                    [lambda s=s, bp=bp: fused(*s, block_p=bp) for s in prepared])) * 1e3
            except Exception as exc:  # e.g. out of resources for the widest tiles
                print(f"   BLOCK_P {bp}: {type(exc).__name__}")
                continue
            if best is None or f < best[0]:
                best = (f, bp)
        floor = 2 * one / 3.0e12 * 1e6  # read x, write y once at ~3 TB/s
        print(f"{f'{c}ch {hw}x{hw}':>14} {t:9.1f} {best[0]:9.1f} {t / best[0]:6.2f}x  "
              f"{best[1]:>12}  {floor:.1f}")


if __name__ == "__main__":
    main()
