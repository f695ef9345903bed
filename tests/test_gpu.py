"""GPU tests: real sizes, every precision, real compilation and tensor-core numerics."""

import random

import pytest
import torch
import torch.nn.functional as F

import fastconv
from fastconv import backends, testing
from fastconv.precision import TOLERANCE, Precision, relative_error

pytestmark = pytest.mark.gpu
BACKENDS = list(backends.REGISTRY)


@pytest.mark.parametrize("precision", list(Precision), ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_random_real_size_problems(backend, precision):
    rng = random.Random(hash((backend, precision.value)) % 1000)
    gen = torch.Generator().manual_seed(7)
    for _ in range(15):
        case = testing.random_case(rng, small=False)
        err = testing.check_case(case, backend=backend, precision=precision, device="cuda",
                                 generator=gen)
        assert err <= TOLERANCE[precision], f"{testing.describe(case)}: {err:.3g}\n{case}"


@pytest.mark.parametrize("precision", list(Precision), ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_resnet_like_layers(precision, layout):
    for c, k, hw, ks, s in ((64, 64, 56, 3, 1), (256, 128, 56, 1, 1), (128, 128, 56, 3, 2),
                            (3, 64, 112, 7, 2), (512, 512, 7, 3, 1)):
        case = dict(rank=2, n=8, c=c, k=k, spatial=(hw, hw), kernel=(ks, ks), stride=(s, s),
                    padding=((ks // 2,) * 2,) * 2, dilation=(1, 1), groups=1, bias=True,
                    scale=True, shift=False, residual=True, activation="relu",
                    negative_slope=0.01, channels_last=layout == "nhwc")
        err = testing.check_case(case, backend="triton", precision=precision, device="cuda")
        assert err <= TOLERANCE[precision], f"{c}->{k} {hw} k{ks} s{s}: {err:.3g}"


def test_tf32_is_really_tf32_and_ieee_is_not():
    """The same data gives a TF32-sized error in tf32 and an fp32-sized one in ieee."""
    x = torch.randn(8, 256, 28, 28, device="cuda")
    w = torch.randn(256, 256, 3, 3, device="cuda") / 48
    ref = F.conv2d(x.double(), w.double(), padding=1)
    e_tf32 = relative_error(fastconv.conv2d(x, w, padding=1, backend="triton",
                                            precision="tf32"), ref)
    e_ieee = relative_error(fastconv.conv2d(x, w, padding=1, backend="triton",
                                            precision="ieee"), ref)
    assert e_ieee < 1e-6 < e_tf32 < TOLERANCE[Precision.TF32], (e_ieee, e_tf32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_candidate_config_is_correct(backend):
    """Each configuration dispatch may time is itself correct, epilogue included."""
    cls = backends.REGISTRY[backend]
    for dtype in (torch.float32, torch.bfloat16):
        for c, k, ks in ((64, 64, 3), (3, 64, 7), (256, 512, 1), (32, 32, 3), (512, 512, 3)):
            x = torch.randn(4, c, 23, 19, device="cuda").to(dtype)
            w = (torch.randn(k, c, ks, ks, device="cuda") / (c * ks * ks) ** 0.5).to(dtype)
            b = torch.randn(k, device="cuda").to(dtype)
            res = torch.randn(4, k, 23, 19, device="cuda").to(dtype)
            ep = fastconv.Epilogue(activation="relu", has_shift=True, has_residual=True)
            prob = fastconv.ConvProblem.from_tensors(x, w, b, padding=ks // 2, rank=2,
                                                     epilogue=ep, residual=res)
            ref = F.relu(F.conv2d(x.double(), w.double(), b.double(), padding=ks // 2)
                         + res.double())
            for cfg in cls.candidates(prob):
                out = torch.full(prob.output_shape(), float("nan"), device="cuda", dtype=dtype)
                run = cls.bind(prob, cfg)
                if cls.TAKES_BIAS:
                    run(x, w, b, None, None, res, out)
                else:
                    run(x, w, None, None, b, res, out)
                err = relative_error(out, ref)
                assert err <= TOLERANCE[prob.precision], (cfg, c, k, ks, dtype, err)


def test_int64_indexing_beyond_2_31_elements():
    """An input of more than 2**31 elements: the last rows must be right (int32 offsets
    would wrap and read or write the wrong place)."""
    x = torch.randn(2, 16, 8200, 8200, device="cuda", dtype=torch.bfloat16)
    assert x.numel() > 2**31
    w = torch.randn(8, 16, 1, 1, device="cuda", dtype=torch.bfloat16) / 4
    out = fastconv.conv2d(x, w, backend="triton")
    tail = out[1, :, -16:, :]
    ref = F.conv2d(x[1:, :, -16:, :].double(), w.double())[0]
    assert relative_error(tail, ref) < TOLERANCE[Precision.BF16]
    head = out[0, :, :16, :]
    ref0 = F.conv2d(x[:1, :, :16, :].double(), w.double())[0]
    assert relative_error(head, ref0) < TOLERANCE[Precision.BF16]


def test_auto_dispatch_runs_and_is_correct():
    x = torch.randn(16, 128, 28, 28, device="cuda", dtype=torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(128, 128, 3, 3, device="cuda", dtype=torch.bfloat16) / 34
    b = torch.randn(128, device="cuda", dtype=torch.bfloat16)
    y = fastconv.conv2d(x, w, b, padding=1, activation="relu")
    ref = F.relu(F.conv2d(x.double(), w.double(), b.double(), padding=1))
    assert relative_error(y, ref) < TOLERANCE[Precision.BF16]
