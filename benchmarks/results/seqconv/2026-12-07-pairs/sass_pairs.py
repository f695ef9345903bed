"""SASS instructions per position of shortconv.py's two backward kernels (8- and 16-position
chunks, pairs.patch applied), then of the 16-position one at wider tiles, without a GPU:
each kernel at its tile compiled for sm_90a by Triton's own compiler (bf16, silu, bias, no
states; seqlen 16-divisible, as a launch of seqlen 2048 specialises it), disassembled by
the cuobjdump Triton ships, instructions counted (straight-line code: static = dynamic)
and divided by the positions a thread holds. Run with PYTHONPATH at a source tree (its
shortconv.py is the one counted): python sass_counts.py"""
import collections
import inspect
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fastconv.backends.triton import shortconv


def compiled(fn, const, unit, warps):
    sig, attrs, const = {}, {}, dict(const)
    for i, name in enumerate(inspect.signature(fn.fn).parameters):
        if name in const:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = {"part_ptr": "*fp32", "ids_ptr": "*i32"}.get(name, "*bf16")
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in unit:
            sig[name], const[name] = "constexpr", 1
        else:
            sig[name] = "i32"
            if name != "dim":
                attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})


def counts(kernel):
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    text = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    ops = collections.Counter()
    for line in text.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if m and not m.group(2).startswith("NOP"):
            ops[m.group(2).split(".")[0]] += 1
    return ops


params = set(inspect.signature(shortconv._backward_kernel.fn).parameters)
print(f"triton {triton.__version__}, sm_90a; instructions per position (the commonest ops)")
for layout in ("seqlen", "dim"):
    unit = tuple(f"{t}_{'d' if layout == 'dim' else 't'}" for t in ("sx", "so", "sy", "sdx"))
    for width in (2, 4, 8):
        look = 1 if width <= 9 else 2
        for i, direction in enumerate(("backward", "backward16")):
            tile = shortconv.tiles(layout, width, False)[1] if i == 0 else shortconv.PAIRS[layout]
            block_d, chunks, warps = tile[:3]
            const = dict(WIDTH=width, LOOK=look, HAS_INIT=False, HAS_BIAS=True, SILU=True,
                         HAS_IDS=False, BLOCK_D=block_d, CHUNKS=chunks)
            if "SPLIT" in params:
                const["SPLIT"] = tile[3]
            fn = shortconv._forward_kernel
            if direction == "backward":
                fn = shortconv._backward_kernel
                const.update(TAPS=triton.next_power_of_2(width + 1), FIRST=0, INIT_GRAD=False,
                             OWN=shortconv.owned(look, chunks))
            if direction == "backward16":
                fn = shortconv._backward_pairs_kernel
                const = {k: v for k, v in const.items() if k not in ("LOOK", "HAS_IDS")}
                const.update(TAPS=triton.next_power_of_2(width + 1), FIRST=0, INIT_GRAD=False)
            ops = counts(compiled(fn, const, unit, warps))
            per = block_d * chunks * (16 if direction == "backward16" else 8) / (32 * warps)
            top = ", ".join(f"{o} {n / per:.1f}" for o, n in ops.most_common(6))
            print(f"{layout:6} w{width:<2} {direction:8} {tile}: "
                  f"{sum(ops.values()) / per:5.1f} ({top})", flush=True)
print("the 16-position backward at other tiles (registers, spill bytes by Triton's ptxas)")
from fastconv.tools.offline import registers  # noqa: E402

for layout, tiles in (("seqlen", [(1, 64, 1, True), (1, 128, 1, True)]),
                      ("dim", [(32, 4, 2, False), (16, 8, 2, False), (8, 8, 1, False)])):
    unit = tuple(f"{t}_{'d' if layout == 'dim' else 't'}" for t in ("sx", "so", "sy", "sdx"))
    for width in (4, 8):
        for tile in tiles:
            const = dict(WIDTH=width, HAS_INIT=False, HAS_BIAS=True, SILU=True,
                         BLOCK_D=tile[0], CHUNKS=tile[1], SPLIT=tile[3],
                         TAPS=triton.next_power_of_2(width + 1), FIRST=0, INIT_GRAD=False)
            kernel = compiled(shortconv._backward_pairs_kernel, const, unit, tile[2])
            ops = counts(kernel)
            per = tile[0] * tile[1] * 16 / (32 * tile[2])
            top = ", ".join(f"{o} {n / per:.1f}" for o, n in ops.most_common(6))
            print(f"{layout:6} w{width:<2} backward16 {tile}: {sum(ops.values()) / per:5.1f} "
                  f"registers {registers(kernel)} ({top})", flush=True)
