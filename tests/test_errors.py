"""Every class of invalid input raises ConvError naming the argument; valid oddities work."""

import pytest
import torch
import torch.nn.functional as F

import fastconv
from fastconv import ConvError, ConvTypeError, NotSupported

x = torch.randn(2, 4, 8, 8)
w = torch.randn(6, 4, 3, 3)


def _raises(match, fn=fastconv.conv2d, *args, exc=ConvError, **kw):
    with pytest.raises(exc, match=match) as info:
        fn(*args, **kw)
    assert isinstance(info.value, ValueError)
    return info.value


def test_non_tensor_input_is_a_type_error():
    err = _raises("input: expected a torch.Tensor", fastconv.conv2d, [[1.0]], w,
                  exc=ConvTypeError)
    assert isinstance(err, TypeError)
    _raises("weight: expected a torch.Tensor", fastconv.conv2d, x, 3.0, exc=ConvTypeError)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs two devices")
def test_tensors_on_different_devices():
    _raises("weight: is on cuda", fastconv.conv2d, x, w.cuda())


def test_tensors_on_different_devices_meta():
    # The meta device stands in for a second device on CPU-only machines.
    _raises(r"weight: is on meta:?\d? but input is on cpu", fastconv.conv2d, x,
            torch.empty(6, 4, 3, 3, device="meta"))
    _raises("bias: is on meta", fastconv.conv2d, x, w, torch.empty(6, device="meta"))
    _raises("residual: is on meta", fastconv.conv2d, x, w,
            residual=torch.empty(2, 6, 6, 6, device="meta"))


def test_unsupported_dtype():
    _raises("input: dtype torch.int64 is not supported", fastconv.conv2d, x.long(), w.long())


def test_mixed_dtypes():
    _raises("weight: dtype torch.float16 differs from input dtype torch.float32",
            fastconv.conv2d, x, w.half())


def test_wrong_rank():
    _raises("input: expected a 4-D", fastconv.conv2d, torch.randn(2, 4, 8, 8, 1), w)
    _raises("input: expected a 3-D", fastconv.conv1d, torch.randn(8), torch.randn(2, 1, 3))


def test_weight_rank_differs_from_input_rank():
    _raises("weight: expected a 4-D tensor", fastconv.conv2d, x, torch.randn(6, 4, 3))


def test_channel_mismatch_names_both_numbers():
    _raises(r"input has 4 channels but weight.shape\[1\] \* groups = 3 \* 1 = 3",
            fastconv.conv2d, x, torch.randn(6, 3, 3, 3))


def test_groups_must_divide_channels():
    _raises("groups: 4 does not divide the output channels 6", fastconv.conv2d, x,
            torch.randn(6, 1, 3, 3), groups=4)
    _raises("groups: got 0", fastconv.conv2d, x, w, groups=0)


@pytest.mark.parametrize("arg", ["stride", "dilation"])
@pytest.mark.parametrize("value", [0, -1, (1, 0)])
def test_stride_and_dilation_must_be_positive(arg, value):
    _raises(f"{arg}: got .*must be positive", fastconv.conv2d, x, w, **{arg: value})


def test_float_stride_is_a_type_error():
    _raises("stride: expected an int", fastconv.conv2d, x, w, stride=1.5, exc=ConvTypeError)


@pytest.mark.parametrize("padding", [-1, (0, -2), ((1, -1), (0, 0))])
def test_negative_padding(padding):
    _raises("padding: got .*non-negative", fastconv.conv2d, x, w, padding=padding)


def test_bad_padding_string():
    _raises("padding: got 'full'; allowed strings", fastconv.conv2d, x, w, padding="full")


def test_same_padding_needs_stride_one():
    _raises("padding: 'same' needs stride 1", fastconv.conv2d, x, w, padding="same", stride=2)


def test_output_size_must_be_positive():
    _raises("every output size must be positive", fastconv.conv2d, torch.randn(1, 4, 2, 2), w)
    _raises("every output size must be positive", fastconv.conv2d, x, w, dilation=5)


def test_bias_shape_dtype_device():
    _raises(r"bias: expected shape \(6,\)", fastconv.conv2d, x, w, torch.randn(5))
    _raises("bias: dtype torch.float16 differs", fastconv.conv2d, x, w, torch.randn(6).half())
    _raises("bias: expected a torch.Tensor or None", fastconv.conv2d, x, w, [0.0] * 6,
            exc=ConvTypeError)


def test_scale_and_shift_shape():
    _raises(r"scale: expected shape \(6,\)", fastconv.conv2d, x, w, scale=torch.ones(6, 1))
    _raises(r"shift: expected shape \(6,\)", fastconv.conv2d, x, w, shift=torch.ones(3))


def test_out_shape_dtype_device():
    _raises(r"out: expected shape \(2, 6, 6, 6\)", fastconv.conv2d, x, w,
            out=torch.empty(2, 6, 6, 5))
    _raises("out: dtype torch.float64 differs", fastconv.conv2d, x, w,
            out=torch.empty(2, 6, 6, 6, dtype=torch.float64))
    _raises("out: is on meta", fastconv.conv2d, x, w,
            out=torch.empty(2, 6, 6, 6, device="meta"))


def test_out_overlapping_an_input():
    buf = torch.randn(2 * 6 * 6 * 6 + 100)
    xin = buf[:2 * 4 * 8 * 8].view(2, 4, 8, 8)
    out = buf[50:50 + 2 * 6 * 6 * 6].view(2, 6, 6, 6)
    _raises("out: overlaps input", fastconv.conv2d, xin, w, out=out)
    res = torch.randn(2, 6, 6, 6)
    _raises("out: overlaps residual", fastconv.conv2d, x, w, residual=res, out=res)


def test_residual_shape():
    _raises(r"residual: expected shape \(2, 6, 6, 6\)", fastconv.conv2d, x, w,
            residual=torch.randn(2, 6, 6, 7))


def test_bad_activation_backend_precision():
    _raises("activation: got 'swish'; allowed", fastconv.conv2d, x, w, activation="swish")
    _raises("backend: got 'cuda'; allowed: 'auto', 'aten', 'triton'", fastconv.conv2d, x, w,
            backend="cuda")
    _raises("precision: got 'fp8'", fastconv.conv2d, x, w, precision="fp8")
    _raises("precision: got 'bf16' for torch.float32 tensors", fastconv.conv2d, x, w,
            precision="bf16")


def test_forced_backend_lists_every_reason():
    many = 65536  # more groups than the launch grid's second dimension holds
    with pytest.raises(NotSupported) as info:
        fastconv.conv2d(torch.randn(1, many, 1, 1), torch.randn(many, 1, 1, 1), groups=many,
                        backend="triton")
    assert any("groups 65536 > 65535" in r for r in info.value.reasons)
    assert "triton" in str(info.value)


# -------------------------------------------------------------------- not errors


def test_non_finite_values_propagate_like_torch():
    xi = x.clone()
    xi[0, 1, 2, 3] = float("nan")
    xi[1, 0, 5, 5] = float("inf")
    ours = fastconv.conv2d(xi, w, backend="aten")
    ref = F.conv2d(xi, w)
    assert torch.equal(torch.isnan(ours), torch.isnan(ref))
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))


def test_empty_batch_gives_empty_output():
    out = fastconv.conv2d(torch.randn(0, 4, 8, 8), w, padding=1)
    assert out.shape == (0, 6, 8, 8)


def test_non_contiguous_input_works():
    xt = torch.randn(2, 8, 8, 4).permute(0, 3, 2, 1)  # (2, 4, 8, 8), odd strides
    assert not xt.is_contiguous()
    torch.testing.assert_close(fastconv.conv2d(xt, w, backend="aten"), F.conv2d(xt, w))
