"""What dispatch stores for a ConvBNAct2d in eval (GPU only): the module's folded convolution
(1x1 1024 -> 256, 14x14, batch 32, ReLU, tf32: resnet50_cbr's cbr_l3_1x1_1024_256) tuned
exhaustively from an empty cache, its eager and CUDA-graph plan-cache entries, then
``explain`` of the same folded convolution ranked for a CUDA graph.

    PYTHONPATH=src FASTCONV_CACHE_DIR=<empty dir> python benchmarks/cbr_eval_diag.py
"""

import torch

import fastconv
from fastconv import dispatch
from fastconv.nn import fused


def main() -> None:
    dispatch.tuning_budget()  # exhaustive
    conv = torch.nn.Conv2d(1024, 256, 1, bias=False)
    bn = torch.nn.BatchNorm2d(256)
    seq = torch.nn.Sequential(conv, bn, torch.nn.ReLU()).cuda().eval()
    with torch.no_grad():
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2)
        bn.weight.normal_()
        bn.bias.normal_()
    module = fused.ConvBNAct2d.from_torch(seq, backend="auto", precision="tf32")
    x = torch.randn(32, 1024, 14, 14, device="cuda")
    with torch.no_grad():
        module(x)
    for key, entry in dispatch.CACHE.items():
        print(key, {k: round(v * 1000, 1) if isinstance(v, float) else v
                    for k, v in entry.items()})
    problem = module._plan[1].problem
    print("module plan problem:", problem.key())
    weight, bias = module._fold[1], module._fold[2]
    print("folded weight", weight.shape, weight.stride(), weight.dtype, "bias", bias.dtype)
    with dispatch.settings(graph=True):
        print(fastconv.explain(x, weight, bias, activation="relu", precision="tf32",
                               dispatch="benchmark"))


if __name__ == "__main__":
    main()
