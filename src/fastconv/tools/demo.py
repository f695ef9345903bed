"""``fastconv demo``: a model through torch and through fastconv, timed and checked.

The model is torchvision's DeepLabV3-ResNet50 (``--model deeplabv3``, the default), a
torchvision classifier (``--model resnet50``) or a timm one (``--model timm:resnet50``),
randomly initialised or loaded from ``--weights`` (a local state_dict: nothing is
downloaded). Every row runs the same model on the same input; its output is checked against
a float64 run (within twice torch's own error in the same precision, or the per-layer
contract if larger); the table gives milliseconds, images per second and the speed-up over
the **baseline: torch eager in the same precision and layout** as fastconv (bf16 or fp16:
autocast on a channels-last copy; tf32 and ieee: float32). A PNG shows the input, the mask
(segmentation) and the timings.

On a GPU the rows are torch eager float32 (context, not a baseline), the baseline, torch's
own CUDA graph of it, ``torch.compile`` (default and reduce-overhead), ``fastconv.optimize``
and ``fastconv.optimize(cuda_graph=True)``. ``--train`` times a training step (forward,
backward, SGD) instead. Without a GPU it runs a small size, skips the GPU-only rows and
prints the last GPU measurement shipped with the package.
"""

from __future__ import annotations

import json
import statistics
import time
from importlib import resources

import torch

from ..costs import generator_released_on_failure
from ..errors import ConvError
from ..precision import TOLERANCE, Precision, relative_error
from .bench.models import float64_truth, no_dropout, output, provider_call

BASELINE = "torch eager"  # the row every speed-up divides


def _model(name: str, num_classes: int | None, weights: str | None, device):
    """(model, is_segmentation) for ``--model``."""
    extra = {} if num_classes is None else {"num_classes": num_classes}
    if name.startswith("timm:"):
        try:
            import timm
        except ImportError:
            raise ConvError(f"--model: {name!r} needs timm (pip install timm)") from None
        try:
            model = timm.create_model(name[5:], pretrained=False, **extra)
        except RuntimeError as exc:
            raise ConvError(f"--model: {name!r}: {exc}") from None
        segmentation = False
    else:
        import torchvision

        if name == "deeplabv3":
            model = torchvision.models.segmentation.deeplabv3_resnet50(
                weights=None, weights_backbone=None, num_classes=num_classes or 21,
                aux_loss=False)
            segmentation = True
        else:
            classifiers = torchvision.models.list_models(torchvision.models)
            if name not in classifiers:
                raise ConvError(f"--model: got {name!r}; allowed: deeplabv3, a torchvision "
                                f"classifier (resnet50, mobilenet_v3_large, ...) or "
                                f"timm:<name>")
            model = torchvision.models.get_model(name, weights=None, **extra)
            segmentation = False
    if weights:
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return model.to(device), segmentation


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


def _cuda_graph(fn):
    """``fn`` captured in a CUDA graph (after warm-up calls on a side stream): a call
    replays it and returns the captured output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with generator_released_on_failure(), torch.cuda.graph(graph):
        out = fn()

    def replay():
        graph.replay()
        return out
    return replay


def _rows(precision: Precision):
    """(row name, models provider, its precision, graphed, why skipped without a GPU)."""
    half = precision in (Precision.BF16, Precision.FP16)
    dtype = f" {precision.value} channels_last" if half else ""
    specs = []
    if half:
        specs.append(("torch fp32 eager (context)", "torch", Precision.TF32, False, None))
    specs += [(BASELINE + dtype, "torch", precision, False, None),
              ("torch CUDA graph" + dtype, "torch", precision, True, "no GPU"),
              ("torch.compile" + dtype, "torch_compile", precision, False,
               "no GPU (compiling on the CPU takes minutes)"),
              ("torch.compile reduce-overhead" + dtype, "torch_compile_ro", precision, False,
               "no GPU"),
              ("fastconv.optimize", "fastconv", precision, False, None),
              ("fastconv.optimize + CUDA graph", "fastconv_cuda_graph", precision, False,
               "no GPU")]
    return specs


def _last_gpu_measurement(model: str, mode: str) -> str:
    """The shipped record of the last GPU run of this demo (``data/measured.json``)."""
    try:
        text = resources.files("fastconv").joinpath("data/measured.json").read_text()
    except (FileNotFoundError, OSError):
        return "no GPU measurement is shipped with this copy of fastconv"
    record = json.loads(text)
    key = f"{model} {mode}"
    keys = [key] if key in record["rows"] else sorted(record["rows"])
    lines = [f"  {k} batch {record['rows'][k]['batch']}: " + ", ".join(
        f"{name} {value:.2f}x" for name, value in record["rows"][k]["speedups"].items())
        for k in keys]
    return (f"the last GPU measurement ({record['date']}, {record['gpu']}, torch "
            f"{record['torch']}, {record['source']}):\n" + "\n".join(lines))


def run(model: str = "deeplabv3", batch: int | None = None, size: int | None = None,
        precision: str | None = None, train: bool = False, image: str | None = None,
        weights: str | None = None, out: str = "fastconv-demo.png", reps: int | None = None,
        num_classes: int | None = None) -> int:
    """Run the demo; 0 when every row agrees with float64, 1 when one disagrees."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        print("the demo needs torchvision (pip install torchvision matching your torch)")
        return 2
    on_gpu = torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    batch = batch or ((8 if model == "deeplabv3" else 32) if on_gpu else 2)
    if train and batch < 2:
        raise ConvError(f"--batch: got {batch}; a training step needs at least 2 images "
                        f"(BatchNorm normalises over the batch)")
    if batch < 1:
        raise ConvError(f"--batch: got {batch}; allowed: 1 or more")
    size = size or ((512 if model == "deeplabv3" else 224) if on_gpu else 64)
    precision = precision or ("bf16" if on_gpu else "ieee")
    if precision not in ("ieee", "tf32", "bf16", "fp16"):
        raise ConvError(f"--precision: got {precision!r}; allowed: ieee, tf32, bf16, fp16")
    prec = Precision(precision)
    reps = reps or (20 if on_gpu else 3)
    mode = "train" if train else "eval"
    torch.manual_seed(0)
    net, segmentation = _model(model, num_classes, weights, device)
    net.train(train)
    img = _image(image, size, batch, device)
    x = _normalise(img)
    print(f"{model}, batch {batch}, {size}x{size}, {device}, precision {precision}, "
          f"{'training step' if train else 'inference'}")
    if not on_gpu:
        print(f"No CUDA GPU found: a small size on the CPU. Speed needs an NVIDIA GPU; "
              f"{_last_gpu_measurement(model, mode)}")
    truth = float64_truth(net, x)  # the same weights, mode and input, dropout off
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    rows, torch_err = [], {}  # torch_err: half precision? -> torch's own error
    try:
        specs = _rows(prec)
        for i, (name, provider, row_prec, graphed, gpu_only) in enumerate(specs, 1):
            print(f"[{i}/{len(specs)}] {name} ...", flush=True)
            if gpu_only and not on_gpu:
                rows.append((name, None, None, None, f"skipped: {gpu_only}"))
                continue
            torch.backends.cudnn.allow_tf32 = row_prec == Precision.TF32
            torch.backends.cuda.matmul.allow_tf32 = row_prec == Precision.TF32
            try:
                fn, copy_ = provider_call(provider, net, x, row_prec, mode)
                # (outputs cloned: a CUDA graph's, torch's or reduce-overhead's, live in
                # buffers the timed replays overwrite)
                with no_dropout(copy_):
                    if graphed and train:  # checked before the warm-up steps move weights
                        y = fn().detach().clone()
                    if graphed:
                        fn = _cuda_graph(fn)
                    if not (graphed and train):
                        y = fn().detach().clone()
                ms = _time(fn, reps, on_gpu)
                err = relative_error(y, truth)
                agree = float((y.argmax(1) == truth.argmax(1)).float().mean())
            except Exception as exc:  # a row that cannot run says why; the others go on
                rows.append((name, None, None, None, f"failed: {type(exc).__name__}: "
                                                     f"{str(exc)[:120]}"))
                continue
            half = row_prec in (Precision.BF16, Precision.FP16)
            if provider.startswith("torch"):
                torch_err.setdefault(half, err)
            bound = max(TOLERANCE[row_prec], 2 * torch_err.get(half, torch_err.get(False, 0)))
            rows.append((name, ms, err, agree, "" if err <= bound else "DISAGREES"))
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags
    base = next((ms for name, ms, *_ in rows if name.startswith(BASELINE) and ms), None)
    _print_table(rows, base, batch, segmentation)
    _plot(out, img, net, x, rows, base, segmentation)
    return 0 if all(r[4] != "DISAGREES" for r in rows) else 1


def _print_table(rows, base, batch: int, segmentation: bool) -> None:
    agree = "mask" if segmentation else "top-1"
    print(f"\n{'':48} {'ms':>9} {'img/s':>8} {'speed-up':>9} {'err f64':>9} {agree:>6}")
    for name, ms, err, agreement, note in rows:
        if ms is None:
            print(f"{name:48} {note}")
            continue
        mark = "  (baseline)" if name.startswith(BASELINE) else ""
        speedup = f"{base / ms:8.2f}x" if base else f"{'-':>9}"
        print(f"{name:48} {ms:9.2f} {batch * 1000 / ms:8.1f} {speedup} {err:9.1e} "
              f"{agreement:6.1%} {note}{mark}")
    print("speed-up: the baseline row's time over the row's (same precision and layout); "
          "err: relative error against float64")


def _plot(path: str, img, model, x, rows, base, segmentation: bool) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG (pip install matplotlib)")
        return
    picture = img[0].permute(1, 2, 0).float().cpu().numpy()
    panels = 3 if segmentation else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4.5))
    axes[0].imshow(picture)
    axes[0].set_title("input")
    axes[0].axis("off")
    if segmentation:
        with torch.no_grad():
            logits = output(model.eval()(x[:1]))[0]
        axes[1].imshow(picture)
        axes[1].imshow(logits.argmax(0).cpu().numpy(), cmap="tab20", alpha=0.5, vmin=0,
                       vmax=max(logits.shape[0] - 1, 1))
        axes[1].set_title("predicted mask (untrained unless --weights)")
        axes[1].axis("off")
    timed = [(n, ms) for n, ms, *_ in rows if ms is not None]
    colours = ["tab:gray" if n.startswith(BASELINE) else
               "tab:orange" if n.startswith("fastconv") else "tab:blue" for n, _ in timed]
    labels = [n + (" (baseline)" if n.startswith(BASELINE) else
                   f" {base / ms:.2f}x" if base else "") for n, ms in timed]
    axes[-1].barh(labels, [ms for _, ms in timed], color=colours)
    axes[-1].invert_yaxis()
    axes[-1].set_xlabel("ms per batch (median); speed-up over the baseline")
    axes[-1].set_title("GPU timings" if torch.cuda.is_available()
                       else "CPU timings (speed needs a GPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print(f"wrote {path}")
