"""Precision modes and the numerical contract (DESIGN.md §4).

A precision says how the multiply-adds are done, not only which dtype holds the data:

=========  =====================================================  ==========
precision  meaning                                                bound
=========  =====================================================  ==========
ieee       true fp32 (or fp64) multiply-add, no TF32 anywhere     1e-5
tf32       fp32 in/out, tensor cores with TF32 inputs             2e-3
fp16       fp16 in/out, fp32 accumulate                           5e-3
bf16       bf16 in/out, fp32 accumulate                           2e-2
=========  =====================================================  ==========

The bound is on ``‖out − ref‖ / ‖ref‖`` where ``ref`` is computed in float64.
"""

from __future__ import annotations

import enum

import torch

from .errors import ConvError


class Precision(str, enum.Enum):
    IEEE = "ieee"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"

    def __str__(self) -> str:  # "tf32", not "Precision.TF32"
        return self.value


#: Relative-error bound per precision: ‖out − ref‖ / ‖ref‖ against a float64 reference.
TOLERANCE: dict[Precision, float] = {
    Precision.IEEE: 1e-5,
    Precision.TF32: 2e-3,
    Precision.FP16: 5e-3,
    Precision.BF16: 2e-2,
}

#: The precisions each input dtype may run in.
ALLOWED: dict[torch.dtype, tuple[Precision, ...]] = {
    torch.float64: (Precision.IEEE,),
    torch.float32: (Precision.IEEE, Precision.TF32),
    torch.float16: (Precision.FP16,),
    torch.bfloat16: (Precision.BF16,),
}

#: The dtype whose data a precision implies when the data itself is converted (bench, check).
DTYPE: dict[Precision, torch.dtype] = {
    Precision.IEEE: torch.float32,
    Precision.TF32: torch.float32,
    Precision.FP16: torch.float16,
    Precision.BF16: torch.bfloat16,
}


def parse(precision: str | Precision) -> Precision:
    """``precision`` as a Precision, or a ConvError listing the allowed names."""
    try:
        return Precision(precision)
    except ValueError:
        allowed = ", ".join(repr(p.value) for p in Precision)
        raise ConvError(f"precision: got {precision!r}; allowed: {allowed} or None") from None


def resolve(precision: str | Precision | None, dtype: torch.dtype) -> Precision:
    """The precision a convolution on ``dtype`` data runs in.

    ``None`` follows PyTorch: fp32 data uses tf32 when ``torch.backends.cudnn.allow_tf32``
    is true (PyTorch's default for convolutions) and ieee otherwise; fp16 and bf16 data run
    in their own precision; float64 data in ieee.
    """
    if dtype not in ALLOWED:
        raise ConvError(f"dtype: got {dtype}; allowed: {', '.join(map(str, ALLOWED))}")
    if precision is None:
        if dtype == torch.float32:
            return Precision.TF32 if torch.backends.cudnn.allow_tf32 else Precision.IEEE
        return ALLOWED[dtype][0]
    p = parse(precision)
    if p not in ALLOWED[dtype]:
        allowed = ", ".join(repr(a.value) for a in ALLOWED[dtype])
        raise ConvError(
            f"precision: got {p.value!r} for {dtype} tensors; allowed for {dtype}: {allowed} "
            "(convert the tensors to run in another precision)"
        )
    return p


def accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums are carried in: float64 for float64 data, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ computed in float64 (0 when both are zero, inf on a NaN)."""
    o = out.detach().to(device="cpu", dtype=torch.float64)
    r = ref.detach().to(device="cpu", dtype=torch.float64)
    if o.shape != r.shape:
        raise ConvError(f"relative_error: shapes differ, {tuple(o.shape)} vs {tuple(r.shape)}")
    num = torch.linalg.vector_norm(o - r).item()
    den = torch.linalg.vector_norm(r).item()
    if num != num:  # NaN never passes
        return float("inf")
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den
