"""Host cost of one conv -> BatchNorm -> ReLU training forward on the CPU, where nothing is
asynchronous (a tiny problem: 2x16x4x4, 3x3, float32, input with requires_grad): torch's
three ops called bare, torch's three modules (nn.Sequential) and fastconv's ConvBNAct2d.
The differences between the rows are each path's Python around the same three ops (the
training forward runs torch's convolution and batch norm in both: plans._eager_native on the
GPU, aten on the CPU). Each row: min over 9 rounds of 2000 calls, rows alternating.

    PYTHONPATH=src python benchmarks/train_layer_cpu.py
"""

import torch
from host_parts import per_call_us

from fastconv.nn import ConvBNAct2d


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    seq = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1, bias=False),
                              torch.nn.BatchNorm2d(16), torch.nn.ReLU(inplace=True)).train()
    fused = ConvBNAct2d.from_torch(seq).train()
    x = torch.randn(2, 16, 4, 4, requires_grad=True)
    w, gamma, beta = seq[0].weight, seq[1].weight, seq[1].bias
    mean, var = seq[1].running_mean.clone(), seq[1].running_var.clone()

    def bare():
        y = torch.conv2d(x, w, None, 1, 1)
        return torch.relu_(torch.batch_norm(y, gamma, beta, mean, var, True, 0.1, 1e-5,
                                            False))
    rows = per_call_us({"torch ops, bare": bare, "torch modules (Sequential)": lambda: seq(x),
                        "fastconv ConvBNAct2d": lambda: fused(x)}, calls=2000, rounds=9,
                       sync=lambda: None)
    print(torch.__version__, "CPU, 1 thread: us per training forward (min of 9 x 2000)")
    for name, us in rows.items():
        print(f"  {name:30s} {us:7.1f}  {us - rows['torch ops, bare']:+6.1f}")


if __name__ == "__main__":
    main()
