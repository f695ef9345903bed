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
dx of the last ``WIDTH − 1`` positions of a span needs g past it: a program steps
``WIDTH − 1`` positions further, without counting them in the sums. The initial states'
gradient is dx of the positions before 0 (the first span starts ``WIDTH − 1`` early).
``UNROLL`` positions are loaded before any is used, so that their loads are in flight
together.
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
def _pre(xs, xnew, w, bias, WIDTH: tl.constexpr):
    """The pre-activation at a position whose row is ``xnew``; ``xs[j]`` is the row j + 1
    positions back."""
    acc = bias + w[WIDTH - 1] * xnew
    for j in tl.static_range(WIDTH - 1):
        acc += w[WIDTH - 2 - j] * xs[j]
    return acc


@triton.jit
def _forward_rows_kernel(x_ptr, init_ptr, w_ptr, b_ptr, out_ptr, dim, seqlen, sx_b, sx_d,
                         sx_t, sh_b, sh_d, sh_k, sw_d, sw_k, so_b, so_d, so_t,
                         WIDTH: tl.constexpr, BLOCK_D: tl.constexpr, SPAN: tl.constexpr,
                         UNROLL: tl.constexpr, HAS_INIT: tl.constexpr,
                         HAS_BIAS: tl.constexpr, SILU: tl.constexpr):
    t0 = tl.program_id(0) * SPAN
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < dim
    b = tl.program_id(2).to(tl.int64)
    base = b * sx_b + d.to(tl.int64) * sx_d
    obase = b * so_b + d.to(tl.int64) * so_d
    w, bias = _taps(w_ptr, b_ptr, d, dmask, sw_d, sw_k, WIDTH, HAS_BIAS)
    xs = _rows(x_ptr, init_ptr, base, b, d, dmask, t0 - 1, seqlen, sx_t, sh_b, sh_d, sh_k,
               WIDTH, HAS_INIT, WIDTH - 1, -1)
    for t in range(t0, t0 + SPAN, UNROLL):
        xn = _rows(x_ptr, init_ptr, base, b, d, dmask, t, seqlen, sx_t, sh_b, sh_d, sh_k,
                   WIDTH, HAS_INIT, UNROLL, 1)
        for i in tl.static_range(UNROLL):
            v = _pre(xs, xn[i], w, bias, WIDTH)
            if SILU:
                v = v * _sigmoid(v)
            tl.store(out_ptr + obase + tl.cast(t + i, tl.int64) * so_t,
                     v.to(out_ptr.dtype.element_ty), mask=_masked(dmask, t + i < seqlen))
            xs = _shift(xs, xn[i], WIDTH - 1)


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
def _store_dx(dx_ptr, dh_ptr, dx, dxbase, b, d, dmask, v, t0, seqlen, sdx_t, sdh_b, sdh_d,
              sdh_k, WIDTH: tl.constexpr, INIT_GRAD: tl.constexpr):
    """dx at position v (from t0 on): dx's row where 0 ≤ v < seqlen, the initial states'
    gradient where v < 0 (with INIT_GRAD)."""
    tl.store(dx_ptr + dxbase + tl.cast(v, tl.int64) * sdx_t, dx.to(dx_ptr.dtype.element_ty),
             mask=_masked(dmask, (v >= t0) & (v >= 0) & (v < seqlen)))
    if INIT_GRAD:
        tl.store(dh_ptr + b * sdh_b + d * sdh_d + (WIDTH - 1 + v) * sdh_k,
                 dx.to(dh_ptr.dtype.element_ty), mask=_masked(dmask, (v >= t0) & (v < 0)))


@triton.jit
def _backward_rows_kernel(x_ptr, init_ptr, w_ptr, b_ptr, dy_ptr, dx_ptr, dh_ptr, part_ptr,
                          dim, seqlen, sx_b, sx_d, sx_t, sh_b, sh_d, sh_k, sw_d, sw_k,
                          sy_b, sy_d, sy_t, sdx_b, sdx_d, sdx_t, sdh_b, sdh_d, sdh_k,
                          WIDTH: tl.constexpr, TAPS: tl.constexpr, FIRST: tl.constexpr,
                          BLOCK_D: tl.constexpr, SPAN: tl.constexpr, UNROLL: tl.constexpr,
                          HAS_INIT: tl.constexpr, HAS_BIAS: tl.constexpr,
                          SILU: tl.constexpr, INIT_GRAD: tl.constexpr):
    # FIRST: the first span's first position (1 − WIDTH with the initial states' gradient)
    t0 = tl.program_id(0) * SPAN + FIRST
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < dim
    b = tl.program_id(2).to(tl.int64)
    base = b * sx_b + d.to(tl.int64) * sx_d
    ybase = b * sy_b + d.to(tl.int64) * sy_d
    dxbase = b * sdx_b + d.to(tl.int64) * sdx_d
    w, bias = _taps(w_ptr, b_ptr, d, dmask, sw_d, sw_k, WIDTH, HAS_BIAS)
    xs = _rows(x_ptr, init_ptr, base, b, d, dmask, t0 - 1, seqlen, sx_t, sh_b, sh_d, sh_k,
               WIDTH, HAS_INIT, WIDTH - 1, -1)
    zero = tl.zeros([BLOCK_D], tl.float32)
    gs = (zero,)  # g before t0: read only for dx before t0, which is not stored
    for _j in tl.static_range(WIDTH - 2):
        gs = gs + (zero,)
    dw = (zero,)
    for _k in tl.static_range(WIDTH - 1):
        dw = dw + (zero,)
    db = zero
    for t in range(t0, t0 + SPAN, UNROLL):
        xn = _rows(x_ptr, init_ptr, base, b, d, dmask, t, seqlen, sx_t, sh_b, sh_d, sh_k,
                   WIDTH, HAS_INIT, UNROLL, 1)
        dyn = _rows(dy_ptr, init_ptr, ybase, b, d, dmask, t, seqlen, sy_t, sh_b, sh_d, sh_k,
                    WIDTH, False, UNROLL, 1)
        for i in tl.static_range(UNROLL):
            g = _g(dyn[i], xs, xn[i], w, bias, WIDTH, SILU)
            dw = _sums(dw, g, xs, xn[i], WIDTH)
            db += g
            _store_dx(dx_ptr, dh_ptr, _dx(g, gs, w, WIDTH), dxbase, b, d, dmask,
                      t + i - (WIDTH - 1), t0, seqlen, sdx_t, sdh_b, sdh_d, sdh_k, WIDTH,
                      INIT_GRAD)
            xs = _shift(xs, xn[i], WIDTH - 1)
            gs = _shift(gs, g, WIDTH - 1)
    # the WIDTH − 1 positions after the span: g for the span's last dx, not counted in the sums
    t = t0 + SPAN
    xn = _rows(x_ptr, init_ptr, base, b, d, dmask, t, seqlen, sx_t, sh_b, sh_d, sh_k, WIDTH,
               HAS_INIT, WIDTH - 1, 1)
    dyn = _rows(dy_ptr, init_ptr, ybase, b, d, dmask, t, seqlen, sy_t, sh_b, sh_d, sh_k,
                WIDTH, False, WIDTH - 1, 1)
    for i in tl.static_range(WIDTH - 1):
        g = _g(dyn[i], xs, xn[i], w, bias, WIDTH, SILU)
        _store_dx(dx_ptr, dh_ptr, _dx(g, gs, w, WIDTH), dxbase, b, d, dmask,
                  t + i - (WIDTH - 1), t0, seqlen, sdx_t, sdh_b, sdh_d, sdh_k, WIDTH,
                  INIT_GRAD)
        xs = _shift(xs, xn[i], WIDTH - 1)
        gs = _shift(gs, g, WIDTH - 1)
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
#: (1.04x), shortconv.py's column loads being 5-13 % faster at widths 2-8. The backward's
#: widths 6-17 then took 8 warps (results/seqconv/2026-12-07-versions/, the same case, one
#: process, Triton 3.6): 1.13x the 4-warp tile at widths 8 and 16 (52.1 % of the byte floor
#: against 46.1 %, 31.3 % against 27.7 %). A cap of 128 registers gave 1.21x and 1.27x
#: there, but spills 72-344 bytes at Triton 3.8 (tools.offline), so it is not taken.
TILES = {5: (None, (64, 128, 4, 1)), 9: (None, (64, 128, 8, 1)),
         17: ((64, 64, 8, 1), (32, 128, 8, 1))}


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
           HAS_BIAS=bias is not None, SILU=silu, **_options(tile))
    return out


def rows_backward(dy: torch.Tensor, x: torch.Tensor, initial_states, weight: torch.Tensor,
                  bias, silu: bool, init_grad: bool, tile: tuple) -> tuple:
    """(dx, d initial_states or None, d weight, d bias or None) of :func:`rows_forward`
    given the output's gradient (dx in x's layout), on a tile as there."""
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    block_d, span, unroll = tile[:3]
    first = 1 - width if init_grad else 0
    windows = cdiv(seqlen - first, span)
    dx, dh, part = backward_buffers(x, width, windows, init_grad)
    init = initial_states if initial_states is not None else x
    launch(_backward_rows_kernel, (windows, cdiv(dim, block_d), batch),
           x, init, weight, x if bias is None else bias, dy, dx, dh, part, dim, seqlen,
           *x.stride(), *init.stride(), *weight.stride(), *dy.stride(), *dx.stride(),
           *dh.stride(), WIDTH=width, TAPS=part.shape[3], FIRST=first, BLOCK_D=block_d,
           SPAN=span, UNROLL=unroll, HAS_INIT=initial_states is not None,
           HAS_BIAS=bias is not None, SILU=silu, INIT_GRAD=init_grad, **_options(tile))
    return (dx, dh if init_grad else None, *weight_sums(part, weight, bias))
