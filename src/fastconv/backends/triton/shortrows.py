"""causal_conv1d's short filters (width ≤ 17) on a dim-contiguous x, a position at a time:
the forward and the training backward without ``seq_idx``.

x (batch, dim, seqlen) transposed from a (batch, seqlen, dim) tensor, as Mamba's blocks pass
it, has its channels contiguous: position t of ``BLOCK_D`` channels is one row of 16-byte
vectors, and a tap reaching ``s`` positions back is the row loaded ``s`` steps earlier. A
program walks ``SPAN`` positions of one batch row in order and keeps the last ``WIDTH − 1``
rows in registers (a tuple, shifted by one each step), so every row is loaded once and no
value moves between threads. shortconv.py's kernels hold eight *columns* of positions
instead, each loaded on its own in this layout, and sum the weight's gradient across
threads.

Forward: x's row at t → ``act(bias + Σ_k w[k]·x[t − (WIDTH − 1 − k)])``. Backward (with
SiLU's gradient recomputed): at step t, g[t] = dy[t]·SiLU'(pre[t]), then
dx[t − (WIDTH − 1)] = Σ_k w[k]·g[t − k] from the last ``WIDTH − 1`` g kept likewise; the
weight's and bias's sums over the program's positions stay in registers per channel and
are stored once per program, then added in a fixed order (shortparts.py's ``_sums_kernel``).
A program's span [t0, t0 + SPAN) owns the sums of its positions and dx of the positions
``WIDTH − 1`` earlier, so that every step of its loop writes one dx: it first steps through
the ``WIDTH − 1`` positions before t0 for their g alone (x from ``2·(WIDTH − 1)`` back). The
initial states' gradient is dx of the positions before 0 (the first span's), and a last
span covers dx of the last ``WIDTH − 1`` positions. ``UNROLL`` positions are loaded before
any is used, so that their loads are in flight together. Spans whose loop stays inside the
sequence (all but the last; in the backward, the first too) run it without the positions'
masks, and with no mask at all where dim is a multiple of ``BLOCK_D``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import cdiv, launch
from .shortparts import _sigmoid, _store_part, _taps, backward_buffers, weight_sums


@triton.jit
def _masked(dmask, inside):
    """``dmask`` where the scalar condition ``inside`` holds, else all False. (Not ``dmask &
    inside``: Triton 3.9's interpreter gives that integers, which its loads refuse as a mask.)"""
    return tl.where(inside, dmask, False)


@triton.jit
def _shift(rows, new, N: tl.constexpr):
    """``(new, rows[0], …, rows[N − 2])``: the last N rows after a step."""
    out = (new,)
    for j in tl.static_range(N - 1):
        out = out + (rows[j],)
    return out


@triton.jit
def _row(ptr, init_ptr, base, b, d, dmask, p, seqlen, s_t, sh_b, sh_d, sh_k,
         WIDTH: tl.constexpr, HAS_INIT: tl.constexpr):
    """The row of channels ``d`` at position ``p`` in float32: ``initial_states`` before 0
    where given, zero elsewhere outside [0, seqlen)."""
    v = tl.load(ptr + base + tl.cast(p, tl.int64) * s_t,
                mask=_masked(dmask, (p >= 0) & (p < seqlen)), other=0.0).to(tl.float32)
    if HAS_INIT:
        v += tl.load(init_ptr + b * sh_b + d * sh_d + (WIDTH - 1 + p) * sh_k,
                     mask=_masked(dmask, (p < 0) & (p >= 1 - WIDTH)), other=0.0).to(tl.float32)
    return v


@triton.jit
def _rows(ptr, init_ptr, base, b, d, dmask, t, seqlen, s_t, sh_b, sh_d, sh_k,
          WIDTH: tl.constexpr, HAS_INIT: tl.constexpr, N: tl.constexpr, STEP: tl.constexpr):
    """The rows at positions ``t + STEP·j`` for j < N (:func:`_row`)."""
    out = (_row(ptr, init_ptr, base, b, d, dmask, t, seqlen, s_t, sh_b, sh_d, sh_k, WIDTH,
                HAS_INIT),)
    for j in tl.static_range(1, N):
        out = out + (_row(ptr, init_ptr, base, b, d, dmask, t + STEP * j, seqlen, s_t, sh_b,
                          sh_d, sh_k, WIDTH, HAS_INIT),)
    return out


@triton.jit
def _rows_at(ptr, base, d, dmask, t, seqlen, s_t, N: tl.constexpr, MASKED: tl.constexpr,
             EVEN_D: tl.constexpr):
    """The rows at positions ``t … t + N − 1`` (t ≥ 0): :func:`_rows` without initial
    states, or (not MASKED: positions known to lie in [0, seqlen)) loads masked by the
    channels alone, or not at all with EVEN_D (dim a multiple of the channels a program
    holds)."""
    if MASKED:
        out = _rows(ptr, ptr, base, 0, d, dmask, t, seqlen, s_t, 0, 0, 0, 1, False, N, 1)
    else:
        at = ptr + base + tl.cast(t, tl.int64) * s_t
        if EVEN_D:
            out = (tl.load(at).to(tl.float32),)
            for j in tl.static_range(1, N):
                out = out + (tl.load(at + j * s_t).to(tl.float32),)
        else:
            out = (tl.load(at, mask=dmask, other=0.0).to(tl.float32),)
            for j in tl.static_range(1, N):
                out = out + (tl.load(at + j * s_t, mask=dmask, other=0.0).to(tl.float32),)
    return out


@triton.jit
def _pre(xs, xnew, w, bias, WIDTH: tl.constexpr):
    """The pre-activation at a position whose row is ``xnew``; ``xs[j]`` is the row j + 1
    positions back."""
    acc = bias + w[WIDTH - 1] * xnew
    for j in tl.static_range(WIDTH - 1):
        acc += w[WIDTH - 2 - j] * xs[j]
    return acc


@triton.jit
def _store_row(at, v, dmask, inside, MASKED: tl.constexpr, EVEN_D: tl.constexpr):
    """A row stored at ``at`` where ``inside`` (MASKED), else where the channels are
    (``_rows_at``'s EVEN_D)."""
    if MASKED:
        tl.store(at, v, mask=_masked(dmask, inside))
    elif EVEN_D:
        tl.store(at, v)
    else:
        tl.store(at, v, mask=dmask)


@triton.jit
def _forward_steps(x_ptr, out_ptr, base, obase, d, dmask, xs, w, bias, t0, seqlen, sx_t, so_t,
                   WIDTH: tl.constexpr, SPAN: tl.constexpr, UNROLL: tl.constexpr,
                   SILU: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr):
    """The outputs of the span [t0, t0 + SPAN) (``xs``: the ``WIDTH − 1`` rows before)."""
    for t in range(t0, t0 + SPAN, UNROLL):
        xn = _rows_at(x_ptr, base, d, dmask, t, seqlen, sx_t, UNROLL, MASKED, EVEN_D)
        for i in tl.static_range(UNROLL):
            v = _pre(xs, xn[i], w, bias, WIDTH)
            if SILU:
                v = v * _sigmoid(v)
            _store_row(out_ptr + obase + tl.cast(t + i, tl.int64) * so_t,
                       v.to(out_ptr.dtype.element_ty), dmask, t + i < seqlen, MASKED, EVEN_D)
            xs = _shift(xs, xn[i], WIDTH - 1)


@triton.jit
def _forward_rows_kernel(x_ptr, init_ptr, w_ptr, b_ptr, out_ptr, dim, seqlen, sx_b, sx_d,
                         sx_t, sh_b, sh_d, sh_k, sw_d, sw_k, so_b, so_d, so_t,
                         WIDTH: tl.constexpr, BLOCK_D: tl.constexpr, SPAN: tl.constexpr,
                         UNROLL: tl.constexpr, HAS_INIT: tl.constexpr,
                         HAS_BIAS: tl.constexpr, SILU: tl.constexpr, EVEN_D: tl.constexpr):
    t0 = tl.program_id(0) * SPAN
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < dim
    b = tl.program_id(2).to(tl.int64)
    base = b * sx_b + d.to(tl.int64) * sx_d
    obase = b * so_b + d.to(tl.int64) * so_d
    w, bias = _taps(w_ptr, b_ptr, d, dmask, sw_d, sw_k, WIDTH, HAS_BIAS)
    xs = _rows(x_ptr, init_ptr, base, b, d, dmask, t0 - 1, seqlen, sx_t, sh_b, sh_d, sh_k,
               WIDTH, HAS_INIT, WIDTH - 1, -1)
    if t0 + SPAN <= seqlen:
        _forward_steps(x_ptr, out_ptr, base, obase, d, dmask, xs, w, bias, t0, seqlen, sx_t,
                       so_t, WIDTH, SPAN, UNROLL, SILU, False, EVEN_D)
    else:
        _forward_steps(x_ptr, out_ptr, base, obase, d, dmask, xs, w, bias, t0, seqlen, sx_t,
                       so_t, WIDTH, SPAN, UNROLL, SILU, True, EVEN_D)


@triton.jit
def _g(dy, xs, xnew, w, bias, WIDTH: tl.constexpr, SILU: tl.constexpr):
    """The pre-activation's gradient at a position: dy · SiLU'(pre), or dy."""
    g = dy
    if SILU:
        pre = _pre(xs, xnew, w, bias, WIDTH)
        sig = _sigmoid(pre)
        g = dy * sig * (1 + pre * (1 - sig))
    return g


@triton.jit
def _dx(g, gs, w, WIDTH: tl.constexpr):
    """dx at the position WIDTH − 1 before g's: Σ_k w[k]·g[t − k] (``gs[j]``: g j + 1
    positions before g's)."""
    acc = w[0] * g
    for j in tl.static_range(WIDTH - 1):
        acc += w[j + 1] * gs[j]
    return acc


@triton.jit
def _sums(dw, g, xs, xnew, WIDTH: tl.constexpr):
    """dw[k] + g·x[t − (WIDTH − 1 − k)] for every tap k."""
    out = (dw[0] + g * xs[WIDTH - 2],)
    for k in tl.static_range(1, WIDTH - 1):
        out = out + (dw[k] + g * xs[WIDTH - 2 - k],)
    out = out + (dw[WIDTH - 1] + g * xnew,)
    return out


@triton.jit
def _store_dx(dx_ptr, dh_ptr, dx, dxbase, b, d, dmask, v, seqlen, sdx_t, sdh_b, sdh_d, sdh_k,
              WIDTH: tl.constexpr, INIT_GRAD: tl.constexpr, MASKED: tl.constexpr,
              EVEN_D: tl.constexpr):
    """dx at position v ≥ 1 − WIDTH: dx's row where 0 ≤ v < seqlen, the initial states'
    gradient where v < 0 (with INIT_GRAD); not MASKED: v known to lie in [0, seqlen)."""
    _store_row(dx_ptr + dxbase + tl.cast(v, tl.int64) * sdx_t, dx.to(dx_ptr.dtype.element_ty),
               dmask, (v >= 0) & (v < seqlen), MASKED, EVEN_D)
    if INIT_GRAD and MASKED:
        tl.store(dh_ptr + b * sdh_b + d * sdh_d + (WIDTH - 1 + v) * sdh_k,
                 dx.to(dh_ptr.dtype.element_ty), mask=_masked(dmask, v < 0))


@triton.jit
def _backward_steps(x_ptr, dy_ptr, dx_ptr, dh_ptr, base, ybase, dxbase, b, d, dmask, xs, gs, w,
                    bias, t0, end, seqlen, sx_t, sy_t, sdx_t, sdh_b, sdh_d, sdh_k,
                    WIDTH: tl.constexpr, UNROLL: tl.constexpr, SILU: tl.constexpr,
                    INIT_GRAD: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr):
    """The sums (dw, db) of the positions [t0, end) and dx of those ``WIDTH − 1`` earlier
    (``xs``, ``gs``: the ``WIDTH − 1`` rows of x and g before t0)."""
    zero = tl.zeros_like(bias)
    dw = (zero,)
    for _k in tl.static_range(WIDTH - 1):
        dw = dw + (zero,)
    db = zero
    for t in range(t0, end, UNROLL):
        xn = _rows_at(x_ptr, base, d, dmask, t, seqlen, sx_t, UNROLL, MASKED, EVEN_D)
        dyn = _rows_at(dy_ptr, ybase, d, dmask, t, seqlen, sy_t, UNROLL, MASKED, EVEN_D)
        for i in tl.static_range(UNROLL):
            g = _g(dyn[i], xs, xn[i], w, bias, WIDTH, SILU)
            dw = _sums(dw, g, xs, xn[i], WIDTH)
            db += g
            _store_dx(dx_ptr, dh_ptr, _dx(g, gs, w, WIDTH), dxbase, b, d, dmask,
                      t + i - (WIDTH - 1), seqlen, sdx_t, sdh_b, sdh_d, sdh_k, WIDTH,
                      INIT_GRAD, MASKED, EVEN_D)
            xs = _shift(xs, xn[i], WIDTH - 1)
            gs = _shift(gs, g, WIDTH - 1)
    return dw, db


@triton.jit
def _backward_rows_kernel(x_ptr, init_ptr, w_ptr, b_ptr, dy_ptr, dx_ptr, dh_ptr, part_ptr,
                          dim, seqlen, sx_b, sx_d, sx_t, sh_b, sh_d, sh_k, sw_d, sw_k,
                          sy_b, sy_d, sy_t, sdx_b, sdx_d, sdx_t, sdh_b, sdh_d, sdh_k,
                          WIDTH: tl.constexpr, TAPS: tl.constexpr, BLOCK_D: tl.constexpr,
                          SPAN: tl.constexpr, UNROLL: tl.constexpr, HAS_INIT: tl.constexpr,
                          HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                          INIT_GRAD: tl.constexpr, EVEN_D: tl.constexpr):
    t0 = tl.program_id(0) * SPAN
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < dim
    b = tl.program_id(2).to(tl.int64)
    base = b * sx_b + d.to(tl.int64) * sx_d
    ybase = b * sy_b + d.to(tl.int64) * sy_d
    dxbase = b * sdx_b + d.to(tl.int64) * sdx_d
    w, bias = _taps(w_ptr, b_ptr, d, dmask, sw_d, sw_k, WIDTH, HAS_BIAS)
    # g of the WIDTH − 1 positions before the span, for the dx its first steps write
    tw = t0 - (WIDTH - 1)
    xs = _rows(x_ptr, init_ptr, base, b, d, dmask, tw - 1, seqlen, sx_t, sh_b, sh_d, sh_k,
               WIDTH, HAS_INIT, WIDTH - 1, -1)
    xn = _rows(x_ptr, init_ptr, base, b, d, dmask, tw, seqlen, sx_t, sh_b, sh_d, sh_k, WIDTH,
               HAS_INIT, WIDTH - 1, 1)
    dyn = _rows(dy_ptr, init_ptr, ybase, b, d, dmask, tw, seqlen, sy_t, sh_b, sh_d, sh_k,
                WIDTH, False, WIDTH - 1, 1)
    zero = tl.zeros([BLOCK_D], tl.float32)
    gs = (zero,)
    for _j in tl.static_range(WIDTH - 2):
        gs = gs + (zero,)
    for i in tl.static_range(WIDTH - 1):
        g = _g(dyn[i], xs, xn[i], w, bias, WIDTH, SILU)
        xs = _shift(xs, xn[i], WIDTH - 1)
        gs = _shift(gs, g, WIDTH - 1)
    if (tw >= 0) & (t0 + SPAN <= seqlen):
        dw, db = _backward_steps(x_ptr, dy_ptr, dx_ptr, dh_ptr, base, ybase, dxbase, b, d,
                                 dmask, xs, gs, w, bias, t0, t0 + SPAN, seqlen, sx_t, sy_t,
                                 sdx_t, sdh_b, sdh_d, sdh_k, WIDTH, UNROLL, SILU, INIT_GRAD,
                                 False, EVEN_D)
    else:  # (the last span: no further than dx's last position needs)
        dw, db = _backward_steps(x_ptr, dy_ptr, dx_ptr, dh_ptr, base, ybase, dxbase, b, d,
                                 dmask, xs, gs, w, bias, t0,
                                 tl.minimum(t0 + SPAN, seqlen + WIDTH - 1), seqlen, sx_t,
                                 sy_t, sdx_t, sdh_b, sdh_d, sdh_k, WIDTH, UNROLL, SILU,
                                 INIT_GRAD, True, EVEN_D)
    taps = tl.arange(0, TAPS)[None, :]
    part = tl.where(taps == WIDTH, db[:, None], 0.0)
    for k in tl.static_range(WIDTH):
        part += tl.where(taps == k, dw[k][:, None], 0.0)
    _store_part(part_ptr, part, b, d, dmask, dim, WIDTH, TAPS)


#: (BLOCK_D, SPAN, UNROLL, warps[, registers]) of the forward and the backward by the widest
#: width a tile serves (:func:`tiles`; registers: a cap on a thread's, Triton's ``maxnreg``,
#: where given); None: shortconv.py's kernel runs there. The best of a probe
#: on an H100 (bf16, SiLU, bias, b8 d4096 L2048; each class by its width 4, 8 or 16, the
#: kernels interleaved; results/seqconv/2026-12-07-rows/): the backward 1.25x / 1.12x /
#: 1.14x shortconv.py's at widths 4 / 8 / 16 (1.04x at 2, 1.41x at b1 d8192 L16384 w4;
#: 75.7 % of its byte floor at width 4 against 60.6 %); the forward only at width 16
#: (1.04x), shortconv.py's column loads being 5-13 % faster at widths 2-8.
TILES = {5: (None, (64, 128, 4, 1)), 9: (None, (64, 128, 4, 1)),
         17: ((64, 64, 8, 1), (32, 128, 4, 1))}


def tiles(width: int) -> tuple:
    """(forward tile, backward tile) of a width (``TILES``); None where shortconv.py's
    kernel runs."""
    return TILES[5 if width <= 5 else 9 if width <= 9 else 17]


def _options(tile: tuple) -> dict:
    """A tile's launch options: its warps, and its register cap where it has one."""
    return {"num_warps": tile[3], **({"maxnreg": tile[4]} if len(tile) > 4 else {})}


def rows_forward(x: torch.Tensor, initial_states, weight: torch.Tensor, bias, silu: bool,
                 tile: tuple) -> torch.Tensor:
    """causal_conv1d's output for a dim-contiguous x (x's shape, layout and dtype), on a
    tile (BLOCK_D, SPAN, UNROLL, warps[, registers])."""
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    block_d, span, unroll = tile[:3]
    out = torch.empty_like(x)
    init = initial_states if initial_states is not None else x
    launch(_forward_rows_kernel, (cdiv(seqlen, span), cdiv(dim, block_d), batch),
           x, init, weight, x if bias is None else bias, out, dim, seqlen, *x.stride(),
           *init.stride(), *weight.stride(), *out.stride(), WIDTH=width, BLOCK_D=block_d,
           SPAN=span, UNROLL=unroll, HAS_INIT=initial_states is not None,
           HAS_BIAS=bias is not None, SILU=silu, EVEN_D=dim % block_d == 0, **_options(tile))
    return out


def rows_backward(dy: torch.Tensor, x: torch.Tensor, initial_states, weight: torch.Tensor,
                  bias, silu: bool, init_grad: bool, tile: tuple) -> tuple:
    """(dx, d initial_states or None, d weight, d bias or None) of :func:`rows_forward`
    given the output's gradient (dx in x's layout), on a tile as there."""
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    block_d, span, unroll = tile[:3]
    windows = cdiv(seqlen + width - 1, span)
    dx, dh, part = backward_buffers(x, width, windows, init_grad)
    init = initial_states if initial_states is not None else x
    launch(_backward_rows_kernel, (windows, cdiv(dim, block_d), batch),
           x, init, weight, x if bias is None else bias, dy, dx, dh, part, dim, seqlen,
           *x.stride(), *init.stride(), *weight.stride(), *dy.stride(), *dx.stride(),
           *dh.stride(), WIDTH=width, TAPS=part.shape[3], BLOCK_D=block_d, SPAN=span,
           UNROLL=unroll, HAS_INIT=initial_states is not None, HAS_BIAS=bias is not None,
           SILU=silu, INIT_GRAD=init_grad, EVEN_D=dim % block_d == 0, **_options(tile))
    return (dx, dh if init_grad else None, *weight_sums(part, weight, bias))
