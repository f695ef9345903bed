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


# ResNet-50's conv -> BatchNorm -> ReLU layers at batch 32 (the stem and each bottleneck's
# first two convolutions; not the expanding 1x1 nor the downsample, whose BatchNorm feeds the
# residual add): torch runs conv2d, batch_norm, relu.
SUITES["resnet50_cbr"] = [
    dataclasses.replace(c, name=c.name.replace("r50_", "cbr_"), bn=True, activation="relu")
    for c in SUITES["resnet50"]
    if "_ds_" not in c.name and not (c.kernel == (1, 1) and c.k == 4 * c.c)]


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
    from ..errors import ConvError

    if name not in SUITES:
        raise ConvError(f"suite: got {name!r}; allowed: {', '.join(SUITES)}")
    return SUITES[name]
