"""``fastconv check``: the numerical contract (DESIGN.md §4) on this machine.

Runs the seed's six convolution cases and ``count`` random problems per available backend
and precision against float64 references, every run into a poisoned output buffer, then
every route of the sequence convolutions (:func:`seqconv_rows`). On a CPU-only machine the
Triton kernels run in the interpreter on small sizes.
"""

from __future__ import annotations

import dataclasses
import functools
import random

import torch

from .. import backends
from ..errors import NotSupported
from ..precision import TOLERANCE, Precision, relative_error
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


def _check_or_bare(case: dict, backend: str, prec: Precision, device: str,
                   gen) -> tuple[float, dict]:
    """(relative error, the case run): ``case`` on ``backend`` or, where the backend refuses
    its fused epilogue (cuDNN runs bare convolutions only), the same convolution without
    it, so that the random problems verify every backend (nearly every random case has an
    epilogue). NotSupported where the bare convolution is refused too."""
    try:
        return testing.check_case(case, backend=backend, precision=prec, device=device,
                                  generator=gen), case
    except NotSupported:
        bare = dict(case, bias=False, scale=False, shift=False, residual=False,
                    activation="none")
        if bare == case:
            raise
        return testing.check_case(bare, backend=backend, precision=prec, device=device,
                                  generator=gen), bare


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
                    err, case = _check_or_bare(case, name, prec, device, gen)
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
    for row in seqconv_rows(device, gen):
        rows.append(row)
        if emit:
            emit(row)
        if progress:
            progress()
    return rows


def seqconv_rows(device: str, gen: torch.Generator) -> list[CheckRow]:
    """``causal_conv1d``'s routes in float32 (the ieee bound) and bfloat16 against float64: the
    public call without autograd (shortconv.py's forward at width 4, fastconv.conv1d's
    route at width 16), the wide-filter tensor-core kernels (forward,
    and with every gradient), the training kernels (output and every gradient) without and
    with packed sequences, and a decode step (output and state). A route that does not run
    here (no Triton; the wide kernel on float32 data on a GPU) has no row; a kernel that
    failed has a failing one. The public calls' rows say "auto" (whatever route they take),
    the kernels' "triton"."""
    from .. import seqconv
    from ..decode import causal_conv1d_update

    batch, dim, seqlen = (2, 64, 301) if device == "cuda" else (2, 5, 37)
    ids = torch.tensor([[i * 3 // seqlen for i in range(seqlen)], [0] * seqlen],
                       dtype=torch.int32, device=device)
    rows = []
    for prec, dtype in ((Precision.IEEE, torch.float32), (Precision.BF16, torch.bfloat16)):
        def data(*shape, scale=1.0, dtype=dtype):
            return (torch.randn(shape, generator=gen) * scale).to(device, dtype)
        routes = (  # (width, label, the call of (x, w, b, initial states, ids))
            (4, "forward", functools.partial(_public, precision=prec.value)),
            (16, "forward", functools.partial(_public, precision=prec.value)),
            (4, "fwd+bwd, kernels", _kernels),
            (4, "packed, fwd+bwd", _kernels),
            (40, "forward, tensor cores", _wide_kernel),
            (40, "fwd+bwd, tensor cores", _wide_kernel))
        for width, label, call in routes:
            x, w, b = data(batch, dim, seqlen), data(dim, width, scale=width ** -0.5), data(dim)
            init = data(batch, dim, width - 1)
            err = _seq_error(call, x, w, b, init, ids if "packed" in label else None,
                             "bwd" in label, gen)
            if err is not None:
                rows.append(CheckRow(f"causal_conv1d w{width} {label}",
                                     "auto" if label == "forward" else "triton", prec.value,
                                     err, TOLERANCE[prec]))
        x, w, b = data(batch, dim), data(dim, 4, scale=0.5), data(dim)
        state = data(batch, dim, 3)
        want = _reference(x[..., None], w, b, state, None)[..., 0]
        want_state = torch.cat([state.double()[..., 1:], x.double()[..., None]], -1)
        got = causal_conv1d_update(x, state, w, b, "silu")
        rows.append(CheckRow("causal_conv1d_update w4, one token", "auto", prec.value,
                             max(relative_error(got, want), relative_error(state, want_state)),
                             TOLERANCE[prec]))
    for family, why in seqconv._KERNEL_FAILED.items():  # (their routes gave no rows)
        rows.append(CheckRow(f"causal_conv1d {family} kernels FAILED: {why}", "triton", "-",
                             float("inf"), 0.0))
    return rows


def _public(x, w, b, init, ids, precision):
    from ..seqconv import causal_conv1d

    return causal_conv1d(x, w, b, ids, init, activation="silu", precision=precision)


def _kernels(x, w, b, init, ids):
    """The training route's kernels (packed where ``ids`` is given), or None."""
    from ..seqconv import _packed_kernel

    return _packed_kernel(x, w, b, ids, init, True)


def _wide_kernel(x, w, b, init, ids):
    """The wide-filter kernel, or None where it does not run."""
    from ..seqconv import _wide_kernel

    return _wide_kernel(x, w, b, init, True)


def _reference(x, w, b, init, ids) -> torch.Tensor:
    """The SiLU output in float64 by torch operations (seqconv's torch route: one masked
    multiply-add pass per tap, differentiable), one sequence per row without ``ids``."""
    from ..seqconv import _packed_torch

    if ids is None:
        ids = torch.zeros(x.shape[0], x.shape[2], dtype=torch.int32, device=x.device)
    return _packed_torch(x.double(), w.double(), b.double(), ids, init.double(), False, "silu")


def _seq_error(call, x, w, b, init, ids, backward: bool, gen) -> float | None:
    """The largest relative error of ``call()``'s output (and, with ``backward``, of the
    gradients of x, weight, bias and the initial states) against float64; None where the
    route does not run here."""
    operands = (x, w, b, init)
    if backward:
        for t in operands:
            t.requires_grad_(True)
    try:
        with torch.set_grad_enabled(backward):
            out = call(x, w, b, init, ids)
        if out is None:
            return None
        ref_in = [t.detach().double().requires_grad_(backward) for t in operands]
        with torch.set_grad_enabled(backward):
            want = _reference(*ref_in, ids)
        errors = [relative_error(out, want)]
        if backward:
            g = torch.randn(out.shape, generator=gen).to(out.device, out.dtype)
            got = torch.autograd.grad(out, operands, g)
            wanted = torch.autograd.grad(want, ref_in, g.double())
            errors += [relative_error(a, c) for a, c in zip(got, wanted)]
        return max(errors)
    finally:
        for t in operands:
            t.requires_grad_(False)


HEADER = f"{'case':<44} {'backend':<8} {'prec':<5} {'rel err':>9} {'bound':>7}  ok"


def format_row(r: CheckRow) -> str:
    return (f"{r.case[:44]:<44} {r.backend:<8} {r.precision:<5} {r.rel_err:9.2e} "
            f"{r.bound:7.0e}  {'ok' if r.ok else 'FAIL'}")
