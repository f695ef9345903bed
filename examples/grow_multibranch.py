"""Train a small multi-branch network on synthetic data and widen it twice while it trains.

The network: a stem, a MultiBranch block whose branches meet through identity-initialised
1x1 projections, and a pooled Linear head. ``grow_width`` finds the producers from the
dataflow (the stem feeds both branches; each branch's convolutions feed the next or the
projection; the last one the head) and widens them so that the network computes exactly what
it did: the loss right after a growth equals the loss right before it, and training goes on
from there with the optimizer's state (AdamW moments) carried to the new parameters.

    python examples/grow_multibranch.py [--steps 150] [--out grow_multibranch.png]

Prints the loss around each growth and the widths; writes the loss curve as a PNG when
matplotlib is installed. Runs on the CPU in seconds (a GPU is used when present).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from fastconv.growth import MultiBranch, grow_width


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.block = MultiBranch(
            [nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                           nn.Conv2d(8, 8, 3, padding=1)),
             nn.Sequential(nn.Conv2d(8, 12, 1), nn.ReLU(), nn.Conv2d(12, 6, 1))],
            out_channels=8, scale=1.0)
        self.mid = nn.Sequential(nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1),
                                 nn.ReLU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))

    def forward(self, x):
        return self.head(self.mid(self.block(self.stem(x))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--out", default="grow_multibranch.png")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    # synthetic 4-class data: the class sets the mean colour of a noisy image
    labels = torch.randint(0, 4, (256,))
    images = torch.randn(256, 3, 16, 16) + torch.randn(4, 3, 1, 1)[labels] * 0.15
    images, labels = images.to(device), labels.to(device)
    net = Net().to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    losses, grown_at = [], []
    for step in range(args.steps):
        batch = torch.randint(0, 256, (64,), device=device)
        loss = nn.functional.cross_entropy(net(images[batch]), labels[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step + 1 in (args.steps // 3, 2 * args.steps // 3):
            net.eval()  # the same loss before and after: evaluated without batch statistics
            with torch.no_grad():
                before = nn.functional.cross_entropy(net(images), labels).item()
            report = grow_width(net, 1.5, optimizer=opt)
            with torch.no_grad():
                after = nn.functional.cross_entropy(net(images), labels).item()
            net.train()
            grown_at.append(step)
            print(f"step {step + 1}: grew {len(report.grown)} producers; full-data loss "
                  f"{before:.6f} before, {after:.6f} after")
            print(report)
    print(f"loss: first 10 steps {sum(losses[:10]) / 10:.3f}, last 10 "
          f"{sum(losses[-10:]) / 10:.3f}; parameters now "
          f"{sum(p.numel() for p in net.parameters())}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return 0
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(range(1, len(losses) + 1), losses, lw=1)
    for s in grown_at:
        ax.axvline(s + 1, color="gray", ls="--", lw=0.8)
    ax.set(xlabel="step", ylabel="training loss (batch)",
           title="grow_width x1.5 at the dashed lines")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
