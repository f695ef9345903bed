"""NaN and Inf propagate as in torch (DESIGN.md §4): same positions, same signs of infinity,
for every backend and epilogue.

At a *padded* tap the two kinds of torch kernel differ, and fastconv follows each: dense
convolutions multiply the zero padding by the weight, so a non-finite weight gives NaN there
(im2col on the CPU, implicit GEMM); depthwise kernels skip padded taps, and so do fastconv's
(test_depthwise_padded_taps_add_nothing). One documented difference:
* ``gelu(+inf)``: torch's float32 CPU kernel returns NaN on some builds and CPUs and +inf
  on others (seen on two machines with the same torch 2.14.1); its float64 and CUDA kernels
  give +inf, as the Triton epilogue does. The aten backend is torch: there either is
  accepted, and only there.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fastconv
from fastconv.epilogue import ACTIVATIONS, activate

_BACKENDS = ("aten", "triton")


def _cudnn_available() -> bool:
    from fastconv.backends.cudnn import CudnnBackend

    return torch.cuda.is_available() and CudnnBackend.available()[0]


def _poison(t: torch.Tensor, gen: torch.Generator, count: int) -> torch.Tensor:
    t = t.clone()
    flat = t.view(-1)
    idx = torch.randperm(flat.numel(), generator=gen)[:count]
    values = torch.tensor([float("nan"), float("inf"), -float("inf")])
    flat[idx] = values[torch.arange(count) % 3]
    return t


def _same_nonfinite(got: torch.Tensor, want: torch.Tensor) -> tuple[bool, str]:
    nan_ok = torch.equal(got.isnan(), want.isnan())
    pos_ok = torch.equal(got == float("inf"), want == float("inf"))
    neg_ok = torch.equal(got == -float("inf"), want == -float("inf"))
    return nan_ok and pos_ok and neg_ok, (f"nan {int(got.isnan().sum())} vs "
                                          f"{int(want.isnan().sum())}, +inf "
                                          f"{int((got == float('inf')).sum())} vs "
                                          f"{int((want == float('inf')).sum())}")


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.slow_after(4)
def test_nonfinite_inputs_propagate_as_in_torch(activation, groups, device):
    gen = torch.Generator().manual_seed(ACTIVATIONS.index(activation) * 7 + groups)
    x = _poison(torch.randn(2, 4, 7, 6, generator=gen), gen, 9)
    w = torch.randn(8, 4 // groups, 3, 3, generator=gen)
    b = torch.randn(8, generator=gen)
    res = _poison(torch.randn(2, 8, 7, 6, generator=gen), gen, 4)
    # finite weights: at padded taps 0·w is 0 on every path
    ref = activate(F.conv2d(x.double(), w.double(), b.double(), 1, 1, 1, groups)
                   + res.double(), activation, 0.1)
    for backend in _BACKENDS:
        y = fastconv.conv2d(x.to(device), w.to(device), b.to(device), 1, 1, 1, groups,
                            activation=activation, negative_slope=0.1,
                            residual=res.to(device), backend=backend, precision="ieee")
        y = y.cpu()
        want = ref
        if activation == "gelu" and backend == "aten" and device == "cpu":
            # torch's float32 CPU gelu(+inf): NaN or +inf by build and CPU (see above)
            want = torch.where((ref == float("inf")) & y.double().isnan(), float("nan"), ref)
        ok, detail = _same_nonfinite(y.double(), want)
        assert ok, f"{backend} {activation}: {detail}"
        finite = want.isfinite()
        assert torch.allclose(y.double()[finite], want[finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("groups", [1, 3])
def test_nonfinite_weights(groups, device):
    """Dense: as torch (0·inf = NaN at padded taps too). Depthwise: Triton as torch's native
    depthwise kernel, which skips padded taps; aten is torch on the device (compared with
    torch itself on the GPU); cuDNN multiplies the padding by the weight in every convolution
    (measured on the H100: NaN at padded taps, as a dense convolution)."""
    gen = torch.Generator().manual_seed(groups)
    x = torch.randn(1, 3, 5, 5, generator=gen)
    w = torch.randn(3, 3 // groups, 3, 3, generator=gen)
    w[0, 0, 0, 0] = float("inf")
    w[1, 0, 2, 2] = float("nan")
    padded = F.conv2d(F.pad(x.double(), (1, 1, 1, 1)), w.double(), None, 1, 0, 1, groups)
    for backend in _BACKENDS + (("cudnn",) if _cudnn_available() else ()):
        y = fastconv.conv2d(x.to(device), w.to(device), None, 1, 1, 1, groups,
                            backend=backend, precision="ieee").cpu()
        if backend == "cudnn" or groups == 1:
            want = padded
        elif backend == "aten" and device != "cpu":
            want = F.conv2d(x.to(device), w.to(device), None, 1, 1, 1, groups).cpu().double()
        else:
            want = _depthwise_valid_taps(x, w, 1)
        ok, detail = _same_nonfinite(y.double(), want)
        assert ok, f"{backend} groups={groups}: {detail}"


@pytest.mark.skipif(not _cudnn_available(), reason="needs the cuDNN backend (a GPU)")
@pytest.mark.parametrize("groups", [1, 4])
def test_nonfinite_inputs_cudnn(groups):
    """The cuDNN backend (no fused epilogue): NaN and ±inf inputs as in float64 torch."""
    gen = torch.Generator().manual_seed(groups)
    x = _poison(torch.randn(2, 4, 7, 6, generator=gen), gen, 9)
    w = torch.randn(8, 4 // groups, 3, 3, generator=gen)
    ref = F.conv2d(x.double(), w.double(), None, 1, 1, 1, groups)
    y = fastconv.conv2d(x.cuda(), w.cuda(), None, 1, 1, 1, groups, backend="cudnn",
                        precision="ieee").cpu()
    ok, detail = _same_nonfinite(y.double(), ref)
    assert ok, detail
    finite = ref.isfinite()
    assert torch.allclose(y.double()[finite], ref[finite], rtol=1e-4, atol=1e-4)


def _depthwise_valid_taps(x, w, pad):
    """float64 depthwise forward summing only the taps inside the input (no 0·w products);
    output channel k reads input channel k // multiplier."""
    n, c, h, wd = x.shape
    r, s = w.shape[2:]
    x = x.repeat_interleave(w.shape[0] // c, dim=1)
    out = torch.zeros(n, w.shape[0], h + 2 * pad - r + 1, wd + 2 * pad - s + 1,
                      dtype=torch.float64)
    for p in range(out.shape[2]):
        for q in range(out.shape[3]):
            for i in range(r):
                for j in range(s):
                    ih, iw = p - pad + i, q - pad + j
                    if 0 <= ih < h and 0 <= iw < wd:
                        out[:, :, p, q] += x[:, :, ih, iw].double() * w[:, 0, i, j].double()
    return out


@pytest.mark.parametrize("k", [3, 7])  # 7x7: the forward loops over kernel rows
@pytest.mark.slow_after(1)
def test_depthwise_padded_taps_add_nothing(device, k):
    """Depthwise forward and dgrad skip padded taps, as torch's depthwise kernels do: an
    infinite weight meets only real inputs (and real output gradients)."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 5, 6, generator=gen)
    w = torch.randn(3, 1, k, k, generator=gen)
    w[0, 0, 0, 0] = float("inf")
    w[1, 0, 2, 1] = float("nan")
    pad = k // 2
    want = _depthwise_valid_taps(x, w, pad)
    assert want[0, 0].isfinite().sum() > 0 and not want[0, 0, pad:, pad:].isfinite().any()
    xd = x.detach().to(device).requires_grad_()
    y = fastconv.conv2d(xd, w.to(device), None, 1, pad, 1, 3, backend="triton",
                        precision="ieee")
    ok, detail = _same_nonfinite(y.detach().cpu().double(), want)
    assert ok, detail
    # dgrad: dx[h, w] = sum over taps of dy[h + 1 - i, w + 1 - j] · w[i, j] where that dy exists
    dy = torch.randn(y.shape, generator=gen)
    (dx,) = torch.autograd.grad(y, xd, dy.to(device))
    dx = dx.cpu()
    want_dx = _depthwise_valid_taps(dy, w.flip(2, 3), pad)
    ok, detail = _same_nonfinite(dx.double(), want_dx)
    assert ok, f"dgrad: {detail}"
    assert torch.allclose(dx.double()[want_dx.isfinite()], want_dx[want_dx.isfinite()],
                          rtol=1e-5, atol=1e-5)


def test_depthwise_multiplier_padded_taps_add_nothing(device):
    """Channel multiplier 2 (each input channel feeds two output channels)."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(1, 3, 4, 5, generator=gen)
    w = torch.randn(6, 1, 3, 3, generator=gen)
    w[3, 0, 2, 2] = -float("inf")
    want = _depthwise_valid_taps(x, w, 1)
    y = fastconv.conv2d(x.to(device), w.to(device), None, 1, 1, 1, 3, backend="triton",
                        precision="ieee").cpu()
    ok, detail = _same_nonfinite(y.double(), want)
    assert ok, detail
    assert torch.allclose(y.double()[want.isfinite()], want[want.isfinite()], atol=1e-5)


def test_depthwise_pairs_kernel_padded_taps_add_nothing(device):
    """The 16-bit pair-word kernel skips padded words too (bf16, even width, unit stride)."""
    from fastconv.backends.triton import depthwise, dw_pairs
    from fastconv.backends.triton.launchargs import NO_EPILOGUE, Geometry
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(1, 2, 4, 8, generator=gen).bfloat16()
    w = torch.randn(2, 1, 3, 3, generator=gen).bfloat16()
    w[0, 0, 0, 0] = float("inf")
    w[1, 0, 1, 2] = -float("inf")
    want = _depthwise_valid_taps(x, w, 1)
    x, w = x.to(device), w.to(device)
    out = torch.full(want.shape, float("nan"), dtype=torch.bfloat16, device=device)
    assert dw_pairs.eligible(x, out, None, 1)
    dw_pairs.launch_fprop(x, w, out, NO_EPILOGUE, Geometry((1, 1), (1, 1), (1, 1)),
                          channels_last=False, config=depthwise.DwConfig(2, 8, 4, pairs=True),
                          int64=False)
    ok, detail = _same_nonfinite(out.cpu().double(), want)
    assert ok, detail
