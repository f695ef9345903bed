"""Registers (sm_90a, Triton's ptxas, no GPU needed) of shortrows.py's kernels on the
candidate tiles of tiles.json ((BLOCK_D, SPAN, UNROLL, warps[, register cap])), as the
probe runs them (bf16, SiLU, bias, no initial states), and the bytes of loads each SM can
hold in flight: warps per SM (65,536 registers, allocated in eights per thread; at most 32
blocks) × UNROLL rows × the tensors read (x, and dy in the backward) × BLOCK_D × 2 bytes.
python predict.py [tiles.json]"""
import json
import sys

import triton
from loop_counts import constants

from fastconv.backends.triton import shortrows
from fastconv.tools.offline import compile_kernel, registers

UNIT = ("sx_d", "so_d", "sy_d", "sdx_d")
given = json.load(open(sys.argv[1] if len(sys.argv) > 1 else "tiles.json"))
print(f"triton {triton.__version__}, sm_90a, bf16, no initial states", flush=True)
for direction in ("forward", "backward"):
    for width, tiles in given[direction].items():
        width = int(width)
        for tile in tiles:
            block_d, span, unroll, warps = tile[:4]
            const = dict(WIDTH=width, HAS_INIT=False, HAS_BIAS=True, SILU=True,
                         BLOCK_D=block_d, SPAN=span, UNROLL=unroll)
            if direction == "forward":
                fn = shortrows._forward_rows_kernel
            else:
                fn = shortrows._backward_rows_kernel
                const["TAPS"] = triton.next_power_of_2(width + 1)
            cap = tile[4] if len(tile) > 4 else None
            regs, spill = registers(compile_kernel(fn, constants(fn, const),
                                                   {"part_ptr": "*fp32"}, UNIT,
                                                   num_warps=warps, maxnreg=cap))
            blocks = min(32, 65536 // (-(-regs // 8) * 8 * 32 * warps))
            tensors = 1 if direction == "forward" else 2
            kb = blocks * warps * unroll * tensors * block_d * 2 / warps / 1024
            print(f"{direction:8} w{width:<2} {tuple(tile)!s:23} "
                  f"{regs:3} registers, spill {spill} B, {blocks * warps:2} warps/SM, "
                  f"{kb:5.1f} KB of loads in flight", flush=True)
