"""The aten backend: torch.nn.functional (cuDNN on the GPU) plus the epilogue in torch.

Always available, on every device and dtype: the CPU path, the fallback, and the reference
every other backend is compared with.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..context import current
from ..precision import Precision
from ..problem import ConvProblem, empty_in_layout, layout_strides
from .base import Backend


class AtenBackend(Backend):
    NAME = "aten"
    SUPPORTED_DTYPES = frozenset({torch.float64, torch.float32, torch.float16, torch.bfloat16})
    SUPPORTS_TRANSPOSED = True
    IS_DETERMINISTIC = False  # cuDNN may pick non-deterministic algorithms
    TAKES_BIAS = True  # and scale/shift as given, so autograd flows through every operand

    @classmethod
    def not_supported_reasons(cls, problem):
        reasons = super().not_supported_reasons(problem)
        if problem.transposed and problem.pad_pre != problem.pad_post:
            reasons.append("asymmetric padding of a transposed convolution")
        return reasons

    @classmethod
    def nondeterminism_reasons(cls, problem):
        if problem.device != "cuda" or torch.backends.cudnn.deterministic \
                or torch.are_deterministic_algorithms_enabled():
            return []
        return ["cuDNN may pick non-deterministic algorithms (set "
                "torch.backends.cudnn.deterministic = True to let aten run)"]

    @classmethod
    def decode_config(cls, data):
        if data is None or data == CUDNN_RELU:
            return None if data is None else CUDNN_RELU
        raise ValueError(f"not an aten configuration: {data!r}")

    @classmethod
    def candidates(cls, problem, op="fprop"):
        cands = [None]
        if op == "fprop" and _cudnn_fusable(problem):
            cands.append(CUDNN_RELU)
        return cands

    @classmethod
    def bind(cls, problem, config, op="fprop"):
        """On the GPU in benchmark dispatch mode the call runs with cudnn.benchmark on
        (``_searched``), so that aten is one implementation whatever the user's flag: the one
        dispatch times, the tuning database stores and the bench measures. A provisional
        plan runs cuDNN's heuristic plan instead (``_heuristic``). The mode is the
        context's or the environment's: a call's own ``dispatch=`` is not seen here."""
        run = _bind(problem, config, op)
        if problem.device != "cuda":
            return run
        if config == PROVISIONAL:
            return _heuristic(run)
        # (the dispatch mode as dispatch.default_mode reads it: benchmark on the GPU unless
        # a settings() context or FASTCONV_DISPATCH says otherwise)
        return _searched(run) if (current()[0] or "benchmark") == "benchmark" else run

    @classmethod
    def forward(cls, problem, config, input, weight, bias, *, scale, shift, residual, out):
        return cls.bind(problem, config)(input, weight, bias, scale, shift, residual, out)


def _bind(problem: ConvProblem, config, op: str):
    """``run(input, weight, bias, scale, shift, residual, out)`` of ``config`` (dgrad's and
    wgrad's runs take their own operands: ``_bind_backward``), under the caller's cuDNN
    flags."""
    if op == "dgrad":
        return _bind_backward(problem, input_grad=True)
    if op == "wgrad":
        return _bind_backward(problem, input_grad=False)
    if config == CUDNN_RELU:
        return _bind_cudnn_relu(problem)
    conv = bare_conv(problem)
    ep = problem.epilogue
    if ep.activation == "none" and not ep.has_scale and not ep.has_residual:
        # at most a bias, which torch's convolution adds (and a shift given apart from it:
        # the epilogue's), with no epilogue call per call
        apply_shift = ep.apply

        def run_bare(input, weight, bias, scale, shift, residual, out):
            y = conv(input, weight, bias)
            if shift is not None:
                y = apply_shift(y, None, shift)
            return y if out is None else out.copy_(y)
        return run_bare
    apply = problem.epilogue.apply

    def run(input, weight, bias, scale, shift, residual, out):
        y = apply(conv(input, weight, bias), scale, shift, residual)
        return y if out is None else out.copy_(y)
    return run


class _Named(str):
    def name(self) -> str:
        return str(self)


#: Configuration of the aten backend that runs cuDNN's fused convolution + bias (+ residual)
#: + ReLU through torch.cudnn_convolution_relu / torch.cudnn_convolution_add_relu: one
#: cuDNN kernel instead of three.
CUDNN_RELU = _Named("cudnn_relu")


#: Configuration of the aten backend that a tuning-database choice runs while its Triton
#: kernels compile (dispatch's provisional choice, never stored): the convolution with
#: cuDNN's heuristic plan, without cudnn.benchmark's search (16-65 ms per new shape, each
#: spent on a plan used for a few seconds).
PROVISIONAL = _Named("provisional")


def _searched(run):
    """``run`` with cudnn.benchmark on: cuDNN's searched plan (the search runs once per
    shape and thread, as for torch with the flag on). One getter call where the flag is on
    already; else it is set for the call and restored after (process-wide, as
    ``_heuristic``'s flags)."""
    get_b, set_b = torch._C._get_cudnn_benchmark, torch._C._set_cudnn_benchmark

    def run_searched(*args):
        if get_b():
            return run(*args)
        set_b(True)
        try:
            return run(*args)
        finally:
            set_b(False)
    return run_searched


def _heuristic(run):
    """``run`` with cudnn.benchmark off. While cudnn.benchmark is on, cudnn.deterministic is
    set too: it is part of PyTorch's cuDNN plan-cache key, so the heuristic plan is cached
    apart from the plan a later benchmark-mode call of the same shape (the user's own
    torch layers included) searches for, rather than found and kept by it. The flags are
    process-wide: a torch convolution another thread runs during the call runs under them
    too (correctly, with a heuristic, deterministic plan for that call)."""
    get_b, set_b = torch._C._get_cudnn_benchmark, torch._C._set_cudnn_benchmark
    get_d, set_d = torch._C._get_cudnn_deterministic, torch._C._set_cudnn_deterministic

    def run_heuristic(*args):
        if not get_b():
            return run(*args)
        det = get_d()
        set_b(False)
        set_d(True)
        try:
            return run(*args)
        finally:
            set_b(True)
            set_d(det)
    return run_heuristic


def _cudnn_fusable(problem: ConvProblem) -> bool:
    ep = problem.epilogue
    return (problem.device == "cuda" and problem.rank == 2 and not problem.transposed
            and ep.activation == "relu" and not ep.has_scale
            and problem.pad_pre == problem.pad_post
            and problem.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and hasattr(torch, "cudnn_convolution_add_relu"))


def _bind_cudnn_relu(problem: ConvProblem):
    geo = (problem.stride, problem.pad_pre, problem.dilation, problem.groups)

    def run(input, weight, bias, scale, shift, residual, out):
        if shift is not None:
            bias = shift if bias is None else bias.float() + shift.float()
        if bias is not None:
            bias = bias.to(input.dtype)
        with _precision(problem):
            if residual is None:
                y = torch.cudnn_convolution_relu(input, weight, bias, *geo)
            else:
                y = torch.cudnn_convolution_add_relu(input, weight, residual, 1.0, bias, *geo)
        return y if out is None else out.copy_(y)
    return run


def _bind_backward(problem: ConvProblem, input_grad: bool):
    """dgrad (``run(grad_out, weight, out)``) or wgrad (``run(grad_out, input, out)``) of a
    convolution through aten's convolution_backward (cuDNN on the GPU). Asymmetric padding is
    a symmetric problem on the explicitly padded input."""
    pre, post = problem.pad_pre, problem.pad_post
    symmetric = pre == post
    padded = tuple(i + a + b for i, a, b in zip(problem.in_size, pre, post))
    geo = dict(stride=list(problem.stride), padding=list(pre) if symmetric else [0] * problem.rank,
               dilation=list(problem.dilation), transposed=False,
               output_padding=[0] * problem.rank, groups=problem.groups)

    dense_out = layout_strides(problem.output_shape(), problem.layout)
    dense_in = layout_strides(problem.input_shape(), problem.layout)

    def run_dgrad(grad_out, weight, out):
        grad_out = restrided(grad_out, dense_out)
        # The input's values are never read, but its layout picks cuDNN's: an expanded
        # (stride-0) stand-in reads as NCHW, and a depthwise weight (K, 1, R, S) is both
        # layouts at once, so a channels-last problem ran in NCHW at 3-9x the time
        # (benchmarks/NOTES.md). The stand-in is an empty tensor in the problem's
        # layout (the output buffer itself where it has the input's shape).
        if symmetric and out is not None:
            fake_input = out
        else:
            shape = problem.input_shape() if symmetric else (problem.n, problem.c, *padded)
            fake_input = empty_in_layout(shape, problem.layout, grad_out.dtype,
                                         grad_out.device)
        with _precision(problem):
            gi = torch.ops.aten.convolution_backward(grad_out, fake_input, weight, None,
                                                     output_mask=[True, False, False], **geo)[0]
        if not symmetric:
            gi = gi[(slice(None), slice(None),
                     *(slice(a, a + i) for a, i in zip(pre, problem.in_size)))]
        return gi if out is None else out.copy_(gi)

    def run_wgrad(grad_out, input, out):
        grad_out = restrided(grad_out, dense_out)
        input = restrided(input, dense_in)
        if not symmetric:
            input = F.pad(input, _flat_pad(pre, post))
        with _precision(problem):
            gw = torch.ops.aten.convolution_backward(grad_out, input, _shape_only(problem, input),
                                                     None, output_mask=[False, True, False],
                                                     **geo)[1]
        return gw if out is None else out.copy_(gw)
    return run_dgrad if input_grad else run_wgrad


@functools.lru_cache(maxsize=1024)
def _dense(shape: tuple, layout: str) -> tuple:
    return layout_strides(shape, layout)


def restrided(t: torch.Tensor, strides: tuple) -> torch.Tensor:
    """``t`` as a view with ``strides`` where they differ from its own only in dimensions of
    size 1 (the same elements: such a stride is never stepped), else ``t``. cuDNN reads
    those strides to pick a memory format: in mobilenet_v3's training step a squeeze-excite
    weight gradient received a pooled input strided channels-last, (72, 1, 72, 72), beside a
    row-major output gradient, (24, 1, 1, 1), and took 3.6 µs against 2.3 with both
    row-major (H200, bf16, N32 72->24 at 1x1 pixels; benchmarks/NOTES.md)."""
    if t.stride() == strides:  # (the usual case: nothing to compare per dimension)
        return t
    if all(n == 1 or a == b for n, a, b in zip(t.shape, t.stride(), strides)):
        return t.as_strided(t.shape, strides, t.storage_offset())
    return t


def conv_backward_both(problem: ConvProblem, grad_out: torch.Tensor, input: torch.Tensor,
                       weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dx, dw)`` of a symmetric-padding convolution in one convolution_backward call
    (operands strided as ``run_wgrad``'s)."""
    grad_out = restrided(grad_out, _dense(tuple(grad_out.shape), problem.layout))
    input = restrided(input, _dense(tuple(input.shape), problem.layout))
    with _precision(problem):
        dx, dw, _ = torch.ops.aten.convolution_backward(
            grad_out, input, weight, None, list(problem.stride), list(problem.pad_pre),
            list(problem.dilation), False, [0] * problem.rank, problem.groups,
            [True, True, False])
    return dx, dw


def _shape_only(problem: ConvProblem, like: torch.Tensor) -> torch.Tensor:
    """A weight-shaped tensor whose values are never read (wgrad needs only the shape)."""
    return like.new_empty(1).expand(problem.weight_shape())


def _flat_pad(pre, post) -> list[int]:
    """F.pad's argument: (pre, post) pairs, last dimension first."""
    flat = []
    for a, b in reversed(list(zip(pre, post))):
        flat += [a, b]
    return flat


class _precision:
    """cuDNN's TF32 switch set to ``problem``'s precision for the duration of a call."""

    def __init__(self, problem: ConvProblem):
        self.allow = problem.precision == Precision.TF32
        # The switch matters for float32 data only: 16-bit convolutions leave it alone.
        self.fp32 = problem.dtype == torch.float32

    def __enter__(self):
        # Set only when it differs: the property setter costs ~1 us of host time per call,
        # the raw getter 0.2 us.
        self.saved = torch._C._get_cudnn_allow_tf32()
        if self.fp32 and self.saved != self.allow:
            torch.backends.cudnn.allow_tf32 = self.allow

    def __exit__(self, *exc):
        if self.fp32 and self.saved != self.allow:
            torch.backends.cudnn.allow_tf32 = self.saved


def bare_conv(problem: ConvProblem):
    """``conv(input, weight, bias)``: the bare convolution of ``problem`` through torch,
    honouring its precision, with everything but the tensors decided here, once per plan
    (the function, its geometry arguments, explicit padding for asymmetric padding, whether
    cuDNN's TF32 switch must be set around the call)."""
    if problem.transposed:
        fn = F.conv_transpose1d if problem.rank == 1 else F.conv_transpose2d
        tail = (problem.stride, problem.pad_pre, problem.output_padding, problem.groups,
                problem.dilation)
        flat = None
    else:
        fn = F.conv1d if problem.rank == 1 else F.conv2d
        symmetric = problem.pad_pre == problem.pad_post
        # torch takes only symmetric padding: pad explicitly
        flat = None if symmetric else _flat_pad(problem.pad_pre, problem.pad_post)
        tail = (problem.stride, problem.pad_pre if symmetric else 0, problem.dilation,
                problem.groups)
    allow = problem.precision == Precision.TF32
    switch = problem.dtype == torch.float32  # the switch matters for float32 data only
    if flat is None and not switch:
        return lambda input, weight, bias: fn(input, weight, bias, *tail)

    def conv(input, weight, bias):
        if flat is not None:
            input = F.pad(input, flat)
        # set only when it differs: the property setter costs ~1 us of host time, the raw
        # getter 0.2 us
        if switch and torch._C._get_cudnn_allow_tf32() != allow:
            torch.backends.cudnn.allow_tf32 = allow
            try:
                return fn(input, weight, bias, *tail)
            finally:
                torch.backends.cudnn.allow_tf32 = not allow
        return fn(input, weight, bias, *tail)
    return conv
