"""How many images one dw_wgrad program walks (``images``: fewer programs and partial sums,
against a grid that may not fill the GPU), per depthwise_models layer (GPU, bf16
channels-last, CUDA-graph replay over four rotated input sets).

Nsight Compute on dwm_144_56_k3 (tile dw16x16w4r64, results/issue23/2026-11-25-s10/) read
0.48 waves: the default of about four programs per multiprocessor leaves most of the
register file's room for programs unused. Each listed tile is timed with the default and
with 1, 2 and 4 images per program; a row prints cuDNN's time and the best tile's time
under each rule. Usage: python benchmarks/sweep_dw_wgrad_images.py [names]"""

import statistics
import sys

import torch

from fastconv.backends.triton.depthwise import _ROLL_WGRAD, DwConfig
from fastconv.backends.triton.dw_wgrad import eligible, launch_wgrad
from fastconv.tools.bench.report import geomean
from fastconv.tools.bench.runner import time_graph
from fastconv.tools.bench.suites import SUITES

SETS = 4
RULES = (None, 1, 2, 4)  # None: launch_wgrad's default


def main():
    torch.backends.cudnn.benchmark = True
    names = sys.argv[1:]
    tiles = [DwConfig(*t, roll=rows) for *t, rows in _ROLL_WGRAD]
    print(f"{'case':<20} {'cudnn ms':>9} " + " ".join(
        f"{'images ' + str(r or 'def'):>13}" for r in RULES) + "  best tile per rule")
    ratios = {r: [] for r in RULES}
    for case in SUITES["depthwise_models"]:
        if names and case.name not in names:
            continue
        if not eligible(channels_last=True, c_per_group=1, kernel=tuple(case.kernel),
                        stride=(case.stride,) * 2, dilation=(case.dilation,) * 2):
            continue
        sets = []
        for _ in range(SETS):
            x = torch.randn(case.n, case.c, *case.spatial, device="cuda").to(torch.bfloat16)
            x = x.contiguous(memory_format=torch.channels_last)
            w = torch.randn(case.k, 1, *case.kernel, device="cuda").to(torch.bfloat16)
            y = torch.nn.functional.conv2d(x, w, None, case.stride, case.padding,
                                           case.dilation, case.groups)
            g = torch.randn_like(y).contiguous(memory_format=torch.channels_last)
            sets.append((g, x, w, torch.empty_like(w)))
        geo = dict(stride=[case.stride] * 2, pad=[case.padding] * 2,
                   dil=[case.dilation] * 2)

        def cudnn(g, x, w, geo=geo, groups=case.groups):
            return torch.ops.aten.convolution_backward(
                g, x, w, None, geo["stride"], geo["pad"], geo["dil"], False, [0, 0], groups,
                [False, True, False])[1]
        t_cudnn = statistics.median(time_graph([lambda s=s: cudnn(*s[:3]) for s in sets]))
        ref = cudnn(sets[0][0].double(), sets[0][1].double(), sets[0][2].double())
        best = {}
        for tile in tiles:
            for rule in RULES:
                def run(s, tile=tile, rule=rule):
                    launch_wgrad(s[0], s[1], s[3], stride=tuple(geo["stride"]),
                                 pad=tuple(geo["pad"]), dilation=tuple(geo["dil"]),
                                 config=tile, int64=False, images=rule)
                try:
                    run(sets[0])
                    err = float((sets[0][3].double() - ref).norm() / ref.norm())
                    if not err < 2e-2:
                        print(f"  {case.name} {tile.name()} images={rule}: rel. err {err:.1e}")
                        continue
                    ms = statistics.median(time_graph([lambda s=s: run(s) for s in sets]))
                except Exception as exc:  # a tile the layer cannot take
                    print(f"  {case.name} {tile.name()} images={rule}: {type(exc).__name__}")
                    continue
                if rule not in best or ms < best[rule][0]:
                    best[rule] = (ms, tile.name())
        if len(best) < len(RULES):
            continue
        for rule in RULES:
            ratios[rule].append(t_cudnn / best[rule][0])
        print(f"{case.name:<20} {t_cudnn:9.4f} " + " ".join(
            f"{best[r][0]:7.4f} {t_cudnn / best[r][0]:4.2f}x" for r in RULES)
            + "  " + " ".join(best[r][1] for r in RULES), flush=True)
    for rule in RULES:
        print(f"images={rule or 'default'}: geomean cuDNN / best tile {geomean(ratios[rule]):.3f}"
              f" over {len(ratios[rule])} layers (min {min(ratios[rule]):.2f})")


if __name__ == "__main__":
    main()
