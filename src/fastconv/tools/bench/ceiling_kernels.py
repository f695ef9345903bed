"""A Triton kernel that measures a ceiling the bench reports against (runner.measure_ceilings)."""

import triton
import triton.language as tl


@triton.jit
def fma_chains(out_ptr, ITERS: tl.constexpr, BLOCK: tl.constexpr):
    """Eight independent fp32 FMA chains per element, ``ITERS`` steps each: the CUDA cores'
    FMA rate (the result is stored so that nothing is eliminated)."""
    x = tl.arange(0, BLOCK).to(tl.float32) * 1e-6 + tl.program_id(0)
    a0, a1, a2, a3 = x, x + 1.0, x + 2.0, x + 3.0
    a4, a5, a6, a7 = x + 4.0, x + 5.0, x + 6.0, x + 7.0
    for _ in range(ITERS):
        a0 = a0 * 0.9999 + 0.5
        a1 = a1 * 0.9999 + 0.5
        a2 = a2 * 0.9999 + 0.5
        a3 = a3 * 0.9999 + 0.5
        a4 = a4 * 0.9999 + 0.5
        a5 = a5 * 0.9999 + 0.5
        a6 = a6 * 0.9999 + 0.5
        a7 = a7 * 0.9999 + 0.5
    tl.store(out_ptr + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK),
             a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7)
