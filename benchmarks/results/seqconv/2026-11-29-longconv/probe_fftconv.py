"""Probe (issue 56, 2026-11-29): a causal long convolution as one Triton kernel per
(channel, batch row): a two-stage FFT of size N = N1 x N2 on the tensor cores (the
FlashFFTConv / Monarch scheme: DFT matrices as matrix products, a twiddle between them),
the product with the filter's spectrum, and the inverse, in registers and shared memory,
x read once and y written once. The filter's spectrum comes from torch.fft (float32).

x (batch, dim, L), weight (dim, K), y[t] = sum_{j<=t} weight[j] x[t-j] (long_conv1d's
convention). N = the power of two >= L + K - 1; x as an (N1, N2) matrix A[n1, n2] =
x[N2 n1 + n2] (zero past L); B = F_N1 A (only A's first R rows are non-zero: R = ceil(L/N2)),
C = B * twiddle, D = C F_N2 (D[k1, k2] = X[k1 + N1 k2]); Y = D * H (H in the same order);
the inverse likewise, only the output's first R rows. 12 matrix products per row.

Prints, per case: the relative error against float64 (and torch.fft's), and the median ms
of this kernel and of torch.fft's implementation (the seqconv bench's provider) in one process,
interleaved, in CUDA graphs (and fastconv.long_conv1d's; the kernel at 4, 8 and 16 warps;
run 3, not yet run: also N1 ≥ N2, and a program per channel computing the filter's
spectrum itself).
Run: PYTHONPATH=src python3 probe_fftconv.py"""

import json
import math
import sys

import torch
import triton
import triton.language as tl

from fastconv import long_conv1d
from fastconv.tools.bench.seqconv import _torch_fft as torch_fft  # the bench's provider


@triton.jit
def _cmm(ar, ai, br, bi, DT: tl.constexpr):
    """(ar + i ai) @ (br + i bi), float32 accumulation, operands in DT."""
    ar, ai, br, bi = ar.to(DT), ai.to(DT), br.to(DT), bi.to(DT)
    rr = tl.dot(ar, br) - tl.dot(ai, bi)
    ii = tl.dot(ar, bi) + tl.dot(ai, br)
    return rr, ii


@triton.jit
def _fftconv_kernel(x_ptr, y_ptr, hr_ptr, hi_ptr, f1r_ptr, f1i_ptr, tr_ptr, ti_ptr,
                    f2r_ptr, f2i_ptr, g1r_ptr, g1i_ptr, b_ptr, batch, dim, L, inv_n,
                    N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr,
                    HAS_BIAS: tl.constexpr, DT: tl.constexpr):
    d = tl.program_id(0)
    b = tl.program_id(1)
    k1 = tl.arange(0, N1)
    n2 = tl.arange(0, N2)
    r = tl.arange(0, R)
    k2 = tl.arange(0, N2)
    pos = r[:, None] * N2 + n2[None, :]  # (R, N2): x's first R rows
    row = (b * dim + d).to(tl.int64) * L
    a = tl.load(x_ptr + row + pos, mask=pos < L, other=0.0)
    # B = F_N1[:, :R] @ A  (A real)
    f1r = tl.load(f1r_ptr + k1[:, None] * R + r[None, :])
    f1i = tl.load(f1i_ptr + k1[:, None] * R + r[None, :])
    a16 = a.to(DT)
    br = tl.dot(f1r.to(DT), a16)
    bi = tl.dot(f1i.to(DT), a16)
    tw = k1[:, None] * N2 + n2[None, :]
    tr = tl.load(tr_ptr + tw)
    ti = tl.load(ti_ptr + tw)
    cr = br * tr - bi * ti
    ci = br * ti + bi * tr
    f2 = n2[:, None] * N2 + k2[None, :]
    f2r = tl.load(f2r_ptr + f2)
    f2i = tl.load(f2i_ptr + f2)
    dr, di = _cmm(cr, ci, f2r, f2i, DT)
    hw = d.to(tl.int64) * (N1 * N2) + tw
    hr = tl.load(hr_ptr + hw)
    hi = tl.load(hi_ptr + hw)
    yr = dr * hr - di * hi
    yi = dr * hi + di * hr
    # inverse: E = Y @ conj(F_N2), G = E * conj(twiddle), out = Re(conj(F_N1)[:R] @ G) / N
    er, ei = _cmm(yr, yi, f2r, -f2i, DT)
    gr = er * tr + ei * ti
    gi = ei * tr - er * ti
    g1r = tl.load(g1r_ptr + r[:, None] * N1 + k1[None, :])
    g1i = tl.load(g1i_ptr + r[:, None] * N1 + k1[None, :])
    out = (tl.dot(g1r.to(DT), gr.to(DT)) - tl.dot(g1i.to(DT), gi.to(DT))) * inv_n
    if HAS_BIAS:
        out += tl.load(b_ptr + d).to(tl.float32)
    tl.store(y_ptr + row + pos, out.to(y_ptr.dtype.element_ty), mask=pos < L)


@triton.jit
def _spectrum(src, length, f1r_ptr, f1i_ptr, tr_ptr, ti_ptr, f2r_ptr, f2i_ptr,
              N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr, DT: tl.constexpr):
    """The N1·N2-point DFT of ``length`` real values at ``src`` (zeros after), in D order."""
    k1 = tl.arange(0, N1)
    n2 = tl.arange(0, N2)
    r = tl.arange(0, R)
    pos = r[:, None] * N2 + n2[None, :]
    a = tl.load(src + pos, mask=pos < length, other=0.0).to(DT)
    f1r = tl.load(f1r_ptr + k1[:, None] * R + r[None, :])
    f1i = tl.load(f1i_ptr + k1[:, None] * R + r[None, :])
    br = tl.dot(f1r.to(DT), a)
    bi = tl.dot(f1i.to(DT), a)
    tw = k1[:, None] * N2 + n2[None, :]
    tr = tl.load(tr_ptr + tw)
    ti = tl.load(ti_ptr + tw)
    f2 = n2[:, None] * N2 + n2[None, :]
    return _cmm(br * tr - bi * ti, br * ti + bi * tr, tl.load(f2r_ptr + f2),
                tl.load(f2i_ptr + f2), DT)


@triton.jit
def _fftconv_channel_kernel(x_ptr, y_ptr, w_ptr, f1r_ptr, f1i_ptr, tr_ptr, ti_ptr,
                            f2r_ptr, f2i_ptr, g1r_ptr, g1i_ptr, b_ptr, batch, dim, L, K,
                            inv_n, N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr,
                            HAS_BIAS: tl.constexpr, DT: tl.constexpr):
    """Run 3's variant: one program per channel, the filter's spectrum computed here (the
    same transform as x's: no torch.fft, no spectrum in memory) and kept for every batch
    row of the channel."""
    d = tl.program_id(0)
    hr, hi = _spectrum(w_ptr + d.to(tl.int64) * K, K, f1r_ptr, f1i_ptr, tr_ptr, ti_ptr,
                       f2r_ptr, f2i_ptr, N1, N2, R, DT)
    k1 = tl.arange(0, N1)
    n2 = tl.arange(0, N2)
    r = tl.arange(0, R)
    pos = r[:, None] * N2 + n2[None, :]
    tw = k1[:, None] * N2 + n2[None, :]
    f2 = n2[:, None] * N2 + n2[None, :]
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(b_ptr + d).to(tl.float32)
    for b in range(batch):
        row = (b * dim + d).to(tl.int64) * L
        dr, di = _spectrum(x_ptr + row, L, f1r_ptr, f1i_ptr, tr_ptr, ti_ptr, f2r_ptr,
                           f2i_ptr, N1, N2, R, DT)
        er, ei = _cmm(dr * hr - di * hi, dr * hi + di * hr, tl.load(f2r_ptr + f2),
                      -tl.load(f2i_ptr + f2), DT)
        tr = tl.load(tr_ptr + tw)
        ti = tl.load(ti_ptr + tw)
        gr = er * tr + ei * ti
        gi = ei * tr - er * ti
        g1r = tl.load(g1r_ptr + r[:, None] * N1 + k1[None, :])
        g1i = tl.load(g1i_ptr + r[:, None] * N1 + k1[None, :])
        out = (tl.dot(g1r.to(DT), gr.to(DT)) - tl.dot(g1i.to(DT), gi.to(DT))) * inv_n + bias
        tl.store(y_ptr + row + pos, out.to(y_ptr.dtype.element_ty), mask=pos < L)


@triton.jit
def _spectrum_kernel(w_ptr, hr_ptr, hi_ptr, K, f1r_ptr, f1i_ptr, tr_ptr, ti_ptr, f2r_ptr,
                     f2i_ptr, N1: tl.constexpr, N2: tl.constexpr, R: tl.constexpr,
                     DT: tl.constexpr):
    """Run 4: the filters' spectra (dim, N1, N2) in D order, float32, by the same transform
    (for ``_fftconv_kernel``: no torch.fft, no transposed copies)."""
    d = tl.program_id(0)
    hr, hi = _spectrum(w_ptr + d.to(tl.int64) * K, K, f1r_ptr, f1i_ptr, tr_ptr, ti_ptr,
                       f2r_ptr, f2i_ptr, N1, N2, R, DT)
    k1 = tl.arange(0, N1)
    n2 = tl.arange(0, N2)
    at = d.to(tl.int64) * (N1 * N2) + k1[:, None] * N2 + n2[None, :]
    tl.store(hr_ptr + at, hr)
    tl.store(hi_ptr + at, hi)


_MATS: dict = {}


def _split(n: int, tall: bool = False) -> tuple[int, int]:
    """(N1, N2): N1 ≤ N2, or with ``tall`` N1 ≥ N2 (6.3M multiply-adds a row at N = 8192
    against 9.4M: the complex-by-complex products are N1·N2² each)."""
    small = 1 << (n.bit_length() - 1) // 2
    return (n // small, small) if tall else (small, n // small)


def _matrices(n1: int, n2: int, rows: int, device):
    key = (n1, n2, rows, device)
    if key not in _MATS:
        n = n1 * n2
        k1 = torch.arange(n1, dtype=torch.float64)
        r = torch.arange(rows, dtype=torch.float64)
        j2 = torch.arange(n2, dtype=torch.float64)
        f1 = torch.exp(-2j * math.pi * torch.outer(k1, r) / n1)  # (N1, R)
        tw = torch.exp(-2j * math.pi * torch.outer(k1, j2) / n)  # (N1, N2)
        f2 = torch.exp(-2j * math.pi * torch.outer(j2, j2) / n2)  # (N2, N2)
        g1 = torch.exp(2j * math.pi * torch.outer(r, k1) / n1)  # (R, N1)
        _MATS[key] = [t.to(device, torch.float32).contiguous()
                      for m in (f1, tw, f2, g1) for t in (m.real, m.imag)]
    return _MATS[key]


def fftconv(x, w, bias=None, warps=None, tall=False):
    batch, dim, L = x.shape
    K = w.shape[1]
    n = triton.next_power_of_2(L + K - 1)
    n = max(n, 256)
    n1, n2 = _split(n, tall)
    rows = max(16, triton.next_power_of_2(triton.cdiv(L, n2)))
    spec = torch.fft.fft(w.float(), n=n).view(dim, n2, n1).transpose(1, 2)  # D order
    hr, hi = spec.real.contiguous(), spec.imag.contiguous()
    f1r, f1i, tr, ti, f2r, f2i, g1r, g1i = _matrices(n1, n2, rows, x.device)
    y = torch.empty_like(x)
    dt = tl.bfloat16 if x.dtype == torch.bfloat16 else tl.float16 \
        if x.dtype == torch.float16 else tl.float32
    _fftconv_kernel[(dim, batch)](
        x, y, hr, hi, f1r, f1i, tr, ti, f2r, f2i, g1r, g1i, x if bias is None else bias,
        batch, dim, L, 1.0 / n, N1=n1, N2=n2, R=rows, HAS_BIAS=bias is not None, DT=dt,
        num_warps=warps or (8 if n1 * n2 >= 4096 else 4))
    return y


def fftconv_two(x, w, bias=None, warps=4, tall=False):
    """Run 4's variant: ``_spectrum_kernel`` then ``_fftconv_kernel`` on a (dim, batch) grid."""
    batch, dim, L = x.shape
    K = w.shape[1]
    n = max(triton.next_power_of_2(L + K - 1), 256)
    n1, n2 = _split(n, tall)
    rows = max(16, triton.next_power_of_2(triton.cdiv(L, n2)))
    f1r, f1i, tr, ti, f2r, f2i, g1r, g1i = _matrices(n1, n2, rows, x.device)
    dt = tl.bfloat16 if x.dtype == torch.bfloat16 else tl.float16 \
        if x.dtype == torch.float16 else tl.float32
    w = w.contiguous()
    hr = torch.empty(dim, n1, n2, device=x.device)
    hi = torch.empty_like(hr)
    _spectrum_kernel[(dim,)](w, hr, hi, K, f1r, f1i, tr, ti, f2r, f2i, N1=n1, N2=n2, R=rows,
                             DT=dt, num_warps=warps)
    y = torch.empty_like(x)
    _fftconv_kernel[(dim, batch)](
        x, y, hr, hi, f1r, f1i, tr, ti, f2r, f2i, g1r, g1i, x if bias is None else bias,
        batch, dim, L, 1.0 / n, N1=n1, N2=n2, R=rows, HAS_BIAS=bias is not None, DT=dt,
        num_warps=warps)
    return y


def fftconv_channels(x, w, bias=None, warps=4, tall=False):
    """Run 3's variant (``_fftconv_channel_kernel``): a program per channel."""
    batch, dim, L = x.shape
    K = w.shape[1]
    n = max(triton.next_power_of_2(L + K - 1), 256)
    n1, n2 = _split(n, tall)
    rows = max(16, triton.next_power_of_2(triton.cdiv(L, n2)))
    mats = _matrices(n1, n2, rows, x.device)
    y = torch.empty_like(x)
    dt = tl.bfloat16 if x.dtype == torch.bfloat16 else tl.float16 \
        if x.dtype == torch.float16 else tl.float32
    w = w.contiguous()
    _fftconv_channel_kernel[(dim,)](
        x, y, w, *mats, x if bias is None else bias, batch, dim, L, K, 1.0 / n, N1=n1, N2=n2,
        R=rows, HAS_BIAS=bias is not None, DT=dt, num_warps=warps, num_stages=1)
    return y


def reference(x, w, b):
    L = x.shape[-1]
    return torch.nn.functional.conv1d(torch.nn.functional.pad(x.double(), (w.shape[1] - 1, 0)),
                                      w.double().flip(-1).unsqueeze(1), b.double(),
                                      groups=x.shape[1])[..., :L]


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def graph_ms(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    for a, e in ev:
        a.record()
        g.replay()
        e.record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(e) for a, e in ev)
    return t[len(t) // 2]


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = [(4, 768, 1024), (4, 768, 2048), (4, 768, 4096), (4, 768, 8192)] \
        if device == "cuda" else [(2, 3, 100), (1, 2, 37), (2, 2, 128), (1, 2, 200)]
    dts = (torch.bfloat16,) if device == "cuda" else (torch.float32,)
    if device == "cuda":
        print("#", torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    for batch, dim, L in cases:
        for dt in dts:
            g = torch.Generator(device="cpu").manual_seed(L)
            x = torch.randn(batch, dim, L, generator=g).to(device, dt)
            w = (torch.randn(dim, L, generator=g) / L ** 0.5).to(device, dt)
            b = torch.randn(dim, generator=g).to(device, dt)
            ref = reference(x, w, b)
            row = dict(batch=batch, dim=dim, L=L, dtype=str(dt).split(".")[-1])
            variants = {"torch": lambda: torch_fft(x, w, b),
                        "long_conv1d": lambda: long_conv1d(x, w, b)}
            for tall in (False, True):  # run 4: each variant on its own; 4 warps (run 2-3)
                t = "_tall" * tall
                variants["rows" + t] = lambda tall=tall: fftconv(x, w, b, 4, tall)
                variants["channels" + t] = lambda tall=tall: fftconv_channels(x, w, b, 4, tall)
                variants["two" + t] = lambda tall=tall: fftconv_two(x, w, b, 4, tall)
            fns = {}
            for name, fn in variants.items():
                try:
                    row[f"err_{name}"] = float(f"{rel(fn(), ref):.3g}")
                    fns[name] = fn
                except Exception as exc:
                    row[f"error_{name}"] = f"{type(exc).__name__}: {str(exc)[:120]}"
            if device == "cuda":
                times = {k: [] for k in fns}
                for _ in range(5):  # interleaved
                    for k, fn in fns.items():
                        times[k].append(graph_ms(fn))
                row.update({f"ms_{k}": round(sorted(v)[2], 4) for k, v in times.items()})
                best = min((k for k in fns if k not in ("torch", "long_conv1d")),
                           key=lambda k: row[f"ms_{k}"], default=None)
                if best:
                    row["best"] = best
                    row["speedup"] = round(row["ms_torch"] / row[f"ms_{best}"], 3)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
