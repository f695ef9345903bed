"""Named lists of benchmark problems.

A case is a :class:`BenchCase`: the convolution's shape and, where the suite is about fusion,
its epilogue. ``fastconv bench --list`` prints them.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BenchCase:
    name: str
    n: int
    c: int
    k: int
    spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: int = 1
    padding: int = 0
    dilation: int = 1
    groups: int = 1
    bias: bool = False
    activation: str = "none"
    transposed: bool = False  # then c is the input's channels and k the output's
    output_padding: int = 0
    bn: bool = False  # conv -> BatchNorm -> activation (batch statistics unless mode eval)
    causal: bool = False  # rank 1: all the padding on the left, dilation·(kernel − 1)

    def padding_arg(self):
        """The padding as fastconv takes it (causal: one (pre, post) pair)."""
        if self.causal:
            return ((self.dilation * (self.kernel[0] - 1), 0),)
        return self.padding

    @property
    def rank(self) -> int:
        return len(self.spatial)

    def weight_shape(self) -> tuple[int, ...]:
        if self.transposed:
            return (self.c, self.k // self.groups, *self.kernel)
        return (self.k, self.c // self.groups, *self.kernel)


def _r50(name, c, k, hw, ks, stride=1):
    return BenchCase(f"r50_{name}", 32, c, k, (hw, hw), (ks, ks), stride, ks // 2)


SUITES: dict[str, list[BenchCase]] = {
    # The seed's headline case (input 32x512x7x7, weight 512x512x3x3, s1 p1): the plain
    # convolution, and conv + bias + ReLU (torch runs conv2d -> add -> relu).
    "seed000": [
        BenchCase("seed000", 32, 512, 512, (7, 7), (3, 3), 1, 1),
        BenchCase("seed000_bias_relu", 32, 512, 512, (7, 7), (3, 3), 1, 1, bias=True,
                  activation="relu"),
    ],
    # The distinct convolution layers of torchvision's ResNet-50 (v1.5: stride on the 3x3)
    # at batch 32, 224x224 input.
    "resnet50": [
        _r50("stem_7x7_s2", 3, 64, 224, 7, 2),
        _r50("l1_1x1_64_64", 64, 64, 56, 1),
        _r50("l1_3x3_64", 64, 64, 56, 3),
        _r50("l1_1x1_64_256", 64, 256, 56, 1),
        _r50("l1_1x1_256_64", 256, 64, 56, 1),
        _r50("l2_1x1_256_128", 256, 128, 56, 1),
        _r50("l2_3x3_128_s2", 128, 128, 56, 3, 2),
        _r50("l2_1x1_128_512", 128, 512, 28, 1),
        _r50("l2_ds_256_512_s2", 256, 512, 56, 1, 2),
        _r50("l2_1x1_512_128", 512, 128, 28, 1),
        _r50("l2_3x3_128", 128, 128, 28, 3),
        _r50("l3_1x1_512_256", 512, 256, 28, 1),
        _r50("l3_3x3_256_s2", 256, 256, 28, 3, 2),
        _r50("l3_1x1_256_1024", 256, 1024, 14, 1),
        _r50("l3_ds_512_1024_s2", 512, 1024, 28, 1, 2),
        _r50("l3_1x1_1024_256", 1024, 256, 14, 1),
        _r50("l3_3x3_256", 256, 256, 14, 3),
        _r50("l4_1x1_1024_512", 1024, 512, 14, 1),
        _r50("l4_3x3_512_s2", 512, 512, 14, 3, 2),
        _r50("l4_1x1_512_2048", 512, 2048, 7, 1),
        _r50("l4_ds_1024_2048_s2", 1024, 2048, 14, 1, 2),
        _r50("l4_1x1_2048_512", 2048, 512, 7, 1),
        _r50("l4_3x3_512", 512, 512, 7, 3),
    ],
    # Decoder upsampling layers (U-Net / DCGAN style, as in PyTorch's own figures in
    # ../shared/anchors/): kernel 4 stride 2 padding 1, and kernel 2 stride 2.
    "transposed": [
        BenchCase("up_k4s2_512_256_16", 32, 512, 256, (16, 16), (4, 4), 2, 1, transposed=True),
        BenchCase("up_k4s2_256_128_32", 32, 256, 128, (32, 32), (4, 4), 2, 1, transposed=True),
        BenchCase("up_k4s2_128_64_64", 32, 128, 64, (64, 64), (4, 4), 2, 1, transposed=True),
        BenchCase("up_k2s2_256_128_64", 16, 256, 128, (64, 64), (2, 2), 2, 0, transposed=True),
    ],
}


def _seed002(name, c, k, ks=3, stride=1, groups=1):
    return BenchCase(f"seed002_{name}", 128, c, k, (448,), (ks,), stride, 1, groups=groups)


def _dw(name, c, hw, ks, stride=1, batch=64, prefix="dw"):
    return BenchCase(f"{prefix}_{name}", batch, c, c, (hw, hw), (ks, ks), stride, ks // 2,
                     groups=c)


def _rx(name, c, hw, stride=1):
    return BenchCase(f"rx50_{name}", 64, c, c, (hw, hw), (3, 3), stride, 1, groups=32)


def _w2v(name, c, length, ks, stride):
    return BenchCase(f"w2v2_{name}", 16, c, 512, (length,), (ks,), stride, 0)


SUITES.update({
    # The seed's 17-case conv1d table (file 002): batch 128, length 448, padding 1; kernel,
    # stride, groups and channels varied around 512 -> 1024 k3 s1 (which is also the last
    # channels case, as in the seed's table).
    "seed002_conv1d": [
        *(_seed002(f"k{k}", 512, 1024, ks=k) for k in (3, 5, 7, 9)),
        *(_seed002(f"s{s}", 512, 1024, stride=s) for s in (2, 4, 8, 16)),
        *(_seed002(f"g{g}", 512, 1024, groups=g) for g in (2, 4, 8, 16)),
        *(_seed002(f"c{c}_{2 * c}", c, 2 * c) for c in (32, 64, 128, 256, 512)),
    ],
    # Depthwise layers of MobileNetV2 and EfficientNet-B0 at batch 64.
    "depthwise": [
        _dw("32_112_k3", 32, 112, 3), _dw("96_112_k3_s2", 96, 112, 3, 2),
        _dw("144_56_k3", 144, 56, 3), _dw("144_56_k3_s2", 144, 56, 3, 2),
        _dw("192_28_k3", 192, 28, 3), _dw("384_14_k3", 384, 14, 3),
        _dw("576_14_k3", 576, 14, 3), _dw("960_7_k3", 960, 7, 3),
        _dw("240_28_k5", 240, 28, 5), _dw("672_14_k5", 672, 14, 5),
    ],
    # Every distinct depthwise layer of timm convnext_tiny (7x7), mobilenetv3_large_100 and
    # efficientnet_b0 and torchvision mobilenet_v2 at 224x224, batch 32 (channels, input
    # size, kernel, stride; listed from the models by forward hooks), issue 23.
    "depthwise_models": [
        _dw(f"{c}_{hw}_k{ks}" + (f"_s{st}" if st > 1 else ""), c, hw, ks, st, batch=32,
            prefix="dwm")
        for c, hw, ks, st in (
            (16, 112, 3, 1), (32, 112, 3, 1), (64, 112, 3, 2), (72, 56, 3, 1), (72, 56, 5, 2),
            (96, 56, 7, 1), (96, 112, 3, 2), (120, 28, 5, 1), (144, 56, 3, 1),
            (144, 56, 3, 2), (144, 56, 5, 2), (184, 14, 3, 1), (192, 28, 3, 1),
            (192, 28, 3, 2), (192, 28, 7, 1), (200, 14, 3, 1), (240, 28, 3, 2),
            (240, 28, 5, 1), (384, 14, 3, 1), (384, 14, 7, 1), (480, 14, 3, 1),
            (480, 14, 5, 1), (576, 14, 3, 1), (576, 14, 3, 2), (672, 14, 3, 1),
            (672, 14, 5, 1), (672, 14, 5, 2), (768, 7, 7, 1), (960, 7, 3, 1),
            (960, 7, 5, 1), (1152, 7, 3, 1), (1152, 7, 5, 1))],
    # ResNeXt-50 32x4d's grouped 3x3 convolutions (32 groups) at batch 64.
    "grouped": [
        _rx("128_56", 128, 56), _rx("256_56_s2", 256, 56, 2), _rx("256_28", 256, 28),
        _rx("512_28_s2", 512, 28, 2), _rx("512_14", 512, 14), _rx("1024_14_s2", 1024, 14, 2),
        _rx("1024_7", 1024, 7),
    ],
    # Short 1-D convolutions: causal depthwise k=4 as in Mamba-style blocks, and the wav2vec2
    # feature encoder's seven convolutions on 16 x 4 s of 16 kHz audio.
    "conv1d_short": [
        BenchCase("causal_dw_k4_8x4096x2048", 8, 4096, 4096, (2048,), (4,), groups=4096,
                  causal=True),
        BenchCase("causal_dw_k4_32x2048x1024", 32, 2048, 2048, (1024,), (4,), groups=2048,
                  causal=True),
        _w2v("conv0_k10_s5", 1, 64000, 10, 5),
        *(_w2v(f"conv{i}_k3_s2", 512, n, 3, 2)
          for i, n in enumerate((12799, 6399, 3199, 1599), start=1)),
        *(_w2v(f"conv{i}_k2_s2", 512, n, 2, 2) for i, n in ((5, 799), (6, 399))),
    ],
})

# ResNet-50's conv -> BatchNorm -> ReLU layers at batch 32 (the stem and each bottleneck's
# first two convolutions; not the expanding 1x1 nor the downsample, whose BatchNorm feeds the
# residual add): torch runs conv2d, batch_norm, relu.
SUITES["resnet50_cbr"] = [
    dataclasses.replace(c, name=c.name.replace("r50_", "cbr_"), bn=True, activation="relu")
    for c in SUITES["resnet50"]
    if "_ds_" not in c.name and not (c.kernel == (1, 1) and c.k == 4 * c.c)]

# Host cost per call (issue 20): problems so small that the kernels take a few microseconds,
# so a call's time is the host's. Rows of this suite carry host_us (wall clock per call of
# back-to-back calls) besides the usual GPU timings. A conv, conv + bias + ReLU, and
# conv -> BatchNorm -> ReLU (mode train: ConvBNAct2d's training step).
SUITES["host"] = [
    BenchCase("host_conv", 1, 16, 16, (8, 8), (3, 3), 1, 1),
    BenchCase("host_conv_bias_relu", 1, 16, 16, (8, 8), (3, 3), 1, 1, bias=True,
              activation="relu"),
    BenchCase("host_conv_bn_relu", 1, 16, 16, (8, 8), (3, 3), 1, 1, bn=True, activation="relu"),
]
#: suites whose rows also report host microseconds per call
HOST_SUITES = ("host",)


def shrink(case: BenchCase) -> BenchCase:
    """A small version of ``case`` (same geometry, few channels and pixels) for correctness
    runs under the Triton interpreter."""
    g = case.groups
    c = g * min(case.c // g, 8)
    k = g * min(case.k // g, 8)
    reach = [case.dilation * (kk - 1) + 1 for kk in case.kernel]
    if case.transposed:  # any input size works; keep a few pixels
        spatial = tuple(min(s, 3) for s in case.spatial)
    else:
        spatial = tuple(max(r - 2 * case.padding, min(s, r + 2 * case.stride)) for s, r
                        in zip(case.spatial, reach))
    return dataclasses.replace(case, n=1, c=c, k=k, spatial=spatial)


def get(name: str) -> list[BenchCase]:
    from ...errors import ConvError

    if name not in SUITES:
        raise ConvError(f"suite: got {name!r}; allowed: {', '.join(SUITES)}")
    return SUITES[name]
