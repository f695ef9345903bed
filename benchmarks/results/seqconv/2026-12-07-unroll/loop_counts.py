"""SASS instructions per element in the loops of shortrows.py's kernels, without a GPU: each
candidate of tiles.json compiled for sm_90a by Triton's own compiler (bf16, SiLU, bias, no
initial states, as the probe runs them), disassembled by the cuobjdump Triton ships
(:func:`sass`). The loops are the spans between a backward branch and its
target, those at least a third of the longest: since 2026-12-07's spans, a masked loop for a
row's edge spans and an unmasked one, with fewer instructions, for the others. A loop's
instructions are divided by the elements a thread handles per iteration (UNROLL × BLOCK_D /
32 / warps). With the issue rate of an H100 (~33 T thread instructions a second) and the
floor's element rate at 2.84 TB/s, prints the ceiling that instruction issue alone puts on
% of the floor. Run with PYTHONPATH at a source tree: python loop_counts.py [tiles.json]"""
import collections
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile

import triton

from fastconv.backends.triton import shortrows
from fastconv.tools.offline import compile_kernel

UNIT = ("sx_d", "so_d", "sy_d", "sdx_d")
ISSUE = 132 * 4 * 32 * 1.98e9  # thread instructions a second (H100 SXM)
GBPS = 2839  # the copy bandwidth of the 2026-12-07 probe


def sass(kernel) -> str:
    """The SASS of a compiled kernel, by the cuobjdump Triton ships."""
    exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                       "cuobjdump")
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    try:
        return subprocess.run([exe, "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    finally:
        os.unlink(f.name)


def loop_ops(kernel) -> list:
    """The instructions (by operation) of each of a compiled kernel's loops."""
    text = sass(kernel)
    code = []  # (address, op, the rest of the line)
    for line in text.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);", line)
        if m and not m.group(3).startswith("NOP"):
            code.append((int(m.group(1), 16), m.group(3).split(".")[0], m.group(4)))
    loops = []  # (target, branch) of each backward branch
    for addr, op, rest in code:
        m = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if m and int(m.group(1), 16) < addr:
            loops.append((int(m.group(1), 16), addr))
    longest = max(hi - lo for lo, hi in loops)
    return [collections.Counter(op for addr, op, _ in code if lo <= addr <= hi)
            for lo, hi in sorted(loops) if hi - lo >= longest / 3]


def compiled(path: str):
    """(direction, width, tile, compiled kernel, passes of x's size its floor counts) for
    every candidate of the tiles file at ``path`` ((BLOCK_D, SPAN, UNROLL, warps[, register
    cap])), as the probe runs them: bf16, SiLU, bias, no initial states; with the flags
    this tree's kernel takes (no initial states' gradient: ``FIRST`` 0 before 2026-12-07's
    spans; dim a multiple of BLOCK_D: ``EVEN_D``)."""
    with open(path) as f:
        given = json.load(f)
    for direction in ("forward", "backward"):
        for width, tiles in given[direction].items():
            width = int(width)
            for tile in tiles:
                block_d, span, unroll, warps = tile[:4]
                const = dict(WIDTH=width, HAS_INIT=False, HAS_BIAS=True, SILU=True,
                             BLOCK_D=block_d, SPAN=span, UNROLL=unroll)
                fn, passes = shortrows._forward_rows_kernel, 2
                if direction == "backward":
                    fn, passes = shortrows._backward_rows_kernel, 3
                    const["TAPS"] = triton.next_power_of_2(width + 1)
                params = inspect.signature(fn.fn).parameters
                const.update({k: v for k, v in (("INIT_GRAD", False), ("FIRST", 0),
                                                ("EVEN_D", True)) if k in params})
                kernel = compile_kernel(fn, const, {"part_ptr": "*fp32"}, UNIT,
                                        num_warps=warps,
                                        maxnreg=tile[4] if len(tile) > 4 else None)
                yield direction, width, tuple(tile), kernel, passes


def main():
    print(f"triton {triton.__version__}, sm_90a; the main loop's instructions per element")
    path = sys.argv[1] if len(sys.argv) > 1 else "tiles.json"
    for direction, width, tile, kernel, passes in compiled(path):
        per = tile[2] * tile[0] / (32 * tile[3])
        for n, ops in enumerate(loop_ops(kernel)):
            total = sum(ops.values()) / per
            cap = ISSUE / total / (GBPS * 1e9 / (2 * passes)) * 100
            top = ", ".join(f"{o} {c / per:.1f}" for o, c in ops.most_common(5))
            print(f"{direction:8} w{width:<2} {tile!s:23} loop {n}: {total:5.1f} an element "
                  f"(issue caps at {cap:4.0f} % of the floor; {top})", flush=True)


if __name__ == "__main__":
    main()
