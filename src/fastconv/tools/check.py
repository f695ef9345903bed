"""``fastconv check``: the numerical contract (DESIGN.md §4) on this machine.

Runs the seed's six convolution cases and ``count`` random problems per available backend
and precision against float64 references, every run into a poisoned output buffer. On a
CPU-only machine the Triton kernels run in the interpreter on small sizes.
"""

from __future__ import annotations

import dataclasses
import random

import torch

from .. import backends
from ..errors import NotSupported
from ..precision import TOLERANCE, Precision
from . import testing


@dataclasses.dataclass
class CheckRow:
    case: str
    backend: str
    precision: str
    rel_err: float
    bound: float
    count: int = 1

    @property
    def ok(self) -> bool:
        return self.rel_err <= self.bound


def seed_cases(device: str) -> list[tuple[str, dict]]:
    """The seed's six cases: (kernel, stride, padding) = k3 s1 p0, k3 s1 p1, k3 s2 p1,
    k1 s1 p0, k1 s2 p0, k7 s2 p3."""
    n, c, k, hw = (8, 64, 64, 28) if device == "cuda" else (1, 8, 8, 11)
    cases = []
    for ks, s, p in ((3, 1, 0), (3, 1, 1), (3, 2, 1), (1, 1, 0), (1, 2, 0), (7, 2, 3)):
        cases.append((f"seed k{ks} s{s} p{p}", dict(
            rank=2, n=n, c=c, k=k, spatial=(hw, hw), kernel=(ks, ks), stride=(s, s),
            padding=((p, p), (p, p)), dilation=(1, 1), groups=1, bias=False, scale=False,
            shift=False, residual=False, activation="none", negative_slope=0.01)))
    return cases


def run_check(count: int = 50, seed: int = 0, verbose: bool = False,
              progress=None, emit=None) -> list[CheckRow]:
    """Every (case, backend, precision) result; random problems aggregated to their worst
    unless ``verbose``. ``emit(row)`` is called as each row is final (a long GPU run shows
    its results as it goes)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    rows: list[CheckRow] = []
    names = [n for n, b in backends.REGISTRY.items() if b.available()[0]]
    for name in names:
        for prec in Precision:
            bound = TOLERANCE[prec]
            for label, case in seed_cases(device):
                try:
                    err = testing.check_case(case, backend=name, precision=prec,
                                             device=device, generator=gen)
                except NotSupported:  # refused with its reasons: nothing to verify
                    if progress:
                        progress()
                    continue
                rows.append(CheckRow(label, name, prec.value, err, bound))
                if emit:
                    emit(rows[-1])
                if progress:
                    progress()
            worst = CheckRow("", name, prec.value, 0.0, bound, 0)
            for _ in range(count):
                case = testing.random_case(rng, small=device == "cpu")
                try:
                    err = testing.check_case(case, backend=name, precision=prec,
                                             device=device, generator=gen)
                except NotSupported:
                    if progress:
                        progress()
                    continue
                worst.count += 1
                if verbose or err > bound:
                    rows.append(CheckRow(testing.describe(case), name, prec.value, err, bound))
                    if emit:
                        emit(rows[-1])
                worst.rel_err = max(worst.rel_err, err)
                if progress:
                    progress()
            refused = count - worst.count
            worst.case = f"random x{worst.count} (worst)" + (f", {refused} refused"
                                                             if refused else "")
            rows.append(worst)
            if emit:
                emit(worst)
    return rows


HEADER = f"{'case':<44} {'backend':<8} {'prec':<5} {'rel err':>9} {'bound':>7}  ok"


def format_row(r: CheckRow) -> str:
    return (f"{r.case[:44]:<44} {r.backend:<8} {r.precision:<5} {r.rel_err:9.2e} "
            f"{r.bound:7.0e}  {'ok' if r.ok else 'FAIL'}")
