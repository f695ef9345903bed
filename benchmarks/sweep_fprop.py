"""Sweep Triton fprop tile configurations on ResNet-50 layers (GPU; CUDA-graph timing).

For each case and dtype: cuDNN's time (torch, cudnn.benchmark) and every configuration's
time for the bare kernel on channels-last tensors, so the table shows what the kernel
itself reaches. Prints one line per case: best config, its time, cuDNN's, the ratio.
"""

import statistics
import sys

import torch
import torch.nn.functional as F

from fastconv.backends.triton.configs import FpropConfig
from fastconv.backends.triton.fprop import launch_fprop
from fastconv.bench.runner import time_graph
from fastconv.bench.suites import SUITES
from fastconv.precision import relative_error

CONFIGS = {
    torch.bfloat16: [FpropConfig(*c, False) for c in [
        (128, 128, 64, 8, 3), (128, 128, 64, 4, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3),
        (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4), (128, 128, 64, 8, 4),
        (256, 64, 64, 8, 3), (64, 256, 64, 8, 3), (128, 128, 32, 4, 4), (128, 64, 32, 4, 5)]],
    torch.float32: [FpropConfig(*c, False) for c in [
        (128, 128, 32, 8, 3), (128, 128, 32, 4, 3), (128, 256, 32, 8, 3), (256, 128, 32, 8, 3),
        (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 32, 4, 4), (128, 128, 32, 8, 4),
        (64, 64, 32, 4, 6), (128, 128, 16, 4, 4), (128, 128, 64, 8, 2), (64, 64, 64, 4, 3)]],
}


def main(names=None):
    cases = [c for c in SUITES["resnet50"] if c.c >= 16 and (not names or c.name in names)]
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    print(f"{'case':<24} {'dtype':<9} {'cudnn ms':>9} {'best ms':>9} {'ratio':>6}  best config"
          "  (second, third)")
    for dtype in (torch.float32, torch.bfloat16):
        prec = "tf32" if dtype == torch.float32 else "ieee"
        for case in cases:
            x = torch.randn(case.n, case.c, *case.spatial, device="cuda").to(dtype)
            x = x.contiguous(memory_format=torch.channels_last)
            w = (torch.randn(case.k, case.c, *case.kernel, device="cuda") / 30).to(dtype)
            w = w.contiguous(memory_format=torch.channels_last)
            ref = F.conv2d(x, w, None, case.stride, case.padding)
            t_cudnn = statistics.median(time_graph(
                [lambda: F.conv2d(x, w, None, case.stride, case.padding)]))
            out = torch.empty_like(ref)
            results = []
            for cfg in CONFIGS[dtype]:
                def fn(cfg=cfg):
                    launch_fprop(x, w, out, None, None, None, stride=(case.stride,) * 2,
                                 pad=(case.padding,) * 2, dilation=(1, 1), groups=1,
                                 act_code=0, negative_slope=0.0, precision=prec, config=cfg,
                                 int64=False)
                try:
                    fn()
                    err = relative_error(out, ref)
                    t = statistics.median(time_graph([fn], reps=10, calls=8))
                except Exception as exc:  # e.g. out of shared memory
                    print(f"  {cfg.name()}: {type(exc).__name__}", file=sys.stderr)
                    continue
                if err > 2e-2:
                    print(f"  {cfg.name()}: WRONG rel err {err:.2e}", file=sys.stderr)
                    continue
                results.append((t, cfg.name()))
            results.sort()
            best = results[0]
            others = ", ".join(f"{n} {t:.4f}" for t, n in results[1:3])
            print(f"{case.name:<24} {str(dtype)[6:]:<9} {t_cudnn:9.4f} {best[0]:9.4f} "
                  f"{t_cudnn / best[0]:6.2f}  {best[1]}  ({others})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
