"""Registers and spills of shortconv.py's kernels per width and tile, without a GPU: each
kernel compiled by Triton for sm_90a (H100), its PTX assembled by the ptxas Triton ships,
``-v``. A tile whose registers grow past ~128 a thread (or that spills) holds fewer warps
per SM: a first cut before timing tiles on a device.

    python benchmarks/ptxas_regs.py [--layout seqlen|dim] [--widths 4,9,16,17]
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fastconv.backends.triton import shortconv

#: the candidate tiles (BLOCK_D, CHUNKS, warps) per layout and direction
TILES = {"seqlen": {"forward": [(1, 128, 2), (1, 64, 2)],
                    "backward": [(1, 64, 1), (1, 32, 1)]},
         "dim": {"forward": [(128, 2, 4), (64, 2, 4)],
                 "backward": [(32, 8, 4), (32, 4, 4)]}}


def ptxas(ptx: str) -> tuple[str, str]:
    """(registers, spill stores/loads in bytes) of one kernel's PTX, by ptxas -v."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    exe = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    run = subprocess.run([exe, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull],
                         capture_output=True, text=True)
    os.unlink(f.name)
    text = run.stdout + run.stderr
    if run.returncode:
        return "error", text[-200:]
    regs = re.search(r"Used (\d+) registers", text).group(1)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return regs, f"{spill.group(1)}/{spill.group(2)}"


def compile_ptx(fn, layout: str, tile: tuple, const: dict) -> str:
    """The PTX of ``fn`` for bf16 data in ``layout`` (its unit stride a constant, the other
    strides and pointers 16-aligned, as the launches see them) and ``tile``."""
    block_d, chunks, warps = tile
    const = dict(const, BLOCK_D=block_d, CHUNKS=chunks)
    unit = "_d" if layout == "dim" else "_t"
    sig, attrs = {}, {}
    for i, name in enumerate(inspect.signature(fn.fn).parameters):
        if name in const:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*fp32" if name == "part_ptr" else "*bf16"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name.startswith(("sx", "so", "sy", "sdx")) and name.endswith(unit):
            sig[name], const[name] = "constexpr", 1
        else:
            sig[name] = "i32"
            if name not in ("dim", "seqlen"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps}).asm["ptx"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=("seqlen", "dim"), default="seqlen")
    parser.add_argument("--widths", default="4,9,16,17")
    args = parser.parse_args()
    print(f"triton {triton.__version__}, sm_90a, bf16, layout {args.layout}")
    for width in map(int, args.widths.split(",")):
        look = shortconv._look(width)
        common = dict(WIDTH=width, LOOK=look, HAS_INIT=True, HAS_BIAS=True, SILU=True)
        kernels = {"forward": (shortconv._forward_kernel, common),
                   "backward": (shortconv._backward_kernel,
                                dict(common, TAPS=triton.next_power_of_2(width + 1),
                                     FIRST=-8 * look, INIT_GRAD=True))}
        for direction, (fn, const) in kernels.items():
            for tile in TILES[args.layout][direction]:
                regs, spill = ptxas(compile_ptx(fn, args.layout, tile, const))
                print(f"width {width:2d} {direction:8} tile {tile}: {regs} registers, "
                      f"spills {spill} bytes")


if __name__ == "__main__":
    main()
