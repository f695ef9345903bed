"""Registers (sm_90a, Triton's ptxas, no GPU needed) of shortrows.py's kernels on the
candidate tiles of tiles.json ((BLOCK_D, SPAN, UNROLL, warps[, register cap])), as the
probe runs them (bf16, SiLU, bias, no initial states), and the bytes of loads each SM can
hold in flight: warps per SM (65,536 registers, allocated in eights per thread; at most 32
blocks) × UNROLL rows × the tensors read (x, and dy in the backward) × BLOCK_D × 2 bytes.
python predict.py [tiles.json]"""
import sys

import triton
from loop_counts import compiled

from fastconv.tools.offline import registers

print(f"triton {triton.__version__}, sm_90a, bf16, no initial states", flush=True)
for direction, width, tile, kernel, _ in compiled(sys.argv[1] if len(sys.argv) > 1
                                                  else "tiles.json"):
    block_d, span, unroll, warps = tile[:4]
    regs, spill = registers(kernel)
    blocks = min(32, 65536 // (-(-regs // 8) * 8 * 32 * warps))
    tensors = 1 if direction == "forward" else 2
    kb = blocks * warps * unroll * tensors * block_d * 2 / warps / 1024
    print(f"{direction:8} w{width:<2} {tile!s:23} {regs:3} registers, spill {spill} B, "
          f"{blocks * warps:2} warps/SM, {kb:5.1f} KB of loads in flight", flush=True)
