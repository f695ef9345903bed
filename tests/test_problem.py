"""ConvProblem: shapes, padding forms, FLOPs, bytes, keys, layouts."""

import pytest
import torch
import torch.nn.functional as F

from fastconv import ConvProblem, Epilogue
from fastconv.precision import Precision


def _problem(x, w, **kw):
    return ConvProblem.from_tensors(x, w, rank=x.dim() - 2, **kw)


@pytest.mark.parametrize("h,w_,k,s,p,d", [(7, 7, 3, 1, 1, 1), (9, 13, 3, 2, 1, 1),
                                          (224, 224, 7, 2, 3, 1), (10, 11, 5, 3, 0, 2),
                                          (5, 6, 1, 4, 0, 1)])
def test_output_shape_matches_torch(h, w_, k, s, p, d):
    x = torch.randn(2, 6, h, w_)
    w = torch.randn(4, 3, k, k)
    prob = _problem(x, w, stride=s, padding=p, dilation=d, groups=2)
    assert prob.output_shape() == tuple(F.conv2d(x, w, None, s, p, d, 2).shape)


def test_rectangular_kernel_and_asymmetric_padding():
    x, w = torch.randn(1, 3, 10, 12), torch.randn(5, 3, 2, 5)
    prob = _problem(x, w, padding=((1, 2), (0, 3)))
    assert prob.kernel == (2, 5)
    assert prob.pad_pre == (1, 0) and prob.pad_post == (2, 3)
    assert prob.output_shape() == tuple(F.conv2d(F.pad(x, (0, 3, 1, 2)), w).shape)


@pytest.mark.parametrize("k,d", [(3, 1), (4, 1), (3, 2), (2, 3)])
def test_same_padding_matches_torch(k, d):
    x, w = torch.randn(1, 2, 9, 8), torch.randn(3, 2, k, k)
    prob = _problem(x, w, padding="same", dilation=d)
    assert prob.output_shape() == tuple(F.conv2d(x, w, padding="same", dilation=d).shape)
    assert prob.out_size == prob.in_size


def test_valid_padding():
    x, w = torch.randn(1, 2, 9), torch.randn(3, 2, 4)
    assert _problem(x, w, padding="valid").output_shape() == (1, 3, 6)


@pytest.mark.parametrize("s,p,op,d", [(2, 1, 1, 1), (3, 0, 2, 1), (1, 1, 0, 2), (2, 2, 1, 3)])
def test_transposed_output_shape_matches_torch(s, p, op, d):
    x = torch.randn(2, 4, 5, 6)
    w = torch.randn(4, 3, 3, 3)
    prob = ConvProblem.from_tensors(x, w, None, s, p, d, 1, rank=2, transposed=True,
                                    output_padding=op)
    ref = F.conv_transpose2d(x, w, None, s, p, op, 1, d)
    assert prob.output_shape() == tuple(ref.shape)


def test_flops_and_bytes():
    x, w = torch.randn(32, 512, 7, 7), torch.randn(512, 512, 3, 3)
    prob = _problem(x, w, padding=1)
    assert prob.flops() == 2 * 32 * 7 * 7 * 512 * 512 * 9
    assert prob.min_bytes() == 4 * (x.numel() + w.numel() + 32 * 512 * 49)
    grouped = _problem(torch.randn(2, 8, 5, 5), torch.randn(8, 2, 3, 3), groups=4)
    assert grouped.flops() == 2 * 2 * 3 * 3 * 8 * 2 * 9


def test_key_distinguishes_everything_that_matters():
    x, w = torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3)
    base = _problem(x, w, padding=1)
    assert base.key() == _problem(torch.randn(2, 4, 8, 8), w, padding=1).key()
    variants = [
        _problem(x, w, padding=2), _problem(x, w, padding=1, stride=2),
        _problem(x.to(memory_format=torch.channels_last), w, padding=1),
        _problem(x, w, padding=1, precision="ieee"),
        _problem(x, w, padding=1, epilogue=Epilogue(activation="relu")),
        _problem(x.half(), w.half(), padding=1),
        _problem(x, w, padding=((1, 0), (1, 1))),
    ]
    keys = {base.key()} | {v.key() for v in variants}
    assert len(keys) == len(variants) + 1


def test_layout_detection():
    x = torch.randn(2, 4, 5, 5)
    assert _problem(x, torch.randn(4, 4, 1, 1)).layout == "nchw"
    cl = x.contiguous(memory_format=torch.channels_last)
    assert _problem(cl, torch.randn(4, 4, 1, 1)).layout == "nhwc"


def test_precision_follows_torch_flags():
    x, w = torch.randn(1, 2, 4, 4), torch.randn(2, 2, 1, 1)
    saved = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        assert _problem(x, w).precision == Precision.TF32
        torch.backends.cudnn.allow_tf32 = False
        assert _problem(x, w).precision == Precision.IEEE
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    assert _problem(x.bfloat16(), w.bfloat16()).precision == Precision.BF16
    assert _problem(x.half(), w.half()).precision == Precision.FP16


def test_new_output_keeps_layout():
    x = torch.randn(2, 4, 5, 6).contiguous(memory_format=torch.channels_last)
    out = _problem(x, torch.randn(3, 4, 3, 3)).new_output()
    assert out.shape == (2, 3, 3, 4) and out.is_contiguous(memory_format=torch.channels_last)


def test_an_epilogue_is_the_identity_whatever_the_unused_slope():
    """negative_slope is read by leaky_relu only: conv2d(..., negative_slope=0.2) without an
    activation is a bare convolution (cuDNN refused it as a fused epilogue)."""
    assert Epilogue().is_identity and Epilogue(negative_slope=0.2).is_identity
    for other in (Epilogue(activation="leaky_relu"), Epilogue(activation="relu"),
                  Epilogue(has_scale=True), Epilogue(has_shift=True),
                  Epilogue(has_residual=True)):
        assert not other.is_identity
