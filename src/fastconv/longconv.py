"""Long causal depthwise convolutions (Hyena's implicit filters): ``long_conv1d``, a
direct convolution, real FFTs of 7-smooth lengths, or on a GPU one fused Triton kernel
(``backends.triton.fftconv``, or ``fftsplit`` past its size), whichever the GPU measured
fastest for the shape."""

from __future__ import annotations

import warnings

import torch

from .devices import elsewhere
from .errors import ConvError
from .functional import conv1d
from .seqargs import accumulate_dtype, check_bias, check_x, described, readable


def long_conv1d(x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """Long causal depthwise convolution (Hyena's implicit filters):
    ``out[:, d, t] = bias[d] + Σ_{j=0..t} weight[d, j] · x[:, d, t − j]`` (``weight[:, 0]``
    multiplies the current position, the FFT convention), for a filter as long as the
    sequence.

    ``x`` is ``(batch, dim, seqlen)``, ``weight`` ``(dim, K)`` with ``1 ≤ K ≤ seqlen``. Short
    filters run as a direct convolution (:func:`fastconv.conv1d`), long ones through real
    FFTs of a length with factors 2, 3, 5 and 7 only, at least ``seqlen + K − 1`` (no power
    of two padding), in float32 (float64 for float64 inputs). On a GPU, 16-bit inputs whose
    ``seqlen + K − 1`` is at most 4,096 also have a fused FFT kernel (the transforms as
    matrix products on the tensor cores, x read once and the output written once; its
    backward one kernel of the same transforms), and bfloat16 inputs past that, up to
    ``seqlen`` 8,192, one that splits the transform into two halves of the same tiles
    (``backends.triton.fftsplit``). The first call of each shape on a GPU
    times the routes and keeps the fastest (``LONG_CONV_CHOICES``); elsewhere, and while
    compiling, filters longer than ``DIRECT_MAX_K`` take the real FFTs. Differentiable in
    x, weight and bias.
    """
    device = elsewhere(x)
    if device is not None:  # (its kernels and timings run on the current device)
        with torch.cuda.device(device):
            return long_conv1d(x, weight, bias)
    check_x(x)
    x = readable(x)
    batch, dim, seqlen = x.shape
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] != dim \
            or not 1 <= weight.shape[1] <= seqlen:
        raise ConvError(f"weight: got {described(weight)}; expected (dim, K) with dim = {dim} "
                        f"and 1 <= K <= seqlen = {seqlen}")
    if weight.device != x.device:
        raise ConvError(f"weight: on {weight.device}, x on {x.device}; expected one device")
    check_bias(bias, dim, x)
    key = (tuple(x.shape), weight.shape[1], x.dtype, x.device.type)
    route = LONG_CONV_CHOICES.get(key)
    if route is None:
        route = _choose_route(x, weight, bias, key)
    elif route == "fused_fft" and torch.compiler.is_compiling():
        route = "fft"  # (the kernel is launched outside torch.compile's graph)
    return _ROUTES[route](x, weight, bias)


#: filters up to this length take the direct convolution where nothing was timed
DIRECT_MAX_K = 64
#: filters longer than this take the FFT untimed (a direct pass costs K multiply-adds per
#: output: at K = seqlen = 64K, seconds per call, and the timing makes ~60 calls)
TIMED_MAX_K = 1024
#: (x shape, K, dtype, device type) -> a route of ``_ROUTES``, measured on the GPU
LONG_CONV_CHOICES: dict[tuple, str] = {}


def _direct(x, weight, bias):
    k = weight.shape[1]
    return conv1d(x, weight.flip(-1).unsqueeze(1), bias, padding=((k - 1, 0),),
                  groups=x.shape[1])


def fft_length(n: int) -> int:
    """The least integer ≥ n whose prime factors are 2, 3, 5 and 7 (fast FFT sizes)."""
    best = 1 << (max(n, 1) - 1).bit_length()
    f7 = 1
    while f7 < best:
        f5 = f7
        while f5 < best:
            f3 = f5
            while f3 < best:
                f2 = f3
                while f2 < n:
                    f2 *= 2
                best = min(best, f2)
                f3 *= 3
            f5 *= 5
        f7 *= 7
    return best


def _fft(x, weight, bias):
    seqlen = x.shape[-1]
    n = fft_length(seqlen + weight.shape[1] - 1)
    acc_type = accumulate_dtype(x.dtype)
    spectrum = torch.fft.rfft(x.to(acc_type), n=n) * torch.fft.rfft(weight.to(acc_type), n=n)
    out = torch.fft.irfft(spectrum, n=n)[..., :seqlen]
    if bias is not None:
        out = out + bias.to(acc_type).unsqueeze(-1)
    return out.to(x.dtype)


def _fused_kernels(seqlen: int, k: int):
    """The module of the fused kernels for the shape: ``fftconv`` (one transform of at
    most ``fftconv.MAX_N`` points), else ``fftsplit`` (two halves)."""
    from .backends.triton import fftconv, fftsplit

    return fftconv if fftconv.transform_size(seqlen, k) <= fftconv.MAX_N else fftsplit


class _FusedFFT(torch.autograd.Function):
    """The fused kernels (``_fused_kernels``): the forward, and a backward of the same
    transforms (the input's gradient is the output gradient's correlation with the filter,
    the filter's its correlation with x summed over the batch); the bias's gradient is a
    sum."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return _fused_kernels(x.shape[-1], weight.shape[1]).long_conv(x, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        need_dx, need_dw, need_db = ctx.needs_input_grad
        dx = dw = db = None
        if need_dx or need_dw:
            kernels = _fused_kernels(x.shape[-1], weight.shape[1])
            dx, dw = kernels.long_conv_backward(x, weight, grad, need_dx, need_dw)
        if need_db:
            db = grad.sum((0, 2), dtype=accumulate_dtype(grad.dtype)).to(ctx.bias_dtype)
        return dx, dw, db


def _fused_fft(x, weight, bias):
    return _FusedFFT.apply(x, weight, bias)


_ROUTES = {"direct": _direct, "fft": _fft, "fused_fft": _fused_fft}


def _choose_route(x, weight, bias, key) -> str:
    k = weight.shape[1]
    guess = "direct" if k <= DIRECT_MAX_K else "fft"
    if x.device.type != "cuda" or torch.compiler.is_compiling() \
            or torch.cuda.is_current_stream_capturing():
        return guess
    from .backends.triton import fftconv, fftsplit
    from .costs import time_costs

    names = (["direct"] if k <= TIMED_MAX_K else []) + ["fft"]
    if fftconv.eligible(x, k) or fftsplit.eligible(x, k):
        names.append("fused_fft")
    if len(names) == 1:
        return guess
    times = {}
    with torch.no_grad():
        for name in names:
            route = _ROUTES[name]
            try:
                times[name] = sum(time_costs(lambda route=route: route(x, weight, bias)))
            except Exception as exc:  # a kernel that cannot compile or run here: the others
                if name != "fused_fft":
                    raise
                warnings.warn(f"fastconv: long_conv1d's fused FFT kernel failed "
                              f"({type(exc).__name__}: {exc}); the other routes run",
                              RuntimeWarning, stacklevel=3)
    LONG_CONV_CHOICES[key] = min(times, key=times.get)
    return LONG_CONV_CHOICES[key]
