"""A Triton kernel compiled for an NVIDIA GPU this machine need not have (Triton's own
compiler and the ptxas it ships): what the interpreter does not check (a construct the
compiler refuses) and the registers and spills of each configuration, on a CPU-only
machine. Not under ``TRITON_INTERPRET=1`` (kernels are then interpreted functions): the
kernel tests run it in a process of its own.

    python -m fastconv.tools.offline [--layout seqlen|dim] [--widths 4,9,16,17] [--ids]
        [--used]

prints shortconv.py's kernels' registers and spill stores per width and candidate tile
(``--ids``: with ``seq_idx``); a tile past ~128 registers a thread, or one that spills,
holds fewer warps per SM: a first cut before timing tiles on a device.
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


def compile_kernel(fn, constexprs: dict, pointers: dict, unit: tuple = (), *,
                   data: str = "*bf16", num_warps: int = 4, capability: int = 90,
                   maxnreg: int | None = None, num_stages: int | None = None):
    """``fn`` (a ``triton.jit`` function) compiled for ``sm_<capability>`` (``maxnreg``: a
    cap on a thread's registers, where given; ``num_stages``: the launch's software
    pipelining depth, Triton's default where not given): the arguments in
    ``constexprs`` fixed, pointers of ``data``'s type unless ``pointers`` names another
    (``{"part_ptr": "*fp32"}``), the integer arguments named in ``unit`` the constant 1 (a
    unit stride, as a launch specialises it), the others 32-bit; pointers and integers
    other than ``dim``/``seqlen`` 16-divisible (as aligned launches see them). Raises
    Triton's CompilationError where the compiler refuses the kernel."""
    const = dict(constexprs)
    sig, attrs = {}, {}
    for i, name in enumerate(inspect.signature(fn.fn).parameters):
        if name in const:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = pointers.get(name, data)
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in unit:
            sig[name], const[name] = "constexpr", 1
        else:
            sig[name] = "i32"
            if name not in ("dim", "seqlen"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs)
    options = {"num_warps": num_warps, **({"maxnreg": maxnreg} if maxnreg else {}),
               **({"num_stages": num_stages} if num_stages else {})}
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)


def registers(kernel, capability: int = 90) -> tuple[int | None, int | None]:
    """(registers a thread, bytes of spill stores) of a compiled kernel, by the ptxas
    Triton ships (``-v`` on its PTX); (None, None) where that ptxas does not take the PTX
    on its own (Triton 3.9's: exit status 255, though its compile succeeded)."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(kernel.asm["ptx"])
    exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    try:
        run = subprocess.run([exe, "-v", "--gpu-name", f"sm_{capability}a", f.name, "-o",
                              os.devnull], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if run.returncode:
        return None, None
    text = run.stdout + run.stderr
    spill = re.search(r"(\d+) bytes spill stores", text)
    return int(re.search(r"Used (\d+) registers", text).group(1)), int(spill.group(1))


#: the candidate tiles (BLOCK_D, CHUNKS, warps, split loads) per layout and direction
TILES = {"seqlen": {"forward": [(1, 128, 2, True), (1, 64, 2, True)],
                    "backward": [(1, 64, 1, True), (1, 32, 1, True)]},
         "dim": {"forward": [(128, 4, 4, False), (32, 4, 1, False)],
                 "backward": [(16, 8, 2, False), (16, 32, 4, True)]}}
#: the candidate tiles of the backward over 16-position chunks (widths up to 9, no seq_idx)
PAIRS = {"seqlen": [(1, 64, 1, True), (1, 32, 1, True)],
         "dim": [(32, 8, 4, False), (16, 8, 2, False)]}


def shortconv_rows(layout: str, widths, ids: bool, used: bool = False):
    """(width, direction, tile, registers, spill bytes) of shortconv.py's kernels, bf16, on
    each candidate tile (``used``: the tile the kernels run, ``shortconv.tiles`` and
    ``shortconv.PAIRS``, and shortrows.py's kernels in their place where they run: "forward
    rows", "backward rows"); "backward16" is the backward over 16-position chunks, which
    runs in place of the other where taps reach one chunk back without seq_idx."""
    from ..backends.triton import shortconv

    # the layout's unit strides (x, out, dy, dx) and seq_idx's
    unit = tuple(f"{t}_{'d' if layout == 'dim' else 't'}"
                 for t in ("sx", "so", "sy", "sdx")) + ("si_t",)
    for width in widths:
        look = shortconv._look(width)
        common = dict(WIDTH=width, LOOK=look, HAS_INIT=True, HAS_BIAS=True, SILU=True,
                      HAS_IDS=ids)
        kernels = {"forward": (shortconv._forward_kernel, common),
                   "backward": (shortconv._backward_kernel,
                                dict(common, TAPS=triton.next_power_of_2(width + 1),
                                     FIRST=-8 * look, INIT_GRAD=True))}
        tried = {direction: [shortconv.tiles(layout, width, ids)[i]] if used
                 else TILES[layout][direction] for i, direction in enumerate(kernels)}
        pair = shortconv.pairs_tile(layout, width) if look == 1 and not ids else None
        if look == 1 and not ids and (pair is not None or not used):
            kernels["backward16"] = (shortconv._backward_pairs_kernel,
                                     {k: v for k, v in kernels["backward"][1].items()
                                      if k not in ("LOOK", "HAS_IDS")})
            tried["backward16"] = [pair] if used else PAIRS[layout]
        if used and layout == "dim" and not ids:  # shortrows.py's kernels where they run
            yield from _rows_kernels(width, kernels, unit)
        for direction, (fn, const) in kernels.items():
            for block_d, chunks, warps, split in tried[direction]:
                # (the backward's OWN: the chunks a window writes)
                own = {"OWN": shortconv.owned(look, chunks)} \
                    if direction == "backward" else {}
                kernel = compile_kernel(fn, dict(const, BLOCK_D=block_d, CHUNKS=chunks,
                                                 SPLIT=split, **own),
                                        {"part_ptr": "*fp32", "ids_ptr": "*i32"}, unit,
                                        num_warps=warps)
                yield (width, direction, (block_d, chunks, warps, split), *registers(kernel))


def _rows_kernels(width: int, kernels: dict, unit: tuple):
    """shortrows.py's kernels at the width's tiles, compiled as :func:`shortconv_rows`'
    rows ("forward rows", "backward rows"); shortconv.py's kernels they replace are taken
    out of ``kernels``."""
    from ..backends.triton import shortrows

    forward, backward = shortrows.tiles(width)
    common = dict(WIDTH=width, HAS_INIT=True, HAS_BIAS=True, SILU=True)
    for direction, tile, fn, more in (
            ("forward", forward, shortrows._forward_rows_kernel, {}),
            ("backward", backward, shortrows._backward_rows_kernel,
             dict(TAPS=triton.next_power_of_2(width + 1), FIRST=1 - width, INIT_GRAD=True))):
        if tile is None:
            continue
        for name in ((direction, "backward16") if direction == "backward" else (direction,)):
            kernels.pop(name, None)
        block_d, span, unroll = tile[:3]
        kernel = compile_kernel(fn, dict(common, BLOCK_D=block_d, SPAN=span, UNROLL=unroll,
                                         **more), {"part_ptr": "*fp32"}, unit,
                                **shortrows._options(tile))
        yield (width, f"{direction} rows", tile, *registers(kernel))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fastconv.tools.offline",
                                     description="shortconv.py's kernels compiled for sm_90a:"
                                                 " registers and spills per tile")
    parser.add_argument("--layout", choices=("seqlen", "dim"), default="seqlen")
    parser.add_argument("--widths", default="4,9,16,17")
    parser.add_argument("--ids", action="store_true", help="with seq_idx")
    parser.add_argument("--used", action="store_true",
                        help="only the tiles the kernels run (shortconv.tiles)")
    args = parser.parse_args(argv)
    print(f"triton {triton.__version__}, sm_90a, bf16, layout {args.layout}"
          f"{', seq_idx' if args.ids else ''}", flush=True)
    for width, direction, tile, regs, spill in shortconv_rows(
            args.layout, map(int, args.widths.split(",")), args.ids, args.used):
        print(f"width {width:2d} {direction:10} tile {tile}: {regs} registers, spill stores "
              f"{spill} bytes", flush=True)


if __name__ == "__main__":
    main()
