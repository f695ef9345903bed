"""ConvProblem: one convolution described completely, validated once.

The same object serves argument checking, dispatch (``key()``), launch (sizes, strides) and
benchmarks (``flops()``, ``min_bytes()``). Rank-1 problems are stored with rank 1; backends
that only implement rank 2 treat them as ``H = 1``.

Output size per spatial dimension, with ``pre``/``post`` padding:

* convolution: ``(in + pre + post − dil·(k − 1) − 1) // stride + 1``
* transposed:  ``(in − 1)·stride − pre − post + dil·(k − 1) + output_padding + 1``
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import torch

from .epilogue import Epilogue
from .errors import ConvError, ConvTypeError
from .precision import ALLOWED, Precision, resolve

_DTYPE_NAMES = {torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16",
                torch.bfloat16: "bf16"}


@dataclasses.dataclass(frozen=True)
class ConvProblem:
    """A convolution: sizes, geometry, dtypes, layout, precision and epilogue."""

    rank: int
    n: int
    c: int  # input channels
    k: int  # output channels
    in_size: tuple[int, ...]
    out_size: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    pad_pre: tuple[int, ...]
    pad_post: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int = 1
    transposed: bool = False
    output_padding: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float32
    layout: str = "nchw"  # "nchw" or "nhwc" (channels last), of the input
    precision: Precision = Precision.TF32
    epilogue: Epilogue = Epilogue()
    device: str = "cpu"

    # ----------------------------------------------------------------------- derived sizes
    @property
    def c_per_group(self) -> int:
        return self.c // self.groups

    @property
    def k_per_group(self) -> int:
        return self.k // self.groups

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.groups == self.c

    def input_shape(self) -> tuple[int, ...]:
        return (self.n, self.c, *self.in_size)

    def weight_shape(self) -> tuple[int, ...]:
        if self.transposed:
            return (self.c, self.k // self.groups, *self.kernel)
        return (self.k, self.c // self.groups, *self.kernel)

    def output_shape(self) -> tuple[int, ...]:
        return (self.n, self.k, *self.out_size)

    def new_output(self, device: torch.device | str | None = None) -> torch.Tensor:
        """An uninitialised output tensor in the input's memory layout, on ``device`` (the
        input's device; the problem records only its type): one ``empty_strided`` call,
        its shape and strides computed once per problem (a plan's every call makes one)."""
        shape, strides = self._output_layout
        return torch.empty_strided(shape, strides, dtype=self.dtype,
                                   device=device if device is not None else self.device)

    @functools.cached_property
    def _output_layout(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        shape = self.output_shape()
        return shape, layout_strides(shape, self.layout)

    def conv_equivalent(self) -> ConvProblem:
        """For a transposed convolution: the convolution whose data gradient it is (same
        weight, same geometry, input and output swapped). Its forward is this problem's
        input gradient and its weight gradient this problem's weight gradient."""
        if not self.transposed:
            return self
        return dataclasses.replace(
            self, c=self.k, k=self.c, in_size=self.out_size, out_size=self.in_size,
            pad_post=self.pad_pre, transposed=False, output_padding=(0,) * self.rank,
            epilogue=Epilogue())

    def flops(self) -> int:
        """Multiply-adds × 2 of the convolution itself (epilogue excluded)."""
        taps = math.prod(self.kernel)
        spatial = math.prod(self.in_size if self.transposed else self.out_size)
        return 2 * self.n * spatial * (self.k if not self.transposed else self.c) * \
            (self.c_per_group if not self.transposed else self.k_per_group) * taps

    def min_bytes(self) -> int:
        """Each input, weight and output element moved once (plus epilogue operands)."""
        item = self.dtype.itemsize
        numel = sum(math.prod(s) for s in (self.input_shape(), self.weight_shape(),
                                            self.output_shape()))
        if self.epilogue.has_residual:
            numel += math.prod(self.output_shape())
        scale_shift = 4 * self.k * (int(self.epilogue.has_scale) + int(self.epilogue.has_shift))
        return numel * item + scale_shift

    def key(self) -> str:
        """A string that identifies everything that can change the choice of kernel."""
        parts = [
            f"r{self.rank}", "T" if self.transposed else "F",
            f"n{self.n}c{self.c}k{self.k}",
            "in" + "x".join(map(str, self.in_size)),
            "f" + "x".join(map(str, self.kernel)),
            "s" + "x".join(map(str, self.stride)),
            "p" + "x".join(f"{a}-{b}" for a, b in zip(self.pad_pre, self.pad_post)),
            "d" + "x".join(map(str, self.dilation)),
            f"g{self.groups}",
        ]
        if self.transposed:
            parts.append("op" + "x".join(map(str, self.output_padding)))
        parts += [_DTYPE_NAMES[self.dtype], self.layout, self.precision.value,
                  self.epilogue.signature(), self.device]
        return "_".join(parts)

    def describe(self) -> str:
        """A short human-readable name, used in tables."""
        sp = "x".join(map(str, self.in_size))
        ks = "x".join(map(str, self.kernel))
        s = "x".join(map(str, self.stride))
        return (f"N{self.n} {self.c}->{self.k} {sp} k{ks} s{s} "
                f"p{','.join(f'{a}/{b}' for a, b in zip(self.pad_pre, self.pad_post))}"
                + (f" d{self.dilation}" if any(d != 1 for d in self.dilation) else "")
                + (f" g{self.groups}" if self.groups != 1 else ""))

    # ---------------------------------------------------------------------- construction
    @classmethod
    def from_tensors(
        cls,
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        stride: int | Sequence[int] = 1,
        padding: int | str | Sequence = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        *,
        rank: int,
        transposed: bool = False,
        output_padding: int | Sequence[int] = 0,
        precision: str | Precision | None = None,
        epilogue: Epilogue = Epilogue(),
        residual: torch.Tensor | None = None,
        scale: torch.Tensor | None = None,
        shift: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> ConvProblem:
        """Validate the arguments of a convolution call and describe it.

        ``input`` must be batched (``rank + 2`` dimensions); the functional API unsqueezes
        unbatched inputs before calling this. Raises :class:`ConvError` on any invalid input.
        """
        for name, t in (("input", input), ("weight", weight)):
            if not isinstance(t, torch.Tensor):
                raise ConvTypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        _check_devices(input, weight=weight, bias=bias, residual=residual, scale=scale,
                       shift=shift, out=out)
        if input.dtype not in ALLOWED:
            raise ConvError(f"input: dtype {input.dtype} is not supported; allowed: "
                            f"{', '.join(map(str, ALLOWED))}")
        if weight.dtype != input.dtype:
            raise ConvError(f"weight: dtype {weight.dtype} differs from input dtype "
                            f"{input.dtype}; both must have the same dtype")
        if input.dim() != rank + 2:
            raise ConvError(f"input: expected a {rank + 2}-D (batched) or {rank + 1}-D "
                            f"(unbatched) tensor for conv{rank}d, got shape {tuple(input.shape)}")
        if weight.dim() != rank + 2:
            raise ConvError(f"weight: expected a {rank + 2}-D tensor for conv{rank}d (the same "
                            f"rank as input), got shape {tuple(weight.shape)}")
        stride_t = _int_tuple("stride", stride, rank, minimum=1)
        dilation_t = _int_tuple("dilation", dilation, rank, minimum=1)
        if isinstance(groups, bool) or not isinstance(groups, int):
            raise ConvTypeError(f"groups: expected an int, got {type(groups).__name__}")
        if groups < 1:
            raise ConvError(f"groups: got {groups}; must be a positive integer")
        n, c = input.shape[0], input.shape[1]
        in_size = tuple(input.shape[2:])
        kernel = tuple(weight.shape[2:])
        if transposed:
            if weight.shape[0] != c:
                raise ConvError(f"weight: transposed convolution needs input channels "
                                f"({c}) == weight.shape[0] ({weight.shape[0]})")
            k = weight.shape[1] * groups
            if c % groups:
                raise ConvError(f"groups: {groups} does not divide the input channels {c}")
        else:
            k = weight.shape[0]
            if c != weight.shape[1] * groups:
                raise ConvError(
                    f"weight: input has {c} channels but weight.shape[1] * groups = "
                    f"{weight.shape[1]} * {groups} = {weight.shape[1] * groups}; "
                    "they must be equal")
            if k % groups:
                raise ConvError(f"groups: {groups} does not divide the output channels "
                                f"{k} (weight.shape[0])")
        if any(s == 0 for s in kernel) or k == 0 or c == 0:
            raise ConvError(f"weight: every dimension must be positive, got shape "
                            f"{tuple(weight.shape)} (input channels {c})")
        if any(i == 0 for i in in_size):
            raise ConvError(f"input: spatial size {in_size}; every spatial size must be "
                            "positive (torch refuses empty images too; an empty batch is "
                            "allowed)")
        pad_pre, pad_post = _padding(padding, rank, kernel, stride_t, dilation_t, transposed)
        opad = _int_tuple("output_padding", output_padding, rank, minimum=0)
        if transposed:
            for o, s, d in zip(opad, stride_t, dilation_t):
                if o >= max(s, d):
                    raise ConvError(f"output_padding: got {opad}; each must be smaller than "
                                    f"stride or dilation ({stride_t}, {dilation_t})")
            out_size = tuple((i - 1) * s - a - b + d * (kk - 1) + o + 1 for i, s, a, b, d, kk, o
                             in zip(in_size, stride_t, pad_pre, pad_post, dilation_t, kernel, opad))
        else:
            if any(o != 0 for o in opad):
                raise ConvError(f"output_padding: got {opad}; only transposed convolution has it")
            out_size = tuple((i + a + b - d * (kk - 1) - 1) // s + 1 for i, s, a, b, d, kk
                             in zip(in_size, stride_t, pad_pre, pad_post, dilation_t, kernel))
        if any(o <= 0 for o in out_size):
            raise ConvError(
                f"input: spatial size {in_size} with padding {tuple(zip(pad_pre, pad_post))}, "
                f"kernel {kernel}, dilation {dilation_t} and stride {stride_t} gives output "
                f"size {out_size}; every output size must be positive (input too small)")
        padded = tuple(i + a + b for i, a, b in zip(in_size, pad_pre, pad_post))
        for what, size in (("output", out_size), ("padded input", padded)):
            if n * max(c, k) * math.prod(size) > _MAX_ELEMENTS:
                raise ConvError(f"padding: the {what} would be {size} per image and channel, "
                                f"more than {_MAX_ELEMENTS:.1e} elements in all")
        prec = resolve(precision, input.dtype)
        problem = cls(rank=rank, n=n, c=c, k=k, in_size=in_size, out_size=out_size,
                      kernel=kernel, stride=stride_t, pad_pre=pad_pre, pad_post=pad_post,
                      dilation=dilation_t, groups=groups, transposed=transposed,
                      output_padding=opad if transposed else (0,) * rank, dtype=input.dtype,
                      layout=layout_of(input), precision=prec, epilogue=epilogue,
                      device=str(input.device.type))
        problem._check_operands(input, weight, bias, residual, scale, shift, out)
        return problem

    def _check_operands(self, input, weight, bias, residual, scale, shift, out) -> None:
        oshape = self.output_shape()
        for name, t in (("bias", bias), ("scale", scale), ("shift", shift)):
            if t is None:
                continue
            if not isinstance(t, torch.Tensor):
                raise ConvTypeError(f"{name}: expected a torch.Tensor or None, "
                                    f"got {type(t).__name__}")
            if tuple(t.shape) != (self.k,):
                raise ConvError(f"{name}: expected shape ({self.k},) (one value per output "
                                f"channel), got {tuple(t.shape)}")
            if name == "bias" and t.dtype != self.dtype:
                raise ConvError(f"bias: dtype {t.dtype} differs from input dtype {self.dtype}")
            if not t.dtype.is_floating_point:
                raise ConvError(f"{name}: dtype {t.dtype} is not a floating-point dtype")
        for name, t in (("residual", residual), ("out", out)):
            if t is None:
                continue
            if not isinstance(t, torch.Tensor):
                raise ConvTypeError(f"{name}: expected a torch.Tensor or None, "
                                    f"got {type(t).__name__}")
            if tuple(t.shape) != oshape:
                raise ConvError(f"{name}: expected shape {oshape} (the output's), "
                                f"got {tuple(t.shape)}")
            if t.dtype != self.dtype:
                raise ConvError(f"{name}: dtype {t.dtype} differs from input dtype {self.dtype}")
        if out is not None:
            if self_overlaps(out):
                raise ConvError(f"out: elements share memory (strides {tuple(out.stride())} "
                                f"for shape {tuple(out.shape)}, e.g. an expanded tensor); "
                                "out needs one memory location per element")
            self._check_overlap(out, input, weight, bias, residual, scale, shift)

    @staticmethod
    def _check_overlap(out, input, weight, bias, residual, scale, shift) -> None:
        for name, t in (("input", input), ("weight", weight), ("residual", residual),
                        ("bias", bias), ("scale", scale), ("shift", shift)):
            if t is not None and overlaps(out, t):
                raise ConvError(f"out: overlaps {name} in memory; out must not share memory "
                                "with any operand")


def empty_in_layout(shape, layout: str, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialised tensor of ``shape``; channels fastest (like torch's channels_last)
    when ``layout`` is 'nhwc'."""
    return torch.empty_strided(tuple(shape), layout_strides(shape, layout), dtype=dtype,
                               device=device)


def layout_strides(shape, layout: str) -> tuple[int, ...]:
    """The dense strides of ``shape`` in ``layout``: row-major ('nchw'), or channels
    fastest, then the spatial dimensions, then the batch ('nhwc')."""
    order = (1, *range(len(shape) - 1, 1, -1), 0) if layout == "nhwc" \
        else tuple(range(len(shape) - 1, -1, -1))  # fastest first
    strides = [0] * len(shape)
    step = 1
    for d in order:
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def layout_of(t: torch.Tensor) -> str:
    """'nhwc' when ``t`` is stored channels-last (channels fastest), else 'nchw'."""
    if t.dim() >= 3 and t.shape[1] > 1 and t.stride(1) == 1 and \
            any(t.stride(i) != 1 for i in range(2, t.dim()) if t.shape[i] > 1):
        return "nhwc"
    return "nchw"


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory spans of two tensors intersect (conservative: extents, not elements)."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False

    def span(t):
        start = t.data_ptr()
        last = sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
        return start, start + (last + 1) * t.element_size()

    a0, a1 = span(a)
    b0, b1 = span(b)
    return a0 < b1 and b0 < a1


#: No tensor of more elements can be allocated (2**48 fp16 elements are 512 TiB).
_MAX_ELEMENTS = 2**48


def self_overlaps(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory (conservative: each dimension's stride,
    smallest first, must step past everything the smaller ones reach)."""
    reach = 0  # the largest offset the dimensions seen so far reach
    for size, stride in sorted((d for d in zip(t.shape, t.stride()) if d[0] > 1),
                               key=lambda d: d[1]):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def normalize_geometry(rank: int, kernel: Sequence[int], stride, padding, dilation,
                       output_padding, transposed: bool):
    """``(stride, pad_pre, pad_post, dilation, output_padding)`` as tuples of ints, from the
    forms the functional API accepts (raises ConvError / ConvTypeError like from_tensors)."""
    stride_t = _int_tuple("stride", stride, rank, minimum=1)
    dilation_t = _int_tuple("dilation", dilation, rank, minimum=1)
    pre, post = _padding(padding, rank, tuple(kernel), stride_t, dilation_t, transposed)
    opad = _int_tuple("output_padding", output_padding, rank, minimum=0)
    return stride_t, pre, post, dilation_t, opad


def _check_devices(input: torch.Tensor, **others: torch.Tensor | None) -> None:
    for name, t in others.items():
        if isinstance(t, torch.Tensor) and t.device != input.device:
            raise ConvError(f"{name}: is on {t.device} but input is on {input.device}; "
                            "all tensors must be on the same device")


def _int_tuple(name: str, value, rank: int, minimum: int) -> tuple[int, ...]:
    vals = (value,) * rank if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(vals, (tuple, list)) or \
            any(isinstance(v, bool) or not isinstance(v, int) for v in vals):
        raise ConvTypeError(f"{name}: expected an int or a tuple of {rank} ints, got {value!r}")
    if len(vals) != rank:
        raise ConvError(f"{name}: expected {rank} value(s), got {len(vals)} ({value!r})")
    if any(v < minimum for v in vals):
        what = "positive" if minimum == 1 else "non-negative"
        raise ConvError(f"{name}: got {tuple(vals)}; each value must be {what}")
    return tuple(int(v) for v in vals)


def _padding(padding, rank, kernel, stride, dilation, transposed):
    """(pre, post) per spatial dimension from int, tuple, pairs, 'same' or 'valid'."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0,) * rank, (0,) * rank
        if padding == "same":
            if transposed:
                raise ConvError("padding: 'same' is not supported for transposed convolution")
            if any(s != 1 for s in stride):
                raise ConvError(f"padding: 'same' needs stride 1, got stride {stride}")
            total = [d * (k - 1) for d, k in zip(dilation, kernel)]
            pre = tuple(t // 2 for t in total)
            return pre, tuple(t - p for t, p in zip(total, pre))
        raise ConvError(f"padding: got {padding!r}; allowed strings: 'same', 'valid'")
    if isinstance(padding, (tuple, list)) and padding and \
            all(isinstance(p, (tuple, list)) for p in padding):
        if len(padding) != rank or any(len(p) != 2 for p in padding):
            raise ConvError(f"padding: expected {rank} (pre, post) pairs, got {padding!r}")
        pre = _int_tuple("padding", [p[0] for p in padding], rank, minimum=0)
        post = _int_tuple("padding", [p[1] for p in padding], rank, minimum=0)
        return pre, post
    sym = _int_tuple("padding", padding, rank, minimum=0)
    return sym, sym

