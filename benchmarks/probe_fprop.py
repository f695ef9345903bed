"""Diagnose the Triton fprop kernel on the GPU: which MMA instructions it compiles to, and
how it compares on 1x1 convolutions (pure GEMMs) with torch.matmul and a plain Triton GEMM.
"""

import re
import statistics

import torch
import triton
import triton.language as tl

from fastconv.backends.triton.configs import TileConfig
from fastconv.backends.triton.fprop import launch_fprop
from fastconv.tools.bench.runner import time_graph


@triton.jit
def _gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bn, stride_cm,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + offs_n[None, :] * stride_bn + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :],
             acc.to(c_ptr.dtype.element_ty), mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


def main():
    dtype = torch.bfloat16
    cfgs = [(128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
            (128, 128, 64, 4, 4), (256, 128, 64, 8, 3)]
    for n, c, k, hw in ((32, 512, 2048, 7), (32, 512, 128, 28), (32, 64, 256, 56),
                        (32, 1024, 256, 14)):
        x = torch.randn(n, c, hw, hw, device="cuda", dtype=dtype)
        x = x.contiguous(memory_format=torch.channels_last)
        w = torch.randn(k, c, 1, 1, device="cuda", dtype=dtype) / 20
        out = torch.empty(n, k, hw, hw, device="cuda", dtype=dtype,
                          memory_format=torch.channels_last)
        a = x.permute(0, 2, 3, 1).reshape(-1, c)
        b = w.view(k, c)
        cm = out.permute(0, 2, 3, 1).view(-1, k)
        m = a.shape[0]
        flops = 2 * m * k * c
        t_mm = statistics.median(time_graph([lambda: torch.matmul(a, b.t(), out=cm)]))
        t_conv = statistics.median(time_graph([lambda: torch.nn.functional.conv2d(x, w)]))
        best_gemm, best_conv = (9, ""), (9, "")
        for bm, bn, bk, nw, ns in cfgs:
            grid = (triton.cdiv(m, bm) * triton.cdiv(k, bn),)
            t = statistics.median(time_graph([lambda: _gemm_kernel[grid](
                a, b, cm, m, k, c, a.stride(0), b.stride(0), cm.stride(0), BLOCK_M=bm,
                BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=nw, num_stages=ns)]))
            best_gemm = min(best_gemm, (t, f"{bm}x{bn}x{bk}w{nw}s{ns}"))
            cfg = TileConfig(bm, bn, bk, nw, ns, False)
            t = statistics.median(time_graph([lambda: launch_fprop(
                x, w, out, None, None, None, stride=(1, 1), pad=(0, 0), dilation=(1, 1),
                groups=1, act_code=0, negative_slope=0.0, precision="ieee", config=cfg,
                int64=False, bounds_post=False)]))
            best_conv = min(best_conv, (t, cfg.name()))
        print(f"1x1 M={m} C={c} K={k}: cuDNN {t_conv*1e3:6.1f} us  matmul {t_mm*1e3:6.1f} us  "
              f"triton gemm {best_gemm[0]*1e3:6.1f} us ({best_gemm[1]})  fastconv "
              f"{best_conv[0]*1e3:6.1f} us ({best_conv[1]})  [{flops/t_mm/1e9:.0f} TFLOPS mm]")
    # what did the conv kernel compile to?
    from fastconv.backends.triton import fprop
    for key, kern in list(fprop._conv_fprop_kernel.device_caches[0][0].items())[:3]:
        ttgir, ptx = kern.asm["ttgir"], kern.asm["ptx"]
        ops = sorted(set(re.findall(r"(ttng\.\w+|ttg\.\w+|tt\.dot\w*)", ttgir)))
        print("ops:", " ".join(ops))
        print("ptx: wgmma", ptx.count("wgmma.mma_async"), "mma.sync", ptx.count("mma.sync"),
              "cp.async", ptx.count("cp.async.cg") + ptx.count("cp.async.ca"),
              "ld.global.v4", ptx.count("ld.global.v4"), "regs/spills:", kern.n_regs,
              kern.n_spills)


if __name__ == "__main__":
    main()
