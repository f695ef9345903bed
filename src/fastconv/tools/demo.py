"""``fastconv demo segmentation``: DeepLabV3-ResNet50 through torch and through fastconv.

Builds torchvision's DeepLabV3-ResNet50 (random initialisation, or ``--weights`` from a
local file: nothing is downloaded), runs each variant on the same input, checks that every
output agrees with a float64 run of the same model (within twice torch's own error in the
same class of precision), prints a table (ms, images/s, speed-up)
and writes a PNG with the input, the predicted mask over it and a bar chart of the timings.

Variants: torch eager; on a GPU also torch eager in bf16 channels-last (autocast) and
torch.compile; fastconv.optimize (and, on a GPU, with CUDA-graph replay). ``--train`` times
a training step (forward, backward, SGD step) of torch eager and fastconv.optimize in
training mode instead. Without a GPU it runs at a small size and says so.
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

from ..precision import TOLERANCE, Precision, relative_error
from .bench.models import float64_truth, no_dropout, output, train_step


def _model(num_classes: int, weights: str | None, device):
    import torchvision

    model = torchvision.models.segmentation.deeplabv3_resnet50(
        weights=None, weights_backbone=None, num_classes=num_classes, aux_loss=False)
    if weights:
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return model.to(device)


def _image(path: str | None, size: int, batch: int, device) -> torch.Tensor:
    """(batch, 3, size, size) in [0, 1]: the image at ``path`` (image i rolled sideways by
    i/batch of its width), or smooth synthetic images. The images differ: a training step's
    BatchNorm normalises over the batch, and in a batch of copies the pooling branch of
    ASPP (one value per image and channel) has zero variance, which BatchNorm turns into
    amplified rounding noise."""
    if path:
        import torchvision

        img = torchvision.io.read_image(path, torchvision.io.ImageReadMode.RGB).float() / 255
        img = torch.nn.functional.interpolate(img[None], size=(size, size), mode="bilinear",
                                              align_corners=False)[0]
        imgs = torch.stack([img.roll(i * size // batch, dims=-1) for i in range(batch)])
    else:
        g = torch.Generator().manual_seed(0)
        low = torch.rand(batch, 3, 6, 6, generator=g)
        imgs = torch.nn.functional.interpolate(low, size=(size, size), mode="bicubic",
                                               align_corners=False).clamp(0, 1)
    return imgs.contiguous().to(device)


def _normalise(x: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor([0.485, 0.456, 0.406], device=x.device).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std


def _time(fn, reps: int, on_gpu: bool) -> float:
    """Median milliseconds per call (after 2 warm-up calls)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        if on_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


class _Autocast(torch.nn.Module):
    """A channels-last copy of ``model`` run under bf16 autocast: torch's own mixed
    precision, the baseline for a bf16 training step."""

    def __init__(self, model):
        super().__init__()
        self.model = copy.deepcopy(model).to(memory_format=torch.channels_last)

    def forward(self, x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return self.model(x.contiguous(memory_format=torch.channels_last))


def _variants(model, x, on_gpu: bool, precision: str, train: bool):
    """(name, callable returning the output, precision it is held to, skip reason,
    the network it runs); a training variant steps its own copy of the model."""
    from ..optimize import optimize

    ieee = Precision.IEEE if precision == "ieee" else Precision.TF32
    ours = Precision(precision) if precision != "ieee" else ieee
    mode = "training" if train else "inference"
    if not train:
        model = model.eval()
    own = (lambda: copy.deepcopy(model)) if train else (lambda: model)
    # (name, network builder, precision, why it is skipped without a GPU or None)
    specs = [("torch eager", own, ieee, None),
             ("torch eager bf16 channels_last", lambda: _Autocast(model), Precision.BF16,
              "no GPU"),
             ("torch.compile", lambda: torch.compile(own()), ieee,
              "no GPU (CPU compile takes minutes)"),
             ("fastconv.optimize", lambda: optimize(model, mode, precision), ours, None),
             ("fastconv.optimize + CUDA graph",
              lambda: optimize(model, mode, precision, cuda_graph=True), ours, "no GPU")]
    out = []
    for name, build, prec, gpu_only in specs:
        if gpu_only and not on_gpu:
            out.append((name, None, None, gpu_only, None))
            continue
        net = build()
        fn = train_step(net, x) if train else (lambda net=net: output(net(x)))
        out.append((name, fn, prec, "", net))
    return out


def run(batch: int | None = None, size: int | None = None, precision: str | None = None,
        train: bool = False, image: str | None = None, weights: str | None = None,
        out: str = "fastconv-demo-segmentation.png", reps: int | None = None,
        num_classes: int = 21) -> int:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        print("the segmentation demo needs torchvision (pip install torchvision matching "
              "your torch)")
        return 2
    on_gpu = torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    if not on_gpu:
        print("no CUDA GPU found: running on the CPU at a small size (nothing here measures "
              "GPU speed)")
    from ..errors import ConvError

    batch = batch or (8 if on_gpu else 2 if train else 1)  # training: BatchNorm needs 2
    if train and batch < 2:
        raise ConvError(f"--batch: got {batch}; a training step needs at least 2 images "
                        f"(BatchNorm normalises over the batch)")
    size = size or (512 if on_gpu else 64)
    precision = precision or ("bf16" if on_gpu else "ieee")
    reps = reps or (20 if on_gpu else 3)
    if precision not in ("ieee", "tf32", "bf16", "fp16"):
        raise ConvError(f"precision: got {precision!r}; allowed: ieee, tf32, bf16, fp16")
    torch.manual_seed(0)
    model = _model(num_classes, weights, device)
    img = _image(image, size, batch, device)
    x = _normalise(img)
    print(f"DeepLabV3-ResNet50, batch {batch}, {size}x{size}, {device}, fastconv precision "
          f"{precision}, {'training step' if train else 'inference'}")
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = precision == "tf32"  # torch's baseline: same math
    rows = []
    if not train:
        model.eval()
    truth = float64_truth(model, x)  # the same weights, mode and input, dropout off
    torch_err: dict[bool, float] = {}  # half precision? -> torch's own error
    try:
        with torch.no_grad() if not train else torch.enable_grad():
            variants = _variants(model, x, on_gpu, precision, train)
            for i, (name, fn, prec, skip, net) in enumerate(variants, 1):
                print(f"[{i}/{len(variants)}] {name} ...", flush=True)
                if fn is None:
                    rows.append((name, None, None, None, skip))
                    continue
                with no_dropout(net):
                    y = fn()
                err = relative_error(y, truth)
                agree = float((y.argmax(1) == truth.argmax(1)).float().mean())
                half = prec in (Precision.BF16, Precision.FP16)
                if name.startswith("torch"):
                    torch_err.setdefault(half, err)
                # a whole network compounds rounding: held to twice torch's own error in
                # the same class of precision, or to the per-layer contract if larger
                bound = max(TOLERANCE[prec], 2 * torch_err.get(half, torch_err.get(False, 0)))
                ms = _time(fn, reps, on_gpu)
                rows.append((name, ms, err, agree, "" if err <= bound else "DISAGREES"))
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags
    base = rows[0][1]
    print(f"\n{'variant':34} {'ms':>9} {'img/s':>8} {'speed-up':>9} {'err f64':>9} "
          f"{'mask':>6}")
    for name, ms, err, agree, note in rows:
        if ms is None:
            print(f"{name:34} {'skipped: ' + note}")
            continue
        print(f"{name:34} {ms:9.2f} {batch * 1000 / ms:8.1f} {base / ms:8.2f}x {err:9.1e} "
              f"{agree:6.1%} {note}")
    _plot(out, img, model, x, rows, num_classes)
    return 0 if all(r[4] != "DISAGREES" for r in rows) else 1


def _plot(path: str, img, model, x, rows, num_classes: int) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG (pip install matplotlib)")
        return
    with torch.no_grad():
        mask = model.eval()(x[:1])["out"][0].argmax(0).cpu()
    picture = img[0].permute(1, 2, 0).float().cpu().numpy()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    axes[0].imshow(picture)
    axes[0].set_title("input")
    axes[1].imshow(picture)
    axes[1].imshow(mask.numpy(), cmap="tab20", alpha=0.5, vmin=0, vmax=max(num_classes - 1, 1))
    axes[1].set_title("predicted mask (untrained model unless --weights)")
    for a in axes[:2]:
        a.axis("off")
    timed = [(n, ms) for n, ms, *_ in rows if ms is not None]
    axes[2].barh([n for n, _ in timed], [ms for _, ms in timed], color="tab:blue")
    axes[2].invert_yaxis()
    axes[2].set_xlabel("ms per batch (median)")
    axes[2].set_title("timings")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print(f"wrote {path}")
