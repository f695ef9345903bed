"""Time dw_roll.py's tiles against cuDNN on the depthwise_models layers (GPU; CUDA-graph
replay over four rotated input sets, so small layers do not stay in L2), channels-last:
the forward and, where the kernel takes it (stride 1), the data gradient; and dw_wgrad.py's
tiles for the weight gradient.

Per layer and op: cuDNN's time (torch, cudnn.benchmark), each roll tile's time through
TritonBackend.bind (the launch the library makes, the weight repacked inside the graph as a
captured call does), depthwise.py's best earlier channels-last tile, and the binding floor:
the larger of (input + output bytes) / measured copy bandwidth and the multiply-adds /
measured fp32 FMA rate of the CUDA cores.
Usage: python benchmarks/sweep_dw_roll.py [--dtype bf16|fp16] [--ops fprop,dgrad,wgrad]
       [--grid] [--old] [names]
"""

import argparse
import statistics

import torch
import torch.nn.functional as F
from sweep_fprop import time_configs  # (run as a script: benchmarks/ is on sys.path)

from fastconv import ConvProblem
from fastconv.backends.triton import TritonBackend
from fastconv.backends.triton.depthwise import _ROLL_WGRAD, DwConfig
from fastconv.precision import Precision
from fastconv.tools.bench.report import geomean
from fastconv.tools.bench.runner import cuda_core_tflops, measure_ceilings, time_graph
from fastconv.tools.bench.suites import SUITES

SETS = 4
#: --grid: tiles of 4 to 16 elements per thread, 1 to 32 rows per program
GRID = [DwConfig(a, b, w, roll=r) for a, b, w, r in (
    (16, 32, 4, 8), (32, 32, 8, 8), (8, 32, 2, 8), (16, 16, 2, 8), (32, 16, 4, 8),
    (16, 32, 4, 16), (8, 64, 4, 8), (16, 32, 2, 32), (16, 32, 2, 4), (32, 32, 4, 16),
    (64, 32, 8, 8), (16, 64, 8, 8))]
#: --grid for the weight gradient: 64 to 256 elements of [columns x channels] per program
#: (x R·S accumulators), 1 to 8 warps, whole images or strips of rows
WGRAD_GRID = [DwConfig(a, b, w, roll=r) for a, b, w, r in (
    (4, 32, 4, 32), (8, 32, 4, 64), (4, 64, 4, 64), (8, 8, 2, 64), (16, 8, 4, 64),
    (4, 32, 8, 64), (8, 16, 2, 64), (2, 32, 2, 64), (4, 16, 4, 16), (16, 16, 4, 64),
    (4, 16, 1, 64), (2, 32, 1, 64), (8, 8, 1, 64), (4, 32, 2, 64))]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _tensors(case, dtype):
    x = torch.randn(case.n, case.c, *case.spatial, device="cuda").to(dtype)
    w = (torch.randn(case.k, 1, *case.kernel, device="cuda") / case.kernel[0]).to(dtype)
    return x.contiguous(memory_format=torch.channels_last), w


def _conv(case, x, w):
    return F.conv2d(x, w, None, case.stride, case.padding_arg(), case.dilation, case.groups)


def _dgrad(case, g, w, x):
    """cuDNN's data gradient as torch's autograd runs it: the real input gives the layout
    (torch.nn.grad.conv2d_input passes an NCHW stand-in, which runs 3-9x slower here)."""
    return torch.ops.aten.convolution_backward(
        g, x, w, None, [case.stride] * 2, [case.padding] * 2, [case.dilation] * 2, False,
        [0, 0], case.groups, [True, False, False])[0]


def _wgrad(case, g, w, x):
    """cuDNN's weight gradient as torch's autograd runs it."""
    return torch.ops.aten.convolution_backward(
        g, x, w, None, [case.stride] * 2, [case.padding] * 2, [case.dilation] * 2, False,
        [0, 0], case.groups, [False, True, False])[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    parser.add_argument("--ops", default="fprop,dgrad")
    parser.add_argument("--old", action="store_true",
                        help="also time depthwise.py's earlier channels-last tiles")
    parser.add_argument("--grid", action="store_true",
                        help="also time a grid of roll tiles beyond the listed candidates")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    dtype = DTYPES[args.dtype]
    torch.backends.cudnn.benchmark = True
    hbm = measure_ceilings(Precision.BF16)["hbm_gbps"] * 1e9
    fmas = cuda_core_tflops() * 1e12 / 2
    print(f"measured: copy {hbm / 1e9:.0f} GB/s, fp32 FMA {fmas / 1e12:.1f} T/s "
          f"({torch.cuda.get_device_name()})")
    print(f"{'case':<20} {'op':<6} {'cudnn ms':>9} {'best ms':>9} {'floor ms':>9} "
          f"{'%floor':>6} {'ratio':>6}  best tile  (runners-up)")
    ratios: dict[str, list[float]] = {}
    cases = [c for c in SUITES["depthwise_models"] if not args.names or c.name in args.names]
    for op in args.ops.split(","):
        for case in cases:
            sets = [_tensors(case, dtype) for _ in range(SETS)]
            x0, w0 = sets[0]
            problem = ConvProblem.from_tensors(x0, w0, None, case.stride, case.padding_arg(),
                                               case.dilation, case.groups, rank=2)
            configs = TritonBackend.candidates(problem, op)
            if not args.old:
                configs = [c for c in configs if c.roll]
            listed = [DwConfig(*t, roll=rows) for *t, rows in _ROLL_WGRAD]
            if op == "wgrad" and not configs and not args.old \
                    and TritonBackend.config_errors(problem, listed[0], op) == []:
                configs = listed  # (candidates only where they won; the kernel takes these)
            if args.grid and configs:
                configs += [c for c in (WGRAD_GRID if op == "wgrad" else GRID)
                            if c not in configs]
            if not configs:
                continue
            y0 = _conv(case, x0, w0)
            if op == "fprop":
                t_cudnn = statistics.median(time_graph(
                    [lambda x=x, w=w: _conv(case, x, w) for x, w in sets]))
                ref = _conv(case, x0.double(), w0.double())
                outs = [torch.empty_like(y0) for _ in sets]

                def fns(run, outs=outs):
                    return [lambda x=x, w=w, o=o: run(x, w, None, None, None, None, o)
                            for (x, w), o in zip(sets, outs)]
            else:
                grads = [torch.randn_like(y0) for _ in sets]
                grad = _dgrad if op == "dgrad" else _wgrad
                t_cudnn = statistics.median(time_graph(
                    [lambda g=g, x=x, w=w: grad(case, g, w, x)
                     for g, (x, w) in zip(grads, sets)]))
                ref = grad(case, grads[0].double(), w0.double(), x0.double())
                outs = [torch.empty_like(x0 if op == "dgrad" else w0) for _ in sets]

                def fns(run, outs=outs, grads=grads, op=op):
                    return [lambda g=g, a=(w if op == "dgrad" else x), o=o: run(g, a, o)
                            for g, (x, w), o in zip(grads, sets, outs)]
            results = time_configs(case.name, problem, configs, fns, outs[0], ref, op)
            if not results:
                continue
            best_ms, best = results[0]
            nbytes = (x0.numel() + y0.numel()) * x0.element_size()
            floor_ms = max(nbytes / hbm, y0.numel() * case.kernel[0] * case.kernel[1] / fmas) \
                * 1e3
            ratios.setdefault(op, []).append(t_cudnn / best_ms)
            others = ", ".join(f"{n} {t:.4f}" for t, n in results[1:4])
            print(f"{case.name:<20} {op:<6} {t_cudnn:9.4f} {best_ms:9.4f} {floor_ms:9.4f} "
                  f"{100 * floor_ms / best_ms:6.0f} {t_cudnn / best_ms:6.2f}  {best}  "
                  f"({others})", flush=True)
    for op, r in ratios.items():
        print(f"{op}: geomean cuDNN/best-tile time ratio {geomean(r):.3f} over {len(r)} layers "
              f"(min {min(r):.2f}, max {max(r):.2f})")


if __name__ == "__main__":
    main()
